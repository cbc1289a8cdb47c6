//! The stream machinery of the HTTP front: a relayed request polled inline
//! until its first message, an answer that turns into an SSE stream when a
//! related message comes first, and (in a handshake-era session) resumable
//! streams whose events are kept for `Last-Event-ID`.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body as HttpBody, Bytes};
use axum::http::StatusCode;
use axum::response::Response;
use futures_util::{stream, StreamExt};
use serde_json::Value;
use tokio::sync::mpsc;

use super::mcp::{self, RequestCtx};
use super::respond::{reject, rpc, sse_response};
use crate::enforce::answer::Rejection;
use crate::front::gateway::{Gateway, Session};
use crate::wire::era::Era;
use crate::wire::jsonrpc::{Kind, Message};
use crate::wire::sse::{self, UpstreamEvent};

/// Aborts the relayed call when the client goes away (2026-07-28: closing the
/// response stream is the cancellation).
struct AbortOnDrop(tokio::task::AbortHandle);

/// A call polled inline by the request's handler. Dropped before it ends,
/// it is cancelled, or, when `outlives` (the handshake era), its rest is
/// spawned so that it still runs to the end.
struct Inline {
    fut: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
    outlives: bool,
}

impl Inline {
    fn new(
        fut: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
        outlives: bool,
    ) -> Inline {
        use futures_util::FutureExt;
        // The call's future is large: boxed by the caller where it is made,
        // it is copied once, not once per wrapper.
        // A panic ends the call, not the client's connection: its sender is
        // dropped, and the handler answers that no answer came.
        let fut = std::panic::AssertUnwindSafe(fut).catch_unwind().map(|_| ());
        Inline {
            fut: Some(Box::pin(fut)),
            outlives,
        }
    }

    /// Run the rest in a task of its own.
    fn detach(mut self) -> tokio::task::JoinHandle<()> {
        match self.fut.take() {
            Some(fut) => tokio::spawn(fut),
            None => tokio::spawn(async {}),
        }
    }
}

impl std::future::Future for Inline {
    type Output = ();
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        let Some(fut) = self.fut.as_mut() else {
            return std::task::Poll::Ready(());
        };
        let done = fut.as_mut().poll(cx);
        if done.is_ready() {
            self.fut = None;
        }
        done
    }
}

impl Drop for Inline {
    fn drop(&mut self) {
        if let (Some(fut), true) = (self.fut.take(), self.outlives) {
            tokio::spawn(fut);
        }
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A handshake-era session whose SSE streams are resumable (2025-11-25):
/// events carry ids, are kept in the session, and a GET with
/// `Last-Event-ID` replays the ones after it.
pub(super) struct Resumable(pub(super) Arc<Session>);

/// Relay one request. The answer is plain JSON when the upstream sends
/// nothing before it; as soon as a related message (progress, a server
/// request) comes first, the answer becomes an SSE stream. In a session the
/// stream is resumable: a client whose connection breaks gets the rest,
/// the answer included, with a GET and `Last-Event-ID`.
pub(super) async fn relay_request(
    gw: &Arc<Gateway>,
    rc: RequestCtx,
    msg: Message,
    sse: bool,
    resumable: Option<Resumable>,
) -> Response {
    let (tx, mut rx) = mpsc::channel::<UpstreamEvent>(64);
    let events = sse.then(|| tx.clone());
    let poll_after = gw.config().gateway.sse_poll_after;
    let era = rc.era;
    let gw = gw.clone();
    // Run here, in the connection's own task, until the first message: a
    // plain answer then costs no task of its own and no wake-up of another
    // worker thread. In the handshake era a client that disconnects does not
    // cancel the call (it may resume through the session), so dropping this
    // handler moves the rest of the call into a task of its own.
    let mut call = Inline::new(
        Box::pin(async move {
            let final_answer = mcp::answer(&gw, &rc, msg, events).await;
            let _ = tx.send(UpstreamEvent::Message(final_answer)).await;
        }),
        era != Era::Modern,
    );
    // The upstream's word that it answers as a stream makes this answer a
    // stream too. The stream opens then, before the first message; and when
    // the upstream already closed its stream early, the client's is cut at
    // the same point.
    let mut cut_early = false;
    let first = loop {
        let m = tokio::select! {
            biased;
            m = rx.recv() => m,
            () = &mut call => rx.recv().await,
        };
        match m {
            Some(UpstreamEvent::Streamed) if sse => break None,
            Some(UpstreamEvent::Resumed) if sse => {
                cut_early = true;
                break None;
            }
            Some(UpstreamEvent::Streamed | UpstreamEvent::Resumed) => {}
            Some(UpstreamEvent::Message(m)) if m.kind() == Kind::Response => {
                return rpc(StatusCode::OK, &m)
            }
            Some(UpstreamEvent::Message(m)) => break Some(m),
            None => return reject(Rejection::NoAnswer, Value::Null),
        }
    };
    // A stream: the rest of the call runs in its own task. In 2026-07-28 a
    // client that goes away cancels it.
    let task = call.detach();
    let abort = (era == Era::Modern).then(|| AbortOnDrop(task.abort_handle()));
    if let Some(Resumable(session)) = resumable {
        let (number, priming) = lock_replay(&session).open();
        if cut_early {
            lock_replay(&session).cut(number);
        }
        // SSE polling (2025-11-25): a stream still open after
        // `gateway.sse_poll_after` is closed where it stands; the client
        // resumes it with a GET and `Last-Event-ID`, and gets the rest from
        // what the session keeps. The gateway does for a stdio upstream what
        // an HTTP server closing its stream mid-call does.
        if let Some(after) = poll_after {
            let s = session.clone();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                lock_replay(&s).cut(number);
                s.sse_sent.notify_waiters();
            });
        }
        // The stream outlives the connection: what the call sends after the
        // client went away is kept for its resumption.
        let pump = session.clone();
        tokio::spawn(async move {
            let mut next = first;
            loop {
                let msg = match next.take() {
                    Some(m) => m,
                    None => match rx.recv().await {
                        Some(UpstreamEvent::Message(m)) => m,
                        Some(UpstreamEvent::Streamed) => continue,
                        Some(UpstreamEvent::Resumed) => {
                            // The upstream closed its stream early: the
                            // client's ends at the same point, and it resumes
                            // from the gateway (the rest is kept for it).
                            lock_replay(&pump).cut(number);
                            pump.sse_sent.notify_waiters();
                            continue;
                        }
                        None => break,
                    },
                };
                let last = msg.kind() == Kind::Response;
                lock_replay(&pump).push(number, &msg.to_bytes());
                pump.sse_sent.notify_waiters();
                if last {
                    break;
                }
            }
            lock_replay(&pump).finish(number);
            pump.sse_sent.notify_waiters();
        });
        return sse_response(HttpBody::from_stream(
            stream::once(async move { Ok::<Bytes, Infallible>(priming) })
                .chain(follow(session, number, 0, true)),
        ));
    }
    let frames = stream::unfold(
        (first, rx, abort, false),
        |(next, mut rx, abort, done)| async move {
            if done {
                return None;
            }
            let msg = match next {
                Some(m) => m,
                None => loop {
                    if let UpstreamEvent::Message(m) = rx.recv().await? {
                        break m;
                    }
                },
            };
            let last = msg.kind() == Kind::Response;
            Some((
                Ok::<Bytes, Infallible>(sse::encode(&msg.to_bytes())),
                (None, rx, abort, last),
            ))
        },
    );
    sse_response(HttpBody::from_stream(frames))
}

pub(super) fn lock_replay(session: &Session) -> parking_lot::MutexGuard<'_, sse::Replay> {
    session.sse.lock()
}

/// The kept events of `stream` after `after`, then the ones still to come,
/// until the stream ends.
pub(super) fn follow(
    session: Arc<Session>,
    stream: u64,
    after: u64,
    first_connection: bool,
) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> {
    stream::unfold(
        (session, after, std::collections::VecDeque::<Bytes>::new()),
        move |(session, mut cursor, mut ready)| async move {
            loop {
                if let Some(frame) = ready.pop_front() {
                    return Some((Ok(frame), (session, cursor, ready)));
                }
                // Registered before looking, so an event kept between the
                // look and the wait is not missed.
                let notified = session.sse_sent.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let got = lock_replay(&session).since(stream, cursor)?;
                if got.gap {
                    tracing::warn!(session = %session.id, stream, after = cursor, "SSE resumption: some events were no longer kept");
                }
                // The first connection stops where the upstream cut its
                // own stream; a resumption (GET) goes on to the end.
                let cut = got.cut.filter(|_| first_connection);
                let events = got.events.into_iter();
                let room = cut.map_or(usize::MAX, |c| c.saturating_sub(cursor) as usize);
                let taken: Vec<Bytes> = events.take(room).collect();
                cursor = cursor.saturating_add(taken.len() as u64).min(got.last);
                if cut.is_none() {
                    cursor = got.last;
                }
                ready.extend(taken);
                if ready.is_empty() {
                    if got.done || cut.is_some_and(|c| cursor >= c) {
                        return None;
                    }
                    notified.await;
                }
            }
        },
    )
}
