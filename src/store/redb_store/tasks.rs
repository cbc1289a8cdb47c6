//! Tasks on redb (DESIGN.md section 24): the tasks table and its index of
//! open tasks, every write its own fsynced transaction.

use std::sync::Arc;

use redb::{Database, Durability, ReadableTable};

use super::{blocking, decode_json, err, tasks, RedbStore, OPEN_TASKS, TASKS};
use crate::store::{StoreError, StoreFuture, Tasks};

/// One durable write transaction on the tasks table: `f` reads and writes
/// it, and the commit is fsynced before the answer (a task the client was
/// told of, a claim, a cancel, a result are never lost to a crash). Its own
/// transaction, like a nonce's: tasks never touch the ledger's journal.
async fn task_write<T: Send + 'static>(
    db: Arc<Database>,
    f: impl FnOnce(&mut TaskTables<'_>) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    blocking(move || {
        let mut txn = db.begin_write().map_err(|e| err("begin")(e.into()))?;
        txn.set_durability(Durability::Immediate);
        let out = {
            let mut tables = TaskTables {
                tasks: txn
                    .open_table(TASKS)
                    .map_err(|e| err("open table")(e.into()))?,
                open: txn
                    .open_table(OPEN_TASKS)
                    .map_err(|e| err("open table")(e.into()))?,
            };
            f(&mut tables)?
        };
        txn.commit().map_err(|e| err("commit")(e.into()))?;
        Ok(out)
    })
    .await
}

/// The tasks table and its index of open tasks, written together.
struct TaskTables<'t> {
    tasks: redb::Table<'t, &'static str, &'static [u8]>,
    open: redb::Table<'t, &'static str, &'static str>,
}

impl TaskTables<'_> {
    /// Write `t`, and keep the index of open tasks in step with it.
    fn put(&mut self, t: &crate::core::task::TaskRecord) -> Result<(), StoreError> {
        let bytes = encode_task(t)?;
        self.tasks
            .insert(t.id.as_str(), bytes.as_slice())
            .map_err(|e| err("write")(e.into()))?;
        if t.state.terminal() {
            self.open
                .remove(t.id.as_str())
                .map_err(|e| err("write")(e.into()))?;
        } else {
            self.open
                .insert(t.id.as_str(), t.proposal_id.as_deref().unwrap_or(""))
                .map_err(|e| err("write")(e.into()))?;
        }
        Ok(())
    }

    fn get(&self, id: &str) -> Result<Option<crate::core::task::TaskRecord>, StoreError> {
        match self.tasks.get(id).map_err(|e| err("read")(e.into()))? {
            Some(v) => decode_task(v.value()).map(Some),
            None => Ok(None),
        }
    }
}

/// The open tasks (those `open` lists), read from `tasks`.
fn open_tasks(
    tasks: &impl ReadableTable<&'static str, &'static [u8]>,
    open: &impl ReadableTable<&'static str, &'static str>,
    proposal: Option<&str>,
) -> Result<Vec<crate::core::task::TaskRecord>, StoreError> {
    let mut out = Vec::new();
    for entry in open.iter().map_err(|e| err("scan")(e.into()))? {
        let (k, p) = entry.map_err(|e| err("scan")(e.into()))?;
        if proposal.is_some_and(|want| want != p.value()) {
            continue;
        }
        if let Some(v) = tasks.get(k.value()).map_err(|e| err("read")(e.into()))? {
            out.push(decode_task(v.value())?);
        }
    }
    Ok(out)
}

fn decode_task(bytes: &[u8]) -> Result<crate::core::task::TaskRecord, StoreError> {
    decode_json("task", bytes)
}

fn encode_task(t: &crate::core::task::TaskRecord) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(t).map_err(|e| StoreError::Encode {
        what: "task",
        reason: e.to_string(),
        cause: Some(crate::store::Cause::new(e)),
    })
}

fn all_tasks(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
) -> Result<Vec<crate::core::task::TaskRecord>, StoreError> {
    let mut out = Vec::new();
    for entry in table.iter().map_err(|e| err("scan")(e.into()))? {
        let (_, v) = entry.map_err(|e| err("scan")(e.into()))?;
        out.push(decode_task(v.value())?);
    }
    Ok(out)
}

/// `Store::task_create` on redb.
pub(super) fn task_create(
    store: &RedbStore,
    task: crate::core::task::TaskRecord,
) -> StoreFuture<'_, crate::core::task::TaskRecord> {
    Box::pin(task_write(store.db.clone(), move |t| {
        // Only an open task is joined: the index holds them all.
        if let Some(old) = open_tasks(&t.tasks, &t.open, task.proposal_id.as_deref())?
            .into_iter()
            .find(|old| crate::store::tasks::joins(old, &task))
        {
            return Ok(old);
        }
        if t.get(&task.id)?.is_some() {
            return Err(StoreError::Collision(task.id.clone()));
        }
        t.put(&task)?;
        Ok(task)
    }))
}

/// `Store::task_get` on redb.
pub(super) fn task_get<'a>(
    store: &'a RedbStore,
    id: &'a str,
) -> StoreFuture<'a, Option<crate::core::task::TaskRecord>> {
    Box::pin(async move {
        match store
            .read(TASKS)?
            .get(id)
            .map_err(|e| err("read")(e.into()))?
        {
            Some(v) => decode_task(v.value()).map(Some),
            None => Ok(None),
        }
    })
}

/// `Store::tasks` on redb.
pub(super) fn tasks(
    store: &RedbStore,
    filter: crate::store::TaskFilter,
) -> StoreFuture<'_, Vec<crate::core::task::TaskRecord>> {
    Box::pin(async move {
        let txn = store
            .db
            .begin_read()
            .map_err(|e| err("begin read")(e.into()))?;
        let tasks = txn
            .open_table(TASKS)
            .map_err(|e| err("open table")(e.into()))?;
        let mut out: Vec<_> = match &filter {
            crate::store::TaskFilter::Owner { .. } => all_tasks(&tasks)?,
            crate::store::TaskFilter::Open | crate::store::TaskFilter::Proposal(_) => {
                let open = txn
                    .open_table(OPEN_TASKS)
                    .map_err(|e| err("open table")(e.into()))?;
                let proposal = match &filter {
                    crate::store::TaskFilter::Proposal(p) => Some(p.as_str()),
                    _ => None,
                };
                open_tasks(&tasks, &open, proposal)?
            }
        };
        out.retain(|t| filter.selects(t));
        crate::store::tasks::newest_first(&mut out);
        Ok(out)
    })
}

/// `Store::task_put` on redb.
pub(super) fn task_put(
    store: &RedbStore,
    task: crate::core::task::TaskRecord,
) -> StoreFuture<'_, bool> {
    Box::pin(task_write(store.db.clone(), move |t| {
        // INVARIANT: read and written in one write transaction (redb
        // has one writer at a time): the compare-and-set of a claim and
        // of a cancel cannot interleave.
        let current = t.get(&task.id)?;
        if !crate::store::tasks::may_write(current.as_ref(), &task) {
            return Ok(false);
        }
        t.put(&task)?;
        Ok(true)
    }))
}

/// `Store::tasks_gc` on redb.
pub(super) fn tasks_gc(store: &RedbStore, before_ms: i64) -> StoreFuture<'_, usize> {
    // Looked for first in a read: a sweep with nothing to collect
    // writes (and fsyncs) nothing.
    let none_due = (|| {
        let stale = all_tasks(&store.read(TASKS)?)?
            .iter()
            .any(|t| crate::store::tasks::collectable(t, before_ms));
        Ok::<bool, StoreError>(!stale)
    })();
    match none_due {
        Ok(true) => return Box::pin(std::future::ready(Ok(0))),
        Ok(false) => {}
        Err(e) => return Box::pin(std::future::ready(Err(e))),
    }
    Box::pin(task_write(store.db.clone(), move |t| {
        let stale: Vec<String> = all_tasks(&t.tasks)?
            .into_iter()
            .filter(|t| crate::store::tasks::collectable(t, before_ms))
            .map(|t| t.id)
            .collect();
        for id in &stale {
            t.tasks
                .remove(id.as_str())
                .map_err(|e| err("write")(e.into()))?;
        }
        Ok(stale.len())
    }))
}

impl Tasks for RedbStore {
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
        filter: crate::store::TaskFilter,
    ) -> StoreFuture<'_, Vec<crate::core::task::TaskRecord>> {
        tasks::tasks(self, filter)
    }

    fn task_put(&self, task: crate::core::task::TaskRecord) -> StoreFuture<'_, bool> {
        tasks::task_put(self, task)
    }

    fn tasks_gc(&self, before_ms: i64) -> StoreFuture<'_, usize> {
        tasks::tasks_gc(self, before_ms)
    }
}
