//! `countersign reconcile`: an operator settles an `unknown` outcome.
//!
//! Works directly on a stopped gateway's ledger (`gateway.data_dir`), or,
//! while a gateway runs (its ledger file is locked), through its control
//! API (`POST /v1/outcomes/reconcile`, signed by a reviewer), which
//! settles it on the live store with the same rules
//! ([`crate::enforce::reconcile`]).

use crate::cli::args::ReconcileArgs;
use crate::cli::out::{out, outln};
use crate::core::config::Config;
use crate::core::ledger::Record;
use crate::enforce::reconcile::{
    list_unknown_in, reconcile_in, reconciled_fields, Keep, ReconcileError, Verdict,
};
use crate::store::{Ledger, RedbStore, Store};
use std::process::ExitCode;

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
            cause: None,
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
    fn audit_err(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> ReconcileError {
        ReconcileError::Audit(e.into())
    }
    // The gateway is stopped (we hold its ledger): this command appends to
    // its audit log itself, first taking over what a crash left in the
    // ledger's outbox (so the log keeps dispatch before reconciliation), and
    // closes it with a signed checkpoint.
    let gateway = crate::cli::store::gateway_id(&config.gateway.data_dir).map_err(audit_err)?;
    let audit = crate::audit::log::AuditLog::open(
        crate::audit::log::Settings::from_config(config).with_gateway(gateway),
    )
    .map_err(audit_err)?;
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

/// `countersign reconcile`: through the running gateway's control API when
/// a reviewer key is given, else on a stopped gateway's ledger.
pub(crate) async fn command(args: ReconcileArgs) -> anyhow::Result<ExitCode> {
    let ReconcileArgs {
        config,
        list,
        key,
        tenant,
        principal,
        executed,
        not_executed: _,
        note,
        result,
        reviewer_key,
        gateway,
    } = args;
    if let Some(key_file) = reviewer_key {
        let c = crate::cli::review::client(&gateway, &key_file)?;
        if list {
            let v = c.call(reqwest::Method::GET, "/v1/outcomes", None).await?;
            for o in v["outcomes"].as_array().into_iter().flatten() {
                outln!(
                    "{}\t{}\t{}\t{}/{}\t{}",
                    o["tenant"].as_str().unwrap_or(""),
                    o["principal"].as_str().unwrap_or(""),
                    o["key"].as_str().unwrap_or(""),
                    o["server"].as_str().unwrap_or(""),
                    o["tool"].as_str().unwrap_or(""),
                    o["call_digest"].as_str().unwrap_or("")
                );
            }
            return Ok(ExitCode::SUCCESS);
        }
        let body = serde_json::json!({
            "tenant": tenant, "principal": principal, "key": key,
            "resolution": if executed { "executed" } else { "not_executed" },
            "note": note, "result": result,
        });
        out!("{}", crate::cli::review::reconcile(&c, &body).await?);
        return Ok(ExitCode::SUCCESS);
    }
    let config = crate::cli::files::load_config(&config)?;
    if list {
        for (t, p, k, r) in crate::cli::reconcile::list_unknown(&config).await? {
            outln!("{t}\t{p}\t{k}\t{}/{}\t{}", r.server, r.tool, r.digest);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let (Some(key), Some(tenant), Some(principal)) = (key, tenant, principal) else {
        anyhow::bail!("reconcile needs KEY, --tenant and --principal");
    };
    let verdict = if executed {
        crate::enforce::reconcile::Verdict::Executed { result }
    } else {
        crate::enforce::reconcile::Verdict::NotExecuted
    };
    let rec =
        crate::cli::reconcile::reconcile(&config, &tenant, &principal, &key, verdict, note).await?;
    outln!(
        "reconciled `{key}` of {principal}@{tenant}: now {:?}",
        rec.state
    );
    Ok(ExitCode::SUCCESS)
}
