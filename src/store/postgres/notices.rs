//! The notification queue on PostgreSQL: notices leased to one gateway at a time while they are sent, and each webhook's status.

use super::*;

impl Outbox for PgStore {
    fn notices_enqueue(&self, notices: Vec<Notice>) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let mut client = self.client().await?;
            let txn = client.transaction().await.map_err(backend("begin"))?;
            insert_notices(&txn, &notices).await?;
            txn.commit().await.map_err(backend("commit"))?;
            Ok(())
        })
    }

    fn notices_claim(
        &self,
        owner: &str,
        now_ms: i64,
        lease_ms: i64,
        limit: usize,
    ) -> StoreFuture<'_, Vec<Notice>> {
        let owner = owner.to_owned();
        Box::pin(async move {
            let client = self.client().await?;
            // Leases are judged on the database's clock, like the
            // gateways' own: one gateway delivers each notice at a time,
            // and a lapsed lease (its gateway died) is taken over.
            let _ = now_ms;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = client
                .query(
                    &format!(
                        "WITH due AS (
                           SELECT key FROM notices
                           WHERE NOT gave_up AND next_ms <= {NOW_MS}
                             AND (lease_until IS NULL OR lease_until < {NOW_MS})
                           ORDER BY next_ms LIMIT $3
                           FOR UPDATE SKIP LOCKED)
                         UPDATE notices n SET lease_owner = $1, lease_until = {NOW_MS} + $2
                         FROM due WHERE n.key = due.key
                         RETURNING n.notice, n.lease_until"
                    ),
                    &[&owner, &lease_ms, &limit],
                )
                .await
                .map_err(backend("claim notices"))?;
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                let mut n: Notice = decode("notice", row.get::<_, &str>(0))?;
                n.lease = Some((owner.clone(), row.get::<_, i64>(1)));
                out.push(n);
            }
            Ok(out)
        })
    }

    fn notice_settle(&self, notice: Notice, outcome: Settle) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let mut client = self.client().await?;
            let txn = client.transaction().await.map_err(backend("begin"))?;
            // Lost to a crash, a settlement only means the notice is sent
            // again, with the same id.
            relaxed(&txn, false).await?;
            let name = notice.webhook.clone();
            let key = notice.key();
            let row = txn
                .query_opt(
                    "SELECT status FROM notify_status WHERE webhook = $1 FOR UPDATE",
                    &[&name],
                )
                .await
                .map_err(backend("read a webhook status"))?;
            let mut status: WebhookStatus = match &row {
                Some(r) => decode("webhook status", r.get::<_, &str>(0))?,
                None => WebhookStatus::default(),
            };
            match crate::store::settled(notice, &outcome, &mut status) {
                Some(n) => {
                    txn.execute(
                        "UPDATE notices SET next_ms = $2, gave_up = $3, lease_owner = NULL,
                         lease_until = NULL, notice = $4 WHERE key = $1",
                        &[&key, &n.next_ms, &n.gave_up, &encode("notice", &n)?],
                    )
                    .await
                    .map_err(backend("settle a notice"))?;
                }
                None => {
                    txn.execute("DELETE FROM notices WHERE key = $1", &[&key])
                        .await
                        .map_err(backend("settle a notice"))?;
                }
            }
            txn.execute(
                "INSERT INTO notify_status (webhook, status) VALUES ($1, $2)
                 ON CONFLICT (webhook) DO UPDATE SET status = EXCLUDED.status",
                &[&name, &encode("webhook status", &status)?],
            )
            .await
            .map_err(backend("write a webhook status"))?;
            txn.commit().await.map_err(backend("commit"))?;
            Ok(())
        })
    }

    fn notify_status(&self) -> StoreFuture<'_, (BTreeMap<String, WebhookStatus>, usize)> {
        Box::pin(async move {
            let mut conn = self.client().await?;
            // One snapshot: the queue and the counts agree (a settlement
            // moves both in one transaction).
            let client = conn
                .build_transaction()
                .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await
                .map_err(backend("begin"))?;
            let rows = client
                .query("SELECT webhook, status FROM notify_status", &[])
                .await
                .map_err(backend("read webhook status"))?;
            let mut out = BTreeMap::new();
            for r in rows {
                out.insert(
                    r.get::<_, String>(0),
                    decode("webhook status", r.get::<_, &str>(1))?,
                );
            }
            let waiting: i64 = client
                .query_one("SELECT count(*) FROM notices WHERE NOT gave_up", &[])
                .await
                .map_err(backend("count notices"))?
                .get(0);
            client.commit().await.map_err(backend("commit"))?;
            Ok((out, usize::try_from(waiting).unwrap_or(0)))
        })
    }

    fn outbox(&self) -> StoreFuture<'_, Vec<(u64, String)>> {
        Box::pin(async move {
            let client = self.client().await?;
            let gateway: &str = &self.gateway;
            let rows = client
                .query(
                    "SELECT id, entries FROM audit_outbox WHERE gateway = $1 ORDER BY id",
                    &[&gateway],
                )
                .await
                .map_err(backend("read the outbox"))?;
            Ok(rows
                .iter()
                .map(|r| (u64::try_from(r.get::<_, i64>(0)).unwrap_or(0), r.get(1)))
                .collect())
        })
    }

    /// A second: each clear is a statement and a commit per gateway on the
    /// shared database, whose cost is mostly the statement's, not its rows'
    /// (with four gateways, clearing after every 50 ms fsync was a sixth of
    /// the database's time per write).
    fn outbox_clear_pace(&self) -> std::time::Duration {
        std::time::Duration::from_secs(1)
    }

    fn outbox_clear(&self, upto: u64) -> StoreFuture<'_, usize> {
        // The request is made now (the contract allows dropping the future):
        // the work runs on its own task.
        let pool = self.pool.clone();
        let gateway = self.gateway.clone();
        let done = self.runtime.spawn(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let upto = i64::try_from(upto).unwrap_or(i64::MAX);
            let n = client
                .execute(
                    "DELETE FROM audit_outbox WHERE gateway = $1 AND id <= $2",
                    &[&&*gateway, &upto],
                )
                .await
                .map_err(backend("clear the outbox"))?;
            Ok::<usize, StoreError>(usize::try_from(n).unwrap_or(usize::MAX))
        });
        Box::pin(async move {
            done.await
                .map_err(|e| StoreError::backend("clear the outbox", e))?
        })
    }
}
