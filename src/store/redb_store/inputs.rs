//! Decision inputs on redb, in a database file of their own beside the
//! ledger (opened at first use), never fsynced: losing the last ones only
//! makes a later `policy diff` see fewer calls.

use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use redb::{Database, Durability, ReadableTable};

use super::apply::remove_keys;
use super::{blocking, err, open_db, RedbStore, INPUTS};
use crate::store::{inputs_stale, InputRow, Inputs, StoreError, StoreFuture};

/// The decision inputs' database, opened (or made) at first use; under
/// the lock, so that two first uses make it once.
pub(super) fn inputs_db(
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
pub(super) fn inputs_txn<T>(
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
pub(super) fn key_time(key: &str) -> i64 {
    key.get(..20).and_then(|t| t.parse().ok()).unwrap_or(0)
}

pub(super) fn input_row(key: &str, value: &str) -> Result<InputRow, StoreError> {
    let corrupt = || StoreError::Corrupt {
        what: "decision inputs",
        reason: format!("row {key} does not start with its tenant"),
        cause: None,
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

impl Inputs for RedbStore {
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
}
