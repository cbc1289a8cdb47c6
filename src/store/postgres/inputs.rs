//! Decision inputs on PostgreSQL (`decision_inputs`): what each decision saw, for `policy diff`.

use super::*;

impl Inputs for PgStore {
    fn inputs_put(&self, rows: Vec<InputRow>) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            if rows.is_empty() {
                return Ok(());
            }
            let client = self.client().await?;
            let keys: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
            let tenants: Vec<&str> = rows.iter().map(|r| r.tenant.as_str()).collect();
            let times: Vec<i64> = rows.iter().map(|r| r.time_ms).collect();
            let inputs: Vec<&str> = rows.iter().map(|r| r.inputs.as_str()).collect();
            client
                .execute(
                    "INSERT INTO decision_inputs (key, tenant, time_ms, inputs)
                     SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[])
                     ON CONFLICT (key) DO NOTHING",
                    &[&keys, &tenants, &times, &inputs],
                )
                .await
                .map_err(backend("keep decision inputs"))?;
            Ok(())
        })
    }

    fn inputs_since(
        &self,
        since_ms: i64,
        tenant: Option<String>,
    ) -> StoreFuture<'_, Vec<InputRow>> {
        Box::pin(async move {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT key, tenant, time_ms, inputs FROM decision_inputs
                     WHERE time_ms >= $1 AND ($2::text IS NULL OR tenant = $2)
                     ORDER BY key",
                    &[&since_ms, &tenant],
                )
                .await
                .map_err(backend("read decision inputs"))?;
            Ok(rows
                .iter()
                .map(|r| InputRow {
                    key: r.get(0),
                    tenant: r.get(1),
                    time_ms: r.get(2),
                    inputs: r.get(3),
                })
                .collect())
        })
    }

    fn inputs_erase(&self, tenant: String) -> StoreFuture<'_, usize> {
        Box::pin(async move {
            let client = self.client().await?;
            let n = client
                .execute("DELETE FROM decision_inputs WHERE tenant = $1", &[&tenant])
                .await
                .map_err(backend("erase decision inputs"))?;
            Ok(usize::try_from(n).unwrap_or(usize::MAX))
        })
    }

    fn inputs_gc(&self, before_ms: i64, max_rows: usize) -> StoreFuture<'_, usize> {
        Box::pin(async move {
            let client = self.client().await?;
            let old = client
                .execute(
                    "DELETE FROM decision_inputs WHERE time_ms < $1",
                    &[&before_ms],
                )
                .await
                .map_err(backend("collect decision inputs"))?;
            let cap = i64::try_from(max_rows).unwrap_or(i64::MAX);
            let over = client
                .execute(
                    "DELETE FROM decision_inputs WHERE key IN (
                       SELECT key FROM decision_inputs ORDER BY key DESC OFFSET $1)",
                    &[&cap],
                )
                .await
                .map_err(backend("collect decision inputs"))?;
            Ok(usize::try_from(old + over).unwrap_or(usize::MAX))
        })
    }
}
