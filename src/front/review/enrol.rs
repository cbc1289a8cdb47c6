//! Enrolment: a one-time link (`countersign reviewer invite`) on which the
//! invitee makes a passkey (a resident key, with user verification), and
//! the `[[reviewers]]` entry the operator adds to `reviewers.toml`.
//!
//! An invitation ([`super::invite`]) is used once (its use is recorded in
//! the store, durably, before anything else) and it expires. The gateway
//! audits each one when it first sees it (`reviewer_invited`), its use
//! (`reviewer_enrolled`), its lapse unused (`enrolment_expired`) and every
//! refused use (`enrolment_refused`). Nothing is trusted because of an
//! enrolment: the passkey counts only once its entry is in the reviewers
//! file, reviewed in git.

use std::path::Path;
use std::sync::Arc;

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Extension;
use base64::Engine;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::console::Console;
use super::invite::{enrolled_dir, entry, find, hash_of, invites, Invite, Lookup, Unusable};
use super::pages;
use super::reply::{json_answer, refusal};
use super::session;
use super::sign_in::unavailable;
use crate::core::passkey::{self, Alg, Expect, PasskeyKey, Registration};
use crate::front::gateway::Gateway;

fn now(gw: &Gateway) -> i64 {
    gw.pipeline().clock().now_ms()
}

fn audit(gw: &Gateway, kind: &'static str, fields: &[(&str, Value)]) {
    let mut f = serde_json::Map::new();
    for (k, v) in fields {
        f.insert((*k).to_owned(), v.clone());
    }
    gw.pipeline().audit(kind, f);
}

/// Audit every invitation once, whoever made it (`countersign reviewer
/// invite` writes files and cannot reach the gateway's log): run by the
/// sweeper and whenever a link is opened.
pub(crate) async fn note_invites(c: &Console) {
    let gw = &c.gw;
    let Ok(entries) = std::fs::read_dir(invites(&c.dir)) else {
        return;
    };
    let hashes: Vec<String> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter_map(|p| p.file_stem().and_then(|s| s.to_str()).map(str::to_owned))
        .collect();
    for hash in hashes {
        note(gw, &c.dir, &hash).await;
    }
}

/// Audit invitation `hash`: `reviewer_invited` the first time a gateway
/// sees it while it is good (once across restarts and gateways: a nonce in
/// the store), and `enrolment_expired` when it lapsed unused (its file is
/// renamed `.expired`, which also keeps it from being noted again).
async fn note(gw: &Gateway, dir: &Path, hash: &str) {
    let path = invites(dir).join(format!("{hash}.json"));
    let Some(invite) = std::fs::read(&path)
        .ok()
        .and_then(|t| serde_json::from_slice::<Invite>(&t).ok())
    else {
        return;
    };
    if invite.expires_ms > now(gw) {
        noted(gw, hash, &invite).await;
    } else if std::fs::rename(&path, path.with_extension("expired")).is_ok() {
        audit(
            gw,
            "enrolment_expired",
            &fields_of(
                hash,
                &invite,
                (
                    "expired",
                    Value::from(crate::core::time::rfc3339(invite.expires_ms)),
                ),
            ),
        );
    }
}

/// The fields of an invitation's audit entries, with `extra`.
fn fields_of(
    hash: &str,
    invite: &Invite,
    extra: (&'static str, Value),
) -> [(&'static str, Value); 6] {
    [
        ("reviewer", Value::from(invite.name.clone())),
        ("groups", json!(invite.groups)),
        ("tenants", json!(invite.tenants)),
        (
            "invited",
            Value::from(crate::core::time::rfc3339(invite.created_ms)),
        ),
        // The SHA-256 of the link's token, as the file is named: it
        // identifies the invitation and gives nothing towards the link.
        ("invite", Value::from(hash.to_owned())),
        extra,
    ]
}

/// Audit `reviewer_invited` for a good invitation the first time any
/// gateway sees it (once across restarts and gateways: a nonce in the
/// store). An invitation made on another host reaches the log here, when
/// its link is first opened.
async fn noted(gw: &Gateway, hash: &str, invite: &Invite) {
    let now = now(gw);
    match gw
        .pipeline()
        .store()
        .use_nonce(format!("invited/{hash}"), invite.expires_ms, now)
        .await
    {
        Ok(true) => audit(
            gw,
            "reviewer_invited",
            &fields_of(
                hash,
                invite,
                (
                    "expires",
                    Value::from(crate::core::time::rfc3339(invite.expires_ms)),
                ),
            ),
        ),
        Ok(false) => {}
        Err(e) => tracing::warn!("an invitation could not be noted, it is audited later: {e}"),
    }
}

/// The throttle key of an enrolment request's address.
fn address_of(peer: Option<Extension<ConnectInfo<SocketAddr>>>) -> String {
    format!(
        "enrol:{}",
        peer.map_or("unknown".into(), |Extension(ConnectInfo(a))| a
            .ip()
            .to_string())
    )
}

/// A refused use of an enrolment link: counted against its address, and
/// recorded. A link nobody issued goes to the sampled `refused` entry (one
/// per minute with its count), so made-up links cannot flood the log that
/// can never be edited; a real invitation's refused use is its own
/// `enrolment_refused` entry (the address limit bounds those).
async fn refused_use(c: &Console, address: &str, why: &Unusable) {
    c.failed(address).await;
    match why {
        Unusable::Unknown => c.gw.refused(
            "enrolment_link",
            None,
            "an enrolment link that no invitation issued",
        ),
        _ => audit(
            &c.gw,
            "enrolment_refused",
            &[("reason", Value::from(why.to_string()))],
        ),
    }
}

/// Too many refused enrolment requests from this address: nothing is
/// looked up for it for a while.
async fn slowed(c: &Console, address: &str) -> Option<Response> {
    match c.allowed(address).await {
        Ok(true) => return None,
        Ok(false) => {}
        Err(e) => return Some(unavailable(&e)),
    }
    c.gw.refused(
        "enrolment_link",
        None,
        "enrolment requests over the limit from one address",
    );
    Some(refusal(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limited",
        "too many refused enrolment requests from here: wait a few minutes",
    ))
}

/// `GET /review/enrol/{token}`.
pub(crate) async fn page(
    State(c): State<Arc<Console>>,
    UrlPath(token): UrlPath<String>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
) -> Response {
    let gw = &c.gw;
    let address = address_of(peer);
    if let Some(r) = slowed(&c, &address).await {
        return r;
    }
    match find(gw.pipeline().store().as_ref(), &c.dir, &token, now(gw)).await {
        Ok(invite) => {
            noted(gw, &hash_of(&token), &invite).await;
            pages::html(pages::enrol(&c, &invite, None))
        }
        Err(Lookup::Unusable(why)) => {
            note(gw, &c.dir, &hash_of(&token)).await;
            refused_use(&c, &address, &why).await;
            pages::html_status(StatusCode::GONE, pages::enrol_refused(&c, &why.to_string()))
        }
        Err(Lookup::Store(e)) => unavailable(&e),
    }
}

/// `POST /review/enrol/{token}/options`: the options of
/// `navigator.credentials.create`.
pub(crate) async fn options(
    State(c): State<Arc<Console>>,
    UrlPath(token): UrlPath<String>,
    headers: HeaderMap,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
) -> Response {
    let gw = &c.gw;
    if let Err(e) = session::same_origin(&c.origin, &headers) {
        return refusal(StatusCode::FORBIDDEN, "origin", e);
    }
    let address = address_of(peer);
    if let Some(r) = slowed(&c, &address).await {
        return r;
    }
    let invite = match find(gw.pipeline().store().as_ref(), &c.dir, &token, now(gw)).await {
        Ok(i) => i,
        Err(Lookup::Unusable(why)) => {
            c.failed(&address).await;
            return refusal(StatusCode::GONE, "enrolment", why.to_string());
        }
        Err(Lookup::Store(e)) => return unavailable(&e),
    };
    let challenge = match c.challenge(format!("enrol:{}", hash_of(&token))).await {
        Ok(t) => t,
        Err(e) => return unavailable(&e),
    };
    let user_id = passkey::b64url().encode(&Sha256::digest(invite.name.as_bytes())[..16]);
    json_answer(
        StatusCode::OK,
        json!({
            "challenge": challenge,
            "rp": { "id": c.rp_id, "name": "countersign review" },
            "user": { "id": user_id, "name": invite.name, "displayName": invite.name },
            "pubKeyCredParams": Alg::OFFERED.iter().map(|a| json!({"type": "public-key", "alg": a})).collect::<Vec<_>>(),
            "authenticatorSelection": {
                "residentKey": "required",
                "requireResidentKey": true,
                "userVerification": "required",
            },
            "attestation": "none",
            "timeout": 120_000,
            "extensions": { "credProps": true },
        }),
    )
}

/// `POST /review/enrol/{token}`: the new credential; its `[[reviewers]]`
/// entry.
pub(crate) async fn finish(
    State(c): State<Arc<Console>>,
    UrlPath(token): UrlPath<String>,
    headers: HeaderMap,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    body: axum::body::Bytes,
) -> Response {
    let gw = &c.gw;
    if let Err(e) = session::same_origin(&c.origin, &headers) {
        return refusal(StatusCode::FORBIDDEN, "origin", e);
    }
    let address = address_of(peer);
    if let Some(r) = slowed(&c, &address).await {
        return r;
    }
    match enrol(gw, &c, &token, &body).await {
        Ok((invite, key, entry)) => {
            audit(
                gw,
                "reviewer_enrolled",
                &[
                    ("reviewer", Value::from(invite.name.clone())),
                    ("tenants", json!(invite.tenants)),
                    ("credential_id", Value::from(key.id.clone())),
                    ("alg", Value::from(key.alg.as_str())),
                ],
            );
            tracing::info!(reviewer = %invite.name, credential = %key.id, "passkey enrolled: its entry waits to be added to reviewers.toml");
            json_answer(
                StatusCode::OK,
                json!({ "entry": entry, "reviewer": invite.name }),
            )
        }
        Err((status, why)) => {
            c.failed(&address).await;
            audit(
                gw,
                "enrolment_refused",
                &[(
                    "reason",
                    Value::from(crate::core::legible::text(&why).into_owned()),
                )],
            );
            refusal(status, "enrolment", why)
        }
    }
}

async fn enrol(
    gw: &Gateway,
    c: &Console,
    token: &str,
    body: &[u8],
) -> Result<(Invite, PasskeyKey, String), (StatusCode, String)> {
    let invite = find(gw.pipeline().store().as_ref(), &c.dir, token, now(gw))
        .await
        .map_err(|w| match w {
            Lookup::Unusable(w) => (StatusCode::GONE, w.to_string()),
            Lookup::Store(e) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the invitation could not be read ({e}): try again"),
            ),
        })?;
    let reg: Registration = serde_json::from_slice(body).map_err(|e| {
        (
            StatusCode::BAD_REQUEST,
            format!("the body is not a registration: {e}"),
        )
    })?;
    let challenge = passkey::claimed_challenge(&reg.client_data_json)
        .map_err(|e| (StatusCode::BAD_REQUEST, e.to_owned()))?;
    let hash = hash_of(token);
    if !c.take_challenge(&challenge, &format!("enrol:{hash}")).await {
        return Err((
            StatusCode::BAD_REQUEST,
            "the enrolment's challenge is not one this link was given, or it expired: reload the page".into(),
        ));
    }
    let raw = passkey::b64url().decode(&challenge).unwrap_or_default();
    let key = passkey::read_registration(
        &reg,
        &Expect {
            challenge: &raw,
            origin: &c.origin,
            rp_id: &c.rp_id,
        },
    )
    .map_err(|e| (StatusCode::BAD_REQUEST, e.to_string()))?;
    // A credential id already listed (another reviewer's, copied by the
    // enrollee's own authenticator or made up) is refused: its entry would
    // be refused by the reviewers file anyway, and must not be handed out.
    if let Some(holder) = gw
        .pipeline()
        .policies()
        .reviewers()
        .iter()
        .find(|r| r.passkey(&key.id).is_some())
    {
        return Err((
            StatusCode::CONFLICT,
            format!(
                "passkey `{}` is already listed in reviewers.toml (for `{}`): enrol a new passkey",
                key.id, holder.name
            ),
        ));
    }
    // Single use, across restarts and gateways: recorded before anything
    // is written for it.
    let fresh = gw
        .pipeline()
        .store()
        .use_nonce(format!("enrol/{hash}"), invite.expires_ms, now(gw))
        .await
        .map_err(|e| {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the enrolment could not be recorded ({e}): try again"),
            )
        })?;
    if !fresh {
        return Err((StatusCode::GONE, Unusable::Used.to_string()));
    }
    // The store's copy says it is used, on every gateway (the spent nonce
    // above is what refuses a second use; this words the refusal).
    let used = Invite {
        used_ms: Some(now(gw)),
        ..invite.clone()
    };
    if let Err(e) = gw
        .pipeline()
        .store()
        .console_put(Invite::key(&hash), used.text(), used.kept_until())
        .await
    {
        tracing::warn!("a used invitation could not be marked so (its second use is refused all the same): {e}");
    }
    let base = invites(&c.dir).join(&hash);
    // Best effort: the rename only tells `reviewer enrolled` and an
    // operator which are spent.
    let _ = std::fs::rename(base.with_extension("json"), base.with_extension("used"));
    let text = entry(&invite, &key);
    let folder = enrolled_dir(&c.dir);
    std::fs::create_dir_all(&folder)
        .and_then(|()| {
            std::fs::write(
                folder.join(format!(
                    "{}-{}.toml",
                    invite.name,
                    &key.id[..key.id.len().min(16)]
                )),
                &text,
            )
        })
        // The nonce is spent, so the reviewer must still see the entry to
        // hand to an administrator; the operator learns the copy is missing.
        .unwrap_or_else(|e| {
            tracing::warn!(
                reviewer = %invite.name,
                error = %e,
                "the enrolled passkey entry could not be written to {}; the reviewer was shown it",
                folder.display()
            );
        });
    Ok((invite, key, text))
}
