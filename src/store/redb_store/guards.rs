//! Guards on redb (DESIGN.md section 25): one table of rows and their index
//! by ledger key ([`crate::store::guards`]). A take is one write
//! transaction, fsynced before it answers: redb runs one write transaction
//! at a time, so the check and the rows are one compare-and-set, and a
//! call's spending is on disk before it is dispatched. A release need not
//! be: lost to a crash, it counts a call that was not sent (the safe side).

use redb::{Durability, ReadableTable, TableDefinition};

use super::{blocking, decode_json, err, RedbStore};
use crate::core::guard::Claim;
use crate::store::guards::{
    look_in, release_in, rows_in, take_in, GuardRow, Standing, Table, Taken,
};
use crate::store::{StoreError, StoreFuture};

/// Guard rows and their index (see `store::guards`).
pub(super) const GUARDS: TableDefinition<&str, &[u8]> = TableDefinition::new("guards");

struct Rows<T>(T);

fn encode(row: &GuardRow) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(row).map_err(|e| StoreError::Encode {
        what: "guard row",
        reason: e.to_string(),
    })
}

fn range(
    t: &impl ReadableTable<&'static str, &'static [u8]>,
    from: &str,
    to: &str,
) -> Result<Vec<(String, GuardRow)>, StoreError> {
    if from >= to {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for item in t.range(from..to).map_err(|e| err("scan")(e.into()))? {
        let (k, v) = item.map_err(|e| err("scan")(e.into()))?;
        out.push((k.value().to_owned(), decode_json("guard row", v.value())?));
    }
    Ok(out)
}

fn get(
    t: &impl ReadableTable<&'static str, &'static [u8]>,
    key: &str,
) -> Result<Option<GuardRow>, StoreError> {
    match t.get(key).map_err(|e| err("read")(e.into()))? {
        Some(v) => decode_json("guard row", v.value()).map(Some),
        None => Ok(None),
    }
}

impl Table for Rows<redb::Table<'_, &'static str, &'static [u8]>> {
    fn range(&self, from: &str, to: &str) -> Result<Vec<(String, GuardRow)>, StoreError> {
        range(&self.0, from, to)
    }

    fn get(&self, key: &str) -> Result<Option<GuardRow>, StoreError> {
        get(&self.0, key)
    }

    fn put(&mut self, key: &str, row: &GuardRow) -> Result<(), StoreError> {
        self.0
            .insert(key, encode(row)?.as_slice())
            .map_err(|e| err("write")(e.into()))?;
        Ok(())
    }

    fn delete(&mut self, key: &str) -> Result<(), StoreError> {
        self.0.remove(key).map_err(|e| err("write")(e.into()))?;
        Ok(())
    }
}

impl Table for Rows<redb::ReadOnlyTable<&'static str, &'static [u8]>> {
    fn range(&self, from: &str, to: &str) -> Result<Vec<(String, GuardRow)>, StoreError> {
        range(&self.0, from, to)
    }

    fn get(&self, key: &str) -> Result<Option<GuardRow>, StoreError> {
        get(&self.0, key)
    }

    fn put(&mut self, _: &str, _: &GuardRow) -> Result<(), StoreError> {
        Err(read_only())
    }

    fn delete(&mut self, _: &str) -> Result<(), StoreError> {
        Err(read_only())
    }
}

fn read_only() -> StoreError {
    StoreError::Backend {
        op: "guards",
        reason: "a write in a read transaction".into(),
    }
}

fn write<T: Send + 'static>(
    store: &RedbStore,
    durability: Durability,
    f: impl FnOnce(&mut Rows<redb::Table<'_, &'static str, &'static [u8]>>) -> Result<T, StoreError>
        + Send
        + 'static,
) -> StoreFuture<'_, T> {
    let db = store.db.clone();
    Box::pin(blocking(move || {
        let mut txn = db.begin_write().map_err(|e| err("begin")(e.into()))?;
        txn.set_durability(durability);
        let out = {
            let mut rows = Rows(
                txn.open_table(GUARDS)
                    .map_err(|e| err("open table")(e.into()))?,
            );
            f(&mut rows)?
        };
        txn.commit().map_err(|e| err("commit")(e.into()))?;
        Ok(out)
    }))
}

pub(super) fn look<'a>(
    store: &'a RedbStore,
    key: &'a str,
    claims: &'a [Claim],
    now_ms: i64,
) -> StoreFuture<'a, Standing> {
    Box::pin(async move {
        let rows = Rows(store.read(GUARDS)?);
        look_in(&rows, key, claims, now_ms).map(|l| l.0)
    })
}

pub(super) fn take<'a>(
    store: &'a RedbStore,
    key: &'a str,
    claims: &'a [Claim],
    force: bool,
    now_ms: i64,
) -> StoreFuture<'a, Taken> {
    let (key, claims) = (key.to_owned(), claims.to_vec());
    write(store, Durability::Immediate, move |rows| {
        take_in(rows, &key, &claims, force, now_ms)
    })
}

pub(super) fn release<'a>(store: &'a RedbStore, key: &'a str) -> StoreFuture<'a, usize> {
    let key = key.to_owned();
    write(store, Durability::None, move |rows| release_in(rows, &key))
}

pub(super) fn rows(store: &RedbStore, since_ms: i64) -> StoreFuture<'_, Vec<GuardRow>> {
    Box::pin(async move { rows_in(&Rows(store.read(GUARDS)?), since_ms) })
}
