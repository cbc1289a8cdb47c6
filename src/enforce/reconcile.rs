//! Reconciliation (DESIGN.md section 3): an operator settles an `unknown`
//! record as `executed` (later retries replay its answer) or `not_executed`
//! (the key is free again). Used by the control API on a running gateway's
//! store and by `countersign reconcile` on a stopped one's.

use serde_json::json;

use crate::core::ledger::{storage_key, Answer, Record, State};
use crate::core::time::{ms, rfc3339, Clock};
use crate::store::Store;

/// What the operator says happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The call ran: later retries replay `result` (or a note that it ran).
    Executed {
        /// A `CallToolResult` JSON to replay, if the operator has one.
        result: Option<String>,
    },
    /// The call did not run: the key is free and the next retry runs it.
    NotExecuted,
}

/// Why reconciliation failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The ledger could not be opened or written.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// No record under that key.
    #[error("no ledger record for key `{key}` of principal `{principal}` in tenant `{tenant}`: check the three values (`countersign reconcile --list` shows unknown records)")]
    NotFound {
        /// Tenant.
        tenant: String,
        /// Principal.
        principal: String,
        /// Key.
        key: String,
    },
    /// The record is not `unknown`.
    #[error("the record is `{0:?}`, not `unknown`: only unknown outcomes are reconciled")]
    NotUnknown(State),
    /// `--result` is not JSON.
    #[error("--result must be a JSON CallToolResult: {0}")]
    BadResult(String),
    /// The audit log could not record the reconciliation (its error kept
    /// as the cause).
    #[error("audit log: {0}")]
    Audit(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// The audit fields of a reconciliation.
pub fn reconciled_fields(
    tenant: &str,
    principal: &str,
    key: &str,
    rec: &Record,
    by: &str,
) -> serde_json::Map<String, serde_json::Value> {
    let mut f = serde_json::Map::new();
    f.insert("call_digest".into(), json!(rec.digest));
    f.insert("idempotency_key".into(), json!(key));
    f.insert("principal".into(), json!(principal));
    f.insert("tenant".into(), json!(tenant));
    f.insert("server".into(), json!(rec.server));
    f.insert("tool".into(), json!(rec.tool));
    f.insert(
        "resolution".into(),
        json!(if rec.state == State::Complete {
            "executed"
        } else {
            "not_executed"
        }),
    );
    f.insert("note".into(), json!(rec.note));
    f.insert("by".into(), json!(by));
    f
}

/// How a reconciled answer is kept: like any explicit-key answer, for
/// `retention` counted from the clock's now.
pub struct Keep<'a> {
    /// When the reconciliation happens.
    pub clock: &'a dyn Clock,
    /// `idempotency.retention`.
    pub retention: std::time::Duration,
}

/// Settle one unknown record of `store` (a running gateway's, or a
/// stopped one's the CLI opened). Durable when this returns.
pub async fn reconcile_in(
    store: &dyn Store,
    keep: Keep<'_>,
    tenant: &str,
    principal: &str,
    key: &str,
    verdict: Verdict,
    note: Option<String>,
) -> Result<Record, ReconcileError> {
    let skey = storage_key(tenant, principal, key);
    let Some(rec) = store.get(&skey).await? else {
        return Err(ReconcileError::NotFound {
            tenant: tenant.into(),
            principal: principal.into(),
            key: key.into(),
        });
    };
    if rec.state != State::Unknown {
        return Err(ReconcileError::NotUnknown(rec.state));
    }
    let mut next = rec.clone();
    next.note = note.clone();
    match verdict {
        Verdict::NotExecuted => next.state = State::NotDispatched,
        Verdict::Executed { result } => {
            let result = match result {
                Some(text) => {
                    serde_json::from_str::<serde_json::Value>(&text)
                        .map_err(|e| ReconcileError::BadResult(e.to_string()))?;
                    text
                }
                None => {
                    let text = format!(
                        "This call ran (an operator reconciled its lost answer{}).",
                        note.as_deref()
                            .map(|n| format!(": {n}"))
                            .unwrap_or_default()
                    );
                    json!({ "content": [{ "type": "text", "text": text }], "isError": false })
                        .to_string()
                }
            };
            next.state = State::Complete;
            next.answer = Some(Answer::Result(result));
            let now = keep.clock.now_ms();
            next.answered_at = Some(rfc3339(now));
            // A reconciled answer is kept like any explicit-key answer,
            // counted from now.
            next.expires_ms = now.saturating_add(ms(keep.retention));
        }
    }
    if !store.transition(skey, State::Unknown, next.clone()).await? {
        return Err(ReconcileError::NotUnknown(rec.state));
    }
    Ok(next)
}

/// The unknown records of `store`: (tenant, principal, key, record).
pub async fn list_unknown_in(
    store: &dyn Store,
) -> Result<Vec<(String, String, String, Record)>, ReconcileError> {
    Ok(store
        .list(Some(State::Unknown))
        .await?
        .into_iter()
        .filter_map(|(k, r)| {
            let parts: Vec<String> = serde_json::from_str(&k).ok()?;
            match parts.as_slice() {
                [t, p, key] => Some((t.clone(), p.clone(), key.clone(), r)),
                _ => None,
            }
        })
        .collect())
}
