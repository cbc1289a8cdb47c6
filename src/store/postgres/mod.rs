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
mod tasks;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres_rustls::MakeRustlsConnect;

use group::{Durability, Group};

use super::{
    check_transition, needs_durability, proposal_durable, proposal_final, InputRow, Recovery,
    Reservation, Settle, Store, StoreError, StoreEvent, StoreFuture,
};
use crate::core::approval::{self, Proposal, ProposalState};
use crate::core::ledger::{Record, State};
use crate::core::notify::{Notice, WebhookStatus};
use std::collections::BTreeMap;

/// The schema, one step per version. Never edit a step that shipped: add one.
pub const MIGRATIONS: &[&str] = &[
    // 1: the tables of one or several gateways.
    "CREATE TABLE ledger (
        key text PRIMARY KEY,
        state text NOT NULL,
        expires_ms bigint NOT NULL,
        gateway text NOT NULL,
        record text NOT NULL
     );
     CREATE INDEX ledger_state ON ledger (state);
     CREATE TABLE proposals (
        id text PRIMARY KEY,
        state text NOT NULL,
        updated_ms bigint NOT NULL,
        proposal text NOT NULL
     );
     CREATE TABLE audit_outbox (
        gateway text NOT NULL,
        id bigint NOT NULL,
        entries text NOT NULL,
        PRIMARY KEY (gateway, id)
     );
     CREATE TABLE tool_pins (
        key text PRIMARY KEY,
        value text NOT NULL
     );",
    // 2: gateway leases.
    "CREATE TABLE gateways (
        id text PRIMARY KEY,
        epoch bigint NOT NULL,
        lease_until_ms bigint NOT NULL
     );",
    // 3: the lease epoch a key was reserved under.
    "ALTER TABLE ledger ADD COLUMN epoch bigint NOT NULL DEFAULT 0;",
    // 4: a proposal's revision, the compare of every write over it.
    "ALTER TABLE proposals ADD COLUMN revision bigint NOT NULL DEFAULT 0;",
    // 5: notifications waiting for delivery, leased to one gateway at a
    // time, and each webhook's status.
    "CREATE TABLE notices (
        key text PRIMARY KEY,
        next_ms bigint NOT NULL,
        gave_up boolean NOT NULL DEFAULT false,
        lease_owner text,
        lease_until bigint,
        notice text NOT NULL
     );
     CREATE INDEX notices_due ON notices (next_ms) WHERE NOT gave_up;
     CREATE TABLE notify_status (
        webhook text PRIMARY KEY,
        status text NOT NULL
     );",
    // 6: nonces of signed control requests, each usable once until it
    // expires (a captured request replayed at any gateway is refused).
    "CREATE TABLE used_nonces (
        nonce text PRIMARY KEY,
        expires_ms bigint NOT NULL
     );
     CREATE INDEX used_nonces_expiry ON used_nonces (expires_ms);",
    // 7: decision inputs (`[policy] inputs`), kept for a bounded window.
    "CREATE TABLE decision_inputs (
        key text PRIMARY KEY,
        tenant text NOT NULL,
        time_ms bigint NOT NULL,
        inputs text NOT NULL
     );
     CREATE INDEX decision_inputs_time ON decision_inputs (time_ms);
     CREATE INDEX decision_inputs_tenant ON decision_inputs (tenant);",
    // 8: held calls as tasks (DESIGN.md section 24): the task as JSON,
    // with the columns its look-ups and compare-and-set read.
    "CREATE TABLE tasks (
        id text PRIMARY KEY,
        tenant text NOT NULL,
        principal text NOT NULL,
        join_key text NOT NULL,
        proposal text,
        state text NOT NULL,
        revision bigint NOT NULL,
        created_ms bigint NOT NULL,
        updated_ms bigint NOT NULL,
        task text NOT NULL
     );
     CREATE INDEX tasks_owner ON tasks (tenant, principal);
     CREATE INDEX tasks_join ON tasks (join_key);
     CREATE INDEX tasks_open ON tasks (proposal) WHERE state IN ('waiting', 'claimed');",
    // 9: guards on the business effect (DESIGN.md section 25): one row per
    // call and guard, in the guard's group (kind, name and scope hashed).
    "CREATE TABLE guards (
        grp text NOT NULL,
        kind text NOT NULL,
        name text NOT NULL,
        tenant text NOT NULL,
        scope text NOT NULL,
        key text NOT NULL,
        amount numeric NOT NULL,
        at_ms bigint NOT NULL,
        until_ms bigint NOT NULL,
        PRIMARY KEY (grp, key)
     );
     CREATE INDEX guards_key ON guards (key);
     CREATE INDEX guards_window ON guards (grp, at_ms);
     CREATE INDEX guards_until ON guards (until_ms);",
    // 10: the review console's state, shared by the gateways (DESIGN.md
    // section 21): sessions, challenges, invitations, failed sign-ins and
    // passkey counters.
    "CREATE TABLE review_console (
        key text PRIMARY KEY,
        value text NOT NULL,
        until_ms bigint NOT NULL
     );
     CREATE INDEX review_console_until ON review_console (until_ms);",
    // 11: a proposal's tenant and requester as columns, indexed: a held call
    // reads its own requester's proposals, not the table.
    "ALTER TABLE proposals ADD COLUMN tenant text, ADD COLUMN requester text;
     UPDATE proposals SET tenant = proposal::jsonb->>'tenant', requester = proposal::jsonb->>'requester';
     CREATE INDEX proposals_requester ON proposals (tenant, requester);
     CREATE INDEX proposals_open ON proposals (id) WHERE state IN ('pending', 'approved');",
];

/// The database's clock in unix milliseconds: leases are judged on one
/// clock, whatever the gateways' hosts think the time is.
const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// Any number: the advisory lock that serializes migrations.
const MIGRATION_LOCK: i64 = 0x636f_756e_7465_7273;

fn backend(op: &'static str) -> impl Fn(tokio_postgres::Error) -> StoreError {
    move |e| StoreError::Backend {
        op,
        reason: chain(&e),
    }
}

fn pool_error(e: deadpool_postgres::PoolError) -> StoreError {
    StoreError::Backend {
        op: "connect",
        reason: chain(&e),
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
    })
}

fn decode<T: serde::de::DeserializeOwned>(what: &'static str, text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt {
        what,
        reason: e.to_string(),
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
    })
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
    /// Grouped reservations (not durable by themselves: the contract).
    reserves: Group<group::Reserve>,
    /// Grouped transitions the contract needs on disk when they return.
    flushed: Group<group::Transition>,
    /// Grouped transitions that may reach the disk with the next flush.
    relaxed: Group<group::Transition>,
}

/// Writers per grouped kind: while one writer's batch is in flight (a WAL
/// flush, for the durable ones), the next gathers behind it.
const WRITERS: usize = 2;

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
                        "LISTEN {PROPOSALS_CHANNEL}; LISTEN {LEDGER_CHANNEL}"
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
        })?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth())
}

/// Take (or take again) `gateway`'s lease: a new epoch, valid `lease_ms`.
async fn register(pool: &Pool, gateway: &str, lease_ms: i64) -> Result<i64, StoreError> {
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
async fn renew(pool: Pool, gateway: Arc<str>, epoch: Arc<AtomicI64>, lease_ms: i64) {
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
        let reserves = Group::start(
            group::Reserve(writer.clone()),
            config.clone(),
            tls.clone(),
            WRITERS,
            Durability::Relaxed,
        );
        let flushed = Group::start(
            group::Transition(writer.clone()),
            config.clone(),
            tls.clone(),
            WRITERS,
            Durability::Flushed,
        );
        let relaxed = Group::start(
            group::Transition(writer),
            config.clone(),
            tls.clone(),
            1,
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
    fn task_create(
        &self,
        task: crate::core::task::TaskRecord,
    ) -> StoreFuture<'_, crate::core::task::TaskRecord> {
        Box::pin(tasks::task_create(self, task))
    }

    fn task_get<'a>(
        &'a self,
        id: &'a str,
    ) -> StoreFuture<'a, Option<crate::core::task::TaskRecord>> {
        Box::pin(tasks::task_get(self, id))
    }

    fn tasks(
        &self,
        filter: super::TaskFilter,
    ) -> StoreFuture<'_, Vec<crate::core::task::TaskRecord>> {
        Box::pin(tasks::tasks(self, filter))
    }

    fn task_put(&self, task: crate::core::task::TaskRecord) -> StoreFuture<'_, bool> {
        Box::pin(tasks::task_put(self, task))
    }

    fn tasks_gc(&self, before_ms: i64) -> StoreFuture<'_, usize> {
        Box::pin(tasks::tasks_gc(self, before_ms))
    }

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
                }),
            }
        })
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move {
            let client = self.client().await?;
            // Prepared once per pooled connection: the lookup of every
            // keyed call is one round trip, not a parse and then a read.
            let statement = client
                .prepare_cached("SELECT record FROM ledger WHERE key = $1")
                .await
                .map_err(backend("read"))?;
            let row = client
                .query_opt(&statement, &[&key])
                .await
                .map_err(backend("read"))?;
            row.map(|r| decode("record", r.get::<_, &str>(0)))
                .transpose()
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
                if self.reserves.write(op).await? {
                    return Ok(Reservation::Reserved);
                }
            }
            self.reserve_alone(key, record, now_ms, approval).await
        })
    }

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
            match super::settled(notice, &outcome, &mut status) {
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

    fn put_proposal_with(
        &self,
        proposal: Proposal,
        expect: Option<ProposalState>,
        notices: Vec<Notice>,
    ) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            let mut client = self.client().await?;
            let txn = client.transaction().await.map_err(backend("begin"))?;
            relaxed(&txn, proposal_durable(&proposal) || !notices.is_empty()).await?;
            let text = encode("proposal", &proposal)?;
            let state = proposal.state.as_str();
            let rev = revision(&proposal)?;
            let n = match expect {
                None => txn
                    .execute(
                        "INSERT INTO proposals (id, state, updated_ms, proposal, revision, tenant, requester)
                         VALUES ($1, $2, $3, $4, $5, $6, $7)
                         ON CONFLICT (id) DO NOTHING",
                        &[
                            &proposal.id,
                            &state,
                            &proposal.updated_ms,
                            &text,
                            &rev,
                            &proposal.tenant,
                            &proposal.requester,
                        ],
                    )
                    .await
                    .map_err(backend("write a proposal"))?,
                // Compare and set on the state and the revision it was read at.
                Some(from) => txn
                    .execute(
                        "UPDATE proposals SET state = $2, updated_ms = $3, proposal = $4, revision = $5
                         WHERE id = $1 AND state = $6 AND revision = $7",
                        &[
                            &proposal.id,
                            &state,
                            &proposal.updated_ms,
                            &text,
                            &rev,
                            &from.as_str(),
                            &rev.wrapping_sub(1),
                        ],
                    )
                    .await
                    .map_err(backend("write a proposal"))?,
            };
            if n == 1 {
                notify(&txn, PROPOSALS_CHANNEL, &proposal.id).await?;
                // INVARIANT: a notification commits with the proposal
                // change it announces, or not at all.
                insert_notices(&txn, &notices).await?;
            }
            txn.commit().await.map_err(backend("commit"))?;
            Ok(n == 1)
        })
    }

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

    fn get_proposal<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Proposal>> {
        Box::pin(async move {
            let client = self.client().await?;
            let row = client
                .query_opt("SELECT proposal FROM proposals WHERE id = $1", &[&id])
                .await
                .map_err(backend("read a proposal"))?;
            row.map(|r| decode("proposal", r.get::<_, &str>(0)))
                .transpose()
        })
    }

    fn list_proposals(&self) -> StoreFuture<'_, Vec<Proposal>> {
        Box::pin(async move {
            let client = self.client().await?;
            let rows = client
                .query("SELECT proposal FROM proposals", &[])
                .await
                .map_err(backend("list proposals"))?;
            rows.iter()
                .map(|r| decode("proposal", r.get::<_, &str>(0)))
                .collect()
        })
    }

    fn open_proposals(&self) -> StoreFuture<'_, Vec<Proposal>> {
        Box::pin(async move {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT proposal FROM proposals WHERE state IN ('pending', 'approved')",
                    &[],
                )
                .await
                .map_err(backend("list open proposals"))?;
            rows.iter()
                .map(|r| decode("proposal", r.get::<_, &str>(0)))
                .collect()
        })
    }

    fn proposals_of<'a>(
        &'a self,
        tenant: &'a str,
        requester: &'a str,
    ) -> StoreFuture<'a, Vec<Proposal>> {
        Box::pin(async move {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT proposal FROM proposals WHERE tenant = $1 AND requester = $2",
                    &[&tenant, &requester],
                )
                .await
                .map_err(backend("list a requester's proposals"))?;
            rows.iter()
                .map(|r| decode("proposal", r.get::<_, &str>(0)))
                .collect()
        })
    }

    fn gc_proposals(&self, before_ms: i64) -> StoreFuture<'_, usize> {
        Box::pin(async move {
            // Which states are final is the store's rule (`proposal_final`),
            // decided here on the decoded proposals, not in SQL.
            let mut client = self.client().await?;
            let txn = client.transaction().await.map_err(backend("begin"))?;
            relaxed(&txn, false).await?;
            let rows = txn
                .query(
                    "SELECT id, proposal FROM proposals WHERE updated_ms < $1 FOR UPDATE",
                    &[&before_ms],
                )
                .await
                .map_err(backend("list proposals"))?;
            let mut gone = 0;
            for r in &rows {
                let p: Proposal = decode("proposal", r.get::<_, &str>(1))?;
                if proposal_final(&p) {
                    gone += txn
                        .execute(
                            "DELETE FROM proposals WHERE id = $1",
                            &[&r.get::<_, &str>(0)],
                        )
                        .await
                        .map_err(backend("forget a proposal"))?;
                }
            }
            txn.commit().await.map_err(backend("commit"))?;
            Ok(usize::try_from(gone).unwrap_or(usize::MAX))
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
                from: state_name(from),
                to: state_name(to.state),
                expires_ms: to.expires_ms,
                record: encode("record", &to)?,
                outbox: outbox.map(|(id, text)| (i64::try_from(id).unwrap_or(i64::MAX), text)),
                notices,
            };
            // A notification is queued durably with what it announces.
            if needs_durability(from, to.state) || told {
                self.flushed.write(op).await
            } else {
                self.relaxed.write(op).await
            }
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
            done.await.map_err(|e| StoreError::Backend {
                op: "clear the outbox",
                reason: e.to_string(),
            })?
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
