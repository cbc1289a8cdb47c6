//! Sign-in with a passkey: a fresh server challenge, a WebAuthn assertion
//! with user verification over it, and a session. Failures are limited per
//! credential and per address, and audited.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use base64::Engine;
use parking_lot::Mutex;
use serde_json::{json, Value};

use super::{console, hardened, json_answer, pages, refusal, session};
use crate::core::passkey::{self, Assertion, Expect};
use crate::front::gateway::Gateway;

/// Failed sign-ins allowed per credential and per address in [`WINDOW`].
const FAILURES: u32 = 5;
const WINDOW: Duration = Duration::from_secs(300);

/// Failed sign-ins, by `credential:ID` and `address:IP`.
#[derive(Default)]
pub(crate) struct Failures(Mutex<HashMap<String, (u32, Instant)>>);

impl Failures {
    /// Whether `key` may try again.
    fn allowed(&self, key: &str) -> bool {
        self.0
            .lock()
            .get(key)
            .is_none_or(|(n, since)| *n < FAILURES || since.elapsed() >= WINDOW)
    }

    fn failed(&self, key: &str) {
        let mut all = self.0.lock();
        // Many addresses failing once each must not grow this without bound:
        // entries whose window has passed say nothing any more.
        if all.len() >= 4096 {
            all.retain(|_, (_, since)| since.elapsed() < WINDOW);
        }
        let entry = all.entry(key.to_owned()).or_insert((0, Instant::now()));
        if entry.1.elapsed() >= WINDOW {
            *entry = (0, Instant::now());
        }
        entry.0 += 1;
    }
}

/// `GET /review/sign-in`.
pub(crate) async fn page(State(gw): State<Arc<Gateway>>) -> Response {
    match console(&gw) {
        Ok(c) => pages::html(pages::sign_in(c)),
        Err(r) => r,
    }
}

/// `POST /review/sign-in/options`: the options of
/// `navigator.credentials.get` for a sign-in (a discoverable passkey, user
/// verification required).
pub(crate) async fn options(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let c = match console(&gw) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if let Err(e) = session::same_origin(c, &headers) {
        return refusal(StatusCode::FORBIDDEN, "origin", e);
    }
    let challenge = c.challenge("sign-in".into());
    json_answer(
        StatusCode::OK,
        json!({
            "challenge": challenge,
            "rpId": c.rp_id,
            "timeout": 120_000,
            "userVerification": "required",
            "allowCredentials": [],
        }),
    )
}

/// `POST /review/sign-in`: the assertion; a session when it verifies.
pub(crate) async fn finish(
    State(gw): State<Arc<Gateway>>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let c = match console(&gw) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if let Err(e) = session::same_origin(c, &headers) {
        return refusal(StatusCode::FORBIDDEN, "origin", e);
    }
    let address = format!(
        "address:{}",
        peer.map_or("unknown".into(), |Extension(ConnectInfo(a))| a
            .ip()
            .to_string())
    );
    let assertion: Assertion = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => {
            return refusal(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("the body is not an assertion: {e}"),
            )
        }
    };
    let credential = format!("credential:{}", assertion.credential_id);
    // A guesser is slowed per address and per credential, before any work.
    if !c.failures.allowed(&address) || !c.failures.allowed(&credential) {
        gw.refused("console_sign_in", None, "sign-in attempts over the limit");
        return refusal(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "too many failed sign-ins from here or with this passkey: wait a few minutes",
        );
    }
    match verify(&gw, c, &assertion) {
        Ok(name) => {
            let (id, s) = c.sessions.open(&name, &assertion.credential_id);
            let mut fields = serde_json::Map::new();
            fields.insert("reviewer".into(), Value::from(name.clone()));
            fields.insert(
                "credential_id".into(),
                Value::from(assertion.credential_id.clone()),
            );
            gw.pipeline().audit("console_signed_in", fields);
            tracing::info!(reviewer = %name, "signed in to the review console");
            let mut r = json_answer(
                StatusCode::OK,
                json!({ "reviewer": name, "redirect": "/review/", "csrf": s.csrf }),
            );
            if let Ok(v) = HeaderValue::from_str(&session::set_cookie(&id, c.sessions.ttl())) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r
        }
        Err(why) => {
            c.failures.failed(&address);
            c.failures.failed(&credential);
            let shown = crate::core::legible::text(&why).into_owned();
            // Every tried sign-in that fails is its own audit entry (the
            // limit above bounds them per address and per passkey); the
            // attempts over the limit are counted by the sampled `refused`.
            let mut fields = serde_json::Map::new();
            fields.insert(
                "credential_id".into(),
                Value::from(assertion.credential_id.clone()),
            );
            fields.insert(
                "address".into(),
                Value::from(address.trim_start_matches("address:")),
            );
            fields.insert("reason".into(), Value::from(shown.clone()));
            gw.pipeline().audit("console_sign_in_refused", fields);
            gw.pipeline().metrics().refused("console_sign_in");
            tracing::warn!("review console sign-in refused: {shown}");
            refusal(StatusCode::UNAUTHORIZED, "sign_in_refused", why)
        }
    }
}

/// The reviewer whose passkey made `a` over a challenge this console issued
/// for a sign-in.
fn verify(gw: &Gateway, c: &super::Console, a: &Assertion) -> Result<String, String> {
    let client = passkey::b64url()
        .decode(&a.client_data_json)
        .map_err(|_| "clientDataJSON is not base64url".to_owned())?;
    let challenge = serde_json::from_slice::<Value>(&client)
        .ok()
        .and_then(|v| v["challenge"].as_str().map(str::to_owned))
        .unwrap_or_default();
    // A challenge answers once: a captured sign-in cannot be replayed.
    if !c.take_challenge(&challenge, "sign-in") {
        return Err("the sign-in's challenge is not one this console issued, or it was used or expired: start again".into());
    }
    let raw = passkey::b64url()
        .decode(&challenge)
        .map_err(|_| "the challenge is not base64url".to_owned())?;
    let policies = gw.pipeline().policies();
    let reviewers = policies.reviewers();
    // The trust root: only a passkey listed in reviewers.toml signs in.
    let (name, key) = reviewers
        .iter()
        .find_map(|r| r.passkey(&a.credential_id).map(|k| (r.name.clone(), k.clone())))
        .ok_or_else(|| {
            format!(
                "passkey `{}` is not in reviewers.toml: add the entry its enrolment showed (`countersign reviewer enrolled`), then sign in",
                a.credential_id
            )
        })?;
    let verified = passkey::verify_assertion(
        &key,
        a,
        &Expect {
            challenge: &raw,
            origin: &c.origin,
            rp_id: &c.rp_id,
        },
    )
    .map_err(|e| e.to_string())?;
    gw.pipeline()
        .book()
        .passkey_counter(&key.id, verified.counter)?;
    Ok(name)
}

/// `POST /review/sign-out` (a form with the CSRF token).
pub(crate) async fn sign_out(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    form: axum::extract::Form<HashMap<String, String>>,
) -> Response {
    let c = match console(&gw) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if let Ok((_, s)) = session::reviewer_of(&gw, c, &headers) {
        if let Err(e) =
            session::same_origin_and_token(c, &headers, form.get("csrf").map(String::as_str), &s)
        {
            return refusal(StatusCode::FORBIDDEN, "csrf", e);
        }
    }
    if let Some(id) = session::cookie(&headers) {
        c.sessions.close(&id);
    }
    let mut r = hardened(
        (
            StatusCode::SEE_OTHER,
            [(header::LOCATION, "/review/sign-in")],
        )
            .into_response(),
    );
    if let Ok(v) = HeaderValue::from_str(&session::clear_cookie()) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::{Failures, FAILURES};

    #[test]
    fn a_credential_or_address_is_refused_after_its_failures_and_others_are_not() {
        let f = Failures::default();
        for _ in 0..FAILURES - 1 {
            f.failed("credential:a");
        }
        assert!(f.allowed("credential:a"), "below the limit");
        f.failed("credential:a");
        assert!(!f.allowed("credential:a"), "at the limit");
        assert!(
            f.allowed("credential:b"),
            "another credential is unaffected"
        );
        assert!(
            f.allowed("address:192.0.2.1"),
            "an address is counted apart"
        );
    }
}
