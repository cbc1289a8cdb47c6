//! Request-id multiplexing between clients and one upstream connection.
//!
//! The gateway gives every request it sends upstream its own numeric id and
//! every server-to-client request its own client-facing id, and keeps the
//! mapping here. Ids chosen by different parties therefore never collide
//! (several clients may share one upstream in the 2026-07-28 era), and an
//! upstream can only answer requests the gateway actually sent: a response with
//! an id the gateway never issued is dropped, not delivered to some client.

use crate::core::FastMap;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::wire::jsonrpc::{raw, Kind, Message};
use crate::wire::sse::UpstreamEvent;

/// Where an upstream message arrived.
#[derive(Debug, Clone, Copy)]
pub enum Origin {
    /// On the response stream of the request with this upstream id (HTTP).
    Stream(u64),
    /// On a pipe shared by everything (stdio).
    Pipe,
    /// On the standalone GET stream (HTTP, handshake era).
    Standalone,
}

/// The connection ended before the answer arrived.
#[derive(Debug, Clone, thiserror::Error)]
#[error("upstream connection lost: {0}")]
pub struct Lost(pub String);

struct Pending {
    client_id: Value,
    progress_token: Option<Value>,
    events: Option<mpsc::Sender<UpstreamEvent>>,
    done: oneshot::Sender<Result<Message, Lost>>,
}

/// Both maps are keyed by ids this gateway counts out itself, never by
/// what a peer chooses: foldhash serves (a lookup per relayed message).
#[derive(Default)]
struct Inner {
    pending: FastMap<u64, Pending>,
    /// Client-facing id → the upstream's own id of a server-to-client request.
    server_requests: FastMap<u64, Value>,
    closed: Option<String>,
}

/// A registered request: its upstream id and where its answer arrives.
pub struct Ticket {
    /// The id the request carries upstream.
    pub upstream_id: u64,
    /// Resolves with the response (client id restored) or the loss.
    pub done: oneshot::Receiver<Result<Message, Lost>>,
}

/// What a connection calls when its server's tool list changed.
pub(crate) type ListChanged = Box<dyn Fn() + Send + Sync>;

/// Id mapping and routing for one upstream connection.
pub struct Mux {
    next_id: AtomicU64,
    next_server_request: AtomicU64,
    // A std mutex: every critical section is a few map operations, never an await.
    inner: Mutex<Inner>,
    /// Server messages that belong to no request (GET stream or session buffer).
    unsolicited: mpsc::Sender<Message>,
    /// Told when the server says its tool list changed (the message itself
    /// still goes to the client).
    on_list_changed: Option<ListChanged>,
}

impl Mux {
    /// A mux whose unattributable server messages go to `unsolicited`.
    pub fn new(unsolicited: mpsc::Sender<Message>) -> Mux {
        Mux {
            next_id: AtomicU64::new(1),
            next_server_request: AtomicU64::new(1),
            inner: Mutex::new(Inner::default()),
            unsolicited,
            on_list_changed: None,
        }
    }

    /// Also call `f` when the server sends `notifications/tools/list_changed`.
    pub fn on_list_changed(mut self, f: ListChanged) -> Mux {
        self.on_list_changed = Some(f);
        self
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Inner> {
        // A poisoned lock only means another thread panicked mid-update of
        // plain maps; the maps are still usable.
        self.inner.lock()
    }

    /// Give a client request an upstream id and remember how to answer it.
    /// Related server messages go to `events` when given.
    pub fn register(
        &self,
        mut msg: Message,
        events: Option<mpsc::Sender<UpstreamEvent>>,
    ) -> Result<(Message, Ticket), Lost> {
        let upstream_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let client_id = msg
            .id
            .replace(Value::from(upstream_id))
            .unwrap_or(Value::Null);
        // Parse params only when they can carry a progress token: this runs
        // on every relayed request.
        let progress_token = msg
            .params
            .as_ref()
            .filter(|p| p.get().contains("progressToken"))
            .and_then(|_| msg.params_value())
            .and_then(|p| p.get("_meta")?.get("progressToken").cloned());
        let (tx, rx) = oneshot::channel();
        let mut inner = self.lock();
        if let Some(reason) = &inner.closed {
            return Err(Lost(reason.clone()));
        }
        inner.pending.insert(
            upstream_id,
            Pending {
                client_id,
                progress_token,
                events,
                done: tx,
            },
        );
        Ok((
            msg,
            Ticket {
                upstream_id,
                done: rx,
            },
        ))
    }

    /// Stop waiting for a request (timeout or abandoned call).
    pub fn forget(&self, upstream_id: u64) {
        self.lock().pending.remove(&upstream_id);
    }

    /// The client's id of an in-flight upstream request.
    pub fn client_id(&self, upstream_id: u64) -> Option<Value> {
        self.lock()
            .pending
            .get(&upstream_id)
            .map(|p| p.client_id.clone())
    }

    /// How many requests await an answer.
    pub fn in_flight(&self) -> usize {
        self.lock().pending.len()
    }

    /// Fail every pending request: the connection is gone.
    pub fn close(&self, reason: &str) {
        let pending: Vec<Pending> = {
            let mut inner = self.lock();
            inner.closed.get_or_insert_with(|| reason.to_owned());
            inner.pending.drain().map(|(_, p)| p).collect()
        };
        for p in pending {
            let _ = p.done.send(Err(Lost(reason.to_owned())));
        }
    }

    /// The upstream answers request `id` as an SSE stream: tell whoever
    /// relays it ([`UpstreamEvent::Streamed`]), so that a client that
    /// accepts SSE gets a stream too.
    pub fn streaming(&self, id: u64) {
        self.tell(id, UpstreamEvent::Streamed);
    }

    /// The upstream closed request `id`'s stream before answering, and it is
    /// being resumed ([`UpstreamEvent::Resumed`]).
    pub fn resuming(&self, id: u64) {
        self.tell(id, UpstreamEvent::Resumed);
    }

    fn tell(&self, id: u64, event: UpstreamEvent) {
        let events = self.lock().pending.get(&id).and_then(|p| p.events.clone());
        if let Some(events) = events {
            let _ = events.try_send(event);
        }
    }

    /// Whether the connection was closed.
    pub fn is_closed(&self) -> bool {
        self.lock().closed.is_some()
    }

    /// Route one message that came from upstream.
    pub fn deliver(&self, mut msg: Message, origin: Origin) {
        // `countersign/...` is the gateway's own namespace: a server's
        // notification there would reach the client as if the gateway had
        // sent it. Dropped. (What the transports tell about a stream is an
        // `UpstreamEvent` of its own, never a message.)
        if msg.kind() == Kind::Notification && msg.method().starts_with("countersign/") {
            tracing::warn!(method = %msg.method(), "upstream sent a notification in countersign's namespace; dropped");
            return;
        }
        match msg.kind() {
            Kind::Response => {
                let Some(id) = msg.id.as_ref().and_then(Value::as_u64) else {
                    tracing::warn!(id = ?msg.id, "upstream answered an id the gateway never sent; dropped");
                    return;
                };
                let Some(p) = self.lock().pending.remove(&id) else {
                    tracing::warn!(
                        id,
                        "upstream answered an unknown or abandoned request; dropped"
                    );
                    return;
                };
                msg.id = Some(p.client_id);
                let _ = p.done.send(Ok(msg));
            }
            Kind::Request => {
                let n = self.next_server_request.fetch_add(1, Ordering::Relaxed);
                let original = msg.id.replace(Value::from(n)).unwrap_or(Value::Null);
                self.lock().server_requests.insert(n, original);
                self.route(msg, origin);
            }
            Kind::Notification => {
                if msg.method() == "notifications/tools/list_changed" {
                    if let Some(f) = &self.on_list_changed {
                        f();
                    }
                }
                if msg.method() == "notifications/cancelled" {
                    // The server cancels one of its own requests to the client:
                    // name it by the id the client knows.
                    let Some(mut params) = msg.params_value() else {
                        return;
                    };
                    let known = {
                        let inner = self.lock();
                        let req = params.get("requestId").cloned();
                        inner
                            .server_requests
                            .iter()
                            .find(|(_, orig)| Some(*orig) == req.as_ref())
                            .map(|(n, _)| *n)
                    };
                    let Some(n) = known else { return };
                    params["requestId"] = Value::from(n);
                    msg.params = Some(raw(&params));
                }
                self.route(msg, origin);
            }
        }
    }

    fn route(&self, msg: Message, origin: Origin) {
        let target = {
            let inner = self.lock();
            match origin {
                Origin::Stream(id) => inner.pending.get(&id).and_then(|p| p.events.clone()),
                Origin::Standalone => None,
                Origin::Pipe => Self::attribute(&inner, &msg),
            }
        };
        let delivered = match target {
            Some(events) => match events.try_send(UpstreamEvent::Message(msg)) {
                Ok(()) => Ok(()),
                Err(e) => match e.into_inner() {
                    UpstreamEvent::Message(msg) => Err(msg),
                    UpstreamEvent::Streamed | UpstreamEvent::Resumed => Ok(()),
                },
            },
            None => Err(msg),
        };
        if let Err(msg) = delivered {
            if self.unsolicited.try_send(msg).is_err() {
                tracing::warn!("server message dropped: the client is not reading its stream");
            }
        }
    }

    /// On a shared pipe, a message belongs to a request when its progress
    /// token names exactly one pending request, or when only one request is
    /// pending. A token shared by several pending requests (possible when
    /// clients share an upstream) attributes to none, so one client never
    /// receives another's progress.
    fn attribute(inner: &Inner, msg: &Message) -> Option<mpsc::Sender<UpstreamEvent>> {
        let token = msg
            .params_value()
            .and_then(|p| p.get("progressToken").cloned());
        if let Some(token) = token {
            let mut hits = inner
                .pending
                .values()
                .filter(|p| p.progress_token.as_ref() == Some(&token));
            return match (hits.next(), hits.next()) {
                (Some(p), None) => p.events.clone(),
                _ => None,
            };
        }
        if inner.pending.len() == 1 {
            return inner.pending.values().next().and_then(|p| p.events.clone());
        }
        None
    }

    /// Translate a message from the client before it goes upstream: a
    /// response to a server request gets the server's id back, a
    /// cancellation names the upstream id. `None` means it has no upstream
    /// counterpart (an answer to nothing, a cancel of nothing) and is dropped.
    pub fn toward_upstream(&self, mut msg: Message) -> Option<Message> {
        match msg.kind() {
            Kind::Response => {
                let n = msg.id.as_ref().and_then(Value::as_u64)?;
                let original = self.lock().server_requests.remove(&n)?;
                msg.id = Some(original);
                Some(msg)
            }
            Kind::Notification if msg.method() == "notifications/cancelled" => {
                let mut params = msg.params_value()?;
                let client_id = params.get("requestId")?.clone();
                let upstream = {
                    let inner = self.lock();
                    inner
                        .pending
                        .iter()
                        .find(|(_, p)| p.client_id == client_id)
                        .map(|(id, _)| *id)?
                };
                params["requestId"] = Value::from(upstream);
                msg.params = Some(raw(&params));
                Some(msg)
            }
            _ => Some(msg),
        }
    }
}

#[cfg(test)]
mod forged_markers {
    use super::*;

    #[tokio::test]
    async fn an_upstream_cannot_send_the_gateways_markers() {
        let (utx, mut urx) = mpsc::channel(8);
        let mux = Mux::new(utx);
        let (etx, mut erx) = mpsc::channel(8);
        let (_out, _ticket) = mux
            .register(
                Message::request(Value::from(1), "tools/call", None),
                Some(etx),
            )
            .unwrap();
        mux.deliver(
            Message::notification("countersign/upstream-resumed", None),
            Origin::Pipe,
        );
        assert!(erx.try_recv().is_err(), "not on the request's events");
        assert!(urx.try_recv().is_err(), "nor anywhere else");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(id: Value, method: &str, params: Option<Value>) -> Message {
        Message::request(id, method, params.as_ref().map(raw))
    }

    #[tokio::test]
    async fn ids_are_rewritten_and_restored() {
        let (utx, _urx) = mpsc::channel(8);
        let mux = Mux::new(utx);
        let (up1, t1) = mux
            .register(req(Value::from("a"), "ping", None), None)
            .unwrap();
        let (up2, t2) = mux
            .register(req(Value::from("a"), "ping", None), None)
            .unwrap();
        assert_ne!(
            up1.id, up2.id,
            "the same client id from two clients must not collide upstream"
        );
        let r = Message::response(up2.id.clone().unwrap(), raw(&serde_json::json!({})));
        mux.deliver(r, Origin::Pipe);
        let got = t2.done.await.unwrap().unwrap();
        assert_eq!(got.id, Some(Value::from("a")));
        mux.close("gone");
        assert!(t1.done.await.unwrap().is_err());
        assert!(mux
            .register(req(Value::from(1), "ping", None), None)
            .is_err());
    }

    #[tokio::test]
    async fn unknown_response_is_dropped() {
        let (utx, mut urx) = mpsc::channel(8);
        let mux = Mux::new(utx);
        mux.deliver(
            Message::response(Value::from(99), raw(&serde_json::json!({}))),
            Origin::Pipe,
        );
        assert!(urx.try_recv().is_err());
    }

    #[tokio::test]
    async fn server_request_round_trip() {
        let (utx, mut urx) = mpsc::channel(8);
        let mux = Mux::new(utx);
        mux.deliver(
            req(Value::from("srv-1"), "sampling/createMessage", None),
            Origin::Standalone,
        );
        let to_client = urx.recv().await.unwrap();
        let n = to_client.id.clone().unwrap();
        assert!(n.is_u64());
        let answer = Message::response(n, raw(&serde_json::json!({"ok": true})));
        let upstream = mux.toward_upstream(answer.clone()).unwrap();
        assert_eq!(upstream.id, Some(Value::from("srv-1")));
        assert!(
            mux.toward_upstream(answer).is_none(),
            "a second answer has nothing to answer"
        );
    }

    #[tokio::test]
    async fn progress_goes_to_its_request_only() {
        let (utx, mut urx) = mpsc::channel(8);
        let mux = Mux::new(utx);
        let (etx1, mut erx1) = mpsc::channel(8);
        let (etx2, mut erx2) = mpsc::channel(8);
        let p1 = serde_json::json!({"_meta": {"progressToken": "t1"}});
        let p2 = serde_json::json!({"_meta": {"progressToken": "t2"}});
        mux.register(req(Value::from(1), "tools/call", Some(p1)), Some(etx1))
            .unwrap();
        mux.register(req(Value::from(2), "tools/call", Some(p2)), Some(etx2))
            .unwrap();
        let progress = Message::notification(
            "notifications/progress",
            Some(raw(
                &serde_json::json!({"progressToken": "t2", "progress": 1}),
            )),
        );
        mux.deliver(progress, Origin::Pipe);
        assert!(erx2.try_recv().is_ok());
        assert!(erx1.try_recv().is_err());
        // Two requests pending and no token: it belongs to neither.
        mux.deliver(
            Message::notification("notifications/message", None),
            Origin::Pipe,
        );
        assert!(urx.try_recv().is_ok());
    }

    #[tokio::test]
    async fn cancel_names_upstream_id() {
        let (utx, _urx) = mpsc::channel(8);
        let mux = Mux::new(utx);
        let (up, _t) = mux
            .register(req(Value::from("c-1"), "tools/call", None), None)
            .unwrap();
        let cancel = Message::notification(
            "notifications/cancelled",
            Some(raw(&serde_json::json!({"requestId": "c-1"}))),
        );
        let out = mux.toward_upstream(cancel).unwrap();
        assert_eq!(out.params_value().unwrap()["requestId"], up.id.unwrap());
    }
}
