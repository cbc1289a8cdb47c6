//! Sign-in with a passkey: a fresh server challenge, a WebAuthn assertion
//! with user verification over it, and a session. Failures are limited per
//! credential and per address, and audited.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use base64::Engine;
use serde_json::{json, Value};

use super::console::Console;
use super::pages;
use super::reply::{hardened, json_answer, refusal};
use super::session;
use crate::core::passkey::{self, Assertion, Expect};
use crate::front::gateway::Gateway;

/// `GET /review/sign-in`.
pub(crate) async fn page(State(c): State<Arc<Console>>) -> Response {
    pages::html(pages::sign_in(&c))
}

/// `POST /review/sign-in/options`: the options of
/// `navigator.credentials.get` for a sign-in (a discoverable passkey, user
/// verification required).
pub(crate) async fn options(State(c): State<Arc<Console>>, headers: HeaderMap) -> Response {
    if let Err(e) = session::same_origin(&c.origin, &headers) {
        return refusal(StatusCode::FORBIDDEN, "origin", e);
    }
    let challenge = match c.challenge("sign-in".into()).await {
        Ok(t) => t,
        Err(e) => return unavailable(&e),
    };
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
    State(c): State<Arc<Console>>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let gw = &c.gw;
    if let Err(e) = session::same_origin(&c.origin, &headers) {
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
    let allowed = match (c.allowed(&address).await, c.allowed(&credential).await) {
        (Ok(a), Ok(b)) => a && b,
        (Err(e), _) | (_, Err(e)) => return unavailable(&e),
    };
    if !allowed {
        gw.refused("console_sign_in", None, "sign-in attempts over the limit");
        return refusal(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "too many failed sign-ins from here or with this passkey: wait a few minutes",
        );
    }
    match verify(gw, &c, &assertion).await {
        Ok(name) => {
            let (id, s) = match c
                .sessions
                .open(c.store(), c.now_ms(), &name, &assertion.credential_id)
                .await
            {
                Ok(opened) => opened,
                Err(e) => return unavailable(&e),
            };
            let mut fields = serde_json::Map::new();
            fields.insert("reviewer".into(), Value::from(name.clone()));
            fields.insert(
                "credential_id".into(),
                Value::from(assertion.credential_id.clone()),
            );
            // Whose: `/v1/audit` shows it to reviewers of these tenants only.
            fields.insert("tenants".into(), tenants_of(gw, &assertion.credential_id));
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
        Err(Refused { why, signed }) => {
            // Credential ids are public: a failure counts against the
            // credential only once its own key signed the assertion (no UV,
            // a counter gone back), or anyone could lock a reviewer out by
            // naming their passkey. Every failure counts per address.
            c.failed(&address).await;
            if signed {
                c.failed(&credential).await;
            }
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
            fields.insert("tenants".into(), tenants_of(gw, &assertion.credential_id));
            gw.pipeline().audit("console_sign_in_refused", fields);
            gw.pipeline().metrics().refused("console_sign_in");
            tracing::warn!("review console sign-in refused: {shown}");
            refusal(StatusCode::UNAUTHORIZED, "sign_in_refused", why)
        }
    }
}

/// The tenants of the reviewer whose passkey `credential_id` is (none when
/// no listed reviewer has it).
fn tenants_of(gw: &Gateway, credential_id: &str) -> Value {
    let policies = gw.pipeline().policies();
    let tenants = policies
        .reviewers()
        .iter()
        .find(|r| r.passkey(credential_id).is_some())
        .map(|r| r.tenants.clone())
        .unwrap_or_default();
    Value::from(tenants)
}

/// Why a sign-in failed, and whether the passkey's own key had signed it.
struct Refused {
    why: String,
    signed: bool,
}

impl From<String> for Refused {
    /// A failure before any signature verified.
    fn from(why: String) -> Refused {
        Refused { why, signed: false }
    }
}

impl From<&str> for Refused {
    /// A failure before any signature verified.
    fn from(why: &str) -> Refused {
        Refused::from(why.to_owned())
    }
}

/// The reviewer whose passkey made `a` over a challenge this console issued
/// for a sign-in.
async fn verify(gw: &Gateway, c: &Console, a: &Assertion) -> Result<String, Refused> {
    let challenge = passkey::claimed_challenge(&a.client_data_json)?;
    // A challenge answers once: a captured sign-in cannot be replayed.
    if !c.take_challenge(&challenge, "sign-in").await {
        return Err(Refused::from(
            "the sign-in's challenge is not one this console issued, or it was used or expired: start again"
                .to_owned(),
        ));
    }
    let raw = passkey::b64url()
        .decode(&challenge)
        .map_err(|_| "the challenge is not base64url".to_owned())?;
    // The trust root: only a passkey listed in reviewers.toml signs in.
    let (name, key) = gw
        .pipeline()
        .policies()
        .reviewers()
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
    .map_err(|e| Refused {
        // `verify_assertion` checks the signature before the flags.
        signed: matches!(e, passkey::PasskeyError::AuthenticatorData(_)),
        why: e.to_string(),
    })?;
    gw.pipeline()
        .book()
        .passkey_counter(&name, &key.id, verified.counter)
        .await
        .map_err(|why| Refused { why, signed: true })?;
    Ok(name)
}

/// `POST /review/sign-out` (a form with the CSRF token).
pub(crate) async fn sign_out(
    State(c): State<Arc<Console>>,
    headers: HeaderMap,
    form: axum::extract::Form<HashMap<String, String>>,
) -> Response {
    if let Ok((_, s)) = c.signed_in(&headers).await {
        if let Err(e) = session::same_origin_and_token(
            &c.origin,
            &headers,
            form.get("csrf").map(String::as_str),
            &s,
        ) {
            return refusal(StatusCode::FORBIDDEN, "csrf", e);
        }
    }
    if let Some(id) = session::cookie(&headers) {
        if let Err(e) = c.sessions.close(c.store(), c.now_ms(), &id).await {
            return unavailable(&e);
        }
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

/// The store could not do what a sign-in needs: nothing changed, try again.
pub(crate) fn unavailable(e: &crate::store::StoreError) -> Response {
    tracing::warn!("the review console's state is unavailable: {e}");
    refusal(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        format!(
            "the console cannot reach its state now ({e}): nothing changed; try again in a moment"
        ),
    )
}
