//! Approve, deny and withdraw in the console.
//!
//! Approving (or denying) is two requests around one WebAuthn ceremony:
//! `statement` builds the very statement the TUI and CLI sign (section 6
//! of the design) from the proposal as the gateway holds it, and gives its
//! JCS SHA-256 digest as the challenge; the passkey signs it with user
//! verification; `decide` hands statement and assertion to the approval
//! book, which checks both (the signature with the credential in
//! `reviewers.toml`, the client data's type, origin and challenge, the
//! rpIdHash and UV, the counter, the `approve` policy) before it records
//! the decision, durably, and only then says so.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use base64::Engine;
use serde::Deserialize;
use serde_json::json;

use super::console::Console;
use super::reply::{json_answer, refusal};
use super::session;
use crate::core::approval::{ProposalState, Statement, Verdict};
use crate::core::passkey::{self, Assertion};
use crate::core::reviewers::Reviewer;
use crate::enforce::book::{DecideError, Proof};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Ask {
    decision: Verdict,
    #[serde(default)]
    reason: String,
    /// `15m`, `1h`: how long an approval may be used (default
    /// `approvals.ttl`).
    #[serde(default)]
    ttl: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Signed {
    statement: Statement,
    assertion: Assertion,
}

/// The signed-in reviewer of a state-changing request: a live session whose
/// reviewer and passkey are in the reviewers file, from the console's own
/// origin, with the session's CSRF token.
async fn reviewer(
    c: &Console,
    headers: &HeaderMap,
) -> Result<(Reviewer, session::Session), Response> {
    let (r, s) = c.signed_in(headers).await.map_err(|why| {
        let (status, code) = match why {
            session::NotSignedIn::NoSession => (StatusCode::UNAUTHORIZED, "signed_out"),
            session::NotSignedIn::Revoked(_) => (StatusCode::UNAUTHORIZED, "revoked"),
            session::NotSignedIn::Unavailable(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
            }
        };
        refusal(status, code, why.words())
    })?;
    session::same_origin_and_token(&c.origin, headers, None, &s).map_err(|e| {
        c.gw.refused("console_csrf", None, &e);
        refusal(StatusCode::FORBIDDEN, "csrf", e)
    })?;
    Ok((r, s))
}

/// A JSON body of the shape `shape`, or a 400 that names the shape.
#[expect(
    clippy::result_large_err,
    reason = "the Err side is the handler's answer itself, returned once per request"
)]
fn body_of<T: serde::de::DeserializeOwned>(body: &[u8], shape: &str) -> Result<T, Response> {
    serde_json::from_slice(body).map_err(|e| {
        refusal(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("the body must be {shape}: {e}"),
        )
    })
}

/// `POST /review/p/{id}/statement`: the statement to sign, and the
/// challenge that is its digest.
pub(crate) async fn statement(
    State(c): State<Arc<Console>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let gw = &c.gw;
    let (reviewer, s) = match reviewer(&c, &headers).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let ask: Ask = match body_of(&body, "{decision, reason, ttl}") {
        Ok(a) => a,
        Err(r) => return r,
    };
    if ask.decision == Verdict::Deny && ask.reason.trim().is_empty() {
        return refusal(
            StatusCode::BAD_REQUEST,
            "reason",
            "a denial needs a reason: the agent and the audit log get it",
        );
    }
    let default_ttl = gw.config().approvals.ttl;
    let ttl = match ask.ttl.trim() {
        "" => default_ttl,
        t => match humantime::parse_duration(t) {
            Ok(d) if !d.is_zero() => d.min(default_ttl),
            _ => {
                return refusal(
                    StatusCode::BAD_REQUEST,
                    "ttl",
                    format!("`{t}` is not a duration like 15m or 1h"),
                )
            }
        },
    };
    let p = match gw.pipeline().book().get(&id).await {
        Ok(Some(p)) if reviewer.covers(&p.tenant) => p,
        Ok(_) => {
            return refusal(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no proposal `{id}`"),
            )
        }
        Err(e) => return refusal(StatusCode::SERVICE_UNAVAILABLE, "store", e.to_string()),
    };
    if p.state != ProposalState::Pending {
        return refusal(
            StatusCode::CONFLICT,
            "not_pending",
            format!("proposal `{id}` is {}, not pending", p.state.as_str()),
        );
    }
    let now = gw.pipeline().clock().now_ms();
    let expires = now.saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX));
    let policies = gw.pipeline().policies();
    let policy_set = policies.digest();
    let statement = p.statement(
        ask.decision,
        &reviewer.name,
        &ask.reason,
        &crate::core::time::rfc3339(now),
        &crate::core::time::rfc3339(expires),
        Some(policy_set),
    );
    let digest = match statement.digest_bytes() {
        Ok(d) => d,
        Err(e) => {
            return refusal(
                StatusCode::INTERNAL_SERVER_ERROR,
                "statement",
                e.to_string(),
            )
        }
    };
    json_answer(
        StatusCode::OK,
        json!({
            "statement": statement,
            "challenge": passkey::b64url().encode(digest),
            "rpId": c.rp_id,
            "allowCredentials": [{ "type": "public-key", "id": s.credential_id }],
            "userVerification": "required",
            "timeout": 120_000,
        }),
    )
}

/// `POST /review/p/{id}/decide`: the statement and the passkey's assertion
/// over its digest.
pub(crate) async fn decide(
    State(c): State<Arc<Console>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let gw = &c.gw;
    let (reviewer, _) = match reviewer(&c, &headers).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let signed: Signed = match body_of(&body, "{statement, assertion}") {
        Ok(s) => s,
        Err(r) => return r,
    };
    let verdict = signed.statement.decision;
    let proof = Proof::Passkey {
        assertion: &signed.assertion,
        origin: &c.origin,
        rp_id: &c.rp_id,
    };
    match crate::front::control::decide_with(gw, &id, signed.statement, proof, &reviewer).await {
        Ok(p) => {
            let message = match (verdict, p.state) {
                (Verdict::Approve, ProposalState::Approved) => {
                    format!("approved, recorded: {}/{} may run once", p.server, p.tool)
                }
                (Verdict::Approve, _) => format!(
                    "your approval is recorded; {}",
                    p.progress()
                        .unwrap_or_else(|| "it waits for more reviewers".into())
                ),
                (Verdict::Deny, ProposalState::Denied) => {
                    "denied, recorded: the call will not run".into()
                }
                (Verdict::Deny, _) => "your denial is recorded; it takes more to end it".into(),
            };
            json_answer(
                StatusCode::OK,
                json!({ "message": message, "state": p.state.as_str() }),
            )
        }
        Err(e) => {
            let shown = crate::core::legible::text(&e.to_string()).into_owned();
            tracing::warn!(proposal = %id, reviewer = %reviewer.name, "console decision refused: {shown}");
            refusal(status_of(&e), "refused", e.to_string())
        }
    }
}

/// `POST /review/p/{id}/withdraw`.
pub(crate) async fn withdraw(
    State(c): State<Arc<Console>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let gw = &c.gw;
    let (reviewer, _) = match reviewer(&c, &headers).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    match gw.pipeline().book().withdraw(&id, &reviewer).await {
        Ok(p) => json_answer(
            StatusCode::OK,
            json!({ "message": format!("your approval is withdrawn{}", p.progress().map(|t| format!(" ({t})")).unwrap_or_default()), "state": p.state.as_str() }),
        ),
        Err(e) => refusal(status_of(&e), "refused", e.to_string()),
    }
}

fn status_of(e: &DecideError) -> StatusCode {
    match e {
        DecideError::NotFound(_) => StatusCode::NOT_FOUND,
        DecideError::NotPending { .. } | DecideError::TooLate { .. } => StatusCode::CONFLICT,
        DecideError::Forbidden(_) => StatusCode::FORBIDDEN,
        DecideError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::UNPROCESSABLE_ENTITY,
    }
}
