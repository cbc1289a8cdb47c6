//! Tasks on PostgreSQL (DESIGN.md section 24): one row per task, its JSON
//! beside the columns the look-ups and the compare-and-set read.

use super::{backend, decode, notify, PgStore, TASKS_CHANNEL};
use crate::store::{StoreError, StoreFuture, Tasks};

/// The key under which a held call joins an open task (see
/// [`crate::store::tasks::joins`]): requester, tool, key and proposal.
fn join_key(t: &crate::core::task::TaskRecord) -> String {
    serde_json::json!([
        t.tenant,
        t.principal,
        t.server,
        t.tool,
        t.key,
        t.proposal_id
    ])
    .to_string()
}

fn encode_task(t: &crate::core::task::TaskRecord) -> Result<String, StoreError> {
    serde_json::to_string(t).map_err(|e| StoreError::Encode {
        what: "task",
        reason: e.to_string(),
        cause: Some(crate::store::Cause::new(e)),
    })
}

pub(super) async fn task_create(
    store: &PgStore,
    task: crate::core::task::TaskRecord,
) -> Result<crate::core::task::TaskRecord, StoreError> {
    let join = join_key(&task);
    let body = encode_task(&task)?;
    let mut client = store.client().await?;
    let txn = client.transaction().await.map_err(backend("begin"))?;
    // Two gateways given the same held call at once: the lock on its
    // join key lets one create the task and the other find it.
    txn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&join])
        .await
        .map_err(backend("lock a task's join key"))?;
    let rows = txn
        .query(
            "SELECT task FROM tasks WHERE join_key = $1 AND state IN ('waiting', 'claimed')",
            &[&join],
        )
        .await
        .map_err(backend("find a task to join"))?;
    for r in &rows {
        let old: crate::core::task::TaskRecord = decode("task", r.get::<_, &str>(0))?;
        if crate::store::tasks::joins(&old, &task) {
            return Ok(old);
        }
    }
    let inserted = txn
        .execute(
            "INSERT INTO tasks (id, tenant, principal, join_key, proposal, state, revision,
                                        created_ms, updated_ms, task)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (id) DO NOTHING",
            &[
                &task.id,
                &task.tenant,
                &task.principal,
                &join,
                &task.proposal_id,
                &task.state.as_str(),
                &(task.revision as i64),
                &task.created_ms,
                &task.updated_ms,
                &body,
            ],
        )
        .await
        .map_err(backend("create a task"))?;
    if inserted == 0 {
        return Err(StoreError::Collision(task.id.clone()));
    }
    notify(&txn, TASKS_CHANNEL, &task.id).await?;
    txn.commit().await.map_err(backend("commit a task"))?;
    Ok(task)
}

pub(super) async fn task_get(
    store: &PgStore,
    id: &str,
) -> Result<Option<crate::core::task::TaskRecord>, StoreError> {
    let client = store.client().await?;
    let row = client
        .query_opt("SELECT task FROM tasks WHERE id = $1", &[&id])
        .await
        .map_err(backend("read a task"))?;
    row.map(|r| decode("task", r.get::<_, &str>(0))).transpose()
}

pub(super) async fn tasks(
    store: &PgStore,
    filter: crate::store::TaskFilter,
) -> Result<Vec<crate::core::task::TaskRecord>, StoreError> {
    let client = store.client().await?;
    let rows = match &filter {
        crate::store::TaskFilter::Owner { tenant, principal } => {
            client
                .query(
                    "SELECT task FROM tasks WHERE tenant = $1 AND principal = $2",
                    &[tenant, principal],
                )
                .await
        }
        crate::store::TaskFilter::Open => {
            client
                .query(
                    "SELECT task FROM tasks WHERE state IN ('waiting', 'claimed')",
                    &[],
                )
                .await
        }
        crate::store::TaskFilter::Proposal(p) => client
            .query(
                "SELECT task FROM tasks WHERE proposal = $1 AND state IN ('waiting', 'claimed')",
                &[p],
            )
            .await,
    }
    .map_err(backend("list tasks"))?;
    let mut out = rows
        .iter()
        .map(|r| decode("task", r.get::<_, &str>(0)))
        .collect::<Result<Vec<crate::core::task::TaskRecord>, _>>()?;
    out.retain(|t| filter.selects(t));
    crate::store::tasks::newest_first(&mut out);
    Ok(out)
}

pub(super) async fn task_put(
    store: &PgStore,
    task: crate::core::task::TaskRecord,
) -> Result<bool, StoreError> {
    let body = encode_task(&task)?;
    let mut client = store.client().await?;
    let txn = client.transaction().await.map_err(backend("begin"))?;
    // INVARIANT: one statement compares and sets: of a claim and a
    // cancel read at the same revision, one updates the row and the
    // other finds it moved on. An ended task is never written again.
    let n = txn
        .execute(
            "UPDATE tasks SET state = $2, proposal = $3, revision = $4::bigint, updated_ms = $5,
                                      join_key = $6, task = $7
                     WHERE id = $1 AND revision = $4::bigint - 1
                       AND state NOT IN ('completed', 'cancelled', 'failed')",
            &[
                &task.id,
                &task.state.as_str(),
                &task.proposal_id,
                &(task.revision as i64),
                &task.updated_ms,
                &join_key(&task),
                &body,
            ],
        )
        .await
        .map_err(backend("write a task"))?;
    if n == 1 {
        notify(&txn, TASKS_CHANNEL, &task.id).await?;
    }
    txn.commit().await.map_err(backend("commit a task"))?;
    Ok(n == 1)
}

pub(super) async fn tasks_gc(store: &PgStore, before_ms: i64) -> Result<usize, StoreError> {
    let client = store.client().await?;
    let n = client
        .execute(
            "DELETE FROM tasks WHERE updated_ms < $1
                       AND state IN ('completed', 'cancelled', 'failed')",
            &[&before_ms],
        )
        .await
        .map_err(backend("collect tasks"))?;
    Ok(n as usize)
}

impl Tasks for PgStore {
    fn task_create(
        &self,
        task: crate::core::task::TaskRecord,
    ) -> StoreFuture<'_, crate::core::task::TaskRecord> {
        Box::pin(task_create(self, task))
    }

    fn task_get<'a>(
        &'a self,
        id: &'a str,
    ) -> StoreFuture<'a, Option<crate::core::task::TaskRecord>> {
        Box::pin(task_get(self, id))
    }

    fn tasks(
        &self,
        filter: crate::store::TaskFilter,
    ) -> StoreFuture<'_, Vec<crate::core::task::TaskRecord>> {
        Box::pin(tasks(self, filter))
    }

    fn task_put(&self, task: crate::core::task::TaskRecord) -> StoreFuture<'_, bool> {
        Box::pin(task_put(self, task))
    }

    fn tasks_gc(&self, before_ms: i64) -> StoreFuture<'_, usize> {
        Box::pin(tasks_gc(self, before_ms))
    }
}
