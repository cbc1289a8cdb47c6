//! Guards on redb (DESIGN.md section 25). One process owns a redb file, so
//! the guards' rows live in memory ([`Memory`]), loaded at open: a take is
//! one compare-and-set under its lock ([`crate::store::guards::take_in`]),
//! and what it changed waits there for its call's dispatch. The writer puts
//! those changes into the journal frame of the call's `dispatched` record
//! (one fsync, the one the dispatch pays anyway), and folds them into the
//! `guards` table at its next checkpoint; a reopen after a crash replays
//! them. A call that is not dispatched releases its share in memory and its
//! changes are dropped: after a crash, only what was dispatched counts.
//! Sums change by differences, so two calls dispatched in the other order
//! than they took add up the same.

use std::collections::{BTreeMap, HashMap};

use redb::{Database, ReadableTable, TableDefinition};

use super::{blocking, decode_json, err, RedbStore};
use crate::core::guard::Claim;
use crate::store::guards::{
    gc_in, look_in, release_in, rows_in, take_in, Change, GuardRow, Recording, Standing, Table,
    Taken,
};
use crate::store::{StoreError, StoreFuture};

/// The guards' rows (`g GROUP AT KEY`, see `store::guards`) of dispatched
/// calls, as of the last checkpoint. Sums and the index by ledger key are
/// made again in memory when the store opens.
pub(super) const GUARDS: TableDefinition<&str, &[u8]> = TableDefinition::new("guards");

/// The guards' rows in memory, and the changes of calls not dispatched yet.
pub(crate) struct Memory {
    rows: crate::store::guards::Rows,
    /// Per ledger key: what its take changed, journaled at its dispatch.
    unsent: HashMap<String, Vec<Change>>,
}

impl Memory {
    /// The rows of the `guards` table, with their sums and index.
    pub(super) fn load(db: &Database) -> Result<Memory, StoreError> {
        let txn = db.begin_read().map_err(|e| err("begin read")(e.into()))?;
        let table = txn
            .open_table(GUARDS)
            .map_err(|e| err("open table")(e.into()))?;
        let mut rows = crate::store::guards::Rows::default();
        for item in table.iter().map_err(|e| err("scan")(e.into()))? {
            let (k, v) = item.map_err(|e| err("scan")(e.into()))?;
            let row: GuardRow = decode_json("guard row", v.value())?;
            rows.insert_row(k.value(), &row)?;
        }
        Ok(Memory {
            rows,
            unsent: HashMap::new(),
        })
    }

    /// The changes the call under `key` made, for its dispatch (taken: a
    /// dispatch happens once).
    pub(super) fn unsent(&mut self, key: &str) -> Option<Vec<Change>> {
        self.unsent.remove(key).filter(|c| !c.is_empty())
    }
}

/// Changes as a journal frame carries them.
pub(super) fn encode(changes: &[Change]) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(changes).map_err(|e| StoreError::Encode {
        what: "guard changes",
        reason: e.to_string(),
    })
}

/// Changes read back from a journal frame.
pub(super) fn decode(bytes: &[u8]) -> Result<Vec<Change>, StoreError> {
    decode_json("guard changes", bytes)
}

/// Fold dispatched calls' changes, in order, into the `guards`
/// table: netted first, so that a row made and pruned between two
/// checkpoints (a short window) costs redb nothing, and a row written once.
pub(super) fn fold(
    txn: &redb::WriteTransaction,
    batches: &[Vec<Change>],
) -> Result<(), StoreError> {
    if batches.is_empty() {
        return Ok(());
    }
    // Row key -> what it is after the changes (None: gone).
    let mut net: BTreeMap<String, Option<GuardRow>> = BTreeMap::new();
    for c in batches.iter().flatten() {
        match c {
            Change::Insert(k, r) => {
                net.insert(k.clone(), Some(r.clone()));
            }
            Change::Remove(k) => {
                net.insert(k.clone(), None);
            }
        }
    }
    let mut table = txn
        .open_table(GUARDS)
        .map_err(|e| err("open table")(e.into()))?;
    for (k, row) in net {
        match row {
            Some(r) => {
                let bytes = serde_json::to_vec(&r).map_err(|e| StoreError::Encode {
                    what: "guard row",
                    reason: e.to_string(),
                })?;
                table
                    .insert(k.as_str(), bytes.as_slice())
                    .map_err(|e| err("write")(e.into()))?;
            }
            None => {
                table
                    .remove(k.as_str())
                    .map_err(|e| err("write")(e.into()))?;
            }
        }
    }
    Ok(())
}

pub(super) fn look<'a>(
    store: &'a RedbStore,
    key: &'a str,
    claims: &'a [Claim],
    now_ms: i64,
) -> StoreFuture<'a, Standing> {
    let out = look_in(&store.guards.lock().rows, key, claims, now_ms).map(|l| l.0);
    Box::pin(async move { out })
}

pub(super) fn take<'a>(
    store: &'a RedbStore,
    key: &'a str,
    claims: &'a [Claim],
    force: bool,
    now_ms: i64,
) -> StoreFuture<'a, Taken> {
    let mut mem = store.guards.lock();
    let Memory { rows, unsent } = &mut *mem;
    let mut t = Recording {
        rows,
        changes: Vec::new(),
    };
    let out = take_in(&mut t, key, claims, force, now_ms);
    if !t.changes.is_empty() {
        unsent.entry(key.to_owned()).or_default().extend(t.changes);
    }
    drop(mem);
    Box::pin(async move { out })
}

pub(super) fn release<'a>(store: &'a RedbStore, key: &'a str) -> StoreFuture<'a, usize> {
    let mut mem = store.guards.lock();
    // Never journaled: the call was not dispatched.
    mem.unsent.remove(key);
    let out = release_in(&mut mem.rows, key);
    drop(mem);
    Box::pin(async move { out })
}

pub(super) fn rows(store: &RedbStore, since_ms: i64) -> StoreFuture<'_, Vec<GuardRow>> {
    let out = rows_in(&store.guards.lock().rows, since_ms);
    Box::pin(async move { out })
}

pub(super) fn gc(store: &RedbStore, now_ms: i64) -> StoreFuture<'_, usize> {
    let gone = gc_in(&mut store.guards.lock().rows, now_ms);
    let db = store.db.clone();
    Box::pin(async move {
        let gone = gone?;
        if gone.is_empty() {
            return Ok(0);
        }
        let n = gone.len();
        // Gone from the table too, in a commit of its own (not fsynced: a
        // row a crash brings back has ended anyway, and the next sweep takes
        // it again). A change of a dispatch folded later can bring one back
        // the same way.
        blocking(move || {
            let mut txn = db.begin_write().map_err(|e| err("begin")(e.into()))?;
            txn.set_durability(redb::Durability::None);
            {
                let mut table = txn
                    .open_table(GUARDS)
                    .map_err(|e| err("open table")(e.into()))?;
                for k in &gone {
                    table
                        .remove(k.as_str())
                        .map_err(|e| err("write")(e.into()))?;
                }
            }
            txn.commit().map_err(|e| err("commit")(e.into()))
        })
        .await?;
        Ok(n)
    })
}

impl crate::store::guards::Guards for RedbStore {
    fn guards_look<'a>(
        &'a self,
        key: &'a str,
        claims: &'a [crate::core::guard::Claim],
        now_ms: i64,
    ) -> StoreFuture<'a, crate::store::guards::Standing> {
        look(self, key, claims, now_ms)
    }

    fn guards_take<'a>(
        &'a self,
        key: &'a str,
        claims: &'a [crate::core::guard::Claim],
        force: bool,
        now_ms: i64,
    ) -> StoreFuture<'a, crate::store::guards::Taken> {
        take(self, key, claims, force, now_ms)
    }

    fn guards_release<'a>(&'a self, key: &'a str) -> StoreFuture<'a, usize> {
        release(self, key)
    }

    fn guards_gc(&self, now_ms: i64) -> StoreFuture<'_, usize> {
        gc(self, now_ms)
    }

    fn guards_rows(&self, since_ms: i64) -> StoreFuture<'_, Vec<crate::store::guards::GuardRow>> {
        rows(self, since_ms)
    }
}
