//! The PostgreSQL store: the ledger, proposals, the audit outbox and the
//! first-use pins in one database that several gateways share (DESIGN.md
//! section 13).
//!
//! - Versioned migrations ([`MIGRATIONS`]) are applied at start under an
//!   advisory lock, so gateways starting together apply each once; a
//!   database whose schema is newer than this binary knows is refused.
//! - A reservation is `INSERT … ON CONFLICT DO NOTHING`, then (for a key
//!   that is taken) a row lock and the binding check; the approval is
//!   consumed in the same transaction. A transition is `UPDATE … WHERE key =
//!   $1 AND state = $2`: the row moves only from the state the caller saw.
//! - Durability follows the store contract: a commit that must be on disk
//!   (`dispatched`, a final answer, a reviewer's decision, a pin) uses
//!   synchronous commit; the others `SET LOCAL synchronous_commit = off`
//!   (atomic and visible at once, durable with the next WAL flush).
//! - Rows carry the gateway that wrote them; `recover` and the outbox are
//!   that gateway's own.
//! - The hot writes of concurrent calls (a reservation without an approval,
//!   and every ledger transition) are grouped ([`group`]): one multi-row
//!   statement and one commit for what is queued at once, so concurrent
//!   `dispatched` and answer commits share one WAL flush.

mod console;
mod group;
mod guards;
mod inputs;
mod lease;
use lease::{register, renew};
mod notices;
mod proposals;
mod schema;
mod tasks;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres_rustls::MakeRustlsConnect;

use group::{Durability, Group};

use super::{
    check_transition, dispatched_only, needs_durability, proposal_durable, proposal_final,
    InputRow, Inputs, Ledger, Outbox, Proposals, Recovery, Reservation, Seen, Settle, Store,
    StoreError, StoreEvent, StoreFuture,
};
use crate::core::approval::{self, Proposal, ProposalState};
use crate::core::ledger::{Record, State};
use crate::core::notify::{Notice, WebhookStatus};
use std::collections::BTreeMap;

pub use schema::MIGRATIONS;

/// The database's clock in unix milliseconds: leases are judged on one
/// clock, whatever the gateways' hosts think the time is.
const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// Any number: the advisory lock that serializes migrations.
const MIGRATION_LOCK: i64 = 0x636f_756e_7465_7273;

fn backend(op: &'static str) -> impl Fn(tokio_postgres::Error) -> StoreError {
    move |e| StoreError::Backend {
        op,
        reason: chain(&e),
        cause: Some(super::Cause::new(e)),
    }
}

fn pool_error(e: deadpool_postgres::PoolError) -> StoreError {
    StoreError::Backend {
        op: "connect",
        reason: chain(&e),
        cause: Some(super::Cause::new(e)),
    }
}

/// An error with its causes: tokio-postgres says "error performing TLS
/// handshake" and keeps the reason (an unknown issuer, say) in its source.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

fn encode<T: serde::Serialize>(what: &'static str, v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Encode {
        what,
        reason: e.to_string(),
        cause: Some(crate::store::Cause::new(e)),
    })
}

fn decode<T: serde::de::DeserializeOwned>(what: &'static str, text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt {
        what,
        reason: e.to_string(),
        cause: Some(crate::store::Cause::new(e)),
    })
}

/// Queue `notices` in `txn` (a notice already queued stays as it is).
async fn insert_notices(
    txn: &deadpool_postgres::Transaction<'_>,
    notices: &[Notice],
) -> Result<(), StoreError> {
    for n in notices {
        txn.execute(
            "INSERT INTO notices (key, next_ms, notice) VALUES ($1, $2, $3)
             ON CONFLICT (key) DO NOTHING",
            &[&n.key(), &n.next_ms, &encode("notice", n)?],
        )
        .await
        .map_err(backend("queue a notice"))?;
    }
    Ok(())
}

/// A proposal's revision as the `revision` column holds it.
fn revision(p: &Proposal) -> Result<i64, StoreError> {
    i64::try_from(p.revision).map_err(|_| StoreError::Encode {
        what: "proposal",
        reason: format!("revision {} is out of range", p.revision),
        cause: None,
    })
}

/// An audit outbox row as the grouped statement takes it (the column is a
/// `bigint`; the log's ids start at the clock in microseconds, far below
/// its top).
fn outbox_row((id, text): (u64, String)) -> (i64, String) {
    (i64::try_from(id).unwrap_or(i64::MAX), text)
}

fn state_name(s: State) -> &'static str {
    match s {
        State::Reserved => "reserved",
        State::Dispatched => "dispatched",
        State::Complete => "complete",
        State::NotDispatched => "not_dispatched",
        State::Unknown => "unknown",
    }
}

/// The ledger in PostgreSQL.
pub struct PgStore {
    pool: Pool,
    gateway: Arc<str>,
    /// The runtime the store was opened on: `outbox_clear` is called from
    /// the audit writer's own thread, outside any runtime.
    runtime: tokio::runtime::Handle,
    /// This gateway's lease epoch (renewed by a task of its own; a new
    /// epoch after a lapse).
    epoch: Arc<AtomicI64>,
    /// How long a lease lasts without renewal.
    lease_ms: i64,
    renewal: Option<tokio::task::JoinHandle<()>>,
    /// What `LISTEN` hears, for [`Store::subscribe`].
    events: tokio::sync::broadcast::Sender<StoreEvent>,
    listener: tokio::task::JoinHandle<()>,
    /// Grouped ledger lookups.
    lookups: Group<group::Lookup>,
    /// Grouped reservations (not durable by themselves: the contract).
    reserves: Group<group::Reserve>,
    /// Grouped transitions the contract needs on disk when they return.
    flushed: Group<group::Transition>,
    /// Grouped transitions that may reach the disk with the next flush.
    relaxed: Group<group::Transition>,
}

impl Drop for PgStore {
    fn drop(&mut self) {
        if let Some(r) = self.renewal.take() {
            r.abort();
        }
        self.listener.abort();
    }
}

/// The channels changes are announced on (`pg_notify`, delivered at commit).
const PROPOSALS_CHANNEL: &str = "countersign_proposals";
const LEDGER_CHANNEL: &str = "countersign_ledger";
const TASKS_CHANNEL: &str = "countersign_tasks";

/// One connection that `LISTEN`s and forwards what it hears; reconnects
/// when it is lost (what changed meanwhile is found by the waiters' own
/// re-reads: a notification only wakes, it is never the record).
async fn listen(
    config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    events: tokio::sync::broadcast::Sender<StoreEvent>,
) {
    loop {
        match config.connect(tls.clone()).await {
            Ok((client, mut conn)) => {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                let driver = tokio::spawn(async move {
                    let mut messages =
                        futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
                    while let Some(m) = futures_util::StreamExt::next(&mut messages).await {
                        match m {
                            Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                                let payload = n.payload().to_owned();
                                let event = match n.channel() {
                                    PROPOSALS_CHANNEL => StoreEvent::Proposal(payload),
                                    TASKS_CHANNEL => StoreEvent::Task(payload),
                                    _ => StoreEvent::Ledger(payload),
                                };
                                if tx.send(event).is_err() {
                                    return;
                                }
                            }
                            Ok(_) => {}
                            Err(e) => {
                                tracing::warn!("store notifications: connection lost: {e}");
                                return;
                            }
                        }
                    }
                });
                let listening = client
                    .batch_execute(&format!(
                        "LISTEN {PROPOSALS_CHANNEL}; LISTEN {LEDGER_CHANNEL}; LISTEN {TASKS_CHANNEL}"
                    ))
                    .await;
                if let Err(e) = listening {
                    tracing::warn!("store notifications: LISTEN failed: {e}");
                } else {
                    while let Some(e) = rx.recv().await {
                        let _ = events.send(e);
                    }
                }
                driver.abort();
            }
            Err(e) => tracing::warn!("store notifications: cannot connect: {}", chain(&e)),
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// The TLS settings of a plain connection (never used: TLS is disabled
/// on it), for the one connector type every connection shares.
fn unused_tls() -> Result<rustls::ClientConfig, StoreError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Open {
            path: "store.url".into(),
            reason: e.to_string(),
            cause: Some(crate::store::Cause::new(e)),
        })?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth())
}

/// How the schema of a database stands against this binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migrated {
    /// The version before.
    pub from: usize,
    /// The version now.
    pub to: usize,
}

impl PgStore {
    /// Connect (a pool of `pool_size`), as gateway `gateway`, and bring the
    /// schema up to date. `config` is the parsed connection string with the
    /// password already set; `tls` checks the server when `config` requires
    /// TLS (`None`: plain TCP, and a `config` that requires TLS is refused).
    pub async fn connect(
        mut config: tokio_postgres::Config,
        tls: Option<Arc<rustls::ClientConfig>>,
        pool_size: usize,
        gateway: &str,
    ) -> Result<(PgStore, Migrated), StoreError> {
        let tls = match tls {
            Some(c) => MakeRustlsConnect::new((*c).clone()),
            None => {
                if config.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
                    return Err(StoreError::Open {
                        path: "store.url".into(),
                        reason: "the url requires TLS but no TLS settings were given".into(),
                        cause: None,
                    });
                }
                // Plain TCP: never offer TLS that nothing would check.
                config.ssl_mode(tokio_postgres::config::SslMode::Disable);
                MakeRustlsConnect::new(unused_tls()?)
            }
        };
        let config_for_listen = config.clone();
        let gateway: Arc<str> = Arc::from(gateway);
        let epoch: Arc<AtomicI64> = Arc::default();
        let writer = group::Writer {
            gateway: gateway.clone(),
            epoch: epoch.clone(),
        };
        // A read commits nothing: its session's durability does not matter,
        // only the plan settings both kinds share.
        let lookups = Group::start(
            group::Lookup,
            config.clone(),
            tls.clone(),
            Durability::Relaxed,
        );
        let reserves = Group::start(
            group::Reserve(writer.clone()),
            config.clone(),
            tls.clone(),
            Durability::Relaxed,
        );
        let flushed = Group::start(
            group::Transition(writer.clone()),
            config.clone(),
            tls.clone(),
            Durability::Flushed,
        );
        let relaxed = Group::start(
            group::Transition(writer),
            config.clone(),
            tls.clone(),
            Durability::Relaxed,
        );
        let manager = Manager::from_config(
            config,
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(pool_size)
            .build()
            .map_err(|e| StoreError::Open {
                path: "store.url".into(),
                reason: e.to_string(),
                cause: Some(crate::store::Cause::new(e)),
            })?;
        let (events, _) = tokio::sync::broadcast::channel(1024);
        let listener = tokio::spawn(listen(config_for_listen, tls, events.clone()));
        let store = PgStore {
            pool,
            gateway,
            runtime: tokio::runtime::Handle::current(),
            epoch,
            lease_ms: 0,
            renewal: None,
            events,
            listener,
            lookups,
            reserves,
            flushed,
            relaxed,
        };
        let migrated = store.migrate().await?;
        Ok((store, migrated))
    }

    /// Take this gateway's lease (valid `lease` without renewal) and keep
    /// renewing it. Until then the store dispatches nothing: `store
    /// migrate` and the like never do.
    pub async fn start_lease(&mut self, lease: std::time::Duration) -> Result<i64, StoreError> {
        self.lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
        let epoch = register(&self.pool, &self.gateway, self.lease_ms).await?;
        self.epoch.store(epoch, Ordering::SeqCst);
        if let Some(r) = self.renewal.take() {
            r.abort();
        }
        self.renewal = Some(tokio::spawn(renew(
            self.pool.clone(),
            self.gateway.clone(),
            self.epoch.clone(),
            self.lease_ms,
        )));
        Ok(epoch)
    }

    /// Apply the migrations this binary knows and the database lacks.
    /// Refuses a database whose schema is newer.
    pub async fn migrate(&self) -> Result<Migrated, StoreError> {
        let mut client = self.pool.get().await.map_err(pool_error)?;
        let txn = client.transaction().await.map_err(backend("begin"))?;
        txn.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(backend("lock for migrations"))?;
        txn.batch_execute(
            "CREATE TABLE IF NOT EXISTS countersign_migrations (
                version integer PRIMARY KEY,
                applied_at timestamptz NOT NULL DEFAULT now()
             )",
        )
        .await
        .map_err(backend("create the migrations table"))?;
        let row = txn
            .query_one(
                "SELECT coalesce(max(version), 0) FROM countersign_migrations",
                &[],
            )
            .await
            .map_err(backend("read the schema version"))?;
        let from = usize::try_from(row.get::<_, i32>(0)).unwrap_or(0);
        if from > MIGRATIONS.len() {
            return Err(StoreError::Open {
                path: "store.url".into(),
                reason: format!(
                    "the database schema is at version {from}, newer than this countersign knows ({}): upgrade countersign",
                    MIGRATIONS.len()
                ),
                cause: None,
            });
        }
        for (i, step) in MIGRATIONS.iter().enumerate().skip(from) {
            txn.batch_execute(step)
                .await
                .map_err(backend("apply a migration"))?;
            let version = i32::try_from(i + 1).unwrap_or(i32::MAX);
            txn.execute(
                "INSERT INTO countersign_migrations (version) VALUES ($1)",
                &[&version],
            )
            .await
            .map_err(backend("record a migration"))?;
        }
        txn.commit().await.map_err(backend("commit migrations"))?;
        Ok(Migrated {
            from,
            to: MIGRATIONS.len(),
        })
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(pool_error)
    }

    /// A reservation in a transaction of its own: a key some row holds
    /// (free again if that row no longer binds it), and the approval
    /// consumed with it.
    async fn reserve_alone(
        &self,
        key: String,
        record: Record,
        now_ms: i64,
        approval: Option<String>,
    ) -> Result<Reservation, StoreError> {
        let mut client = self.client().await?;
        let txn = client.transaction().await.map_err(backend("begin"))?;
        relaxed(&txn, false).await?;
        let text = encode("record", &record)?;
        let state = state_name(record.state);
        let gateway: &str = &self.gateway;
        let epoch = self.epoch.load(Ordering::SeqCst);
        // The key is free when no row holds it...
        let inserted = txn
            .execute(
                "INSERT INTO ledger (key, state, expires_ms, gateway, record, epoch)
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (key) DO NOTHING",
                &[&key, &state, &record.expires_ms, &gateway, &text, &epoch],
            )
            .await
            .map_err(backend("reserve"))?;
        if inserted == 0 {
            // ...or when the row that holds it no longer binds it.
            let row = txn
                .query_one(
                    "SELECT record FROM ledger WHERE key = $1 FOR UPDATE",
                    &[&key],
                )
                .await
                .map_err(backend("reserve"))?;
            let existing: Record = decode("record", row.get::<_, &str>(0))?;
            if existing.binds(now_ms) {
                return Ok(Reservation::Bound(existing));
            }
            txn.execute(
                "UPDATE ledger SET state = $2, expires_ms = $3, gateway = $4, record = $5, epoch = $6
                 WHERE key = $1",
                &[&key, &state, &record.expires_ms, &gateway, &text, &epoch],
            )
            .await
            .map_err(backend("reserve"))?;
        }
        if let Some(id) = approval {
            let row = txn
                .query_opt(
                    "SELECT proposal FROM proposals WHERE id = $1 FOR UPDATE",
                    &[&id],
                )
                .await
                .map_err(backend("read a proposal"))?;
            let Some(row) = row else {
                return Ok(Reservation::Unapproved(ProposalState::Invalidated));
            };
            let p: Proposal = decode("proposal", row.get::<_, &str>(0))?;
            match approval::consume(&p, &key, &record.server, &record.digest, now_ms) {
                Err(state) => return Ok(Reservation::Unapproved(state)),
                Ok(None) => {}
                Ok(Some(next)) => {
                    txn.execute(
                        "UPDATE proposals SET state = $2, updated_ms = $3, proposal = $4, revision = $5
                         WHERE id = $1",
                        &[
                            &id,
                            &next.state.as_str(),
                            &next.updated_ms,
                            &encode("proposal", &next)?,
                            &revision(&next)?,
                        ],
                    )
                    .await
                    .map_err(backend("consume an approval"))?;
                    notify(&txn, PROPOSALS_CHANNEL, &id).await?;
                }
            }
        }
        txn.commit().await.map_err(backend("commit"))?;
        Ok(Reservation::Reserved)
    }
}

/// `SET LOCAL synchronous_commit = off` for a commit that need not be on
/// disk when it returns (the store contract says which).
async fn relaxed(
    txn: &deadpool_postgres::Transaction<'_>,
    durable: bool,
) -> Result<(), StoreError> {
    if !durable {
        txn.batch_execute("SET LOCAL synchronous_commit = off")
            .await
            .map_err(backend("relax the commit"))?;
    }
    Ok(())
}

/// Turn `dispatched` rows (key, record; locked by the caller) into
/// `unknown`: sent, the answer lost. Calls waiting on them, on any gateway,
/// look again when `txn` commits.
async fn mark_unknown(
    txn: &deadpool_postgres::Transaction<'_>,
    rows: &[tokio_postgres::Row],
    op: &'static str,
) -> Result<(), StoreError> {
    for r in rows {
        let key: &str = r.get(0);
        let mut rec: Record = decode("record", r.get::<_, &str>(1))?;
        rec.state = State::Unknown;
        txn.execute(
            "UPDATE ledger SET state = 'unknown', record = $2 WHERE key = $1 AND state = 'dispatched'",
            &[&key, &encode("record", &rec)?],
        )
        .await
        .map_err(backend(op))?;
        notify(txn, LEDGER_CHANNEL, key).await?;
    }
    Ok(())
}

/// Announce a change; delivered to listeners when `txn` commits.
async fn notify(
    txn: &deadpool_postgres::Transaction<'_>,
    channel: &str,
    payload: &str,
) -> Result<(), StoreError> {
    txn.execute("SELECT pg_notify($1, $2)", &[&channel, &payload])
        .await
        .map_err(backend("notify"))?;
    Ok(())
}

impl Store for PgStore {
    fn subscribe(&self) -> Option<tokio::sync::broadcast::Receiver<StoreEvent>> {
        Some(self.events.subscribe())
    }

    fn health(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let ask = async {
                let client = self.client().await?;
                client
                    .execute("SELECT 1", &[])
                    .await
                    .map_err(backend("health check"))
            };
            match tokio::time::timeout(std::time::Duration::from_secs(2), ask).await {
                Ok(r) => r.map(|_| ()),
                Err(_) => Err(StoreError::Backend {
                    op: "health check",
                    reason: "no answer within 2s".into(),
                    cause: None,
                }),
            }
        })
    }
}

impl Ledger for PgStore {
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move {
            let found = self.lookups.submit(key.to_owned()).await?;
            found.map(|r| decode("record", &r)).transpose()
        })
    }

    fn reserve_with(
        &self,
        key: String,
        record: Record,
        now_ms: i64,
        approval: Option<String>,
    ) -> StoreFuture<'_, Reservation> {
        Box::pin(async move {
            // A free key, the common case, is claimed in a grouped insert;
            // a taken key, or an approval to consume with it, takes a
            // transaction of its own.
            if approval.is_none() {
                let op = group::ReserveOp {
                    key: key.clone(),
                    state: state_name(record.state),
                    expires_ms: record.expires_ms,
                    record: encode("record", &record)?,
                    epoch: self.epoch.load(Ordering::SeqCst),
                };
                if self.reserves.submit(op).await? {
                    return Ok(Reservation::Reserved);
                }
            }
            self.reserve_alone(key, record, now_ms, approval).await
        })
    }

    fn transition_telling(
        &self,
        key: String,
        from: State,
        to: Record,
        outbox: Option<(u64, String)>,
        notices: Vec<Notice>,
    ) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            check_transition(from, to.state)?;
            let told = !notices.is_empty();
            let notices = if told {
                Some(encode("notice", &notices)?)
            } else {
                None
            };
            // The lease and epoch check of a move to `dispatched`, the
            // outbox row and the notification are in the grouped statement
            // (`group::Transition`).
            let op = group::TransitionOp {
                key,
                from: Some(state_name(from)),
                to: state_name(to.state),
                expires_ms: to.expires_ms,
                record: encode("record", &to)?,
                outbox: outbox.map(outbox_row),
                notices,
                epoch: 0,
            };
            // A notification is queued durably with what it announces.
            let moved = if needs_durability(from, to.state) || told {
                self.flushed.submit(op).await?
            } else {
                self.relaxed.submit(op).await?
            };
            Ok(moved == group::Moved::Yes)
        })
    }

    fn reserve_dispatched(
        &self,
        key: String,
        record: Record,
        _now_ms: i64,
        outbox: Option<(u64, String)>,
    ) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            dispatched_only(&record)?;
            // An insert in the flushed writer's grouped statement, beside
            // the moves to `dispatched` and the answers: one statement and
            // one commit fewer per write than a reservation and its move.
            // The lease check is in the statement (`group::Transition`).
            let op = group::TransitionOp {
                key,
                from: None,
                to: state_name(record.state),
                expires_ms: record.expires_ms,
                record: encode("record", &record)?,
                outbox: outbox.map(outbox_row),
                notices: None,
                epoch: self.epoch.load(Ordering::SeqCst),
            };
            match self.flushed.submit(op).await? {
                group::Moved::Yes => Ok(true),
                group::Moved::No => Ok(false),
                group::Moved::Fenced => Err(StoreError::Fenced),
            }
        })
    }

    fn recover(&self) -> StoreFuture<'_, Recovery> {
        Box::pin(async move {
            let mut client = self.client().await?;
            let txn = client.transaction().await.map_err(backend("begin"))?;
            let gateway: &str = &self.gateway;
            // This gateway's own rows only: another gateway's calls in
            // flight are that gateway's to recover. What a call never sent
            // took of its guards (budgets, effect keys) goes back first.
            txn.execute(
                "DELETE FROM guards WHERE key IN
                   (SELECT key FROM ledger WHERE gateway = $1 AND state = 'reserved')",
                &[&gateway],
            )
            .await
            .map_err(backend("recover"))?;
            let freed = txn
                .execute(
                    "DELETE FROM ledger WHERE gateway = $1 AND state = 'reserved'",
                    &[&gateway],
                )
                .await
                .map_err(backend("recover"))?;
            let rows = txn
                .query(
                    "SELECT key, record FROM ledger WHERE gateway = $1 AND state = 'dispatched' FOR UPDATE",
                    &[&gateway],
                )
                .await
                .map_err(backend("recover"))?;
            mark_unknown(&txn, &rows, "recover").await?;
            txn.commit().await.map_err(backend("commit"))?;
            Ok(Recovery {
                freed: usize::try_from(freed).unwrap_or(usize::MAX),
                unknown: rows.len(),
            })
        })
    }

    fn gc(&self, now_ms: i64) -> StoreFuture<'_, usize> {
        Box::pin(async move {
            let mut client = self.client().await?;
            let txn = client.transaction().await.map_err(backend("begin"))?;
            relaxed(&txn, false).await?;
            // Calls of gateways whose lease lapsed more than a lease ago:
            // what they reserved was never sent (their dispatch is refused
            // now), and what they dispatched has an unknown outcome, never a
            // free key.
            let lapsed = format!("SELECT id FROM gateways WHERE lease_until_ms < {NOW_MS} - $1");
            // What their unsent calls took of the guards goes back.
            txn.execute(
                &format!(
                    "DELETE FROM guards WHERE key IN
                       (SELECT key FROM ledger WHERE state = 'reserved' AND gateway IN ({lapsed}))"
                ),
                &[&self.lease_ms],
            )
            .await
            .map_err(backend("settle lapsed gateways"))?;
            let freed_keys = txn
                .query(
                    &format!(
                        "DELETE FROM ledger WHERE state = 'reserved' AND gateway IN ({lapsed}) RETURNING key"
                    ),
                    &[&self.lease_ms],
                )
                .await
                .map_err(backend("settle lapsed gateways"))?;
            for r in &freed_keys {
                // Calls waiting on the key look again: it is free.
                notify(&txn, LEDGER_CHANNEL, r.get::<_, &str>(0)).await?;
            }
            let freed = freed_keys.len();
            let rows = txn
                .query(
                    &format!(
                        "SELECT key, record FROM ledger WHERE state = 'dispatched' AND gateway IN ({lapsed})
                         FOR UPDATE SKIP LOCKED"
                    ),
                    &[&self.lease_ms],
                )
                .await
                .map_err(backend("settle lapsed gateways"))?;
            mark_unknown(&txn, &rows, "settle lapsed gateways").await?;
            if freed > 0 || !rows.is_empty() {
                tracing::warn!(
                    freed,
                    unknown = rows.len(),
                    "calls of gateways whose lease lapsed settled"
                );
            }
            // Waits a gateway that stopped never ended (a wait lasts a hold
            // at most): only an announcement more for a settled key.
            txn.execute(
                "DELETE FROM ledger_waiters WHERE since_ms < $1",
                &[&(now_ms - 600_000)],
            )
            .await
            .map_err(backend("forget waits"))?;
            // What no longer binds its key (`Record::binds`).
            let n = txn
                .execute(
                    "DELETE FROM ledger WHERE state = 'not_dispatched'
                        OR (state = 'complete' AND expires_ms <= $1)",
                    &[&now_ms],
                )
                .await
                .map_err(backend("forget records"))?;
            txn.commit().await.map_err(backend("commit"))?;
            Ok(usize::try_from(n).unwrap_or(usize::MAX))
        })
    }

    fn wait_for(&self, key: String) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let client = self.client().await?;
            client
                .execute(
                    &format!(
                        "INSERT INTO ledger_waiters (key, gateway, since_ms) VALUES ($1, $2, {NOW_MS})
                         ON CONFLICT (key, gateway) DO NOTHING"
                    ),
                    &[&key, &&*self.gateway],
                )
                .await
                .map_err(backend("wait for a key"))?;
            Ok(())
        })
    }

    fn waited(&self, key: String) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let client = self.client().await?;
            client
                .execute(
                    "DELETE FROM ledger_waiters WHERE key = $1 AND gateway = $2",
                    &[&key, &&*self.gateway],
                )
                .await
                .map_err(backend("end a wait for a key"))?;
            Ok(())
        })
    }

    fn list(&self, state: Option<State>) -> StoreFuture<'_, Vec<(String, Record)>> {
        Box::pin(async move {
            let client = self.client().await?;
            let rows = match state {
                Some(s) => {
                    client
                        .query(
                            "SELECT key, record FROM ledger WHERE state = $1 ORDER BY key",
                            &[&state_name(s)],
                        )
                        .await
                }
                None => {
                    client
                        .query("SELECT key, record FROM ledger ORDER BY key", &[])
                        .await
                }
            }
            .map_err(backend("list"))?;
            rows.iter()
                .map(|r| {
                    Ok((
                        r.get::<_, String>(0),
                        decode("record", r.get::<_, &str>(1))?,
                    ))
                })
                .collect()
        })
    }
}

impl Seen for PgStore {
    fn pin_first_use(&self, pins: Vec<(String, String)>) -> StoreFuture<'_, usize> {
        Box::pin(async move {
            if pins.is_empty() {
                return Ok(0);
            }
            let mut client = self.client().await?;
            let txn = client.transaction().await.map_err(backend("begin"))?;
            let mut wrote = 0;
            for (key, value) in &pins {
                wrote += txn
                    .execute(
                        "INSERT INTO tool_pins (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
                        &[key, value],
                    )
                    .await
                    .map_err(backend("pin"))?;
            }
            txn.commit().await.map_err(backend("commit"))?;
            Ok(usize::try_from(wrote).unwrap_or(usize::MAX))
        })
    }

    fn use_nonce(&self, nonce: String, expires_ms: i64, now_ms: i64) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            let client = self.client().await?;
            // One statement: two gateways given the same nonce at once
            // cannot both record it. An expired row is taken over.
            let row = client
                .query_opt(
                    "INSERT INTO used_nonces (nonce, expires_ms) VALUES ($1, $2)
                     ON CONFLICT (nonce) DO UPDATE SET expires_ms = EXCLUDED.expires_ms
                       WHERE used_nonces.expires_ms <= $3
                     RETURNING 1",
                    &[&nonce, &expires_ms, &now_ms],
                )
                .await
                .map_err(backend("use a nonce"))?;
            // Now and then, drop what can no longer match.
            if rand::random::<u8>() < 8 {
                let _ = client
                    .execute("DELETE FROM used_nonces WHERE expires_ms <= $1", &[&now_ms])
                    .await;
            }
            Ok(row.is_some())
        })
    }

    fn first_use_pins(&self) -> StoreFuture<'_, Vec<String>> {
        Box::pin(async move {
            let client = self.client().await?;
            let rows = client
                .query("SELECT value FROM tool_pins", &[])
                .await
                .map_err(backend("read pins"))?;
            Ok(rows.iter().map(|r| r.get::<_, String>(0)).collect())
        })
    }
}
