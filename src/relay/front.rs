//! The HTTP front: `/mcp/{server}` (Streamable HTTP, both wire eras) and
//! `/healthz`.
//!
//! Every `/mcp` request passes, in this order: the `Origin` check (DNS
//! rebinding), bearer authentication, the server lookup, the body size limit,
//! JSON-RPC parsing, then era dispatch:
//! - `Mcp-Session-Id` present → the handshake-era session it names;
//! - `initialize` → a new handshake-era session;
//! - `_meta["io.modelcontextprotocol/protocolVersion"]` → 2026-07-28, stateless;
//! - anything else → 400, saying to initialize first.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body as HttpBody, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures_util::stream;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::approval::{ProposalState, Risk};
use crate::canonical;
use crate::control::book::Found;
use crate::decision::{self, Decision};
use crate::idempotency::{
    follow, ApprovalCode, ApprovalNote, Begin, Gate, Outcome as IdemOutcome, Permit, Settled,
    Ticket,
};
use crate::identity::Identity;
use crate::jsonrpc::{code, parse_body, Body, Kind, Message};
use crate::ledger;
use crate::recovery::{self, Admission, Backoff, ResponseClass};
use crate::relay::session::{
    declared_version, decode_header_value, modern_headers, Gateway, ModernUpstream, Session,
};
use crate::relay::trail::Trail;
use crate::relay::upstream::UpstreamError;
use crate::relay::upstream::{ExtraHeaders, UpstreamConn};
use crate::relay::{sse, HANDSHAKE_VERSIONS, MODERN_VERSIONS};
use crate::reply;
use std::time::Instant;

const SESSION_HEADER: &str = "mcp-session-id";
const PROTOCOL_HEADER: &str = "mcp-protocol-version";
/// Header by which the stdio bridge names its stable session scope.
pub const SCOPE_HEADER: &str = "countersign-session-scope";

/// The gateway's routes.
pub fn router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route(
            "/mcp/{server}",
            get(get_mcp).post(post_mcp).delete(delete_mcp),
        )
        .with_state(Arc::clone(&gw))
        .merge(crate::control::router(gw))
}

async fn healthz(State(gw): State<Arc<Gateway>>) -> Response {
    let body = json!({ "status": "ok", "sessions": gw.session_count() });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn rpc(status: StatusCode, msg: &Message) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        msg.to_bytes(),
    )
        .into_response()
}

fn rpc_error(status: StatusCode, code: i64, message: &str, data: Option<Value>) -> Response {
    rpc(status, &Message::error(Value::Null, code, message, data))
}

/// Origin, token and server checks shared by every `/mcp` method.
#[expect(
    clippy::result_large_err,
    reason = "the refusal is the response itself; boxing gains nothing on this path"
)]
fn admit(gw: &Gateway, server: &str, headers: &HeaderMap) -> Result<Arc<Identity>, Response> {
    if !origin_allowed(gw, headers) {
        // A browser page from a foreign origin (DNS rebinding) must not drive
        // a gateway that listens on localhost.
        return Err(rpc_error(
            StatusCode::FORBIDDEN,
            code::INVALID_REQUEST,
            "origin not allowed: add it to gateway.allowed_origins if this browser origin is trusted",
            None,
        ));
    }
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let Some(identity) = gw.identities.from_authorization(auth) else {
        let mut r = rpc_error(
            StatusCode::UNAUTHORIZED,
            code::INVALID_REQUEST,
            "missing or unknown bearer token: send `Authorization: Bearer TOKEN` with a token listed in [[identities]]",
            None,
        );
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"countersign\""),
        );
        return Err(r);
    };
    if !gw.config.servers.contains_key(server) {
        let known: Vec<&str> = gw.config.servers.keys().map(String::as_str).collect();
        return Err(rpc_error(
            StatusCode::NOT_FOUND,
            code::INVALID_REQUEST,
            &format!(
                "unknown server `{server}`: configured servers are {}",
                known.join(", ")
            ),
            None,
        ));
    }
    Ok(identity)
}

fn origin_allowed(gw: &Gateway, headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    if gw
        .config
        .gateway
        .allowed_origins
        .iter()
        .any(|o| o == origin)
    {
        return true;
    }
    let Some(rest) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    let host = if let Some(v6) = rest.strip_prefix('[') {
        v6.split(']')
            .next()
            .map(|h| format!("[{h}]"))
            .unwrap_or_default()
    } else {
        rest.split(':').next().unwrap_or_default().to_owned()
    };
    matches!(host.as_str(), "localhost" | "127.0.0.1" | "[::1]")
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn accepts_sse(headers: &HeaderMap) -> bool {
    header_str(headers, "accept")
        .is_none_or(|a| a.contains("text/event-stream") || a.contains("*/*"))
}

async fn post_mcp(
    State(gw): State<Arc<Gateway>>,
    Path(server): Path<String>,
    headers: HeaderMap,
    body: HttpBody,
) -> Response {
    let identity = match admit(&gw, &server, &headers) {
        Ok(i) => i,
        Err(r) => return r,
    };
    let limit = gw.config.limits.max_body_bytes;
    let Ok(bytes) = axum::body::to_bytes(body, limit).await else {
        return rpc_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            code::INVALID_REQUEST,
            &format!("request body larger than limits.max_body_bytes ({limit} bytes): send less, or raise the limit"),
            None,
        );
    };
    let parsed = match parse_body(&bytes) {
        Ok(p) => p,
        Err(e) => return rpc_error(StatusCode::BAD_REQUEST, e.code(), &e.to_string(), None),
    };
    if let Some(sid) = header_str(&headers, SESSION_HEADER) {
        let Some(session) = gw.session(&server, sid, &identity) else {
            return rpc_error(
                StatusCode::NOT_FOUND,
                code::INVALID_REQUEST,
                "session not found (expired, closed, or the gateway restarted): send initialize again",
                None,
            );
        };
        session.touch();
        if let Some(v) = header_str(&headers, PROTOCOL_HEADER) {
            if !HANDSHAKE_VERSIONS.contains(&v) && v != "2024-11-05" {
                return rpc_error(
                    StatusCode::BAD_REQUEST,
                    code::INVALID_REQUEST,
                    &format!(
                        "unsupported MCP-Protocol-Version `{v}` for a session; supported: {}",
                        HANDSHAKE_VERSIONS.join(", ")
                    ),
                    None,
                );
            }
        }
        return match parsed {
            Body::Single(msg) => in_session(&gw, &session, msg, accepts_sse(&headers)).await,
            Body::Batch(members) => {
                // Batching exists only in 2025-03-26; later versions removed it.
                let version = session
                    .protocol_version
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                if version.as_deref() != Some("2025-03-26") {
                    return rpc_error(
                        StatusCode::BAD_REQUEST,
                        code::INVALID_REQUEST,
                        &format!(
                            "JSON-RPC batches are only part of protocol version 2025-03-26; this session negotiated `{}`: send one message per request",
                            version.unwrap_or_default()
                        ),
                        None,
                    );
                }
                batch(&gw, &session, members).await
            }
        };
    }
    match parsed {
        Body::Single(msg) if msg.method() == "initialize" && msg.kind() == Kind::Request => {
            initialize(&gw, &server, identity, &headers, msg).await
        }
        Body::Single(msg) if declared_version(msg.params_value().as_ref()).is_some() => {
            modern(&gw, &server, identity, &headers, msg).await
        }
        _ => rpc_error(
            StatusCode::BAD_REQUEST,
            code::INVALID_REQUEST,
            "missing Mcp-Session-Id header: send initialize first (2025 protocol versions), \
             or carry `_meta[\"io.modelcontextprotocol/protocolVersion\"]` (2026-07-28)",
            None,
        ),
    }
}

async fn initialize(
    gw: &Arc<Gateway>,
    server: &str,
    identity: Arc<Identity>,
    headers: &HeaderMap,
    msg: Message,
) -> Response {
    let id = msg.id.clone().unwrap_or(Value::Null);
    let (unsolicited, standalone) = mpsc::channel(256);
    let conn = match gw.connect_with(server, unsolicited.clone()).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(server, "initialize failed: {e}");
            return rpc(
                StatusCode::OK,
                &reply::upstream_failure(id, "initialize", &e, false),
            );
        }
    };
    let params = msg.params.clone();
    let timeout = call_timeout(gw, server);
    match conn.call(msg, None, timeout, &Vec::new()).await {
        Ok(resp) if resp.error.is_none() => {
            let scope = header_str(headers, super::front::SCOPE_HEADER).map(str::to_owned);
            let session = gw.add_session(server, identity, scope, conn, unsolicited, standalone);
            let version = resp
                .result
                .as_ref()
                .and_then(|r| serde_json::from_str::<Value>(r.get()).ok())
                .and_then(|v| v.get("protocolVersion")?.as_str().map(str::to_owned));
            *session
                .protocol_version
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = version;
            *session
                .init_params
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = params;
            tracing::info!(server, session = %session.id, principal = %session.identity.principal, "session opened");
            let mut r = rpc(StatusCode::OK, &resp);
            if let Ok(v) = HeaderValue::try_from(session.id.as_str()) {
                r.headers_mut().insert(SESSION_HEADER, v);
            }
            r
        }
        Ok(refusal) => {
            let grace = gw.config.gateway.shutdown_grace;
            tokio::spawn(async move { conn.shutdown(grace).await });
            rpc(StatusCode::OK, &refusal)
        }
        Err(e) => {
            tracing::warn!(server, "initialize failed: {e}");
            let grace = gw.config.gateway.shutdown_grace;
            tokio::spawn(async move { conn.shutdown(grace).await });
            rpc(
                StatusCode::OK,
                &reply::upstream_failure(id, "initialize", &e, false),
            )
        }
    }
}

fn call_timeout(gw: &Gateway, server: &str) -> std::time::Duration {
    gw.config
        .servers
        .get(server)
        .map_or(std::time::Duration::from_secs(30), |c| c.call_timeout)
}

async fn in_session(
    gw: &Arc<Gateway>,
    session: &Arc<Session>,
    msg: Message,
    sse: bool,
) -> Response {
    match msg.kind() {
        Kind::Request if msg.method() == "initialize" => rpc(
            StatusCode::BAD_REQUEST,
            &Message::error(
                msg.id.unwrap_or(Value::Null),
                code::INVALID_REQUEST,
                "this session is already initialized: open a new session without Mcp-Session-Id",
                None,
            ),
        ),
        Kind::Request => {
            relay_request(
                gw,
                Route::Session(session.clone()),
                &session.server,
                msg,
                sse,
                false,
                Vec::new(),
                session_caller(session),
            )
            .await
        }
        Kind::Notification | Kind::Response => {
            if let Err(e) = session.conn().send(msg, &Vec::new()).await {
                tracing::warn!(server = %session.server, "client message not delivered upstream: {e}");
            }
            StatusCode::ACCEPTED.into_response()
        }
    }
}

/// A JSON-RPC batch (2025-03-26): each member handled as if sent alone, the
/// answers collected into one array.
async fn batch(
    gw: &Arc<Gateway>,
    session: &Arc<Session>,
    members: Vec<Result<Message, crate::jsonrpc::ParseError>>,
) -> Response {
    let mut answers = Vec::new();
    let mut calls = Vec::new();
    for member in members {
        match member {
            Err(e) => answers.push(Message::error(Value::Null, e.code(), &e.to_string(), None)),
            Ok(msg) if msg.kind() == Kind::Request && msg.method() == "initialize" => {
                answers.push(Message::error(
                    msg.id.unwrap_or(Value::Null),
                    code::INVALID_REQUEST,
                    "initialize cannot be part of a batch",
                    None,
                ))
            }
            Ok(msg) if msg.kind() == Kind::Request => calls.push(answer(
                gw.clone(),
                Route::Session(session.clone()),
                session.server.clone(),
                msg,
                None,
                false,
                Vec::new(),
                session_caller(session),
            )),
            Ok(msg) => {
                if let Err(e) = session.conn().send(msg, &Vec::new()).await {
                    tracing::warn!(server = %session.server, "client message not delivered upstream: {e}");
                }
            }
        }
    }
    answers.extend(futures_util::future::join_all(calls).await);
    if answers.is_empty() {
        return StatusCode::ACCEPTED.into_response();
    }
    let body: Vec<Value> = answers
        .iter()
        .filter_map(|m| serde_json::from_slice(&m.to_bytes()).ok())
        .collect();
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        Value::Array(body).to_string(),
    )
        .into_response()
}

fn session_caller(session: &Session) -> Caller {
    Caller {
        identity: session.identity.clone(),
        scope: Some(session.scope.clone()),
    }
}

/// Who is calling, for idempotency keys: the identity and the session scope
/// (the bridge's stable scope, the session id, or none when stateless).
#[derive(Clone)]
struct Caller {
    identity: Arc<Identity>,
    scope: Option<String>,
}

/// Call upstream and produce the answer the client gets (the upstream's
/// response, or the gateway's account of the failure).
#[expect(
    clippy::too_many_arguments,
    reason = "one request's whole context, passed once"
)]
async fn answer(
    gw: Arc<Gateway>,
    route: Route,
    server: String,
    msg: Message,
    events: Option<mpsc::Sender<Message>>,
    modern: bool,
    extra: ExtraHeaders,
    caller: Caller,
) -> Message {
    let method = msg.method().to_owned();
    if method == "tools/call" {
        return tool_call(&gw, &route, &server, msg, events, modern, &extra, &caller).await;
    }
    let id = msg.id.clone().unwrap_or(Value::Null);
    let conn = match route.conn(&gw).await {
        Ok(c) => c,
        Err(e) => return reply::upstream_failure(id, &method, &e, modern),
    };
    match conn
        .call(msg, events, call_timeout(&gw, &server), &extra)
        .await
    {
        Ok(resp) => {
            if method == "tools/list" {
                if let Some(result) = &resp.result {
                    let captured = gw.catalog.capture(&server, result.get());
                    if !captured.changed.is_empty() {
                        let mut f = serde_json::Map::new();
                        f.insert("server".into(), json!(server));
                        f.insert("tools".into(), json!(captured.changed));
                        gw.audit("tools_changed", f);
                    }
                }
            }
            resp
        }
        Err(e) => {
            tracing::warn!(%server, %method, dispatched = e.dispatched(), "upstream call failed: {e}");
            reply::upstream_failure(id, &method, &e, modern)
        }
    }
}

/// Where a request goes: a handshake-era session (healed when its
/// connection is lost) or a server's shared 2026-07-28 connection.
#[derive(Clone)]
enum Route {
    Session(Arc<Session>),
    Shared { server: String, meta: Value },
}

impl Route {
    /// A connection for a tool call. Failing to get one (even when the
    /// handshake or probe that failed had been sent) means the tool call
    /// itself was never sent: report it as such.
    async fn conn_for_call(
        &self,
        gw: &Gateway,
        server: &str,
    ) -> Result<Arc<UpstreamConn>, UpstreamError> {
        self.conn(gw).await.map_err(|e| match e {
            e if !e.dispatched() => e,
            e => UpstreamError::Connect {
                server: server.to_owned(),
                reason: format!("the connection could not be (re)established: {e}"),
            },
        })
    }

    /// A live connection, healing a lost one first.
    async fn conn(&self, gw: &Gateway) -> Result<Arc<UpstreamConn>, UpstreamError> {
        match self {
            Route::Session(s) => s.healthy_conn(gw).await,
            Route::Shared { server, meta } => match gw.modern_upstream(server, meta).await? {
                ModernUpstream::Speaks(c) => Ok(c),
                ModernUpstream::Legacy => Err(UpstreamError::Closed {
                    server: server.clone(),
                    reason: "the upstream speaks only the handshake era".into(),
                }),
            },
        }
    }
}

/// What one attempt at a tool call ended with.
enum Attempt {
    /// Final: give this to the client.
    Done(Message),
    /// Not sent (or a read that may be retried): try again if attempts remain,
    /// else give this to the client.
    Retry(Message),
}

/// The enforcement pipeline of one `tools/call` (DESIGN.md sections 3 and
/// 5, in this order): strict parse and digest → key → circuit breaker →
/// ledger lookup (replay, wait, conflict, `outcome_unknown`) → reserve →
/// durable `dispatched` → forward → record the answer. Policy and approvals
/// slot in before the reservation (issues 4/7 and 5/7).
///
/// Retries (`retry.*`, capped exponential backoff with jitter) happen only
/// where they cannot run a call twice: a read-only tool after any transport
/// failure or transient error, and any call proven not dispatched (spawn or
/// connect failure, upstream session expired, refused unprocessed). A lost
/// connection is healed before the next attempt.
#[expect(
    clippy::too_many_arguments,
    reason = "one request's whole context, passed once"
)]
async fn tool_call(
    gw: &Arc<Gateway>,
    route: &Route,
    server: &str,
    msg: Message,
    events: Option<mpsc::Sender<Message>>,
    modern: bool,
    extra: &ExtraHeaders,
    caller: &Caller,
) -> Message {
    let id = msg.id.clone().unwrap_or(Value::Null);
    let (msg, call) = match canonical_call(gw, server, msg) {
        Ok(c) => c,
        Err(refusal) => return refusal,
    };
    let who = &caller.identity;
    let (client_key, explicit) = match ledger::idempotency_key(
        &call.reserved,
        &who.principal,
        &who.tenant,
        caller.scope.as_deref(),
        &call.digest,
    ) {
        Ok(k) => k,
        Err(e) => return Message::error(id, code::INVALID_PARAMS, &e.to_string(), None),
    };
    let claim = ledger::Claim {
        key: ledger::storage_key(&who.tenant, &who.principal, &client_key),
        client_key: client_key.clone(),
        explicit,
        digest: call.digest.clone(),
        server: server.to_owned(),
        tool: call.tool.clone(),
    };
    // Read once: the same annotations classify the call and feed the policies.
    let annotations = gw.catalog.effective(server, &call.tool);
    let read_only = annotations.read_only;
    let trail = Trail::new(gw.audit.as_ref(), who, server, &call, &client_key);
    trail.received(&call, explicit, read_only);
    let ctx = Attempting {
        gw,
        route,
        server,
        msg: &msg,
        events: &events,
        modern,
        extra,
        id: &id,
        trail: &trail,
    };
    let unattended_read = read_only
        && !explicit
        && match policy_decision(gw, server, caller, &call, annotations, &trail) {
            Decision::Allow { .. } => true,
            Decision::Deny { .. } => {
                return verdict(id, IdemOutcome::Denied, &client_key, &call.tool, modern)
            }
            // A read the policies want approved goes through the approval
            // book and the ledger like a write: its yes is single-use too.
            Decision::Approval { .. } => false,
        };
    if unattended_read {
        // Reads stay fresh: identical reads in flight share one call, and a
        // finished read is never replayed. No durable write.
        return match gw.idempotency.coalesce_read(&claim) {
            Ok(lead) => {
                let answer = ctx
                    .with_retries(|| async { ctx.read_once(lead.permit()).await })
                    .await;
                lead.finish(settled_from(&answer));
                trail.record("completed", outcome_fields(&answer));
                answer
            }
            Err(rx) => from_settled(id, follow(rx).await, &client_key, false, modern),
        };
    }
    ctx.with_retries(|| async {
        if let Some(refusal) = ctx.circuit_refusal() {
            return Attempt::Done(refusal);
        }
        let held = Held {
            gw,
            route,
            server,
            caller,
            call: &call,
            annotations,
            msg: &msg,
            events: &events,
            modern,
            extra,
            key: &claim.key,
            client_key: &client_key,
            trail: &trail,
            consumed: std::sync::Mutex::new(None),
        };
        let gate = |lost| held.gate(lost);
        let begin = match gw.idempotency.begin_gated(claim.clone(), gate).await {
            Ok(b) => b,
            Err(e) => return Attempt::Done(ledger_unavailable(id.clone(), &e, modern)),
        };
        match begin {
            Begin::Go(ticket) => {
                let consumed = held
                    .consumed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take();
                if let Some((proposal, approval)) = consumed {
                    gw.book.changed(&proposal);
                    // With the reviewer's signed statement: the entry shows
                    // on its own which yes this execution used.
                    trail.record(
                        "approval_consumed",
                        vec![("proposal_id", json!(proposal)), ("approval", approval)],
                    );
                }
                ctx.write_once(ticket, &call.tool, &client_key).await
            }
            Begin::Replay {
                answer,
                answered_at,
            } => Attempt::Done({
                trail.record("replayed", vec![("first_answered_at", json!(answered_at))]);
                replay(id.clone(), &answer, &client_key, &answered_at, modern)
            }),
            Begin::Follow(rx) => Attempt::Done(from_settled(
                id.clone(),
                follow(rx).await,
                &client_key,
                true,
                modern,
            )),
            Begin::Stop(outcome) => {
                trail_refusal(&trail, &outcome);
                Attempt::Done(verdict(
                    id.clone(),
                    outcome,
                    &client_key,
                    &call.tool,
                    modern,
                ))
            }
        }
    })
    .await
}

/// The policy decision (DESIGN.md section 4) for a call about to run, with
/// the determining policies logged here, never sent to the agent.
fn policy_decision(
    gw: &Gateway,
    server: &str,
    caller: &Caller,
    call: &canonical::CanonicalCall,
    annotations: crate::annotations::Annotations,
    trail: &Trail,
) -> Decision {
    let policies = gw.policies();
    let decision = policies.decide(&decision::Call {
        identity: &caller.identity,
        server,
        tool: &call.tool,
        annotations,
        arguments: &call.arguments,
        digest: &call.digest,
        resource_version: explicit_version(call),
    });
    match &decision {
        Decision::Allow { policies } => {
            tracing::debug!(%server, tool = %call.tool, ?policies, "policy: allow");
        }
        Decision::Approval { policies } => {
            tracing::info!(%server, tool = %call.tool, ?policies, principal = %caller.identity.principal, "policy: approval required");
        }
        Decision::Deny { policies, errors } => {
            tracing::info!(%server, tool = %call.tool, ?policies, ?errors, principal = %caller.identity.principal, "policy: denied");
        }
    }
    trail.decision(&decision);
    decision
}

/// `_meta["dev.countersign/resource-version"]`: a version the client binds
/// explicitly (DESIGN.md section 6).
fn explicit_version(call: &canonical::CanonicalCall) -> Option<&str> {
    call.reserved
        .meta
        .get("dev.countersign/resource-version")
        .and_then(Value::as_str)
}

/// The gate of a call that goes through the ledger (DESIGN.md section 3's
/// order): policy decision → approval lookup and revalidation → the atomic
/// {reserve, consume} that [`Idempotency::begin_gated`] performs. A call
/// that needs a yes is held up to `approvals.hold`, with progress
/// notifications when it sent a `progressToken`, and proceeds the moment a
/// reviewer approves.
struct Held<'a> {
    gw: &'a Arc<Gateway>,
    route: &'a Route,
    server: &'a str,
    caller: &'a Caller,
    call: &'a canonical::CanonicalCall,
    annotations: crate::annotations::Annotations,
    msg: &'a Message,
    events: &'a Option<mpsc::Sender<Message>>,
    modern: bool,
    extra: &'a ExtraHeaders,
    key: &'a str,
    client_key: &'a str,
    trail: &'a Trail,
    /// The proposal the gate chose to consume, for the audit entry once the
    /// reservation (and so the consumption) succeeded.
    consumed: std::sync::Mutex<Option<(String, Value)>>,
}

/// Audit entries for a call refused before dispatch by the ledger or a
/// stale resource version (policy and approval refusals have theirs).
fn trail_refusal(trail: &Trail, outcome: &IdemOutcome) {
    match outcome {
        IdemOutcome::Drift => trail.record("rejected", vec![("reason", json!("drift"))]),
        IdemOutcome::Remap => trail.record("rejected", vec![("reason", json!("remap"))]),
        IdemOutcome::Unknown => trail.record("outcome_unknown", vec![("repeat", json!(true))]),
        IdemOutcome::Approval(note) if note.code == ApprovalCode::Stale => trail.record(
            "rejected",
            vec![
                ("reason", json!("stale")),
                ("detail", json!(note.reason)),
                ("proposal_id", json!(note.proposal_id)),
            ],
        ),
        _ => {}
    }
}

/// `completed` fields of an answer: whether it is an error, and its code
/// when countersign itself answered.
fn outcome_fields(answer: &Message) -> Vec<(&'static str, Value)> {
    let result: Option<Value> = answer
        .result
        .as_ref()
        .and_then(|r| serde_json::from_str(r.get()).ok());
    let is_error = answer.error.is_some()
        || result
            .as_ref()
            .and_then(|r| r.get("isError"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
    let mut out = vec![("is_error", json!(is_error))];
    if let Some(code) = result
        .as_ref()
        .and_then(|r| r.pointer("/structuredContent/countersign/code"))
    {
        out.push(("code", code.clone()));
    }
    out
}

fn approval_refusal(code: ApprovalCode, proposal: Option<String>, reason: Option<String>) -> Gate {
    Gate::Refuse(IdemOutcome::Approval(ApprovalNote {
        code,
        proposal_id: proposal,
        revises: None,
        reason,
    }))
}

impl Held<'_> {
    async fn gate(&self, lost: Option<ProposalState>) -> Gate {
        if let Some(state) = lost {
            tracing::info!(tool = %self.call.tool, lost = state.as_str(), "the approval went to a concurrent call; looking again");
        }
        let gw = self.gw;
        let hold_until = Instant::now() + gw.config.approvals.hold;
        // Set up on the first look only: an unattended call (the hot path)
        // pays for neither the subscription nor re-reading its params.
        let mut waiting: Option<(tokio::sync::broadcast::Receiver<_>, Option<Value>)> = None;
        let mut progress = 0u64;
        loop {
            // Revalidation right before execution: the policies in force now.
            let policies = match policy_decision(
                gw,
                self.server,
                self.caller,
                self.call,
                self.annotations,
                self.trail,
            ) {
                Decision::Allow { .. } => return Gate::Pass,
                Decision::Deny { .. } => return Gate::Refuse(IdemOutcome::Denied),
                Decision::Approval { policies } => policies,
            };
            // Subscribed before the first look, so a decision made between
            // the look and the wait is not missed.
            let (changes, token) = waiting.get_or_insert_with(|| {
                let token = self
                    .msg
                    .params_value()
                    .and_then(|p| p.get("_meta")?.get("progressToken").cloned());
                (gw.book.subscribe(), token)
            });
            let version = match self.resource_version().await {
                Ok(v) => {
                    tracing::debug!(tool = %self.call.tool, version = ?v, "resource version");
                    v
                }
                Err(reason) => {
                    tracing::warn!(tool = %self.call.tool, "resource version: {reason}");
                    return approval_refusal(ApprovalCode::Stale, None, Some(reason));
                }
            };
            let who = &self.caller.identity;
            let risk = if self.annotations.read_only {
                Risk::Read
            } else if self.annotations.destructive {
                Risk::Destructive
            } else {
                Risk::Write
            };
            let ask = crate::control::book::Ask {
                identity: who,
                server: self.server,
                tool: &self.call.tool,
                arguments: &self.call.arguments,
                digest: &self.call.digest,
                resource_version: version.as_deref(),
                risk,
                policies: &policies,
                key: self.key,
                client_key: self.client_key,
            };
            let reviewers = gw.policies();
            self.trail.flush();
            let proposal = match gw.book.find(&ask, reviewers.reviewers()).await {
                Ok(Found::Usable(p)) => {
                    let approval = serde_json::to_value(&p.decision).unwrap_or(Value::Null);
                    *self.consumed.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some((p.id.clone(), approval));
                    return Gate::Consume(p.id);
                }
                Ok(Found::Refuse(note)) => return Gate::Refuse(IdemOutcome::Approval(note)),
                Ok(Found::Wait(p)) => p,
                Err(e) => {
                    tracing::error!("approval book unavailable, refusing: {e}");
                    return Gate::Refuse(IdemOutcome::NotDispatched);
                }
            };
            // Hold: wait for this proposal to be decided, sending progress.
            loop {
                let left = hold_until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Gate::Refuse(IdemOutcome::Approval(crate::control::book::pending(
                        &proposal,
                    )));
                }
                let tick = gw.config.approvals.progress_interval.min(left);
                tokio::select! {
                    change = changes.recv() => match change {
                        Ok(e) if e.proposal.id == proposal.id && e.proposal.state != ProposalState::Pending => break,
                        Ok(_) => {}
                        // Missed some: look again rather than wait blind.
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                            return Gate::Refuse(IdemOutcome::Approval(crate::control::book::pending(&proposal)));
                        }
                    },
                    () = tokio::time::sleep(tick) => {
                        if let (Some(token), Some(events)) = (&*token, self.events) {
                            progress += 1;
                            let waited = gw.config.approvals.hold.saturating_sub(hold_until.saturating_duration_since(Instant::now()));
                            let params = json!({
                                "progressToken": token,
                                "progress": progress,
                                "message": format!(
                                    "waiting for a reviewer to approve proposal {} ({}s so far)",
                                    proposal.id, waited.as_secs()
                                ),
                            });
                            let _ = events
                                .send(Message::notification("notifications/progress", Some(crate::jsonrpc::raw(&params))))
                                .await;
                        }
                    }
                }
            }
        }
    }

    /// The resource version this call acts on: the operator's probe when one
    /// is configured (the gateway reads it itself), else the client's
    /// explicit `_meta` binding, else none. Errors fail closed.
    async fn resource_version(&self) -> Result<Option<String>, String> {
        let explicit = explicit_version(self.call).map(str::to_owned);
        let Some(probe) = self
            .gw
            .config
            .servers
            .get(self.server)
            .and_then(|s| s.tools.get(&self.call.tool))
            .and_then(|t| t.version_probe.clone())
        else {
            return Ok(explicit);
        };
        let read = self.probe(&probe).await?;
        if let Some(e) = explicit.filter(|e| *e != read) {
            return Err(format!(
                "the call binds resource version `{e}`, but the resource is at `{read}` now"
            ));
        }
        Ok(Some(read))
    }

    /// Run a version probe: a read-only tool of the same server, through the
    /// read path of the pipeline (policy decision included), as the
    /// requester.
    async fn probe(&self, probe: &crate::config::VersionProbe) -> Result<String, String> {
        // A probe that could write is not a probe: never run it.
        if !self
            .gw
            .catalog
            .effective(self.server, &probe.tool)
            .read_only
        {
            return Err(format!(
                "version probe `{}` is not a read-only tool (list tools first, or set read_only = true for it in the config)",
                probe.tool
            ));
        }
        let mut arguments = serde_json::Map::new();
        for (name, pointer) in &probe.arguments {
            let v = self.call.arguments.pointer(pointer).ok_or_else(|| {
                format!("version probe argument `{name}` points at `{pointer}`, which the call does not have")
            })?;
            arguments.insert(name.clone(), v.clone());
        }
        let mut meta = self.call.reserved.other_meta.clone();
        meta.remove("progressToken");
        let params = json!({ "name": probe.tool, "arguments": arguments, "_meta": meta });
        let request = Message::request(
            json!(format!("countersign-probe-{:x}", rand::random::<u64>())),
            "tools/call",
            Some(crate::jsonrpc::raw(&params)),
        );
        let answer = Box::pin(tool_call(
            self.gw,
            self.route,
            self.server,
            request,
            None,
            self.modern,
            self.extra,
            self.caller,
        ))
        .await;
        let result: Value = answer
            .result
            .as_ref()
            .and_then(|r| serde_json::from_str(r.get()).ok())
            .ok_or_else(|| format!("version probe `{}` failed", probe.tool))?;
        if result.get("isError").and_then(Value::as_bool) == Some(true) {
            return Err(format!("version probe `{}` answered an error", probe.tool));
        }
        match result.pointer(&probe.pointer) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(Value::Null) | None => Err(format!(
                "version probe `{}` has nothing at `{}`",
                probe.tool, probe.pointer
            )),
            Some(other) => serde_jcs::to_string(other).map_err(|e| e.to_string()),
        }
    }
}

/// One tool call's context across its attempts.
struct Attempting<'a> {
    gw: &'a Arc<Gateway>,
    route: &'a Route,
    server: &'a str,
    msg: &'a Message,
    events: &'a Option<mpsc::Sender<Message>>,
    modern: bool,
    extra: &'a ExtraHeaders,
    id: &'a Value,
    trail: &'a Trail,
}

impl Attempting<'_> {
    async fn with_retries<F, Fut>(&self, attempt: F) -> Message
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Attempt>,
    {
        let cfg = &self.gw.config.retry;
        let backoff = Backoff {
            max_attempts: cfg.max_attempts,
            base: cfg.base_delay,
            max: cfg.max_delay,
        };
        let mut n = 1;
        loop {
            match attempt().await {
                Attempt::Done(m) => return m,
                Attempt::Retry(m) if n >= backoff.max_attempts => return m,
                Attempt::Retry(_) => {
                    n += 1;
                    let pause = backoff.delay(n, rand::random::<f64>());
                    tracing::info!(server = %self.server, attempt = n, ?pause, "retrying a call that is safe to retry");
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// `upstream_unavailable` at once while the circuit is open: nothing is
    /// reserved, nothing is sent.
    fn circuit_refusal(&self) -> Option<Message> {
        let breaker = self.gw.breaker(self.server)?;
        let admission = breaker
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .admit(Instant::now());
        (admission == Admission::Refuse).then(|| {
            reply::tool_error(
                self.id.clone(),
                reply::codes::UPSTREAM_UNAVAILABLE,
                &format!(
                    "The call did not run: upstream `{}` is failing and countersign stopped sending to it for a while \
                     (circuit open). It is safe to try again later.",
                    self.server
                ),
                json!({ "circuit": "open" }),
                self.modern,
            )
        })
    }

    fn record(&self, ok: bool) {
        if let Some(b) = self.gw.breaker(self.server) {
            let mut b = b.lock().unwrap_or_else(|p| p.into_inner());
            if ok {
                b.success();
            } else {
                b.failure(Instant::now());
            }
        }
    }

    fn failure(&self, e: &UpstreamError) -> Message {
        if recovery::is_upstream_failure(e) {
            self.record(false);
        }
        reply::upstream_failure(self.id.clone(), "tools/call", e, self.modern)
    }

    async fn send(&self, conn: &UpstreamConn, permit: Permit) -> Result<Message, UpstreamError> {
        let timeout = call_timeout(self.gw, self.server);
        conn.call_tool(
            permit,
            self.msg.clone(),
            self.events.clone(),
            timeout,
            self.extra,
        )
        .await
    }

    /// One read: any failure may be retried (reading twice is harmless).
    async fn read_once(&self, permit: Permit) -> Attempt {
        if let Some(refusal) = self.circuit_refusal() {
            return Attempt::Done(refusal);
        }
        let conn = match self.route.conn_for_call(self.gw, self.server).await {
            Ok(c) => c,
            Err(e) => return Attempt::Retry(self.failure(&e)),
        };
        match self.send(&conn, permit).await {
            Ok(resp) if recovery::classify_response(&resp) == ResponseClass::Transient => {
                self.record(true);
                Attempt::Retry(resp)
            }
            Ok(resp) => {
                self.record(true);
                Attempt::Done(resp)
            }
            Err(e) => Attempt::Retry(self.failure(&e)),
        }
    }

    /// One write under a reserved key: sent at most once; only a failure
    /// proven before dispatch frees the key for another attempt.
    async fn write_once(&self, mut ticket: Box<Ticket>, tool: &str, key: &str) -> Attempt {
        let conn = match self.route.conn_for_call(self.gw, self.server).await {
            Ok(c) => c,
            Err(e) => {
                ticket.not_dispatched().await;
                self.trail
                    .record("not_dispatched", vec![("reason", json!(e.to_string()))]);
                return Attempt::Retry(self.failure(&e));
            }
        };
        // The audit entry that records the dispatch (and the call's entries
        // before it) is on disk before a byte goes upstream: committed in the
        // ledger's outbox with the `dispatched` record, one fsync for both.
        // The audit writer appends it to the log and clears the row once
        // its own file is fsynced; startup repairs a crash in between.
        let permit = match self.trail.stage_dispatch() {
            None => ticket.dispatch().await,
            Some((log, Ok(staged))) => {
                let outbox = Some((staged.id, staged.text.clone()));
                match ticket.dispatch_with(outbox).await {
                    Ok(p) => {
                        log.record_staged(staged);
                        Ok(p)
                    }
                    Err(e) => {
                        log.unstage(staged);
                        Err(e)
                    }
                }
            }
            // An audit log without the ledger's outbox cannot make the
            // dispatch entry durable with the dispatch (`serve` always
            // attaches it): no evidence, no dispatch.
            Some((_, Err(_))) => {
                tracing::error!("refusing a call: the audit log has no ledger outbox attached");
                ticket.not_dispatched().await;
                return Attempt::Done(reply::tool_error(
                    self.id.clone(),
                    reply::codes::UPSTREAM_UNAVAILABLE,
                    "The call did not run: countersign could not record it in its audit log. It is safe to try again later.",
                    json!({}),
                    self.modern,
                ));
            }
        };
        let permit = match permit {
            Ok(p) => p,
            // Dropping the ticket frees the key: nothing was sent.
            Err(e) => {
                self.trail
                    .record("not_dispatched", vec![("reason", json!(e.to_string()))]);
                return Attempt::Done(ledger_unavailable(self.id.clone(), &e, self.modern));
            }
        };
        match self.send(&conn, permit).await {
            Ok(resp) => {
                self.record(true);
                if recovery::classify_response(&resp) == ResponseClass::Refused {
                    // The server refused it unprocessed: provably not run.
                    ticket.not_dispatched().await;
                    self.trail.record(
                        "not_dispatched",
                        vec![("reason", json!("refused unprocessed by the server"))],
                    );
                    Attempt::Done(resp)
                } else if let Some(answer) = answer_of(&resp) {
                    ticket.complete(answer).await;
                    self.trail.record("completed", outcome_fields(&resp));
                    Attempt::Done(resp)
                } else {
                    ticket.unknown().await;
                    self.trail
                        .record("outcome_unknown", vec![("reason", json!("no answer"))]);
                    Attempt::Done(resp)
                }
            }
            Err(e) if !recovery::possibly_executed(&e) => {
                ticket.not_dispatched().await;
                self.trail
                    .record("not_dispatched", vec![("reason", json!(e.to_string()))]);
                Attempt::Retry(self.failure(&e))
            }
            Err(e) => {
                ticket.unknown().await;
                tracing::warn!(server = %self.server, %tool, %key, "outcome unknown: {e}");
                self.trail
                    .record("outcome_unknown", vec![("reason", json!(e.to_string()))]);
                Attempt::Done(self.failure(&e))
            }
        }
    }
}

/// The part of a response the ledger keeps.
fn answer_of(resp: &Message) -> Option<ledger::Answer> {
    match (&resp.result, &resp.error) {
        (Some(r), _) => Some(ledger::Answer::Result(r.get().to_owned())),
        (None, Some(e)) => Some(ledger::Answer::Error(e.get().to_owned())),
        _ => None,
    }
}

fn settled_from(resp: &Message) -> Settled {
    match answer_of(resp) {
        Some(answer) => Settled::Answered {
            answer,
            answered_at: String::new(),
        },
        None => Settled::Verdict(IdemOutcome::NotDispatched),
    }
}

/// The answer a follower or a retry gets.
fn from_settled(
    id: Value,
    settled: Settled,
    key: &str,
    mark_replay: bool,
    modern: bool,
) -> Message {
    match settled {
        Settled::Answered {
            answer,
            answered_at,
        } if mark_replay => replay(id, &answer, key, &answered_at, modern),
        Settled::Answered { answer, .. } => match answer {
            ledger::Answer::Result(r) => Message::response(id, raw_or_null(&r)),
            ledger::Answer::Error(e) => error_message(id, &e),
        },
        Settled::Verdict(o) => verdict(id, o, key, "", modern),
    }
}

fn raw_or_null(text: &str) -> Box<serde_json::value::RawValue> {
    serde_json::value::RawValue::from_string(text.to_owned())
        .unwrap_or_else(|_| crate::jsonrpc::raw(&Value::Null))
}

fn error_message(id: Value, raw_error: &str) -> Message {
    let mut m = Message::error(id, code::INTERNAL_ERROR, "", None);
    m.error = Some(raw_or_null(raw_error));
    m
}

/// A stored answer, given to a retry under its own JSON-RPC id and marked
/// `_meta["dev.countersign/replayed"]` so the client can tell it from a
/// fresh execution.
fn replay(
    id: Value,
    answer: &ledger::Answer,
    key: &str,
    answered_at: &str,
    _modern: bool,
) -> Message {
    match answer {
        ledger::Answer::Result(text) => {
            let mut result: Value = serde_json::from_str(text).unwrap_or(Value::Null);
            if let Some(obj) = result.as_object_mut() {
                let meta = obj.entry("_meta").or_insert_with(|| json!({}));
                if let Some(meta) = meta.as_object_mut() {
                    meta.insert(
                        "dev.countersign/replayed".into(),
                        json!({ "key": key, "first_answered_at": answered_at }),
                    );
                }
            }
            Message::response(id, crate::jsonrpc::raw(&result))
        }
        ledger::Answer::Error(e) => error_message(id, e),
    }
}

/// Ledger verdicts that end a call without running it.
fn verdict(id: Value, outcome: IdemOutcome, key: &str, tool: &str, modern: bool) -> Message {
    let details = json!({ "idempotency_key": key });
    match outcome {
        // Which policy decided stays in the gateway's log (and the audit log
        // later): the agent learns the outcome, not how to word around it.
        IdemOutcome::Denied => reply::tool_error(
            id,
            reply::codes::POLICY_DENIED,
            "Refused, nothing was run: countersign's policies do not allow this call. Do not retry it; \
             ask a person if it is needed.",
            json!({}),
            modern,
        ),
        IdemOutcome::Approval(note) => approval_answer(id, &note, key, tool, modern),
        IdemOutcome::Unknown => reply::tool_error(
            id,
            reply::codes::OUTCOME_UNKNOWN,
            &format!(
                "The call may have run: a call with idempotency key `{key}` was sent and its answer was lost. \
                 Verify with a read before calling again; do not retry blindly. An operator can reconcile it."
            ),
            details,
            modern,
        ),
        IdemOutcome::Drift => reply::tool_error(
            id,
            reply::codes::DRIFT_REJECTED,
            &format!(
                "Refused, nothing was run: idempotency key `{key}` was already used for this tool with different \
                 arguments. A new call needs a new key."
            ),
            details,
            modern,
        ),
        IdemOutcome::Remap => reply::tool_error(
            id,
            reply::codes::REMAP_REJECTED,
            &format!(
                "Refused, nothing was run: idempotency key `{key}` was already used for a different tool or server{}. \
                 A new call needs a new key.",
                if tool.is_empty() { String::new() } else { format!(" (this call is for `{tool}`)") }
            ),
            details,
            modern,
        ),
        IdemOutcome::NotDispatched => reply::tool_error(
            id,
            reply::codes::UPSTREAM_UNAVAILABLE,
            "The call did not run: the identical call it joined could not be sent. It is safe to try again.",
            details,
            modern,
        ),
    }
}

/// What an agent is told when a call waits on, or was refused by, the
/// approval workflow. The proposal id lets it (and a person) follow up; the
/// exact same call later finds the approval.
fn approval_answer(id: Value, note: &ApprovalNote, key: &str, tool: &str, modern: bool) -> Message {
    let proposal = note.proposal_id.as_deref().unwrap_or("none");
    let mut details = json!({ "idempotency_key": key, "proposal_id": note.proposal_id });
    if let Some(r) = &note.revises {
        details["revises"] = json!(r);
    }
    if let Some(r) = &note.reason {
        details["reason"] = json!(r);
    }
    let tool = if tool.is_empty() {
        "this tool".to_owned()
    } else {
        format!("`{tool}`")
    };
    let (code, text) = match note.code {
        ApprovalCode::Pending if note.proposal_id.is_none() => (
            reply::codes::APPROVAL_PENDING,
            format!(
                "Not run: this call to {tool} needs a human approval, and no proposal was made: {}. \
                 Wait for reviewers to decide your earlier proposals before asking for more.",
                note.reason.as_deref().unwrap_or("too many proposals are waiting")
            ),
        ),
        ApprovalCode::Pending => (
            reply::codes::APPROVAL_PENDING,
            format!(
                "Not run yet: this call to {tool} needs a human approval, and proposal {proposal} is waiting for a reviewer{}. \
                 Nothing was run. Call again with exactly the same arguments later; once approved, it runs once. \
                 Changing the arguments needs a new approval.",
                note.revises.as_deref().map(|r| format!(" (it revises proposal {r})")).unwrap_or_default()
            ),
        ),
        ApprovalCode::Denied => (
            reply::codes::APPROVAL_DENIED,
            format!(
                "Refused, nothing was run: a reviewer denied this call to {tool} (proposal {proposal}){}. Do not retry it.",
                note.reason.as_deref().map(|r| format!(", saying: {r}")).unwrap_or_default()
            ),
        ),
        ApprovalCode::Expired => (
            reply::codes::APPROVAL_EXPIRED,
            format!(
                "Not run: the approval for this call to {tool} expired before it was used. Nothing was run; \
                 proposal {proposal} asks a reviewer again. Call again with the same arguments once it is approved."
            ),
        ),
        ApprovalCode::Stale => (
            reply::codes::STALE_RESOURCE_VERSION,
            format!(
                "Not run: what this call to {tool} acts on changed since a reviewer saw it{}. Nothing was run; \
                 re-read the resource, then call again{}.",
                note.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default(),
                note.proposal_id.as_deref().map(|p| format!(" (proposal {p} asks a reviewer about the new version)")).unwrap_or_default()
            ),
        ),
    };
    reply::tool_error(id, code, &text, details, modern)
}

/// The ledger could not record the call: fail closed, nothing is sent.
fn ledger_unavailable(id: Value, e: &crate::store::StoreError, modern: bool) -> Message {
    tracing::error!("refusing a call: {e}");
    reply::tool_error(
        id,
        reply::codes::UPSTREAM_UNAVAILABLE,
        "The call did not run: countersign could not record it in its ledger. It is safe to try again later.",
        json!({}),
        modern,
    )
}

/// Step one for every `tools/call`: strict parse and canonical form. The
/// forwarded `params` carry the exact JCS bytes that were hashed, so what is
/// checked (and later approved) is byte-for-byte what the server receives. A
/// refusal is `-32602` and nothing is sent upstream.
#[expect(clippy::result_large_err, reason = "the refusal is the answer itself")]
fn canonical_call(
    gw: &Gateway,
    server: &str,
    mut msg: Message,
) -> Result<(Message, canonical::CanonicalCall), Message> {
    let id = msg.id.clone().unwrap_or(Value::Null);
    let limits = canonical::Limits {
        max_depth: gw.config.limits.max_depth,
        max_arguments_bytes: gw.config.limits.max_arguments_bytes,
    };
    let params = msg.params.as_ref().map_or("null", |p| p.get());
    let call = canonical::canonicalize(server, params, limits)
        .map_err(|e| Message::error(id.clone(), code::INVALID_PARAMS, &e.to_string(), None))?;
    tracing::debug!(server, tool = %call.tool, digest = %call.digest, "canonical call");
    msg.params = Some(
        serde_json::value::RawValue::from_string(call.forward_params_text()).map_err(|e| {
            Message::error(
                id,
                code::INTERNAL_ERROR,
                &format!("canonical form is not JSON: {e}"),
                None,
            )
        })?,
    );
    Ok((msg, call))
}

/// Aborts the relayed call when the client goes away (2026-07-28: closing the
/// response stream is the cancellation).
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Relay one request. The answer is plain JSON when the upstream sends
/// nothing before it; as soon as a related message (progress, a server
/// request) comes first, the answer becomes an SSE stream.
#[expect(
    clippy::too_many_arguments,
    reason = "one request's whole context, passed once"
)]
async fn relay_request(
    gw: &Arc<Gateway>,
    route: Route,
    server: &str,
    msg: Message,
    sse: bool,
    modern: bool,
    extra: ExtraHeaders,
    caller: Caller,
) -> Response {
    let (tx, mut rx) = mpsc::channel::<Message>(64);
    let events = sse.then(|| tx.clone());
    let work = answer(
        gw.clone(),
        route,
        server.to_owned(),
        msg,
        events,
        modern,
        extra,
        caller,
    );
    // Spawned: in the handshake era a client that disconnects does not cancel
    // the call (it may resume through the session), so the call must outlive
    // this handler.
    let task = tokio::spawn(async move {
        let final_answer = work.await;
        let _ = tx.send(final_answer).await;
    });
    let abort = modern.then(|| AbortOnDrop(task.abort_handle()));
    let Some(first) = rx.recv().await else {
        return rpc_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            code::INTERNAL_ERROR,
            "the relay task ended without an answer",
            None,
        );
    };
    if first.kind() == Kind::Response {
        return rpc(StatusCode::OK, &first);
    }
    let frames = stream::unfold(
        (Some(first), rx, abort, false),
        |(next, mut rx, abort, done)| async move {
            if done {
                return None;
            }
            let msg = match next {
                Some(m) => m,
                None => rx.recv().await?,
            };
            let last = msg.kind() == Kind::Response;
            Some((
                Ok::<Bytes, Infallible>(sse::encode(&msg.to_bytes())),
                (None, rx, abort, last),
            ))
        },
    );
    sse_response(HttpBody::from_stream(frames))
}

fn sse_response(body: HttpBody) -> Response {
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

/// 2026-07-28: validate the metadata headers against the body, then relay
/// through the server's shared upstream.
async fn modern(
    gw: &Arc<Gateway>,
    server: &str,
    identity: Arc<Identity>,
    headers: &HeaderMap,
    msg: Message,
) -> Response {
    let params = msg.params_value();
    let declared = declared_version(params.as_ref()).unwrap_or_default();
    let id = msg.id.clone().unwrap_or(Value::Null);
    let mismatch = |text: String| {
        // The headers are what intermediaries route on; a body that says
        // otherwise is refused so that no component acts on a different call
        // than the one the gateway checked.
        rpc(
            StatusCode::BAD_REQUEST,
            &Message::error(id.clone(), code::HEADER_MISMATCH, &text, None),
        )
    };
    match header_str(headers, PROTOCOL_HEADER) {
        Some(v) if v == declared => {}
        Some(v) => {
            return mismatch(format!(
                "header mismatch: MCP-Protocol-Version `{v}` does not match _meta `{declared}`"
            ))
        }
        None => return mismatch("header mismatch: MCP-Protocol-Version header is missing".into()),
    }
    let unsupported = |supported: Vec<&str>, why: &str| {
        rpc(
            StatusCode::BAD_REQUEST,
            &Message::error(
                id.clone(),
                code::UNSUPPORTED_PROTOCOL_VERSION,
                why,
                Some(json!({ "supported": supported, "requested": declared })),
            ),
        )
    };
    if !MODERN_VERSIONS.contains(&declared.as_str()) {
        let all = MODERN_VERSIONS
            .iter()
            .chain(HANDSHAKE_VERSIONS)
            .copied()
            .collect();
        return unsupported(all, "Unsupported protocol version");
    }
    match header_str(headers, "mcp-method") {
        Some(m) if m == msg.method() => {}
        Some(m) => {
            return mismatch(format!(
                "header mismatch: Mcp-Method `{m}` does not match body `{}`",
                msg.method()
            ))
        }
        None => return mismatch("header mismatch: Mcp-Method header is missing".into()),
    }
    let name_field = match msg.method() {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        _ => None,
    };
    let mut name = None;
    if let Some(field) = name_field {
        let body_name = params
            .as_ref()
            .and_then(|p| p.get(field))
            .and_then(Value::as_str)
            .unwrap_or_default();
        match header_str(headers, "mcp-name").map(decode_header_value) {
            Some(Some(h)) if h == body_name => name = Some(body_name.to_owned()),
            Some(Some(h)) => {
                return mismatch(format!(
                    "header mismatch: Mcp-Name `{h}` does not match body `{body_name}`"
                ))
            }
            Some(None) => {
                return mismatch(
                    "header mismatch: Mcp-Name is not valid base64 sentinel encoding".into(),
                )
            }
            None => return mismatch("header mismatch: Mcp-Name header is missing".into()),
        }
    }
    let meta = params
        .as_ref()
        .and_then(|p| p.get("_meta"))
        .cloned()
        .unwrap_or(Value::Null);
    let conn = match gw.modern_upstream(server, &meta).await {
        Ok(ModernUpstream::Speaks(conn)) => Some(conn),
        Ok(ModernUpstream::Legacy) => {
            return unsupported(
                HANDSHAKE_VERSIONS.to_vec(),
                &format!("upstream `{server}` speaks only the handshake era: send initialize"),
            )
        }
        // Not reachable now: a request goes on, and its own pipeline tries
        // again, classifies the failure (nothing of it was sent) and feeds
        // the circuit breaker.
        Err(e) => {
            tracing::debug!(
                server,
                "upstream not reachable for a 2026-07-28 request: {e}"
            );
            None
        }
    };
    let mut extra = modern_headers(msg.method(), name.as_deref(), &declared);
    // Intermediaries forward `Mcp-Param-*` headers they do not interpret.
    for (k, v) in headers {
        if k.as_str().starts_with("mcp-param-") {
            extra.push((k.clone(), v.clone()));
        }
    }
    match msg.kind() {
        Kind::Request => {
            let caller = Caller {
                identity,
                scope: None,
            };
            let route = Route::Shared {
                server: server.to_owned(),
                meta,
            };
            relay_request(
                gw,
                route,
                server,
                msg,
                accepts_sse(headers),
                true,
                extra,
                caller,
            )
            .await
        }
        _ => {
            match conn {
                Some(conn) => {
                    if let Err(e) = conn.send(msg, &extra).await {
                        tracing::warn!(server, "client message not delivered upstream: {e}");
                    }
                }
                None => tracing::warn!(
                    server,
                    "client notification dropped: the upstream is not reachable"
                ),
            }
            StatusCode::ACCEPTED.into_response()
        }
    }
}

async fn get_mcp(
    State(gw): State<Arc<Gateway>>,
    Path(server): Path<String>,
    headers: HeaderMap,
) -> Response {
    let session = match named_session(&gw, &server, &headers) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let Ok(receiver) = session.standalone.clone().try_lock_owned() else {
        return rpc_error(
            StatusCode::CONFLICT,
            code::INVALID_REQUEST,
            "this session already has a standalone stream open",
            None,
        );
    };
    let frames = stream::unfold(receiver, |mut rx| async move {
        let msg = rx.recv().await?;
        Some((Ok::<Bytes, Infallible>(sse::encode(&msg.to_bytes())), rx))
    });
    sse_response(HttpBody::from_stream(frames))
}

async fn delete_mcp(
    State(gw): State<Arc<Gateway>>,
    Path(server): Path<String>,
    headers: HeaderMap,
) -> Response {
    let session = match named_session(&gw, &server, &headers) {
        Ok(s) => s,
        Err(r) => return r,
    };
    gw.close_session(&session.id).await;
    tracing::info!(server, session = %session.id, "session closed by the client");
    StatusCode::OK.into_response()
}

/// GET and DELETE act on the handshake-era session the request names; in the
/// 2026-07-28 era (no session) both are 405.
#[expect(
    clippy::result_large_err,
    reason = "the refusal is the response itself"
)]
fn named_session(
    gw: &Gateway,
    server: &str,
    headers: &HeaderMap,
) -> Result<Arc<Session>, Response> {
    let identity = admit(gw, server, headers)?;
    let Some(sid) = header_str(headers, SESSION_HEADER) else {
        return Err(StatusCode::METHOD_NOT_ALLOWED.into_response());
    };
    gw.session(server, sid, &identity).ok_or_else(|| {
        rpc_error(
            StatusCode::NOT_FOUND,
            code::INVALID_REQUEST,
            "session not found: send initialize again",
            None,
        )
    })
}
