//! A gateway's lease on PostgreSQL: taken with a new epoch at start and
//! renewed every third of its length; a gateway whose lease lapsed is fenced.

use super::*;

/// Take (or take again) `gateway`'s lease: a new epoch, valid `lease_ms`.
pub(super) async fn register(pool: &Pool, gateway: &str, lease_ms: i64) -> Result<i64, StoreError> {
    let client = pool.get().await.map_err(pool_error)?;
    let row = client
        .query_one(
            &format!(
                "INSERT INTO gateways (id, epoch, lease_until_ms) VALUES ($1, 1, {NOW_MS} + $2)
                 ON CONFLICT (id) DO UPDATE
                 SET epoch = gateways.epoch + 1, lease_until_ms = EXCLUDED.lease_until_ms
                 RETURNING epoch"
            ),
            &[&gateway, &lease_ms],
        )
        .await
        .map_err(backend("take the lease"))?;
    Ok(row.get(0))
}

/// Renew the lease every third of its length. A lease found lapsed (the
/// process was paused, or cut off from the database) is not renewed: it is
/// taken again under a new epoch, and until then nothing is dispatched.
pub(super) async fn renew(pool: Pool, gateway: Arc<str>, epoch: Arc<AtomicI64>, lease_ms: i64) {
    let every =
        std::time::Duration::from_millis(u64::try_from(lease_ms / 3).unwrap_or(1000).max(10));
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        let current = epoch.load(Ordering::SeqCst);
        let renewed = async {
            let client = pool.get().await.map_err(pool_error)?;
            client
                .execute(
                    &format!(
                        "UPDATE gateways SET lease_until_ms = {NOW_MS} + $3
                         WHERE id = $1 AND epoch = $2 AND lease_until_ms > {NOW_MS}"
                    ),
                    &[&&*gateway, &current, &lease_ms],
                )
                .await
                .map_err(backend("renew the lease"))
        }
        .await;
        match renewed {
            Ok(1) => {}
            Ok(_) => {
                tracing::warn!(gateway = %gateway, "the gateway's lease lapsed: taking it again under a new epoch");
                match register(&pool, &gateway, lease_ms).await {
                    Ok(e) => epoch.store(e, Ordering::SeqCst),
                    Err(e) => tracing::error!("lease not taken again: {e}"),
                }
            }
            Err(e) => tracing::error!("lease not renewed (the database is unreachable?): {e}"),
        }
    }
}
