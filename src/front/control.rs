//! The reviewer control API, `/v1` on the gateway's listener (DESIGN.md
//! sections 1 and 6).
//!
//! | route | what |
//! |---|---|
//! | `GET /v1/proposals[?state=pending]` | proposals of the reviewer's tenants, newest first |
//! | `GET /v1/proposals/{id}` | one proposal, with a one-sentence summary |
//! | `POST /v1/proposals/{id}/decision` | `{statement, signature}`: a signed approve or deny |
//! | `POST /v1/proposals/{id}/withdraw` | take the reviewer's own approval back while a quorum is not met |
//! | `GET /v1/outcomes` | `unknown` ledger records of the reviewer's tenants |
//! | `POST /v1/outcomes/reconcile` | settle one: `{tenant, principal, key, resolution, note?, result?}` |
//! | `GET /v1/events` | SSE: `proposal_created` / `proposal_updated` |
//! | `GET /v1/audit[?limit=N]` | the last N (default 50, at most 500) audit entries of the reviewer's tenants |
//!
//! Every request is signed with the reviewer's ed25519 key
//! (`Authorization: Countersign-Ed25519 reviewer=..,time=..,signature=..`
//! over method, path, time and body hash; see [`crate::core::approval`]). There is
//! no shared secret to leak: the key that signs approvals also opens the
//! API. Requests from non-loopback peers are refused unless
//! `approvals.remote_control` is set. Reviewers see only the tenants listed
//! for them in `reviewers.toml`; anything else is "not found".

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, FromRequest, Path, Query, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::core::approval::{self, Proposal, ProposalState, Statement};
use crate::core::reviewers::Reviewer;
use crate::core::signed_request::RequestAuth;
use crate::core::time::{parse_rfc3339, rfc3339};
use crate::enforce::book::DecideError;
use crate::front::gateway::Gateway;

/// The control API's routes (merged into the gateway's router).
pub(crate) fn router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/v1/proposals", get(list))
        .route("/v1/proposals/{id}", get(show))
        .route("/v1/proposals/{id}/decision", post(decide))
        .route("/v1/proposals/{id}/withdraw", post(withdraw))
        .route("/v1/outcomes", get(outcomes))
        .route("/v1/budgets", get(budgets))
        .route("/v1/outcomes/reconcile", post(reconcile))
        .route("/v1/events", get(events))
        .route("/v1/audit", get(audit_tail))
        .route("/v1/inputs", get(inputs))
        .with_state(gw)
}

fn problem(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let mut r = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        json!({ "error": { "code": code, "message": message.into() } }).to_string(),
    )
        .into_response();
    // The code again, for the front's own accounting (`refused`).
    if let Ok(v) = header::HeaderValue::from_str(code) {
        r.headers_mut().insert("countersign-refusal", v);
    }
    r
}

fn ok(body: Value) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// Who signed this request, or why it is refused. Checks, in order: the
/// peer is loopback (unless remote control is on), the header parses, the
/// reviewer is registered, the signed time is within `clock_skew`, the
/// signature covers this method, path, nonce and body, and, for a request
/// that changes something, the nonce was never used (recorded in the store
/// until the time window has passed).
async fn authenticate(
    gw: &Gateway,
    peer: Option<SocketAddr>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Reviewer, Response> {
    let cfg = &gw.config().approvals;
    // Loopback only by default: the control API decides what runs, so it is
    // not exposed to the network by accident (an unknown peer counts as
    // remote: fail closed).
    if !cfg.remote_control && !peer.is_some_and(|p| p.ip().is_loopback()) {
        return Err(problem(
            StatusCode::FORBIDDEN,
            "remote_refused",
            "the control API answers loopback peers only: run the CLI on the gateway's host (or set approvals.remote_control = true behind TLS)",
        ));
    }
    let unauthorized = |m: String| problem(StatusCode::UNAUTHORIZED, "unauthenticated", m);
    let value = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| unauthorized("missing `Authorization`: sign requests with a reviewer key (countersign CLI or countersign-review)".into()))?;
    let auth = RequestAuth::parse(value).map_err(|e| unauthorized(e.to_string()))?;
    let policies = gw.pipeline().policies();
    let reviewer = policies
        .reviewers()
        .get(&auth.reviewer)
        .cloned()
        .ok_or_else(|| {
            unauthorized(format!(
                "reviewer `{}` is not in reviewers.toml: add the line `countersign keygen` printed to the policy repository",
                auth.reviewer
            ))
        })?;
    let signed = parse_rfc3339(&auth.time)
        .ok_or_else(|| unauthorized(format!("`time` `{}` is not RFC 3339", auth.time)))?;
    let now = (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64;
    // A captured request replays only within this window.
    if (signed - now).abs() > cfg.clock_skew.as_millis() as i64 {
        return Err(unauthorized(format!(
            "the request's time {} is too far from the gateway's clock ({}): check the reviewer's clock",
            auth.time,
            rfc3339(now)
        )));
    }
    let path = uri.path_and_query().map_or(uri.path(), |p| p.as_str());
    // Any of the reviewer's keys may have signed.
    reviewer
        .verify_with(|k| auth.verify(k, method.as_str(), path, body))
        .map_err(|e| {
            unauthorized(e.map_or_else(
                || format!("reviewer `{}` has no key", auth.reviewer),
                |e| e.to_string(),
            ))
        })?;
    // Replay: a captured approval or withdrawal, sent again within the
    // window, would redo what the reviewer since undid. Each request that
    // changes something is good once; its nonce is kept until its signed
    // time falls out of the window, in the store (so a restart or another
    // gateway remembers it too). Reads change nothing and are not recorded.
    if method != Method::GET && method != Method::HEAD {
        let until = signed
            .saturating_add(cfg.clock_skew.as_millis() as i64)
            .saturating_add(1000);
        let key = format!("control/{}/{}", reviewer.name, auth.nonce);
        match gw.pipeline().store().use_nonce(key, until, now).await {
            Ok(true) => {}
            Ok(false) => {
                return Err(problem(
                    StatusCode::UNAUTHORIZED,
                    "replayed",
                    format!(
                        "this signed request (nonce {}) was already used: a control request is good once, and nothing changed (sign a new one: the CLI and TUI do)",
                        auth.nonce
                    ),
                ))
            }
            Err(e) => {
                // Fail closed: without the record, a replay cannot be told
                // from a first use.
                return Err(problem(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store",
                    format!("the request's nonce could not be recorded ({e}): nothing changed; try again"),
                ));
            }
        }
    }
    Ok(reviewer)
}

/// A request signed by a registered reviewer: the reviewer and the body the
/// signature covers. Handlers that take it cannot run for anyone else.
pub(crate) struct Signed {
    /// Who signed.
    pub reviewer: Reviewer,
    /// The request body (already read: the signature covers its hash).
    pub body: Bytes,
}

impl FromRequest<Arc<Gateway>> for Signed {
    type Rejection = Response;

    async fn from_request(req: Request, gw: &Arc<Gateway>) -> Result<Self, Self::Rejection> {
        let (parts, body) = req.into_parts();
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(a)| *a);
        // The deadline is the router's (`bounds`), from the request's start.
        let within = gw.config().gateway.body_read_timeout;
        let body = axum::body::to_bytes(body, gw.config().limits.max_body_bytes)
            .await
            .map_err(|e| {
                if crate::front::bounds::is_deadline(&*e.into_inner()) {
                    gw.refused("body_timeout", None, "the request body did not arrive in time");
                    return problem(
                        StatusCode::REQUEST_TIMEOUT,
                        "body_timeout",
                        format!(
                            "the body did not arrive within gateway.body_read_timeout ({}): nothing changed",
                            humantime::format_duration(within)
                        ),
                    );
                }
                problem(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "too_large",
                    "the body could not be read whole within limits.max_body_bytes",
                )
            })?;
        let reviewer = authenticate(gw, peer, &parts.method, &parts.uri, &parts.headers, &body)
            .await
            .inspect_err(|r| {
                let what = match r.status() {
                    StatusCode::UNAUTHORIZED
                        if r.headers()
                            .get("countersign-refusal")
                            .is_some_and(|v| v == "replayed") =>
                    {
                        "control_replay"
                    }
                    StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => "control",
                    _ => return,
                };
                gw.refused(
                    what,
                    None,
                    &format!(
                        "{} {}: refused with {}",
                        parts.method,
                        parts.uri.path(),
                        r.status()
                    ),
                );
            })?;
        Ok(Signed { reviewer, body })
    }
}

/// A proposal as the API shows it: the stored record plus a plain
/// sentence, RFC 3339 times (`pending_expires_at`: when an undecided
/// proposal expires), where its quorum stands (`progress`), and the digest
/// of the policy set in force (`policy_set`), which a reviewer's statement
/// names.
pub(crate) fn view(p: &Proposal, gw: &Gateway) -> Value {
    let pending_ttl = gw.config().approvals.pending_ttl;
    let mut v = serde_json::to_value(p).unwrap_or(Value::Null);
    if let Some(o) = v.as_object_mut() {
        o.insert("summary".into(), json!(approval::summary(p)));
        o.insert(
            "policy_set".into(),
            json!(gw.pipeline().policies().digest()),
        );
        if let Some(progress) = p.progress() {
            o.insert("progress".into(), json!(progress));
        }
        o.insert("created_at".into(), json!(rfc3339(p.created_ms)));
        o.insert("updated_at".into(), json!(rfc3339(p.updated_ms)));
        o.insert(
            "expires_at".into(),
            p.expires_ms.map_or(Value::Null, |e| json!(rfc3339(e))),
        );
        let pending_until = p
            .created_ms
            .saturating_add(pending_ttl.as_millis().min(i64::MAX as u128) as i64);
        o.insert("pending_expires_ms".into(), json!(pending_until));
    }
    v
}

/// A proposal's view with `tasks_waiting`: how many clients wait on it as
/// MCP tasks (the gateway runs the call for them when it is approved).
fn with_tasks(mut v: Value, waiting: Option<usize>) -> Value {
    if let (Some(o), Some(n)) = (v.as_object_mut(), waiting) {
        o.insert("tasks_waiting".into(), json!(n));
    }
    v
}

#[derive(Deserialize)]
struct ListQuery {
    state: Option<String>,
}

async fn list(
    State(gw): State<Arc<Gateway>>,
    Query(q): Query<ListQuery>,
    Signed { reviewer, .. }: Signed,
) -> Response {
    let wanted = match q.state.as_deref() {
        None | Some("all") => None,
        Some(s) => match serde_json::from_value::<ProposalState>(json!(s)) {
            Ok(st) => Some(st),
            Err(_) => {
                return problem(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    format!("unknown state `{s}`: use pending, approved, denied, consumed, expired, invalidated or all"),
                )
            }
        },
    };
    match gw.pipeline().book().list().await {
        Ok(all) => {
            let waiting = super::tasks::waiting_by_proposal(&gw).await;
            ok(json!({
                "proposals": all
                    .iter()
                    .filter(|p| reviewer.covers(&p.tenant) && wanted.is_none_or(|w| p.state == w))
                    .map(|p| with_tasks(view(p, &gw), waiting.get(&p.id).copied()))
                    .collect::<Vec<_>>()
            }))
        }
        Err(e) => problem(StatusCode::SERVICE_UNAVAILABLE, "store", e.to_string()),
    }
}

async fn show(
    State(gw): State<Arc<Gateway>>,
    Path(id): Path<String>,
    Signed { reviewer, .. }: Signed,
) -> Response {
    match gw.pipeline().book().get(&id).await {
        // Another tenant's proposal is "not found": its existence is not
        // disclosed.
        Ok(Some(p)) if reviewer.covers(&p.tenant) => {
            let waiting = super::tasks::waiting_by_proposal(&gw).await;
            ok(json!({ "proposal": with_tasks(view(&p, &gw), waiting.get(&p.id).copied()) }))
        }
        Ok(_) => problem(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no proposal `{id}`: list them with `countersign pending`"),
        ),
        Err(e) => problem(StatusCode::SERVICE_UNAVAILABLE, "store", e.to_string()),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionBody {
    statement: Value,
    signature: String,
}

async fn decide(
    State(gw): State<Arc<Gateway>>,
    Path(id): Path<String>,
    Signed { reviewer, body }: Signed,
) -> Response {
    let parsed: DecisionBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("the body must be {{\"statement\": {{...}}, \"signature\": \"...\"}}: {e}"),
            )
        }
    };
    let statement: Statement = match serde_json::from_value(parsed.statement) {
        Ok(s) => s,
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "bad_statement",
                format!(
                    "the statement is not a {} statement: {e}",
                    approval::STATEMENT_TYPE
                ),
            )
        }
    };
    match decide_with(
        &gw,
        &id,
        statement,
        crate::enforce::book::Proof::Ed25519(&parsed.signature),
        &reviewer,
    )
    .await
    {
        Ok(p) => ok(json!({ "proposal": view(&p, &gw) })),
        Err(e) => {
            tracing::warn!(proposal = %id, reviewer = %reviewer.name, "decision refused: {e}");
            decide_problem(&e)
        }
    }
}

/// Accept `reviewer`'s decision on proposal `id`, signed by `proof`,
/// under the policies and reviewers in force: the book checks the
/// statement and the signature, and approving is itself authorized
/// (DESIGN.md section 4: the reviewer, the tool with its effective
/// annotations, the requester and arguments). The control API and the
/// review console decide through here alike.
pub(crate) async fn decide_with(
    gw: &Gateway,
    id: &str,
    statement: Statement,
    proof: crate::enforce::book::Proof<'_>,
    reviewer: &Reviewer,
) -> Result<Proposal, DecideError> {
    let policies = gw.pipeline().policies();
    let may_approve = |p: &Proposal| {
        let groups = gw
            .config()
            .identities
            .iter()
            .find(|i| i.principal == p.requester && i.tenant == p.tenant)
            .map(|i| i.groups.clone())
            .unwrap_or_default();
        let identity = crate::core::identity::Identity {
            principal: p.requester.clone(),
            tenant: p.tenant.clone(),
            groups,
            ..Default::default()
        };
        let tool = gw.pipeline().catalog().view(&p.server, &p.tool);
        let call = crate::core::decision::Call {
            identity: &identity,
            server: &p.server,
            tool: &p.tool,
            annotations: tool.annotations,
            definition_changed: tool.changed,
            budgets: None,
            arguments: &p.arguments,
            digest: &p.call_digest,
            resource_version: p.resource_version.as_deref(),
        };
        policies
            .may_approve(&reviewer.name, &reviewer.groups, &call)
            .map_err(|d| {
                tracing::info!(proposal = %p.id, reviewer = %reviewer.name, decision = %d, "approval refused by policy");
                let own = reviewer.is_requester(&p.requester, &p.requester_aka);
                approval_refusal(&reviewer.name, &reviewer.groups, own, p, &tool.annotations, &d, &policies)
            })
    };
    gw.pipeline()
        .book()
        .decide(
            id,
            statement,
            proof,
            reviewer,
            crate::enforce::book::Under {
                policy_set: policies.digest(),
                reviewers: policies.reviewers(),
            },
            may_approve,
        )
        .await
}

/// The answer to a refused decision or withdrawal.
fn decide_problem(e: &DecideError) -> Response {
    let (status, code) = match e {
        DecideError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
        DecideError::NotPending { .. } => (StatusCode::CONFLICT, "not_pending"),
        DecideError::TooLate { .. } => (StatusCode::CONFLICT, "too_late"),
        DecideError::Refused(_) => (StatusCode::BAD_REQUEST, "refused"),
        DecideError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
        DecideError::Store(_) => (StatusCode::SERVICE_UNAVAILABLE, "store"),
    };
    problem(status, code, e.to_string())
}

/// `POST /v1/proposals/{id}/withdraw`: the signing reviewer takes their
/// approval back, while the quorum is not met. The request's signature is
/// the reviewer's act; there is no statement to sign.
async fn withdraw(
    State(gw): State<Arc<Gateway>>,
    Path(id): Path<String>,
    Signed { reviewer, .. }: Signed,
) -> Response {
    match gw.pipeline().book().withdraw(&id, &reviewer).await {
        Ok(p) => ok(json!({ "proposal": view(&p, &gw) })),
        Err(e) => {
            tracing::warn!(proposal = %id, reviewer = %reviewer.name, "withdrawal refused: {e}");
            decide_problem(&e)
        }
    }
}

/// Why `reviewer` may not approve `p`, in words that name what is missing:
/// the policies that forbid it, or, when no policy permits it, the
/// reviewer's groups against the groups the approve policies name.
fn approval_refusal(
    reviewer: &str,
    groups: &[String],
    own: bool,
    p: &Proposal,
    annotations: &crate::core::annotations::Annotations,
    d: &crate::core::decision::Decision,
    policies: &crate::core::decision::Policies,
) -> String {
    let crate::core::decision::Decision::Deny {
        policies: forbidding,
        errors,
    } = d
    else {
        return format!("the policies do not let reviewer `{reviewer}` approve this call");
    };
    if !errors.is_empty() {
        return format!(
            "the approve policies could not be evaluated for reviewer `{reviewer}` ({}): fix the policies",
            errors.join("; ")
        );
    }
    let own = if own {
        " (the call is the reviewer's own: nobody approves their own call)"
    } else {
        ""
    };
    if !forbidding.is_empty() {
        return format!(
            "reviewer `{reviewer}` may not approve this call: forbidden by policy {}{own}",
            forbidding.join(", ")
        );
    }
    let has = if groups.is_empty() {
        "no groups".to_owned()
    } else {
        format!("groups {}", groups.join(", "))
    };
    let risk = if annotations.destructive {
        "destructive"
    } else if annotations.read_only {
        "read-only"
    } else {
        "a write"
    };
    let named: Vec<String> = policies
        .approve_groups()
        .into_iter()
        .filter(|g| !groups.contains(g))
        .collect();
    let hint = if named.is_empty() {
        String::new()
    } else {
        format!(
            "; the approve policies name group {}: add it to `{reviewer}`'s groups in the reviewers file",
            named.join(", ")
        )
    };
    format!(
        "no policy lets reviewer `{reviewer}` ({has}) approve `{}/{}` ({risk}){hint}{own}",
        p.server, p.tool
    )
}

async fn outcomes(State(gw): State<Arc<Gateway>>, Signed { reviewer, .. }: Signed) -> Response {
    match crate::enforce::reconcile::list_unknown_in(gw.pipeline().store().as_ref()).await {
        Ok(all) => ok(json!({
            "outcomes": all
                .into_iter()
                .filter(|(t, ..)| reviewer.covers(t))
                .map(|(tenant, principal, key, r)| json!({
                    "tenant": tenant, "principal": principal, "key": key,
                    "server": r.server, "tool": r.tool, "call_digest": r.digest,
                    "created_at": rfc3339(r.created_ms),
                }))
                .collect::<Vec<_>>()
        })),
        Err(e) => problem(StatusCode::SERVICE_UNAVAILABLE, "store", e.to_string()),
    }
}

/// `GET /v1/budgets`: each budget's spending and each effect key's
/// effects in their windows, in the reviewer's tenants.
async fn budgets(State(gw): State<Arc<Gateway>>, Signed { reviewer, .. }: Signed) -> Response {
    let config = gw.config();
    let now = crate::core::time::now_ms();
    let longest = config
        .budgets
        .iter()
        .map(|b| b.window)
        .chain(config.effect_keys.iter().map(|e| e.window))
        .max()
        .unwrap_or_default();
    match gw
        .pipeline()
        .store()
        .guards_rows(now - crate::core::time::ms(longest))
        .await
    {
        Ok(rows) => ok(crate::enforce::guards::summary(config, &rows, now, |t| {
            reviewer.covers(t)
        })),
        Err(e) => problem(StatusCode::SERVICE_UNAVAILABLE, "store", e.to_string()),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReconcileBody {
    tenant: String,
    principal: String,
    key: String,
    resolution: String,
    note: Option<String>,
    result: Option<String>,
}

async fn reconcile(State(gw): State<Arc<Gateway>>, Signed { reviewer, body }: Signed) -> Response {
    let b: ReconcileBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return problem(StatusCode::BAD_REQUEST, "bad_request", e.to_string()),
    };
    if !reviewer.covers(&b.tenant) {
        return problem(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no unknown outcome for key `{}` in your tenants", b.key),
        );
    }
    let verdict = match b.resolution.as_str() {
        "executed" => crate::enforce::reconcile::Verdict::Executed { result: b.result },
        "not_executed" => crate::enforce::reconcile::Verdict::NotExecuted,
        other => {
            return problem(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("resolution `{other}` must be `executed` or `not_executed`"),
            )
        }
    };
    let note = Some(format!(
        "reconciled by reviewer {}{}",
        reviewer.name,
        b.note.map(|n| format!(": {n}")).unwrap_or_default()
    ));
    match crate::enforce::reconcile::reconcile_in(
        gw.pipeline().store().as_ref(),
        crate::enforce::reconcile::Keep {
            clock: gw.pipeline().clock(),
            retention: gw.config().idempotency.retention,
        },
        &b.tenant,
        &b.principal,
        &b.key,
        verdict,
        note,
    )
    .await
    {
        Ok(r) => {
            gw.pipeline().audit(
                "reconciled",
                crate::enforce::reconcile::reconciled_fields(
                    &b.tenant,
                    &b.principal,
                    &b.key,
                    &r,
                    &format!("reviewer {}", reviewer.name),
                ),
            );
            ok(json!({ "state": r.state, "note": r.note }))
        }
        Err(e @ crate::enforce::reconcile::ReconcileError::NotFound { .. }) => {
            problem(StatusCode::NOT_FOUND, "not_found", e.to_string())
        }
        Err(e @ crate::enforce::reconcile::ReconcileError::NotUnknown(_)) => {
            problem(StatusCode::CONFLICT, "not_unknown", e.to_string())
        }
        Err(e) => problem(StatusCode::BAD_REQUEST, "refused", e.to_string()),
    }
}

#[derive(Deserialize)]
struct TailQuery {
    limit: Option<usize>,
}

async fn audit_tail(
    State(gw): State<Arc<Gateway>>,
    Query(q): Query<TailQuery>,
    Signed { reviewer, .. }: Signed,
) -> Response {
    let limit = q.limit.unwrap_or(50).clamp(1, 500);
    let dir = gw.config().audit_dir();
    let tail =
        tokio::task::spawn_blocking(move || crate::audit::segment::tail(&dir, 256 << 10)).await;
    match tail {
        Ok(Ok(entries)) => {
            let mine: Vec<Value> = entries
                .into_iter()
                .filter(|e| shown_to(e, &reviewer))
                .map(Value::Object)
                .collect();
            let skip = mine.len().saturating_sub(limit);
            ok(json!({ "entries": mine[skip..] }))
        }
        Ok(Err(e)) => problem(StatusCode::SERVICE_UNAVAILABLE, "audit", e.to_string()),
        Err(e) => problem(StatusCode::SERVICE_UNAVAILABLE, "audit", e.to_string()),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InputsQuery {
    /// Only those kept at or after this time (ms since the epoch).
    since_ms: Option<i64>,
    tenant: Option<String>,
}

/// `GET /v1/inputs`: the kept decision inputs (`[policy] inputs`) of the
/// reviewer's tenants, as kept (arguments in full: a `policy diff` decides
/// on them, and a reviewer of a tenant sees its calls' arguments anyway).
/// It is how `policy inputs export` and `policy diff` read them while a
/// gateway on redb holds its files.
async fn inputs(
    State(gw): State<Arc<Gateway>>,
    Query(q): Query<InputsQuery>,
    Signed { reviewer, .. }: Signed,
) -> Response {
    // What was decided a moment ago is in the answer.
    gw.pipeline().flush_inputs().await;
    let rows = gw
        .pipeline()
        .store()
        .inputs_since(q.since_ms.unwrap_or(0), q.tenant)
        .await;
    match rows {
        // Only the reviewer's tenants: the arguments of another tenant's
        // calls are not theirs to read.
        Ok(rows) => ok(json!({
            "inputs": rows
                .into_iter()
                .filter(|r| reviewer.covers(&r.tenant))
                .map(|r| json!({ "tenant": r.tenant, "inputs": r.inputs }))
                .collect::<Vec<_>>()
        })),
        Err(e) => problem(StatusCode::SERVICE_UNAVAILABLE, "store", e.to_string()),
    }
}

/// Whether an audit entry is shown to `reviewer`: one of a tenant, or of
/// reviewers' tenants (a console sign-in, an invitation), only to those who
/// review one of them; one about reviewers or the door that names no tenant
/// (a refused sign-in by an unknown passkey, a sampled refusal: addresses,
/// credential ids) only to reviewers of every tenant; the gateway's own
/// (checkpoints, reloads) to all.
fn shown_to(
    e: &serde_json::Map<String, Value>,
    reviewer: &crate::core::reviewers::Reviewer,
) -> bool {
    if let Some(t) = e.get("tenant").and_then(Value::as_str) {
        return reviewer.covers(t);
    }
    if let Some(ts) = e.get("tenants").and_then(Value::as_array) {
        return ts
            .iter()
            .filter_map(Value::as_str)
            .any(|t| reviewer.covers(t));
    }
    let kind = e.get("kind").and_then(Value::as_str).unwrap_or_default();
    let about_people = kind == "refused"
        || ["console_", "enrolment_", "reviewer_"]
            .iter()
            .any(|p| kind.starts_with(p));
    !about_people || reviewer.covers("*")
}

async fn events(State(gw): State<Arc<Gateway>>, Signed { reviewer, .. }: Signed) -> Response {
    use futures_util::StreamExt;
    let rx = gw.pipeline().book().subscribe();
    let stream = tokio_stream::wrappers::BroadcastStream::new(rx).filter_map(move |e| {
        let out = match e {
            Ok(e) if reviewer.covers(&e.proposal.tenant) => Some(
                Ok::<_, std::convert::Infallible>(SseEvent::default().event(e.kind).data(
                    json!({ "kind": e.kind, "proposal": view(&e.proposal, &gw) }).to_string(),
                )),
            ),
            Ok(_) => None,
            // A slow client missed events: tell it to re-list.
            Err(_) => Some(Ok(SseEvent::default().event("resync").data("{}"))),
        };
        std::future::ready(out)
    });
    // A first comment flushes the headers at once, so a client knows it is
    // subscribed before anything happens.
    let hello = futures_util::stream::once(std::future::ready(Ok(
        SseEvent::default().comment("subscribed")
    )));
    Sse::new(hello.chain(stream))
        .keep_alive(KeepAlive::default())
        .into_response()
}
