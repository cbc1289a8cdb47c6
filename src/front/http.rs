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

use super::mcp::{self, RequestCtx};
use crate::core::identity::Identity;
use crate::enforce::pipeline::Caller;
use crate::upstream::route::Target;
use crate::upstream::session::{Gateway, ModernUpstream, Opened, Session};
use crate::upstream::{ExtraHeaders, Passthrough, UpstreamConn};
use crate::wire::era::{
    declared_version, decode_header_value, modern_headers, Era, HANDSHAKE_VERSIONS, MODERN_VERSIONS,
};
use crate::wire::jsonrpc::{code, parse_body, Body, Kind, Message};
use crate::wire::sse;

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
        .merge(crate::front::control::router(gw))
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
    let scope = header_str(headers, SCOPE_HEADER).map(str::to_owned);
    match gw.open_session(server, identity, scope, msg).await {
        Opened::Session(session, resp) => {
            let mut r = rpc(StatusCode::OK, &resp);
            if let Ok(v) = HeaderValue::try_from(session.id.as_str()) {
                r.headers_mut().insert(SESSION_HEADER, v);
            }
            r
        }
        Opened::Refused(resp) => rpc(StatusCode::OK, &resp),
    }
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
        Kind::Request => relay_request(gw, session_request(session), msg, sse).await,
        Kind::Notification | Kind::Response => {
            forward(&session.conn(), &session.server, msg, &Vec::new()).await;
            StatusCode::ACCEPTED.into_response()
        }
    }
}

/// A client notification or response, relayed as it is.
async fn forward(conn: &UpstreamConn, server: &str, msg: Message, extra: &ExtraHeaders) {
    let sent = match Passthrough::checked(server, msg) {
        Ok(msg) => conn.send(msg, extra).await,
        Err(e) => Err(e),
    };
    if let Err(e) = sent {
        tracing::warn!(server, "client message not delivered upstream: {e}");
    }
}

/// A JSON-RPC batch (2025-03-26): each member handled as if sent alone, the
/// answers collected into one array.
async fn batch(
    gw: &Arc<Gateway>,
    session: &Arc<Session>,
    members: Vec<Result<Message, crate::wire::jsonrpc::ParseError>>,
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
            Ok(msg) if msg.kind() == Kind::Request => {
                let rc = session_request(session);
                calls.push(async move { mcp::answer(gw, &rc, msg, None).await })
            }
            Ok(msg) => {
                forward(&session.conn(), &session.server, msg, &Vec::new()).await;
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

fn session_request(session: &Arc<Session>) -> RequestCtx {
    RequestCtx {
        server: session.server.clone(),
        caller: Caller {
            identity: session.identity.clone(),
            scope: Some(session.scope.clone()),
        },
        era: Era::Handshake,
        target: Target::Session(session.clone()),
        extra: Vec::new(),
    }
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
async fn relay_request(gw: &Arc<Gateway>, rc: RequestCtx, msg: Message, sse: bool) -> Response {
    let (tx, mut rx) = mpsc::channel::<Message>(64);
    let events = sse.then(|| tx.clone());
    let era = rc.era;
    let gw = gw.clone();
    let work = async move { mcp::answer(&gw, &rc, msg, events).await };
    // Spawned: in the handshake era a client that disconnects does not cancel
    // the call (it may resume through the session), so the call must outlive
    // this handler.
    let task = tokio::spawn(async move {
        let final_answer = work.await;
        let _ = tx.send(final_answer).await;
    });
    let abort = (era == Era::Modern).then(|| AbortOnDrop(task.abort_handle()));
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
            let rc = RequestCtx {
                server: server.to_owned(),
                caller: Caller {
                    identity,
                    scope: None,
                },
                era: Era::Modern,
                target: Target::Shared {
                    server: server.to_owned(),
                    meta,
                },
                extra,
            };
            relay_request(gw, rc, msg, accepts_sse(headers)).await
        }
        _ => {
            match conn {
                Some(conn) => forward(&conn, server, msg, &extra).await,
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
