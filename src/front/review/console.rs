//! The console's state: where it lives (origin, relying party id, data
//! folder), the challenges it issued, its sessions and its sign-in
//! throttle, and the gateway it reviews for.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use parking_lot::Mutex;

use super::session::{self, NotSignedIn, Session, Sessions};
use super::throttle::Failures;
use crate::core::reviewers::Reviewer;
use crate::front::gateway::Gateway;

/// How long a challenge the console issued may be answered.
const CHALLENGE_TTL: Duration = Duration::from_secs(300);

/// A challenge the console issued for a sign-in or an enrolment: used
/// once, within [`CHALLENGE_TTL`].
#[derive(Debug, Clone)]
pub(crate) struct Issued {
    /// What it is for: `sign-in`, or `enrol:TOKEN_HASH`.
    pub(crate) purpose: String,
    pub(crate) at: Instant,
}

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
    /// Challenges issued and not yet answered, by their base64url text.
    pub(crate) challenges: Mutex<HashMap<String, Issued>>,
    /// Signed-in sessions.
    pub(crate) sessions: Sessions,
    /// Failed sign-ins, per credential and per address.
    pub(crate) failures: Failures,
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
            challenges: Mutex::new(HashMap::new()),
            failures: Failures::default(),
            gw,
        })
    }

    /// A fresh challenge for `purpose` (32 random bytes, base64url).
    pub(crate) fn challenge(&self, purpose: String) -> String {
        use base64::Engine;
        let text = crate::core::passkey::b64url().encode(rand::random::<[u8; 32]>());
        let mut all = self.challenges.lock();
        all.retain(|_, i| i.at.elapsed() < CHALLENGE_TTL);
        all.insert(
            text.clone(),
            Issued {
                purpose,
                at: Instant::now(),
            },
        );
        text
    }

    /// Take the challenge `text` back for `purpose`: once, and in time.
    /// A challenge answered twice, late, or for another purpose is refused.
    pub(crate) fn take_challenge(&self, text: &str, purpose: &str) -> bool {
        let mut all = self.challenges.lock();
        match all.remove(text) {
            Some(i) => i.purpose == purpose && i.at.elapsed() < CHALLENGE_TTL,
            None => false,
        }
    }

    /// The reviewer signed in on this request, as the reviewers file in
    /// force has them (a session ends when its reviewer or passkey leaves).
    pub(crate) fn signed_in(
        &self,
        headers: &HeaderMap,
    ) -> Result<(Reviewer, Session), NotSignedIn> {
        session::reviewer_of(
            &self.sessions,
            self.gw.pipeline().policies().reviewers(),
            headers,
        )
    }

    /// How long an approval may be used when the reviewer says nothing.
    pub(crate) fn default_ttl(&self) -> Duration {
        self.gw.config().approvals.ttl
    }
}
