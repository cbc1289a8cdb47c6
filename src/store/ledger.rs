//! The idempotency ledger: one record per key, reserved, dispatched and
//! settled by compare-and-set (the durability contract is in the
//! [module documentation](super)).

use super::{StoreError, StoreFuture};
use crate::core::approval::ProposalState;
use crate::core::ledger::{Record, State};
use crate::core::notify::Notice;

/// The outcome of [`Ledger::reserve`].
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

/// What [`Ledger::recover`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// `reserved` records removed (never sent).
    pub freed: usize,
    /// `dispatched` records turned `unknown` (sent, answer lost in the crash).
    pub unknown: usize,
}

/// The ledger of idempotency keys.
pub trait Ledger: Send + Sync {
    /// The record of `key`, if any (reads never fsync). Reads are futures
    /// too: a networked store answers them with a round trip.
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>>;

    /// Atomically claim `key` with `record` (state `reserved`) if no record
    /// binds it at `now_ms` (see [`Record::binds`]); otherwise return the
    /// binding record and write nothing.
    fn reserve(&self, key: String, record: Record, now_ms: i64) -> StoreFuture<'_, Reservation> {
        self.reserve_with(key, record, now_ms, None)
    }

    /// [`Ledger::reserve`], and when `approval` names a proposal, consume it
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

    /// Claim `key` straight as `dispatched` with `record` (its state
    /// `dispatched`), and store `outbox` with it, in one durable commit:
    /// the reservation and the dispatch of a call that has no approval to
    /// consume and no guards to take, which nothing needs to see between
    /// the two. `false` when a record holds the key (written since the
    /// caller's lookup found none, by another process sharing the store):
    /// nothing was written, and the caller looks again. A store may also
    /// answer `false` for a record that no longer binds the key; the caller
    /// then takes the long way ([`Ledger::reserve_with`], then the move to
    /// `dispatched`).
    ///
    /// By default the two steps in turn, the key freed again if the second
    /// fails: one commit less only where a store fuses them.
    fn reserve_dispatched(
        &self,
        key: String,
        record: Record,
        now_ms: i64,
        outbox: Option<(u64, String)>,
    ) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            dispatched_only(&record)?;
            let mut reserved = record.clone();
            reserved.state = State::Reserved;
            if self.reserve(key.clone(), reserved.clone(), now_ms).await? != Reservation::Reserved {
                return Ok(false);
            }
            let moved = self
                .transition_with(key.clone(), State::Reserved, record, outbox)
                .await;
            if !matches!(moved, Ok(true)) {
                // Nothing was dispatched: free the key (a failure here
                // leaves it `reserved`, which recovery frees).
                let mut freed = reserved;
                freed.state = State::NotDispatched;
                let _ = self.transition(key.clone(), State::Reserved, freed).await;
            }
            match moved {
                Ok(true) => Ok(true),
                Ok(false) => Err(StoreError::Raced(key)),
                Err(e) => Err(e),
            }
        })
    }

    /// Replace the record of `key` with `to` if its state is `from`
    /// (compare-and-set). Returns whether it did. Transitions the ledger does
    /// not allow are refused with an error.
    fn transition(&self, key: String, from: State, to: Record) -> StoreFuture<'_, bool> {
        self.transition_with(key, from, to, None)
    }

    /// [`Ledger::transition`], and when it moves, also store `outbox` (an
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

    /// [`Ledger::transition_with`], and when it moves, queue `notices` (the
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

    /// At startup, before serving: free `reserved` keys, mark `dispatched`
    /// ones `unknown`.
    fn recover(&self) -> StoreFuture<'_, Recovery>;

    /// Forget records that no longer bind their key at `now_ms` (expired
    /// `complete`, and `not_dispatched`). `unknown` records stay until
    /// reconciled.
    fn gc(&self, now_ms: i64) -> StoreFuture<'_, usize>;

    /// All records, optionally only those in `state`.
    fn list(&self, state: Option<State>) -> StoreFuture<'_, Vec<(String, Record)>>;

    /// This process waits for `key`, which another process holds, to
    /// settle: its settlement is to be announced to it
    /// ([`super::StoreEvent::Ledger`]). A store shared by processes
    /// announces a settled record only to those that wait on it, so that N
    /// gateways do not each hear every write; a store of one process
    /// announces every settlement and needs nothing. After this, the caller
    /// reads the record again (it may have settled before), and calls
    /// [`Ledger::waited`] when it stops waiting.
    fn wait_for(&self, key: String) -> StoreFuture<'_, ()> {
        let _ = key;
        Box::pin(async { Ok(()) })
    }

    /// This process no longer waits on `key` (see [`Ledger::wait_for`]).
    fn waited(&self, key: String) -> StoreFuture<'_, ()> {
        let _ = key;
        Box::pin(async { Ok(()) })
    }
}

/// Whether a transition to `to` from `from` must be on disk when it returns.
pub(super) fn needs_durability(from: State, to: State) -> bool {
    // `dispatched` before a byte goes upstream; an operator's reconciliation;
    // and the end of a dispatched call that the client is about to be told
    // (`complete` is replayed, `not_dispatched` says "safe to retry"): lost
    // in a crash, either would come back as `unknown`, contradicting an
    // answer already given.
    to == State::Dispatched
        || from == State::Unknown
        || (from == State::Dispatched && matches!(to, State::Complete | State::NotDispatched))
}

/// A record claimed straight as `dispatched` must say so: anything else is
/// the move `reserved → that`, which [`Ledger::reserve_dispatched`] does
/// not make.
pub(super) fn dispatched_only(record: &Record) -> Result<(), StoreError> {
    if record.state == State::Dispatched {
        Ok(())
    } else {
        Err(StoreError::Forbidden {
            from: State::Reserved,
            to: record.state,
        })
    }
}

/// Refuse transitions the ledger does not allow, whatever the backend.
pub(super) fn check_transition(from: State, to: State) -> Result<(), StoreError> {
    if crate::core::ledger::allowed(from, to) {
        Ok(())
    } else {
        Err(StoreError::Forbidden { from, to })
    }
}
