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

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use parking_lot::Mutex;
use redb::{Database, ReadableTable, TableDefinition};
use tokio::sync::oneshot;

use super::journal::{self, Journal};

mod apply;
mod console;
mod guards;
mod inputs;
mod ledger;
mod outbox;
mod pending;
#[cfg(test)]
pub(super) mod power;
mod proposals;
mod seen;
mod tasks;
mod writer;

/// The indexes of proposals, by requester and open (a test deletes them, as
/// a ledger made before them lacks them).
#[cfg(test)]
pub(super) fn proposals_index_for_tests() -> [TableDefinition<'static, &'static str, ()>; 2] {
    [proposals::BY_REQUESTER, proposals::OPEN]
}

use super::{needs_durability, proposal_durable, Reservation, Store, StoreError, StoreFuture};
use crate::core::approval::{Proposal, ProposalState};
use crate::core::ledger::{Record, State};
use crate::core::notify::Notice;
use inputs::{inputs_db, inputs_txn};
use pending::{set_generation, Pending};
use writer::{replay, JournalAt, Limits, CHECKPOINT_BYTES, JOURNAL_LIMIT};

const LEDGER: TableDefinition<&str, &[u8]> = TableDefinition::new("ledger");
/// Approval proposals, in the same database: consuming an approval and
/// reserving a key commit in one transaction.
const PROPOSALS: TableDefinition<&str, &[u8]> = TableDefinition::new("proposals");
/// Audit entries committed with a dispatch (see [`Ledger::transition_with`]).
const OUTBOX: TableDefinition<u64, &str> = TableDefinition::new("audit_outbox");
/// Tool definitions pinned on first use (see [`Seen::pin_first_use`]).
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
    /// A key claimed straight as `dispatched`, with its outbox row
    /// ([`crate::store::Ledger::reserve_dispatched`]).
    Claim {
        key: String,
        record: Record,
        now_ms: i64,
        outbox: Option<(u64, String)>,
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
            Op::Claim { .. } | Op::OutboxClear { .. } => true,
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
            | Op::Claim { .. }
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
            // Its `dispatched` is on disk before the call goes.
            Op::Claim { .. } => true,
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
        cause: Some(crate::store::Cause::new(e)),
    })
}

fn decode_json<T: serde::de::DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        what,
        reason: e.to_string(),
        cause: Some(crate::store::Cause::new(e)),
    })
}

fn encode_proposal(p: &Proposal) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(p).map_err(|e| StoreError::Encode {
        what: "proposal",
        reason: e.to_string(),
        cause: Some(crate::store::Cause::new(e)),
    })
}

fn decode_proposal(bytes: &[u8]) -> Result<Proposal, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        what: "proposal",
        reason: e.to_string(),
        cause: Some(crate::store::Cause::new(e)),
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
    move |e| StoreError::backend(op, e)
}

fn encode(r: &Record) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(r).map_err(|e| StoreError::Encode {
        what: "record",
        reason: e.to_string(),
        cause: Some(crate::store::Cause::new(e)),
    })
}

fn decode(bytes: &[u8]) -> Result<Record, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        what: "record",
        reason: e.to_string(),
        cause: Some(crate::store::Cause::new(e)),
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
                cause: Some(crate::store::Cause::new(e)),
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
                writer::start(
                    &writer_db,
                    &rx,
                    &writer_dirty,
                    &writer_pending,
                    journal,
                    &writer_crash,
                    &limits,
                )
            })
            .map_err(|e| StoreError::backend("start the ledger writer", e))?;
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
        // Errors of several kinds (I/O, redb's) reach here as text.
        cause: None,
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
            cause: Some(crate::store::Cause::new(e)),
        },
        other => open_err(&format!(
            "{other} (the file may be damaged: keep a copy, and restore it from a backup)"
        )),
    })
}

impl Store for RedbStore {
    fn unflushed(&self) -> bool {
        self.dirty.load(Ordering::Acquire)
    }

    fn refusing_writes(&self) -> bool {
        self.refusing.load(Ordering::Acquire)
    }
}

/// Run `f` on blocking thread: redb's calls block.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::backend("notification queue", e))?
}

pub(super) type Table<'t> = redb::Table<'t, &'static str, &'static [u8]>;
