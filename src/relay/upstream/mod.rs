//! Upstream MCP servers: a stdio child or a Streamable HTTP endpoint.
//!
//! An [`UpstreamConn`] is one connection (one child, or one HTTP session) with
//! its [`Mux`]. Transports only move bytes; ids and routing live in the mux,
//! so both transports behave the same towards clients.

mod stdio;
mod streamable_http;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::config::ServerConfig;
use crate::idempotency::Permit;
use crate::jsonrpc::{raw, Message};
use crate::relay::mux::Mux;

pub use streamable_http::HttpClient;

/// Why an upstream call failed. [`UpstreamError::dispatched`] tells whether
/// the request may have reached the server: that decides, for writes, between
/// "safe to try again" and `outcome_unknown`.
#[derive(Debug, Clone, thiserror::Error)]
pub enum UpstreamError {
    /// The child could not be started.
    #[error("cannot start upstream `{server}`: {reason}")]
    Spawn {
        /// Server name.
        server: String,
        /// What failed.
        reason: String,
    },
    /// No connection could be made to the HTTP upstream.
    #[error("cannot connect to upstream `{server}`: {reason}")]
    Connect {
        /// Server name.
        server: String,
        /// What failed.
        reason: String,
    },
    /// The HTTP upstream refused the request before processing it.
    #[error("upstream `{server}` refused the request with HTTP {status}")]
    Refused {
        /// Server name.
        server: String,
        /// HTTP status.
        status: u16,
    },
    /// The upstream no longer knows its session (HTTP 404 for `Mcp-Session-Id`).
    #[error("upstream `{server}` lost its session")]
    SessionExpired {
        /// Server name.
        server: String,
    },
    /// The connection was already closed; nothing was sent.
    #[error("upstream `{server}` is not connected: {reason}")]
    Closed {
        /// Server name.
        server: String,
        /// Why it closed.
        reason: String,
    },
    /// The request was sent and the answer was lost.
    #[error("upstream `{server}` connection lost during the call: {reason}")]
    Lost {
        /// Server name.
        server: String,
        /// What happened.
        reason: String,
    },
    /// `call_timeout` elapsed after the request was sent.
    #[error("upstream `{server}` did not answer within {timeout:?}")]
    Timeout {
        /// Server name.
        server: String,
        /// The timeout.
        timeout: Duration,
    },
}

impl UpstreamError {
    /// Whether the request may have reached the server (and so may have run).
    pub fn dispatched(&self) -> bool {
        matches!(
            self,
            UpstreamError::Lost { .. } | UpstreamError::Timeout { .. }
        )
    }
}

/// Extra HTTP headers for one upstream request (2026-07-28 metadata headers).
pub type ExtraHeaders = Vec<(http::HeaderName, http::HeaderValue)>;

enum Transport {
    Stdio(Arc<stdio::Stdio>),
    Http(Box<streamable_http::Http>),
}

/// One live upstream connection.
pub struct UpstreamConn {
    /// Id mapping and routing (shared with the transport's reader tasks).
    pub mux: Arc<Mux>,
    transport: Transport,
    server: String,
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
    ) -> Result<Arc<UpstreamConn>, UpstreamError> {
        let mux = Arc::new(Mux::new(unsolicited));
        let transport = match &cfg.url {
            Some(url) => Transport::Http(Box::new(streamable_http::Http::new(
                server,
                url,
                &cfg.headers,
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
        }))
    }

    /// The server this connection talks to.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Send a `tools/call` upstream. It takes the [`Permit`] that only the
    /// ledger issues (after the durable `dispatched` record, or as the leader
    /// of a read-only flight): no code path can send a tool call that skipped
    /// the enforcement pipeline.
    pub async fn call_tool(
        &self,
        _permit: Permit,
        msg: Message,
        events: Option<mpsc::Sender<Message>>,
        timeout: Duration,
        extra: &ExtraHeaders,
    ) -> Result<Message, UpstreamError> {
        self.call_inner(msg, events, timeout, extra).await
    }

    /// Send any request other than `tools/call` and wait for its response
    /// (the client's id restored). Server messages related to it go to
    /// `events`.
    pub async fn call(
        &self,
        msg: Message,
        events: Option<mpsc::Sender<Message>>,
        timeout: Duration,
        extra: &ExtraHeaders,
    ) -> Result<Message, UpstreamError> {
        if msg.method() == "tools/call" {
            // INVARIANT: tool calls go through `call_tool` with a permit.
            return Err(UpstreamError::Closed {
                server: self.server.clone(),
                reason: "internal: a tools/call without a ledger permit was refused".into(),
            });
        }
        self.call_inner(msg, events, timeout, extra).await
    }

    async fn call_inner(
        &self,
        msg: Message,
        events: Option<mpsc::Sender<Message>>,
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
    pub async fn send(&self, msg: Message, extra: &ExtraHeaders) -> Result<(), UpstreamError> {
        let Some(msg) = self.mux.from_client(msg) else {
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
