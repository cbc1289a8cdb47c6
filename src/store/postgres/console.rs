//! The review console's entries on PostgreSQL ([`crate::store::console`]),
//! shared by every gateway on the database: each operation is one
//! statement, so two gateways given the same challenge cannot both take
//! it, two failures counted at once are both counted, and a passkey's
//! counter moves forwards only (a compare-and-set in the `UPDATE`'s
//! `WHERE`). Every commit is synchronous (the pool's default).

use super::{backend, PgStore};
use crate::store::console::{last_counter, ConsoleState, Counted};
use crate::store::StoreFuture;

impl ConsoleState for PgStore {
    fn console_put(&self, key: String, value: String, until_ms: i64) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            self.client()
                .await?
                .execute(
                    "INSERT INTO review_console (key, value, until_ms) VALUES ($1, $2, $3)
                     ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, until_ms = EXCLUDED.until_ms",
                    &[&key, &value, &until_ms],
                )
                .await
                .map_err(backend("console: put"))?;
            Ok(())
        })
    }

    fn console_get(&self, key: String, now_ms: i64) -> StoreFuture<'_, Option<String>> {
        Box::pin(async move {
            let row = self
                .client()
                .await?
                .query_opt(
                    "SELECT value FROM review_console WHERE key = $1 AND until_ms > $2",
                    &[&key, &now_ms],
                )
                .await
                .map_err(backend("console: read"))?;
            Ok(row.map(|r| r.get(0)))
        })
    }

    fn console_take(&self, key: String, now_ms: i64) -> StoreFuture<'_, Option<String>> {
        Box::pin(async move {
            // One DELETE: of two gateways taking the same entry, one gets
            // the row and the other nothing.
            let row = self
                .client()
                .await?
                .query_opt(
                    "DELETE FROM review_console WHERE key = $1 RETURNING value, until_ms",
                    &[&key],
                )
                .await
                .map_err(backend("console: take"))?;
            Ok(row
                .filter(|r| r.get::<_, i64>(1) > now_ms)
                .map(|r| r.get(0)))
        })
    }

    fn console_count(&self, key: String, window_ms: i64, now_ms: i64) -> StoreFuture<'_, u32> {
        Box::pin(async move {
            let until = now_ms.saturating_add(window_ms);
            let row = self
                .client()
                .await?
                .query_one(
                    "INSERT INTO review_console (key, value, until_ms) VALUES ($1, '1', $2)
                     ON CONFLICT (key) DO UPDATE SET
                       value = CASE WHEN review_console.until_ms <= $3 THEN '1'
                               ELSE (review_console.value::bigint + 1)::text END,
                       until_ms = CASE WHEN review_console.until_ms <= $3 THEN EXCLUDED.until_ms
                                  ELSE review_console.until_ms END
                     RETURNING value",
                    &[&key, &until, &now_ms],
                )
                .await
                .map_err(backend("console: count"))?;
            Ok(row.get::<_, String>(0).parse().unwrap_or(u32::MAX))
        })
    }

    fn passkey_counter(&self, key: String, counter: u32) -> StoreFuture<'_, Counted> {
        Box::pin(async move {
            let client = self.client().await?;
            // The compare-and-set: the row moves only forwards (or stays 0
            // for an authenticator without a counter), whichever gateway
            // the assertion reached.
            let moved = client
                .query_opt(
                    "INSERT INTO review_console (key, value, until_ms) VALUES ($1, $2, 9223372036854775807)
                     ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value
                       WHERE review_console.value::bigint < EXCLUDED.value::bigint
                          OR (review_console.value = '0' AND EXCLUDED.value = '0')
                     RETURNING 1",
                    &[&key, &counter.to_string()],
                )
                .await
                .map_err(backend("console: passkey counter"))?;
            if moved.is_some() {
                return Ok(Counted::Advanced);
            }
            let last = client
                .query_opt("SELECT value FROM review_console WHERE key = $1", &[&key])
                .await
                .map_err(backend("console: passkey counter"))?
                .map_or(0, |r| last_counter(&r.get::<_, String>(0)));
            Ok(Counted::Behind { last })
        })
    }

    fn console_gc(&self, now_ms: i64) -> StoreFuture<'_, usize> {
        Box::pin(async move {
            let n = self
                .client()
                .await?
                .execute(
                    "DELETE FROM review_console WHERE until_ms <= $1",
                    &[&now_ms],
                )
                .await
                .map_err(backend("console: sweep"))?;
            Ok(usize::try_from(n).unwrap_or(usize::MAX))
        })
    }
}
