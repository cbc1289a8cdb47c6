//! Console sessions: a `__Host-` cookie (Secure, HttpOnly, SameSite=Strict,
//! at most 12 h), a CSRF token per session, and the Origin check on every
//! state change.
//!
//! - Session fixation: an id is minted only by a successful passkey sign-in,
//!   never taken from the browser; a new sign-in gets a new id.
//! - Revocation: every request looks the reviewer up in the reviewers file
//!   in force; a session whose reviewer, or whose passkey, left the file is
//!   over.
//! - CSRF: a state-changing request must come from the console's own
//!   origin (`Origin`) and carry the session's token (`x-csrf-token`, or the
//!   form's `csrf`); SameSite=Strict keeps the cookie off cross-site
//!   requests besides.

use std::time::Duration;

use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::store::{Store, StoreError};

/// The session cookie: `__Host-` binds it to this origin, path `/`, Secure
/// (browsers accept Secure cookies on `http://localhost`).
pub(crate) const COOKIE: &str = "__Host-countersign-review";

/// One signed-in reviewer, as the store keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Session {
    /// The reviewer's name.
    pub(crate) reviewer: String,
    /// The passkey that signed in.
    pub(crate) credential_id: String,
    /// The CSRF token of this session.
    pub(crate) csrf: String,
    /// When it ends, Unix ms.
    pub(crate) until_ms: i64,
}

/// The console's sessions, in the store shared by the gateways: kept under
/// the SHA-256 of their id, so that whoever reads the store (a backup, a
/// database operator) finds no cookie to present.
pub(crate) struct Sessions {
    ttl: Duration,
}

fn random_token() -> String {
    use base64::Engine;
    crate::core::passkey::b64url().encode(rand::random::<[u8; 32]>())
}

/// Where session `id` is in the store.
fn key_of(id: &str) -> String {
    format!("session/{}", hex::encode(Sha256::digest(id.as_bytes())))
}

impl Sessions {
    pub(crate) fn new(ttl: Duration) -> Sessions {
        Sessions { ttl }
    }

    /// Open a session for `reviewer` signed in with `credential_id`: its id
    /// (for the cookie) and the session.
    pub(crate) async fn open(
        &self,
        store: &dyn Store,
        now_ms: i64,
        reviewer: &str,
        credential_id: &str,
    ) -> Result<(String, Session), StoreError> {
        let id = random_token();
        let s = Session {
            reviewer: reviewer.to_owned(),
            credential_id: credential_id.to_owned(),
            csrf: random_token(),
            until_ms: now_ms.saturating_add(crate::core::time::ms(self.ttl)),
        };
        let text = serde_json::to_string(&s).map_err(|e| StoreError::Encode {
            what: "console session",
            reason: e.to_string(),
            cause: Some(crate::store::Cause::new(e)),
        })?;
        store.console_put(key_of(&id), text, s.until_ms).await?;
        Ok((id, s))
    }

    /// The live session `id` (`None`: none, or it ended).
    pub(crate) async fn get(
        &self,
        store: &dyn Store,
        now_ms: i64,
        id: &str,
    ) -> Result<Option<Session>, StoreError> {
        let Some(text) = store.console_get(key_of(id), now_ms).await? else {
            return Ok(None);
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| StoreError::Corrupt {
                what: "console session",
                reason: e.to_string(),
                cause: Some(crate::store::Cause::new(e)),
            })
    }

    /// End session `id`, on every gateway.
    pub(crate) async fn close(
        &self,
        store: &dyn Store,
        now_ms: i64,
        id: &str,
    ) -> Result<(), StoreError> {
        store.console_take(key_of(id), now_ms).await.map(drop)
    }

    /// How long a session lasts.
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }
}

/// The session id the request's cookie names.
pub(crate) fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (k, v) = pair.trim().split_once('=')?;
            (k == COOKIE).then(|| v.to_owned())
        })
}

/// The `Set-Cookie` value of a new session.
pub(crate) fn set_cookie(id: &str, ttl: Duration) -> String {
    format!(
        "{COOKIE}={id}; Path=/; Secure; HttpOnly; SameSite=Strict; Max-Age={}",
        ttl.as_secs()
    )
}

/// The `Set-Cookie` value that ends a session.
pub(crate) fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/; Secure; HttpOnly; SameSite=Strict; Max-Age=0")
}

/// Why a request has no reviewer behind it.
#[derive(Debug)]
pub(crate) enum NotSignedIn {
    /// No cookie, or one no session has (or had, and it ended).
    NoSession,
    /// The session's reviewer, or its passkey, is no longer in the
    /// reviewers file: the session ended with it.
    Revoked(String),
    /// The store could not say (fail closed: nobody is signed in).
    Unavailable(String),
}

impl NotSignedIn {
    /// What the reviewer is told.
    pub(crate) fn words(&self) -> String {
        match self {
            NotSignedIn::NoSession => "sign in first (your session ended or never began)".into(),
            NotSignedIn::Revoked(name) => format!(
                "reviewer `{name}` (or this passkey) is no longer in reviewers.toml: the session ended"
            ),
            NotSignedIn::Unavailable(e) => format!(
                "the console cannot read its sessions now ({e}): try again in a moment"
            ),
        }
    }
}

/// Whether a state-changing request is the console's own: its `Origin` is
/// `origin`, the console's (a page of another site cannot post here), and
/// it carries the session's CSRF token.
pub(crate) fn same_origin_and_token(
    origin: &str,
    headers: &HeaderMap,
    token: Option<&str>,
    session: &Session,
) -> Result<(), String> {
    let sent_origin = headers
        .get(axum::http::header::ORIGIN)
        .and_then(|v| v.to_str().ok());
    if sent_origin != Some(origin) {
        return Err(format!(
            "this request does not come from the console's own pages (Origin {}, not {origin}): nothing changed",
            sent_origin.unwrap_or("(none)"),
        ));
    }
    let sent = token.or_else(|| headers.get("x-csrf-token").and_then(|v| v.to_str().ok()));
    // Compared in constant time: the token is a secret of the session.
    let ok = sent.is_some_and(|t| {
        use subtle::ConstantTimeEq;
        bool::from(t.as_bytes().ct_eq(session.csrf.as_bytes()))
    });
    if !ok {
        return Err("the request lacks this session's CSRF token: reload the page and try again; nothing changed".into());
    }
    Ok(())
}

/// Only the console's own `origin` may post to its unauthenticated
/// endpoints (sign-in, enrolment) too.
pub(crate) fn same_origin(origin: &str, headers: &HeaderMap) -> Result<(), String> {
    let sent_origin = headers
        .get(axum::http::header::ORIGIN)
        .and_then(|v| v.to_str().ok());
    if sent_origin == Some(origin) {
        Ok(())
    } else {
        Err(format!(
            "this request does not come from the console's own pages (Origin {}, not {origin})",
            sent_origin.unwrap_or("(none)"),
        ))
    }
}
