//! How an upstream call fails, as the enforcement pipeline sees it: the
//! transports report these, and [`UpstreamError::class`] tells retries and
//! the breaker what each means.

use std::time::Duration;

use crate::core::recovery::Failure;

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
    /// No token for the caller could be had at dispatch (delegation: the
    /// provider refused the exchange, could not be reached, or the
    /// caller's own token expired). Nothing was sent.
    #[error("no token for upstream `{server}` on the caller's behalf ({reason}): {detail}")]
    Delegation {
        /// Server name.
        server: String,
        /// The short reason (`invalid_grant`, `timeout`, ...).
        reason: String,
        /// What happened.
        detail: String,
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
            // Nothing was sent, and the upstream is not at fault.
            UpstreamError::Refused { .. }
            | UpstreamError::SessionExpired { .. }
            | UpstreamError::Delegation { .. } => Failure::Refused,
            UpstreamError::Lost { .. } | UpstreamError::Timeout { .. } => Failure::Lost,
        }
    }

    /// A low-cardinality name of the failure (a trace's `error.type`).
    pub fn kind(&self) -> &'static str {
        match self {
            UpstreamError::Spawn { .. } => "spawn_failed",
            UpstreamError::Connect { .. } => "connect_failed",
            UpstreamError::Closed { .. } => "closed",
            UpstreamError::Refused { .. } => "refused",
            UpstreamError::SessionExpired { .. } => "session_expired",
            UpstreamError::Delegation { .. } => "delegation_failed",
            UpstreamError::Lost { .. } => "lost",
            UpstreamError::Timeout { .. } => "timeout",
        }
    }

    /// Whether the request may have reached the server (and so may have run).
    pub fn dispatched(&self) -> bool {
        self.class().possibly_executed()
    }
}
