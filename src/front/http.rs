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
use futures_util::{stream, StreamExt};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::mcp::{self, RequestCtx};
use crate::core::identity::Identity;
use crate::enforce::answer::Rejection;
use crate::enforce::pipeline::Caller;
use crate::front::gateway::{Gateway, ModernUpstream, Opened, Session};
use crate::front::route::Target;
use crate::upstream::{ExtraHeaders, Passthrough, UpstreamConn};
use crate::wire::era::{check_modern, declared_version, Era, ModernRequest, HANDSHAKE_VERSIONS};
use crate::wire::jsonrpc::{parse_client_body, Body, Kind, Message};
use crate::wire::sse;

const SESSION_HEADER: &str = "mcp-session-id";
const PROTOCOL_HEADER: &str = "mcp-protocol-version";
/// Header by which the stdio bridge names its stable session scope.
pub(crate) const SCOPE_HEADER: &str = "countersign-session-scope";

/// The gateway's routes.
pub(crate) fn router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/audit/checkpoint", get(audit_checkpoint))
        .route("/audit/proof/inclusion", get(audit_inclusion))
        .route("/audit/proof/consistency", get(audit_consistency))
        .route(
            "/mcp/{server}",
            get(get_mcp).post(post_mcp).delete(delete_mcp),
        )
        .with_state(Arc::clone(&gw))
        .merge(crate::front::control::router(gw))
}

async fn healthz(State(gw): State<Arc<Gateway>>) -> Response {
    // Without its store the gateway runs nothing that writes: say so (503),
    // so that a load balancer sends calls to another gateway.
    let store = gw.pipeline().store().health().await;
    let body = json!({
        "status": if store.is_ok() { "ok" } else { "degraded" },
        "store": match &store {
            Ok(()) => "ok".to_owned(),
            Err(e) => format!("unreachable: {e}"),
        },
        "sessions": gw.session_count(),
        "circuits": gw.pipeline().circuits(),
    });
    (
        if store.is_ok() {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        },
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// `/metrics` for a scraper with the metrics token (`[metrics]`); 404 when
/// none is configured, 401 for any other token. The gauges are read now.
async fn metrics(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let Some(expected) = gw.config().metrics.token_sha256.as_deref() else {
        return (
            StatusCode::NOT_FOUND,
            "no [metrics] token_sha256 is configured\n",
        )
            .into_response();
    };
    // Compared as digests, as identities are: the token itself is never kept.
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| hex::encode(Sha256::digest(t.as_bytes())));
    if presented.is_none_or(|p| !p.eq_ignore_ascii_case(expected)) {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "the metrics token is required\n",
        )
            .into_response();
    }
    let store = gw.pipeline().store();
    let pending = match store.list_proposals().await {
        Ok(all) => all
            .iter()
            .filter(|p| p.state == crate::core::approval::ProposalState::Pending)
            .count(),
        Err(e) => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the store does not answer: {e}\n"),
            )
                .into_response()
        }
    };
    let unknown = match crate::enforce::reconcile::list_unknown_in(store.as_ref()).await {
        Ok(all) => all.len(),
        Err(e) => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the store does not answer: {e}\n"),
            )
                .into_response()
        }
    };
    let now = crate::enforce::metrics::Sampled {
        pending: pending as i64,
        unknown: unknown as i64,
        circuits: gw.pipeline().circuits().into_iter().collect(),
        audit_lag: gw.pipeline().audit_sink().map_or(0, |a| a.lag()) as i64,
        ledger_unflushed: gw.pipeline().store().unflushed(),
    };
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        gw.pipeline().metrics().render(&now),
    )
        .into_response()
}

/// `GET /audit/checkpoint`: the latest signed checkpoint note, with any
/// witness cosignatures. Read-only and unauthenticated, like a transparency
/// log's: it holds a size and a root hash, nothing of any entry.
async fn audit_checkpoint(State(gw): State<Arc<Gateway>>) -> Response {
    let Some(dir) = gw.audit_dir().map(ToOwned::to_owned) else {
        return (StatusCode::NOT_FOUND, "this gateway keeps no audit log\n").into_response();
    };
    match crate::audit::proofs::latest(&dir) {
        Ok((note, _)) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            note,
        )
            .into_response(),
        Err(e) => (StatusCode::NOT_FOUND, format!("{e}\n")).into_response(),
    }
}

#[derive(serde::Deserialize)]
struct InclusionQuery {
    seq: u64,
    size: Option<u64>,
}

#[derive(serde::Deserialize)]
struct ConsistencyQuery {
    old: u64,
    size: Option<u64>,
}

/// A proof as JSON, computed off the async threads (it reads the tree file).
async fn proof_response<T: serde::Serialize + Send + 'static>(
    gw: &Gateway,
    make: impl FnOnce(&std::path::Path) -> Result<T, crate::audit::proofs::ProveError> + Send + 'static,
) -> Response {
    let Some(dir) = gw.audit_dir().map(ToOwned::to_owned) else {
        return (StatusCode::NOT_FOUND, "this gateway keeps no audit log\n").into_response();
    };
    match tokio::task::spawn_blocking(move || make(&dir)).await {
        Ok(Ok(proof)) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::to_string(&proof).unwrap_or_default(),
        )
            .into_response(),
        Ok(Err(crate::audit::proofs::ProveError::Range(why))) => {
            (StatusCode::BAD_REQUEST, format!("{why}\n")).into_response()
        }
        Ok(Err(e)) => (StatusCode::NOT_FOUND, format!("{e}\n")).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// `GET /audit/proof/inclusion?seq=N[&size=M]`.
async fn audit_inclusion(
    State(gw): State<Arc<Gateway>>,
    axum::extract::Query(q): axum::extract::Query<InclusionQuery>,
) -> Response {
    proof_response(&gw, move |dir| {
        crate::audit::proofs::inclusion(dir, q.seq, q.size)
    })
    .await
}

/// `GET /audit/proof/consistency?old=N[&size=M]`.
async fn audit_consistency(
    State(gw): State<Arc<Gateway>>,
    axum::extract::Query(q): axum::extract::Query<ConsistencyQuery>,
) -> Response {
    proof_response(&gw, move |dir| {
        crate::audit::proofs::consistency(dir, q.old, q.size)
    })
    .await
}

fn rpc(status: StatusCode, msg: &Message) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        msg.to_bytes(),
    )
        .into_response()
}

/// A refusal, with the status HTTP gives it; the words come from
/// [`answer::Rejection`].
fn reject(rejection: Rejection, id: Value) -> Response {
    let status = match &rejection {
        Rejection::Origin => StatusCode::FORBIDDEN,
        Rejection::Token => StatusCode::UNAUTHORIZED,
        Rejection::UnknownServer { .. } | Rejection::NoSuchSession => StatusCode::NOT_FOUND,
        Rejection::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        Rejection::BodyUnreadable(_) => StatusCode::BAD_REQUEST,
        Rejection::StreamTaken => StatusCode::CONFLICT,
        Rejection::LastEventId(_) => StatusCode::BAD_REQUEST,
        Rejection::NoAnswer | Rejection::BatchNotRelayed(_) | Rejection::NoMessage { .. } => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
        Rejection::LineTooLong { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        Rejection::RateLimited { .. } | Rejection::TooManySessions { .. } => {
            StatusCode::TOO_MANY_REQUESTS
        }
        Rejection::Parse(_)
        | Rejection::SessionVersion(_)
        | Rejection::BatchVersion(_)
        | Rejection::NoSession
        | Rejection::AlreadyInitialized
        | Rejection::InitializeInBatch
        | Rejection::Header(_)
        | Rejection::LegacyUpstream { .. } => StatusCode::BAD_REQUEST,
    };
    let mut r = rpc(status, &rejection.message(id));
    if let Rejection::RateLimited { retry_after, .. } = &rejection {
        let secs = retry_after.as_secs_f64().ceil().max(1.0) as u64;
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"countersign\""),
        );
    }
    r
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
        return Err(reject(Rejection::Origin, Value::Null));
    }
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let Some(identity) = gw.identities().from_authorization(auth) else {
        return Err(reject(Rejection::Token, Value::Null));
    };
    // Per identity, before anything is parsed or sent: one agent in a loop
    // cannot take the gateway (or the upstreams behind it) from the others.
    if let Err(retry_after) = gw.rate_check(&identity) {
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
    let limit = gw.config().limits.max_body_bytes;
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(e) => {
            let e = e.into_inner();
            // Only the limit's own error means "too large"; a malformed
            // chunked body or one shorter than its Content-Length is a bad
            // request, and says so.
            let too_large =
                std::iter::successors(Some(&*e as &dyn std::error::Error), |e| e.source())
                    .any(|e| e.is::<http_body_util::LengthLimitError>());
            if too_large {
                return reject(Rejection::TooLarge { limit }, Value::Null);
            }
            tracing::warn!(%server, "request body could not be read: {e}");
            return reject(Rejection::BodyUnreadable(e.to_string()), Value::Null);
        }
    };
    let parsed = match parse_client_body(&bytes) {
        Ok(p) => p,
        Err(e) => return reject(Rejection::Parse(e), Value::Null),
    };
    if let Some(sid) = header_str(&headers, SESSION_HEADER) {
        let Some(session) = gw.session(&server, sid, &identity) else {
            return reject(Rejection::NoSuchSession, Value::Null);
        };
        session.touch();
        if let Some(v) = header_str(&headers, PROTOCOL_HEADER) {
            if !HANDSHAKE_VERSIONS.contains(&v) && v != "2024-11-05" {
                return reject(Rejection::SessionVersion(v.to_owned()), Value::Null);
            }
        }
        return match parsed {
            Body::Single(msg) => in_session(&gw, &session, msg, accepts_sse(&headers)).await,
            Body::Batch(members) => {
                // Batching exists only in 2025-03-26; later versions removed it.
                let version = session.protocol_version.lock().clone();
                if version.as_deref() != Some("2025-03-26") {
                    return reject(Rejection::BatchVersion(version), Value::Null);
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
        _ => reject(Rejection::NoSession, Value::Null),
    }
}

async fn initialize(
    gw: &Arc<Gateway>,
    server: &str,
    identity: Arc<Identity>,
    headers: &HeaderMap,
    msg: Message,
) -> Response {
    // Checked before connecting: each session may hold an upstream child.
    let limit = gw.config().limits.max_sessions_per_identity;
    if gw.sessions_of(&identity) >= limit {
        return reject(
            Rejection::TooManySessions { limit },
            msg.id.clone().unwrap_or(Value::Null),
        );
    }
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
        Kind::Request if msg.method() == "initialize" => {
            reject(Rejection::AlreadyInitialized, msg.id.unwrap_or(Value::Null))
        }
        Kind::Request => {
            let stream = Resumable(session.clone());
            relay_request(gw, session_request(session), msg, sse, Some(stream)).await
        }
        // The answer to a question the gateway itself asked (approval in the
        // client) stays here; every other response is the upstream's.
        Kind::Response if session.asks.is_some() => {
            let open = session.asks.as_ref().and_then(|a| a.take(msg.id.as_ref()));
            match open {
                Some(open) => {
                    crate::enforce::client::answered(
                        gw.pipeline().book(),
                        &session.identity,
                        open,
                        &msg,
                    )
                    .await;
                }
                None => forward(&session.conn(), &session.server, msg, &Vec::new()).await,
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
            let extra = session_request(session).extra;
            forward(&session.conn(), &session.server, msg, &extra).await;
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
            Err(e) => answers.push(Rejection::Parse(e).message(Value::Null)),
            Ok(msg) if msg.kind() == Kind::Request && msg.method() == "initialize" => {
                answers.push(Rejection::InitializeInBatch.message(msg.id.unwrap_or(Value::Null)))
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
    }
}

/// Aborts the relayed call when the client goes away (2026-07-28: closing the
/// response stream is the cancellation).
struct AbortOnDrop(tokio::task::AbortHandle);

/// A call polled inline by the request's handler. Dropped before it ends,
/// it is cancelled, or, when `outlives` (the handshake era), its rest is
/// spawned so that it still runs to the end.
struct Inline {
    fut: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
    outlives: bool,
}

impl Inline {
    fn new(fut: impl std::future::Future<Output = ()> + Send + 'static, outlives: bool) -> Inline {
        use futures_util::FutureExt;
        // A panic ends the call, not the client's connection: its sender is
        // dropped, and the handler answers that no answer came.
        let fut = std::panic::AssertUnwindSafe(fut).catch_unwind().map(|_| ());
        Inline {
            fut: Some(Box::pin(fut)),
            outlives,
        }
    }

    /// Run the rest in a task of its own.
    fn detach(mut self) -> tokio::task::JoinHandle<()> {
        match self.fut.take() {
            Some(fut) => tokio::spawn(fut),
            None => tokio::spawn(async {}),
        }
    }
}

impl std::future::Future for Inline {
    type Output = ();
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        let Some(fut) = self.fut.as_mut() else {
            return std::task::Poll::Ready(());
        };
        let done = fut.as_mut().poll(cx);
        if done.is_ready() {
            self.fut = None;
        }
        done
    }
}

impl Drop for Inline {
    fn drop(&mut self) {
        if let (Some(fut), true) = (self.fut.take(), self.outlives) {
            tokio::spawn(fut);
        }
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A handshake-era session whose SSE streams are resumable (2025-11-25):
/// events carry ids, are kept in the session, and a GET with
/// `Last-Event-ID` replays the ones after it.
struct Resumable(Arc<Session>);

/// Relay one request. The answer is plain JSON when the upstream sends
/// nothing before it; as soon as a related message (progress, a server
/// request) comes first, the answer becomes an SSE stream. In a session the
/// stream is resumable: a client whose connection breaks gets the rest,
/// the answer included, with a GET and `Last-Event-ID`.
async fn relay_request(
    gw: &Arc<Gateway>,
    rc: RequestCtx,
    msg: Message,
    sse: bool,
    resumable: Option<Resumable>,
) -> Response {
    let (tx, mut rx) = mpsc::channel::<Message>(64);
    let events = sse.then(|| tx.clone());
    let era = rc.era;
    let gw = gw.clone();
    // Run here, in the connection's own task, until the first message: a
    // plain answer then costs no task of its own and no wake-up of another
    // worker thread. In the handshake era a client that disconnects does not
    // cancel the call (it may resume through the session), so dropping this
    // handler moves the rest of the call into a task of its own.
    let mut call = Inline::new(
        async move {
            let final_answer = mcp::answer(&gw, &rc, msg, events).await;
            let _ = tx.send(final_answer).await;
        },
        era != Era::Modern,
    );
    // The upstream's word that it answers as a stream (a marker, never
    // relayed) makes this answer a stream too.
    // The stream opens then, before the first message; and when the
    // upstream already closed its stream early, the client's is cut at the
    // same point.
    let mut cut_early = false;
    let first = loop {
        let m = tokio::select! {
            biased;
            m = rx.recv() => m,
            () = &mut call => rx.recv().await,
        };
        match m {
            Some(m) if is_streamed_marker(&m) => {
                cut_early |= m.method() == crate::wire::sse::RESUMED;
                if sse {
                    break None;
                }
            }
            Some(m) if m.kind() == Kind::Response => return rpc(StatusCode::OK, &m),
            Some(m) => break Some(m),
            None => return reject(Rejection::NoAnswer, Value::Null),
        }
    };
    // A stream: the rest of the call runs in its own task. In 2026-07-28 a
    // client that goes away cancels it.
    let task = call.detach();
    let abort = (era == Era::Modern).then(|| AbortOnDrop(task.abort_handle()));
    if let Some(Resumable(session)) = resumable {
        let (number, priming) = lock_replay(&session).open();
        if cut_early {
            lock_replay(&session).cut(number);
        }
        // The stream outlives the connection: what the call sends after the
        // client went away is kept for its resumption.
        let pump = session.clone();
        tokio::spawn(async move {
            let mut next = first;
            loop {
                let msg = match next.take() {
                    Some(m) => m,
                    None => match rx.recv().await {
                        Some(m) => m,
                        None => break,
                    },
                };
                if is_streamed_marker(&msg) {
                    if msg.method() == crate::wire::sse::RESUMED {
                        // The upstream closed its stream early: the
                        // client's ends at the same point, and it resumes
                        // from the gateway (the rest is kept for it).
                        lock_replay(&pump).cut(number);
                        pump.sse_sent.notify_waiters();
                    }
                    continue;
                }
                let last = msg.kind() == Kind::Response;
                lock_replay(&pump).push(number, &msg.to_bytes());
                pump.sse_sent.notify_waiters();
                if last {
                    break;
                }
            }
            lock_replay(&pump).finish(number);
            pump.sse_sent.notify_waiters();
        });
        return sse_response(HttpBody::from_stream(
            stream::once(async move { Ok::<Bytes, Infallible>(priming) })
                .chain(follow(session, number, 0, true)),
        ));
    }
    let frames = stream::unfold(
        (first, rx, abort, false),
        |(next, mut rx, abort, done)| async move {
            if done {
                return None;
            }
            let mut msg = match next {
                Some(m) => m,
                None => rx.recv().await?,
            };
            while is_streamed_marker(&msg) {
                msg = rx.recv().await?;
            }
            let last = msg.kind() == Kind::Response;
            Some((
                Ok::<Bytes, Infallible>(sse::encode(&msg.to_bytes())),
                (None, rx, abort, last),
            ))
        },
    );
    sse_response(HttpBody::from_stream(frames))
}

/// An upstream transport's marker (it answers as a stream; it resumes a
/// stream closed early): read by the front, never relayed.
fn is_streamed_marker(m: &Message) -> bool {
    m.kind() == Kind::Notification
        && matches!(
            m.method(),
            crate::wire::sse::STREAMED | crate::wire::sse::RESUMED
        )
}

fn lock_replay(session: &Session) -> parking_lot::MutexGuard<'_, sse::Replay> {
    session.sse.lock()
}

/// The kept events of `stream` after `after`, then the ones still to come,
/// until the stream ends.
fn follow(
    session: Arc<Session>,
    stream: u64,
    after: u64,
    first_connection: bool,
) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> {
    stream::unfold(
        (session, after, std::collections::VecDeque::<Bytes>::new()),
        move |(session, mut cursor, mut ready)| async move {
            loop {
                if let Some(frame) = ready.pop_front() {
                    return Some((Ok(frame), (session, cursor, ready)));
                }
                // Registered before looking, so an event kept between the
                // look and the wait is not missed.
                let notified = session.sse_sent.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let got = lock_replay(&session).since(stream, cursor)?;
                if got.gap {
                    tracing::warn!(session = %session.id, stream, after = cursor, "SSE resumption: some events were no longer kept");
                }
                // The first connection stops where the upstream cut its
                // own stream; a resumption (GET) goes on to the end.
                let cut = got.cut.filter(|_| first_connection);
                let events = got.events.into_iter();
                let room = cut.map_or(usize::MAX, |c| c.saturating_sub(cursor) as usize);
                let taken: Vec<Bytes> = events.take(room).collect();
                cursor = cursor.saturating_add(taken.len() as u64).min(got.last);
                if cut.is_none() {
                    cursor = got.last;
                }
                ready.extend(taken);
                if ready.is_empty() {
                    if got.done || cut.is_some_and(|c| cursor >= c) {
                        return None;
                    }
                    notified.await;
                }
            }
        },
    )
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
    let id = msg.id.clone().unwrap_or(Value::Null);
    let checked = match check_modern(headers, &msg) {
        Ok(c) => c,
        Err(problem) => return reject(Rejection::Header(problem), id),
    };
    let conn = match gw.modern_upstream(server).await {
        Ok(ModernUpstream::Speaks(conn)) => Some(conn),
        Ok(ModernUpstream::Legacy) if bridges(gw, server) => {
            return bridged(gw, server, identity, headers, msg, &checked.meta).await;
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
            let rc = RequestCtx::stateless(server, identity, target, extra, false);
            relay_request(gw, rc, msg, accepts_sse(headers), None).await
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
) -> Response {
    let id = msg.id.clone().unwrap_or(Value::Null);
    let bridge = match gw.bridged(server, &identity, meta, id.clone()).await {
        Ok(b) => b,
        Err(refusal) => return rpc(StatusCode::OK, &refusal),
    };
    match msg.kind() {
        Kind::Request if msg.method() == "server/discover" => rpc(
            StatusCode::OK,
            &crate::enforce::answer::bridged_discover(id, &bridge.init),
        ),
        Kind::Request => {
            let target = Target::Session(bridge.session);
            let rc = RequestCtx::stateless(server, identity, target, Vec::new(), true);
            relay_request(gw, rc, msg, accepts_sse(headers), None).await
        }
        _ => {
            let conn = bridge.session.conn();
            forward(&conn, server, msg, &Vec::new()).await;
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
