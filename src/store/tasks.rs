//! Tasks in the store (DESIGN.md section 24): the rules every store keeps
//! the same way (which task a held call joins, which write a
//! compare-and-set lets through, which tasks a filter selects), and the
//! conformance suite the three stores run.
//!
//! A task is stored as its JSON ([`TaskRecord`]), keyed by id. Every write
//! after the first is a compare-and-set on `revision`: the execution claim
//! (`waiting → claimed`) and a cancel (`waiting → cancelled`) read the same
//! revision, and exactly one of them is written.

use crate::core::task::TaskRecord;

use super::{StoreError, StoreFuture};

/// Tasks (DESIGN.md section 24). A store without them (a wrapper in a
/// test) refuses every call.
pub trait Tasks: Send + Sync {
    /// Create `task` (revision 0), unless a task of the same requester
    /// still waits on the same proposal with the same key
    /// ([`tasks::joins`]): then that one is returned and nothing is written.
    /// Durable before it returns: the answer that names the task leaves
    /// after it (DESIGN.md section 24).
    fn task_create(&self, task: TaskRecord) -> StoreFuture<'_, TaskRecord> {
        drop(task);
        Box::pin(std::future::ready(Err(StoreError::NoTasks)))
    }

    /// A task by id (a read: never a write, however often a client polls).
    fn task_get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<TaskRecord>> {
        let _ = id;
        Box::pin(std::future::ready(Err(StoreError::NoTasks)))
    }

    /// The tasks `filter` selects.
    fn tasks(&self, filter: TaskFilter) -> StoreFuture<'_, Vec<TaskRecord>> {
        drop(filter);
        Box::pin(std::future::ready(Err(StoreError::NoTasks)))
    }

    /// Write `task` if the stored one is at the revision before
    /// `task.revision` (compare-and-set); returns whether it did. Durable
    /// before it returns. The execution claim and a cancel are two such
    /// writes from `waiting`: exactly one of them wins.
    fn task_put(&self, task: TaskRecord) -> StoreFuture<'_, bool> {
        drop(task);
        Box::pin(std::future::ready(Err(StoreError::NoTasks)))
    }

    /// Forget ended tasks last changed before `before_ms`; returns how many.
    fn tasks_gc(&self, before_ms: i64) -> StoreFuture<'_, usize> {
        let _ = before_ms;
        Box::pin(std::future::ready(Err(StoreError::NoTasks)))
    }
}

/// Which tasks [`super::Tasks::tasks`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskFilter {
    /// Every task of one requester, newest first.
    Owner {
        /// The requester's tenant.
        tenant: String,
        /// The requester.
        principal: String,
    },
    /// Every task that has not ended (the runner's sweep).
    Open,
    /// The tasks that have not ended and wait on this proposal.
    Proposal(String),
}

impl TaskFilter {
    /// Whether `t` is selected.
    pub fn selects(&self, t: &TaskRecord) -> bool {
        match self {
            TaskFilter::Owner { tenant, principal } => {
                &t.tenant == tenant && &t.principal == principal
            }
            TaskFilter::Open => !t.state.terminal(),
            TaskFilter::Proposal(p) => {
                !t.state.terminal() && t.proposal_id.as_deref() == Some(p.as_str())
            }
        }
    }
}

/// Whether a new held call `new` joins the stored task `old`: the same
/// requester, tool, key and proposal, and `old` not ended. A repeated
/// identical held call gets the same task, never a second one.
pub fn joins(old: &TaskRecord, new: &TaskRecord) -> bool {
    !old.state.terminal()
        && old.tenant == new.tenant
        && old.principal == new.principal
        && old.server == new.server
        && old.tool == new.tool
        && old.key == new.key
        && old.proposal_id.is_some()
        && old.proposal_id == new.proposal_id
}

/// Whether `next` may replace the stored `current` (compare-and-set on the
/// revision), and leaves an ended task as it ended.
pub fn may_write(current: Option<&TaskRecord>, next: &TaskRecord) -> bool {
    match current {
        None => false,
        // INVARIANT: an ended task never changes again (a late claim, a
        // late cancel, a second finish are all refused here).
        Some(c) if c.state.terminal() => false,
        Some(c) => c.revision.wrapping_add(1) == next.revision,
    }
}

/// Newest first, then by id: the order `tasks/list` shows.
pub fn newest_first(tasks: &mut [TaskRecord]) {
    tasks.sort_by(|a, b| b.created_ms.cmp(&a.created_ms).then(b.id.cmp(&a.id)));
}

/// Whether the garbage collector may forget `t` (ended before `before_ms`).
pub fn collectable(t: &TaskRecord, before_ms: i64) -> bool {
    t.state.terminal() && t.updated_ms < before_ms
}

#[cfg(test)]
pub(crate) mod conformance {
    use super::*;
    use crate::core::task::{Disposition, TaskState};
    use crate::store::Store;
    use serde_json::json;

    pub(crate) fn task(id: &str, key: &str, proposal: &str, created_ms: i64) -> TaskRecord {
        TaskRecord {
            id: id.into(),
            revision: 0,
            tenant: "acme".into(),
            principal: "agent-7".into(),
            groups: vec!["agents".into()],
            scopes: vec![],
            client: None,
            aka: vec![],
            server: "payments".into(),
            tool: "charge_card".into(),
            key: key.into(),
            scope: Some("session-1".into()),
            params: json!({"name": "charge_card", "arguments": {"amount": 5}}),
            proposal_id: Some(proposal.into()),
            state: TaskState::Waiting,
            claimed_by: None,
            claimed_ms: None,
            created_ms,
            updated_ms: created_ms,
            status_message: Some("waiting".into()),
            result: None,
            disposition: None,
            error: None,
            upstream: None,
        }
    }

    /// What every store does with tasks: create and join, read, list per
    /// owner and open, one winner between claim and cancel, ended tasks
    /// frozen, collection of ended tasks only.
    pub(crate) async fn tasks_conformance(store: &dyn Store) {
        let a = task("t-a", "k1", "p1", 10);
        let made = store.task_create(a.clone()).await.unwrap();
        assert_eq!(made, a);
        // The same held call again (same key, same proposal) joins it.
        let again = store
            .task_create(task("t-other", "k1", "p1", 11))
            .await
            .unwrap();
        assert_eq!(again.id, "t-a", "an identical held call joins the task");
        assert!(store.task_get("t-other").await.unwrap().is_none());
        // Another key makes another task.
        let b = store
            .task_create(task("t-b", "k2", "p1", 12))
            .await
            .unwrap();
        assert_eq!(b.id, "t-b");
        assert_eq!(store.task_get("t-a").await.unwrap(), Some(a.clone()));
        assert!(store.task_get("missing").await.unwrap().is_none());

        let mine = store
            .tasks(TaskFilter::Owner {
                tenant: "acme".into(),
                principal: "agent-7".into(),
            })
            .await
            .unwrap();
        assert_eq!(
            mine.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
            ["t-b", "t-a"]
        );
        let theirs = store
            .tasks(TaskFilter::Owner {
                tenant: "globex".into(),
                principal: "agent-7".into(),
            })
            .await
            .unwrap();
        assert!(theirs.is_empty(), "another tenant sees none");
        assert_eq!(
            store
                .tasks(TaskFilter::Proposal("p1".into()))
                .await
                .unwrap()
                .len(),
            2
        );

        // Claim and cancel read the same revision: one wins.
        let claim = a.next(20, |t| {
            t.state = TaskState::Claimed;
            t.claimed_by = Some("gw-1".into());
        });
        let cancel = a.next(20, |t| t.state = TaskState::Cancelled);
        assert!(store.task_put(claim.clone()).await.unwrap());
        assert!(!store.task_put(cancel).await.unwrap(), "the cancel lost");
        assert_eq!(store.task_get("t-a").await.unwrap(), Some(claim.clone()));
        let done = claim.next(30, |t| {
            t.state = TaskState::Completed;
            t.result = Some(json!({"content": []}));
            t.disposition = Some(Disposition::ApprovedExecuted);
        });
        assert!(store.task_put(done.clone()).await.unwrap());
        // Ended: nothing changes it again, whatever the revision.
        let late = done.next(40, |t| t.state = TaskState::Cancelled);
        assert!(!store.task_put(late).await.unwrap());
        // A task never created cannot be written.
        assert!(!store
            .task_put(task("t-none", "k9", "p9", 1).next(2, |_| {}))
            .await
            .unwrap());
        // A finished task no longer takes joiners: the same call again
        // makes a new one.
        let fresh = store
            .task_create(task("t-c", "k1", "p1", 50))
            .await
            .unwrap();
        assert_eq!(fresh.id, "t-c");
        let open: Vec<String> = store
            .tasks(TaskFilter::Open)
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.id)
            .collect();
        assert!(open.contains(&"t-b".to_owned()) && open.contains(&"t-c".to_owned()));
        assert!(!open.contains(&"t-a".to_owned()));

        // Collection takes ended tasks only.
        assert_eq!(store.tasks_gc(31).await.unwrap(), 1);
        assert!(store.task_get("t-a").await.unwrap().is_none());
        assert!(store.task_get("t-b").await.unwrap().is_some());
        assert_eq!(store.tasks_gc(i64::MAX).await.unwrap(), 0);
    }
}
