//! One request's context, whatever the transport: who calls which server,
//! in which era, over which upstream connection, and where it came from.
//! The front ends build it; [`super::mcp`] answers the request and
//! [`super::tasks`] serves the gateway's tasks with it.

use crate::enforce::pipeline::Caller;
use crate::front::gateway::Gateway;
use crate::front::route::{Route, Target};
use crate::upstream::ExtraHeaders;
use crate::wire::era::Era;

/// One request's context: who calls which server, in which era, and where
/// it goes upstream.
#[derive(Clone)]
pub(crate) struct RequestCtx {
    /// The configured server.
    pub server: String,
    /// Who calls, and in which idempotency scope.
    pub caller: Caller,
    /// The wire era.
    pub era: Era,
    /// The upstream connection it goes to.
    pub target: Target,
    /// 2026-07-28 metadata headers for the upstream request.
    pub extra: ExtraHeaders,
    /// Handshake era: the session's open questions to its client, when the
    /// client declared elicitation.
    pub asks: Option<std::sync::Arc<crate::enforce::client::Asks>>,
    /// The upstream speaks the other era than the client (a session held
    /// by the gateway): every answer is rewritten in the client's era.
    pub bridged: bool,
    /// Where the request came from, for its span.
    pub origin: Origin,
}

/// Where a request came from: the peer's address, the HTTP trace context
/// headers (read only when traces are on), and the caller's token when the
/// server delegates to its issuer.
#[derive(Clone, Debug, Default)]
pub(crate) struct Origin {
    /// The peer's socket address.
    pub client: Option<std::net::SocketAddr>,
    /// `traceparent`/`tracestate` headers.
    pub header: Option<crate::wire::trace::TraceContext>,
    /// This request's own verified token (never its session's: a client
    /// refreshes its token within one session), for delegation.
    pub subject: Option<std::sync::Arc<crate::core::identity::SubjectToken>>,
}

impl RequestCtx {
    /// A 2026-07-28 request: no session, so no idempotency scope of its own
    /// and no open questions; `bridged` when `target` speaks the handshake
    /// era for it.
    pub(crate) fn stateless(
        server: &str,
        identity: std::sync::Arc<crate::core::identity::Identity>,
        target: Target,
        extra: ExtraHeaders,
        bridged: bool,
    ) -> RequestCtx {
        RequestCtx {
            server: server.to_owned(),
            caller: Caller {
                identity,
                scope: None,
                subject: None,
            },
            era: Era::Modern,
            target,
            extra,
            asks: None,
            bridged,
            origin: Origin::default(),
        }
    }
}

impl RequestCtx {
    /// Where the request goes upstream: its target, its extra headers,
    /// and its caller.
    pub(crate) fn route<'a>(&'a self, gw: &'a Gateway) -> Route<'a> {
        Route {
            gw,
            caller: &self.caller,
            target: self.target.clone(),
            extra: self.extra.clone(),
        }
    }
}
