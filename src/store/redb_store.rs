//! The embedded ledger store: redb (ACID, copy-on-write B-trees, fsync on
//! durable commit, one process at a time per file), with a journal in front
//! of it for the write path (see [`super::journal`]).
//!
//! All writes go through one writer thread, which takes every operation
//! waiting in its queue into one batch: concurrent dispatches share one fsync
//! (group commit), and a batch is durable only if one of its operations needs
//! it. The write path's ledger changes (reservations, moves, audit outbox
//! rows) go to the journal: one frame per batch, `fdatasync`ed for a
//! `dispatched` or the end of a dispatched call. Everything else (approvals,
//! proposals, pins, notifications, collection) is a redb transaction, with
//! the journal folded into it first when it reads the ledger. Non-durable
//! changes are fsynced by the next durable one, or by an idle flush at most
//! 100 ms later. Reads look at the writer's changes not yet in redb, then
//! use their own read transactions, and never wait for the writer.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use parking_lot::Mutex;
use redb::{Database, Durability, ReadableTable, TableDefinition};
use tokio::sync::oneshot;

use super::journal::{self, Frames, ItemRef, Journal};

mod console;
mod guards;
#[cfg(test)]
pub(super) mod power;
mod proposals;

/// The indexes of proposals, by requester and open (a test deletes them, as
/// a ledger made before them lacks them).
#[cfg(test)]
pub(super) fn proposals_index_for_tests() -> [TableDefinition<'static, &'static str, ()>; 2] {
    [proposals::BY_REQUESTER, proposals::OPEN]
}
mod tasks;

use super::{
    check_transition, inputs_stale, needs_durability, proposal_durable, InputRow, Recovery,
    Reservation, Settle, Store, StoreError, StoreFuture,
};
use crate::core::approval::{self, Proposal, ProposalState};
use crate::core::ledger::{Record, State};
use crate::core::notify::{Notice, WebhookStatus};

const LEDGER: TableDefinition<&str, &[u8]> = TableDefinition::new("ledger");
/// Approval proposals, in the same database: consuming an approval and
/// reserving a key commit in one transaction.
const PROPOSALS: TableDefinition<&str, &[u8]> = TableDefinition::new("proposals");
/// Audit entries committed with a dispatch (see [`Store::transition_with`]).
const OUTBOX: TableDefinition<u64, &str> = TableDefinition::new("audit_outbox");
/// Tool definitions pinned on first use (see [`Store::pin_first_use`]).
const PINS: TableDefinition<&str, &str> = TableDefinition::new("tool_pins");
/// Notifications waiting for delivery (or given up), by `EVENT/WEBHOOK`.
const NOTICES: TableDefinition<&str, &[u8]> = TableDefinition::new("notices");
/// Each webhook's delivery status, by name.
const NOTIFY: TableDefinition<&str, &[u8]> = TableDefinition::new("notify_status");
/// Nonces of signed control requests, and until when (unix ms) each is kept.
const NONCES: TableDefinition<&str, i64> = TableDefinition::new("used_nonces");
/// Decision inputs (`[policy] inputs`) by `{time_ms:020}-{unique}`: the
/// row's tenant and JSON, as `{tenant's length}:{tenant}{json}` (a tenant
/// comes from a token's claim: any text).
const INPUTS: TableDefinition<&str, &str> = TableDefinition::new("decision_inputs");
/// The store's own bookkeeping: the journal's generation.
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// Tasks by id, as JSON (DESIGN.md section 24).
const TASKS: TableDefinition<&str, &[u8]> = TableDefinition::new("tasks");
/// The ids of the tasks that have not ended, each with the proposal it
/// waits on (empty for none): the runner's sweep reads these, never the
/// ended tasks kept for their requesters.
const OPEN_TASKS: TableDefinition<&str, &str> = TableDefinition::new("open_tasks");
const JOURNAL_GENERATION: &str = "journal_generation";

/// Most operations folded into one write transaction.
const MAX_BATCH: usize = 256;

enum Op {
    Reserve {
        key: String,
        record: Record,
        now_ms: i64,
        approval: Option<String>,
        reply: oneshot::Sender<Result<Reservation, StoreError>>,
    },
    PutProposal {
        proposal: Box<Proposal>,
        expect: Option<ProposalState>,
        /// Queued in the same commit when the proposal is written.
        notices: Vec<Notice>,
        reply: oneshot::Sender<Result<bool, StoreError>>,
    },
    GcProposals {
        before_ms: i64,
        reply: oneshot::Sender<Result<usize, StoreError>>,
    },
    Transition {
        key: String,
        from: State,
        to: Record,
        outbox: Option<(u64, String)>,
        /// Queued in the same commit when the record moves.
        notices: Vec<Notice>,
        reply: oneshot::Sender<Result<bool, StoreError>>,
    },
    OutboxClear {
        upto: u64,
        reply: oneshot::Sender<Result<usize, StoreError>>,
    },
    Gc {
        now_ms: i64,
        reply: oneshot::Sender<Result<usize, StoreError>>,
    },
    Pin {
        pins: Vec<(String, String)>,
        reply: oneshot::Sender<Result<usize, StoreError>>,
    },
    /// Fold the journal into redb now (before a scan of redb's ledger).
    Checkpoint {
        reply: oneshot::Sender<Result<usize, StoreError>>,
    },
}

impl Op {
    /// Whether the journal takes it (the write path's ledger changes):
    /// otherwise it needs redb's tables in one transaction.
    fn journaled(&self) -> bool {
        match self {
            Op::Reserve { approval, .. } => approval.is_none(),
            Op::Transition { notices, .. } => notices.is_empty(),
            Op::OutboxClear { .. } => true,
            Op::PutProposal { .. }
            | Op::GcProposals { .. }
            | Op::Gc { .. }
            | Op::Pin { .. }
            | Op::Checkpoint { .. } => false,
        }
    }

    /// Whether it reads or writes the ledger or the outbox.
    fn touches_ledger(&self) -> bool {
        match self {
            Op::Reserve { .. }
            | Op::Transition { .. }
            | Op::OutboxClear { .. }
            | Op::Gc { .. }
            | Op::Checkpoint { .. } => true,
            Op::PutProposal { .. } | Op::GcProposals { .. } | Op::Pin { .. } => false,
        }
    }

    fn durable(&self) -> bool {
        match self {
            // A notification is queued durably with what it announces.
            Op::Transition {
                from, to, notices, ..
            } => needs_durability(*from, to.state) || !notices.is_empty(),
            // A notification is queued durably with what it announces.
            Op::PutProposal {
                proposal, notices, ..
            } => proposal_durable(proposal) || !notices.is_empty(),
            // A pin is what later definitions are judged against: losing it
            // to a crash would let the next run trust a changed tool.
            Op::Pin { .. } => true,
            Op::Reserve { .. }
            | Op::Gc { .. }
            | Op::GcProposals { .. }
            | Op::OutboxClear { .. }
            | Op::Checkpoint { .. } => false,
        }
    }
}

/// What one operation produced inside a batch.
enum Done {
    Reserve(Result<Reservation, StoreError>),
    Transition(Result<bool, StoreError>),
    Gc(Result<usize, StoreError>),
}

fn encode_notice(n: &Notice) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(n).map_err(|e| StoreError::Encode {
        what: "notice",
        reason: e.to_string(),
    })
}

fn decode_json<T: serde::de::DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        what,
        reason: e.to_string(),
    })
}

fn encode_proposal(p: &Proposal) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(p).map_err(|e| StoreError::Encode {
        what: "proposal",
        reason: e.to_string(),
    })
}

fn decode_proposal(bytes: &[u8]) -> Result<Proposal, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        what: "proposal",
        reason: e.to_string(),
    })
}

/// The redb-backed ledger.
pub struct RedbStore {
    db: Arc<Database>,
    // `mpsc::Sender` is `Sync`: every caller enqueues on the same writer.
    // Options only so that `Drop` can close the queue and join the writer,
    // releasing the file lock before `drop` returns.
    queue: Option<mpsc::Sender<Op>>,
    writer: Option<std::thread::JoinHandle<()>>,
    /// Set by the writer while commits since the last fsync wait for one.
    dirty: Arc<AtomicBool>,
    /// The writer's changes not yet in redb (see [`Pending`]).
    pending: Arc<Mutex<Pending>>,
    /// Set to stop the writer as a crash would: without the checkpoint and
    /// the flush of a clean stop (tests of the journal's replay).
    #[cfg_attr(not(test), expect(dead_code, reason = "set by tests only"))]
    crash: Arc<AtomicBool>,
    /// Tests: the power goes out right after the next durable frame is
    /// handed to the OS (see [`RedbStore::cut_after_durable_appends`]).
    #[cfg_attr(not(test), expect(dead_code, reason = "set by tests only"))]
    cut: Arc<std::sync::atomic::AtomicU64>,
    /// The writer refuses writes (see [`Store::refusing_writes`]).
    refusing: Arc<AtomicBool>,
    /// The journal's bound ([`JOURNAL_LIMIT`]; tests lower it).
    #[cfg_attr(not(test), expect(dead_code, reason = "set by tests only"))]
    journal_limit: Arc<std::sync::atomic::AtomicU64>,
    /// When a checkpoint is made ([`CHECKPOINT_BYTES`]; tests lower it).
    #[cfg_attr(not(test), expect(dead_code, reason = "set by tests only"))]
    checkpoint_bytes: Arc<std::sync::atomic::AtomicU64>,
    /// Tests: the broken dispatch order (see [`Limits::broken_order`]).
    #[cfg_attr(not(test), expect(dead_code, reason = "set by tests only"))]
    broken_order: Arc<AtomicBool>,
    /// Decision inputs live in a database file of their own beside the
    /// ledger (`ledger.inputs.redb`), opened at first use: a batch of them
    /// never holds redb's write lock against the ledger writer.
    inputs: Arc<Mutex<Option<Arc<Database>>>>,
    inputs_path: std::path::PathBuf,
    /// The guards' rows (budgets, effect keys), in memory: a take is a
    /// compare-and-set here, made durable with its call's `dispatched`.
    guards: Arc<Mutex<guards::Memory>>,
}

impl Drop for RedbStore {
    fn drop(&mut self) {
        self.queue.take();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

fn err(op: &'static str) -> impl Fn(redb::Error) -> StoreError {
    move |e| StoreError::Backend {
        op,
        reason: e.to_string(),
    }
}

fn encode(r: &Record) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(r).map_err(|e| StoreError::Encode {
        what: "record",
        reason: e.to_string(),
    })
}

fn decode(bytes: &[u8]) -> Result<Record, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        what: "record",
        reason: e.to_string(),
    })
}

impl RedbStore {
    /// Open (or create) the ledger file and start its writer thread. Fails
    /// when another process holds the file (a running gateway).
    pub fn open(path: &Path) -> Result<RedbStore, StoreError> {
        if let Some(dir) = path.parent() {
            super::durable::dir_all(dir).map_err(|e| StoreError::Open {
                path: dir.display().to_string(),
                reason: e.to_string(),
            })?;
        }
        RedbStore::on(path, open_db(path)?, JournalAt::File)
    }

    /// The store over `db`, whose journal is beside `path`.
    pub(super) fn on(
        path: &Path,
        db: Database,
        journal_at: JournalAt,
    ) -> Result<RedbStore, StoreError> {
        let txn = db.begin_write().map_err(|e| err("begin")(e.into()))?;
        txn.open_table(LEDGER)
            .map_err(|e| err("create table")(e.into()))?;
        txn.open_table(PROPOSALS)
            .map_err(|e| err("create table")(e.into()))?;
        txn.open_table(OUTBOX)
            .map_err(|e| err("create table")(e.into()))?;
        txn.open_table(PINS)
            .map_err(|e| err("create table")(e.into()))?;
        txn.open_table(NOTICES)
            .map_err(|e| err("create table")(e.into()))?;
        txn.open_table(NOTIFY)
            .map_err(|e| err("create table")(e.into()))?;
        txn.open_table(NONCES)
            .map_err(|e| err("create table")(e.into()))?;
        txn.open_table(TASKS)
            .map_err(|e| err("create table")(e.into()))?;
        txn.open_table(OPEN_TASKS)
            .map_err(|e| err("create table")(e.into()))?;
        txn.open_table(guards::GUARDS)
            .map_err(|e| err("create table")(e.into()))?;
        txn.open_table(console::CONSOLE)
            .map_err(|e| err("create table")(e.into()))?;
        proposals::index_at_open(&txn)?;
        {
            // One process per file: no delivery of a previous run is still
            // in flight, so its leases are void (its notices go out now,
            // not when the leases would have lapsed).
            let mut notices = txn
                .open_table(NOTICES)
                .map_err(|e| err("open table")(e.into()))?;
            let mut leased = Vec::new();
            for entry in notices.iter().map_err(|e| err("scan")(e.into()))? {
                let (k, v) = entry.map_err(|e| err("scan")(e.into()))?;
                let mut n: Notice = decode_json("notice", v.value())?;
                if n.lease.take().is_some() {
                    leased.push((k.value().to_owned(), n));
                }
            }
            for (k, n) in leased {
                notices
                    .insert(k.as_str(), encode_notice(&n)?.as_slice())
                    .map_err(|e| err("write")(e.into()))?;
            }
        }
        // What the journal holds of the last run (all of it after a crash,
        // nothing after a clean stop) goes into redb now, in the same
        // durable commit, which also starts the journal's next generation.
        let journal_path = journal::path_for(path);
        let generation = txn
            .open_table(META)
            .map_err(|e| err("create table")(e.into()))?
            .get(JOURNAL_GENERATION)
            .map_err(|e| err("read")(e.into()))?
            .map_or(0, |g| g.value());
        let items = match &journal_at {
            JournalAt::File => journal::read(&journal_path, generation)?,
            #[cfg(test)]
            JournalAt::Disk(d) => journal::items(&d.live(), generation)?,
        };
        replay(&txn, items)?;
        set_generation(&txn, generation + 1)?;
        txn.commit().map_err(|e| err("commit")(e.into()))?;
        let journal = match journal_at {
            JournalAt::File => Journal::create(&journal_path, generation + 1)?,
            #[cfg(test)]
            JournalAt::Disk(d) => {
                Journal::on(Box::new(power::JournalOn(d)), &journal_path, generation + 1)?
            }
        };
        let db = Arc::new(db);
        let (queue, rx) = mpsc::channel();
        let writer_db = db.clone();
        let dirty = Arc::new(AtomicBool::new(false));
        let writer_dirty = dirty.clone();
        let pending = Arc::new(Mutex::new(Pending::default()));
        let writer_pending = pending.clone();
        let crash = Arc::new(AtomicBool::new(false));
        let writer_crash = crash.clone();
        let cut = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let writer_cut = cut.clone();
        let refusing = Arc::new(AtomicBool::new(false));
        let journal_limit = Arc::new(std::sync::atomic::AtomicU64::new(JOURNAL_LIMIT));
        let checkpoint_bytes = Arc::new(std::sync::atomic::AtomicU64::new(CHECKPOINT_BYTES));
        let broken_order = Arc::new(AtomicBool::new(false));
        let guard_rows = Arc::new(Mutex::new(guards::Memory::load(&db)?));
        let limits = Limits {
            guards: guard_rows.clone(),
            broken_order: broken_order.clone(),
            cut: writer_cut,
            refusing: refusing.clone(),
            journal: journal_limit.clone(),
            checkpoint: checkpoint_bytes.clone(),
        };
        let writer = std::thread::Builder::new()
            .name("ledger-writer".into())
            .spawn(move || {
                writer(
                    &writer_db,
                    &rx,
                    &writer_dirty,
                    &writer_pending,
                    journal,
                    &writer_crash,
                    &limits,
                )
            })
            .map_err(|e| StoreError::Backend {
                op: "start the ledger writer",
                reason: e.to_string(),
            })?;
        Ok(RedbStore {
            db,
            queue: Some(queue),
            writer: Some(writer),
            dirty,
            pending,
            crash,
            cut,
            refusing,
            journal_limit,
            checkpoint_bytes,
            broken_order,
            inputs: Arc::new(Mutex::new(None)),
            inputs_path: path.with_extension("inputs.redb"),
            guards: guard_rows,
        })
    }

    /// Stop, when dropped, as a crash would (see [`RedbStore::crash`]).
    #[cfg(test)]
    pub(super) fn crash_on_drop(&self) {
        self.crash.store(true, Ordering::Release);
    }

    /// `f` in one non-durable write transaction over the decision inputs'
    /// own database, on a blocking thread.
    fn inputs_write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut redb::Table<'_, &'static str, &'static str>) -> Result<T, StoreError>
            + Send
            + 'static,
    ) -> StoreFuture<'_, T> {
        let cell = self.inputs.clone();
        let path = self.inputs_path.clone();
        Box::pin(blocking(move || {
            let db = inputs_db(&cell, &path)?;
            inputs_txn(&db, f)
        }))
    }

    /// A read-only view of the ledger (never waits for the writer).
    fn read_table(&self) -> Result<redb::ReadOnlyTable<&'static str, &'static [u8]>, StoreError> {
        self.read(LEDGER)
    }

    fn read(
        &self,
        def: TableDefinition<'static, &'static str, &'static [u8]>,
    ) -> Result<redb::ReadOnlyTable<&'static str, &'static [u8]>, StoreError> {
        let txn = self
            .db
            .begin_read()
            .map_err(|e| err("begin read")(e.into()))?;
        txn.open_table(def).map_err(|e| err("open table")(e.into()))
    }

    fn submit<T: Send + 'static>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Op,
    ) -> StoreFuture<'_, T> {
        let (tx, rx) = oneshot::channel();
        let sent = match &self.queue {
            Some(q) => q.send(make(tx)).map_err(drop),
            None => Err(()),
        };
        Box::pin(async move {
            sent.map_err(|_| StoreError::WriterStopped)?;
            rx.await.map_err(|_| StoreError::WriterStopped)?
        })
    }
}

/// How long non-durable commits may wait for an fsync when no durable commit
/// comes along to carry them.
const IDLE_FLUSH: std::time::Duration = std::time::Duration::from_millis(100);

/// The journal is folded into redb once it holds this many bytes...
const CHECKPOINT_BYTES: u64 = 1 << 20;
/// ... or changes to this many keys (bounds the memory of [`Pending`]).
const CHECKPOINT_KEYS: usize = 4096;
/// While checkpoints fail, the journal grows: past this many bytes the
/// writer refuses writes (fail closed) rather than grow it without end.
const JOURNAL_LIMIT: u64 = 64 * CHECKPOINT_BYTES;

/// What the writer changed since its last checkpoint and redb does not hold
/// yet: what the journal holds, and reservations (kept only here: a crash
/// frees a reserved key anyway). Readers look here first, then in redb. The
/// writer clears it only after the checkpoint's commit, so a reader that
/// misses here finds the change in redb.
#[derive(Default, Clone)]
struct Pending {
    ledger: HashMap<String, Record>,
    outbox: BTreeMap<u64, String>,
    /// Outbox rows up to this id are gone (from redb at the checkpoint).
    cleared: Option<u64>,
    /// The guards' changes of dispatched calls, in order.
    guards: Vec<Vec<super::guards::Change>>,
}

impl Pending {
    /// A copy of the outbox part alone (what outbox reads need).
    fn outbox_only(&self) -> Pending {
        Pending {
            ledger: HashMap::new(),
            outbox: self.outbox.clone(),
            cleared: self.cleared,
            guards: Vec::new(),
        }
    }

    fn is_empty(&self) -> bool {
        self.ledger.is_empty()
            && self.outbox.is_empty()
            && self.cleared.is_none()
            && self.guards.is_empty()
    }

    fn apply(&mut self, effects: Vec<Effect>) {
        for e in effects {
            match e {
                Effect::Put(k, r) => {
                    self.ledger.insert(k, r);
                }
                Effect::Outbox(id, text) => {
                    self.outbox.insert(id, text);
                }
                Effect::Clear(upto) => {
                    self.outbox.retain(|id, _| *id > upto);
                    self.cleared = Some(self.cleared.map_or(upto, |c| c.max(upto)));
                }
                Effect::Guards(bytes) => self.guards.push(bytes),
            }
        }
    }
}

/// A change a journaled batch makes, applied to [`Pending`] once its frames
/// are written (and fsynced, when the batch is durable).
enum Effect {
    Put(String, Record),
    Outbox(u64, String),
    Clear(u64),
    Guards(Vec<super::guards::Change>),
}

/// The ledger writer thread's state.
struct Writer<'a> {
    db: &'a Database,
    journal: Journal,
    pending: &'a Mutex<Pending>,
    shown: &'a AtomicBool,
    /// Frames appended since the journal's last fsync.
    journal_unsynced: bool,
    /// redb commits made since its last fsync.
    redb_unsynced: bool,
    /// A journal write or fsync failed: what the file holds is unknown, so
    /// every later operation fails (closed) until a restart replays it.
    broken: Option<StoreError>,
    /// Tests: cut the power after this many more durable appends (0: never).
    cut: &'a std::sync::atomic::AtomicU64,
    /// Tests: the broken dispatch order.
    broken_order: &'a AtomicBool,
    /// The power was cut: the writer stops, syncing nothing.
    halted: bool,
    /// The guards' changes waiting for their call's dispatch.
    guards: &'a Mutex<guards::Memory>,
}

/// Where the journal is: its file beside the database, or (tests of power
/// loss) a simulated disk.
pub(super) enum JournalAt {
    File,
    #[cfg(test)]
    Disk(Arc<power::Disk>),
}

/// What the writer shares with the store beside its queue.
struct Limits {
    /// Tests: cut the power after this many more durable appends (0: never).
    cut: Arc<std::sync::atomic::AtomicU64>,
    /// Set while the writer refuses writes.
    refusing: Arc<AtomicBool>,
    /// The journal's bound, in bytes.
    journal: Arc<std::sync::atomic::AtomicU64>,
    /// A checkpoint is made once the journal holds this many bytes.
    checkpoint: Arc<std::sync::atomic::AtomicU64>,
    /// Tests: append a dispatch before fsyncing redb's commit (the order
    /// the power-loss property test must catch). Never set otherwise.
    broken_order: Arc<AtomicBool>,
    /// The guards' rows in memory, with the changes of calls not yet
    /// dispatched (journaled with their `dispatched` record).
    guards: Arc<Mutex<guards::Memory>>,
}

fn writer(
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

/// The outbox rows redb holds that `pending` has not cleared, with
/// `pending`'s own rows.
fn outbox_rows(
    txn: &redb::ReadTransaction,
    pending: &Pending,
) -> Result<BTreeMap<u64, String>, StoreError> {
    let table = txn
        .open_table(OUTBOX)
        .map_err(|e| err("open table")(e.into()))?;
    let mut rows = BTreeMap::new();
    for entry in table.iter().map_err(|e| err("scan")(e.into()))? {
        let (k, v) = entry.map_err(|e| err("scan")(e.into()))?;
        if pending.cleared.is_none_or(|c| k.value() > c) {
            rows.insert(k.value(), v.value().to_owned());
        }
    }
    rows.extend(pending.outbox.iter().map(|(k, v)| (*k, v.clone())));
    Ok(rows)
}

fn reply(batch: Vec<Op>, done: Vec<Done>) {
    for (op, d) in batch.into_iter().zip(done) {
        match (op, d) {
            (Op::Reserve { reply, .. }, Done::Reserve(r)) => drop(reply.send(r)),
            (Op::Transition { reply, .. }, Done::Transition(r)) => drop(reply.send(r)),
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
fn fail(batch: Vec<Op>, e: &StoreError) {
    for op in batch {
        match op {
            Op::Reserve { reply, .. } => drop(reply.send(Err(e.clone()))),
            Op::Transition { reply, .. } => drop(reply.send(Err(e.clone()))),
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
fn flush(db: &Database) -> bool {
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

/// Write `pending` into `txn` (records, outbox clears, outbox rows, in the
/// order they were made) and record `generation` as the journal's next.
fn fold(
    txn: &redb::WriteTransaction,
    pending: &Pending,
    generation: u64,
    pruned: &guards::Pruned,
) -> Result<(), StoreError> {
    let mut ledger = txn
        .open_table(LEDGER)
        .map_err(|e| err("open table")(e.into()))?;
    for (k, r) in &pending.ledger {
        ledger
            .insert(k.as_str(), encode(r)?.as_slice())
            .map_err(|e| err("write")(e.into()))?;
    }
    let mut outbox = txn
        .open_table(OUTBOX)
        .map_err(|e| err("open table")(e.into()))?;
    if let Some(upto) = pending.cleared {
        outbox_clear(&mut outbox, upto)?;
    }
    for (id, text) in &pending.outbox {
        outbox
            .insert(*id, text.as_str())
            .map_err(|e| err("write")(e.into()))?;
    }
    guards::fold(txn, &pending.guards, pruned)?;
    set_generation(txn, generation)
}

/// Apply a journal's items, in order, in `txn`.
fn replay(txn: &redb::WriteTransaction, items: Vec<journal::Item>) -> Result<(), StoreError> {
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

fn set_generation(txn: &redb::WriteTransaction, generation: u64) -> Result<(), StoreError> {
    txn.open_table(META)
        .map_err(|e| err("open table")(e.into()))?
        .insert(JOURNAL_GENERATION, generation)
        .map_err(|e| err("write")(e.into()))?;
    Ok(())
}

fn apply_batch(
    db: &Database,
    batch: &[Op],
    durable: bool,
    checkpoint: Option<(&Pending, u64)>,
    guards: &Mutex<guards::Memory>,
) -> Result<Vec<Done>, StoreError> {
    let mut txn = db.begin_write().map_err(|e| err("begin")(e.into()))?;
    if let Some((pending, generation)) = checkpoint {
        // Pruned rows leave the table with the checkpoint (should it fail,
        // they are ended rows the next open loads and prunes again).
        let pruned = guards.lock().take_pruned();
        fold(&txn, pending, generation, &pruned)?;
    }
    // INVARIANT: a batch holding a `dispatched` (or reconciliation) commits
    // with fsync before any of its callers is answered.
    // Otherwise not durable yet: the next durable commit (another dispatch,
    // or the idle flush within IDLE_FLUSH) carries it. redb's `Eventual`
    // fsyncs too on Linux, which would triple the flushes of a write call.
    // A crash before that flush can only turn a later state back into
    // `dispatched`, which recovery reads as `unknown`.
    txn.set_durability(if durable {
        Durability::Immediate
    } else {
        Durability::None
    });
    let mut done = Vec::with_capacity(batch.len());
    {
        // Each table is opened when an operation first needs it: a table
        // opened in a write transaction costs its root's bookkeeping at
        // commit, and most batches touch one or two of the five.
        let mut ledger = None;
        let mut proposals_slot = None;
        let mut outbox_slot = None;
        let mut pins_slot = None;
        let mut notices_slot = None;
        let mut index_slot = None;
        let mut open_slot = None;
        for op in batch {
            done.push(match op {
                Op::Reserve {
                    key,
                    record,
                    now_ms,
                    approval,
                    ..
                } => Done::Reserve(reserve(
                    opened(&mut ledger, &txn, LEDGER)?,
                    opened(&mut proposals_slot, &txn, PROPOSALS)?,
                    opened(&mut open_slot, &txn, proposals::OPEN)?,
                    key,
                    record,
                    *now_ms,
                    approval.as_deref(),
                )),
                Op::Transition {
                    key,
                    from,
                    to,
                    outbox: entries,
                    notices: queued,
                    ..
                } => Done::Transition(
                    transition(opened(&mut ledger, &txn, LEDGER)?, key, *from, to).and_then(
                        |moved| {
                            // INVARIANT: the outbox row and the notifications commit
                            // in the same transaction as the move they record, or
                            // not at all.
                            if let (true, Some((id, text))) = (moved, entries) {
                                opened(&mut outbox_slot, &txn, OUTBOX)?
                                    .insert(*id, text.as_str())
                                    .map_err(|e| err("write")(e.into()))?;
                            }
                            if moved {
                                for n in queued {
                                    opened(&mut notices_slot, &txn, NOTICES)?
                                        .insert(n.key().as_str(), encode_notice(n)?.as_slice())
                                        .map_err(|e| err("write")(e.into()))?;
                                }
                            }
                            // INVARIANT: what a call took of its guards
                            // commits with its `dispatched`, as in the journal.
                            if moved && to.state == State::Dispatched {
                                if let Some(g) = guards.lock().unsent(key) {
                                    guards::fold(&txn, &[g], &guards::Pruned::default())?;
                                }
                            }
                            Ok(moved)
                        },
                    ),
                ),
                Op::OutboxClear { upto, .. } => {
                    Done::Gc(outbox_clear(opened(&mut outbox_slot, &txn, OUTBOX)?, *upto))
                }
                Op::Gc { now_ms, .. } => Done::Gc(gc(opened(&mut ledger, &txn, LEDGER)?, *now_ms)),
                Op::PutProposal {
                    proposal,
                    expect,
                    notices: queued,
                    ..
                } => Done::Transition(
                    proposals::put(
                        opened(&mut proposals_slot, &txn, PROPOSALS)?,
                        opened(&mut index_slot, &txn, proposals::BY_REQUESTER)?,
                        opened(&mut open_slot, &txn, proposals::OPEN)?,
                        proposal,
                        *expect,
                    )
                    .and_then(|wrote| {
                        // INVARIANT: a notification commits with the
                        // proposal change it announces, or not at all.
                        if wrote {
                            for n in queued {
                                let bytes = encode_notice(n)?;
                                opened(&mut notices_slot, &txn, NOTICES)?
                                    .insert(n.key().as_str(), bytes.as_slice())
                                    .map_err(|e| err("write")(e.into()))?;
                            }
                        }
                        Ok(wrote)
                    }),
                ),
                Op::GcProposals { before_ms, .. } => Done::Gc(proposals::gc(
                    opened(&mut proposals_slot, &txn, PROPOSALS)?,
                    opened(&mut index_slot, &txn, proposals::BY_REQUESTER)?,
                    opened(&mut open_slot, &txn, proposals::OPEN)?,
                    *before_ms,
                )),
                Op::Pin { pins: new, .. } => {
                    Done::Gc(pin_first(opened(&mut pins_slot, &txn, PINS)?, new))
                }
                Op::Checkpoint { .. } => Done::Gc(Ok(0)),
            });
        }
    }
    txn.commit().map_err(|e| err("commit")(e.into()))?;
    Ok(done)
}

type Table<'t> = redb::Table<'t, &'static str, &'static [u8]>;

/// The table in `slot`, opened in `txn` on first use.
fn opened<'s, 't, K: redb::Key + 'static, V: redb::Value + 'static>(
    slot: &'s mut Option<redb::Table<'t, K, V>>,
    txn: &'t redb::WriteTransaction,
    def: TableDefinition<K, V>,
) -> Result<&'s mut redb::Table<'t, K, V>, StoreError> {
    let table = match slot.take() {
        Some(t) => t,
        None => txn
            .open_table(def)
            .map_err(|e| err("open table")(e.into()))?,
    };
    Ok(slot.insert(table))
}

fn pin_first(
    pins: &mut redb::Table<'_, &'static str, &'static str>,
    new: &[(String, String)],
) -> Result<usize, StoreError> {
    let mut wrote = 0;
    for (key, value) in new {
        if pins
            .get(key.as_str())
            .map_err(|e| err("read")(e.into()))?
            .is_some()
        {
            continue;
        }
        pins.insert(key.as_str(), value.as_str())
            .map_err(|e| err("write")(e.into()))?;
        wrote += 1;
    }
    Ok(wrote)
}

fn read(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
    key: &str,
) -> Result<Option<Record>, StoreError> {
    match table.get(key).map_err(|e| err("read")(e.into()))? {
        Some(v) => decode(v.value()).map(Some),
        None => Ok(None),
    }
}

fn reserve(
    table: &mut Table<'_>,
    proposals: &mut Table<'_>,
    open_ids: &mut proposals::Index<'_>,
    key: &str,
    record: &Record,
    now_ms: i64,
    approval: Option<&str>,
) -> Result<Reservation, StoreError> {
    if let Some(existing) = read(table, key)?.filter(|r| r.binds(now_ms)) {
        return Ok(Reservation::Bound(existing));
    }
    if let Some(id) = approval {
        let stored = match proposals.get(id).map_err(|e| err("read")(e.into()))? {
            Some(v) => Some(decode_proposal(v.value())?),
            None => None,
        };
        let Some(p) = stored else {
            return Ok(Reservation::Unapproved(ProposalState::Invalidated));
        };
        match approval::consume(&p, key, &record.server, &record.digest, now_ms) {
            Err(state) => return Ok(Reservation::Unapproved(state)),
            Ok(None) => {}
            Ok(Some(next)) => {
                proposals
                    .insert(id, encode_proposal(&next)?.as_slice())
                    .map_err(|e| err("write")(e.into()))?;
                // Consumed: no longer open.
                open_ids.remove(id).map_err(|e| err("write")(e.into()))?;
            }
        }
    }
    table
        .insert(key, encode(record)?.as_slice())
        .map_err(|e| err("write")(e.into()))?;
    Ok(Reservation::Reserved)
}

fn transition(
    table: &mut Table<'_>,
    key: &str,
    from: State,
    to: &Record,
) -> Result<bool, StoreError> {
    check_transition(from, to.state)?;
    match read(table, key)? {
        Some(cur) if cur.state == from => {
            table
                .insert(key, encode(to)?.as_slice())
                .map_err(|e| err("write")(e.into()))?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

fn gc(table: &mut Table<'_>, now_ms: i64) -> Result<usize, StoreError> {
    let mut stale = Vec::new();
    for entry in table.iter().map_err(|e| err("scan")(e.into()))? {
        let (k, v) = entry.map_err(|e| err("scan")(e.into()))?;
        if !decode(v.value())?.binds(now_ms) {
            stale.push(k.value().to_owned());
        }
    }
    remove_keys(table, &stale)
}

/// Remove `keys` from `table`; returns how many were named.
fn remove_keys<V: redb::Value + 'static>(
    table: &mut redb::Table<'_, &'static str, V>,
    keys: &[String],
) -> Result<usize, StoreError> {
    for k in keys {
        table
            .remove(k.as_str())
            .map_err(|e| err("delete")(e.into()))?;
    }
    Ok(keys.len())
}

/// Run `f` on blocking thread: redb's calls block.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Backend {
            op: "notification queue",
            reason: e.to_string(),
        })?
}

/// One write transaction over the notification queue and the webhooks'
/// status, fsynced when `durable`.
fn queue_txn<T>(
    db: &Database,
    durable: bool,
    f: impl FnOnce(&mut Table<'_>, &mut Table<'_>) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let mut txn = db.begin_write().map_err(|e| err("begin")(e.into()))?;
    txn.set_durability(if durable {
        Durability::Immediate
    } else {
        Durability::None
    });
    let out = {
        let mut notices = txn
            .open_table(NOTICES)
            .map_err(|e| err("open table")(e.into()))?;
        let mut status = txn
            .open_table(NOTIFY)
            .map_err(|e| err("open table")(e.into()))?;
        f(&mut notices, &mut status)?
    };
    txn.commit().map_err(|e| err("commit")(e.into()))?;
    Ok(out)
}

/// Open the database at `path`, making it first when there is none.
///
/// A new database is made whole before it takes its name: under a
/// temporary name (0600 before redb opens it, which would create it by the
/// umask: it holds arguments), fsynced, renamed, and its folder fsynced. A
/// power cut during the very first creation then leaves no file, or a
/// temporary one that is made again, never a half-made database under the
/// real name that redb refuses at every start.
///
/// Only redb's lock error says that another process has the file; any
/// other error is told as it is.
fn open_db(path: &Path) -> Result<Database, StoreError> {
    let open_err = |e: &dyn std::fmt::Display| StoreError::Open {
        path: path.display().to_string(),
        reason: e.to_string(),
    };
    if !path.exists() {
        let mut name = path.file_name().unwrap_or_default().to_owned();
        name.push(".new");
        let tmp = path.with_file_name(name);
        // A temporary file a cut left behind is made again.
        let _ = std::fs::remove_file(&tmp);
        super::private::options()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| open_err(&e))?;
        drop(Database::create(&tmp).map_err(|e| open_err(&e))?);
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(|e| open_err(&e))?;
        std::fs::rename(&tmp, path).map_err(|e| open_err(&e))?;
        super::durable::created(path).map_err(|e| open_err(&e))?;
    }
    Database::create(path).map_err(|e| match e {
        redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Open {
            path: path.display().to_string(),
            reason: format!(
                "{e}: another process has it open (is a gateway running on this data_dir? stop it, or act through it)"
            ),
        },
        other => open_err(&format!(
            "{other} (the file may be damaged: keep a copy, and restore it from a backup)"
        )),
    })
}

/// The decision inputs' database, opened (or made) at first use; under
/// the lock, so that two first uses make it once.
fn inputs_db(
    cell: &Mutex<Option<Arc<Database>>>,
    path: &Path,
) -> Result<Arc<Database>, StoreError> {
    let mut slot = cell.lock();
    if let Some(db) = slot.as_ref() {
        return Ok(db.clone());
    }
    let db = Arc::new(open_db(path)?);
    *slot = Some(db.clone());
    Ok(db)
}

/// One non-durable write transaction over the decision inputs.
fn inputs_txn<T>(
    db: &Database,
    f: impl FnOnce(&mut redb::Table<'_, &'static str, &'static str>) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let mut txn = db.begin_write().map_err(|e| err("begin")(e.into()))?;
    txn.set_durability(Durability::None);
    let out = {
        let mut table = txn
            .open_table(INPUTS)
            .map_err(|e| err("open table")(e.into()))?;
        f(&mut table)?
    };
    txn.commit().map_err(|e| err("commit")(e.into()))?;
    Ok(out)
}

/// The time in an inputs key (`{time_ms:020}-...`).
fn key_time(key: &str) -> i64 {
    key.get(..20).and_then(|t| t.parse().ok()).unwrap_or(0)
}

fn input_row(key: &str, value: &str) -> Result<InputRow, StoreError> {
    let corrupt = || StoreError::Corrupt {
        what: "decision inputs",
        reason: format!("row {key} does not start with its tenant"),
    };
    let (len, rest) = value.split_once(':').ok_or_else(corrupt)?;
    let len: usize = len.parse().map_err(|_| corrupt())?;
    let tenant = rest.get(..len).ok_or_else(corrupt)?;
    let inputs = rest.get(len..).ok_or_else(corrupt)?;
    Ok(InputRow {
        key: key.to_owned(),
        tenant: tenant.to_owned(),
        time_ms: key_time(key),
        inputs: inputs.to_owned(),
    })
}

fn outbox_clear(
    outbox: &mut redb::Table<'_, u64, &'static str>,
    upto: u64,
) -> Result<usize, StoreError> {
    let ids: Vec<u64> = outbox
        .range(..=upto)
        .map_err(|e| err("scan")(e.into()))?
        .filter_map(|e| e.ok().map(|(k, _)| k.value()))
        .collect();
    for id in &ids {
        outbox.remove(*id).map_err(|e| err("delete")(e.into()))?;
    }
    Ok(ids.len())
}

impl Store for RedbStore {
    fn task_create(
        &self,
        task: crate::core::task::TaskRecord,
    ) -> StoreFuture<'_, crate::core::task::TaskRecord> {
        tasks::task_create(self, task)
    }

    fn task_get<'a>(
        &'a self,
        id: &'a str,
    ) -> StoreFuture<'a, Option<crate::core::task::TaskRecord>> {
        tasks::task_get(self, id)
    }

    fn tasks(
        &self,
        filter: super::TaskFilter,
    ) -> StoreFuture<'_, Vec<crate::core::task::TaskRecord>> {
        tasks::tasks(self, filter)
    }

    fn task_put(&self, task: crate::core::task::TaskRecord) -> StoreFuture<'_, bool> {
        tasks::task_put(self, task)
    }

    fn tasks_gc(&self, before_ms: i64) -> StoreFuture<'_, usize> {
        tasks::tasks_gc(self, before_ms)
    }

    fn unflushed(&self) -> bool {
        self.dirty.load(Ordering::Acquire)
    }

    fn refusing_writes(&self) -> bool {
        self.refusing.load(Ordering::Acquire)
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move {
            // The writer's changes not yet in redb first (cleared only
            // after their checkpoint commits, so a miss finds them there).
            if let Some(r) = self.pending.lock().ledger.get(key) {
                return Ok(Some(r.clone()));
            }
            read(&self.read_table()?, key)
        })
    }

    fn reserve_with(
        &self,
        key: String,
        record: Record,
        now_ms: i64,
        approval: Option<String>,
    ) -> StoreFuture<'_, Reservation> {
        self.submit(|reply| Op::Reserve {
            key,
            record,
            now_ms,
            approval,
            reply,
        })
    }

    fn put_proposal_with(
        &self,
        proposal: Proposal,
        expect: Option<ProposalState>,
        notices: Vec<Notice>,
    ) -> StoreFuture<'_, bool> {
        self.submit(|reply| Op::PutProposal {
            proposal: Box::new(proposal),
            expect,
            notices,
            reply,
        })
    }

    // The queue's own writes are rare (one per event and attempt): they
    // take redb's write lock on a blocking thread rather than the ledger
    // writer's batches. Enqueueing is durable; a claim's lease and a
    // settlement are not (lost to a crash, the notice is sent again, with
    // the same id).
    fn notices_enqueue(&self, notices: Vec<Notice>) -> StoreFuture<'_, ()> {
        let db = self.db.clone();
        Box::pin(blocking(move || {
            queue_txn(&db, true, |table, _| {
                for n in &notices {
                    table
                        .insert(n.key().as_str(), encode_notice(n)?.as_slice())
                        .map_err(|e| err("write")(e.into()))?;
                }
                Ok(())
            })
        }))
    }

    fn notices_claim(
        &self,
        owner: &str,
        now_ms: i64,
        lease_ms: i64,
        limit: usize,
    ) -> StoreFuture<'_, Vec<Notice>> {
        let db = self.db.clone();
        let owner = owner.to_owned();
        Box::pin(blocking(move || {
            queue_txn(&db, false, |table, _| {
                let mut all = std::collections::BTreeMap::new();
                for entry in table.iter().map_err(|e| err("scan")(e.into()))? {
                    let (k, v) = entry.map_err(|e| err("scan")(e.into()))?;
                    let n: Notice = decode_json("notice", v.value())?;
                    all.insert(k.value().to_owned(), n);
                }
                let mut out = Vec::new();
                for key in super::due(&all, now_ms, limit) {
                    if let Some(mut n) = all.remove(&key) {
                        n.lease = Some((owner.clone(), now_ms.saturating_add(lease_ms)));
                        table
                            .insert(key.as_str(), encode_notice(&n)?.as_slice())
                            .map_err(|e| err("write")(e.into()))?;
                        out.push(n);
                    }
                }
                Ok(out)
            })
        }))
    }

    fn notice_settle(&self, notice: Notice, outcome: Settle) -> StoreFuture<'_, ()> {
        let db = self.db.clone();
        Box::pin(blocking(move || {
            queue_txn(&db, false, |table, status| {
                let name = notice.webhook.clone();
                let key = notice.key();
                let mut st: WebhookStatus = match status
                    .get(name.as_str())
                    .map_err(|e| err("read")(e.into()))?
                {
                    Some(v) => decode_json("webhook status", v.value())?,
                    None => WebhookStatus::default(),
                };
                match super::settled(notice, &outcome, &mut st) {
                    Some(n) => {
                        table
                            .insert(key.as_str(), encode_notice(&n)?.as_slice())
                            .map_err(|e| err("write")(e.into()))?;
                    }
                    None => {
                        table
                            .remove(key.as_str())
                            .map_err(|e| err("write")(e.into()))?;
                    }
                }
                let bytes = serde_json::to_vec(&st).map_err(|e| StoreError::Encode {
                    what: "webhook status",
                    reason: e.to_string(),
                })?;
                status
                    .insert(name.as_str(), bytes.as_slice())
                    .map_err(|e| err("write")(e.into()))?;
                Ok(())
            })
        }))
    }

    fn notify_status(&self) -> StoreFuture<'_, (BTreeMap<String, WebhookStatus>, usize)> {
        Box::pin(async move {
            let notices = self.read(NOTICES)?;
            let mut waiting = 0;
            for entry in notices.iter().map_err(|e| err("scan")(e.into()))? {
                let (_, v) = entry.map_err(|e| err("scan")(e.into()))?;
                let n: Notice = decode_json("notice", v.value())?;
                waiting += usize::from(!n.gave_up);
            }
            let mut out = BTreeMap::new();
            for entry in self
                .read(NOTIFY)?
                .iter()
                .map_err(|e| err("scan")(e.into()))?
            {
                let (k, v) = entry.map_err(|e| err("scan")(e.into()))?;
                out.insert(
                    k.value().to_owned(),
                    decode_json("webhook status", v.value())?,
                );
            }
            Ok((out, waiting))
        })
    }

    fn pin_first_use(&self, pins: Vec<(String, String)>) -> StoreFuture<'_, usize> {
        if pins.is_empty() {
            return Box::pin(std::future::ready(Ok(0)));
        }
        self.submit(|reply| Op::Pin { pins, reply })
    }

    fn use_nonce(&self, nonce: String, expires_ms: i64, now_ms: i64) -> StoreFuture<'_, bool> {
        let db = self.db.clone();
        Box::pin(blocking(move || {
            // Its own fsynced commit: a replay after a crash finds it.
            let mut txn = db.begin_write().map_err(|e| err("begin")(e.into()))?;
            txn.set_durability(Durability::Immediate);
            let fresh = {
                let mut table = txn
                    .open_table(NONCES)
                    .map_err(|e| err("open table")(e.into()))?;
                let seen = table
                    .get(nonce.as_str())
                    .map_err(|e| err("read")(e.into()))?
                    .is_some_and(|until| until.value() > now_ms);
                if !seen {
                    table
                        .insert(nonce.as_str(), expires_ms)
                        .map_err(|e| err("write")(e.into()))?;
                    // Expired nonces can no longer match: drop them.
                    table
                        .retain(|_, until| until > now_ms)
                        .map_err(|e| err("write")(e.into()))?;
                }
                !seen
            };
            txn.commit().map_err(|e| err("commit")(e.into()))?;
            Ok(fresh)
        }))
    }

    fn first_use_pins<'a>(&'a self) -> StoreFuture<'a, Vec<String>> {
        Box::pin(async move {
            let txn = self.db.begin_read().map_err(|e| err("begin")(e.into()))?;
            let table = txn
                .open_table(PINS)
                .map_err(|e| err("open table")(e.into()))?;
            let mut out = Vec::new();
            for entry in table.iter().map_err(|e| err("scan")(e.into()))? {
                let (_, v) = entry.map_err(|e| err("scan")(e.into()))?;
                out.push(v.value().to_owned());
            }
            Ok(out)
        })
    }

    fn get_proposal<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Proposal>> {
        Box::pin(async move {
            match self
                .read(PROPOSALS)?
                .get(id)
                .map_err(|e| err("read")(e.into()))?
            {
                Some(v) => decode_proposal(v.value()).map(Some),
                None => Ok(None),
            }
        })
    }

    fn list_proposals<'a>(&'a self) -> StoreFuture<'a, Vec<Proposal>> {
        Box::pin(async move {
            let table = self.read(PROPOSALS)?;
            let mut out = Vec::new();
            for entry in table.iter().map_err(|e| err("scan")(e.into()))? {
                let (_, v) = entry.map_err(|e| err("scan")(e.into()))?;
                out.push(decode_proposal(v.value())?);
            }
            Ok(out)
        })
    }

    fn gc_proposals(&self, before_ms: i64) -> StoreFuture<'_, usize> {
        self.submit(|reply| Op::GcProposals { before_ms, reply })
    }

    fn proposals_of<'a>(
        &'a self,
        tenant: &'a str,
        requester: &'a str,
    ) -> StoreFuture<'a, Vec<Proposal>> {
        Box::pin(async move { proposals::of(&self.db, tenant, requester) })
    }

    fn open_proposals(&self) -> StoreFuture<'_, Vec<Proposal>> {
        let db = self.db.clone();
        Box::pin(blocking(move || proposals::open_ones(&db)))
    }

    fn transition_telling(
        &self,
        key: String,
        from: State,
        to: Record,
        outbox: Option<(u64, String)>,
        notices: Vec<Notice>,
    ) -> StoreFuture<'_, bool> {
        self.submit(|reply| Op::Transition {
            key,
            from,
            to,
            outbox,
            notices,
            reply,
        })
    }

    fn outbox<'a>(&'a self) -> StoreFuture<'a, Vec<(u64, String)>> {
        Box::pin(async move {
            // Pending first, then redb: a checkpoint in between has
            // committed before it cleared what this copy holds.
            let pending = self.pending.lock().outbox_only();
            let txn = self
                .db
                .begin_read()
                .map_err(|e| err("begin read")(e.into()))?;
            Ok(outbox_rows(&txn, &pending)?.into_iter().collect())
        })
    }

    fn outbox_clear(&self, upto: u64) -> StoreFuture<'_, usize> {
        self.submit(|reply| Op::OutboxClear { upto, reply })
    }

    fn recover<'a>(&'a self) -> StoreFuture<'a, Recovery> {
        Box::pin(async move {
            // Recovery scans redb's ledger: the journal goes into it first.
            self.submit(|reply| Op::Checkpoint { reply }).await?;
            let txn = self.db.begin_write().map_err(|e| err("begin")(e.into()))?;
            let mut rec = Recovery::default();
            {
                let mut table = txn
                    .open_table(LEDGER)
                    .map_err(|e| err("open table")(e.into()))?;
                let mut changes = Vec::new();
                for entry in table.iter().map_err(|e| err("scan")(e.into()))? {
                    let (k, v) = entry.map_err(|e| err("scan")(e.into()))?;
                    let r = decode(v.value())?;
                    if matches!(r.state, State::Reserved | State::Dispatched) {
                        changes.push((k.value().to_owned(), r));
                    }
                }
                for (k, mut r) in changes {
                    if r.state == State::Reserved {
                        table
                            .remove(k.as_str())
                            .map_err(|e| err("delete")(e.into()))?;
                        rec.freed += 1;
                    } else {
                        r.state = State::Unknown;
                        table
                            .insert(k.as_str(), encode(&r)?.as_slice())
                            .map_err(|e| err("write")(e.into()))?;
                        rec.unknown += 1;
                    }
                }
            }
            txn.commit().map_err(|e| err("commit")(e.into()))?;
            Ok(rec)
        })
    }

    fn gc(&self, now_ms: i64) -> StoreFuture<'_, usize> {
        self.submit(|reply| Op::Gc { now_ms, reply })
    }

    // Decision inputs are written in batches by a background task, on a
    // blocking thread and in their own non-durable transactions: never on
    // the ledger writer's path.
    fn inputs_put(&self, rows: Vec<InputRow>) -> StoreFuture<'_, ()> {
        self.inputs_write(move |table| {
            for r in &rows {
                table
                    .insert(
                        r.key.as_str(),
                        format!("{}:{}{}", r.tenant.len(), r.tenant, r.inputs).as_str(),
                    )
                    .map_err(|e| err("write")(e.into()))?;
            }
            Ok(())
        })
    }

    fn inputs_since(
        &self,
        since_ms: i64,
        tenant: Option<String>,
    ) -> StoreFuture<'_, Vec<InputRow>> {
        let db = self.inputs.clone();
        let path = self.inputs_path.clone();
        Box::pin(blocking(move || {
            let db = inputs_db(&db, &path)?;
            let txn = db.begin_read().map_err(|e| err("begin read")(e.into()))?;
            let table = match txn.open_table(INPUTS) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(err("open table")(e.into())),
            };
            let from = format!("{:020}", since_ms.max(0));
            let mut out = Vec::new();
            for entry in table
                .range(from.as_str()..)
                .map_err(|e| err("scan")(e.into()))?
            {
                let (k, v) = entry.map_err(|e| err("scan")(e.into()))?;
                let row = input_row(k.value(), v.value())?;
                if tenant.as_ref().is_none_or(|t| *t == row.tenant) {
                    out.push(row);
                }
            }
            Ok(out)
        }))
    }

    fn inputs_erase(&self, tenant: String) -> StoreFuture<'_, usize> {
        self.inputs_write(move |table| {
            let mut gone = Vec::new();
            for entry in table.iter().map_err(|e| err("scan")(e.into()))? {
                let (k, v) = entry.map_err(|e| err("scan")(e.into()))?;
                if input_row(k.value(), v.value())?.tenant == tenant {
                    gone.push(k.value().to_owned());
                }
            }
            remove_keys(table, &gone)
        })
    }

    fn inputs_gc(&self, before_ms: i64, max_rows: usize) -> StoreFuture<'_, usize> {
        self.inputs_write(move |table| {
            let mut rows = Vec::new();
            for entry in table.iter().map_err(|e| err("scan")(e.into()))? {
                let (k, _) = entry.map_err(|e| err("scan")(e.into()))?;
                rows.push(k.value().to_owned());
            }
            let stale = inputs_stale(
                rows.iter().map(|k| (k.as_str(), key_time(k))),
                before_ms,
                max_rows,
            );
            remove_keys(table, &stale)
        })
    }

    fn list<'a>(&'a self, state: Option<State>) -> StoreFuture<'a, Vec<(String, Record)>> {
        Box::pin(async move {
            // Pending first, then redb (as in `outbox`).
            let pending = self.pending.lock().ledger.clone();
            let table = self.read_table()?;
            let mut all = BTreeMap::new();
            for entry in table.iter().map_err(|e| err("scan")(e.into()))? {
                let (k, v) = entry.map_err(|e| err("scan")(e.into()))?;
                all.insert(k.value().to_owned(), decode(v.value())?);
            }
            all.extend(pending);
            Ok(all
                .into_iter()
                .filter(|(_, r)| state.is_none_or(|s| r.state == s))
                .collect())
        })
    }
}
