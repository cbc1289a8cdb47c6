//! The ledger's grouped statements: the lookups, the reservations, and the
//! transitions (a key claimed straight as `dispatched` among them), each a
//! [`Kind`] that [`super::Group`] runs a batch of as one statement.

use std::collections::HashSet;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use tokio_postgres::{Client, Statement};

use super::Kind;

/// Who writes: the gateway's id and its current lease epoch.
#[derive(Clone)]
pub(in crate::store::postgres) struct Writer {
    /// The gateway id rows are written under.
    pub gateway: Arc<str>,
    /// The lease epoch: a move to `dispatched` checks the one read when
    /// its batch runs (reservations carry their own).
    pub epoch: Arc<std::sync::atomic::AtomicI64>,
}

impl Writer {
    fn epoch(&self) -> i64 {
        self.epoch.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Ledger lookups: the lookups of concurrent calls (most of them for keys
/// no row holds yet) share one statement and one round trip, as their
/// writes do, instead of one statement each on a pooled connection. A
/// lookup answers what was committed when its batch's statement began,
/// which is after the lookup was asked for: a write that returned before
/// is always seen.
pub(in crate::store::postgres) struct Lookup;

impl Kind for Lookup {
    /// The key.
    type Op = String;
    /// The record as JSON, when a row holds the key.
    type Out = Option<String>;
    const WHAT: &'static str = "read";
    const SQL: &'static str = "SELECT l.record
         FROM unnest($1::text[]) WITH ORDINALITY AS b(key, n)
         LEFT JOIN ledger l ON l.key = b.key
         ORDER BY b.n";

    /// Lookups of one key share a batch: nothing is written.
    fn key(_: &String) -> Option<&str> {
        None
    }

    fn run<'a>(
        &'a self,
        client: &'a Client,
        statement: &'a Statement,
        ops: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Option<String>>, tokio_postgres::Error>> {
        Box::pin(async move {
            let rows = client.query(statement, &[&ops]).await?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }
}

/// A reservation without an approval to consume: insert the row if no row
/// holds the key. A key that is taken is left to the caller, which checks
/// in a transaction of its own whether the row still binds it.
pub(in crate::store::postgres) struct Reserve(pub Writer);

/// One reservation.
pub(in crate::store::postgres) struct ReserveOp {
    /// The storage key.
    pub key: String,
    /// The record's state (`reserved`).
    pub state: &'static str,
    /// When the record stops binding the key.
    pub expires_ms: i64,
    /// The record as JSON.
    pub record: String,
    /// The lease epoch when the reservation was asked for.
    pub epoch: i64,
}

impl Kind for Reserve {
    type Op = ReserveOp;
    /// Whether the row was inserted.
    type Out = bool;
    const WHAT: &'static str = "reserve";
    // Rows are inserted in key order, so two gateways' batches wait for
    // each other's keys in one order and never deadlock on them.
    // INVARIANT: each row carries the epoch in force when the gateway asked
    // for it, not when the batch ran: a gateway paused between the two
    // (even while this statement waited to be prepared) must not find its
    // reservation under the epoch it took again after waking, or it would
    // dispatch a call decided before the lapse.
    const SQL: &'static str = "INSERT INTO ledger (key, state, expires_ms, gateway, record, epoch)
         SELECT b.key, b.state, b.expires_ms, $1, b.record, b.epoch
         FROM unnest($2::bigint[], $3::text[], $4::text[], $5::bigint[], $6::text[])
           AS b(epoch, key, state, expires_ms, record)
         ORDER BY b.key
         ON CONFLICT (key) DO NOTHING
         RETURNING key";

    fn key(op: &ReserveOp) -> Option<&str> {
        Some(&op.key)
    }

    fn run<'a>(
        &'a self,
        client: &'a Client,
        statement: &'a Statement,
        ops: &'a [ReserveOp],
    ) -> BoxFuture<'a, Result<Vec<bool>, tokio_postgres::Error>> {
        Box::pin(async move {
            let keys: Vec<&str> = ops.iter().map(|o| o.key.as_str()).collect();
            let states: Vec<&str> = ops.iter().map(|o| o.state).collect();
            let expires: Vec<i64> = ops.iter().map(|o| o.expires_ms).collect();
            let records: Vec<&str> = ops.iter().map(|o| o.record.as_str()).collect();
            let epochs: Vec<i64> = ops.iter().map(|o| o.epoch).collect();
            let gateway: &str = &self.0.gateway;
            let rows = client
                .query(
                    statement,
                    &[&gateway, &epochs, &keys, &states, &expires, &records],
                )
                .await?;
            let inserted: HashSet<&str> = rows.iter().map(|r| r.get::<_, &str>(0)).collect();
            Ok(keys.iter().map(|k| inserted.contains(k)).collect())
        })
    }
}

/// A ledger transition (compare-and-set on the state), or a key claimed
/// straight as `dispatched`, with the audit outbox row that commits with
/// it, and the notification that wakes waiters on other gateways when the
/// record settles.
pub(in crate::store::postgres) struct Transition(pub Writer);

/// One transition.
pub(in crate::store::postgres) struct TransitionOp {
    /// The storage key.
    pub key: String,
    /// The state the row must be in; `None`: no row may hold the key, and
    /// it is inserted (a reservation and its dispatch in one commit).
    pub from: Option<&'static str>,
    /// The state it moves to.
    pub to: &'static str,
    /// The new record's expiry.
    pub expires_ms: i64,
    /// The new record as JSON.
    pub record: String,
    /// An audit outbox row (id, entries) to store with the move.
    pub outbox: Option<(i64, String)>,
    /// Notifications to queue with the move (a JSON array of notices).
    pub notices: Option<String>,
    /// For an insert: the lease epoch when the gateway asked for it.
    pub epoch: i64,
}

/// What a transition did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store::postgres) enum Moved {
    /// The row moved (or was inserted).
    Yes,
    /// The row was not in the state asked for (or, for an insert, a row
    /// holds the key).
    No,
    /// An insert the gateway's lease refused: lapsed, or taken again
    /// under another epoch since the gateway asked.
    Fenced,
}

impl Kind for Transition {
    type Op = TransitionOp;
    type Out = Moved;
    const WHAT: &'static str = "transition";
    // INVARIANT: a gateway whose lease lapsed (paused, cut off) does not
    // dispatch: a move to `dispatched` requires, in this very statement and
    // on the database's clock, that the key was reserved by this gateway
    // under its current epoch (epochs count per gateway, so both are
    // checked) and that the lease is still valid. A
    // reservation made before a lapse is never dispatched (it ends
    // `not_dispatched`, and a retry reserves again); meanwhile another
    // gateway may have settled the lapsed gateway's records.
    // INVARIANT: a key claimed straight as `dispatched` (`made`) is
    // inserted only if no row holds it (at most once: of two gateways that
    // both found the key free, one inserts) and only under the lease, in
    // force, of the epoch the gateway read when it asked. Nothing was
    // written for the call before, so nothing of it can have been settled
    // by another gateway during a lapse; rows are inserted in key order, as
    // reservations are, so that two gateways' batches do not deadlock.
    // INVARIANT: the outbox row and the notifications commit with the move
    // they record, and only with it.
    // The lease is read once per statement (`lease`), on the database's
    // clock, for every row that needs it.
    const SQL: &'static str = "WITH b AS (
            SELECT * FROM unnest($3::text[], $4::text[], $5::text[], $6::bigint[], $7::text[], $8::bigint[], $9::text[], $10::text[], $11::bigint[])
              AS b(key, from_state, to_state, expires_ms, record, outbox_id, outbox, notices, epoch)
         ), lease AS (
            SELECT g.epoch FROM gateways g WHERE g.id = $1
              AND g.lease_until_ms > (extract(epoch from clock_timestamp()) * 1000)::bigint
         ), moved AS (
            UPDATE ledger l
            SET state = b.to_state, expires_ms = b.expires_ms, gateway = $1, record = b.record
            FROM b
            WHERE l.key = b.key AND l.state = b.from_state
              AND (b.to_state <> 'dispatched' OR (l.gateway = $1 AND l.epoch = $2
                AND EXISTS (SELECT 1 FROM lease WHERE lease.epoch = $2)))
            RETURNING l.key, b.to_state, b.outbox_id, b.outbox, b.notices
         ), made AS (
            INSERT INTO ledger (key, state, expires_ms, gateway, record, epoch)
            SELECT b.key, b.to_state, b.expires_ms, $1, b.record, b.epoch
            FROM b
            WHERE b.from_state IS NULL AND b.epoch IN (SELECT epoch FROM lease)
            ORDER BY b.key
            ON CONFLICT (key) DO NOTHING
            RETURNING key
         ), kept AS (
            INSERT INTO audit_outbox (gateway, id, entries)
            SELECT $1, m.outbox_id, m.outbox FROM moved m WHERE m.outbox_id IS NOT NULL
            UNION ALL
            SELECT $1, b.outbox_id, b.outbox FROM made JOIN b ON b.key = made.key
            WHERE b.outbox_id IS NOT NULL
         ), told AS (
            INSERT INTO notices (key, next_ms, notice)
            SELECT (n->>'id') || '/' || (n->>'webhook'), (n->>'next_ms')::bigint, n::text
            FROM moved m, jsonb_array_elements(m.notices::jsonb) n
            WHERE m.notices IS NOT NULL
            ON CONFLICT (key) DO NOTHING
         )
         SELECT m.key, CASE WHEN m.to_state IN ('complete', 'not_dispatched', 'unknown')
             AND EXISTS (SELECT 1 FROM ledger_waiters w WHERE w.key = m.key)
           THEN pg_notify('countersign_ledger', m.key)::text END, true
         FROM moved m
         UNION ALL
         SELECT made.key, NULL, true FROM made
         UNION ALL
         SELECT b.key, NULL, false FROM b
         WHERE b.from_state IS NULL AND b.epoch NOT IN (SELECT epoch FROM lease)";

    fn key(op: &TransitionOp) -> Option<&str> {
        Some(&op.key)
    }

    fn run<'a>(
        &'a self,
        client: &'a Client,
        statement: &'a Statement,
        ops: &'a [TransitionOp],
    ) -> BoxFuture<'a, Result<Vec<Moved>, tokio_postgres::Error>> {
        Box::pin(async move {
            let keys: Vec<&str> = ops.iter().map(|o| o.key.as_str()).collect();
            let from: Vec<Option<&str>> = ops.iter().map(|o| o.from).collect();
            let to: Vec<&str> = ops.iter().map(|o| o.to).collect();
            let expires: Vec<i64> = ops.iter().map(|o| o.expires_ms).collect();
            let records: Vec<&str> = ops.iter().map(|o| o.record.as_str()).collect();
            let outbox_ids: Vec<Option<i64>> =
                ops.iter().map(|o| o.outbox.as_ref().map(|x| x.0)).collect();
            let outboxes: Vec<Option<&str>> = ops
                .iter()
                .map(|o| o.outbox.as_ref().map(|x| x.1.as_str()))
                .collect();
            let notices: Vec<Option<&str>> = ops.iter().map(|o| o.notices.as_deref()).collect();
            let epochs: Vec<i64> = ops.iter().map(|o| o.epoch).collect();
            let gateway: &str = &self.0.gateway;
            let rows = client
                .query(
                    statement,
                    &[
                        &gateway,
                        &self.0.epoch(),
                        &keys,
                        &from,
                        &to,
                        &expires,
                        &records,
                        &outbox_ids,
                        &outboxes,
                        &notices,
                        &epochs,
                    ],
                )
                .await?;
            Ok(outcomes(
                &keys,
                rows.iter()
                    .map(|r| (r.get::<_, &str>(0), r.get::<_, bool>(2))),
            ))
        })
    }
}

/// Each key's outcome from the rows a batch returned (`key`, moved): a
/// key with no row did not move. The statement reads the lease once, so an
/// insert and a refusal cannot both name a key; were there two rows, the
/// one that moved would count, since a write that landed is what is true.
fn outcomes<'k>(keys: &[&str], rows: impl Iterator<Item = (&'k str, bool)>) -> Vec<Moved> {
    let mut seen: std::collections::HashMap<&str, Moved> = std::collections::HashMap::new();
    for (key, moved) in rows {
        let now = if moved { Moved::Yes } else { Moved::Fenced };
        seen.entry(key)
            .and_modify(|m| {
                if now == Moved::Yes {
                    *m = Moved::Yes;
                }
            })
            .or_insert(now);
    }
    keys.iter()
        .map(|k| seen.get(k).copied().unwrap_or(Moved::No))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// A key with no row did not move; a row that moved wins over one
    /// that says the lease refused it; a refusal alone is one.
    #[test]
    fn each_key_gets_the_outcome_its_rows_say() {
        let keys = ["a", "b", "c", "d"];
        let rows = [("c", false), ("b", true), ("d", false), ("d", true)];
        assert_eq!(
            outcomes(&keys, rows.into_iter()),
            vec![Moved::No, Moved::Yes, Moved::Fenced, Moved::Yes]
        );
    }

    /// What `EXPLAIN` shows for `sql`, one line per row.
    async fn explain(client: &Client, sql: &str) -> String {
        client
            .simple_query(sql)
            .await
            .unwrap()
            .iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The plans the transitions' and the lookups' writers run for a batch
    /// of `n` keys.
    async fn plans(client: &Client, n: usize) -> [String; 2] {
        let keys: Vec<String> = (0..n).map(|i| format!("'k{i}'")).collect();
        let keys = format!("ARRAY[{}]::text[]", keys.join(","));
        let fill = |v: &str| format!("array_fill({v}, array[{n}])");
        // EXPLAIN takes no parameters: the batch is spelled out.
        let transition = format!(
            "EXPLAIN EXECUTE tr('gw', 1, {keys}, {}, {}, {}, {}, {}, {}, {}, {})",
            fill("'reserved'::text"),
            fill("'dispatched'::text"),
            fill("0::bigint"),
            fill("'{}'::text"),
            fill("null::bigint"),
            fill("null::text"),
            fill("null::text"),
            fill("1::bigint"),
        );
        [
            explain(client, &transition).await,
            explain(client, &format!("EXPLAIN EXECUTE lk({keys})")).await,
        ]
    }

    /// A writer's plan (the transitions', and the lookups') is made once
    /// per connection and is the nested loop into the key index, whether it
    /// was made on an empty ledger or on a large one: never a scan of the
    /// whole table (which the plan cache kept once, as the ledger grew,
    /// when left to itself).
    #[tokio::test]
    async fn a_writer_finds_its_rows_by_key_on_an_empty_ledger_and_on_a_large_one() {
        let Some((_schema, config)) = crate::store::tests::PgSchema::new().await else {
            return;
        };
        let (client, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        for m in crate::store::postgres::MIGRATIONS {
            client.batch_execute(m).await.unwrap();
        }
        client
            .batch_execute(super::super::Durability::Flushed.session())
            .await
            .unwrap();
        client
            .batch_execute(&format!(
                "PREPARE tr(text, bigint, text[], text[], text[], bigint[], text[], bigint[], text[], text[], bigint[]) AS {}",
                Transition::SQL
            ))
            .await
            .unwrap();
        client
            .batch_execute(&format!("PREPARE lk(text[]) AS {}", Lookup::SQL))
            .await
            .unwrap();
        let empty = plans(&client, 64).await;
        client
            .batch_execute(
                "INSERT INTO ledger (key, state, expires_ms, gateway, record)
                   SELECT 'x' || i, 'complete', 0, 'gw', '{}' FROM generate_series(1, 20000) i;
                 ANALYZE ledger",
            )
            .await
            .unwrap();
        let large = plans(&client, 2).await;
        let each = empty.iter().map(|p| ("empty", p));
        for (when, plan) in each.chain(large.iter().map(|p| ("large", p))) {
            assert!(
                plan.contains("Index Scan using ledger_pkey on ledger")
                    && plan.contains("Nested Loop"),
                "{when} ledger:\n{plan}"
            );
            assert!(
                !plan.contains("Seq Scan on ledger") && !plan.contains("Hash Join"),
                "{when} ledger:\n{plan}"
            );
        }
        // The same plan, but for the planner's cost estimates.
        let shape = |plan: &str| {
            plan.lines()
                .map(|l| l.split("  (cost=").next().unwrap_or(l).to_owned())
                .collect::<Vec<_>>()
        };
        for (empty, large) in empty.iter().zip(&large) {
            assert_eq!(shape(empty), shape(large), "one plan for either ledger");
        }
    }
}
