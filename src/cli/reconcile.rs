//! `countersign reconcile`: an operator settles an `unknown` outcome.
//!
//! Works directly on a stopped gateway's ledger (`gateway.data_dir`), or,
//! while a gateway runs (its ledger file is locked), through its control
//! API (`POST /v1/outcomes/reconcile`, signed by a reviewer), which
//! settles it on the live store with the same rules
//! ([`crate::enforce::reconcile`]).

use crate::core::config::Config;
use crate::core::ledger::Record;
use crate::enforce::reconcile::{
    list_unknown_in, reconcile_in, reconciled_fields, Keep, ReconcileError, Verdict,
};
use crate::store::{RedbStore, Store};

/// Open a stopped gateway's ledger. Holding the file lock proves no gateway
/// runs on it, so calls left `dispatched` have unknown outcomes: recover
/// first, as the gateway would on start.
async fn open(config: &Config) -> Result<RedbStore, ReconcileError> {
    // A shared ledger has no "stopped gateway" to stand in for: other
    // gateways may run on it. Reconcile through one of them.
    if config.store.url.is_some() {
        return Err(ReconcileError::Store(crate::store::StoreError::Open {
            path: "store.url".into(),
            reason: "the ledger is in PostgreSQL, shared by running gateways: reconcile through one of them \
                     (--reviewer-key FILE --gateway URL)"
                .into(),
        }));
    }
    let store = RedbStore::open(&crate::cli::store::ledger_path(&config.gateway.data_dir))?;
    store.recover().await?;
    Ok(store)
}

/// Settle one unknown record. The change is durable when this returns.
pub(crate) async fn reconcile(
    config: &Config,
    tenant: &str,
    principal: &str,
    key: &str,
    verdict: Verdict,
    note: Option<String>,
) -> Result<Record, ReconcileError> {
    let store: std::sync::Arc<dyn Store> = std::sync::Arc::new(open(config).await?);
    let audit_err = ReconcileError::Audit;
    // The gateway is stopped (we hold its ledger): this command appends to
    // its audit log itself, first taking over what a crash left in the
    // ledger's outbox (so the log keeps dispatch before reconciliation), and
    // closes it with a signed checkpoint.
    let gateway = crate::cli::store::gateway_id(&config.gateway.data_dir)
        .map_err(|e| audit_err(e.to_string()))?;
    let audit = crate::audit::log::AuditLog::open(
        crate::audit::log::Settings::from_config(config).with_gateway(gateway),
    )
    .map_err(|e| audit_err(e.to_string()))?;
    audit
        .attach_outbox(store.clone())
        .await
        .map_err(audit_err)?;
    let rec = reconcile_in(
        store.as_ref(),
        Keep {
            clock: &crate::core::time::SystemClock,
            retention: config.idempotency.retention,
        },
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

/// The unknown records of a stopped gateway: (tenant, principal, key, record).
pub(crate) async fn list_unknown(
    config: &Config,
) -> Result<Vec<(String, String, String, Record)>, ReconcileError> {
    list_unknown_in(&open(config).await?).await
}
