//! Guards on PostgreSQL (DESIGN.md section 25): gateways sharing a database
//! share each budget and effect. A take is one transaction that first
//! takes an advisory lock on each of its guards' groups (in one order, so
//! two takes never wait on each other in a circle), then reads the window
//! and writes the rows. Under READ COMMITTED every statement after the lock
//! sees every take committed before it: no two gateways both fit in the
//! last of a budget. (One statement could not do it: its snapshot is taken
//! before any lock it would take.)

use std::str::FromStr;

use rust_decimal::Decimal;

use super::{backend, PgStore};
use crate::core::guard::Claim;
use crate::store::guards::{group, row, window_ms, GuardRow, Standing, Taken};
use crate::store::{StoreError, StoreFuture};

fn decimal(text: &str) -> Result<Decimal, StoreError> {
    Decimal::from_str(text).map_err(|e| StoreError::Corrupt {
        what: "guards",
        reason: format!("a sum `{text}`: {e}"),
        cause: Some(crate::store::Cause::new(e)),
    })
}

/// Each claim's standing, read with `q` (a client or a transaction).
async fn standing(
    q: &impl deadpool_postgres::GenericClient,
    key: &str,
    claims: &[Claim],
    now_ms: i64,
) -> Result<Standing, StoreError> {
    let mut out = Standing::default();
    for c in claims {
        let g = group(c);
        let since = now_ms - window_ms(c);
        match c {
            Claim::Budget { .. } => {
                let r = q
                    .query_one(
                        "SELECT COALESCE(sum(amount), 0)::text FROM guards
                          WHERE grp = $1 AND at_ms > $2 AND key <> $3",
                        &[&g, &since, &key],
                    )
                    .await
                    .map_err(backend("sum a budget"))?;
                out.spent.push(decimal(r.get::<_, &str>(0))?);
            }
            Claim::Effect { .. } => {
                let r = q
                    .query_opt(
                        "SELECT key, at_ms FROM guards
                          WHERE grp = $1 AND at_ms > $2 AND key <> $3
                          ORDER BY at_ms DESC LIMIT 1",
                        &[&g, &since, &key],
                    )
                    .await
                    .map_err(backend("find an effect"))?;
                out.earlier
                    .push(r.map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1))));
            }
        }
    }
    Ok(out)
}

pub(super) async fn look(
    store: &PgStore,
    key: &str,
    claims: &[Claim],
    now_ms: i64,
) -> Result<Standing, StoreError> {
    let client = store.client().await?;
    standing(&client, key, claims, now_ms).await
}

pub(super) async fn take(
    store: &PgStore,
    key: &str,
    claims: &[Claim],
    force: bool,
    now_ms: i64,
) -> Result<Taken, StoreError> {
    let mut client = store.client().await?;
    let txn = client.transaction().await.map_err(backend("begin"))?;
    let mut groups: Vec<&str> = claims.iter().map(group).collect();
    groups.sort();
    groups.dedup();
    for g in &groups {
        txn.execute(
            "SELECT pg_advisory_xact_lock(hashtext('countersign-guard:' || $1))",
            &[g],
        )
        .await
        .map_err(backend("lock a guard"))?;
    }
    let standing = standing(&txn, key, claims, now_ms).await?;
    for c in claims {
        txn.execute(
            "DELETE FROM guards WHERE grp = $1 AND at_ms <= $2",
            &[&group(c), &(now_ms - window_ms(c))],
        )
        .await
        .map_err(backend("prune a guard's window"))?;
    }
    let counted = txn
        .query_opt("SELECT 1 FROM guards WHERE key = $1 LIMIT 1", &[&key])
        .await
        .map_err(backend("find a call's guards"))?
        .is_some();
    let taken = counted || force || standing.passes(claims);
    if taken && !counted {
        for c in claims {
            let r = row(c, key, now_ms);
            txn.execute(
                "INSERT INTO guards (grp, kind, name, tenant, scope, key, amount, at_ms, until_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7::text::numeric, $8, $9) ON CONFLICT DO NOTHING",
                &[
                    &group(c),
                    &r.kind,
                    &r.name,
                    &r.tenant,
                    &r.scope,
                    &r.key,
                    &r.amount,
                    &r.at_ms,
                    &r.until_ms,
                ],
            )
            .await
            .map_err(backend("take a guard"))?;
        }
    }
    txn.commit().await.map_err(backend("commit"))?;
    Ok(Taken { taken, standing })
}

pub(super) async fn release(store: &PgStore, key: &str) -> Result<usize, StoreError> {
    let client = store.client().await?;
    let n = client
        .execute("DELETE FROM guards WHERE key = $1", &[&key])
        .await
        .map_err(backend("release a call's guards"))?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

pub(super) async fn rows(store: &PgStore, since_ms: i64) -> Result<Vec<GuardRow>, StoreError> {
    let client = store.client().await?;
    let rows = client
        .query(
            "SELECT kind, name, tenant, scope, key, amount::text, at_ms, until_ms FROM guards
              WHERE at_ms >= $1 ORDER BY at_ms",
            &[&since_ms],
        )
        .await
        .map_err(backend("list guards"))?;
    Ok(rows
        .iter()
        .map(|r| GuardRow {
            kind: r.get(0),
            name: r.get(1),
            tenant: r.get(2),
            scope: r.get(3),
            key: r.get(4),
            amount: r.get(5),
            at_ms: r.get(6),
            until_ms: r.get(7),
        })
        .collect())
}

pub(super) async fn gc(store: &PgStore, now_ms: i64) -> Result<usize, StoreError> {
    let client = store.client().await?;
    let n = client
        .execute("DELETE FROM guards WHERE until_ms <= $1", &[&now_ms])
        .await
        .map_err(backend("sweep the guards"))?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

impl crate::store::guards::Guards for PgStore {
    fn guards_look<'a>(
        &'a self,
        key: &'a str,
        claims: &'a [crate::core::guard::Claim],
        now_ms: i64,
    ) -> StoreFuture<'a, crate::store::guards::Standing> {
        Box::pin(look(self, key, claims, now_ms))
    }

    fn guards_take<'a>(
        &'a self,
        key: &'a str,
        claims: &'a [crate::core::guard::Claim],
        force: bool,
        now_ms: i64,
    ) -> StoreFuture<'a, crate::store::guards::Taken> {
        Box::pin(take(self, key, claims, force, now_ms))
    }

    fn guards_release<'a>(&'a self, key: &'a str) -> StoreFuture<'a, usize> {
        Box::pin(release(self, key))
    }

    fn guards_gc(&self, now_ms: i64) -> StoreFuture<'_, usize> {
        Box::pin(gc(self, now_ms))
    }

    fn guards_rows(&self, since_ms: i64) -> StoreFuture<'_, Vec<crate::store::guards::GuardRow>> {
        Box::pin(rows(self, since_ms))
    }
}
