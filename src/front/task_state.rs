//! What this gateway knows of tasks beyond the store (DESIGN.md section
//! 24): its own name in execution claims, the tasks it is running now, and
//! the changes that wake a client waiting on `tasks/result`. Nothing here is
//! a source of truth: the store is, and every decision reads it again.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::core::identity::SubjectToken;

use parking_lot::Mutex;
use tokio::sync::broadcast;

/// The runner's state on one gateway.
pub(crate) struct Runner {
    /// This process's name in the claims it writes: random per start, so a
    /// claim left by an earlier run of this very gateway is known as
    /// someone else's (and taken over when stale).
    me: String,
    /// Tasks this process is driving now: one driver per task here (the
    /// store's compare-and-set keeps it one across gateways).
    running: Mutex<HashSet<String>>,
    /// Ids of tasks that changed (here, or through the shared store).
    changed: broadcast::Sender<String>,
    /// The caller's access token of each task waiting here for a server
    /// that delegates (DESIGN.md section 23): kept in memory only, never in
    /// the store, so the gateway that made the task can mint the delegated
    /// token when it runs the call. Another gateway, or this one after a
    /// restart, has none: such a run is refused (`delegation_unavailable`).
    subjects: Mutex<HashMap<String, Arc<SubjectToken>>>,
}

/// At most this many callers' tokens are kept for waiting tasks; past it
/// (after expired ones are dropped) a new one is not kept, and its task's
/// run is refused rather than made with anything else.
const MAX_SUBJECTS: usize = 10_000;

impl Default for Runner {
    fn default() -> Runner {
        let bytes: [u8; 8] = rand::random();
        Runner {
            me: format!("gw-{}", hex::encode(bytes)),
            running: Mutex::default(),
            changed: broadcast::channel(1024).0,
            subjects: Mutex::default(),
        }
    }
}

impl Runner {
    /// This process's name in claims.
    pub(crate) fn me(&self) -> &str {
        &self.me
    }

    /// Start driving task `id` here; `None` when it is driven here already.
    /// The guard ends it when dropped.
    pub(crate) fn start(&self, id: &str) -> Option<Driving<'_>> {
        self.running.lock().insert(id.to_owned()).then(|| Driving {
            runner: self,
            id: id.to_owned(),
        })
    }

    /// Whether task `id` is being driven here.
    pub(crate) fn is_running(&self, id: &str) -> bool {
        self.running.lock().contains(id)
    }

    /// Task `id` changed: wake whoever waits on it.
    pub(crate) fn changed(&self, id: &str) {
        // No receivers is fine: nobody waits.
        let _ = self.changed.send(id.to_owned());
    }

    /// Changes from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<String> {
        self.changed.subscribe()
    }

    /// Keep `subject` for task `id` until it ends (`now_ms`: to drop the
    /// expired ones when full). `false`: not kept.
    pub(crate) fn keep_subject(&self, id: &str, subject: Arc<SubjectToken>, now_ms: i64) -> bool {
        let mut subjects = self.subjects.lock();
        if subjects.len() >= MAX_SUBJECTS {
            subjects.retain(|_, s| s.expires_ms > now_ms);
        }
        if subjects.len() >= MAX_SUBJECTS && !subjects.contains_key(id) {
            return false;
        }
        subjects.insert(id.to_owned(), subject);
        true
    }

    /// The caller's token kept for task `id`, if this gateway has it.
    pub(crate) fn subject(&self, id: &str) -> Option<Arc<SubjectToken>> {
        self.subjects.lock().get(id).cloned()
    }

    /// Task `id` ended: its caller's token goes.
    pub(crate) fn forget_subject(&self, id: &str) {
        self.subjects.lock().remove(id);
    }
}

/// A task being driven here; ends when dropped.
pub(crate) struct Driving<'a> {
    runner: &'a Runner,
    id: String,
}

impl Drop for Driving<'_> {
    fn drop(&mut self) {
        self.runner.running.lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_driver_per_task_here() {
        let r = Runner::default();
        let first = r.start("t1");
        assert!(first.is_some());
        assert!(r.start("t1").is_none(), "a second driver is refused");
        assert!(r.is_running("t1"));
        drop(first);
        assert!(!r.is_running("t1"));
        assert!(r.start("t1").is_some());
        assert_ne!(
            Runner::default().me(),
            r.me(),
            "each start names itself anew"
        );
    }

    #[test]
    fn a_callers_token_is_kept_for_its_task_only_until_it_ends() {
        let r = Runner::default();
        let token = Arc::new(SubjectToken {
            issuer: "corp".into(),
            token: "secret".into(),
            expires_ms: 10,
        });
        assert!(r.keep_subject("t1", token.clone(), 0));
        assert_eq!(r.subject("t1"), Some(token));
        assert!(r.subject("t2").is_none(), "never another task's");
        r.forget_subject("t1");
        assert!(r.subject("t1").is_none());
    }
}
