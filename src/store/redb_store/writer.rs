//! The writer thread: every write waits in its queue and leaves in a batch,
//! journaled (the write path, one `fdatasync` shared by the batch) or as a
//! redb transaction; what the journal holds is folded into redb by a
//! checkpoint.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use parking_lot::Mutex;
use redb::{Database, Durability};

use super::apply::{apply_batch, read};
use super::pending::{outbox_clear, outbox_rows, Effect, Pending};

use super::{decode, encode, err, guards, Done, Op, LEDGER, MAX_BATCH, OUTBOX};
use crate::core::ledger::{Record, State};
use crate::store::journal::{self, Frames, ItemRef, Journal};
use crate::store::{check_transition, dispatched_only, needs_durability, Reservation, StoreError};

/// How long non-durable commits may wait for an fsync when no durable commit
/// comes along to carry them.
pub(super) const IDLE_FLUSH: std::time::Duration = std::time::Duration::from_millis(100);

/// The journal is folded into redb once it holds this many bytes...
pub(super) const CHECKPOINT_BYTES: u64 = 1 << 20;
/// ... or changes to this many keys (bounds the memory of [`Pending`]).
pub(super) const CHECKPOINT_KEYS: usize = 4096;
/// While checkpoints fail, the journal grows: past this many bytes the
/// writer refuses writes (fail closed) rather than grow it without end.
pub(super) const JOURNAL_LIMIT: u64 = 64 * CHECKPOINT_BYTES;

/// The ledger writer thread's state.
pub(super) struct Writer<'a> {
    pub(super) db: &'a Database,
    pub(super) journal: Journal,
    pub(super) pending: &'a Mutex<Pending>,
    pub(super) shown: &'a AtomicBool,
    /// Frames appended since the journal's last fsync.
    pub(super) journal_unsynced: bool,
    /// redb commits made since its last fsync.
    pub(super) redb_unsynced: bool,
    /// A journal write or fsync failed: what the file holds is unknown, so
    /// every later operation fails (closed) until a restart replays it.
    pub(super) broken: Option<StoreError>,
    /// Tests: cut the power after this many more durable appends (0: never).
    pub(super) cut: &'a std::sync::atomic::AtomicU64,
    /// Tests: the broken dispatch order.
    pub(super) broken_order: &'a AtomicBool,
    /// The power was cut: the writer stops, syncing nothing.
    pub(super) halted: bool,
    /// The guards' changes waiting for their call's dispatch.
    pub(super) guards: &'a Mutex<guards::Memory>,
}

/// Where the journal is: its file beside the database, or (tests of power
/// loss) a simulated disk.
pub(in crate::store) enum JournalAt {
    File,
    #[cfg(test)]
    Disk(Arc<super::power::Disk>),
}

/// What the writer shares with the store beside its queue.
pub(super) struct Limits {
    /// Tests: cut the power after this many more durable appends (0: never).
    pub(super) cut: Arc<std::sync::atomic::AtomicU64>,
    /// Set while the writer refuses writes.
    pub(super) refusing: Arc<AtomicBool>,
    /// The journal's bound, in bytes.
    pub(super) journal: Arc<std::sync::atomic::AtomicU64>,
    /// A checkpoint is made once the journal holds this many bytes.
    pub(super) checkpoint: Arc<std::sync::atomic::AtomicU64>,
    /// Tests: append a dispatch before fsyncing redb's commit (the order
    /// the power-loss property test must catch). Never set otherwise.
    pub(super) broken_order: Arc<AtomicBool>,
    /// The guards' rows in memory, with the changes of calls not yet
    /// dispatched (journaled with their `dispatched` record).
    pub(super) guards: Arc<Mutex<guards::Memory>>,
}

pub(super) fn start(
    db: &Database,
    rx: &mpsc::Receiver<Op>,
    shown: &AtomicBool,
    pending: &Mutex<Pending>,
    journal: Journal,
    crash: &AtomicBool,
    limits: &Limits,
) {
    let mut w = Writer {
        db,
        journal,
        pending,
        shown,
        journal_unsynced: false,
        redb_unsynced: false,
        broken: None,
        cut: &limits.cut,
        broken_order: &limits.broken_order,
        guards: &limits.guards,
        halted: false,
    };
    loop {
        let first = if w.unsynced() {
            match rx.recv_timeout(IDLE_FLUSH) {
                Ok(op) => op,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    w.flush();
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        } else {
            match rx.recv() {
                Ok(op) => op,
                Err(_) => break,
            }
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        w.run(batch);
        if w.halted {
            return;
        }
        let keys = w.pending.lock().ledger.len();
        let at = limits.checkpoint.load(Ordering::Acquire);
        if w.broken.is_none() && (w.journal.len() >= at || keys >= CHECKPOINT_KEYS) {
            if let Err(e) = w.checkpoint(&[]) {
                tracing::error!("ledger checkpoint failed: {e}");
                // Fail closed: a journal that cannot be folded into the
                // database would otherwise grow until the disk is full.
                let limit = limits.journal.load(Ordering::Acquire);
                if w.broken.is_none() && w.journal.len() >= limit {
                    w.broken = Some(StoreError::Backend {
                        op: "ledger checkpoint",
                        reason: format!(
                            "the journal holds {} bytes and folding it into the database keeps failing ({e}): \
                             writes are refused until the gateway restarts on a working disk (reads go on)",
                            w.journal.len()
                        ),
                        cause: Some(crate::store::Cause::new(e)),
                    });
                }
            }
        }
        if w.broken.is_some() && !limits.refusing.swap(true, Ordering::AcqRel) {
            tracing::error!(
                "the ledger refuses writes: {}",
                w.broken
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default()
            );
        }
    }
    if crash.load(Ordering::Acquire) {
        return;
    }
    // A clean stop leaves everything in redb and an empty journal.
    if w.broken.is_none() {
        if let Err(e) = w.checkpoint(&[]) {
            tracing::error!("ledger checkpoint at shutdown failed: {e}");
        }
    }
    w.flush();
}

impl Writer<'_> {
    fn unsynced(&self) -> bool {
        self.journal_unsynced || self.redb_unsynced
    }

    fn show(&self) {
        self.shown.store(self.unsynced(), Ordering::Release);
    }

    /// fsync what waits for it (the idle flush).
    fn flush(&mut self) {
        if self.journal_unsynced && self.broken.is_none() {
            match self.journal.sync() {
                Ok(()) => self.journal_unsynced = false,
                Err(e) => {
                    tracing::error!("ledger journal flush failed: {e}");
                    self.broken = Some(e);
                }
            }
        }
        if self.redb_unsynced && flush(self.db) {
            self.redb_unsynced = false;
        }
        self.show();
    }

    /// Apply `batch` and answer each of its callers.
    fn run(&mut self, batch: Vec<Op>) {
        let result = match &self.broken {
            Some(e) => Err(e.clone()),
            None if batch.iter().all(Op::journaled) => self.journaled(&batch),
            None => self.committed(&batch),
        };
        // Shown before any caller is answered: whoever saw its change
        // answered can tell whether it is on disk yet.
        self.show();
        match result {
            Ok(done) => reply(batch, done),
            Err(e) => {
                tracing::error!("ledger write failed: {e}");
                fail(batch, &e);
            }
        }
    }

    /// The record of `key` as this batch sees it: its own earlier changes,
    /// then [`Pending`], then redb.
    fn current(
        &self,
        effects: &[Effect],
        view: &mut Option<redb::ReadTransaction>,
        key: &str,
    ) -> Result<Option<Record>, StoreError> {
        for e in effects.iter().rev() {
            if let Effect::Put(k, r) = e {
                if k == key {
                    return Ok(Some(r.clone()));
                }
            }
        }
        if let Some(r) = self.pending.lock().ledger.get(key) {
            return Ok(Some(r.clone()));
        }
        let txn = match view {
            Some(t) => t,
            None => view.insert(
                self.db
                    .begin_read()
                    .map_err(|e| err("begin read")(e.into()))?,
            ),
        };
        let table = txn
            .open_table(LEDGER)
            .map_err(|e| err("open table")(e.into()))?;
        read(&table, key)
    }

    /// The outbox rows as this batch sees them.
    fn outbox_now(
        &self,
        effects: &[Effect],
        view: &mut Option<redb::ReadTransaction>,
    ) -> Result<BTreeMap<u64, String>, StoreError> {
        let pending = self.pending.lock().outbox_only();
        let txn = match view {
            Some(t) => t,
            None => view.insert(
                self.db
                    .begin_read()
                    .map_err(|e| err("begin read")(e.into()))?,
            ),
        };
        let mut rows = outbox_rows(txn, &pending)?;
        for e in effects {
            match e {
                Effect::Outbox(id, text) => {
                    rows.insert(*id, text.clone());
                }
                Effect::Clear(upto) => rows.retain(|id, _| id > upto),
                Effect::Put(..) | Effect::Guards(_) => {}
            }
        }
        Ok(rows)
    }

    /// A batch of the write path's ledger changes, through the journal: one
    /// append, and one fsync when an operation needs it.
    fn journaled(&mut self, batch: &[Op]) -> Result<Vec<Done>, StoreError> {
        let generation = self.journal.generation();
        let mut effects = Vec::new();
        let mut frames = Frames::default();
        let mut view = None;
        let mut durable = false;
        let mut done = Vec::with_capacity(batch.len());
        for op in batch {
            done.push(match op {
                Op::Reserve {
                    key,
                    record,
                    now_ms,
                    ..
                } => Done::Reserve(self.current(&effects, &mut view, key).map(|cur| {
                    match cur.filter(|r| r.binds(*now_ms)) {
                        Some(existing) => Reservation::Bound(existing),
                        None => {
                            // Not journaled: a reservation is lost to a crash
                            // anyway (recovery frees reserved keys).
                            effects.push(Effect::Put(key.clone(), record.clone()));
                            Reservation::Reserved
                        }
                    }
                })),
                Op::Transition {
                    key,
                    from,
                    to,
                    outbox,
                    ..
                } => Done::Transition((|| {
                    check_transition(*from, to.state)?;
                    match self.current(&effects, &mut view, key)? {
                        Some(cur) if cur.state == *from => {}
                        _ => return Ok(false),
                    }
                    let bytes = encode(to)?;
                    let mut items = vec![ItemRef::Record { key, bytes: &bytes }];
                    // INVARIANT: the outbox row is in the same frame as the
                    // move it records: both apply, or neither.
                    if let Some((id, text)) = outbox {
                        items.push(ItemRef::Outbox { id: *id, text });
                    }
                    // INVARIANT: what a call took of its guards is in the
                    // frame of its `dispatched`: spent once sent, and never
                    // durable for a call that was not.
                    let taken = match to.state {
                        State::Dispatched => self.guards.lock().unsent(key),
                        _ => None,
                    };
                    let taken_bytes = taken.as_deref().map(guards::encode).transpose()?;
                    if let Some(g) = &taken_bytes {
                        items.push(ItemRef::Guards { bytes: g });
                    }
                    frames.push(generation, &items);
                    if let Some(g) = taken {
                        effects.push(Effect::Guards(g));
                    }
                    durable |= needs_durability(*from, to.state);
                    effects.push(Effect::Put(key.clone(), to.clone()));
                    if let Some((id, text)) = outbox {
                        effects.push(Effect::Outbox(*id, text.clone()));
                    }
                    Ok(true)
                })()),
                Op::Claim {
                    key,
                    record,
                    now_ms,
                    outbox,
                    ..
                } => Done::Transition((|| {
                    dispatched_only(record)?;
                    let held = self
                        .current(&effects, &mut view, key)?
                        .is_some_and(|r| r.binds(*now_ms));
                    if held {
                        return Ok(false);
                    }
                    let bytes = encode(record)?;
                    let mut items = vec![ItemRef::Record { key, bytes: &bytes }];
                    // INVARIANT: the outbox row is in the same frame as the
                    // claim it records: both apply, or neither.
                    if let Some((id, text)) = outbox {
                        items.push(ItemRef::Outbox { id: *id, text });
                    }
                    frames.push(generation, &items);
                    durable = true;
                    effects.push(Effect::Put(key.clone(), record.clone()));
                    if let Some((id, text)) = outbox {
                        effects.push(Effect::Outbox(*id, text.clone()));
                    }
                    Ok(true)
                })()),
                Op::OutboxClear { upto, .. } => {
                    Done::Gc(self.outbox_now(&effects, &mut view).map(|rows| {
                        frames.push(generation, &[ItemRef::Clear { upto: *upto }]);
                        effects.push(Effect::Clear(*upto));
                        rows.range(..=*upto).count()
                    }))
                }
                _ => Done::Gc(Err(StoreError::Backend {
                    op: "ledger journal",
                    reason: "an operation the journal does not take".into(),
                    cause: None,
                })),
            });
        }
        drop(view);
        if let Err(e) = self.write(&frames, durable) {
            self.broken = Some(e.clone());
            return Err(e);
        }
        self.pending.lock().apply(effects);
        Ok(done)
    }

    /// When `durable`, fsync what redb committed before; then append
    /// `frames`, and when `durable`, fsync them.
    fn write(&mut self, frames: &Frames, durable: bool) -> Result<(), StoreError> {
        // INVARIANT: what redb committed before this batch (an approval
        // consumed with its reservation) is on disk before the `dispatched`
        // it led to is even handed to the OS. The OS writes appended pages
        // back whenever it likes: had the frame been appended first, a power
        // cut before redb's fsync could keep the dispatch and lose the
        // consumption, and the approval would run the call again under a
        // fresh key.
        let broken_order = self.broken_order.load(Ordering::Relaxed);
        if durable && self.redb_unsynced && !broken_order {
            self.flush_redb()?;
        }
        if !frames.is_empty() {
            self.journal.append(frames)?;
            self.journal_unsynced = true;
            if durable {
                match self.cut.load(Ordering::Acquire) {
                    0 => {}
                    1 => {
                        self.halted = true;
                        return Err(StoreError::WriterStopped);
                    }
                    n => self.cut.store(n - 1, Ordering::Release),
                }
            }
        }
        if durable && self.redb_unsynced {
            // Only in tests of the broken order: the fsync comes too late.
            self.flush_redb()?;
        }
        if durable {
            // INVARIANT: a batch holding a `dispatched` (or the end of a
            // dispatched call) is fsynced before any of its callers is
            // answered.
            if self.journal_unsynced {
                self.journal.sync()?;
                self.journal_unsynced = false;
            }
        }
        Ok(())
    }

    /// fsync what redb committed without durability.
    fn flush_redb(&mut self) -> Result<(), StoreError> {
        if !flush(self.db) {
            return Err(StoreError::Backend {
                op: "ledger flush",
                reason: "the fsync before a dispatch failed".into(),
                cause: None,
            });
        }
        self.redb_unsynced = false;
        Ok(())
    }

    /// A batch that needs redb's tables (approvals, proposals, pins,
    /// notifications, collection): one transaction. When it reads or writes
    /// the ledger, [`Pending`] is folded into the same transaction first.
    fn committed(&mut self, batch: &[Op]) -> Result<Vec<Done>, StoreError> {
        if batch.iter().any(Op::touches_ledger) && !self.pending.lock().is_empty() {
            return self.checkpoint(batch);
        }
        let durable = batch.iter().any(Op::durable);
        let done = apply_batch(self.db, batch, durable, None, self.guards)?;
        self.redb_unsynced = !durable;
        Ok(done)
    }

    /// Fold [`Pending`] into redb, then apply `batch`, in one durable
    /// transaction that also starts the journal's next generation; then
    /// empty the journal.
    fn checkpoint(&mut self, batch: &[Op]) -> Result<Vec<Done>, StoreError> {
        let snapshot = self.pending.lock().clone();
        let next = self.journal.generation() + 1;
        let done = apply_batch(self.db, batch, true, Some((&snapshot, next)), self.guards)?;
        self.redb_unsynced = false;
        // The journal's content is in redb now (the writer alone changes
        // `Pending`, so the snapshot was all of it).
        *self.pending.lock() = Pending::default();
        if let Err(e) = self.journal.reset(next) {
            self.broken = Some(e.clone());
            return Err(e);
        }
        self.journal_unsynced = false;
        Ok(done)
    }
}

pub(super) fn reply(batch: Vec<Op>, done: Vec<Done>) {
    for (op, d) in batch.into_iter().zip(done) {
        match (op, d) {
            (Op::Reserve { reply, .. }, Done::Reserve(r)) => drop(reply.send(r)),
            (Op::Transition { reply, .. } | Op::Claim { reply, .. }, Done::Transition(r)) => {
                drop(reply.send(r))
            }
            (
                Op::Gc { reply, .. }
                | Op::GcProposals { reply, .. }
                | Op::OutboxClear { reply, .. },
                Done::Gc(r),
            ) => drop(reply.send(r)),
            (Op::PutProposal { reply, .. }, Done::Transition(r)) => drop(reply.send(r)),
            (Op::Pin { reply, .. } | Op::Checkpoint { reply, .. }, Done::Gc(r)) => {
                drop(reply.send(r))
            }
            _ => {}
        }
    }
}

/// The whole batch failed: nothing of it happened.
pub(super) fn fail(batch: Vec<Op>, e: &StoreError) {
    for op in batch {
        match op {
            Op::Reserve { reply, .. } => drop(reply.send(Err(e.clone()))),
            Op::Transition { reply, .. } | Op::Claim { reply, .. } => {
                drop(reply.send(Err(e.clone())))
            }
            Op::Gc { reply, .. }
            | Op::GcProposals { reply, .. }
            | Op::OutboxClear { reply, .. } => drop(reply.send(Err(e.clone()))),
            Op::PutProposal { reply, .. } => drop(reply.send(Err(e.clone()))),
            Op::Pin { reply, .. } | Op::Checkpoint { reply, .. } => {
                drop(reply.send(Err(e.clone())))
            }
        }
    }
}

/// An empty durable commit: fsyncs every non-durable commit before it.
/// Returns whether it succeeded.
pub(super) fn flush(db: &Database) -> bool {
    let result = match db.begin_write() {
        Ok(mut txn) => {
            txn.set_durability(Durability::Immediate);
            txn.commit().map_err(|e| e.to_string())
        }
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = &result {
        tracing::error!("ledger flush failed: {e}");
    }
    result.is_ok()
}

/// Apply a journal's items, in order, in `txn`.
pub(super) fn replay(
    txn: &redb::WriteTransaction,
    items: Vec<journal::Item>,
) -> Result<(), StoreError> {
    if items.is_empty() {
        return Ok(());
    }
    let mut ledger = txn
        .open_table(LEDGER)
        .map_err(|e| err("open table")(e.into()))?;
    let mut outbox = txn
        .open_table(OUTBOX)
        .map_err(|e| err("open table")(e.into()))?;
    for item in items {
        match item {
            journal::Item::Record { key, bytes } => {
                // Checked before it is trusted: a record that does not decode
                // fails the open instead of failing a later lookup.
                decode(&bytes)?;
                ledger
                    .insert(key.as_str(), bytes.as_slice())
                    .map_err(|e| err("write")(e.into()))?;
            }
            journal::Item::Outbox { id, text } => {
                outbox
                    .insert(id, text.as_str())
                    .map_err(|e| err("write")(e.into()))?;
            }
            journal::Item::Clear { upto } => {
                outbox_clear(&mut outbox, upto)?;
            }
            journal::Item::Guards { bytes } => {
                guards::fold(txn, &[guards::decode(&bytes)?], &guards::Pruned::default())?
            }
        }
    }
    Ok(())
}
