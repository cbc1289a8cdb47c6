//! The listener and the threads client connections are served on: one
//! connection per client, bounded in number, with a header read timeout,
//! TLS when configured, and a graceful end when the gateway stops
//! accepting.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;

/// Serve HTTP/1.1 connections until `stop` fires, then let the open ones
/// finish (the caller bounds that with the shutdown grace).
///
/// A connection of its own per client, with a header read timeout: hyper
/// closes a connection whose request header is not complete within
/// `header_timeout`, so a client trickling bytes cannot hold it open.
pub(super) async fn accept(
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
        // the connection's token memo spares hashing the same bearer token
        // on each request; every request is held to the bounds
        // (`front::bounds`).
        let memo = Arc::new(crate::front::auth::TokenMemo::default());
        let service =
            hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                crate::front::http::serve(app.clone(), req, peer, memo.clone())
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
///
/// With one CPU there is no thread of its own: connections are served on
/// the main runtime, beside the store's writers. A serving thread would only
/// add hops there: every write waits for the store's grouped statements,
/// whose writers run on the main runtime, so each grouped statement a write
/// joins would cross between the two threads and back. Four gateways on one
/// shared CPU with PostgreSQL made about a tenth more writes per second so
/// (docs/performance.md, "Fewer commits per write").
pub(crate) struct Threads {
    handles: Vec<tokio::runtime::Handle>,
    next: std::sync::atomic::AtomicUsize,
    stop: Vec<tokio::sync::oneshot::Sender<()>>,
    joins: Vec<std::thread::JoinHandle<()>>,
    /// Served on the main runtime: its connections, to end at the stop as a
    /// thread's runtime ends its own.
    on_main: Option<parking_lot::Mutex<tokio::task::JoinSet<()>>>,
}

impl Threads {
    /// `n` serving threads; for one (or none), the main runtime, which
    /// must be the runtime this is called on.
    pub(crate) fn start(n: usize) -> anyhow::Result<Threads> {
        let mut t = Threads {
            handles: Vec::new(),
            next: std::sync::atomic::AtomicUsize::new(0),
            stop: Vec::new(),
            joins: Vec::new(),
            on_main: None,
        };
        if n <= 1 {
            t.handles.push(tokio::runtime::Handle::current());
            t.on_main = Some(parking_lot::Mutex::new(tokio::task::JoinSet::new()));
            return Ok(t);
        }
        for i in 0..n {
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
        if let Some(tasks) = &self.on_main {
            let mut tasks = tasks.lock();
            // The ended connections are let go of as new ones come.
            while tasks.try_join_next().is_some() {}
            tasks.spawn_on(fut, &self.handles[i]);
            return;
        }
        self.handles[i].spawn(fut);
    }

    /// Stop every thread: connections still open are dropped. Called on a
    /// blocking thread of the main runtime (it waits for the connections
    /// served there to end).
    pub(crate) fn stop(self) {
        if let (Some(tasks), Some(main)) = (self.on_main, self.handles.first()) {
            let mut tasks = tasks.into_inner();
            tasks.abort_all();
            main.block_on(async move { while tasks.join_next().await.is_some() {} });
        }
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
