//! Durable storage: the idempotency ledger and everything else a gateway keeps.
//!
//! One trait per capability, each with what its calls guarantee when they
//! return: [`Ledger`] (idempotency keys), [`Proposals`], [`Outbox`]
//! (webhook notices and the audit outbox), [`Seen`] (first-use pins,
//! single-use nonces), [`Inputs`] (decision inputs), [`Tasks`],
//! [`guards::Guards`] (budgets and effect keys) and
//! [`console::ConsoleState`]. [`Store`] is all of them at once, and has
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
//! - [`Ledger::reserve`]: atomic, **not** necessarily durable. A reservation
//!   lost in a crash means nothing was sent, and recovery would have freed
//!   the key anyway.
//! - [`Ledger::transition`] to `dispatched`: **durable** (fsync) before the
//!   future resolves. The relay writes nothing upstream before that.
//! - [`Ledger::transition`] out of `unknown` (reconciliation): durable.
//! - [`Ledger::transition`] from `dispatched` to `complete` or
//!   `not_dispatched`: **durable** before the future resolves, because the
//!   client is told the answer (or "safe to retry") right after: a crash must
//!   not turn what it was told into `unknown`. Concurrent calls share the
//!   fsync (group commit).
//! - Other transitions (`dispatched → unknown`, anything from `reserved`) and
//!   reservations: atomic and visible at once, durable with the next durable
//!   commit (redb: at most 100 ms later). If a crash drops one, recovery
//!   reaches the same state (`unknown`, or the key freed).
//! - [`Ledger::recover`] (at startup): `reserved` → removed, `dispatched` →
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
pub mod inputs;
mod journal;
pub mod ledger;
mod memory;
pub mod outbox;
pub mod postgres;
pub mod private;
pub mod proposals;
mod redb_store;
pub mod seen;
pub mod tasks;

use std::future::Future;
use std::pin::Pin;

pub use inputs::{InputRow, Inputs};
pub use ledger::{Ledger, Recovery, Reservation};
pub use memory::MemoryStore;
pub use outbox::{Outbox, Settle};
pub use postgres::PgStore;
pub use proposals::Proposals;
pub use redb_store::RedbStore;
pub use seen::Seen;
pub use tasks::{TaskFilter, Tasks};

use crate::core::ledger::State;
// The rules every backend keeps the same way, where the backends find them.
use inputs::inputs_stale;
use ledger::{check_transition, dispatched_only, needs_durability};
use outbox::{due, settled};
use proposals::{proposal_durable, proposal_expected, proposal_final};

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
        /// The database's own error, when there is one: kept, not only
        /// its text (`reason` repeats it for logs that print one line).
        #[source]
        cause: Option<Cause>,
    },
    /// The ledger file could not be opened.
    #[error("ledger store: cannot open `{path}`: {reason}")]
    Open {
        /// The file or its directory.
        path: String,
        /// Why, and what to do.
        reason: String,
        /// The error it comes from, when there is one.
        #[source]
        cause: Option<Cause>,
    },
    /// A value could not be encoded for storage.
    #[error("ledger store: cannot encode a {what}: {reason}")]
    Encode {
        /// `record` or `proposal`.
        what: &'static str,
        /// Why.
        reason: String,
        /// The error it comes from, when there is one.
        #[source]
        cause: Option<Cause>,
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
        /// The error it comes from, when there is one.
        #[source]
        cause: Option<Cause>,
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
    /// This gateway's lease on the shared ledger has lapsed (it was paused,
    /// or cut off from the database, longer than the lease): it dispatches
    /// nothing until it has renewed it.
    #[error("ledger store: this gateway's lease has lapsed; nothing was dispatched")]
    Fenced,
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

/// The error a store error comes from, kept with it: shared, so that an
/// error a whole batch of calls shares stays `Clone`, and compared by its
/// text (two errors of the database are the same failure when they say the
/// same).
#[derive(Debug, Clone)]
pub struct Cause(std::sync::Arc<dyn std::error::Error + Send + Sync>);

impl Cause {
    /// Keep `e`.
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> Cause {
        Cause(std::sync::Arc::new(e))
    }

    /// The error kept, if it is an `E`.
    pub fn downcast_ref<E: std::error::Error + 'static>(&self) -> Option<&E> {
        self.0.downcast_ref::<E>()
    }
}

impl StoreError {
    /// Whether the store's file is open in another process (a gateway
    /// running on the same redb data dir holds its lock).
    pub fn held_elsewhere(&self) -> bool {
        matches!(self, StoreError::Open { cause: Some(c), .. }
            if matches!(c.downcast_ref::<redb::DatabaseError>(), Some(redb::DatabaseError::DatabaseAlreadyOpen)))
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for Cause {
    fn eq(&self, other: &Cause) -> bool {
        self.to_string() == other.to_string()
    }
}

impl Eq for Cause {}

impl StoreError {
    /// A failure of the database in `op`, with its error kept as the cause.
    pub fn backend(
        op: &'static str,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> StoreError {
        StoreError::Backend {
            op,
            reason: e.to_string(),
            cause: Some(Cause::new(e)),
        }
    }
}

/// A future returned by the store.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

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

/// Everything a gateway keeps: one trait per capability, and what the
/// store as a whole answers (its changes, its health). Keys of the ledger
/// are [`crate::core::ledger::storage_key`]s.
pub trait Store:
    Ledger
    + Proposals
    + Outbox
    + Seen
    + Inputs
    + Tasks
    + guards::Guards
    + console::ConsoleState
    + Send
    + Sync
{
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
}

#[cfg(test)]
pub(crate) mod tests;
