//! What redb does not hold yet: the writer's changes since its last
//! checkpoint (what the journal holds, and reservations), which readers
//! look at before redb, and how they are folded into a redb transaction.

use std::collections::{BTreeMap, HashMap};

use redb::ReadableTable;

use super::{encode, err, guards, JOURNAL_GENERATION, LEDGER, META, OUTBOX};
use crate::core::ledger::Record;
use crate::store::StoreError;

/// What the writer changed since its last checkpoint and redb does not hold
/// yet: what the journal holds, and reservations (kept only here: a crash
/// frees a reserved key anyway). Readers look here first, then in redb. The
/// writer clears it only after the checkpoint's commit, so a reader that
/// misses here finds the change in redb.
#[derive(Default, Clone)]
pub(super) struct Pending {
    pub(super) ledger: HashMap<String, Record>,
    pub(super) outbox: BTreeMap<u64, String>,
    /// Outbox rows up to this id are gone (from redb at the checkpoint).
    pub(super) cleared: Option<u64>,
    /// The guards' changes of dispatched calls, in order.
    pub(super) guards: Vec<Vec<crate::store::guards::Change>>,
}

impl Pending {
    /// A copy of the outbox part alone (what outbox reads need).
    pub(super) fn outbox_only(&self) -> Pending {
        Pending {
            ledger: HashMap::new(),
            outbox: self.outbox.clone(),
            cleared: self.cleared,
            guards: Vec::new(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.ledger.is_empty()
            && self.outbox.is_empty()
            && self.cleared.is_none()
            && self.guards.is_empty()
    }

    pub(super) fn apply(&mut self, effects: Vec<Effect>) {
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
pub(super) enum Effect {
    Put(String, Record),
    Outbox(u64, String),
    Clear(u64),
    Guards(Vec<crate::store::guards::Change>),
}

/// The outbox rows redb holds that `pending` has not cleared, with
/// `pending`'s own rows.
pub(super) fn outbox_rows(
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

/// Write `pending` into `txn` (records, outbox clears, outbox rows, in the
/// order they were made) and record `generation` as the journal's next.
pub(super) fn fold(
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

pub(super) fn set_generation(
    txn: &redb::WriteTransaction,
    generation: u64,
) -> Result<(), StoreError> {
    txn.open_table(META)
        .map_err(|e| err("open table")(e.into()))?
        .insert(JOURNAL_GENERATION, generation)
        .map_err(|e| err("write")(e.into()))?;
    Ok(())
}

pub(super) fn outbox_clear(
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
