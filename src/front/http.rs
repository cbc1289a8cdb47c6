//! The HTTP front: `/mcp/{server}` (Streamable HTTP, both wire eras), and
//! the routes of the operator endpoints ([`super::ops`]) and the control
//! API ([`super::control`]). The stream machinery is in [`super::stream`].
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
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures_util::{stream, StreamExt};
use serde_json::Value;
use tracing::Instrument;

use super::auth::TokenMemo;
use super::mcp::{self, Origin, RequestCtx};
use super::ops;
use super::respond::{reject, rpc, sse_response};
use super::stream::{follow, lock_replay, relay_request, Resumable};
use crate::core::identity::Identity;
use crate::enforce::answer::Rejection;
use crate::enforce::pipeline::Caller;
use crate::front::gateway::{Gateway, ModernUpstream, Opened, Session};
use crate::front::route::Target;
use crate::upstream::{ExtraHeaders, Passthrough, UpstreamConn};
use crate::wire::era::{check_modern, declared_version, Era, ModernRequest, HANDSHAKE_VERSIONS};
use crate::wire::jsonrpc::{parse_client_body, Body, Kind, Message};
use crate::wire::sse;

// Header names parsed once, at compile time: a name given as text is
// parsed again on every lookup.
const SESSION_HEADER: HeaderName = HeaderName::from_static("mcp-session-id");
const PROTOCOL_HEADER: HeaderName = HeaderName::from_static("mcp-protocol-version");
/// Header by which the stdio bridge names its stable session scope.
pub(crate) const SCOPE_HEADER: &str = "countersign-session-scope";

/// The gateway's routes, with the review console's when it is on.
pub(crate) fn router(
    gw: Arc<Gateway>,
    console: Option<Arc<crate::front::review::Console>>,
) -> Router {
    Router::new()
        .route("/healthz", get(ops::healthz))
        .route("/metrics", get(ops::metrics))
        .route("/audit/checkpoint", get(ops::audit_checkpoint))
        .route("/audit/proof/inclusion", get(ops::audit_inclusion))
        .route("/audit/proof/consistency", get(ops::audit_consistency))
        .route(
            "/.well-known/oauth-protected-resource",
            get(ops::resource_metadata),
        )
        .route(
            "/.well-known/oauth-protected-resource/mcp/{server}",
            get(ops::server_resource_metadata),
        )
        .route(
            "/mcp/{server}",
            get(get_mcp).post(post_mcp).delete(delete_mcp),
        )
        .with_state(Arc::clone(&gw))
        .merge(crate::front::review::router(console))
        .merge(crate::front::control::router(gw))
}

/// A request as it comes off a connection. `POST /mcp/{server}` with a
/// plain server name (every tool call) goes straight to its handler, with
/// its body held to the same deadline; anything else goes through the
/// router ([`super::bounds::serve`]). The router's matching, its extractors
/// and its boxed futures cost several thousand instructions per call, more
/// than the decision. A name with `%` goes through the router, whose path
/// extractor decodes it; a plain name is the same text either way.
/// `peer` and `memo` are the connection's.
pub(crate) async fn serve<B>(
    b: Arc<super::bounds::Bounds>,
    mut req: axum::http::Request<B>,
    peer: std::net::SocketAddr,
    memo: Arc<TokenMemo>,
) -> Result<Response, Infallible>
where
    B: http_body::Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    let plain = (req.method() == axum::http::Method::POST)
        .then(|| req.uri().path().strip_prefix("/mcp/"))
        .flatten()
        .filter(|name| !name.is_empty() && !name.contains(['/', '%']))
        .map(str::to_owned);
    let Some(server) = plain else {
        // The router's handlers find the peer and the memo among the
        // request's extensions.
        let extensions = req.extensions_mut();
        extensions.insert(axum::extract::ConnectInfo(peer));
        extensions.insert(memo);
        return super::bounds::serve(b, req).await;
    };
    let (parts, body) = req.into_parts();
    let body = b.timed_body(body);
    let gw = Arc::clone(b.gateway());
    let peer = Some(axum::Extension(axum::extract::ConnectInfo(peer)));
    let memo = Some(axum::Extension(memo));
    Ok(post_mcp(State(gw), Path(server), peer, memo, parts.headers, body).await)
}

/// Origin, token and server checks shared by every `/mcp` method.
async fn admit(
    gw: &Gateway,
    server: &str,
    headers: &HeaderMap,
    memo: Option<&TokenMemo>,
) -> Result<super::auth::Authenticated, Response> {
    // The server name is the client's text: named in a refusal's audit
    // entry only when it is one of ours.
    let known = gw.config().servers.contains_key(server).then_some(server);
    if !origin_allowed(gw, headers) {
        // A browser page from a foreign origin (DNS rebinding) must not drive
        // a gateway that listens on localhost.
        let origin = headers
            .get(header::ORIGIN)
            .map(|o| String::from_utf8_lossy(o.as_bytes()).into_owned())
            .unwrap_or_default();
        gw.refused(
            "origin",
            known,
            &format!("origin `{}`", crate::core::legible::text(&origin)),
        );
        return Err(reject(Rejection::Origin, Value::Null));
    }
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let now = gw.pipeline().clock().now_ms();
    let authenticated = match gw.auth().identify(auth, server, now, memo).await {
        Ok(a) => a,
        Err(refusal) => {
            gw.refused("token", known, &gw.auth().describe(&refusal));
            return Err(gw.auth().refuse(known, &refusal));
        }
    };
    // Per identity, before anything is parsed or sent: one agent in a loop
    // cannot take the gateway (or the upstreams behind it) from the others.
    if let Err(retry_after) = gw.rate_check(&authenticated.identity) {
        gw.refused("rate_limited", known, "over limits.requests_per_second");
        return Err(reject(
            Rejection::RateLimited {
                per_second: gw.config().limits.requests_per_second,
                retry_after,
            },
            Value::Null,
        ));
    }
    if !gw.config().servers.contains_key(server) {
        let known = gw.config().servers.keys().cloned().collect();
        return Err(reject(
            Rejection::UnknownServer {
                server: server.to_owned(),
                known,
            },
            Value::Null,
        ));
    }
    Ok(authenticated)
}

fn origin_allowed(gw: &Gateway, headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    if gw
        .config()
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

fn header_str(headers: &HeaderMap, name: impl header::AsHeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn accepts_sse(headers: &HeaderMap) -> bool {
    header_str(headers, header::ACCEPT)
        .is_none_or(|a| a.contains("text/event-stream") || a.contains("*/*"))
}

/// An answer to a request whose body was not read to its end (refused
/// before it, or cut off in it). hyper closes such a connection after the
/// answer, and a client that put it back in its pool would send its next
/// request (the OAuth discovery right after a 401) into a closing socket:
/// "server disconnected without sending a response". `Connection: close`
/// keeps it out of the pool. Here rather than in `bounds` for every route:
/// knowing whether a body ended would cost every call, and the other
/// routes read their bodies whole before they answer (the console's
/// refusals in `bounds` already say `close`).
fn closing(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// The handler's future is moved by value by the router: the paths off
/// the common one (batch, initialize, 2026-07-28, a session's relay) are
/// boxed where they are awaited, so it stays small.
async fn post_mcp(
    State(gw): State<Arc<Gateway>>,
    Path(server): Path<String>,
    peer: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    memo: Option<axum::Extension<Arc<TokenMemo>>>,
    headers: HeaderMap,
    body: HttpBody,
) -> Response {
    let memo = memo.as_ref().map(|axum::Extension(m)| &**m);
    let super::auth::Authenticated { identity, subject } =
        match admit(&gw, &server, &headers, memo).await {
            Ok(a) => a,
            // An unauthenticated body is never read.
            Err(r) => return closing(r),
        };
    let limit = gw.config().limits.max_body_bytes;
    // The header timeout ends at the header: a body trickled in a byte at a
    // time is cut off at the router's deadline (`bounds`, from the request's
    // start), before anything of it is parsed or run.
    let within = gw.config().gateway.body_read_timeout;
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(e) => {
            let e = e.into_inner();
            if super::bounds::is_deadline(&*e) {
                gw.refused(
                    "body_timeout",
                    Some(&server),
                    "the request body did not arrive in time",
                );
                return closing(reject(Rejection::BodyTimeout(within), Value::Null));
            }
            // Only the limit's own error means "too large"; a malformed
            // chunked body or one shorter than its Content-Length is a bad
            // request, and says so.
            let too_large =
                std::iter::successors(Some(&*e as &dyn std::error::Error), |e| e.source())
                    .any(|e| e.is::<http_body_util::LengthLimitError>());
            if too_large {
                return closing(reject(Rejection::TooLarge { limit }, Value::Null));
            }
            tracing::warn!(%server, "request body could not be read: {e}");
            return closing(reject(
                Rejection::BodyUnreadable(e.to_string()),
                Value::Null,
            ));
        }
    };
    let parsed = match parse_client_body(&bytes) {
        Ok(p) => p,
        Err(e) => {
            // Not a message (an id of the wrong type, say): nothing of it
            // goes anywhere, and it is counted.
            gw.refused("malformed", Some(&server), &e.to_string());
            return reject(Rejection::Parse(e), Value::Null);
        }
    };
    let origin = Origin {
        client: peer.map(|axum::Extension(axum::extract::ConnectInfo(a))| a),
        header: crate::telemetry::on()
            .then(|| {
                let traceparent = header_str(&headers, "traceparent")?.to_owned();
                let tracestate = header_str(&headers, "tracestate").map(str::to_owned);
                Some(crate::wire::trace::TraceContext {
                    traceparent,
                    tracestate,
                })
            })
            .flatten(),
        subject,
    };
    if let Some(sid) = header_str(&headers, &SESSION_HEADER) {
        let Some(session) = gw.session(&server, sid, &identity) else {
            return reject(Rejection::NoSuchSession, Value::Null);
        };
        session.touch();
        if let Some(v) = header_str(&headers, &PROTOCOL_HEADER) {
            if !HANDSHAKE_VERSIONS.contains(&v) && v != "2024-11-05" {
                return reject(Rejection::SessionVersion(v.to_owned()), Value::Null);
            }
        }
        return match parsed {
            Body::Single(msg) => {
                in_session(&gw, &session, msg, accepts_sse(&headers), &origin).await
            }
            Body::Batch(members) => {
                // Batching exists only in 2025-03-26; later versions removed it.
                let version = session.protocol_version.lock().clone();
                if version.as_deref() != Some("2025-03-26") {
                    return reject(Rejection::BatchVersion(version), Value::Null);
                }
                Box::pin(batch(&gw, &session, members, &origin)).await
            }
        };
    }
    match parsed {
        Body::Single(msg) if msg.method() == "initialize" && msg.kind() == Kind::Request => {
            Box::pin(initialize(&gw, &server, identity, &headers, msg, &origin)).await
        }
        Body::Single(msg) if declared_version(msg.params_value().as_ref()).is_some() => {
            Box::pin(modern(&gw, &server, identity, &headers, msg, &origin)).await
        }
        _ => reject(Rejection::NoSession, Value::Null),
    }
}

async fn initialize(
    gw: &Arc<Gateway>,
    server: &str,
    identity: Arc<Identity>,
    headers: &HeaderMap,
    msg: Message,
    origin: &Origin,
) -> Response {
    let span = match crate::telemetry::on() {
        true => crate::telemetry::server_span(
            &msg,
            &crate::telemetry::Request {
                server,
                client: origin.client,
                header: origin.header.clone(),
                session_id: None,
                protocol_version: msg
                    .params_value()
                    .and_then(|p| p.get("protocolVersion")?.as_str().map(str::to_owned)),
            },
        ),
        false => tracing::Span::none(),
    };
    // Checked before connecting: each session may hold an upstream child.
    let limit = gw.config().limits.max_sessions_per_identity;
    if gw.sessions_of(&identity) >= limit {
        return reject(
            Rejection::TooManySessions { limit },
            msg.id.clone().unwrap_or(Value::Null),
        );
    }
    let scope = header_str(headers, SCOPE_HEADER).map(str::to_owned);
    let opened = gw
        .open_session(server, identity, scope, msg)
        .instrument(span.clone())
        .await;
    match opened {
        Opened::Session(session, resp) => {
            let resp = super::tasks::offer_in_initialize(gw, &session, resp);
            crate::telemetry::record_answer(&span, &resp);
            span.record("mcp.session.id", session.id.as_str());
            let mut r = rpc(StatusCode::OK, &resp);
            if let Ok(v) = HeaderValue::try_from(session.id.as_str()) {
                r.headers_mut().insert(SESSION_HEADER, v);
            }
            r
        }
        Opened::Refused(resp) => {
            crate::telemetry::record_answer(&span, &resp);
            rpc(StatusCode::OK, &resp)
        }
    }
}

async fn in_session(
    gw: &Arc<Gateway>,
    session: &Arc<Session>,
    msg: Message,
    sse: bool,
    origin: &Origin,
) -> Response {
    match msg.kind() {
        Kind::Request if msg.method() == "initialize" => {
            reject(Rejection::AlreadyInitialized, msg.id.unwrap_or(Value::Null))
        }
        Kind::Request => {
            let stream = Resumable(session.clone());
            let rc = session_request(session, origin);
            Box::pin(relay_request(gw, rc, msg, sse, Some(stream))).await
        }
        // The answer to a question the gateway itself asked (approval in the
        // client) stays here; every other response is the upstream's.
        Kind::Response if session.asks.is_some() => {
            let open = session.asks.as_ref().and_then(|a| a.take(msg.id.as_ref()));
            match open {
                Some(open) => {
                    Box::pin(crate::enforce::client::answered(
                        gw.pipeline().book(),
                        &session.identity,
                        open,
                        &msg,
                    ))
                    .await;
                }
                None => {
                    return Box::pin(forward(
                        gw,
                        Some(&session.conn()),
                        &session.server,
                        msg,
                        &Vec::new(),
                    ))
                    .await
                }
            }
            StatusCode::ACCEPTED.into_response()
        }
        // Over a 2026-07-28 upstream there is no handshake to complete.
        Kind::Notification
            if session.envelope.is_some() && msg.method() == "notifications/initialized" =>
        {
            StatusCode::ACCEPTED.into_response()
        }
        Kind::Notification | Kind::Response => {
            let extra = session_request(session, origin).extra;
            Box::pin(forward(
                gw,
                Some(&session.conn()),
                &session.server,
                msg,
                &extra,
            ))
            .await
        }
    }
}

/// A client notification or response, relayed as it is: 202. A message
/// that could be taken for a `tools/call` (a `tools/call` without an id, a
/// lookalike method) or a notification outside `notifications/` is never
/// sent: it is refused with 400 and a JSON-RPC error without an id (as the
/// transport says for input a server does not accept), and counted. With
/// no `conn` (the upstream is not reachable), a relayable message is
/// dropped and logged.
async fn forward(
    gw: &Gateway,
    conn: Option<&UpstreamConn>,
    server: &str,
    msg: Message,
    extra: &ExtraHeaders,
) -> Response {
    // Fail closed on the wire: this is where every client notification and
    // response of every era and path meets the rule.
    if let Some(why) = Passthrough::refusal(&msg) {
        gw.refuse_unrelayable(server, &msg, why);
        return reject(Rejection::Unrelayable(why), Value::Null);
    }
    let Some(conn) = conn else {
        tracing::warn!(
            server,
            "client notification dropped: the upstream is not reachable"
        );
        return StatusCode::ACCEPTED.into_response();
    };
    let sent = match Passthrough::checked(server, msg) {
        Ok(msg) => conn.send(msg, extra).await,
        Err(e) => Err(e),
    };
    if let Err(e) = sent {
        tracing::warn!(server, "client message not delivered upstream: {e}");
    }
    StatusCode::ACCEPTED.into_response()
}

/// A JSON-RPC batch (2025-03-26): each member handled as if sent alone, the
/// answers collected into one array.
async fn batch(
    gw: &Arc<Gateway>,
    session: &Arc<Session>,
    members: Vec<Result<Message, crate::wire::jsonrpc::ParseError>>,
    origin: &Origin,
) -> Response {
    // A batch is refused whole past its cap, before any member is looked at.
    let limit = gw.config().limits.max_batch_members;
    if members.len() > limit {
        gw.refused(
            "batch_too_large",
            Some(&session.server),
            "a batch over limits.max_batch_members",
        );
        return reject(
            Rejection::BatchTooLarge {
                members: members.len(),
                limit,
            },
            Value::Null,
        );
    }
    let mut answers = Vec::new();
    let mut calls = Vec::new();
    // The HTTP request was admitted once by the rate limiter; each member
    // in it after the first, a request or a notification alike, is one
    // more to the limiter, so a batch relays no more than a burst of
    // single messages would.
    let mut admitted = false;
    for member in members {
        match member {
            Err(e) => answers.push(Rejection::Parse(e).message(Value::Null)),
            Ok(msg) if msg.kind() == Kind::Request && msg.method() == "initialize" => {
                answers.push(Rejection::InitializeInBatch.message(msg.id.unwrap_or(Value::Null)))
            }
            Ok(msg) if msg.kind() == Kind::Request => {
                if std::mem::replace(&mut admitted, true) {
                    if let Err(retry_after) = gw.rate_check(&session.identity) {
                        gw.refused(
                            "rate_limited",
                            Some(&session.server),
                            "a batch member over limits.requests_per_second",
                        );
                        let limited = Rejection::RateLimited {
                            per_second: gw.config().limits.requests_per_second,
                            retry_after,
                        };
                        answers.push(limited.message(msg.id.unwrap_or(Value::Null)));
                        continue;
                    }
                }
                let rc = session_request(session, origin);
                calls.push(async move { mcp::answer(gw, &rc, msg, None).await })
            }
            // A notification or a response: relayed (or, if it may not be,
            // dropped and counted) once the limiter admits it; over the
            // rate it is dropped (it gets no answer) and counted.
            Ok(msg) => {
                if std::mem::replace(&mut admitted, true)
                    && gw.rate_check(&session.identity).is_err()
                {
                    gw.refused(
                        "rate_limited",
                        Some(&session.server),
                        "a batch member over limits.requests_per_second",
                    );
                    continue;
                }
                let _ = forward(gw, Some(&session.conn()), &session.server, msg, &Vec::new()).await;
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

fn session_request(session: &Arc<Session>, origin: &Origin) -> RequestCtx {
    RequestCtx {
        server: session.server.clone(),
        caller: Caller {
            identity: session.identity.clone(),
            scope: Some(session.scope.clone()),
            subject: origin.subject.clone(),
        },
        era: Era::Handshake,
        target: Target::Session(session.clone()),
        // Over a 2026-07-28 upstream: its metadata headers, named for each
        // request as it is sent (`wire::era::headers_for`).
        extra: match &session.envelope {
            Some(_) => {
                crate::wire::era::modern_headers("", None, crate::wire::era::MODERN_VERSIONS[0])
            }
            None => Vec::new(),
        },
        asks: session.asks.clone(),
        bridged: session.envelope.is_some(),
        origin: origin.clone(),
    }
}

/// 2026-07-28: validate the metadata headers against the body, then relay
/// through the server's shared upstream.
async fn modern(
    gw: &Arc<Gateway>,
    server: &str,
    identity: Arc<Identity>,
    headers: &HeaderMap,
    msg: Message,
    origin: &Origin,
) -> Response {
    let id = msg.id.clone().unwrap_or(Value::Null);
    let checked = match check_modern(headers, &msg) {
        Ok(c) => c,
        Err(problem) => return reject(Rejection::Header(problem), id),
    };
    // Refused before any upstream is connected for it.
    if msg.kind() != Kind::Request && Passthrough::refusal(&msg).is_some() {
        return forward(gw, None, server, msg, &Vec::new()).await;
    }
    let conn = match gw.modern_upstream(server).await {
        Ok(ModernUpstream::Speaks(conn)) => Some(conn),
        Ok(ModernUpstream::Legacy) if bridges(gw, server) => {
            return bridged(gw, server, identity, headers, msg, &checked.meta, origin).await;
        }
        Ok(ModernUpstream::Legacy) => {
            let rejection = Rejection::LegacyUpstream {
                server: server.to_owned(),
                requested: checked.version,
            };
            return reject(rejection, id);
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
    let ModernRequest { extra, .. } = checked;
    match msg.kind() {
        Kind::Request => {
            let target = Target::Shared {
                server: server.to_owned(),
            };
            let mut rc = RequestCtx::stateless(server, identity, target, extra, false);
            rc.caller.subject = origin.subject.clone();
            rc.origin = origin.clone();
            Box::pin(relay_request(gw, rc, msg, accepts_sse(headers), None)).await
        }
        _ => forward(gw, conn.as_deref(), server, msg, &extra).await,
    }
}

/// Whether 2026-07-28 clients of `server` are bridged to its handshake era.
fn bridges(gw: &Gateway, server: &str) -> bool {
    gw.config()
        .servers
        .get(server)
        .is_some_and(|c| c.bridge_eras)
}

/// A 2026-07-28 request to a server that speaks only the handshake era,
/// carried by the handshake-era session the gateway holds for the caller
/// ([`Gateway::bridged`]) and answered in the client's era. The
/// enforcement is the same as for any 2026-07-28 request: the pipeline
/// sees a stateless caller, so keys, approvals and the ledger are exactly
/// those of a server that spoke the era itself.
async fn bridged(
    gw: &Arc<Gateway>,
    server: &str,
    identity: Arc<Identity>,
    headers: &HeaderMap,
    msg: Message,
    meta: &Value,
    origin: &Origin,
) -> Response {
    let id = msg.id.clone().unwrap_or(Value::Null);
    let bridge = match gw.bridged(server, &identity, meta, id.clone()).await {
        Ok(b) => b,
        Err(refusal) => return rpc(StatusCode::OK, &refusal),
    };
    match msg.kind() {
        Kind::Request if msg.method() == "server/discover" => {
            let mut discover = crate::enforce::answer::bridged_discover(id, &bridge.init);
            super::tasks::offer_in_discover(gw, &mut discover);
            rpc(StatusCode::OK, &discover)
        }
        Kind::Request => {
            let target = Target::Session(bridge.session);
            let mut rc = RequestCtx::stateless(server, identity, target, Vec::new(), true);
            rc.caller.subject = origin.subject.clone();
            rc.origin = origin.clone();
            Box::pin(relay_request(gw, rc, msg, accepts_sse(headers), None)).await
        }
        _ => {
            let conn = bridge.session.conn();
            forward(gw, Some(&conn), server, msg, &Vec::new()).await
        }
    }
}

async fn get_mcp(
    State(gw): State<Arc<Gateway>>,
    Path(server): Path<String>,
    headers: HeaderMap,
) -> Response {
    let session = match named_session(&gw, &server, &headers).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    // Resumption of a broken stream (2025-11-25): `Last-Event-ID` names the
    // stream and the last event the client got.
    let resume = match header_str(&headers, "last-event-id") {
        None => None,
        Some(id) => match sse::parse_event_id(id) {
            Some(at) => Some(at),
            None => return reject(Rejection::LastEventId(id.to_owned()), Value::Null),
        },
    };
    if let Some((stream, after)) = resume.filter(|(s, _)| *s != sse::STANDALONE) {
        if lock_replay(&session).since(stream, after).is_none() {
            return reject(
                Rejection::LastEventId(format!("{stream}-{after}")),
                Value::Null,
            );
        }
        return sse_response(HttpBody::from_stream(follow(session, stream, after, false)));
    }
    let Ok(receiver) = session.standalone.clone().try_lock_owned() else {
        return reject(Rejection::StreamTaken, Value::Null);
    };
    // The standalone stream: its kept events after the client's last one,
    // or a priming event for a new listener; then what the server sends.
    let first: Vec<Bytes> = match resume {
        Some((_, after)) => lock_replay(&session)
            .since(sse::STANDALONE, after)
            .map(|r| r.events)
            .unwrap_or_default(),
        None => vec![lock_replay(&session).priming(sse::STANDALONE)],
    };
    let live = stream::unfold((receiver, session), |(mut rx, session)| async move {
        let msg = rx.recv().await?;
        let frame = lock_replay(&session).push(sse::STANDALONE, &msg.to_bytes());
        Some((Ok::<Bytes, Infallible>(frame), (rx, session)))
    });
    sse_response(HttpBody::from_stream(
        stream::iter(first.into_iter().map(Ok::<Bytes, Infallible>)).chain(live),
    ))
}

async fn delete_mcp(
    State(gw): State<Arc<Gateway>>,
    Path(server): Path<String>,
    headers: HeaderMap,
) -> Response {
    let session = match named_session(&gw, &server, &headers).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    gw.close_session(&session.id).await;
    tracing::info!(server, session = %session.id, "session closed by the client");
    StatusCode::OK.into_response()
}

/// GET and DELETE act on the handshake-era session the request names; in the
/// 2026-07-28 era (no session) both are 405.
async fn named_session(
    gw: &Gateway,
    server: &str,
    headers: &HeaderMap,
) -> Result<Arc<Session>, Response> {
    let identity = admit(gw, server, headers, None).await?.identity;
    let Some(sid) = header_str(headers, &SESSION_HEADER) else {
        // 405 as the specification asks of a server without such a stream,
        // with the reason in words.
        return Err((
            StatusCode::METHOD_NOT_ALLOWED,
            [(header::ALLOW, "POST")],
            "no Mcp-Session-Id: a GET stream and a DELETE belong to a handshake-era session \
             (initialize first); 2026-07-28 has no sessions\n",
        )
            .into_response());
    };
    gw.session(server, sid, &identity)
        .ok_or_else(|| reject(Rejection::NoSuchSession, Value::Null))
}
