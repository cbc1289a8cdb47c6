//! The embedded ledger store: redb (ACID, copy-on-write B-trees, fsync on
//! durable commit, one process at a time per file).
//!
//! All writes go through one writer thread, which takes every operation
//! waiting in its queue into a single transaction: concurrent dispatches share
//! one fsync (group commit), and a batch is durable only if one of its
//! operations needs it. Non-durable commits are fsynced by the next durable
//! one, or by an idle flush at most 100 ms later, so a write call costs one
//! fsync on its hot path (the `dispatched` record). Reads use their own read
//! transactions and never wait for the writer.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use redb::{Database, Durability, ReadableTable, TableDefinition};
use tokio::sync::oneshot;

use super::{
    check_transition, needs_durability, proposal_durable, proposal_final, Recovery, Reservation,
    Settle, Store, StoreError, StoreFuture,
};
use crate::core::approval::{self, Proposal, ProposalState};
use crate::core::ledger::{Record, State};
use crate::core::notify::{Notice, WebhookStatus};
use std::collections::BTreeMap;

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
}

impl Op {
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
            | Op::OutboxClear { .. } => false,
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
            std::fs::create_dir_all(dir).map_err(|e| StoreError::Open {
                path: dir.display().to_string(),
                reason: e.to_string(),
            })?;
        }
        let db = Database::create(path).map_err(|e| StoreError::Open {
            path: path.display().to_string(),
            reason: format!(
                "{e} (is a gateway running on this data_dir? stop it, or act through it)"
            ),
        })?;
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
        txn.commit().map_err(|e| err("commit")(e.into()))?;
        let db = Arc::new(db);
        let (queue, rx) = mpsc::channel();
        let writer_db = db.clone();
        let dirty = Arc::new(AtomicBool::new(false));
        let writer_dirty = dirty.clone();
        let writer = std::thread::Builder::new()
            .name("ledger-writer".into())
            .spawn(move || writer(&writer_db, &rx, &writer_dirty))
            .map_err(|e| StoreError::Backend {
                op: "start the ledger writer",
                reason: e.to_string(),
            })?;
        Ok(RedbStore {
            db,
            queue: Some(queue),
            writer: Some(writer),
            dirty,
        })
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

fn writer(db: &Database, rx: &mpsc::Receiver<Op>, shown: &AtomicBool) {
    // Whether commits since the last fsync are waiting for one.
    let mut dirty = false;
    loop {
        let first = if dirty {
            match rx.recv_timeout(IDLE_FLUSH) {
                Ok(op) => op,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    dirty = !flush(db);
                    shown.store(dirty, Ordering::Release);
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
        let durable = batch.iter().any(Op::durable);
        // A durable commit also makes every earlier non-durable one durable.
        // Shown before any caller is answered: whoever saw its commit
        // answered can tell whether it is on disk yet.
        dirty = !durable;
        shown.store(dirty, Ordering::Release);
        match apply_batch(db, &batch, durable) {
            Ok(done) => {
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
                        (Op::Pin { reply, .. }, Done::Gc(r)) => drop(reply.send(r)),
                        _ => {}
                    }
                }
            }
            Err(e) => {
                // The whole transaction failed: nothing of it happened.
                tracing::error!("ledger commit failed: {e}");
                for op in batch {
                    match op {
                        Op::Reserve { reply, .. } => drop(reply.send(Err(e.clone()))),
                        Op::Transition { reply, .. } => drop(reply.send(Err(e.clone()))),
                        Op::Gc { reply, .. }
                        | Op::GcProposals { reply, .. }
                        | Op::OutboxClear { reply, .. } => drop(reply.send(Err(e.clone()))),
                        Op::PutProposal { reply, .. } => drop(reply.send(Err(e.clone()))),
                        Op::Pin { reply, .. } => drop(reply.send(Err(e.clone()))),
                    }
                }
            }
        }
    }
    if dirty {
        flush(db);
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

fn apply_batch(db: &Database, batch: &[Op], durable: bool) -> Result<Vec<Done>, StoreError> {
    let mut txn = db.begin_write().map_err(|e| err("begin")(e.into()))?;
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
                    put_proposal(
                        opened(&mut proposals_slot, &txn, PROPOSALS)?,
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
                Op::GcProposals { before_ms, .. } => Done::Gc(gc_proposals(
                    opened(&mut proposals_slot, &txn, PROPOSALS)?,
                    *before_ms,
                )),
                Op::Pin { pins: new, .. } => {
                    Done::Gc(pin_first(opened(&mut pins_slot, &txn, PINS)?, new))
                }
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
    for k in &stale {
        table
            .remove(k.as_str())
            .map_err(|e| err("delete")(e.into()))?;
    }
    Ok(stale.len())
}

fn put_proposal(
    proposals: &mut Table<'_>,
    p: &Proposal,
    expect: Option<ProposalState>,
) -> Result<bool, StoreError> {
    let current = match proposals
        .get(p.id.as_str())
        .map_err(|e| err("read")(e.into()))?
    {
        Some(v) => {
            let stored = decode_proposal(v.value())?;
            Some((stored.state, stored.revision))
        }
        None => None,
    };
    if !super::proposal_expected(current, expect, p) {
        return Ok(false);
    }
    proposals
        .insert(p.id.as_str(), encode_proposal(p)?.as_slice())
        .map_err(|e| err("write")(e.into()))?;
    Ok(true)
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

fn gc_proposals(proposals: &mut Table<'_>, before_ms: i64) -> Result<usize, StoreError> {
    let mut stale = Vec::new();
    for entry in proposals.iter().map_err(|e| err("scan")(e.into()))? {
        let (k, v) = entry.map_err(|e| err("scan")(e.into()))?;
        let p = decode_proposal(v.value())?;
        if proposal_final(&p) && p.updated_ms < before_ms {
            stale.push(k.value().to_owned());
        }
    }
    for k in &stale {
        proposals
            .remove(k.as_str())
            .map_err(|e| err("delete")(e.into()))?;
    }
    Ok(stale.len())
}

impl Store for RedbStore {
    fn unflushed(&self) -> bool {
        self.dirty.load(Ordering::Acquire)
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move { read(&self.read_table()?, key) })
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
            let txn = self
                .db
                .begin_read()
                .map_err(|e| err("begin read")(e.into()))?;
            let table = txn
                .open_table(OUTBOX)
                .map_err(|e| err("open table")(e.into()))?;
            let mut out = Vec::new();
            for entry in table.iter().map_err(|e| err("scan")(e.into()))? {
                let (k, v) = entry.map_err(|e| err("scan")(e.into()))?;
                out.push((k.value(), v.value().to_owned()));
            }
            Ok(out)
        })
    }

    fn outbox_clear(&self, upto: u64) -> StoreFuture<'_, usize> {
        self.submit(|reply| Op::OutboxClear { upto, reply })
    }

    fn recover<'a>(&'a self) -> StoreFuture<'a, Recovery> {
        Box::pin(async move {
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

    fn list<'a>(&'a self, state: Option<State>) -> StoreFuture<'a, Vec<(String, Record)>> {
        Box::pin(async move {
            let table = self.read_table()?;
            let mut out = Vec::new();
            for entry in table.iter().map_err(|e| err("scan")(e.into()))? {
                let (k, v) = entry.map_err(|e| err("scan")(e.into()))?;
                let r = decode(v.value())?;
                if state.is_none_or(|s| r.state == s) {
                    out.push((k.value().to_owned(), r));
                }
            }
            Ok(out)
        })
    }
}
