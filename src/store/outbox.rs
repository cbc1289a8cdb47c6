//! What waits to leave: webhook notices (leased to one gateway at a time)
//! and the audit entries that share the ledger's fsync until the audit
//! writer has them on its own disk.

use std::collections::BTreeMap;

use super::{StoreError, StoreFuture};
use crate::core::notify::{Notice, WebhookStatus};

/// How a delivery attempt of a [`Notice`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settle {
    /// The receiver took it (2xx) at this unix ms: the notice is done.
    Delivered(i64),
    /// It failed at `at_ms` with `error`; tried again at `retry_ms`, or
    /// given up (`None`) once its retry window passed.
    Failed {
        /// Unix ms of the attempt.
        at_ms: i64,
        /// What went wrong (a status, a connection error), never a body.
        error: String,
        /// When to try again, if at all.
        retry_ms: Option<i64>,
    },
}

/// The notification queue and the audit outbox.
pub trait Outbox: Send + Sync {
    /// Queue `notices` on their own, durably, before it returns (an event
    /// of no store change: a circuit, a tool definition).
    fn notices_enqueue(&self, notices: Vec<Notice>) -> StoreFuture<'_, ()> {
        let _ = notices;
        Box::pin(std::future::ready(Err(StoreError::NoQueue)))
    }

    /// Lease up to `limit` notices due now to `owner` for `lease_ms`: no
    /// other gateway takes them until the lease lapses (then they are
    /// taken over: the owner died mid-delivery).
    fn notices_claim(
        &self,
        owner: &str,
        now_ms: i64,
        lease_ms: i64,
        limit: usize,
    ) -> StoreFuture<'_, Vec<Notice>> {
        let _ = (owner, now_ms, lease_ms, limit);
        Box::pin(std::future::ready(Ok(Vec::new())))
    }

    /// Record how an attempt of `notice` ended: delivered (forgotten),
    /// tried again later, or given up (kept, never sent again).
    fn notice_settle(&self, notice: Notice, outcome: Settle) -> StoreFuture<'_, ()> {
        let _ = (notice, outcome);
        Box::pin(std::future::ready(Err(StoreError::NoQueue)))
    }

    /// Each webhook's status, and how many notices wait in the queue.
    fn notify_status(&self) -> StoreFuture<'_, (BTreeMap<String, WebhookStatus>, usize)> {
        Box::pin(std::future::ready(Ok((BTreeMap::new(), 0))))
    }

    /// The audit entries waiting in the outbox, by id.
    fn outbox(&self) -> StoreFuture<'_, Vec<(u64, String)>>;

    /// Forget outbox rows with ids up to `upto` (their entries are fsynced
    /// in the audit log). Not durable by itself. The request is made when
    /// this is called (awaiting only waits for its result), so a caller
    /// outside an async context may drop the future.
    fn outbox_clear(&self, upto: u64) -> StoreFuture<'_, usize>;

    /// How long the audit writer lets rows it may clear wait for the next
    /// clear while calls keep coming (it clears at once when it goes
    /// idle). None by default: on an embedded store a clear is a frame of
    /// its journal, and rows cleared before the journal is folded never
    /// reach its tables. A store where each clear is a statement and a
    /// commit on a shared database paces them.
    fn outbox_clear_pace(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

/// The notices of a queue that are due at `now_ms` and not leased by a
/// live delivery, at most `limit`, oldest first (the embedded stores'
/// claim; PostgreSQL's is the same in SQL).
pub(super) fn due(notices: &BTreeMap<String, Notice>, now_ms: i64, limit: usize) -> Vec<String> {
    let mut due: Vec<&Notice> = notices
        .values()
        .filter(|n| !n.gave_up && n.next_ms <= now_ms)
        .filter(|n| n.lease.as_ref().is_none_or(|(_, until)| *until < now_ms))
        .collect();
    due.sort_by_key(|n| (n.next_ms, n.created_ms));
    due.into_iter().take(limit).map(Notice::key).collect()
}

/// A settled attempt, applied to the notice (`None`: delivered, forget it)
/// and to its webhook's status.
pub(super) fn settled(
    mut n: Notice,
    outcome: &Settle,
    status: &mut WebhookStatus,
) -> Option<Notice> {
    n.lease = None;
    match outcome {
        Settle::Delivered(at) => {
            status.delivered += 1;
            status.last_success_ms = Some(*at);
            None
        }
        Settle::Failed {
            at_ms,
            error,
            retry_ms,
        } => {
            n.attempts = n.attempts.saturating_add(1);
            n.last_error = Some(error.clone());
            status.last_failure_ms = Some(*at_ms);
            status.last_error = Some(error.clone());
            match retry_ms {
                Some(next) => {
                    status.retried += 1;
                    n.next_ms = *next;
                }
                None => {
                    status.gave_up += 1;
                    n.gave_up = true;
                }
            }
            Some(n)
        }
    }
}
