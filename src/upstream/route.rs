//! Where a client's request goes upstream: its handshake-era session
//! (healed when the connection is lost) or the server's shared 2026-07-28
//! connection. [`Route`] is what the enforcement pipeline sees as its
//! [`Upstream`].

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;

use super::session::{Gateway, ModernUpstream, Session};
use super::{ExtraHeaders, Passthrough, UpstreamConn, UpstreamError};
use crate::enforce::permit::{Permit, Sent};
use crate::enforce::permit::{ToolConn, Upstream};
use crate::wire::jsonrpc::Message;

/// Which connection serves a request.
#[derive(Clone)]
pub enum Target {
    /// A handshake-era session's own connection.
    Session(Arc<Session>),
    /// A server's shared 2026-07-28 connection; `meta` is the request's
    /// `_meta` (for the first `server/discover`).
    Shared {
        /// The server.
        server: String,
        /// The request's `_meta`.
        meta: Value,
    },
}

/// One request's route: the gateway, its target and the extra headers of
/// its upstream POSTs.
pub struct Route<'a> {
    /// The gateway.
    pub gw: &'a Gateway,
    /// The target connection.
    pub target: Target,
    /// 2026-07-28 metadata headers for the upstream request.
    pub extra: ExtraHeaders,
}

impl Route<'_> {
    /// A live connection, healing a lost one first.
    pub async fn conn(&self) -> Result<Arc<UpstreamConn>, UpstreamError> {
        match &self.target {
            Target::Session(s) => s.healthy_conn(self.gw).await,
            Target::Shared { server, meta } => match self.gw.modern_upstream(server, meta).await? {
                ModernUpstream::Speaks(c) => Ok(c),
                ModernUpstream::Legacy => Err(UpstreamError::Closed {
                    server: server.clone(),
                    reason: "the upstream speaks only the handshake era".into(),
                }),
            },
        }
    }

    /// Relay a request other than `tools/call` and wait for its answer.
    pub async fn call(
        &self,
        server: &str,
        msg: Message,
        events: Option<mpsc::Sender<Message>>,
        timeout: Duration,
    ) -> Result<Message, UpstreamError> {
        let request = Passthrough::checked(server, msg)?;
        self.conn()
            .await?
            .call(request, events, timeout, &self.extra)
            .await
    }
}

/// A connection bound to one request's extra headers.
pub struct Bound {
    conn: Arc<UpstreamConn>,
    extra: ExtraHeaders,
}

impl Upstream for Route<'_> {
    type Conn = Bound;

    /// Failing to get a connection (even when the handshake or discovery
    /// that failed had been sent) means the tool call itself was never
    /// sent: it is reported as such.
    async fn ready(&self) -> Result<Bound, UpstreamError> {
        let conn = self.conn().await.map_err(|e| match e {
            e if !e.dispatched() => e,
            e => UpstreamError::Connect {
                server: match &self.target {
                    Target::Session(s) => s.server.clone(),
                    Target::Shared { server, .. } => server.clone(),
                },
                reason: format!("the connection could not be (re)established: {e}"),
            },
        })?;
        Ok(Bound {
            conn,
            extra: self.extra.clone(),
        })
    }
}

impl ToolConn for Bound {
    async fn call_tool(
        &self,
        permit: Permit,
        events: Option<mpsc::Sender<Message>>,
        timeout: Duration,
    ) -> Sent {
        self.conn
            .call_tool(permit, events, timeout, &self.extra)
            .await
    }
}
