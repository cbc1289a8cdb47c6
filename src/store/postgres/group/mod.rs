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
//! INVARIANT: nothing waits for a group while it holds a row lock in a
//! transaction of its own. With one writer per kind, a batch that waits
//! for such a lock holds up every write queued behind it; were the
//! transaction waiting on one of those writes, the gateway would stop
//! (a wait PostgreSQL cannot see as a deadlock). The store's transactions
//! (a reservation with an approval, recovery, the sweep) run their
//! statements on their own connection and queue nothing here.
//!
//! Fail closed: a batch that errors answers every write in it with the
//! error (nothing of it committed), and its writer reconnects for the next
//! batch. A batch the server aborts as a deadlock or a serialization
//! failure (two gateways' batches taking row locks in another order) is run
//! again, since nothing of it was kept.

use std::collections::HashSet;

use futures_util::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Statement};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::backend;
use crate::store::StoreError;

mod ledger;

pub(super) use ledger::{Lookup, Moved, Reserve, ReserveOp, Transition, TransitionOp, Writer};

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
    /// `None` for an op that may share one with any other (a read).
    fn key(op: &Self::Op) -> Option<&str>;
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
/// in `carry` for the next batch; reads of one key share it). `None` when
/// the queue is closed.
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
    if let Some(key) = K::key(&first.0) {
        keys.insert(key.to_owned());
    }
    batch.push(first);
    // Let the calls that are ready to run queue their writes first: one
    // turn of the scheduler, microseconds, and the batch takes them too
    // instead of leaving with the first write alone while the gateway's
    // other calls are one step behind it.
    tokio::task::yield_now().await;
    while batch.len() < MAX_BATCH {
        let Ok(job) = rx.try_recv() else { break };
        if let Some(key) = K::key(&job.0) {
            if !keys.insert(key.to_owned()) {
                *carry = Some(job);
                break;
            }
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// The lookups' statement, noting the size of each batch it runs.
    /// `KEYED`: as if a lookup were a write of its key.
    struct Counted<const KEYED: bool>(Arc<parking_lot::Mutex<Vec<usize>>>);

    impl<const KEYED: bool> Kind for Counted<KEYED> {
        type Op = String;
        type Out = Option<String>;
        const WHAT: &'static str = Lookup::WHAT;
        const SQL: &'static str = Lookup::SQL;

        fn key(op: &String) -> Option<&str> {
            if KEYED {
                Some(op)
            } else {
                Lookup::key(op)
            }
        }

        fn run<'a>(
            &'a self,
            client: &'a Client,
            statement: &'a Statement,
            ops: &'a [String],
        ) -> BoxFuture<'a, Result<Vec<Option<String>>, tokio_postgres::Error>> {
            self.0.lock().push(ops.len());
            Lookup.run(client, statement, ops)
        }
    }

    /// The batches 64 lookups of one key, queued at one moment (all of them
    /// before the writer runs: one thread), went out in.
    async fn batches<const KEYED: bool>(config: &tokio_postgres::Config) -> Vec<usize> {
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let tls = MakeRustlsConnect::new(super::super::unused_tls().unwrap());
        let group = Group::start(
            Counted::<KEYED>(seen.clone()),
            config.clone(),
            tls,
            Durability::Relaxed,
        );
        let asked = (0..64).map(|_| group.submit("k".to_owned()));
        for answer in futures_util::future::join_all(asked).await {
            assert_eq!(answer.unwrap(), None, "no record holds the key");
        }
        let seen = seen.lock().clone();
        seen
    }

    /// Lookups queued at one moment share one statement, even of one key
    /// (a read writes nothing); writes of one key never share one.
    #[tokio::test]
    async fn lookups_queued_at_one_moment_share_one_statement_and_writes_of_one_key_do_not() {
        let Some((_schema, mut config)) = crate::store::tests::PgSchema::new().await else {
            return;
        };
        config.ssl_mode(tokio_postgres::config::SslMode::Disable);
        let (client, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        for m in super::super::MIGRATIONS {
            client.batch_execute(m).await.unwrap();
        }
        assert_eq!(batches::<false>(&config).await, [64]);
        assert_eq!(batches::<true>(&config).await, [1; 64]);
    }
}
