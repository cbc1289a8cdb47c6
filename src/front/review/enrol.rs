//! Enrolment: a one-time link (`countersign reviewer invite`) on which the
//! invitee makes a passkey (a resident key, with user verification), and
//! the `[[reviewers]]` entry the operator adds to `reviewers.toml`.
//!
//! An invite is a file `DATA_DIR/review/invites/HASH.json`, named by the
//! SHA-256 of its token (the token itself is stored nowhere). It is used
//! once (its use is recorded in the store, durably, and the file renamed),
//! and it expires. The gateway audits each one when it first sees it
//! (`reviewer_invited`), its use (`reviewer_enrolled`), its lapse unused
//! (`enrolment_expired`) and every refused use (`enrolment_refused`). Nothing is trusted because of an enrolment: the passkey
//! counts only once its entry is in the reviewers file, reviewed in git.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::{console, json_answer, pages, refusal, session, Console};
use crate::core::passkey::{self, Alg, Expect, PasskeyKey, Registration};
use crate::front::gateway::Gateway;

/// One invitation, as its file holds it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Invite {
    /// The reviewer's name in `reviewers.toml`.
    pub(crate) name: String,
    /// Their groups.
    pub(crate) groups: Vec<String>,
    /// Their tenants.
    pub(crate) tenants: Vec<String>,
    /// Unix ms: made.
    pub(crate) created_ms: i64,
    /// Unix ms: no longer good after this.
    pub(crate) expires_ms: i64,
}

fn hash_of(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

fn invites(dir: &Path) -> PathBuf {
    dir.join("invites")
}

/// Where finished enrolments are kept (`countersign reviewer enrolled`).
pub(crate) fn enrolled_dir(dir: &Path) -> PathBuf {
    dir.join("enrolled")
}

/// Write an invitation under `dir` (`DATA_DIR/review`); its token (32
/// random bytes, base64url), which only the link carries.
pub(crate) fn write_invite(
    dir: &Path,
    name: &str,
    groups: &[String],
    tenants: &[String],
    ttl: Duration,
    now_ms: i64,
) -> std::io::Result<String> {
    let token = passkey::b64url().encode(rand::random::<[u8; 32]>());
    let invite = Invite {
        name: name.to_owned(),
        groups: groups.to_vec(),
        tenants: tenants.to_vec(),
        created_ms: now_ms,
        expires_ms: now_ms.saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)),
    };
    let folder = invites(dir);
    std::fs::create_dir_all(&folder)?;
    let path = folder.join(format!("{}.json", hash_of(&token)));
    let text = serde_json::to_vec_pretty(&invite).map_err(std::io::Error::other)?;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(&path)?;
    std::io::Write::write_all(&mut f, &text)?;
    f.sync_all()?;
    Ok(token)
}

/// Why an enrolment link does not work.
#[derive(Debug)]
pub(crate) enum Unusable {
    /// No invitation has this token.
    Unknown,
    /// It was used.
    Used,
    /// It expired.
    Expired(i64),
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unusable::Unknown => f.write_str("this enrolment link is not valid: ask for a new one (`countersign reviewer invite`)"),
            Unusable::Used => f.write_str("this enrolment link was used already: each link enrols one passkey; ask for a new one"),
            Unusable::Expired(at) => write!(
                f,
                "this enrolment link expired at {}: ask for a new one",
                crate::core::time::rfc3339(*at)
            ),
        }
    }
}

/// The invitation behind `token`, while it may be used.
pub(crate) fn find(dir: &Path, token: &str, now_ms: i64) -> Result<Invite, Unusable> {
    let base = invites(dir).join(hash_of(token));
    if base.with_extension("used").exists() {
        return Err(Unusable::Used);
    }
    let text = std::fs::read(base.with_extension("json"))
        .or_else(|_| std::fs::read(base.with_extension("expired")))
        .map_err(|_| Unusable::Unknown)?;
    let invite: Invite = serde_json::from_slice(&text).map_err(|_| Unusable::Unknown)?;
    if invite.expires_ms <= now_ms {
        return Err(Unusable::Expired(invite.expires_ms));
    }
    Ok(invite)
}

/// The `[[reviewers]]` entry of an enrolment.
pub(crate) fn entry(invite: &Invite, key: &PasskeyKey) -> String {
    let list = |items: &[String]| {
        let quoted: Vec<String> = items
            .iter()
            .map(|i| toml::Value::String(i.clone()).to_string())
            .collect();
        format!("[{}]", quoted.join(", "))
    };
    format!(
        "[[reviewers]]\nname = {}\ngroups = {}\ntenants = {}\npasskeys = [{{ id = \"{}\", public_key = \"{}\", alg = \"{}\" }}]\n",
        toml::Value::String(invite.name.clone()),
        list(&invite.groups),
        list(&invite.tenants),
        key.id,
        key.public_key,
        key.alg.as_str()
    )
}

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
pub(crate) async fn note_invites(gw: &Gateway) {
    let Some(c) = gw.console() else { return };
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
    let now = now(gw);
    let fields = |extra: (&'static str, Value)| {
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
    };
    if invite.expires_ms > now {
        match gw
            .pipeline()
            .store()
            .use_nonce(format!("invited/{hash}"), invite.expires_ms, now)
            .await
        {
            Ok(true) => audit(
                gw,
                "reviewer_invited",
                &fields((
                    "expires",
                    Value::from(crate::core::time::rfc3339(invite.expires_ms)),
                )),
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!("an invitation could not be noted, it is audited later: {e}"),
        }
    } else if std::fs::rename(&path, path.with_extension("expired")).is_ok() {
        audit(
            gw,
            "enrolment_expired",
            &fields((
                "expired",
                Value::from(crate::core::time::rfc3339(invite.expires_ms)),
            )),
        );
    }
}

/// `GET /review/enrol/{token}`.
pub(crate) async fn page(
    State(gw): State<Arc<Gateway>>,
    UrlPath(token): UrlPath<String>,
) -> Response {
    let c = match console(&gw) {
        Ok(c) => c,
        Err(r) => return r,
    };
    note(&gw, &c.dir, &hash_of(&token)).await;
    match find(&c.dir, &token, now(&gw)) {
        Ok(invite) => pages::html(pages::enrol(c, &invite, None)),
        Err(why) => {
            audit(
                &gw,
                "enrolment_refused",
                &[("reason", Value::from(why.to_string()))],
            );
            pages::html_status(StatusCode::GONE, pages::enrol_refused(c, &why.to_string()))
        }
    }
}

/// `POST /review/enrol/{token}/options`: the options of
/// `navigator.credentials.create`.
pub(crate) async fn options(
    State(gw): State<Arc<Gateway>>,
    UrlPath(token): UrlPath<String>,
    headers: HeaderMap,
) -> Response {
    let c = match console(&gw) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if let Err(e) = session::same_origin(c, &headers) {
        return refusal(StatusCode::FORBIDDEN, "origin", e);
    }
    let invite = match find(&c.dir, &token, now(&gw)) {
        Ok(i) => i,
        Err(why) => return refusal(StatusCode::GONE, "enrolment", why.to_string()),
    };
    let challenge = c.challenge(format!("enrol:{}", hash_of(&token)));
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
    State(gw): State<Arc<Gateway>>,
    UrlPath(token): UrlPath<String>,
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
    match enrol(&gw, c, &token, &body).await {
        Ok((invite, key, entry)) => {
            audit(
                &gw,
                "reviewer_enrolled",
                &[
                    ("reviewer", Value::from(invite.name.clone())),
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
            audit(
                &gw,
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
    let invite = find(&c.dir, token, now(gw)).map_err(|w| (StatusCode::GONE, w.to_string()))?;
    let reg: Registration = serde_json::from_slice(body).map_err(|e| {
        (
            StatusCode::BAD_REQUEST,
            format!("the body is not a registration: {e}"),
        )
    })?;
    let client = passkey::b64url()
        .decode(&reg.client_data_json)
        .map_err(|_| {
            (
                StatusCode::BAD_REQUEST,
                "clientDataJSON is not base64url".to_owned(),
            )
        })?;
    let challenge = serde_json::from_slice::<Value>(&client)
        .ok()
        .and_then(|v| v["challenge"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let hash = hash_of(token);
    if !c.take_challenge(&challenge, &format!("enrol:{hash}")) {
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
    let base = invites(&c.dir).join(&hash);
    // Best effort: the spent nonce above is what refuses a second use; the
    // rename only tells `reviewer enrolled` and an operator which are spent.
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
