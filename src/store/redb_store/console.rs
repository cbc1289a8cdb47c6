//! The review console's entries on redb ([`crate::store::console`]): one
//! table, key → (until, value), each write its own fsynced transaction (a
//! session, a spent challenge, a counter are never lost to a crash, so a
//! replayed assertion stays refused after a restart). The console writes
//! at a person's pace; it never touches the ledger's journal.

use std::sync::Arc;

use redb::{Database, Durability, ReadableTable, ReadableTableMetadata, TableDefinition};

use super::{blocking, err, RedbStore};
use crate::store::console::{counter_follows, last_counter, next_count, ConsoleState, Counted};
use crate::store::{StoreError, StoreFuture};

/// The console's entries: key → (until when it counts, Unix ms; value).
pub(super) const CONSOLE: TableDefinition<&str, (i64, &str)> =
    TableDefinition::new("review_console");

type Table<'t> = redb::Table<'t, &'static str, (i64, &'static str)>;

/// One durable write transaction on the console's table.
async fn write<T: Send + 'static>(
    db: Arc<Database>,
    f: impl FnOnce(&mut Table<'_>) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    blocking(move || {
        let mut txn = db.begin_write().map_err(|e| err("begin")(e.into()))?;
        txn.set_durability(Durability::Immediate);
        let out = {
            let mut table = txn
                .open_table(CONSOLE)
                .map_err(|e| err("open table")(e.into()))?;
            f(&mut table)?
        };
        txn.commit().map_err(|e| err("commit")(e.into()))?;
        Ok(out)
    })
    .await
}

/// The entry under `key`: until, value.
fn entry(table: &Table<'_>, key: &str) -> Result<Option<(i64, String)>, StoreError> {
    Ok(table.get(key).map_err(|e| err("read")(e.into()))?.map(|v| {
        let (until, value) = v.value();
        (until, value.to_owned())
    }))
}

fn put(table: &mut Table<'_>, key: &str, until: i64, value: &str) -> Result<(), StoreError> {
    table
        .insert(key, (until, value))
        .map_err(|e| err("write")(e.into()))?;
    Ok(())
}

impl ConsoleState for RedbStore {
    fn console_put(&self, key: String, value: String, until_ms: i64) -> StoreFuture<'_, ()> {
        Box::pin(write(self.db.clone(), move |t| {
            put(t, &key, until_ms, &value)
        }))
    }

    fn console_get(&self, key: String, now_ms: i64) -> StoreFuture<'_, Option<String>> {
        let db = self.db.clone();
        Box::pin(blocking(move || {
            let txn = db.begin_read().map_err(|e| err("begin")(e.into()))?;
            let table = match txn.open_table(CONSOLE) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(e) => return Err(err("open table")(e.into())),
            };
            let got = table.get(key.as_str()).map_err(|e| err("read")(e.into()))?;
            Ok(got.and_then(|v| {
                let (until, value) = v.value();
                (until > now_ms).then(|| value.to_owned())
            }))
        }))
    }

    fn console_take(&self, key: String, now_ms: i64) -> StoreFuture<'_, Option<String>> {
        Box::pin(write(self.db.clone(), move |t| {
            let was = entry(t, &key)?;
            if was.is_some() {
                t.remove(key.as_str()).map_err(|e| err("write")(e.into()))?;
            }
            Ok(was
                .filter(|(until, _)| *until > now_ms)
                .map(|(_, value)| value))
        }))
    }

    fn console_count(&self, key: String, window_ms: i64, now_ms: i64) -> StoreFuture<'_, u32> {
        Box::pin(write(self.db.clone(), move |t| {
            let was = entry(t, &key)?;
            let (n, until) = next_count(
                was.as_ref().map(|(u, v)| (v.as_str(), *u)),
                window_ms,
                now_ms,
            );
            put(t, &key, until, &n.to_string())?;
            Ok(n)
        }))
    }

    fn passkey_counter(&self, key: String, counter: u32) -> StoreFuture<'_, Counted> {
        Box::pin(write(self.db.clone(), move |t| {
            let last = entry(t, &key)?.map(|(_, v)| last_counter(&v));
            if !counter_follows(last, counter) {
                return Ok(Counted::Behind {
                    last: last.unwrap_or(0),
                });
            }
            put(t, &key, i64::MAX, &counter.to_string())?;
            Ok(Counted::Advanced)
        }))
    }

    fn console_gc(&self, now_ms: i64) -> StoreFuture<'_, usize> {
        let db = self.db.clone();
        Box::pin(async move {
            // Looked at first: a sweep with nothing to forget costs no
            // write (and no fsync).
            let ended = blocking({
                let db = db.clone();
                move || {
                    let txn = db.begin_read().map_err(|e| err("begin")(e.into()))?;
                    let table = txn
                        .open_table(CONSOLE)
                        .map_err(|e| err("open table")(e.into()))?;
                    let mut rows = table.iter().map_err(|e| err("read")(e.into()))?;
                    rows.try_fold(false, |found, row| {
                        let (_, v) = row.map_err(|e| err("read")(e.into()))?;
                        Ok(found || v.value().0 <= now_ms)
                    })
                }
            })
            .await?;
            if !ended {
                return Ok(0);
            }
            gc(db, now_ms).await
        })
    }
}

/// Forget the entries that ended by `now_ms`.
async fn gc(db: Arc<Database>, now_ms: i64) -> Result<usize, StoreError> {
    write(db, move |t| {
        let before = t.len().map_err(|e| err("read")(e.into()))?;
        t.retain(|_, (until, _)| until > now_ms)
            .map_err(|e| err("write")(e.into()))?;
        let after = t.len().map_err(|e| err("read")(e.into()))?;
        Ok(usize::try_from(before.saturating_sub(after)).unwrap_or(usize::MAX))
    })
    .await
}
