//! Group commit on PostgreSQL: the hot writes of concurrent calls (the
//! reservations, and the `dispatched` and answer transitions) share one
//! statement and one commit instead of a transaction each; their ledger
//! lookups share one statement too ([`Lookup`]).
//!
//! A write is queued and answered through a oneshot channel. One writer
//! task per kind, on a connection of its own, takes what is queued (up to
//! [`MAX_BATCH`], at most one write per key) and runs it as a single
//! multi-row statement over arrays (`unnest`). A single statement is its own
//! transaction: every write of the batch commits together or none does, and
//! the commit answers only once the server has done it (synchronously
//! flushed to the WAL on a durable writer's connection). While the writer's
//! batch is in flight the next one gathers in the queue, so the batch size
//! follows the load: one write alone goes out at once, and many share one
//! statement and one WAL flush.
//!
//! One writer, not several: a second writer took the first write queued
//! behind the first writer's batch and left with it almost alone, so the
//! groups were smaller and the database ran more statements per write.
//! Measured with `benches/pg_writes.sh` (64 clients), one writer gave as
//! many or more writes per second with one, two and four gateways, for less
//! database CPU per write, and no worse latency with one or eight clients
//! (docs/performance.md, "One writer per grouped kind").
//!
//! Fail closed: a batch that errors answers every write in it with the
//! error (nothing of it committed), and its writer reconnects for the next
//! batch. A batch the server aborts as a deadlock or a serialization
//! failure (two gateways' batches taking row locks in another order) is run
//! again, since nothing of it was kept.

use std::collections::HashSet;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Statement};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::backend;
use crate::store::StoreError;

/// The most writes one statement carries.
pub(super) const MAX_BATCH: usize = 256;

/// How often a batch aborted by a deadlock or a serialization failure is run
/// again before its writes get the error.
const RETRIES: usize = 3;

/// One kind of grouped write: its statement and how a batch runs it.
pub(super) trait Kind: Send + Sync + 'static {
    /// One write.
    type Op: Send + Sync + 'static;
    /// What one write learns.
    type Out: Send + 'static;
    /// What the statement is called in errors.
    const WHAT: &'static str;
    /// The statement, prepared once per connection.
    const SQL: &'static str;
    /// The key a write touches: two writes of one key never share a batch.
    fn key(op: &Self::Op) -> &str;
    /// Run `ops` as one statement; one answer per op, in order.
    fn run<'a>(
        &'a self,
        client: &'a Client,
        statement: &'a Statement,
        ops: &'a [Self::Op],
    ) -> BoxFuture<'a, Result<Vec<Self::Out>, tokio_postgres::Error>>;
}

type Reply<K> = oneshot::Sender<Result<<K as Kind>::Out, StoreError>>;
type Job<K> = (<K as Kind>::Op, Reply<K>);

/// A queue of writes of kind `K` and the writer that commits them.
pub(super) struct Group<K: Kind> {
    queue: mpsc::UnboundedSender<Job<K>>,
    writer: tokio::task::JoinHandle<()>,
}

impl<K: Kind> Drop for Group<K> {
    fn drop(&mut self) {
        self.writer.abort();
    }
}

impl<K: Kind> Group<K> {
    /// The writer task, with its own connection made from `config` and
    /// set up for `durability`.
    pub(super) fn start(
        kind: K,
        config: tokio_postgres::Config,
        tls: MakeRustlsConnect,
        durability: Durability,
    ) -> Group<K> {
        let (queue, rx) = mpsc::unbounded_channel();
        let writer = tokio::spawn(writer(kind, (config, tls), durability, rx));
        Group { queue, writer }
    }

    /// Queue `op`; resolves when its batch committed or answered (or failed).
    pub(super) async fn submit(&self, op: K::Op) -> Result<K::Out, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.queue
            .send((op, tx))
            .map_err(|_| StoreError::WriterStopped)?;
        rx.await.map_err(|_| StoreError::WriterStopped)?
    }
}

/// What a writer's commit promises when it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Durability {
    /// Flushed to the WAL (the server's `synchronous_commit`, raised to
    /// `on` where the server's default is `off`: the store contract needs
    /// the flush, whatever the default).
    Flushed,
    /// Atomic and visible at once, durable with the next WAL flush
    /// (`synchronous_commit = off` on the writer's connection).
    Relaxed,
}

impl Durability {
    /// How a writer's session is set up: the commit's durability, and the
    /// plan. A writer runs one statement, which finds its rows by key, for
    /// as long as the gateway lives. Its plan is made once (a generic plan)
    /// with joins other than the nested loop and full scans switched off,
    /// so it is the nested loop over the unnested batch into the key index
    /// whatever the table's statistics said when it was made. Left to
    /// itself, the plan cache kept the plan of an empty ledger (a hash join
    /// over a scan of the whole table) as the table grew; planning each
    /// batch anew instead (a custom plan) cost the database as much CPU as
    /// running it (0.35 ms of 0.7 ms for a batch of eight transitions).
    fn session(self) -> &'static str {
        match self {
            Durability::Flushed => {
                "SET plan_cache_mode = force_generic_plan;
                 SET enable_hashjoin = off; SET enable_mergejoin = off; SET enable_seqscan = off;
                 SELECT set_config('synchronous_commit', CASE current_setting('synchronous_commit')
                   WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, false)"
            }
            Durability::Relaxed => {
                "SET plan_cache_mode = force_generic_plan;
                 SET enable_hashjoin = off; SET enable_mergejoin = off; SET enable_seqscan = off;
                 SET synchronous_commit = off"
            }
        }
    }
}

/// The connection a writer holds, with the statement prepared on it.
struct Conn {
    client: Client,
    statement: Statement,
    driver: tokio::task::JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// Where a writer connects: the settings and the TLS connector.
type Target = (tokio_postgres::Config, MakeRustlsConnect);

async fn connect<K: Kind>(target: &Target, durability: Durability) -> Result<Conn, StoreError> {
    let (client, connection) = target
        .0
        .connect(target.1.clone())
        .await
        .map_err(backend("connect a writer"))?;
    let driver = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!("store writer: connection lost: {e}");
        }
    });
    client
        .batch_execute(durability.session())
        .await
        .map_err(backend("set up a writer"))?;
    let statement = client
        .prepare(K::SQL)
        .await
        .map_err(backend("prepare a grouped write"))?;
    Ok(Conn {
        client,
        statement,
        driver,
    })
}

/// Take the next batch: wait for one write, then whatever else is queued,
/// up to [`MAX_BATCH`] and one write per key (a second write of a key waits
/// in `carry` for the next batch). `None` when the queue is closed.
async fn gather<K: Kind>(
    rx: &mut mpsc::UnboundedReceiver<Job<K>>,
    carry: &mut Option<Job<K>>,
) -> Option<Vec<Job<K>>> {
    let mut batch = Vec::new();
    let mut keys = HashSet::new();
    let first = match carry.take() {
        Some(job) => job,
        None => rx.recv().await?,
    };
    keys.insert(K::key(&first.0).to_owned());
    batch.push(first);
    // Let the calls that are ready to run queue their writes first: one
    // turn of the scheduler, microseconds, and the batch takes them too
    // instead of leaving with the first write alone while the gateway's
    // other calls are one step behind it.
    tokio::task::yield_now().await;
    while batch.len() < MAX_BATCH {
        let Ok(job) = rx.try_recv() else { break };
        if !keys.insert(K::key(&job.0).to_owned()) {
            *carry = Some(job);
            break;
        }
        batch.push(job);
    }
    Some(batch)
}

async fn writer<K: Kind>(
    kind: K,
    target: Target,
    durability: Durability,
    mut rx: mpsc::UnboundedReceiver<Job<K>>,
) {
    let mut conn: Option<Conn> = None;
    let mut carry = None;
    while let Some(batch) = gather::<K>(&mut rx, &mut carry).await {
        let (ops, replies): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
        tracing::trace!(kind = K::WHAT, writes = ops.len(), "grouped write");
        let result = run(&kind, &target, durability, &mut conn, &ops).await;
        match result {
            Ok(outs) => {
                for (reply, out) in replies.into_iter().zip(outs) {
                    let _ = reply.send(Ok(out));
                }
            }
            Err(e) => {
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}

/// Run one batch on the writer's connection (made first if there is none,
/// or again once it closed), again after a deadlock or serialization
/// failure.
async fn run<K: Kind>(
    kind: &K,
    target: &Target,
    durability: Durability,
    conn: &mut Option<Conn>,
    ops: &[K::Op],
) -> Result<Vec<K::Out>, StoreError> {
    let mut tries = 0;
    loop {
        if conn.as_ref().is_none_or(|c| c.client.is_closed()) {
            *conn = Some(connect::<K>(target, durability).await?);
        }
        let Some(c) = conn.as_ref() else {
            return Err(StoreError::WriterStopped);
        };
        match kind.run(&c.client, &c.statement, ops).await {
            Ok(outs) if outs.len() == ops.len() => return Ok(outs),
            Ok(outs) => {
                return Err(StoreError::Backend {
                    op: K::WHAT,
                    reason: format!("{} answers for {} writes", outs.len(), ops.len()),
                    cause: None,
                })
            }
            Err(e) => {
                let retry = matches!(
                    e.code(),
                    Some(&SqlState::T_R_DEADLOCK_DETECTED | &SqlState::T_R_SERIALIZATION_FAILURE)
                );
                if retry && tries < RETRIES {
                    tries += 1;
                    tracing::debug!("store writer: {} run again after: {e}", K::WHAT);
                    continue;
                }
                return Err(backend(K::WHAT)(e));
            }
        }
    }
}

/// Who writes: the gateway's id and its current lease epoch.
#[derive(Clone)]
pub(super) struct Writer {
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
pub(super) struct Lookup;

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

    fn key(op: &String) -> &str {
        op
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
pub(super) struct Reserve(pub Writer);

/// One reservation.
pub(super) struct ReserveOp {
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

    fn key(op: &ReserveOp) -> &str {
        &op.key
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
pub(super) struct Transition(pub Writer);

/// One transition.
pub(super) struct TransitionOp {
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
pub(super) enum Moved {
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

    fn key(op: &TransitionOp) -> &str {
        &op.key
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

    /// The plans the transitions' and the lookups' writers run, as
    /// `EXPLAIN` shows them, for a batch of `n` keys.
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
        let lookup = format!("EXPLAIN EXECUTE lk({keys})");
        let mut out = [String::new(), String::new()];
        for (sql, plan) in [transition, lookup].iter().zip(out.iter_mut()) {
            *plan = client
                .simple_query(sql)
                .await
                .unwrap()
                .iter()
                .filter_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n");
        }
        out
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
        for m in super::super::MIGRATIONS {
            client.batch_execute(m).await.unwrap();
        }
        client
            .batch_execute(Durability::Flushed.session())
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
