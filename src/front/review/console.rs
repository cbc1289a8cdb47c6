//! The console's state: where it lives (origin, relying party id, data
//! folder) and the gateway it reviews for. What changes as reviewers use it
//! (the challenges it issued, its sessions, failed sign-ins, invitations,
//! passkey counters) is in the store ([`crate::store::console`]), so that
//! several gateways behind one address serve one console: a challenge
//! issued through one gateway is answered through another.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;

use super::session::{cookie, NotSignedIn, Session, Sessions};
use super::throttle;
use crate::core::reviewers::Reviewer;
use crate::front::gateway::Gateway;
use crate::store::{Store, StoreError};

/// How long a challenge the console issued may be answered.
const CHALLENGE_TTL: Duration = Duration::from_secs(300);

/// The console's state on this gateway: the state of its routes.
pub(crate) struct Console {
    /// The gateway it reviews for.
    pub(crate) gw: Arc<Gateway>,
    /// `https://gw.example.com` (or `http://localhost:PORT`).
    pub(crate) origin: String,
    /// The WebAuthn relying party id.
    pub(crate) rp_id: String,
    /// `DATA_DIR/review`: `invites/` and `enrolled/`.
    pub(crate) dir: PathBuf,
    /// Signed-in sessions.
    pub(crate) sessions: Sessions,
}

impl Console {
    /// Open the console of `gw` at `origin` for relying party `rp_id`,
    /// keeping its enrolments under `gateway.data_dir/review`; webhook
    /// events for proposals then carry their page's URL.
    pub(crate) fn open(gw: Arc<Gateway>, origin: String, rp_id: String) -> Arc<Console> {
        gw.pipeline()
            .book()
            .set_review_url(format!("{origin}/review/p/"));
        Arc::new(Console {
            dir: gw.config().gateway.data_dir.join("review"),
            sessions: Sessions::new(gw.config().review.session_ttl),
            origin,
            rp_id,
            gw,
        })
    }

    /// Now, Unix ms, on the gateway's clock.
    pub(crate) fn now_ms(&self) -> i64 {
        self.gw.pipeline().clock().now_ms()
    }

    /// The store the console's state is in (shared by the gateways).
    pub(crate) fn store(&self) -> &dyn Store {
        self.gw.pipeline().store().as_ref()
    }

    /// Whether `key` (`credential:ID`, `address:IP`, `enrol:IP`) may try
    /// again ([`throttle`]).
    pub(crate) async fn allowed(&self, key: &str) -> Result<bool, StoreError> {
        throttle::allowed(self.store(), self.now_ms(), key).await
    }

    /// Count one more failure of `key`.
    pub(crate) async fn failed(&self, key: &str) {
        throttle::failed(self.store(), self.now_ms(), key).await;
    }

    /// A fresh challenge for `purpose` (32 random bytes, base64url),
    /// recorded in the store so that any gateway can take it back.
    pub(crate) async fn challenge(&self, purpose: String) -> Result<String, StoreError> {
        use base64::Engine;
        let text = crate::core::passkey::b64url().encode(rand::random::<[u8; 32]>());
        let until = self
            .now_ms()
            .saturating_add(crate::core::time::ms(CHALLENGE_TTL));
        self.gw
            .pipeline()
            .store()
            .console_put(format!("challenge/{text}"), purpose, until)
            .await?;
        Ok(text)
    }

    /// Take the challenge `text` back for `purpose`: once, and in time.
    /// A challenge answered twice (through any gateway), late, or for
    /// another purpose is refused; a store that cannot answer refuses too.
    pub(crate) async fn take_challenge(&self, text: &str, purpose: &str) -> bool {
        match self
            .gw
            .pipeline()
            .store()
            .console_take(format!("challenge/{text}"), self.now_ms())
            .await
        {
            Ok(Some(p)) => p == purpose,
            Ok(None) => false,
            Err(e) => {
                tracing::warn!("a console challenge could not be checked: {e}");
                false
            }
        }
    }

    /// The reviewer signed in on this request, as the reviewers file in
    /// force has them (a session ends when its reviewer or passkey leaves).
    pub(crate) async fn signed_in(
        &self,
        headers: &HeaderMap,
    ) -> Result<(Reviewer, Session), NotSignedIn> {
        let id = cookie(headers).ok_or(NotSignedIn::NoSession)?;
        let session = self
            .sessions
            .get(self.store(), self.now_ms(), &id)
            .await
            .map_err(|e| NotSignedIn::Unavailable(e.to_string()))?
            .ok_or(NotSignedIn::NoSession)?;
        // Revocation: the file in force decides, on every request.
        let reviewer = self
            .gw
            .pipeline()
            .policies()
            .reviewers()
            .get(&session.reviewer)
            .filter(|r| r.passkey(&session.credential_id).is_some())
            .cloned();
        match reviewer {
            Some(r) => Ok((r, session)),
            None => {
                if let Err(e) = self.sessions.close(self.store(), self.now_ms(), &id).await {
                    tracing::warn!("a revoked console session could not be removed (it is refused on every request all the same): {e}");
                }
                Err(NotSignedIn::Revoked(session.reviewer))
            }
        }
    }

    /// How long an approval may be used when the reviewer says nothing.
    pub(crate) fn default_ttl(&self) -> Duration {
        self.gw.config().approvals.ttl
    }
}
