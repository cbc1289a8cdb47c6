//! `countersign reconcile`: an operator settles an `unknown` outcome.
//!
//! Works directly on a stopped gateway's ledger (`gateway.data_dir`), or,
//! while a gateway runs (its ledger file is locked), through its control
//! API (`POST /v1/outcomes/reconcile`, signed by a reviewer), which calls
//! [`reconcile_in`] on the live store.

use std::path::Path;

use serde_json::json;

use crate::core::config::Config;
use crate::core::ledger::{storage_key, Answer, Record, State};
use crate::store::{RedbStore, Store};

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
    #[error("{0}")]
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
}

/// Open a stopped gateway's ledger. Holding the file lock proves no gateway
/// runs on it, so calls left `dispatched` have unknown outcomes: recover
/// first, as the gateway would on start.
fn open(config: &Config) -> Result<RedbStore, ReconcileError> {
    let store = RedbStore::open(&ledger_path(&config.gateway.data_dir))?;
    store.recover()?;
    Ok(store)
}

/// Where the ledger of a data dir lives.
pub fn ledger_path(data_dir: &Path) -> std::path::PathBuf {
    data_dir.join("ledger.redb")
}

/// Settle one unknown record. The change is durable when this returns.
pub async fn reconcile(
    config: &Config,
    tenant: &str,
    principal: &str,
    key: &str,
    verdict: Verdict,
    note: Option<String>,
) -> Result<Record, ReconcileError> {
    let store: std::sync::Arc<dyn Store> = std::sync::Arc::new(open(config)?);
    let audit_err = |e: String| ReconcileError::Store(crate::store::StoreError(e));
    // The gateway is stopped (we hold its ledger): this command appends to
    // its audit log itself, first taking over what a crash left in the
    // ledger's outbox (so the log keeps dispatch before reconciliation), and
    // closes it with a signed checkpoint.
    let audit = crate::audit::log::AuditLog::open(crate::audit::log::Settings::from_config(config))
        .map_err(|e| audit_err(e.to_string()))?;
    audit
        .attach_outbox(store.clone())
        .await
        .map_err(audit_err)?;
    let rec = reconcile_in(
        store.as_ref(),
        config.idempotency.retention,
        tenant,
        principal,
        key,
        verdict,
        note,
    )
    .await?;
    audit
        .record_durable(
            "reconciled",
            reconciled_fields(tenant, principal, key, &rec, "operator (offline)"),
        )
        .await
        .map_err(audit_err)?;
    audit.close();
    Ok(rec)
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

/// [`reconcile`] on an open store (a running gateway's).
pub async fn reconcile_in(
    store: &dyn Store,
    retention: std::time::Duration,
    tenant: &str,
    principal: &str,
    key: &str,
    verdict: Verdict,
    note: Option<String>,
) -> Result<Record, ReconcileError> {
    let skey = storage_key(tenant, principal, key);
    let Some(rec) = store.get(&skey)? else {
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
            next.answered_at = time::OffsetDateTime::now_utc()
                .format(&time::format_description::well_known::Rfc3339)
                .ok();
            // A reconciled answer is kept like any explicit-key answer,
            // counted from now.
            let now_ms = time::OffsetDateTime::now_utc().unix_timestamp() * 1000;
            let keep = retention.as_millis().min(i64::MAX as u128) as i64;
            next.expires_ms = now_ms.saturating_add(keep);
        }
    }
    if !store.transition(skey, State::Unknown, next.clone()).await? {
        return Err(ReconcileError::NotUnknown(rec.state));
    }
    Ok(next)
}

/// The unknown records of a stopped gateway: (tenant, principal, key, record).
pub fn list_unknown(
    config: &Config,
) -> Result<Vec<(String, String, String, Record)>, ReconcileError> {
    list_unknown_in(&open(config)?)
}

/// [`list_unknown`] on an open store.
pub fn list_unknown_in(
    store: &dyn Store,
) -> Result<Vec<(String, String, String, Record)>, ReconcileError> {
    Ok(store
        .list(Some(State::Unknown))?
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
