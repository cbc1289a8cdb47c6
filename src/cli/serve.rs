//! `countersign serve`: run the gateway until SIGINT/SIGTERM.
//!
//! Shutdown: stop accepting, give in-flight requests `shutdown_grace` to
//! finish, then shut every upstream down (stdin closed, SIGTERM, SIGKILL).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::core::config::Config;
use crate::front::gateway::Gateway;
use crate::front::http::router;
use crate::front::review::Console;

/// How often idle sessions, ledger retention and approval expiry are swept
/// (more often when `session_idle_timeout` is short, so a session never
/// outlives it by more than half).
const SWEEP_EVERY: Duration = Duration::from_secs(10);

fn sweep_every(idle_timeout: Duration) -> Duration {
    (idle_timeout / 2).clamp(Duration::from_millis(100), SWEEP_EVERY)
}

/// Run the gateway with a loaded config.
pub(crate) async fn serve(config: Config) -> anyhow::Result<()> {
    let addr = config.gateway.listen;
    if !addr.ip().is_loopback() {
        tracing::warn!(%addr, "listening on a non-loopback address: every client must present a bearer token, and TLS belongs in front of this port");
    }
    // Every upstream credential resolves now, or the gateway does not start.
    crate::upstream::credentials::check_all(&config).map_err(|e| anyhow::anyhow!("{e}"))?;
    crate::upstream::tls::check_all(&config).map_err(|e| anyhow::anyhow!("{e}"))?;
    let grace = config.gateway.shutdown_grace;
    let (store, opened) = crate::cli::store::open(&config).await?;
    tracing::info!("ledger store: {opened}");
    // Before serving: what was reserved never went out; what was dispatched
    // when the last process died has an unknown outcome.
    let recovery = store.recover().await.map_err(|e| anyhow::anyhow!("{e}"))?;
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
    // The audit log before anything can happen that it must record.
    let audit_dir = config.audit_dir();
    let audit = Arc::new(
        crate::audit::log::AuditLog::open(
            crate::audit::log::Settings::from_config(&config)
                .with_gateway(crate::cli::store::gateway_id(&config.gateway.data_dir)?),
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?,
    );
    tracing::info!(dir = %audit_dir.display(), key = %audit.public_key, "audit log open");
    // Entries a crash left in the ledger's outbox go into the log first.
    let recovered = audit
        .attach_outbox(store.clone())
        .await
        .map_err(|e| anyhow::anyhow!("audit log recovery from the ledger's outbox: {e}"))?;
    if recovered > 0 {
        tracing::warn!(
            entries = recovered,
            "audit entries recovered from the ledger's outbox"
        );
    }
    // Changes another gateway made in a shared store (PostgreSQL): proposals
    // it created or decided are shown here too, and wake calls held here.
    let store_events = store.subscribe();
    let lock = crate::cli::files::load_tool_lock(&policy_dir)?;
    let gw = Gateway::new(config, store, policies, Some(audit.clone()));
    gw.pipeline().catalog().set_lock(lock);
    // Identity providers' keys before the first request: a provider that
    // cannot be reached now is asked again on its first token.
    gw.auth().load().await;
    let pins = gw
        .pipeline()
        .load_pins()
        .await
        .map_err(|e| anyhow::anyhow!("tool pins: {e}"))?;
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
    // Each checkpoint to the witness, when one is configured.
    if let Some(w) = gw.config().audit.witness.clone() {
        let key = crate::audit::note::parse_vkey(&w.key)
            .map_err(|e| anyhow::anyhow!("audit.witness.key: {e}"))?;
        anyhow::ensure!(
            key.kind == 0x04,
            "audit.witness.key is a note key (type 0x01); a witness cosigns with a cosignature key (type 0x04)"
        );
        tracing::info!(url = %w.url, witness = %key.name, "checkpoints go to the witness");
        tokio::spawn(crate::upstream::witness::run(audit.clone(), w, key));
    }
    // Reviewer notifications: delivered by a worker of their own, never on
    // a call's path.
    let deliverer = (!gw.config().notify.webhooks.is_empty()).then(|| {
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
        tokio::spawn(worker.run(gw.pipeline().book().queued()))
    });
    let reloader = tokio::spawn(watch_policies(Arc::clone(&gw), policy_dir));
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
    let shadow_watcher = gw.config().policy.shadow.clone().map(|dir| {
        let seen = fingerprint(&dir, None);
        load_shadow(&gw, &dir);
        tokio::spawn(watch_shadow(Arc::clone(&gw), dir, seen))
    });
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
    let follower = store_events.map(|rx| tokio::spawn(follow_store(Arc::clone(&gw), rx)));
    // Held calls as tasks: approved ones are run here (or on any other
    // gateway sharing the store), whether or not their client is connected.
    let task_runner = tokio::spawn(crate::front::task_runner::run(Arc::clone(&gw)));
    // TLS on the listener, when configured: the pair must load now, and is
    // taken again whenever the files change.
    let (tls, tls_watcher) = match (&gw.config().gateway.tls_cert, &gw.config().gateway.tls_key) {
        (Some(cert), Some(key)) => {
            let certs = crate::front::tls::Reloading::open(cert, key)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let config = certs.server_config().map_err(|e| anyhow::anyhow!("{e}"))?;
            let watcher = tokio::spawn(certs.watch(Duration::from_millis(500)));
            (Some(tokio_rustls::TlsAcceptor::from(config)), Some(watcher))
        }
        _ => (None, None),
    };
    let listener = TcpListener::bind(addr).await.with_context(|| {
        format!("cannot listen on {addr} (gateway.listen): is another process using it?")
    })?;
    let local = listener.local_addr()?;
    gw.auth().listening_on(local, tls.is_some());
    let console = if gw.config().review.enabled {
        // A WebAuthn relying party is a domain: an IP-address origin is
        // refused here, with what to set instead.
        let (origin, rp_id) = crate::core::config::console_of(gw.config(), local, tls.is_some())
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        tracing::info!(%origin, rp_id = %rp_id, "review console at {origin}/review/");
        Some(Console::open(Arc::clone(&gw), origin, rp_id))
    } else {
        None
    };
    // Tests and scripts wait for this exact line on stderr.
    eprintln!("countersign: listening on {local}");
    if tls.is_some() {
        tracing::info!(%local, "the listener speaks TLS (https://)");
    }
    tracing::info!(servers = gw.config().servers.len(), "gateway ready");

    let sweeper = {
        let gw = Arc::clone(&gw);
        let console = console.clone();
        tokio::spawn(async move {
            let mut tick =
                tokio::time::interval(sweep_every(gw.config().gateway.session_idle_timeout));
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
        })
    };

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    // As many serving threads as the CPUs the process may use now (or
    // `TOKIO_WORKER_THREADS`, as for the main runtime).
    let serving = std::env::var("TOKIO_WORKER_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let threads = Arc::new(Threads::start(serving)?);
    let server = tokio::spawn(accept(
        listener,
        crate::front::bounds::Bounds::new(Arc::clone(&gw), router(Arc::clone(&gw), console)),
        gw.config().gateway.header_read_timeout,
        gw.config().limits.max_connections,
        tls,
        stop_rx,
        threads.clone(),
    ));
    shutdown_signal().await;
    tracing::info!("shutting down");
    // Held calls answer first (approval_pending, nothing ran), while their
    // connections are still open.
    gw.pipeline().drain();
    let _ = stop_tx.send(());
    // Open SSE streams never end on their own: bound the drain.
    let mut server = server;
    if tokio::time::timeout(grace, &mut server).await.is_err() {
        server.abort();
        let _ = server.await;
    }
    sweeper.abort();
    // A task mid-run stays claimed: the next start (or another gateway,
    // after tasks.claim_timeout) takes it over through the ledger.
    task_runner.abort();
    // The decision inputs recorded so far are kept.
    gw.pipeline().flush_inputs().await;
    reloader.abort();
    if let Some(w) = &shadow_watcher {
        w.abort();
    }
    if let Some(d) = deliverer {
        d.abort();
    }
    if let Some(f) = follower {
        f.abort();
    }
    if let Some(w) = tls_watcher {
        w.abort();
    }
    // Connections still open after the grace (SSE streams) end here.
    if let Ok(threads) = Arc::try_unwrap(threads) {
        let _ = tokio::task::spawn_blocking(move || threads.stop()).await;
    }
    gw.shutdown().await;
    // Last: the shutdown checkpoint signs everything recorded above.
    audit.close();
    tracing::info!("stopped");
    Ok(())
}

/// Serve HTTP/1.1 connections until `stop` fires, then let the open ones
/// finish (the caller bounds that with the shutdown grace).
///
/// A connection of its own per client, with a header read timeout: hyper
/// closes a connection whose request header is not complete within
/// `header_timeout`, so a client trickling bytes cannot hold it open.
async fn accept(
    listener: TcpListener,
    app: Arc<crate::front::bounds::Bounds>,
    header_timeout: Duration,
    max_connections: usize,
    tls: Option<tokio_rustls::TlsAcceptor>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
    threads: Arc<Threads>,
) {
    // One permit per open connection: thousands of idle clients cannot use
    // up the process's descriptors and starve the rest.
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections));
    use hyper_util::rt::{TokioIo, TokioTimer};
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .keep_alive(true);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors and the like: back off, go on.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let _ = tcp.set_nodelay(true);
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!(%peer, max_connections, "connection refused: limits.max_connections reached");
            tokio::spawn(refuse_connection(tcp));
            continue;
        };
        let app = app.clone();
        // The peer address lets the control API refuse non-loopback peers;
        // every request is held to the bounds (`front::bounds`).
        let service =
            hyper::service::service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                crate::front::bounds::serve(app.clone(), req)
            });
        let watcher = graceful.watcher();
        let http = http.clone();
        let tls = tls.clone();
        // Off this runtime's reactor, onto the serving thread's.
        let tcp = match tcp.into_std() {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(%peer, "connection dropped: {e}");
                continue;
            }
        };
        threads.spawn(async move {
            let _slot = slot;
            let tcp = match tokio::net::TcpStream::from_std(tcp) {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!(%peer, "connection dropped: {e}");
                    return;
                }
            };
            let ended = match tls {
                None => {
                    watcher
                        .watch(http.serve_connection(TokioIo::new(tcp), service))
                        .await
                }
                Some(acceptor) => {
                    // The handshake gets the header read timeout too: a
                    // client that never finishes it holds no connection.
                    let stream =
                        match tokio::time::timeout(header_timeout, acceptor.accept(tcp)).await {
                            Ok(Ok(s)) => s,
                            Ok(Err(e)) => {
                                tracing::debug!(%peer, "TLS handshake failed: {e}");
                                return;
                            }
                            Err(_) => {
                                tracing::debug!(%peer, "TLS handshake timed out");
                                return;
                            }
                        };
                    watcher
                        .watch(http.serve_connection(TokioIo::new(stream), service))
                        .await
                }
            };
            if let Err(e) = ended {
                tracing::debug!(%peer, "connection ended: {e}");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// The threads client connections are served on: each runs a runtime of its
/// own, and a connection lives on one of them, taken in turn, for its whole
/// life. A call's client socket, its upstream connection (the pool gives a
/// thread its own first) and the work between them are on one thread: no
/// call is handed from one worker to another, which costs two context
/// switches more per call than the floor when there are more workers than
/// CPUs (a gateway confined after it started). Background work (sweeps,
/// reloads, notifications) stays on the main runtime.
pub(crate) struct Threads {
    handles: Vec<tokio::runtime::Handle>,
    next: std::sync::atomic::AtomicUsize,
    stop: Vec<tokio::sync::oneshot::Sender<()>>,
    joins: Vec<std::thread::JoinHandle<()>>,
}

impl Threads {
    /// `n` serving threads (at least one).
    pub(crate) fn start(n: usize) -> anyhow::Result<Threads> {
        let mut t = Threads {
            handles: Vec::new(),
            next: std::sync::atomic::AtomicUsize::new(0),
            stop: Vec::new(),
            joins: Vec::new(),
        };
        for i in 0..n.max(1) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("cannot start a serving thread's runtime")?;
            t.handles.push(rt.handle().clone());
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            t.stop.push(stop);
            let join = std::thread::Builder::new()
                .name(format!("serve-{i}"))
                .spawn(move || {
                    rt.block_on(async {
                        let _ = stopped.await;
                    });
                })
                .context("cannot start a serving thread")?;
            t.joins.push(join);
        }
        Ok(t)
    }

    /// Run `fut` on the next thread.
    fn spawn(&self, fut: impl std::future::Future<Output = ()> + Send + 'static) {
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % self.handles.len();
        self.handles[i].spawn(fut);
    }

    /// Stop every thread: connections still open are dropped.
    pub(crate) fn stop(self) {
        for s in self.stop {
            let _ = s.send(());
        }
        for j in self.joins {
            let _ = j.join();
        }
    }
}

/// Over `limits.max_connections`: a plain 503 that says why, then close
/// (bounded: a peer that does not read gets nothing more).
async fn refuse_connection(mut tcp: tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let body =
        "too many connections: the gateway's limits.max_connections is reached; retry later\n";
    let text = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\nretry-after: 1\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), tcp.write_all(text.as_bytes())).await;
    let _ = tcp.shutdown().await;
}

/// Re-read and publish each proposal another process changed in the shared
/// store: a decision made through another gateway wakes the call held here
/// at once (no polling), and live reviewer views here show it.
async fn follow_store(
    gw: Arc<Gateway>,
    mut events: tokio::sync::broadcast::Receiver<crate::store::StoreEvent>,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match events.recv().await {
            Ok(crate::store::StoreEvent::Proposal(id)) => gw.pipeline().book().changed(&id).await,
            Ok(crate::store::StoreEvent::Task(id)) => gw.tasks().changed(&id),
            Ok(crate::store::StoreEvent::Ledger(_)) => {}
            Err(RecvError::Lagged(n)) => {
                tracing::warn!(missed = n, "store notifications fell behind: a call held here may wait for its hold to end");
            }
            Err(RecvError::Closed) => return,
        }
    }
}

/// The shadow policy folder (`[policy] shadow`): loaded at start and
/// whenever it changes. A set that does not load is logged with file and
/// line and ignored: the previous shadow set (or none) stays, enforcement is
/// untouched, and the gateway never stops for it.
async fn watch_shadow(
    gw: Arc<Gateway>,
    dir: std::path::PathBuf,
    mut seen: Vec<(std::path::PathBuf, u64, Option<std::time::SystemTime>)>,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        let now = fingerprint(&dir, None);
        if now != seen {
            seen = now;
            load_shadow(&gw, &dir);
        }
    }
}

/// Load the shadow set from `dir` and put it in the shadow, or log why not.
fn load_shadow(gw: &Gateway, dir: &std::path::Path) {
    let reviewers = gw.config().approvals.reviewers.clone();
    match crate::cli::files::load_policies(dir, reviewers.as_deref()) {
        Ok(p) => {
            tracing::info!(policies = p.len(), dir = %dir.display(), digest = %p.digest(), "shadow policies loaded (decided beside the policies in force, never enforced)");
            let mut f = serde_json::Map::new();
            f.insert("shadow".into(), true.into());
            f.insert("policies".into(), p.len().into());
            f.insert("policy_set".into(), p.digest().into());
            gw.pipeline().audit("policy_reloaded", f);
            gw.pipeline().set_shadow(Some(p));
        }
        Err(errors) => {
            for e in &errors {
                tracing::error!(
                    "shadow policies in `{}` not loaded, enforcement unchanged: {e}",
                    dir.display()
                );
            }
            let mut f = refused(&errors);
            f.insert("shadow".into(), true.into());
            gw.pipeline().audit("policy_reload_refused", f);
        }
    }
}

/// The fields of a `policy_reload_refused` entry: the errors, each with
/// its file and line.
fn refused(errors: &[impl ToString]) -> serde_json::Map<String, serde_json::Value> {
    let mut f = serde_json::Map::new();
    f.insert(
        "errors".into(),
        errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .into(),
    );
    f
}

/// What the policy folder looks like: its files with sizes and mtimes.
fn fingerprint(
    dir: &std::path::Path,
    reviewers: Option<&std::path::Path>,
) -> Vec<(std::path::PathBuf, u64, Option<std::time::SystemTime>)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            Some((e.path(), meta.len(), meta.modified().ok()))
        })
        .collect();
    if let Some(path) = reviewers {
        let meta = std::fs::metadata(path).ok();
        out.push((
            path.to_owned(),
            meta.as_ref().map_or(0, |m| m.len()),
            meta.and_then(|m| m.modified().ok()),
        ));
    }
    out.sort();
    out
}

/// Hot reload: poll the policy folder; on a change, load it whole. A set that
/// fails to parse or validate is not used: the previous one stays in force
/// and the errors are logged with file and line.
async fn watch_policies(gw: Arc<Gateway>, dir: std::path::PathBuf) {
    let reviewers = gw.config().approvals.reviewers.clone();
    let mut seen = fingerprint(&dir, reviewers.as_deref());
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        let now = fingerprint(&dir, reviewers.as_deref());
        if now == seen {
            continue;
        }
        seen = now;
        // tools.lock is judged on its own: a bad lock keeps the previous
        // pins, whatever the policies do.
        match crate::cli::files::load_tool_lock(&dir) {
            Ok(lock) if lock != *gw.pipeline().catalog().lock() => {
                tracing::info!("tools.lock reloaded");
                gw.pipeline().catalog().set_lock(lock);
                gw.pipeline()
                    .audit("tools_lock_reloaded", serde_json::Map::new());
            }
            Ok(_) => {}
            Err(e) => {
                tracing::error!("tools.lock reload refused, previous pins stay in force: {e}");
                let mut f = serde_json::Map::new();
                f.insert("errors".into(), vec![e.to_string()].into());
                gw.pipeline().audit("policy_reload_refused", f);
            }
        }
        match crate::cli::files::load_policies(&dir, reviewers.as_deref()) {
            Ok(p) => {
                tracing::info!(policies = p.len(), "policies reloaded");
                let mut f = serde_json::Map::new();
                f.insert("policies".into(), p.len().into());
                f.insert("reviewers".into(), p.reviewers().len().into());
                gw.pipeline().audit("policy_reloaded", f);
                gw.pipeline().set_policies(p);
            }
            Err(errors) => {
                for e in &errors {
                    tracing::error!("policy reload refused, previous policies stay in force: {e}");
                }
                gw.pipeline()
                    .audit("policy_reload_refused", refused(&errors));
            }
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
