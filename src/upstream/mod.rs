//! Upstream MCP servers: a stdio child or a Streamable HTTP endpoint.
//!
//! An [`UpstreamConn`] is one connection (one child, or one HTTP session) with
//! its [`Mux`]. Transports only move bytes; ids and routing live in the mux,
//! so both transports behave the same towards clients.

pub(crate) mod credentials;
pub mod delegation;
pub(crate) mod mux;
pub(crate) mod notify;
pub(crate) mod provider;
mod stdio;
mod streamable_http;
pub(crate) mod tls;
pub(crate) mod witness;

/// An error with its causes, `a: b: c` (reqwest's and hyper's own messages
/// stop at "error sending request" and keep the reason in their sources).
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::Instrument;

use crate::core::config::ServerConfig;
use crate::enforce::permit::{Permit, Sent};
use crate::upstream::mux::Mux;
use crate::wire::jsonrpc::{raw, Kind, Message};
use crate::wire::sse::UpstreamEvent;
pub use crate::wire::toolcall::Unrelayable;

pub use streamable_http::HttpClient;

pub use crate::enforce::upstream::UpstreamError;

pub use crate::wire::era::ExtraHeaders;

enum Transport {
    Stdio(Arc<stdio::Stdio>),
    Http(Box<streamable_http::Http>),
}

/// A client message relayed as it is: anything that cannot be taken for a
/// `tools/call`, which reaches an upstream only as a [`Permit`].
///
/// ```
/// use countersign::upstream::Passthrough;
/// use countersign::wire::jsonrpc::{raw, Message};
/// let list = Message::request(1.into(), "tools/list", None);
/// assert!(Passthrough::new(list).is_ok());
/// let call = Message::request(2.into(), "tools/call", Some(raw(&"{}".into())));
/// assert!(Passthrough::new(call).is_err(), "a tools/call needs the pipeline's permit");
/// // Without an id it is a notification, and a lenient server runs it all the same.
/// let note = Message::notification("tools/call", Some(raw(&"{}".into())));
/// assert!(Passthrough::new(note).is_err());
/// // Spelled so that a forgiving dispatcher could take it for one.
/// let alike = Message::request(3.into(), "Tools/Call ", None);
/// assert!(Passthrough::new(alike).is_err());
/// ```
///
/// The general [`UpstreamConn::call`] takes a `Passthrough`, so a plain
/// message does not compile there:
///
/// ```no_run
/// use countersign::upstream::{Passthrough, UpstreamConn};
/// use countersign::wire::jsonrpc::Message;
/// async fn relay(conn: &UpstreamConn, msg: Message) {
///     if let Ok(msg) = Passthrough::new(msg) {
///         let _ = conn.call(msg, None, std::time::Duration::from_secs(1), &Vec::new()).await;
///     }
/// }
/// ```
///
/// ```compile_fail
/// use countersign::upstream::UpstreamConn;
/// use countersign::wire::jsonrpc::Message;
/// async fn relay(conn: &UpstreamConn, msg: Message) {
///     let _ = conn.call(msg, None, std::time::Duration::from_secs(1), &Vec::new()).await;
/// }
/// ```
///
/// ```compile_fail
/// use countersign::upstream::Passthrough;
/// use countersign::wire::jsonrpc::Message;
/// fn wrap(msg: Message) -> Passthrough {
///     // The field is private: only `Passthrough::new` makes one.
///     Passthrough(msg)
/// }
/// ```
#[derive(Debug)]
pub struct Passthrough(Message);

impl Passthrough {
    /// `msg`, unless it could be taken for a `tools/call` in any form, or
    /// is a notification outside `notifications/` (then `msg` back, and
    /// why).
    #[expect(
        clippy::result_large_err,
        reason = "the refused message itself comes back"
    )]
    pub fn new(msg: Message) -> Result<Passthrough, Message> {
        match Passthrough::refusal(&msg) {
            Some(_) => Err(msg),
            None => Ok(Passthrough(msg)),
        }
    }

    /// Why `msg` may not pass through, if it may not
    /// ([`crate::wire::toolcall::unrelayable`]).
    pub fn refusal(msg: &Message) -> Option<Unrelayable> {
        // INVARIANT: tool calls go through the enforcement pipeline; this
        // is the one door for everything else.
        crate::wire::toolcall::unrelayable(msg)
    }

    /// [`Passthrough::new`], a refusal worded as an upstream error of
    /// `server` (nothing was sent).
    pub fn checked(server: &str, msg: Message) -> Result<Passthrough, UpstreamError> {
        match Passthrough::refusal(&msg) {
            None => Ok(Passthrough(msg)),
            Some(why) => Err(UpstreamError::Closed {
                server: server.to_owned(),
                reason: format!("refused, nothing sent: {why}"),
            }),
        }
    }
}

/// One live upstream connection.
pub struct UpstreamConn {
    /// Id mapping and routing (shared with the transport's reader tasks).
    pub mux: Arc<Mux>,
    transport: Transport,
    server: String,
    /// A delegated connection: one caller's, with that caller's exchanged
    /// token and none of the server's static headers.
    delegated: bool,
}

impl UpstreamConn {
    /// Connect to `server`: spawn its child or prepare its HTTP endpoint.
    /// Server messages that belong to no request go to `unsolicited`.
    pub async fn connect(
        server: &str,
        cfg: &ServerConfig,
        http: &HttpClient,
        max_line: usize,
        unsolicited: mpsc::Sender<Message>,
        on_list_changed: crate::upstream::mux::ListChanged,
    ) -> Result<Arc<UpstreamConn>, UpstreamError> {
        Self::open(
            server,
            cfg,
            http,
            max_line,
            unsolicited,
            on_list_changed,
            false,
        )
    }

    /// A connection for one caller of an HTTP server with delegation: none
    /// of the server's static `headers` (its service credential) is ever
    /// sent on it, only the caller's exchanged token
    /// ([`UpstreamConn::set_bearer`]).
    pub async fn connect_delegated(
        server: &str,
        cfg: &ServerConfig,
        http: &HttpClient,
        max_line: usize,
        unsolicited: mpsc::Sender<Message>,
        on_list_changed: crate::upstream::mux::ListChanged,
    ) -> Result<Arc<UpstreamConn>, UpstreamError> {
        if cfg.url.is_none() {
            return Err(UpstreamError::Closed {
                server: server.into(),
                reason: "delegation needs an HTTP server".into(),
            });
        }
        Self::open(
            server,
            cfg,
            http,
            max_line,
            unsolicited,
            on_list_changed,
            true,
        )
    }

    /// Send the caller's exchanged `token` on every request from now on (a
    /// delegated connection only).
    pub fn set_bearer(&self, token: &str) -> Result<(), UpstreamError> {
        match &self.transport {
            Transport::Http(h) if self.delegated => h.set_bearer(token),
            _ => Err(UpstreamError::Closed {
                server: self.server.clone(),
                reason: "internal: a caller's token on a shared connection".into(),
            }),
        }
    }

    fn open(
        server: &str,
        cfg: &ServerConfig,
        http: &HttpClient,
        max_line: usize,
        unsolicited: mpsc::Sender<Message>,
        on_list_changed: crate::upstream::mux::ListChanged,
        delegated: bool,
    ) -> Result<Arc<UpstreamConn>, UpstreamError> {
        let mux = Arc::new(Mux::new(unsolicited).on_list_changed(on_list_changed));
        // INVARIANT: a delegated connection carries no static header: the
        // service credential never goes out beside (or instead of) the
        // caller's token.
        let no_headers = std::collections::BTreeMap::new();
        let headers = if delegated { &no_headers } else { &cfg.headers };
        let transport = match &cfg.url {
            Some(url) => Transport::Http(Box::new(streamable_http::Http::new(
                server,
                url,
                headers,
                cfg.tls.as_ref(),
                http,
                max_line,
            )?)),
            None => Transport::Stdio(Arc::new(stdio::Stdio::spawn(
                server,
                cfg,
                max_line,
                mux.clone(),
            )?)),
        };
        Ok(Arc::new(UpstreamConn {
            mux,
            transport,
            server: server.into(),
            delegated,
        }))
    }

    /// The server this connection talks to.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Send a `tools/call` upstream. It takes the [`Permit`] that only the
    /// enforcement pipeline's last stage constructs (after the durable
    /// `dispatched` record, or as the leader of a read-only flight): no code
    /// path can send a tool call that skipped the pipeline.
    pub async fn call_tool(
        &self,
        permit: Permit,
        events: Option<mpsc::Sender<UpstreamEvent>>,
        timeout: Duration,
        extra: &ExtraHeaders,
    ) -> Sent {
        let (request, receipt) = permit.spend();
        receipt.sent(self.call_inner(request, events, timeout, extra).await)
    }

    /// Send a request other than `tools/call` and wait for its response
    /// (the client's id restored). Server messages related to it go to
    /// `events`.
    pub async fn call(
        &self,
        request: Passthrough,
        events: Option<mpsc::Sender<UpstreamEvent>>,
        timeout: Duration,
        extra: &ExtraHeaders,
    ) -> Result<Message, UpstreamError> {
        self.call_inner(request.0, events, timeout, extra).await
    }

    async fn call_inner(
        &self,
        msg: Message,
        events: Option<mpsc::Sender<UpstreamEvent>>,
        timeout: Duration,
        extra: &ExtraHeaders,
    ) -> Result<Message, UpstreamError> {
        let peer = match &self.transport {
            Transport::Stdio(_) => None,
            Transport::Http(h) => Some(h.peer()),
        };
        let Some((span, ctx)) = crate::telemetry::client_span(&self.server, &msg, peer) else {
            return self.exchange(msg, events, timeout, extra).await;
        };
        if self.delegated {
            // That it ran as the caller, and nothing of the token.
            span.record("countersign.delegated", true);
        }
        // The CLIENT span's context goes upstream in `params._meta` (both
        // eras) and, over HTTP, in the `traceparent` header. Only `_meta`
        // changes: the arguments go out as the bytes that were hashed.
        let mut msg = msg;
        if let Some(params) = crate::wire::trace::with_context(msg.params.as_deref(), &ctx) {
            msg.params = Some(params);
        }
        let mut headers;
        let extra = match peer {
            Some(_) => {
                headers = extra.clone();
                for (name, value) in [
                    ("traceparent", Some(&ctx.traceparent)),
                    ("tracestate", ctx.tracestate.as_ref()),
                ] {
                    if let Some(v) =
                        value.and_then(|v| http::HeaderValue::try_from(v.as_str()).ok())
                    {
                        headers.push((http::HeaderName::from_static(name), v));
                    }
                }
                &headers
            }
            None => extra,
        };
        let answer = self
            .exchange(msg, events, timeout, extra)
            .instrument(span.clone())
            .await;
        match &answer {
            Ok(resp) => crate::telemetry::record_answer(&span, resp),
            Err(e) => crate::telemetry::record_failure(&span, e.kind(), &e.to_string()),
        }
        answer
    }

    /// Send `msg` and wait for its answer.
    async fn exchange(
        &self,
        msg: Message,
        events: Option<mpsc::Sender<UpstreamEvent>>,
        timeout: Duration,
        extra: &ExtraHeaders,
    ) -> Result<Message, UpstreamError> {
        let (out, ticket) = self
            .mux
            .register(msg, events)
            .map_err(|l| UpstreamError::Closed {
                server: self.server.clone(),
                reason: l.0,
            })?;
        let id = ticket.upstream_id;
        // If this future is dropped mid-call (the 2026-07-28 client closed its
        // stream, which is its cancellation), tell a stdio upstream to stop.
        let mut in_flight = InFlight {
            conn: self,
            id,
            armed: true,
        };
        let work = async {
            match &self.transport {
                Transport::Stdio(s) => s.write(&out).await?,
                Transport::Http(h) => h.post(&self.mux, &out, Some(id), extra).await?,
            }
            match ticket.done.await {
                Ok(Ok(resp)) => Ok(resp),
                Ok(Err(lost)) => Err(self.lost(lost.0)),
                Err(_) => Err(self.lost("the answer was dropped".into())),
            }
        };
        let outcome = tokio::time::timeout(timeout, work).await;
        in_flight.armed = false;
        match outcome {
            Ok(Ok(resp)) => {
                if out.method() == "initialize" {
                    if let Transport::Http(h) = &self.transport {
                        h.initialized(&resp);
                    }
                }
                Ok(resp)
            }
            Ok(Err(e)) => {
                self.mux.forget(id);
                if matches!(e, UpstreamError::SessionExpired { .. }) {
                    // The upstream forgot this session: every call on it is
                    // lost, and the next call heals the connection.
                    self.mux.close("the upstream session expired");
                }
                Err(e)
            }
            Err(_) => {
                self.mux.forget(id);
                // Tell the server to stop; the call may still have run, which
                // the caller reports as an unknown outcome.
                let cancel = Message::notification(
                    "notifications/cancelled",
                    Some(raw(
                        &serde_json::json!({ "requestId": id, "reason": "countersign: call_timeout elapsed" }),
                    )),
                );
                let _ = self.send_raw(&cancel, &Vec::new()).await;
                Err(UpstreamError::Timeout {
                    server: self.server.clone(),
                    timeout,
                })
            }
        }
    }

    /// Send a client notification or a client response to a server request
    /// (mapped through the mux first; dropped when it maps to nothing).
    pub async fn send(&self, msg: Passthrough, extra: &ExtraHeaders) -> Result<(), UpstreamError> {
        if msg.0.kind() == Kind::Request {
            // A request expects an answer: it goes through `call`.
            return Err(UpstreamError::Closed {
                server: self.server.clone(),
                reason: format!("internal: request `{}` handed to send", msg.0.method()),
            });
        }
        let Some(msg) = self.mux.toward_upstream(msg.0) else {
            return Ok(());
        };
        self.send_raw(&msg, extra).await?;
        if msg.method() == "notifications/initialized" {
            if let Transport::Http(h) = &self.transport {
                h.open_standalone_stream(&self.mux);
            }
        }
        Ok(())
    }

    /// Cancel an in-flight upstream request (the client went away in the
    /// 2026-07-28 era, where closing the stream is the cancellation).
    pub async fn cancel(&self, upstream_id: u64, reason: &str) {
        self.mux.forget(upstream_id);
        let cancel = Message::notification(
            "notifications/cancelled",
            Some(raw(
                &serde_json::json!({ "requestId": upstream_id, "reason": reason }),
            )),
        );
        let _ = self.send_raw(&cancel, &Vec::new()).await;
    }

    async fn send_raw(&self, msg: &Message, extra: &ExtraHeaders) -> Result<(), UpstreamError> {
        match &self.transport {
            Transport::Stdio(s) => s.write(msg).await,
            Transport::Http(h) => h.post(&self.mux, msg, None, extra).await,
        }
    }

    /// Close the connection: stdio closes stdin, then SIGTERM, then SIGKILL,
    /// each after `grace`; HTTP ends its session with DELETE.
    pub async fn shutdown(&self, grace: Duration) {
        self.mux.close("the session was closed");
        match &self.transport {
            Transport::Stdio(s) => s.shutdown(grace).await,
            Transport::Http(h) => h.shutdown().await,
        }
    }

    /// Whether the connection is gone (child exited, shut down).
    pub fn is_closed(&self) -> bool {
        self.mux.is_closed()
    }

    fn lost(&self, reason: String) -> UpstreamError {
        UpstreamError::Lost {
            server: self.server.clone(),
            reason,
        }
    }
}

/// Cancels an upstream request whose call future was dropped before it ended.
struct InFlight<'a> {
    conn: &'a UpstreamConn,
    id: u64,
    armed: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.conn.mux.forget(self.id);
        // Over HTTP, the dropped POST already closed the upstream stream,
        // which is the cancellation there; stdio needs the notification.
        if let Transport::Stdio(s) = &self.conn.transport {
            let s = s.clone();
            let cancel = Message::notification(
                "notifications/cancelled",
                Some(raw(
                    &serde_json::json!({ "requestId": self.id, "reason": "the client cancelled the request" }),
                )),
            );
            tokio::spawn(async move {
                let _ = s.write(&cancel).await;
            });
        }
    }
}
