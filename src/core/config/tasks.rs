//! `[tasks]`: held calls as MCP tasks (DESIGN.md section 24).

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::{duration, invalid, ConfigError};

/// `[tasks]`: how a call held for a reviewer becomes a task the client
/// polls, and how long a finished task is kept.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TasksConfig {
    /// Offer tasks to clients that ask for them (2025-11-25 core tasks, the
    /// 2026-07-28 `io.modelcontextprotocol/tasks` extension). Off: every
    /// client sees `approval_pending` as before.
    pub enabled: bool,
    /// How long a finished task (its result) is kept after it ended.
    #[serde(deserialize_with = "duration")]
    pub retention: Duration,
    /// The poll interval suggested to clients (`pollInterval`).
    #[serde(deserialize_with = "duration")]
    pub poll_interval: Duration,
    /// A task claimed for execution by a gateway that has not finished it
    /// within this time (it stopped, or lost the database) may be taken
    /// over by another gateway. The ledger keeps the takeover at most once:
    /// the call is asked again with the task's own idempotency key.
    #[serde(deserialize_with = "duration")]
    pub claim_timeout: Duration,
}

impl Default for TasksConfig {
    fn default() -> Self {
        TasksConfig {
            enabled: true,
            retention: Duration::from_secs(24 * 3600),
            poll_interval: Duration::from_secs(2),
            claim_timeout: Duration::from_secs(10 * 60),
        }
    }
}

impl TasksConfig {
    /// `[tasks]`: a poll interval of at least 100 ms, a retention and a
    /// claim timeout above zero.
    pub(super) fn check(&self, path: &Path) -> Result<(), ConfigError> {
        if self.poll_interval < Duration::from_millis(100) {
            return Err(invalid(
                path,
                "tasks.poll_interval must be at least 100ms".into(),
            ));
        }
        if self.retention.is_zero() || self.claim_timeout.is_zero() {
            return Err(invalid(
                path,
                "tasks.retention and tasks.claim_timeout must be more than 0s".into(),
            ));
        }
        Ok(())
    }
}
