//! The audit log's side of the ledger's outbox (see
//! [`crate::store::Ledger::transition_with`]): the entries a dispatch needs
//! on disk are committed in the ledger's transaction with the durable
//! `dispatched` record (one fsync for both), queued for the log, and their
//! rows cleared once the log has fsynced them. At startup, what a crash left
//! in the outbox is appended (marked `recovered`), recognising entries
//! already written by their `outbox` tag.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Map, Value};

use super::segment::AuditError;
use super::Entries;
use crate::store::{Store, StoreError};

/// Why what a crash left in the ledger's outbox could not be taken over.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    /// The ledger's outbox could not be read or cleared.
    #[error("the ledger's outbox: {0}")]
    Store(#[from] StoreError),
    /// The log's own tail could not be read.
    #[error(transparent)]
    Log(#[from] AuditError),
    /// The read of the tail did not finish (its thread panicked).
    #[error("reading the log's tail: {0}")]
    Tail(#[from] tokio::task::JoinError),
    /// A row that is not the entries the gateway put there.
    #[error("a damaged outbox row: {0}")]
    Damaged(#[source] serde_json::Error),
    /// The audit writer did not take the recovered entries (its words).
    #[error("{0}")]
    Writer(String),
}

/// How soon entries that came through the outbox are fsynced here (after
/// which their outbox rows may be cleared).
pub(super) const OUTBOX_SYNC: Duration = Duration::from_millis(50);

/// However the store paces its clears
/// ([`crate::store::Outbox::outbox_clear_pace`]), they come once this many
/// ids wait, and at once when the writer goes idle. Rows left a little
/// longer cost nothing but their room: a restart finds their entries in the
/// log and clears them.
pub(super) const OUTBOX_CLEAR_IDS: u64 = 8192;

/// Entries staged for a dispatch: committed to the ledger's outbox with the
/// `dispatched` record (one fsync), then queued here.
pub struct Staged {
    /// Outbox id.
    pub id: u64,
    /// The entries as JSON, for the outbox row.
    pub text: String,
    /// The entries, tagged with their outbox place.
    pub entries: Entries,
}

/// The outbox the log shares with the ledger, once attached.
#[derive(Default)]
pub(super) struct Outbox {
    store: Mutex<Option<Arc<dyn Store>>>,
    /// Highest outbox id whose entries are queued.
    queued: AtomicU64,
    /// The next outbox id to hand out.
    next: AtomicU64,
    /// How long clears wait for each other while calls come (ms).
    pace_ms: AtomicU64,
}

impl Outbox {
    /// The ledger store, once attached.
    pub(super) fn store(&self) -> Option<Arc<dyn Store>> {
        self.store.lock().clone()
    }

    /// The highest outbox id whose entries are queued for the log.
    pub(super) fn queued(&self) -> u64 {
        self.queued.load(Ordering::SeqCst)
    }

    /// Share the ledger's fsync from now on. Ids never repeat across runs:
    /// they start at the clock (µs), past any id a previous run used (and
    /// past every row still in the outbox).
    pub(super) fn attach(&self, store: Arc<dyn Store>, rows: &[(u64, String)]) {
        let start = (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1000) as u64;
        let after_rows = rows.iter().map(|(id, _)| id + 1).max().unwrap_or(0);
        self.next.store(start.max(after_rows), Ordering::SeqCst);
        let pace = u64::try_from(store.outbox_clear_pace().as_millis()).unwrap_or(u64::MAX);
        self.pace_ms.store(pace, Ordering::SeqCst);
        *self.store.lock() = Some(store);
    }

    /// How long the writer lets clears wait for each other while calls
    /// come (the attached store's pace; none before one is attached).
    pub(super) fn clear_pace(&self) -> Duration {
        Duration::from_millis(self.pace_ms.load(Ordering::Relaxed))
    }

    /// Stage entries for a dispatch: tag them with an outbox id and give
    /// the JSON for the outbox row. `Err` (the entries back) when no outbox
    /// is attached (the caller must then not dispatch).
    pub(super) fn stage(&self, mut entries: Entries) -> Result<Staged, Entries> {
        if self.store.lock().is_none() {
            return Err(entries);
        }
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        for (i, (_, f)) in entries.iter_mut().enumerate() {
            f.insert("outbox", Value::from(format!("{id}/{i}")));
        }
        let text = serde_json::to_string(&entries).unwrap_or_default();
        Ok(Staged { id, text, entries })
    }

    /// The row `id` is committed and its entries are queued for the log.
    pub(super) fn queued_up_to(&self, id: u64) {
        self.queued.fetch_max(id, Ordering::SeqCst);
    }
}

/// Staged entries whose dispatch did not happen: all but the last (the
/// `dispatched` entry), untagged, to be recorded as any others.
pub(super) fn unstaged(staged: Staged) -> Entries {
    let mut entries = staged.entries;
    entries.pop();
    for (_, f) in entries.iter_mut() {
        f.remove("outbox");
    }
    entries
}

/// The entries of outbox `rows` that the log in `dir` does not hold yet
/// (by their `outbox` tag), marked `recovered`.
pub(super) async fn recovered(
    dir: &Path,
    rows: &[(u64, String)],
) -> Result<Entries, RecoveryError> {
    let mut recovered = Vec::new();
    if rows.is_empty() {
        return Ok(recovered);
    }
    let dir = dir.to_owned();
    let tail = tokio::task::spawn_blocking(move || super::segment::tail(&dir, u64::MAX)).await??;
    let present: HashSet<String> = tail
        .iter()
        .filter_map(|e| e.get("outbox").and_then(Value::as_str).map(str::to_owned))
        .collect();
    for (_, text) in rows {
        let entries: Vec<(String, Map<String, Value>)> =
            serde_json::from_str(text).map_err(RecoveryError::Damaged)?;
        for (kind, mut fields) in entries {
            let tag = fields.get("outbox").and_then(Value::as_str).unwrap_or("");
            if !present.contains(tag) {
                fields.insert("recovered".into(), Value::Bool(true));
                recovered.push((intern(&kind), fields.into()));
            }
        }
    }
    Ok(recovered)
}

/// A `&'static str` for a kind read back from an outbox row (the set of
/// kinds is small and fixed; unknown ones are leaked once each).
fn intern(kind: &str) -> &'static str {
    const KINDS: [&str; 8] = [
        "call_received",
        "decision",
        "dispatched",
        "approval_consumed",
        "completed",
        "not_dispatched",
        "outcome_unknown",
        "rejected",
    ];
    KINDS
        .iter()
        .find(|k| **k == kind)
        .copied()
        .unwrap_or_else(|| Box::leak(kind.to_owned().into_boxed_str()))
}
