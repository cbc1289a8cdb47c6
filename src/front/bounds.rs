//! What one request may hold of the gateway, on every route: its body
//! arrives whole within `gateway.body_read_timeout` of the request's start
//! and is at most `limits.max_body_bytes`; and the review console's routes,
//! which answer people before they sign in, share at most
//! `limits.max_console_requests` requests in flight.
//!
//! Without these, 1,030 slow uploads to the console's sign-in, sent by
//! nobody signed in, held `limits.max_connections` and every agent was
//! answered 503 for as long as they trickled. Now a slow upload is cut at
//! the deadline, and the console's requests past their budget are answered
//! 503 at once and their connections closed: the rest of the connections
//! stay for `/mcp`.
//!
//! The deadline is one timer from the request's start. `tower-http`'s
//! `RequestBodyTimeoutLayer` was the first choice, but its timer restarts at
//! every frame: a body trickled a byte at a time, each just inside the
//! timeout, is never cut (the test below shows it). Handlers that answer a
//! late body in their own shape (`/mcp` as JSON-RPC, the control API as a
//! problem) recognise [`BodyDeadline`] with [`is_deadline`]; any other
//! handler's answer to a late body is replaced by a plain 408 here.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body::{Frame, SizeHint};

use super::gateway::Gateway;

/// The error a body gives once its deadline has passed.
#[derive(Debug)]
pub(crate) struct BodyDeadline(pub(crate) Duration);

impl std::fmt::Display for BodyDeadline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request body did not arrive within gateway.body_read_timeout ({})",
            humantime::format_duration(self.0)
        )
    }
}

impl std::error::Error for BodyDeadline {}

/// Whether `e` (or what caused it) is a body's deadline passing.
pub(crate) fn is_deadline(e: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(e), |e| e.source()).any(|e| e.is::<BodyDeadline>())
}

/// A body that fails with [`BodyDeadline`] when it has not ended by its
/// deadline, however steadily its bytes trickle.
struct Deadline {
    body: Body,
    sleep: Pin<Box<tokio::time::Sleep>>,
    within: Duration,
    passed: Arc<AtomicBool>,
}

impl http_body::Body for Deadline {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if self.sleep.as_mut().poll(cx).is_ready() {
            self.passed.store(true, Ordering::Relaxed);
            return Poll::Ready(Some(Err(BodyDeadline(self.within).into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The bounds every request is held to.
pub(crate) struct Bounds {
    gw: Arc<Gateway>,
    /// Permits for console requests in flight.
    console: Arc<tokio::sync::Semaphore>,
}

impl Bounds {
    pub(crate) fn new(gw: Arc<Gateway>) -> Arc<Bounds> {
        let console = Arc::new(tokio::sync::Semaphore::new(
            gw.config().limits.console_requests(),
        ));
        Arc::new(Bounds { gw, console })
    }
}

/// The console's routes: served before anyone signs in.
fn is_console(path: &str) -> bool {
    path == "/review" || path.starts_with("/review/")
}

/// The middleware: the console's budget, then the body's deadline and size.
pub(crate) async fn bound(State(b): State<Arc<Bounds>>, req: Request, next: Next) -> Response {
    let _permit = if is_console(req.uri().path()) {
        match b.console.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => {
                b.gw.refused(
                    "console_busy",
                    None,
                    "limits.max_console_requests console requests are in flight",
                );
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [
                        (header::CONNECTION, "close"),
                        (header::RETRY_AFTER, "1"),
                    ],
                    "the review console is busy (limits.max_console_requests requests in flight); retry in a moment\n",
                )
                    .into_response();
            }
        }
    } else {
        None
    };
    let config = b.gw.config();
    let within = config.gateway.body_read_timeout;
    let passed = Arc::new(AtomicBool::new(false));
    let (parts, body) = req.into_parts();
    let body = Deadline {
        body: Body::new(http_body_util::Limited::new(
            body,
            config.limits.max_body_bytes,
        )),
        sleep: Box::pin(tokio::time::sleep(within)),
        within,
        passed: passed.clone(),
    };
    let response = next.run(Request::from_parts(parts, Body::new(body))).await;
    if !passed.load(Ordering::Relaxed) {
        return response;
    }
    b.gw.refused(
        "body_timeout",
        None,
        "the request body did not arrive in time",
    );
    if response.status() != StatusCode::REQUEST_TIMEOUT {
        // A handler that did not say so itself (an extractor's 400).
        return (
            StatusCode::REQUEST_TIMEOUT,
            [(header::CONNECTION, "close")],
            format!("{}: nothing was done\n", BodyDeadline(within)),
        )
            .into_response();
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use http_body_util::BodyExt;

    /// A body of `n` one-byte frames, one every `every`.
    fn trickle(n: usize, every: Duration) -> Body {
        Body::from_stream(futures_util::stream::iter(0..n).then(move |_| async move {
            tokio::time::sleep(every).await;
            Ok::<_, std::io::Error>(Bytes::from_static(b"x"))
        }))
    }

    /// Why not `tower-http`: its body timeout restarts at every frame, so
    /// ten frames 0.9 s apart pass a 1 s timeout though the body took 9 s.
    #[tokio::test(start_paused = true)]
    async fn tower_http_lets_a_trickled_body_run_past_its_timeout() {
        let body = tower_http::timeout::TimeoutBody::new(
            Duration::from_secs(1),
            trickle(10, Duration::from_millis(900)),
        );
        let start = tokio::time::Instant::now();
        let read = body.collect().await;
        assert!(read.is_ok(), "tower-http cut it");
        assert!(start.elapsed() >= Duration::from_secs(9));
    }

    /// The deadline here is one timer: the same body is cut at 1 s.
    #[tokio::test(start_paused = true)]
    async fn a_trickled_body_is_cut_at_its_deadline() {
        let passed = Arc::new(AtomicBool::new(false));
        let body = Deadline {
            body: trickle(10, Duration::from_millis(900)),
            sleep: Box::pin(tokio::time::sleep(Duration::from_secs(1))),
            within: Duration::from_secs(1),
            passed: passed.clone(),
        };
        let start = tokio::time::Instant::now();
        let e = body.collect().await.expect_err("cut");
        assert!(is_deadline(&*e), "{e}");
        assert!(passed.load(Ordering::Relaxed));
        assert!(start.elapsed() < Duration::from_secs(2));
        // A body that ends in time passes whole.
        let body = Deadline {
            body: trickle(3, Duration::from_millis(100)),
            sleep: Box::pin(tokio::time::sleep(Duration::from_secs(1))),
            within: Duration::from_secs(1),
            passed: Arc::new(AtomicBool::new(false)),
        };
        assert_eq!(body.collect().await.unwrap().to_bytes().as_ref(), b"xxx");
    }
}
