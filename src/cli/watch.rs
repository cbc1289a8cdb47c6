//! What a running gateway follows: its policy folder (reloaded when it
//! changes, refused whole when it does not load), the shadow set, and the
//! changes other gateways make in a shared store.

use std::sync::Arc;
use std::time::Duration;

use crate::front::gateway::Gateway;

/// Re-read and publish each proposal another process changed in the shared
/// store: a decision made through another gateway wakes the call held here
/// at once (no polling), and live reviewer views here show it.
pub(super) async fn follow_store(
    gw: Arc<Gateway>,
    mut events: tokio::sync::broadcast::Receiver<crate::store::StoreEvent>,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match events.recv().await {
            Ok(crate::store::StoreEvent::Proposal(id)) => gw.pipeline().book().changed(&id).await,
            Ok(crate::store::StoreEvent::Task(id)) => gw.tasks().changed(&id),
            Ok(crate::store::StoreEvent::Ledger(_)) => {}
            Err(RecvError::Lagged(n)) => {
                tracing::warn!(missed = n, "store notifications fell behind: a call held here may wait for its hold to end");
            }
            Err(RecvError::Closed) => return,
        }
    }
}

/// The shadow policy folder (`[policy] shadow`): loaded at start and
/// whenever it changes. A set that does not load is logged with file and
/// line and ignored: the previous shadow set (or none) stays, enforcement is
/// untouched, and the gateway never stops for it.
pub(super) async fn watch_shadow(
    gw: Arc<Gateway>,
    dir: std::path::PathBuf,
    mut seen: Vec<(std::path::PathBuf, u64, Option<std::time::SystemTime>)>,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        let now = fingerprint(&dir, None);
        if now != seen {
            seen = now;
            load_shadow(&gw, &dir);
        }
    }
}

/// Load the shadow set from `dir` and put it in the shadow, or log why not.
pub(super) fn load_shadow(gw: &Gateway, dir: &std::path::Path) {
    let reviewers = gw.config().approvals.reviewers.clone();
    match crate::cli::files::load_policies(dir, reviewers.as_deref()) {
        Ok(p) => {
            tracing::info!(policies = p.len(), dir = %dir.display(), digest = %p.digest(), "shadow policies loaded (decided beside the policies in force, never enforced)");
            let mut f = serde_json::Map::new();
            f.insert("shadow".into(), true.into());
            f.insert("policies".into(), p.len().into());
            f.insert("policy_set".into(), p.digest().into());
            gw.pipeline().audit("policy_reloaded", f);
            gw.pipeline().set_shadow(Some(p));
        }
        Err(errors) => {
            for e in &errors {
                tracing::error!(
                    "shadow policies in `{}` not loaded, enforcement unchanged: {e}",
                    dir.display()
                );
            }
            let mut f = refused(&errors);
            f.insert("shadow".into(), true.into());
            gw.pipeline().audit("policy_reload_refused", f);
        }
    }
}

/// The fields of a `policy_reload_refused` entry: the errors, each with
/// its file and line.
fn refused(errors: &[impl ToString]) -> serde_json::Map<String, serde_json::Value> {
    let mut f = serde_json::Map::new();
    f.insert(
        "errors".into(),
        errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .into(),
    );
    f
}

/// What the policy folder looks like: its files with sizes and mtimes.
pub(super) fn fingerprint(
    dir: &std::path::Path,
    reviewers: Option<&std::path::Path>,
) -> Vec<(std::path::PathBuf, u64, Option<std::time::SystemTime>)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            Some((e.path(), meta.len(), meta.modified().ok()))
        })
        .collect();
    if let Some(path) = reviewers {
        let meta = std::fs::metadata(path).ok();
        out.push((
            path.to_owned(),
            meta.as_ref().map_or(0, |m| m.len()),
            meta.and_then(|m| m.modified().ok()),
        ));
    }
    out.sort();
    out
}

/// Hot reload: poll the policy folder; on a change, load it whole. A set that
/// fails to parse or validate is not used: the previous one stays in force
/// and the errors are logged with file and line.
pub(super) async fn watch_policies(gw: Arc<Gateway>, dir: std::path::PathBuf) {
    let reviewers = gw.config().approvals.reviewers.clone();
    let mut seen = fingerprint(&dir, reviewers.as_deref());
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        let now = fingerprint(&dir, reviewers.as_deref());
        if now == seen {
            continue;
        }
        seen = now;
        // tools.lock is judged on its own: a bad lock keeps the previous
        // pins, whatever the policies do.
        match crate::cli::files::load_tool_lock(&dir) {
            Ok(lock) if lock != *gw.pipeline().catalog().lock() => {
                tracing::info!("tools.lock reloaded");
                gw.pipeline().catalog().set_lock(lock);
                gw.pipeline()
                    .audit("tools_lock_reloaded", serde_json::Map::new());
            }
            Ok(_) => {}
            Err(e) => {
                tracing::error!("tools.lock reload refused, previous pins stay in force: {e}");
                let mut f = serde_json::Map::new();
                f.insert("errors".into(), vec![e.to_string()].into());
                gw.pipeline().audit("policy_reload_refused", f);
            }
        }
        match crate::cli::files::load_policies(&dir, reviewers.as_deref()) {
            Ok(p) => {
                tracing::info!(policies = p.len(), "policies reloaded");
                let mut f = serde_json::Map::new();
                f.insert("policies".into(), p.len().into());
                f.insert("reviewers".into(), p.reviewers().len().into());
                gw.pipeline().audit("policy_reloaded", f);
                gw.pipeline().set_policies(p);
            }
            Err(errors) => {
                for e in &errors {
                    tracing::error!("policy reload refused, previous policies stay in force: {e}");
                }
                gw.pipeline()
                    .audit("policy_reload_refused", refused(&errors));
            }
        }
    }
}
