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
//! The accept loop (`cli::serve`) hands every request to
//! `front::http::serve`, which gives a tool call's `POST` to its handler
//! with its body held by [`Bounds::timed_body`], and every other request to
//! [`serve`]. The deadline is one timer from the request's start. `tower-http`'s
//! `RequestBodyTimeoutLayer` was the first choice, but its timer restarts at
//! every frame: a body trickled a byte at a time, each just inside the
//! timeout, is never cut (the test below shows it). Handlers that answer a
//! late body in their own shape (`/mcp` as JSON-RPC, the control API as a
//! problem) recognise [`BodyDeadline`] with [`is_deadline`]; the console's
//! answer to a late body is replaced by a plain 408 here.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
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
/// deadline, however steadily its bytes trickle. The timer is made only
/// when the body first makes its reader wait: a body that came whole with
/// its header (most `/mcp` requests) costs no timer.
pub(crate) struct Deadline<B> {
    body: B,
    deadline: tokio::time::Instant,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    within: Duration,
    /// Set when the deadline passed (the console's requests: their
    /// handlers do not say so themselves).
    passed: Option<Arc<AtomicBool>>,
}

impl<B> Deadline<B> {
    fn new(body: B, within: Duration, passed: Option<Arc<AtomicBool>>) -> Deadline<B> {
        Deadline {
            body,
            deadline: tokio::time::Instant::now() + within,
            sleep: None,
            within,
            passed,
        }
    }
}

impl<B> http_body::Body for Deadline<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let deadline = self.deadline;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.as_mut().poll(cx).is_ready() {
            if let Some(p) = &self.passed {
                p.store(true, Ordering::Relaxed);
            }
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

/// The gateway's routes, and the bounds every request to them is held to.
pub(crate) struct Bounds {
    app: axum::Router,
    gw: Arc<Gateway>,
    /// Permits for console requests in flight.
    console: Arc<tokio::sync::Semaphore>,
}

impl Bounds {
    pub(crate) fn new(gw: Arc<Gateway>, app: axum::Router) -> Arc<Bounds> {
        let console = Arc::new(tokio::sync::Semaphore::new(
            gw.config().limits.console_requests(),
        ));
        Arc::new(Bounds { app, gw, console })
    }
}

/// The console's routes: served before anyone signs in.
impl Bounds {
    /// The gateway the routes serve.
    pub(crate) fn gateway(&self) -> &Arc<Gateway> {
        &self.gw
    }

    /// A request body held to `gateway.body_read_timeout` from now, as
    /// [`serve`] holds every routed body.
    pub(crate) fn timed_body<B>(&self, body: B) -> Body
    where
        B: http_body::Body<Data = Bytes> + Unpin + Send + 'static,
        B::Error: Into<axum::BoxError>,
    {
        Body::new(Deadline::new(
            body,
            self.gw.config().gateway.body_read_timeout,
            None,
        ))
    }
}

fn is_console(path: &str) -> bool {
    path == "/review" || path.starts_with("/review/")
}

/// Serve `req` with the routes under the bounds: the console's budget, then the
/// body's deadline (every route) and size (the console's; `/mcp` and the
/// control API read theirs with `limits.max_body_bytes` themselves, and say
/// a late body in their own shape).
pub(crate) async fn serve<B>(
    b: Arc<Bounds>,
    req: http::Request<B>,
) -> Result<Response, std::convert::Infallible>
where
    B: http_body::Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    let within = b.gw.config().gateway.body_read_timeout;
    if !is_console(req.uri().path()) {
        let req = req.map(|body| b.timed_body(body));
        return tower::ServiceExt::oneshot(b.app.clone(), req).await;
    }
    let Ok(_permit) = b.console.clone().try_acquire_owned() else {
        b.gw.refused(
            "console_busy",
            None,
            "limits.max_console_requests console requests are in flight",
        );
        return Ok((
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONNECTION, "close"), (header::RETRY_AFTER, "1")],
            "the review console is busy (limits.max_console_requests requests in flight); retry in a moment\n",
        )
            .into_response());
    };
    let passed = Arc::new(AtomicBool::new(false));
    let limit = b.gw.config().limits.max_body_bytes;
    let req = req.map(|body| {
        Body::new(Deadline::new(
            http_body_util::Limited::new(body, limit),
            within,
            Some(passed.clone()),
        ))
    });
    let response = tower::ServiceExt::oneshot(b.app.clone(), req).await?;
    if !passed.load(Ordering::Relaxed) {
        return Ok(response);
    }
    // The console's handlers answer a late body as a bad one: say what it is.
    b.gw.refused(
        "body_timeout",
        None,
        "the request body did not arrive in time",
    );
    Ok((
        StatusCode::REQUEST_TIMEOUT,
        [(header::CONNECTION, "close")],
        format!("{}: nothing was done\n", BodyDeadline(within)),
    )
        .into_response())
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
        let body = Deadline::new(
            trickle(10, Duration::from_millis(900)),
            Duration::from_secs(1),
            Some(passed.clone()),
        );
        let start = tokio::time::Instant::now();
        let e = body.collect().await.expect_err("cut");
        assert!(is_deadline(&*e), "{e}");
        assert!(passed.load(Ordering::Relaxed));
        assert!(start.elapsed() < Duration::from_secs(2));
        // A body that ends in time passes whole.
        let body = Deadline::new(
            trickle(3, Duration::from_millis(100)),
            Duration::from_secs(1),
            None,
        );
        assert_eq!(body.collect().await.unwrap().to_bytes().as_ref(), b"xxx");
    }
}
