//! The operator endpoints of the HTTP front: `/healthz`, `/metrics` (behind
//! its own token) and the read-only transparency endpoints `/audit/*`
//! (the latest signed checkpoint, inclusion and consistency proofs).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::front::gateway::Gateway;

pub(super) async fn healthz(State(gw): State<Arc<Gateway>>) -> Response {
    // Without its store the gateway runs nothing that writes: say so (503),
    // so that a load balancer sends calls to another gateway.
    let store = gw.pipeline().store().health().await;
    let body = json!({
        "status": if store.is_ok() { "ok" } else { "degraded" },
        "store": match &store {
            Ok(()) => "ok".to_owned(),
            Err(e) => format!("unreachable: {e}"),
        },
        "sessions": gw.session_count(),
        "circuits": gw.pipeline().circuits(),
        // Each webhook's last success and failure (`countersign check`
        // prints them); names and times only, never a url or a secret.
        "webhooks": crate::upstream::notify::status(
            gw.pipeline().store().as_ref(),
            &gw.config().notify,
        )
        .await,
    });
    (
        if store.is_ok() {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        },
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// `/metrics` for a scraper with the metrics token (`[metrics]`); 404 when
/// none is configured, 401 for any other token. The gauges are read now.
pub(super) async fn metrics(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let Some(expected) = gw.config().metrics.token_sha256.as_deref() else {
        return (
            StatusCode::NOT_FOUND,
            "no [metrics] token_sha256 is configured\n",
        )
            .into_response();
    };
    // Compared as digests, as identities are: the token itself is never kept.
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| hex::encode(Sha256::digest(t.as_bytes())));
    if presented.is_none_or(|p| !p.eq_ignore_ascii_case(expected)) {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "the metrics token is required\n",
        )
            .into_response();
    }
    let store = gw.pipeline().store();
    let pending = match store.open_proposals().await {
        Ok(all) => all
            .iter()
            .filter(|p| p.state == crate::core::approval::ProposalState::Pending)
            .count(),
        Err(e) => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the store does not answer: {e}\n"),
            )
                .into_response()
        }
    };
    let unknown = match crate::enforce::reconcile::list_unknown_in(store.as_ref()).await {
        Ok(all) => all.len(),
        Err(e) => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the store does not answer: {e}\n"),
            )
                .into_response()
        }
    };
    // A queue that cannot be read does not hide the other metrics.
    let (notifications, queued) = store.notify_status().await.unwrap_or_default();
    let now = crate::enforce::metrics::Sampled {
        notifications: notifications.into_iter().collect(),
        notifications_queued: queued as i64,
        pending: pending as i64,
        unknown: unknown as i64,
        circuits: gw.pipeline().circuits().into_iter().collect(),
        audit_lag: gw.pipeline().audit_sink().map_or(0, |a| a.lag()) as i64,
        ledger_unflushed: gw.pipeline().store().unflushed(),
        ledger_refusing: gw.pipeline().store().refusing_writes(),
    };
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        gw.pipeline().metrics().render(&now),
    )
        .into_response()
}

/// `GET /audit/checkpoint`: the latest signed checkpoint note, with any
/// witness cosignatures. Read-only and unauthenticated, like a transparency
/// log's: it holds a size and a root hash, nothing of any entry.
pub(super) async fn audit_checkpoint(State(gw): State<Arc<Gateway>>) -> Response {
    let Some(dir) = gw.audit_dir().map(ToOwned::to_owned) else {
        return (StatusCode::NOT_FOUND, "this gateway keeps no audit log\n").into_response();
    };
    match crate::audit::proofs::latest(&dir) {
        Ok((note, _)) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            note,
        )
            .into_response(),
        Err(e) => (StatusCode::NOT_FOUND, format!("{e}\n")).into_response(),
    }
}

#[derive(serde::Deserialize)]
pub(super) struct InclusionQuery {
    seq: u64,
    size: Option<u64>,
}

#[derive(serde::Deserialize)]
pub(super) struct ConsistencyQuery {
    old: u64,
    size: Option<u64>,
}

/// A proof as JSON, computed off the async threads (it reads the tree file).
pub(super) async fn proof_response<T: serde::Serialize + Send + 'static>(
    gw: &Gateway,
    make: impl FnOnce(&std::path::Path) -> Result<T, crate::audit::proofs::ProveError> + Send + 'static,
) -> Response {
    let Some(dir) = gw.audit_dir().map(ToOwned::to_owned) else {
        return (StatusCode::NOT_FOUND, "this gateway keeps no audit log\n").into_response();
    };
    match tokio::task::spawn_blocking(move || make(&dir)).await {
        Ok(Ok(proof)) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::to_string(&proof).unwrap_or_default(),
        )
            .into_response(),
        Ok(Err(crate::audit::proofs::ProveError::Range(why))) => {
            (StatusCode::BAD_REQUEST, format!("{why}\n")).into_response()
        }
        Ok(Err(e)) => (StatusCode::NOT_FOUND, format!("{e}\n")).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// `GET /audit/proof/inclusion?seq=N[&size=M]`.
pub(super) async fn audit_inclusion(
    State(gw): State<Arc<Gateway>>,
    axum::extract::Query(q): axum::extract::Query<InclusionQuery>,
) -> Response {
    proof_response(&gw, move |dir| {
        crate::audit::proofs::inclusion(dir, q.seq, q.size)
    })
    .await
}

/// `GET /audit/proof/consistency?old=N[&size=M]`.
pub(super) async fn audit_consistency(
    State(gw): State<Arc<Gateway>>,
    axum::extract::Query(q): axum::extract::Query<ConsistencyQuery>,
) -> Response {
    proof_response(&gw, move |dir| {
        crate::audit::proofs::consistency(dir, q.old, q.size)
    })
    .await
}

/// `GET /.well-known/oauth-protected-resource`: the gateway's RFC 9728
/// Protected Resource Metadata (404 without `[[auth.issuers]]`).
pub(super) async fn resource_metadata(State(gw): State<Arc<Gateway>>) -> Response {
    metadata_response(&gw, None)
}

/// `GET /.well-known/oauth-protected-resource/mcp/{server}`: one server's
/// metadata; its `resource` is the URL a client sends requests to.
pub(super) async fn server_resource_metadata(
    State(gw): State<Arc<Gateway>>,
    Path(server): Path<String>,
) -> Response {
    if !gw.config().servers.contains_key(&server) {
        return (StatusCode::NOT_FOUND, "no such server\n").into_response();
    }
    metadata_response(&gw, Some(&server))
}

fn metadata_response(gw: &Gateway, server: Option<&str>) -> Response {
    if !gw.auth().has_issuers() {
        return (
            StatusCode::NOT_FOUND,
            "no [[auth.issuers]] are configured: this gateway takes static tokens only\n",
        )
            .into_response();
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        gw.auth().metadata(server).to_string(),
    )
        .into_response()
}
