//! A Streamable HTTP upstream. Each message is a POST; a request's answer
//! comes back as JSON or as an SSE stream carrying related messages first.
//! In the handshake era the upstream's `Mcp-Session-Id` (never the client's,
//! which the gateway mints) is kept here, and a standalone GET stream is
//! opened after `notifications/initialized`.

use super::error_chain;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::task::JoinHandle;

use super::{ExtraHeaders, UpstreamError};
use crate::upstream::mux::{Mux, Origin};
use crate::wire::jsonrpc::Message;
use crate::wire::sse;

/// Idle HTTP/1.1 connections to one upstream origin. A request takes an idle
/// connection or opens a new one, and gives it back once its answer has been
/// read in full.
///
/// This is hyper's connection API rather than a general-purpose client: the
/// gateway only ever talks plain HTTP/1.1 to a handful of configured origins,
/// and the general client's per-request URL parsing, proxy and redirect
/// handling showed up in the relay's latency profile.
///
/// A connection has no task of its own: the request that holds it drives it
/// (see [`drive`]), so a call's upstream I/O runs in the call's own task and
/// wakes no other worker thread. Measured with the external harness, a task
/// per connection cost about 10 µs per relayed call.
struct Pool {
    authority: String,
    /// Idle connections, the most recently used last. A call takes one its
    /// own thread opened first (see [`Conn::home`]), then any other: a
    /// connection of another thread costs a wake-up across threads, a new
    /// one a TCP handshake.
    idle: Mutex<Vec<Conn>>,
    /// For an `https://` upstream: its TLS client and the name its
    /// certificate must be valid for (also sent as SNI).
    tls: Option<Tls>,
}

struct Tls {
    connector: tokio_rustls::TlsConnector,
    name: rustls::pki_types::ServerName<'static>,
    server: String,
}

/// Most idle connections kept per origin.
const MAX_IDLE: usize = 32;

/// Any byte stream a connection runs over (plain TCP or TLS).
pub(crate) trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Io for T {}

/// hyper's side of a connection: reads and writes it, and must be polled
/// for a request on it to make progress.
type Driver = hyper::client::conn::http1::Connection<TokioIo<Box<dyn Io>>, Full<Bytes>>;

/// One HTTP/1.1 connection: the sender for requests, and the driver, which
/// whoever holds the connection polls (`None` once the connection ended).
struct Conn {
    sender: SendRequest<Full<Bytes>>,
    driver: Option<Driver>,
    /// The thread that opened it: its socket is registered with that
    /// thread's runtime, which is woken when the socket is ready (the
    /// gateway serves each client connection on one thread; see
    /// `cli::serve`).
    home: std::thread::ThreadId,
}

/// Run `fut` while driving the connection. The driver is polled first, so a
/// connection the server closed while it sat idle is seen as closed before
/// a request goes out on it. When the connection ends, its driver is dropped,
/// which fails whatever request was still waiting on it.
async fn drive<F: std::future::Future>(driver: &mut Option<Driver>, fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        if let Some(d) = driver.as_mut() {
            if let std::task::Poll::Ready(r) = d.poll_without_shutdown(cx) {
                if let Err(e) = r {
                    tracing::debug!("upstream connection ended: {e}");
                }
                *driver = None;
            }
        }
        fut.as_mut().poll(cx)
    })
    .await
}

impl Pool {
    async fn checkout(&self) -> std::io::Result<Conn> {
        loop {
            let here = std::thread::current().id();
            let taken = {
                let mut idle = self.idle.lock();
                match idle.iter().rposition(|c| c.home == here) {
                    Some(i) => Some(idle.remove(i)),
                    None => idle.pop(),
                }
            };
            let Some(mut conn) = taken else {
                break;
            };
            // Driven until ready: an idle connection is ready once its driver
            // has seen the end of the previous answer, and one the server
            // closed shows it here.
            if conn.driver.is_some()
                && !conn.sender.is_closed()
                && drive(&mut conn.driver, conn.sender.ready()).await.is_ok()
                && conn.driver.is_some()
            {
                return Ok(conn);
            }
        }
        // A literal address skips the resolver (which runs on the blocking pool).
        let stream = match self.authority.parse::<std::net::SocketAddr>() {
            Ok(addr) => tokio::net::TcpStream::connect(addr).await?,
            Err(_) => tokio::net::TcpStream::connect(&self.authority).await?,
        };
        stream.set_nodelay(true)?;
        match &self.tls {
            None => handshake(stream).await,
            Some(tls) => {
                let stream = tls
                    .connector
                    .connect(tls.name.clone(), stream)
                    .await
                    .map_err(|e| {
                        std::io::Error::other(super::tls::handshake_error(&tls.server, &e))
                    })?;
                handshake(stream).await
            }
        }
    }

    fn checkin(&self, conn: Conn) {
        if conn.driver.is_none() || conn.sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock();
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
    }
}

/// HTTP/1.1 over `io`.
async fn handshake<T: Io + 'static>(io: T) -> std::io::Result<Conn> {
    let io: Box<dyn Io> = Box::new(io);
    let (sender, driver) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(std::io::Error::other)?;
    Ok(Conn {
        sender,
        driver: Some(driver),
        home: std::thread::current().id(),
    })
}

/// Connection pools of all HTTP upstreams, shared by their sessions.
#[derive(Clone, Default)]
pub struct HttpClient {
    pools: Arc<Mutex<HashMap<String, Arc<Pool>>>>,
}

impl HttpClient {
    /// An empty set of pools.
    pub fn new() -> HttpClient {
        HttpClient::default()
    }

    /// The pool of a plain `http://` origin (shared by every server there).
    fn pool(&self, authority: &str) -> Arc<Pool> {
        self.pools
            .lock()
            .entry(authority.to_owned())
            .or_insert_with(|| {
                Arc::new(Pool {
                    authority: authority.to_owned(),
                    idle: Mutex::new(Vec::new()),
                    tls: None,
                })
            })
            .clone()
    }

    /// The pool of `server`'s `https://` upstream: one per server, since
    /// each has its own roots and client certificate. Its TLS configuration
    /// is built when the pool is (the first connection).
    fn tls_pool(
        &self,
        server: &str,
        authority: &str,
        host: &str,
        tls: Option<&crate::core::config::UpstreamTls>,
    ) -> Result<Arc<Pool>, String> {
        let key = format!("https {server} {authority}");
        if let Some(p) = self.pools.lock().get(&key) {
            return Ok(p.clone());
        }
        // Its words: this becomes a call's `upstream_unavailable` message;
        // `serve` printed the whole chain at start (`tls::check_all`).
        let config = super::tls::client_config(server, tls).map_err(|e| e.to_string())?;
        let name = rustls::pki_types::ServerName::try_from(host.to_owned())
            .map_err(|e| format!("host `{host}` is not a valid TLS server name: {e}"))?;
        let pool = Arc::new(Pool {
            authority: authority.to_owned(),
            idle: Mutex::new(Vec::new()),
            tls: Some(Tls {
                connector: tokio_rustls::TlsConnector::from(config),
                name,
                server: server.to_owned(),
            }),
        });
        Ok(self.pools.lock().entry(key).or_insert(pool).clone())
    }
}

pub(super) struct Http {
    server: String,
    /// Origin-form target (`/mcp`) and `Host` value, parsed once from the URL.
    path: Uri,
    host: HeaderValue,
    /// The host and port, as a trace names them (`server.address`).
    peer: (String, u16),
    pool: Arc<Pool>,
    headers: HeaderMap,
    max_event: usize,
    session: Mutex<Option<HeaderValue>>,
    protocol: Mutex<Option<HeaderValue>>,
    standalone: Mutex<Option<JoinHandle<()>>>,
    /// Delegation: the caller's exchanged token, sent as
    /// `Authorization: Bearer` on every request of this connection (which
    /// has no static headers: see [`Http::delegated`]).
    bearer: Mutex<Option<HeaderValue>>,
}

// Parsed once, at compile time: a name given as text is parsed again on
// every request.
const SESSION: HeaderName = HeaderName::from_static("mcp-session-id");
const PROTOCOL: HeaderName = HeaderName::from_static("mcp-protocol-version");

/// What came back for one request, with the connection, which drives the
/// body and goes back to the pool once the body has been read.
/// How many times one answer is resumed after its stream closed early.
const MAX_RESUMES: usize = 3;
/// The pause before a resumption (servers that close a stream mid-call ask
/// for a short `retry`).
const RESUME_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

struct Answer {
    status: http::StatusCode,
    headers: HeaderMap,
    body: Incoming,
    conn: Conn,
}

impl Http {
    pub(super) fn new(
        server: &str,
        url: &str,
        static_headers: &BTreeMap<String, crate::core::config::Credential>,
        tls: Option<&crate::core::config::UpstreamTls>,
        client: &super::HttpClient,
        max_event: usize,
    ) -> Result<Http, UpstreamError> {
        let bad = |reason: String| UpstreamError::Connect {
            server: server.into(),
            reason,
        };
        let uri: Uri = url
            .parse()
            .map_err(|e| bad(format!("url `{url}` is not valid: {e}")))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => {
                return Err(bad(format!(
                    "url `{url}`: only https:// and http:// upstreams are supported"
                )))
            }
        };
        let parts = uri
            .authority()
            .ok_or_else(|| bad(format!("url `{url}` has no host")))?;
        let authority = match parts.port_u16() {
            Some(_) => parts.as_str().to_owned(),
            None => format!("{}:{}", parts.host(), if https { 443 } else { 80 }),
        };
        // `[::1]` in a url is the address `::1` for TLS.
        let tls_host = parts.host().trim_start_matches('[').trim_end_matches(']');
        let path: Uri = uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .parse()
            .map_err(|e| bad(format!("url `{url}` has an invalid path: {e}")))?;
        let host = HeaderValue::try_from(uri.authority().map_or("", |a| a.as_str()))
            .map_err(|e| bad(format!("url `{url}`: {e}")))?;
        let mut headers = HeaderMap::new();
        for (k, v) in static_headers {
            let what = format!("header `{k}` of server `{server}`");
            let value = super::credentials::resolve(v, &what).map_err(bad)?;
            // The value is not in the message: it is usually a credential.
            let (Ok(name), Ok(mut value)) = (
                HeaderName::try_from(k.as_str()),
                HeaderValue::try_from(value),
            ) else {
                return Err(bad(format!(
                    "header `{k}` in [servers.{server}.headers] is not a valid HTTP header name and value"
                )));
            };
            // Kept out of hyper's debug output.
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        Ok(Http {
            server: server.into(),
            path,
            host,
            peer: (
                tls_host.to_owned(),
                parts.port_u16().unwrap_or(if https { 443 } else { 80 }),
            ),
            pool: if https {
                client
                    .tls_pool(server, &authority, tls_host, tls)
                    .map_err(bad)?
            } else {
                client.pool(&authority)
            },
            headers,
            max_event,
            session: Mutex::new(None),
            protocol: Mutex::new(None),
            standalone: Mutex::new(None),
            bearer: Mutex::new(None),
        })
    }

    /// Send `token` as `Authorization: Bearer` from now on.
    pub(super) fn set_bearer(&self, token: &str) -> Result<(), UpstreamError> {
        let mut value = HeaderValue::try_from(format!("Bearer {token}")).map_err(|_| {
            UpstreamError::Delegation {
                server: self.server.clone(),
                reason: "invalid_response".into(),
                detail: "the exchanged token is not a valid HTTP header value".into(),
            }
        })?;
        // Kept out of hyper's debug output.
        value.set_sensitive(true);
        *self.bearer.lock() = Some(value);
        Ok(())
    }

    /// The upstream's host and port.
    pub(super) fn peer(&self) -> (&str, u16) {
        (&self.peer.0, self.peer.1)
    }

    fn request(
        &self,
        method: Method,
        body: Bytes,
        extra: &[(HeaderName, HeaderValue)],
    ) -> Request<Full<Bytes>> {
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = method;
        *req.uri_mut() = self.path.clone();
        let h = req.headers_mut();
        // Room for every header set below at once (an empty map grows
        // twice on the way).
        h.reserve(5 + self.headers.len() + extra.len());
        h.insert(http::header::HOST, self.host.clone());
        for (k, v) in &self.headers {
            h.insert(k, v.clone());
        }
        if let Some(b) = self.bearer.lock().clone() {
            h.insert(http::header::AUTHORIZATION, b);
        }
        if let Some(s) = self.session.lock().clone() {
            h.insert(SESSION, s);
        }
        if let Some(p) = self.protocol.lock().clone() {
            h.insert(PROTOCOL, p);
        }
        for (k, v) in extra {
            h.insert(k, v.clone());
        }
        req
    }

    /// Send one request on a pooled connection.
    async fn send(&self, req: Request<Full<Bytes>>) -> Result<Answer, UpstreamError> {
        let mut conn = self
            .pool
            .checkout()
            .await
            .map_err(|e| UpstreamError::Connect {
                server: self.server.clone(),
                reason: error_chain(&e),
            })?;
        let resp = match drive(&mut conn.driver, conn.sender.send_request(req)).await {
            Ok(r) => r,
            // The request may have been written before the failure.
            Err(e) => return Err(self.lost(error_chain(&e))),
        };
        let (parts, body) = resp.into_parts();
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body,
            conn,
        })
    }

    /// Remember what `initialize` negotiated.
    pub(super) fn initialized(&self, resp: &Message) {
        let version = resp
            .result
            .as_ref()
            .and_then(|r| serde_json::from_str::<serde_json::Value>(r.get()).ok())
            .and_then(|v| v.get("protocolVersion")?.as_str().map(str::to_owned));
        if let Some(v) = version.and_then(|v| HeaderValue::try_from(v).ok()) {
            *self.protocol.lock() = Some(v);
        }
    }

    /// POST one message. For a request (`id` given), related messages and the
    /// response are delivered to the mux as they arrive.
    pub(super) async fn post(
        &self,
        mux: &Mux,
        msg: &Message,
        id: Option<u64>,
        extra: &ExtraHeaders,
    ) -> Result<(), UpstreamError> {
        let extra = crate::wire::era::headers_for(msg, extra);
        let mut req = self.request(Method::POST, Bytes::from(msg.to_bytes()), &extra);
        let h = req.headers_mut();
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(
            http::header::ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        let Answer {
            status,
            headers,
            mut body,
            mut conn,
        } = self.send(req).await?;
        if msg.method() == "initialize" {
            if let Some(s) = headers.get(&SESSION) {
                *self.session.lock() = Some(s.clone());
            }
        }
        if status == http::StatusCode::NOT_FOUND && self.session.lock().is_some() {
            return Err(UpstreamError::SessionExpired {
                server: self.server.clone(),
            });
        }
        if status == http::StatusCode::UNAUTHORIZED || status == http::StatusCode::FORBIDDEN {
            return Err(UpstreamError::Refused {
                server: self.server.clone(),
                status: status.as_u16(),
            });
        }
        let is_sse = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let Some(id) = id else {
            // A notification or a response: the answer is a status.
            if !is_sse {
                let _ = drive(&mut conn.driver, self.read_all(&mut body)).await;
                self.pool.checkin(conn);
            }
            return if status.is_success() {
                Ok(())
            } else {
                Err(UpstreamError::Refused {
                    server: self.server.clone(),
                    status: status.as_u16(),
                })
            };
        };
        let origin = Origin::Stream(id);
        if is_sse {
            // The client that asks may get a stream too (its own priming
            // event and ids come from the gateway).
            mux.streaming(id);
            let mut last = self.read_stream(mux, &mut conn, &mut body, id).await?;
            // A server may close the stream before it answers (SEP-1699):
            // the answer is resumed with a GET naming the last event id, on
            // this session, a bounded number of times.
            let mut resumed = 0;
            while mux.client_id(id).is_some() {
                let (Some(event), true) = (last.clone(), self.session.lock().is_some()) else {
                    break;
                };
                if resumed == MAX_RESUMES {
                    break;
                }
                resumed += 1;
                if resumed == 1 {
                    mux.resuming(id);
                }
                tokio::time::sleep(RESUME_PAUSE).await;
                let mut req = self.request(Method::GET, Bytes::new(), &[]);
                let h = req.headers_mut();
                h.insert(
                    http::header::ACCEPT,
                    HeaderValue::from_static("text/event-stream"),
                );
                if let Ok(v) = HeaderValue::try_from(event.as_str()) {
                    h.insert("last-event-id", v);
                }
                let Answer {
                    status,
                    mut body,
                    conn: mut again,
                    ..
                } = self.send(req).await.map_err(|e| {
                    self.lost(format!(
                        "the response stream closed before its answer, and resuming it failed: {e}"
                    ))
                })?;
                if !status.is_success() {
                    return Err(self.lost(format!(
                        "the response stream closed before its answer, and resuming it with Last-Event-ID got HTTP {status}"
                    )));
                }
                tracing::debug!(server = %self.server, event = %event, "resuming the upstream's response stream");
                if let Some(next) = self.read_stream(mux, &mut again, &mut body, id).await? {
                    last = Some(next);
                }
            }
            if mux.client_id(id).is_none() {
                return Ok(());
            }
        } else {
            let bytes = drive(&mut conn.driver, self.read_all(&mut body)).await?;
            self.pool.checkin(conn);
            // One request, one answer: upstreams receive no batches from the
            // gateway, so they owe none back.
            match Message::parse_from_upstream(&bytes) {
                Ok(m) => mux.deliver(m, origin),
                Err(_) if !status.is_success() => {
                    // A non-2xx without a JSON-RPC answer. A 4xx means the server
                    // rejected the request without processing it.
                    return if status.is_client_error() {
                        Err(UpstreamError::Refused {
                            server: self.server.clone(),
                            status: status.as_u16(),
                        })
                    } else {
                        Err(self.lost(format!("HTTP {status} without a JSON-RPC answer")))
                    };
                }
                Err(e) => return Err(self.lost(format!("the answer is not JSON-RPC: {e}"))),
            }
        }
        if mux.client_id(id).is_some() {
            return Err(self.lost("the response ended without an answer".into()));
        }
        Ok(())
    }

    /// Deliver the events of one response stream of request `id` until it
    /// ends or carries the answer; the id of the last event that had one.
    async fn read_stream(
        &self,
        mux: &Mux,
        conn: &mut Conn,
        body: &mut Incoming,
        id: u64,
    ) -> Result<Option<String>, UpstreamError> {
        let origin = Origin::Stream(id);
        let mut decoder = sse::Decoder::new(self.max_event);
        while let Some(frame) = drive(&mut conn.driver, body.frame()).await {
            let frame = frame.map_err(|e| {
                self.lost(format!("the response stream broke: {}", error_chain(&e)))
            })?;
            let Ok(chunk) = frame.into_data() else {
                continue;
            };
            let events = decoder.feed(&chunk).map_err(|e| self.lost(e.to_string()))?;
            for ev in events {
                if ev.data.is_empty() {
                    continue;
                }
                match Message::parse_from_upstream(ev.data.as_bytes()) {
                    Ok(m) => mux.deliver(m, origin),
                    Err(e) => {
                        tracing::warn!(server = %self.server, "upstream SSE event is not JSON-RPC ({e}); ignored")
                    }
                }
            }
            if mux.client_id(id).is_none() {
                // Answered: the rest of the stream is not ours to wait for
                // (and the connection is not reusable mid-stream).
                break;
            }
        }
        Ok(decoder.last_event_id().map(str::to_owned))
    }

    /// Read a whole (non-streaming) body, refusing more than `max_event` bytes.
    async fn read_all(&self, body: &mut Incoming) -> Result<Bytes, UpstreamError> {
        let mut out = bytes::BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                self.lost(format!("reading the response failed: {}", error_chain(&e)))
            })?;
            if let Ok(chunk) = frame.into_data() {
                if out.len() + chunk.len() > self.max_event {
                    return Err(self.lost(format!("response larger than {} bytes", self.max_event)));
                }
                out.extend_from_slice(&chunk);
            }
        }
        Ok(out.freeze())
    }

    fn lost(&self, reason: String) -> UpstreamError {
        UpstreamError::Lost {
            server: self.server.clone(),
            reason,
        }
    }

    /// Open the standalone GET stream for server-initiated messages.
    pub(super) fn open_standalone_stream(self: &Http, mux: &Arc<Mux>) {
        let mut req = self.request(Method::GET, Bytes::new(), &[]);
        req.headers_mut().insert(
            http::header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        let mux = mux.clone();
        let server = self.server.clone();
        let max_event = self.max_event;
        let pool = self.pool.clone();
        let task = tokio::spawn(async move {
            // A dedicated connection: this stream lives as long as the session.
            let Ok(mut conn) = pool.checkout().await else {
                return;
            };
            let resp = match drive(&mut conn.driver, conn.sender.send_request(req)).await {
                Ok(r) if r.status().is_success() => r,
                Ok(r) => {
                    tracing::debug!(%server, status = %r.status(), "upstream offers no standalone stream");
                    return;
                }
                Err(e) => {
                    tracing::debug!(%server, "standalone stream not opened: {e}");
                    return;
                }
            };
            let mut body = resp.into_body();
            let mut decoder = sse::Decoder::new(max_event);
            while let Some(Ok(frame)) = drive(&mut conn.driver, body.frame()).await {
                let Ok(chunk) = frame.into_data() else {
                    continue;
                };
                let Ok(events) = decoder.feed(&chunk) else {
                    break;
                };
                for ev in events {
                    if let Ok(m) = Message::parse_from_upstream(ev.data.as_bytes()) {
                        mux.deliver(m, Origin::Standalone);
                    }
                }
            }
        });
        if let Some(old) = self.standalone.lock().replace(task) {
            old.abort();
        }
    }

    pub(super) async fn shutdown(&self) {
        if let Some(task) = self.standalone.lock().take() {
            task.abort();
        }
        if self.session.lock().is_some() {
            let req = self.request(Method::DELETE, Bytes::new(), &[]);
            if let Ok(Answer {
                mut body, mut conn, ..
            }) = self.send(req).await
            {
                let _ = drive(&mut conn.driver, self.read_all(&mut body)).await;
                self.pool.checkin(conn);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// A current-thread runtime on a thread of its own, as a serving thread
    /// runs; it runs until the sender is dropped.
    fn serving_thread() -> (tokio::runtime::Handle, tokio::sync::oneshot::Sender<()>) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let handle = rt.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            rt.block_on(async {
                let _ = stopped.await;
            })
        });
        (handle, stop)
    }

    /// Run `step` on the runtime `rt`, from the test's own runtime.
    fn on<F, Fut>(
        main: &tokio::runtime::Runtime,
        rt: &tokio::runtime::Handle,
        pool: &Arc<Pool>,
        step: F,
    ) -> Fut::Output
    where
        F: FnOnce(Arc<Pool>) -> Fut,
        Fut: std::future::Future + Send + 'static,
        Fut::Output: Send + 'static,
    {
        main.block_on(rt.spawn(step(pool.clone()))).unwrap()
    }

    /// A call takes an idle connection its own thread opened before one
    /// another thread opened, and takes another thread's rather than open a
    /// new one.
    #[test]
    fn a_thread_takes_its_own_idle_connection_first_then_any() {
        // Accepts and holds connections (the client's handshake sends nothing).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let authority = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for s in listener.incoming() {
                held.push(s);
            }
        });
        let pool = Arc::new(Pool {
            authority,
            idle: Mutex::new(Vec::new()),
            tls: None,
        });
        let (a, _stop_a) = serving_thread();
        let (b, _stop_b) = serving_thread();
        let main = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();

        // A opens one and leaves it idle.
        let (home, thread_a) = on(&main, &a, &pool, |pool| async move {
            let conn = pool.checkout().await.unwrap();
            let home = conn.home;
            pool.checkin(conn);
            (home, std::thread::current().id())
        });
        assert_eq!(home, thread_a, "opened on A");

        // B has none of its own: it takes A's, then opens one of its own
        // while it holds A's. Both go back idle, B's last.
        let (first, left_idle, second, thread_b) = on(&main, &b, &pool, |pool| async move {
            let first = pool.checkout().await.unwrap();
            let left_idle = pool.idle.lock().len();
            let second = pool.checkout().await.unwrap();
            let homes = (
                first.home,
                left_idle,
                second.home,
                std::thread::current().id(),
            );
            pool.checkin(first);
            pool.checkin(second);
            homes
        });
        assert_eq!(
            first, thread_a,
            "B reused A's idle connection instead of opening one"
        );
        assert_eq!(left_idle, 0, "B took the one idle connection");
        assert_eq!(second, thread_b, "the one B opened is B's");
        assert_eq!(pool.idle.lock().len(), 2);

        // A takes its own, though B's went back last.
        let home = on(&main, &a, &pool, |pool| async move {
            let conn = pool.checkout().await.unwrap();
            let home = conn.home;
            pool.checkin(conn);
            home
        });
        assert_eq!(home, thread_a, "A took B's connection before its own");
    }
}
