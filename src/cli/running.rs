//! The gateway's life: [`Gateway::start`] opens the store and recovers it,
//! loads the policies, opens the audit log, spawns every background task
//! (sweeps, reloads, the task runner, notifications, the witness) into one
//! set under one cancellation token, and listens; [`Running::shutdown`]
//! stops it in order: stop accepting and drain the held calls, give the
//! requests in flight `gateway.shutdown_grace`, stop the background tasks
//! and wait for each, keep the decision inputs, close the upstream
//! connections, flush the audit log (its shutdown checkpoint signs
//! everything recorded before it), and last let go of the store (redb folds
//! its journal into the database then). `countersign serve` and the tests
//! run the gateway through this one type.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::listen;
use super::watch::{fingerprint, follow_store, load_shadow, watch_policies, watch_shadow};
use crate::audit::log::AuditLog;
use crate::core::config::Config;
use crate::front::gateway::Gateway;
use crate::front::http::router;
use crate::front::review::Console;
use crate::store::Store;

/// How often idle sessions, ledger retention and approval expiry are swept
/// (more often when `session_idle_timeout` is short, so a session never
/// outlives it by more than half).
const SWEEP_EVERY: Duration = Duration::from_secs(10);

fn sweep_every(idle_timeout: Duration) -> Duration {
    (idle_timeout / 2).clamp(Duration::from_millis(100), SWEEP_EVERY)
}

/// The background tasks of a running gateway: each runs until the token
/// is cancelled (or ends on its own), in one `JoinSet` that shutdown
/// waits on.
#[derive(Default)]
struct Background {
    tasks: JoinSet<()>,
    stop: CancellationToken,
    names: Vec<&'static str>,
}

impl Background {
    /// Run `task` until it ends or the gateway stops.
    fn spawn(
        &mut self,
        name: &'static str,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let stop = self.stop.clone();
        self.names.push(name);
        self.tasks.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = task => {}
            }
        });
    }

    /// Cancel every task and wait for each to end; returns how many ended
    /// and the panics among them (each logged).
    async fn stop(mut self) -> (usize, Vec<String>) {
        self.stop.cancel();
        let mut ended = 0;
        let mut panicked = Vec::new();
        while let Some(done) = self.tasks.join_next().await {
            ended += 1;
            if let Err(e) = done {
                if e.is_panic() {
                    tracing::error!("a background task panicked: {e}");
                    panicked.push(e.to_string());
                }
            }
        }
        (ended, panicked)
    }
}

/// A gateway that serves: what [`Gateway::start`] returns.
pub struct Running {
    gw: Arc<Gateway>,
    audit: Arc<AuditLog>,
    local: SocketAddr,
    background: Background,
    server: tokio::task::JoinHandle<()>,
    stop_accepting: tokio::sync::oneshot::Sender<()>,
    threads: Arc<listen::Threads>,
}

/// How a shutdown went.
#[derive(Debug)]
pub struct Stopped {
    /// The background tasks that were running, by name.
    pub background: Vec<&'static str>,
    /// How many of them ended (all of them, unless one could not be
    /// joined).
    pub ended: usize,
    /// The panics among them.
    pub panicked: Vec<String>,
    /// Whether requests were still open when the grace ran out.
    pub cut_short: bool,
    /// Whether this was the last holder of the store (then it is closed:
    /// on redb, its journal folded into the database).
    pub store_closed: bool,
}

/// [`Gateway::start`], for callers outside the crate (the tests).
pub async fn start(config: Config) -> anyhow::Result<Running> {
    Gateway::start(config).await
}

/// [`start`] with `serving` threads for the connections instead of one per
/// CPU (one: the connections are served on the runtime this runs on).
pub async fn start_serving(config: Config, serving: usize) -> anyhow::Result<Running> {
    Gateway::start_with(config, Some(serving)).await
}

impl Gateway {
    /// Start a gateway from a loaded config: everything `countersign
    /// serve` does before it waits for a signal. The listener is bound
    /// when this returns.
    pub(crate) async fn start(config: Config) -> anyhow::Result<Running> {
        Gateway::start_with(config, None).await
    }

    /// [`Gateway::start`] with `serving` threads (`None`: as many as the
    /// CPUs the process may use now, or `TOKIO_WORKER_THREADS`).
    async fn start_with(config: Config, serving: Option<usize>) -> anyhow::Result<Running> {
        let addr = config.gateway.listen;
        if !addr.ip().is_loopback() {
            tracing::warn!(%addr, "listening on a non-loopback address: every client must present a bearer token, and TLS belongs in front of this port");
        }
        let store = open_store(&config).await?;
        let policy_dir = config.gateway.policies.clone();
        let policies = load_policies(&config)?;
        let audit = open_audit(&config, &store).await?;
        // Changes another gateway made in a shared store (PostgreSQL): proposals
        // it created or decided are shown here too, and wake calls held here.
        let store_events = store.subscribe();
        let lock = crate::cli::files::load_tool_lock(&policy_dir)?;
        let gw = Gateway::new(config, store, policies, Some(audit.clone()));
        gw.pipeline().catalog().set_lock(lock);
        // Identity providers' keys before the first request: a provider that
        // cannot be reached now is asked again on its first token.
        gw.auth().load().await;
        let pins = gw.pipeline().load_pins().await.context("tool pins")?;
        tracing::info!(
            first_use = pins,
            locked = gw
                .pipeline()
                .catalog()
                .lock()
                .servers
                .values()
                .map(std::collections::BTreeMap::len)
                .sum::<usize>(),
            "tool pins loaded"
        );
        // Every background task, in one set under one cancellation: shutdown
        // stops them together and waits for each to end.
        let mut background = Background::default();
        spawn_background(&gw, &audit, policy_dir, store_events, &mut background)?;
        // TLS on the listener, when configured: the pair must load now, and is
        // taken again whenever the files change.
        let tls = match (&gw.config().gateway.tls_cert, &gw.config().gateway.tls_key) {
            (Some(cert), Some(key)) => {
                let certs = crate::front::tls::Reloading::open(cert, key)?;
                let config = certs.server_config()?;
                background.spawn(
                    "certificate reload",
                    certs.watch(Duration::from_millis(500)),
                );
                Some(tokio_rustls::TlsAcceptor::from(config))
            }
            _ => None,
        };
        let listener = TcpListener::bind(addr).await.with_context(|| {
            format!("cannot listen on {addr} (gateway.listen): is another process using it?")
        })?;
        let local = listener.local_addr()?;
        gw.auth().listening_on(local, tls.is_some());
        let console = if gw.config().review.enabled {
            // A WebAuthn relying party is a domain: an IP-address origin is
            // refused here, with what to set instead.
            let (origin, rp_id) =
                crate::core::config::console_of(gw.config(), local, tls.is_some())
                    .map_err(anyhow::Error::msg)?;
            tracing::info!(%origin, rp_id = %rp_id, "review console at {origin}/review/");
            Some(Console::open(Arc::clone(&gw), origin, rp_id))
        } else {
            None
        };
        if tls.is_some() {
            tracing::info!(%local, "the listener speaks TLS (https://)");
        }
        tracing::info!(servers = gw.config().servers.len(), "gateway ready");

        spawn_sweep(&gw, console.clone(), &mut background);

        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        // As many serving threads as the CPUs the process may use now (or
        // `TOKIO_WORKER_THREADS`, as for the main runtime).
        let serving = serving.unwrap_or_else(|| {
            std::env::var("TOKIO_WORKER_THREADS")
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        });
        let threads = Arc::new(listen::Threads::start(serving)?);
        let server = tokio::spawn(listen::accept(
            listener,
            crate::front::bounds::Bounds::new(Arc::clone(&gw), router(Arc::clone(&gw), console)),
            gw.config().gateway.header_read_timeout,
            gw.config().limits.max_connections,
            tls,
            stop_rx,
            threads.clone(),
        ));
        Ok(Running {
            gw,
            audit,
            local,
            background,
            server,
            stop_accepting: stop_tx,
            threads,
        })
    }
}

impl Running {
    /// Where the gateway listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Stop, in order (see the module documentation).
    pub async fn shutdown(self) -> Stopped {
        let Running {
            gw,
            audit,
            local: _,
            background,
            mut server,
            stop_accepting,
            threads,
        } = self;
        let grace = gw.config().gateway.shutdown_grace;
        // No new connections; held calls answer now (approval_pending,
        // nothing ran) while their connections are still open.
        let _ = stop_accepting.send(());
        gw.pipeline().drain();
        // Open SSE streams never end on their own: bound the drain.
        let cut_short = tokio::time::timeout(grace, &mut server).await.is_err();
        if cut_short {
            server.abort();
            let _ = server.await;
        }
        // A task mid-run stays claimed: the next start (or another gateway,
        // after tasks.claim_timeout) takes it over through the ledger.
        let names = background.names.clone();
        let (ended, panicked) = background.stop().await;
        // The decision inputs recorded so far are kept.
        gw.pipeline().flush_inputs().await;
        // Connections still open after the grace (SSE streams) end here.
        if let Ok(threads) = Arc::try_unwrap(threads) {
            let _ = tokio::task::spawn_blocking(move || threads.stop()).await;
        }
        gw.shutdown().await;
        // The shutdown checkpoint signs everything recorded above; the
        // audit writer clears the store's outbox, so the store is still open.
        audit.close();
        let store: Arc<dyn Store> = gw.pipeline().store().clone();
        drop(gw);
        drop(audit);
        let store_closed = Arc::strong_count(&store) == 1;
        // The last holder closes the store (redb: a final checkpoint) on a
        // blocking thread: its writer thread is joined.
        let _ = tokio::task::spawn_blocking(move || drop(store)).await;
        tracing::info!("stopped");
        Stopped {
            background: names,
            ended,
            panicked,
            cut_short,
            store_closed,
        }
    }
}

/// Open the store and recover it before serving: what was reserved never
/// went out; what was dispatched when the last process died has an unknown
/// outcome (and the webhooks are told, durably, before the first call).
/// Every upstream credential resolves first, or the gateway does not start.
async fn open_store(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
    // Every upstream credential resolves now, or the gateway does not start.
    crate::upstream::credentials::check_all(config).map_err(anyhow::Error::msg)?;
    crate::upstream::tls::check_all(config)?;
    let (store, opened) = crate::cli::store::open(config).await?;
    tracing::info!("ledger store: {opened}");
    // Before serving: what was reserved never went out; what was dispatched
    // when the last process died has an unknown outcome.
    let recovery = store.recover().await?;
    if recovery.unknown > 0 || recovery.freed > 0 {
        tracing::warn!(
        freed = recovery.freed,
        unknown = recovery.unknown,
        "ledger recovered after an unclean stop: calls in flight are now `unknown` until reconciled"
    );
    }
    if recovery.unknown > 0 && !config.notify.webhooks.is_empty() {
        // Queued before serving, durably: the delivery worker sends it.
        let mut facts = serde_json::Map::new();
        facts.insert("count".into(), serde_json::json!(recovery.unknown));
        facts.insert(
            "reason".into(),
            serde_json::json!("the gateway stopped uncleanly while they were in flight"),
        );
        facts.insert(
            "command".into(),
            serde_json::json!("countersign reconcile --list"),
        );
        let notices = crate::core::notify::Event::incident(
            crate::core::config::EventKind::OutcomeUnknown,
            None,
            facts,
        )
        .notices(&config.notify.webhooks, crate::core::time::now_ms());
        if let Err(e) = store.notices_enqueue(notices).await {
            tracing::error!("the notification of the recovered calls was not queued: {e}");
        }
    }
    Ok(store)
}

/// The policies in force at the start: they must load, or the gateway does
/// not start (the error names each problem and the command that checks).
fn load_policies(config: &Config) -> anyhow::Result<crate::core::decision::Policies> {
    let policy_dir = config.gateway.policies.clone();
    let reviewers_file = config.approvals.reviewers.clone();
    let policies = crate::cli::files::load_policies(&policy_dir, reviewers_file.as_deref()).map_err(|errors| {
    anyhow::anyhow!(
        "the policies in `{}` do not load (fix them, or check with `countersign policy check --dir {}`):\n{}",
        policy_dir.display(),
        policy_dir.display(),
        errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")
    )
})?;
    tracing::info!(policies = policies.len(), dir = %policy_dir.display(), "policies loaded");
    Ok(policies)
}

/// The audit log, open before anything can happen that it must record,
/// with the entries a crash left in the ledger's outbox written first.
async fn open_audit(config: &Config, store: &Arc<dyn Store>) -> anyhow::Result<Arc<AuditLog>> {
    // The audit log before anything can happen that it must record.
    let audit_dir = config.audit_dir();
    let audit = Arc::new(crate::audit::log::AuditLog::open(
        crate::audit::log::Settings::from_config(config)
            .with_gateway(crate::cli::store::gateway_id(&config.gateway.data_dir)?),
    )?);
    tracing::info!(dir = %audit_dir.display(), key = %audit.public_key, "audit log open");
    // Entries a crash left in the ledger's outbox go into the log first.
    let recovered = audit
        .attach_outbox(store.clone())
        .await
        .context("audit log recovery from the ledger's outbox")?;
    if recovered > 0 {
        tracing::warn!(
            entries = recovered,
            "audit entries recovered from the ledger's outbox"
        );
    }
    Ok(audit)
}

/// The background tasks of a gateway that serves (all but the sweep, which
/// needs the console): the witness, notifications, policy and shadow
/// reloads, a shared store's changes, the task runner; and what is only
/// said once (decision inputs kept, data files others can read).
fn spawn_background(
    gw: &Arc<Gateway>,
    audit: &Arc<AuditLog>,
    policy_dir: std::path::PathBuf,
    store_events: Option<tokio::sync::broadcast::Receiver<crate::store::StoreEvent>>,
    background: &mut Background,
) -> anyhow::Result<()> {
    // Each checkpoint to the witness, when one is configured.
    if let Some(w) = gw.config().audit.witness.clone() {
        let key = crate::audit::note::parse_vkey(&w.key).context("audit.witness.key")?;
        anyhow::ensure!(
        key.kind == 0x04,
        "audit.witness.key is a note key (type 0x01); a witness cosigns with a cosignature key (type 0x04)"
    );
        tracing::info!(url = %w.url, witness = %key.name, "checkpoints go to the witness");
        background.spawn(
            "witness",
            crate::upstream::witness::run(audit.clone(), w, key),
        );
    }
    // Reviewer notifications: delivered by a worker of their own, never on
    // a call's path.
    if !gw.config().notify.webhooks.is_empty() {
        let worker = crate::upstream::notify::Deliverer::new(
            gw.pipeline().store().clone(),
            &gw.config().notify,
            Some(audit.clone()),
            Arc::new(crate::core::time::SystemClock),
        );
        tracing::info!(
            webhooks = gw.config().notify.webhooks.len(),
            "notifications go to the webhooks"
        );
        background.spawn("notifications", worker.run(gw.pipeline().book().queued()));
    }
    background.spawn("policy reload", watch_policies(Arc::clone(gw), policy_dir));
    if gw.config().policy.inputs {
        gw.pipeline()
            .start_inputs(Arc::new(crate::core::time::SystemClock));
        tracing::info!(
            retention = %humantime::format_duration(gw.config().policy.inputs_retention),
            max_rows = gw.config().policy.inputs_max_rows,
            "decision inputs are kept for policy diff"
        );
    }
    // The shadow set: loaded now if it loads, and watched like the set in
    // force. It never stops the gateway.
    if let Some(dir) = gw.config().policy.shadow.clone() {
        let seen = fingerprint(&dir, None);
        load_shadow(gw, &dir);
        background.spawn("shadow reload", watch_shadow(Arc::clone(gw), dir, seen));
    }
    // The data dir holds arguments and keys: say so when others can read it
    // (files made by an older release, or by hand).
    let exposed = crate::store::private::exposed(&gw.config().gateway.data_dir);
    if let Some(first) = exposed.first() {
        tracing::warn!(
            count = exposed.len(),
            first = %first.display(),
            "data files or folders are readable by other users of this host: chmod 600 the files and 700 the folders (new ones are made so)"
        );
    }
    if let Some(rx) = store_events {
        background.spawn("store changes", follow_store(Arc::clone(gw), rx));
    }
    // Held calls as tasks: approved ones are run here (or on any other
    // gateway sharing the store), whether or not their client is connected.
    background.spawn("tasks", crate::front::task_runner::run(Arc::clone(gw)));
    Ok(())
}

/// The sweep, every few seconds: idle sessions, the console's state,
/// ledger and guards retention, and approval expiry.
fn spawn_sweep(gw: &Arc<Gateway>, console: Option<Arc<Console>>, background: &mut Background) {
    let gw = Arc::clone(gw);
    background.spawn("sweep", async move {
        let mut tick = tokio::time::interval(sweep_every(gw.config().gateway.session_idle_timeout));
        loop {
            tick.tick().await;
            gw.sweep_idle().await;
            if let Some(c) = &console {
                crate::front::review::enrol::note_invites(c).await;
                // Ended sessions, challenges, counts and invitations.
                let now = c.now_ms();
                match gw.pipeline().store().console_gc(now).await {
                    Ok(0) => {}
                    Ok(n) => tracing::debug!(forgotten = n, "review console sweep"),
                    Err(e) => tracing::warn!("review console sweep failed: {e}"),
                }
            }
            let now = time::OffsetDateTime::now_utc().unix_timestamp() * 1000;
            match gw.pipeline().store().gc(now).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(forgotten = n, "ledger retention sweep"),
                Err(e) => tracing::warn!("ledger retention sweep failed: {e}"),
            }
            // Budgets' spending and effects whose window ended.
            match gw.pipeline().store().guards_gc(now).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(forgotten = n, "guards sweep"),
                Err(e) => tracing::warn!("guards sweep failed: {e}"),
            }
            // Expiry is also checked at consumption; the sweep keeps
            // reviewers' lists honest and forgets old final proposals.
            match gw
                .pipeline()
                .book()
                .sweep(gw.config().idempotency.retention)
                .await
            {
                Ok(0) => {}
                Ok(n) => tracing::info!(expired = n, "approval expiry sweep"),
                Err(e) => tracing::warn!("approval expiry sweep failed: {e}"),
            }
        }
    });
}
