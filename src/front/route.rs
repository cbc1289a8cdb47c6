//! Where a client's request goes upstream: its handshake-era session
//! (healed when the connection is lost) or the server's shared 2026-07-28
//! connection. [`Route`] is what the enforcement pipeline sees as its
//! [`Upstream`].

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;

use super::gateway::{Gateway, ModernUpstream, Session};
use crate::enforce::permit::{Permit, Sent};
use crate::enforce::permit::{ToolConn, Upstream};
use crate::upstream::{ExtraHeaders, Passthrough, UpstreamConn, UpstreamError};
use crate::wire::era::{modern_headers, own_envelope, MODERN_VERSIONS};
use crate::wire::jsonrpc::{raw, Message};
use crate::wire::sse::UpstreamEvent;

/// Which connection serves a request.
#[derive(Clone)]
pub(crate) enum Target {
    /// A handshake-era session's own connection.
    Session(Arc<Session>),
    /// A server's shared 2026-07-28 connection.
    Shared {
        /// The server.
        server: String,
    },
}

/// One request's route: the gateway, its target, the extra headers of
/// its upstream POSTs, and its caller (whose token a delegating server's
/// calls go out with).
pub(crate) struct Route<'a> {
    /// The gateway.
    pub gw: &'a Gateway,
    /// Who calls.
    pub caller: &'a crate::enforce::call::Caller,
    /// The target connection.
    pub target: Target,
    /// 2026-07-28 metadata headers for the upstream request.
    pub extra: ExtraHeaders,
}

impl Route<'_> {
    /// A live connection, healing a lost one first.
    pub(crate) async fn conn(&self) -> Result<Arc<UpstreamConn>, UpstreamError> {
        match &self.target {
            Target::Session(s) => s.healthy_conn(self.gw).await,
            Target::Shared { server } => match self.gw.modern_upstream(server).await? {
                ModernUpstream::Speaks(c) => Ok(c),
                ModernUpstream::Legacy => Err(UpstreamError::Closed {
                    server: server.clone(),
                    reason: "the upstream speaks only the handshake era".into(),
                }),
            },
        }
    }

    /// Relay a request other than `tools/call` and wait for its answer.
    pub(crate) async fn call(
        &self,
        server: &str,
        msg: Message,
        events: Option<mpsc::Sender<UpstreamEvent>>,
        timeout: Duration,
    ) -> Result<Message, UpstreamError> {
        let request = Passthrough::checked(server, msg)?;
        self.conn()
            .await?
            .call(request, events, timeout, &self.extra)
            .await
    }
}

impl Route<'_> {
    fn server(&self) -> &str {
        match &self.target {
            Target::Session(s) => &s.server,
            Target::Shared { server } => server,
        }
    }
}

/// A connection bound to one request's extra headers, or, for a server
/// called as the person who asks, to the caller.
pub(crate) struct Bound<'a> {
    via: Via<'a>,
    extra: ExtraHeaders,
}

/// How a bound call goes out.
enum Via<'a> {
    /// On this connection, with the server's own credential.
    Conn(Arc<UpstreamConn>),
    /// On the caller's own connection, with the caller's exchanged token.
    Delegate(super::delegation::Delegate<'a>),
}

impl<'a> Upstream for Route<'a> {
    type Conn = Bound<'a>;

    /// Failing to get a connection (even when the handshake or discovery
    /// that failed had been sent) means the tool call itself was never
    /// sent: it is reported as such.
    async fn ready(&self) -> Result<Bound<'a>, UpstreamError> {
        // The pipeline refused a caller that cannot be delegated before
        // this (`delegation_unavailable`); a `fallback = "service"` caller
        // has no token here and goes out as without delegation.
        // The caller's own connection is opened (or found) at dispatch,
        // under the permit, not here.
        if let Some(delegate) = super::delegation::of(self.gw, self.server(), self.caller) {
            return Ok(Bound {
                via: Via::Delegate(delegate),
                extra: self.extra.clone(),
            });
        }
        let conn = self.conn().await.map_err(|e| match e {
            e if !e.dispatched() => e,
            e => UpstreamError::Connect {
                server: self.server().to_owned(),
                reason: format!("the connection could not be (re)established: {e}"),
            },
        })?;
        Ok(Bound {
            via: Via::Conn(conn),
            extra: self.extra.clone(),
        })
    }

    async fn list_tools(&self, cursor: Option<String>) -> Result<Message, UpstreamError> {
        self.list_page(cursor).await
    }

    /// A session's list is the one its client's `initialize` capabilities
    /// are offered; the shared 2026-07-28 connection lists with the
    /// gateway's own envelope (no capabilities).
    fn client_profile(&self) -> String {
        let capabilities = match &self.target {
            Target::Session(s) => s.client_capabilities(),
            Target::Shared { .. } => None,
        };
        crate::core::catalog::client_profile(capabilities.as_ref())
    }
}

impl Route<'_> {
    /// The gateway's own `tools/list` request, in the route's era.
    async fn list_page(&self, cursor: Option<String>) -> Result<Message, UpstreamError> {
        let mut params = serde_json::Map::new();
        if let Some(c) = cursor {
            params.insert("cursor".into(), Value::from(c));
        }
        let extra = match &self.target {
            Target::Session(s) if s.envelope.is_none() => Vec::new(),
            Target::Session(_) | Target::Shared { .. } => {
                let version = MODERN_VERSIONS[0];
                params.insert("_meta".into(), Value::Object(own_envelope(version)));
                modern_headers("tools/list", None, version)
            }
        };
        let id = Value::from(format!("countersign-catalog-{:x}", rand::random::<u64>()));
        let request = Message::request(id, "tools/list", Some(raw(&Value::Object(params))));
        let server = self.server();
        let request = Passthrough::checked(server, request)?;
        let timeout = self.gw.pipeline().call_timeout(server);
        self.conn()
            .await?
            .call(request, None, timeout, &extra)
            .await
    }
}

impl ToolConn for Bound<'_> {
    async fn call_tool(
        &self,
        permit: Permit,
        events: Option<mpsc::Sender<UpstreamEvent>>,
        timeout: Duration,
    ) -> Sent {
        match &self.via {
            // The token is had now, after the decision, the approval and
            // the durable `dispatched`: a held or denied call mints none.
            Via::Delegate(d) => d.call_tool(permit, events, timeout, &self.extra).await,
            Via::Conn(conn) => conn.call_tool(permit, events, timeout, &self.extra).await,
        }
    }
}
