//! One batch of operations as a redb transaction: the ledger's
//! compare-and-sets, proposals with their indexes, pins, nonces and
//! notices.

use parking_lot::Mutex;
use redb::{Database, Durability, ReadableTable, TableDefinition};

use super::pending::{fold, outbox_clear, Pending};
use super::{
    decode, decode_proposal, encode, encode_notice, encode_proposal, err, guards, proposals, Done,
    Op, Table, LEDGER, NOTICES, NOTIFY, OUTBOX, PINS, PROPOSALS,
};
use crate::core::approval::{self, ProposalState};
use crate::core::ledger::{Record, State};
use crate::store::{check_transition, dispatched_only, Reservation, StoreError};

pub(super) fn apply_batch(
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
                Op::Claim {
                    key,
                    record,
                    now_ms,
                    outbox: entries,
                    ..
                } => Done::Transition(
                    claim(opened(&mut ledger, &txn, LEDGER)?, key, record, *now_ms).and_then(
                        |claimed| {
                            // INVARIANT: the outbox row commits with the
                            // claim it records, or not at all.
                            if let (true, Some((id, text))) = (claimed, entries) {
                                opened(&mut outbox_slot, &txn, OUTBOX)?
                                    .insert(*id, text.as_str())
                                    .map_err(|e| err("write")(e.into()))?;
                            }
                            Ok(claimed)
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

/// The table in `slot`, opened in `txn` on first use.
pub(super) fn opened<'s, 't, K: redb::Key + 'static, V: redb::Value + 'static>(
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

pub(super) fn pin_first(
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

pub(super) fn read(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
    key: &str,
) -> Result<Option<Record>, StoreError> {
    match table.get(key).map_err(|e| err("read")(e.into()))? {
        Some(v) => decode(v.value()).map(Some),
        None => Ok(None),
    }
}

pub(super) fn reserve(
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

/// Claim `key` straight as `dispatched` if no record binds it at `now_ms`.
fn claim(
    table: &mut Table<'_>,
    key: &str,
    record: &Record,
    now_ms: i64,
) -> Result<bool, StoreError> {
    dispatched_only(record)?;
    if read(table, key)?.is_some_and(|r| r.binds(now_ms)) {
        return Ok(false);
    }
    table
        .insert(key, encode(record)?.as_slice())
        .map_err(|e| err("write")(e.into()))?;
    Ok(true)
}

pub(super) fn transition(
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

pub(super) fn gc(table: &mut Table<'_>, now_ms: i64) -> Result<usize, StoreError> {
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
pub(super) fn remove_keys<V: redb::Value + 'static>(
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

/// One write transaction over the notification queue and the webhooks'
/// status, fsynced when `durable`.
pub(super) fn queue_txn<T>(
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::store::tests::{claim as claim_of, with_state};

    /// A claim in a batch the journal does not take (one that also holds
    /// a proposal, say) goes through redb's own transaction: a key no
    /// record binds is claimed with its outbox row; a bound one is not,
    /// and leaves no row.
    #[test]
    fn a_claim_in_a_transaction_of_its_own_writes_the_record_and_its_row_together() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.redb");
        drop(super::super::RedbStore::open(&path).unwrap());
        let db = Database::open(&path).unwrap();
        let guards = Mutex::new(guards::Memory::load(&db).unwrap());
        let r = with_state(Record::reserve(&claim_of("d"), 0, 1000), State::Dispatched);
        let op = |key: &str, id: u64| Op::Claim {
            key: key.into(),
            record: r.clone(),
            now_ms: 0,
            outbox: Some((id, format!("[{id}]"))),
            reply: tokio::sync::oneshot::channel().0,
        };
        let done = apply_batch(&db, &[op("a", 1), op("a", 2)], true, None, &guards).unwrap();
        let claimed: Vec<bool> = done
            .into_iter()
            .map(|d| match d {
                Done::Transition(r) => r.unwrap(),
                _ => panic!("a claim answers as a transition"),
            })
            .collect();
        assert_eq!(claimed, vec![true, false], "the second finds the first");
        let txn = db.begin_read().unwrap();
        let ledger = txn.open_table(LEDGER).unwrap();
        assert_eq!(read(&ledger, "a").unwrap(), Some(r));
        let outbox = txn.open_table(OUTBOX).unwrap();
        assert_eq!(outbox.get(1).unwrap().unwrap().value(), "[1]");
        assert!(
            outbox.get(2).unwrap().is_none(),
            "no row for a claim refused"
        );
    }
}
