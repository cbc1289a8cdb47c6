//! The enforcement pipeline's view of an upstream server: a trait the
//! upstream layer implements, and the errors it reports. The pipeline never
//! sees a transport; a test drives it with an in-process upstream.

use std::future::Future;
use std::time::Duration;

use tokio::sync::mpsc;

use super::pipeline::{Permit, Sent};
use crate::core::recovery::Failure;
use crate::wire::jsonrpc::Message;

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
    /// Its class for retries and the breaker.
    pub fn class(&self) -> Failure {
        match self {
            UpstreamError::Spawn { .. }
            | UpstreamError::Connect { .. }
            | UpstreamError::Closed { .. } => Failure::Unreachable,
            UpstreamError::Refused { .. } | UpstreamError::SessionExpired { .. } => {
                Failure::Refused
            }
            UpstreamError::Lost { .. } | UpstreamError::Timeout { .. } => Failure::Lost,
        }
    }

    /// Whether the request may have reached the server (and so may have run).
    pub fn dispatched(&self) -> bool {
        self.class().possibly_executed()
    }
}

/// Where the pipeline sends a permitted `tools/call`: one server, reached
/// through a client's session or the server's shared connection.
pub trait Upstream: Send + Sync {
    /// A connection that can carry one call.
    type Conn: ToolConn;

    /// A connection ready for a call, healed first if it was lost. Failing
    /// here means nothing of the call was sent.
    fn ready(&self) -> impl Future<Output = Result<Self::Conn, UpstreamError>> + Send;
}

/// A live connection that can carry a `tools/call`.
pub trait ToolConn: Send + Sync {
    /// Send the permit's canonical request and wait up to `timeout` for its
    /// answer; server messages related to it go to `events`. The permit is
    /// spent: what it held comes back in the [`Sent`].
    fn call_tool(
        &self,
        permit: Permit,
        events: Option<mpsc::Sender<Message>>,
        timeout: Duration,
    ) -> impl Future<Output = Sent> + Send;
}
