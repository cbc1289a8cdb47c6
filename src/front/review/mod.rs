//! The reviewer web console (DESIGN.md section 21): `/review/` on the
//! gateway's listener, at the console's origin, where a reviewer signs in
//! with a passkey and decides proposals with it.
//!
//! Every decision is a WebAuthn assertion whose challenge is the approval
//! statement's digest, checked by the approval book exactly as an ed25519
//! statement is (`enforce::book::Proof::Passkey`). The console adds the
//! ways in:
//! - [`enrol`]: one-time enrolment links (`countersign reviewer invite`)
//!   that make a passkey and show the `[[reviewers]]` entry to add;
//! - [`sign_in`]: a passkey sign-in and the session it opens;
//! - [`decide`]: approve, deny and withdraw;
//! - [`session`]: the `__Host-` cookie, the CSRF token, the Origin check;
//! - [`pages`]: the server-rendered pages (maud), no logic in them;
//! - [`assets`]: the one script (WebAuthn only) and the style sheet,
//!   compiled into the binary.
//!
//! The reviewers file stays the trust root: a passkey signs nothing that
//! counts until its entry is in `reviewers.toml`, and a session ends when
//! its reviewer's entry (or that passkey) leaves the file.

pub(crate) mod assets;
pub(crate) mod decide;
pub(crate) mod enrol;
pub(crate) mod pages;
pub(crate) mod session;
pub(crate) mod sign_in;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use parking_lot::Mutex;

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

/// The console's state on this gateway.
pub(crate) struct Console {
    /// `https://gw.example.com` (or `http://localhost:PORT`).
    pub(crate) origin: String,
    /// The WebAuthn relying party id.
    pub(crate) rp_id: String,
    /// `DATA_DIR/review`: `invites/` and `enrolled/`.
    pub(crate) dir: PathBuf,
    /// Challenges issued and not yet answered, by their base64url text.
    pub(crate) challenges: Mutex<HashMap<String, Issued>>,
    /// Signed-in sessions.
    pub(crate) sessions: session::Sessions,
    /// Failed sign-ins, per credential and per address.
    pub(crate) failures: sign_in::Failures,
}

impl Console {
    /// The console at `origin` for relying party `rp_id`, keeping its
    /// enrolments under `data_dir/review`.
    pub(crate) fn new(
        origin: String,
        rp_id: String,
        data_dir: &std::path::Path,
        session_ttl: Duration,
    ) -> Console {
        Console {
            origin,
            rp_id,
            dir: data_dir.join("review"),
            challenges: Mutex::new(HashMap::new()),
            sessions: session::Sessions::new(session_ttl),
            failures: sign_in::Failures::default(),
        }
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
}

/// The console's routes (merged into the gateway's router; they answer 404
/// while the console is off).
pub(crate) fn router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/review", get(pages::to_list))
        .route("/review/", get(pages::list))
        .route("/review/history", get(pages::history))
        .route("/review/p/{id}", get(pages::proposal))
        .route("/review/p/{id}/statement", post(decide::statement))
        .route("/review/p/{id}/decide", post(decide::decide))
        .route("/review/p/{id}/withdraw", post(decide::withdraw))
        .route("/review/sign-in", get(sign_in::page).post(sign_in::finish))
        .route("/review/sign-in/options", post(sign_in::options))
        .route("/review/sign-out", post(sign_in::sign_out))
        .route(
            "/review/enrol/{token}",
            get(enrol::page).post(enrol::finish),
        )
        .route("/review/enrol/{token}/options", post(enrol::options))
        .route("/review/assets/{file}", get(assets::serve))
        .with_state(gw)
}

/// The console, or 404 when it is off.
#[expect(clippy::result_large_err, reason = "the refusal is the response")]
pub(crate) fn console(gw: &Gateway) -> Result<&Arc<Console>, Response> {
    gw.console().ok_or_else(|| {
        (
            StatusCode::NOT_FOUND,
            "the review console is off ([review] enabled = false)\n",
        )
            .into_response()
    })
}

/// The headers every console answer carries: a strict Content-Security-
/// Policy (the one script is a file of the console's own; no inline
/// script, no frames), no caching (a proposal page is not kept anywhere),
/// and no referrer.
pub(crate) fn hardened(mut r: Response) -> Response {
    let h = r.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    r
}

/// A JSON answer of the console, hardened.
pub(crate) fn json_answer(status: StatusCode, body: serde_json::Value) -> Response {
    hardened(
        (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response(),
    )
}

/// A refusal as JSON: `{error: {code, message}}`, the message for the
/// status line of the page (`data-role="status"`).
pub(crate) fn refusal(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    json_answer(
        status,
        serde_json::json!({ "error": { "code": code, "message": message.into() } }),
    )
}
