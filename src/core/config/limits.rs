//! `[limits]`: sizes and counts a gateway can serve with.

use std::path::Path;

use serde::Deserialize;

use super::{invalid, ConfigError};

/// `[limits]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest HTTP request body, in bytes.
    pub max_body_bytes: usize,
    /// Longest line on a stdio pipe (client bridge or upstream child).
    pub max_line_bytes: usize,
    /// Deepest nesting of `tools/call` arguments.
    pub max_depth: usize,
    /// Largest `tools/call` arguments, in bytes.
    pub max_arguments_bytes: usize,
    /// Most client connections open at once; one more is answered 503 and
    /// closed (idle clients cannot exhaust descriptors).
    pub max_connections: usize,
    /// Most review console requests in flight at once (the console answers
    /// people before they sign in); one more is answered 503 and its
    /// connection closed, so the console never holds the connections
    /// `/mcp` needs. Less than `max_connections`; by default an eighth
    /// of it (see [`Limits::console_requests`]).
    pub max_console_requests: Option<usize>,
    /// Most handshake-era sessions one identity may hold; one more
    /// `initialize` is refused (429) until one closes or idles out.
    pub max_sessions_per_identity: usize,
    /// Requests per second one identity may send to `/mcp`, with bursts of
    /// twice that; beyond it a request gets 429 with `Retry-After` and
    /// nothing is sent upstream. 0: no limit (the default: the right rate
    /// depends on the agents, and a gateway-wide load test drives one
    /// identity at thousands per second).
    pub requests_per_second: u32,
    /// Most members of one JSON-RPC batch (2025-03-26); a larger batch is
    /// refused whole (`-32600`) and nothing of it is sent: a client has no
    /// reason to send thousands.
    pub max_batch_members: usize,
}

impl Limits {
    /// Review console requests in flight at most: `max_console_requests`,
    /// or an eighth of `max_connections` (at least one).
    pub fn console_requests(&self) -> usize {
        self.max_console_requests
            .unwrap_or((self.max_connections / 8).max(1))
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 4 << 20,
            max_line_bytes: 16 << 20,
            max_depth: 64,
            max_arguments_bytes: 1 << 20,
            max_connections: 1024,
            max_console_requests: None,
            max_sessions_per_identity: 256,
            requests_per_second: 0,
            max_batch_members: 100,
        }
    }
}

impl Limits {
    /// `[limits]`: sizes and counts a gateway can serve with.
    pub(super) fn check(&self, path: &Path) -> Result<(), ConfigError> {
        if self.max_body_bytes < 1024 || self.max_line_bytes < 1024 {
            return Err(invalid(
                path,
                "limits.max_body_bytes and limits.max_line_bytes must be at least 1024".into(),
            ));
        }
        if self.max_connections == 0
            || self.max_sessions_per_identity == 0
            || self.max_batch_members == 0
            || self.max_console_requests == Some(0)
        {
            return Err(invalid(
                path,
                "limits.max_connections, limits.max_sessions_per_identity, limits.max_batch_members and limits.max_console_requests must be at least 1"
                    .into(),
            ));
        }
        if let Some(n) = self
            .max_console_requests
            .filter(|n| *n >= self.max_connections)
        {
            return Err(invalid(
                path,
                format!(
                    "limits.max_console_requests ({n}) must be less than limits.max_connections ({}): the console must leave connections for /mcp",
                    self.max_connections
                ),
            ));
        }
        Ok(())
    }
}
