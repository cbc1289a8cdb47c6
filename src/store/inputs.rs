//! Decision inputs kept for `policy diff` (`[policy] inputs`, DESIGN.md
//! section 22).

use super::{StoreError, StoreFuture};

/// One call's decision inputs as the store keeps them: `key` orders them by
/// time (`{time_ms:020}-{unique}`), `inputs` is their JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputRow {
    pub key: String,
    pub tenant: String,
    pub time_ms: i64,
    pub inputs: String,
}

/// Decision inputs, by time.
pub trait Inputs: Send + Sync {
    /// Keep `rows` of decision inputs (`[policy] inputs`, DESIGN.md section
    /// 22). Not durable: a crash may lose the last ones, which only makes a
    /// later `policy diff` see fewer calls.
    fn inputs_put(&self, rows: Vec<InputRow>) -> StoreFuture<'_, ()> {
        drop(rows);
        Box::pin(std::future::ready(Err(inputs_unsupported())))
    }

    /// Decision inputs from `since_ms` on, oldest first, of one tenant or
    /// of all.
    fn inputs_since(
        &self,
        since_ms: i64,
        tenant: Option<String>,
    ) -> StoreFuture<'_, Vec<InputRow>> {
        let _ = (since_ms, tenant);
        Box::pin(std::future::ready(Err(inputs_unsupported())))
    }

    /// Forget every decision input of `tenant`; returns how many.
    fn inputs_erase(&self, tenant: String) -> StoreFuture<'_, usize> {
        drop(tenant);
        Box::pin(std::future::ready(Err(inputs_unsupported())))
    }

    /// Forget decision inputs older than `before_ms`, then the oldest beyond
    /// `max_rows`; returns how many.
    fn inputs_gc(&self, before_ms: i64, max_rows: usize) -> StoreFuture<'_, usize> {
        let _ = (before_ms, max_rows);
        Box::pin(std::future::ready(Err(inputs_unsupported())))
    }
}

pub(super) fn inputs_unsupported() -> StoreError {
    StoreError::Backend {
        op: "decision inputs",
        reason: "this store does not keep decision inputs".into(),
        cause: None,
    }
}

/// Which of `rows` (sorted by key, oldest first) `inputs_gc` removes.
pub(super) fn inputs_stale<'r>(
    rows: impl Iterator<Item = (&'r str, i64)> + Clone,
    before_ms: i64,
    max_rows: usize,
) -> Vec<String> {
    let total = rows.clone().count();
    let mut out = Vec::new();
    for (i, (key, time_ms)) in rows.enumerate() {
        // Old, or among the oldest beyond the cap.
        if time_ms < before_ms || total - i > max_rows {
            out.push(key.to_owned());
        }
    }
    out
}
