//! Durable storage of the idempotency ledger.
//!
//! One trait, [`Store`], with what each call guarantees when it returns, and
//! three implementations: [`RedbStore`] (embedded, the default, under
//! `gateway.data_dir`), [`PgStore`] (PostgreSQL, shared by several
//! gateways) and [`MemoryStore`] (the reference the others are checked
//! against; also for tests). The same conformance suite
//! (`tests::conformance`) runs against all three, PostgreSQL on a real
//! server.
//!
//! Every method returns a future, reads included: a networked store (the
//! PostgreSQL one for several gateways) answers them with a round trip, and
//! the embedded stores answer at once.
//!
//! Durability contract (what is on disk when the future resolves):
//! - [`Store::reserve`]: atomic, **not** necessarily durable. A reservation
//!   lost in a crash means nothing was sent, and recovery would have freed
//!   the key anyway.
//! - [`Store::transition`] to `dispatched`: **durable** (fsync) before the
//!   future resolves. The relay writes nothing upstream before that.
//! - [`Store::transition`] out of `unknown` (reconciliation): durable.
//! - [`Store::transition`] from `dispatched` to `complete` or
//!   `not_dispatched`: **durable** before the future resolves, because the
//!   client is told the answer (or "safe to retry") right after: a crash must
//!   not turn what it was told into `unknown`. Concurrent calls share the
//!   fsync (group commit).
//! - Other transitions (`dispatched → unknown`, anything from `reserved`) and
//!   reservations: atomic and visible at once, durable with the next durable
//!   commit (redb: at most 100 ms later). If a crash drops one, recovery
//!   reaches the same state (`unknown`, or the key freed).
//! - [`Store::recover`] (at startup): `reserved` → removed, `dispatched` →
//!   `unknown`, durably.
//!
//! On PostgreSQL ([`PgStore`], several gateways sharing one ledger) the same
//! contract holds across processes: one row per key, a reservation is an
//! `INSERT ... ON CONFLICT DO NOTHING`, a transition an `UPDATE ... WHERE
//! state = $from`, the durable commits are synchronous, the hot writes of
//! concurrent calls share one statement and one commit, and rows carry the
//! gateway that wrote them (a gateway's `recover` is of its own rows). See
//! the module for the lease that fences a paused gateway.

pub mod console;
pub mod durable;
pub mod guards;
mod journal;
mod memory;
pub mod postgres;
pub mod private;
mod redb_store;
pub mod tasks;

use std::future::Future;
use std::pin::Pin;

pub use memory::MemoryStore;
pub use postgres::PgStore;
pub use redb_store::RedbStore;

use std::collections::BTreeMap;

use crate::core::approval::{Proposal, ProposalState};
use crate::core::ledger::{Record, State};
use crate::core::notify::{Notice, WebhookStatus};
use crate::core::task::TaskRecord;
pub use tasks::TaskFilter;

/// A storage failure. The pipeline fails closed on it: the call does not
/// run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The database could not do what was asked (`op`: begin, read,
    /// write, commit, scan...).
    #[error("ledger store: {op}: {reason}")]
    Backend {
        /// The operation.
        op: &'static str,
        /// What the database said.
        reason: String,
    },
    /// The ledger file could not be opened.
    #[error("ledger store: cannot open `{path}`: {reason}")]
    Open {
        /// The file or its directory.
        path: String,
        /// Why, and what to do.
        reason: String,
    },
    /// A value could not be encoded for storage.
    #[error("ledger store: cannot encode a {what}: {reason}")]
    Encode {
        /// `record` or `proposal`.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A stored value does not decode.
    #[error(
        "ledger store: a stored {what} does not decode ({reason}): the ledger file may be damaged"
    )]
    Corrupt {
        /// `record` or `proposal`.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A transition the ledger does not allow.
    #[error("ledger store: transition {from:?} → {to:?} is not allowed")]
    Forbidden {
        /// From.
        from: State,
        /// To.
        to: State,
    },
    /// The record changed under a transition that expected another state.
    #[error("ledger store: key `{0}` changed state before dispatch")]
    Raced(String),
    /// A transition found the record no longer in the state it left it in:
    /// another gateway settled it (its lease lapsed, and the others made
    /// the call `unknown`), or an operator reconciled it.
    #[error(
        "ledger store: key `{0}` was settled elsewhere before this gateway could record its answer"
    )]
    SettledElsewhere(String),
    /// A new proposal id was already taken.
    #[error("ledger store: proposal id `{0}` collided")]
    Collision(String),
    /// The writer thread is gone (the store is shutting down).
    #[error("ledger store: the ledger writer stopped")]
    WriterStopped,
    /// This store keeps no notification queue (a wrapper in a test).
    #[error("ledger store: this store keeps no notification queue")]
    NoQueue,
    /// This store keeps no tasks (a wrapper in a test).
    #[error("ledger store: this store keeps no tasks")]
    NoTasks,
}

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

/// The notices of a queue that are due at `now_ms` and not leased by a
/// live delivery, at most `limit`, oldest first (the embedded stores'
/// claim; PostgreSQL's is the same in SQL).
fn due(notices: &BTreeMap<String, Notice>, now_ms: i64, limit: usize) -> Vec<String> {
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
fn settled(mut n: Notice, outcome: &Settle, status: &mut WebhookStatus) -> Option<Notice> {
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

/// A future returned by the store.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The outcome of [`Store::reserve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reservation {
    /// The key was free; the given record now holds it (state `reserved`).
    Reserved,
    /// The key is bound by this record; nothing was written.
    Bound(Record),
    /// The approval to consume is not usable (found in this state;
    /// `Expired` also for an approval past its expiry); nothing was written.
    Unapproved(ProposalState),
}

/// What [`Store::recover`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// `reserved` records removed (never sent).
    pub freed: usize,
    /// `dispatched` records turned `unknown` (sent, answer lost in the crash).
    pub unknown: usize,
}

/// A change another process (or this one) made in a shared store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreEvent {
    /// A proposal changed (created, decided, consumed, expired).
    Proposal(String),
    /// A ledger record reached a state a waiter acts on (`complete`,
    /// `not_dispatched`, `unknown`).
    Ledger(String),
    /// A task was created or changed (its id).
    Task(String),
}

/// Ledger storage. Keys are [`crate::core::ledger::storage_key`]s.
pub trait Store: guards::Guards + console::ConsoleState + Send + Sync {
    /// Changes made through any process sharing this store, as they commit
    /// (PostgreSQL: `LISTEN/NOTIFY`). `None` for a store no other process
    /// can write (redb, memory): this process knows its own changes.
    fn subscribe(&self) -> Option<tokio::sync::broadcast::Receiver<StoreEvent>> {
        None
    }

    /// Whether commits made without an fsync of their own (redb: an
    /// answer recorded after its dispatch) still wait for the next durable
    /// commit or the idle flush. Stores that make every commit durable, or
    /// keep nothing on disk, say `false`.
    fn unflushed(&self) -> bool {
        false
    }

    /// Whether the store refuses writes because it cannot make them
    /// durable (redb: a journal write or fsync failed, or the journal
    /// outgrew its bound while folding it into the database kept failing).
    /// Reads go on. Shown on `/metrics`.
    fn refusing_writes(&self) -> bool {
        false
    }

    /// Whether the store answers now (for `/healthz`); the embedded stores
    /// always do.
    fn health(&self) -> StoreFuture<'_, ()> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// The record of `key`, if any (reads never fsync). Reads are futures
    /// too: a networked store answers them with a round trip.
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>>;

    /// Atomically claim `key` with `record` (state `reserved`) if no record
    /// binds it at `now_ms` (see [`Record::binds`]); otherwise return the
    /// binding record and write nothing.
    fn reserve(&self, key: String, record: Record, now_ms: i64) -> StoreFuture<'_, Reservation> {
        self.reserve_with(key, record, now_ms, None)
    }

    /// [`Store::reserve`], and when `approval` names a proposal, consume it
    /// in the same transaction (see [`crate::core::approval::consume`]): either
    /// both happen or neither. Not durable by itself, like a reservation: a
    /// crash before the durable `dispatched` loses both together, and then
    /// nothing was sent.
    fn reserve_with(
        &self,
        key: String,
        record: Record,
        now_ms: i64,
        approval: Option<String>,
    ) -> StoreFuture<'_, Reservation>;

    /// Write a proposal if its stored state is `expect` and its stored
    /// revision is the one before `proposal.revision` (`None`: only if
    /// there is none). Returns whether it did. A writer reads, changes and
    /// bumps the revision: of two writers that read the same revision, one
    /// wins and the other reads again, so concurrent partial approvals of
    /// one proposal are never lost. Durable before it returns when the new
    /// state is a reviewer's decision (`approved`, `denied`) or the proposal
    /// holds approvals: a signed human act is not lost to a crash.
    fn put_proposal(
        &self,
        proposal: Proposal,
        expect: Option<ProposalState>,
    ) -> StoreFuture<'_, bool> {
        self.put_proposal_with(proposal, expect, Vec::new())
    }

    /// [`Store::put_proposal`], and queue `notices` (the events it
    /// announces, DESIGN.md section 19) in the same commit: the proposal
    /// and its notifications are written together or not at all.
    fn put_proposal_with(
        &self,
        proposal: Proposal,
        expect: Option<ProposalState>,
        notices: Vec<Notice>,
    ) -> StoreFuture<'_, bool>;

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

    /// Record tool definitions pinned on first use (DESIGN.md section 12),
    /// each `(key, value)` unless one is recorded under its key already:
    /// the first one stays. One durable commit for all, before it returns.
    /// Returns how many it wrote.
    fn pin_first_use(&self, pins: Vec<(String, String)>) -> StoreFuture<'_, usize>;

    /// Every pin recorded on first use.
    fn first_use_pins(&self) -> StoreFuture<'_, Vec<String>>;

    /// Use `nonce` once: record it until `expires_ms` unless it is recorded
    /// already and has not expired at `now_ms`. `true` when this call
    /// recorded it, `false` when it was seen before (a replay). Committed
    /// durably before it returns: a request replayed after a restart, or
    /// at another gateway sharing the store, finds it. Nonces past their
    /// expiry may be dropped.
    fn use_nonce(&self, nonce: String, expires_ms: i64, now_ms: i64) -> StoreFuture<'_, bool>;

    /// A proposal by id.
    fn get_proposal<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Proposal>>;

    /// Every stored proposal.
    fn list_proposals(&self) -> StoreFuture<'_, Vec<Proposal>>;

    /// The proposals still open (pending or approved): what the sweep may
    /// expire. Read by an index on the stores that keep one, not by reading
    /// every proposal kept.
    fn open_proposals(&self) -> StoreFuture<'_, Vec<Proposal>> {
        Box::pin(async move {
            Ok(self
                .list_proposals()
                .await?
                .into_iter()
                .filter(|p| matches!(p.state, ProposalState::Pending | ProposalState::Approved))
                .collect())
        })
    }

    /// The proposals `requester` of `tenant` made (every state), read by an
    /// index on the stores that keep one: a held call looks at its own
    /// requester's proposals, never at every proposal in the store.
    fn proposals_of<'a>(
        &'a self,
        tenant: &'a str,
        requester: &'a str,
    ) -> StoreFuture<'a, Vec<Proposal>> {
        Box::pin(async move {
            Ok(self
                .list_proposals()
                .await?
                .into_iter()
                .filter(|p| p.tenant == tenant && p.requester == requester)
                .collect())
        })
    }

    /// Forget proposals in a final state (denied, consumed, expired,
    /// invalidated) last changed before `before_ms`.
    fn gc_proposals(&self, before_ms: i64) -> StoreFuture<'_, usize>;

    /// Replace the record of `key` with `to` if its state is `from`
    /// (compare-and-set). Returns whether it did. Transitions the ledger does
    /// not allow are refused with an error.
    fn transition(&self, key: String, from: State, to: Record) -> StoreFuture<'_, bool> {
        self.transition_with(key, from, to, None)
    }

    /// [`Store::transition`], and when it moves, also store `outbox` (an
    /// id and audit entries as JSON) in the same commit. The audit log uses
    /// this to share the ledger's fsync for the entries that must be on disk
    /// before a dispatch: they are durable here, and the audit writer
    /// appends them to its own file and clears them once that file is
    /// fsynced; a crash in between is repaired at startup from here.
    fn transition_with(
        &self,
        key: String,
        from: State,
        to: Record,
        outbox: Option<(u64, String)>,
    ) -> StoreFuture<'_, bool> {
        self.transition_telling(key, from, to, outbox, Vec::new())
    }

    /// [`Store::transition_with`], and when it moves, queue `notices` (the
    /// events the move announces: a write whose answer was lost) in the
    /// same commit, durably.
    fn transition_telling(
        &self,
        key: String,
        from: State,
        to: Record,
        outbox: Option<(u64, String)>,
        notices: Vec<Notice>,
    ) -> StoreFuture<'_, bool>;

    /// The audit entries waiting in the outbox, by id.
    fn outbox(&self) -> StoreFuture<'_, Vec<(u64, String)>>;

    /// Forget outbox rows with ids up to `upto` (their entries are fsynced
    /// in the audit log). Not durable by itself. The request is made when
    /// this is called (awaiting only waits for its result), so a caller
    /// outside an async context may drop the future.
    fn outbox_clear(&self, upto: u64) -> StoreFuture<'_, usize>;

    /// At startup, before serving: free `reserved` keys, mark `dispatched`
    /// ones `unknown`.
    fn recover(&self) -> StoreFuture<'_, Recovery>;

    /// Forget records that no longer bind their key at `now_ms` (expired
    /// `complete`, and `not_dispatched`). `unknown` records stay until
    /// reconciled.
    fn gc(&self, now_ms: i64) -> StoreFuture<'_, usize>;

    /// All records, optionally only those in `state`.
    fn list(&self, state: Option<State>) -> StoreFuture<'_, Vec<(String, Record)>>;

    /// Keep `rows` of decision inputs (`[policy] inputs`, DESIGN.md section
    /// 22). Not durable: a crash may lose the last ones, which only makes a
    /// later `policy diff` see fewer calls.
    fn inputs_put(&self, rows: Vec<InputRow>) -> StoreFuture<'_, ()> {
        drop(rows);
        Box::pin(std::future::ready(Err(inputs_unsupported())))
    }

    /// Decision inputs from `since_ms` on, oldest first, of one tenant or
    /// of all.
    fn inputs_since(
        &self,
        since_ms: i64,
        tenant: Option<String>,
    ) -> StoreFuture<'_, Vec<InputRow>> {
        let _ = (since_ms, tenant);
        Box::pin(std::future::ready(Err(inputs_unsupported())))
    }

    /// Forget every decision input of `tenant`; returns how many.
    fn inputs_erase(&self, tenant: String) -> StoreFuture<'_, usize> {
        drop(tenant);
        Box::pin(std::future::ready(Err(inputs_unsupported())))
    }

    /// Forget decision inputs older than `before_ms`, then the oldest beyond
    /// `max_rows`; returns how many.
    fn inputs_gc(&self, before_ms: i64, max_rows: usize) -> StoreFuture<'_, usize> {
        let _ = (before_ms, max_rows);
        Box::pin(std::future::ready(Err(inputs_unsupported())))
    }

    /// Create `task` (revision 0), unless a task of the same requester
    /// still waits on the same proposal with the same key
    /// ([`tasks::joins`]): then that one is returned and nothing is written.
    /// Durable before it returns: the answer that names the task leaves
    /// after it (DESIGN.md section 24).
    fn task_create(&self, task: TaskRecord) -> StoreFuture<'_, TaskRecord> {
        drop(task);
        Box::pin(std::future::ready(Err(StoreError::NoTasks)))
    }

    /// A task by id (a read: never a write, however often a client polls).
    fn task_get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<TaskRecord>> {
        let _ = id;
        Box::pin(std::future::ready(Err(StoreError::NoTasks)))
    }

    /// The tasks `filter` selects.
    fn tasks(&self, filter: TaskFilter) -> StoreFuture<'_, Vec<TaskRecord>> {
        drop(filter);
        Box::pin(std::future::ready(Err(StoreError::NoTasks)))
    }

    /// Write `task` if the stored one is at the revision before
    /// `task.revision` (compare-and-set); returns whether it did. Durable
    /// before it returns. The execution claim and a cancel are two such
    /// writes from `waiting`: exactly one of them wins.
    fn task_put(&self, task: TaskRecord) -> StoreFuture<'_, bool> {
        drop(task);
        Box::pin(std::future::ready(Err(StoreError::NoTasks)))
    }

    /// Forget ended tasks last changed before `before_ms`; returns how many.
    fn tasks_gc(&self, before_ms: i64) -> StoreFuture<'_, usize> {
        let _ = before_ms;
        Box::pin(std::future::ready(Err(StoreError::NoTasks)))
    }
}

/// One call's decision inputs as the store keeps them: `key` orders them by
/// time (`{time_ms:020}-{unique}`), `inputs` is their JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputRow {
    pub key: String,
    pub tenant: String,
    pub time_ms: i64,
    pub inputs: String,
}

fn inputs_unsupported() -> StoreError {
    StoreError::Backend {
        op: "decision inputs",
        reason: "this store does not keep decision inputs".into(),
    }
}

/// Which of `rows` (sorted by key, oldest first) `inputs_gc` removes.
fn inputs_stale<'r>(
    rows: impl Iterator<Item = (&'r str, i64)> + Clone,
    before_ms: i64,
    max_rows: usize,
) -> Vec<String> {
    let total = rows.clone().count();
    let mut out = Vec::new();
    for (i, (key, time_ms)) in rows.enumerate() {
        // Old, or among the oldest beyond the cap.
        if time_ms < before_ms || total - i > max_rows {
            out.push(key.to_owned());
        }
    }
    out
}

/// Whether a proposal is in a final state that retention may forget.
fn proposal_final(p: &Proposal) -> bool {
    !matches!(p.state, ProposalState::Pending | ProposalState::Approved)
}

/// Whether writing a proposal in this state must be on disk when it returns:
/// a decision, or a pending one that holds reviewers' signed approvals or
/// denials.
fn proposal_durable(p: &Proposal) -> bool {
    matches!(p.state, ProposalState::Approved | ProposalState::Denied)
        || (p.state == ProposalState::Pending && (!p.approvals.is_empty() || !p.denials.is_empty()))
}

/// The compare of [`Store::put_proposal`]: `current` is the stored
/// proposal's (state, revision), if any.
fn proposal_expected(
    current: Option<(ProposalState, u64)>,
    expect: Option<ProposalState>,
    next: &Proposal,
) -> bool {
    match (current, expect) {
        (None, None) => true,
        (Some((state, revision)), Some(want)) => {
            state == want && revision.wrapping_add(1) == next.revision
        }
        _ => false,
    }
}

/// Whether a transition to `to` from `from` must be on disk when it returns.
fn needs_durability(from: State, to: State) -> bool {
    // `dispatched` before a byte goes upstream; an operator's reconciliation;
    // and the end of a dispatched call that the client is about to be told
    // (`complete` is replayed, `not_dispatched` says "safe to retry"): lost
    // in a crash, either would come back as `unknown`, contradicting an
    // answer already given.
    to == State::Dispatched
        || from == State::Unknown
        || (from == State::Dispatched && matches!(to, State::Complete | State::NotDispatched))
}

/// Refuse transitions the ledger does not allow, whatever the backend.
fn check_transition(from: State, to: State) -> Result<(), StoreError> {
    if crate::core::ledger::allowed(from, to) {
        Ok(())
    } else {
        Err(StoreError::Forbidden { from, to })
    }
}

#[cfg(test)]
pub(crate) mod tests;
