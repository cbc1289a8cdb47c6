//! The running gateway: its shared state and the client sessions.
//!
//! Handshake era: a client's `initialize` creates a [`Session`] with a
//! gateway-minted `Mcp-Session-Id` and its own upstream connection (one
//! stdio child per client session). The session is bound to the identity that
//! created it; another token presenting the same id is told the session does
//! not exist, so a leaked session id alone is worthless.
//!
//! 2026-07-28 era: there are no sessions; each server has one shared
//! upstream connection ([`Gateway::modern_upstream`]), probed once with
//! `server/discover` to learn whether the upstream speaks that era at all.

mod upstreams;

use upstreams::BridgeKey;
pub(crate) use upstreams::{Bridge, ModernUpstream};

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::core::config::Config;
use crate::core::decision::Policies;
use crate::core::identity::Identity;
use crate::core::time::SystemClock;
use crate::enforce::answer;
use crate::enforce::pipeline::Pipeline;
use crate::store::Store;
use crate::upstream::Passthrough;
use crate::upstream::{HttpClient, UpstreamConn, UpstreamError};
use crate::wire::era::Era;
use crate::wire::era::{modern_headers, own_envelope, MODERN_VERSIONS};
use crate::wire::jsonrpc::{raw, Message};

/// How many server messages wait for a client's standalone stream.
pub(crate) const UNSOLICITED_BUFFER: usize = 256;

/// One handshake-era client session.
pub(crate) struct Session {
    /// The gateway-minted `Mcp-Session-Id`.
    pub id: String,
    /// The upstream server.
    pub server: String,
    /// Who created it; only this identity may use it.
    pub identity: Arc<Identity>,
    /// The idempotency scope: the stdio bridge's stable scope when it sent
    /// one, else the session id.
    pub scope: String,
    /// The upstream connection; replaced when it is healed. Read it with
    /// [`Session::conn`].
    conn: Mutex<Arc<UpstreamConn>>,
    /// Where every connection of this session sends server messages of no
    /// request: the same stream across healing.
    unsolicited: mpsc::Sender<Message>,
    /// One healing at a time.
    healing: tokio::sync::Mutex<()>,
    /// What the client negotiated in `initialize`.
    pub protocol_version: Mutex<Option<String>>,
    /// The client's `initialize` params, kept to re-initialize a healed upstream.
    pub init_params: Mutex<Option<Box<RawValue>>>,
    /// Server messages for the standalone GET stream. A tokio mutex so that
    /// exactly one GET stream owns the receiver at a time.
    pub standalone: Arc<tokio::sync::Mutex<mpsc::Receiver<Message>>>,
    /// Events of this session's SSE streams, kept for `Last-Event-ID`
    /// resumption; `sse_sent` wakes the streams that follow them.
    pub sse: Mutex<crate::wire::sse::Replay>,
    /// Notified on every event kept in `sse`.
    pub sse_sent: tokio::sync::Notify,
    /// The gateway's open questions to this client (approval in the
    /// client), when its `initialize` declared form elicitation.
    pub asks: Option<Arc<crate::enforce::client::Asks>>,
    /// Set when the upstream speaks only 2026-07-28: the session is the
    /// gateway's, its requests go over the server's shared 2026-07-28
    /// connection with this `_meta` envelope (the client's capabilities and
    /// info from its `initialize`), and its answers are rewritten in the
    /// handshake era.
    pub envelope: Option<serde_json::Map<String, Value>>,
    last_used: Mutex<Instant>,
}

impl Session {
    /// The current upstream connection.
    pub(crate) fn conn(&self) -> Arc<UpstreamConn> {
        self.conn.lock().clone()
    }

    /// The connection to use now: the current one, or a healed one when it
    /// was lost (child exited, upstream session expired).
    pub(crate) async fn healthy_conn(
        &self,
        gw: &Gateway,
    ) -> Result<Arc<UpstreamConn>, UpstreamError> {
        if self.envelope.is_some() {
            // The server's shared 2026-07-28 connection, reconnected by the
            // gateway when it was lost.
            return match gw.modern_upstream(&self.server).await? {
                ModernUpstream::Speaks(c) => Ok(c),
                ModernUpstream::Legacy => Err(UpstreamError::Closed {
                    server: self.server.clone(),
                    reason: "the upstream no longer speaks 2026-07-28".into(),
                }),
            };
        }
        let conn = self.conn();
        if !conn.is_closed() {
            return Ok(conn);
        }
        self.heal(gw, &conn).await
    }

    /// Replace a lost connection: spawn or reconnect, then re-initialize with
    /// the client's own `initialize` params (its answer stays in the
    /// gateway: the client already has one) and `notifications/initialized`.
    async fn heal(
        &self,
        gw: &Gateway,
        stale: &Arc<UpstreamConn>,
    ) -> Result<Arc<UpstreamConn>, UpstreamError> {
        let _one = self.healing.lock().await;
        let current = self.conn();
        if !Arc::ptr_eq(&current, stale) && !current.is_closed() {
            return Ok(current); // healed meanwhile
        }
        let conn = gw
            .connect_with(&self.server, self.unsolicited.clone())
            .await?;
        let params = self.init_params.lock().clone();
        let init = Message::request(Value::from("countersign-heal"), "initialize", params);
        let timeout = gw.config.call_timeout(&self.server);
        let healed = async {
            let init = Passthrough::checked(&self.server, init)?;
            let resp = conn.call(init, None, timeout, &Vec::new()).await?;
            if resp.error.is_some() {
                return Err(UpstreamError::Refused {
                    server: self.server.clone(),
                    status: 0,
                });
            }
            conn.send(
                Passthrough::checked(
                    &self.server,
                    Message::notification("notifications/initialized", None),
                )?,
                &Vec::new(),
            )
            .await
        }
        .await;
        if let Err(e) = healed {
            conn.shutdown(gw.config.gateway.shutdown_grace).await;
            return Err(e);
        }
        *self.conn.lock() = conn.clone();
        let grace = gw.config.gateway.shutdown_grace;
        let old = current;
        tokio::spawn(async move { old.shutdown(grace).await });
        tracing::info!(server = %self.server, session = %self.id, "upstream connection healed");
        Ok(conn)
    }

    /// The capabilities the session's client declared in `initialize`.
    pub(crate) fn client_capabilities(&self) -> Option<Value> {
        let params = self.init_params.lock().clone()?;
        let params: Value = serde_json::from_str(params.get()).ok()?;
        params.get("capabilities").cloned()
    }

    /// `msg` with the session's 2026-07-28 envelope in `params._meta`, when
    /// the upstream speaks only that era (keys the client sent stay).
    pub(crate) fn enveloped(&self, mut msg: Message) -> Message {
        let Some(envelope) = &self.envelope else {
            return msg;
        };
        let mut params = msg
            .params_value()
            .and_then(|p| match p {
                Value::Object(m) => Some(m),
                _ => None,
            })
            .unwrap_or_default();
        let meta = params
            .entry("_meta")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(meta) = meta.as_object_mut() {
            for (k, v) in envelope {
                meta.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        msg.params = Some(raw(&Value::Object(params)));
        msg
    }

    /// Shut the session's own upstream connection down (a session over the
    /// shared 2026-07-28 connection has none of its own).
    async fn shutdown_upstream(&self, grace: Duration) {
        if self.envelope.is_none() {
            self.conn().shutdown(grace).await;
        }
    }

    /// Send `msg` on the session's standalone stream, if there is room (a
    /// notification of no request, such as a task's status): a client that
    /// does not listen loses nothing it cannot ask for again.
    pub(crate) fn notify(&self, msg: Message) {
        let _ = self.unsolicited.try_send(msg);
    }

    /// Note activity (for the idle sweep).
    pub(crate) fn touch(&self) {
        *self.last_used.lock() = Instant::now();
    }

    fn idle_for(&self) -> Duration {
        self.last_used.lock().elapsed()
    }
}

/// What a client's `initialize` led to.
pub(crate) enum Opened {
    /// A new session, and the upstream's answer.
    Session(Arc<Session>, Message),
    /// No session: the upstream's refusal, or the gateway's account of the
    /// failure.
    Refused(Message),
}

/// The gateway's shared state: configuration, identities, the enforcement
/// pipeline, and the upstream connections (handshake-era sessions and the
/// shared 2026-07-28 connection of each server).
pub(crate) struct Gateway {
    /// The loaded configuration.
    config: Arc<Config>,
    /// Who is asking: static tokens and identity providers' access tokens.
    auth: super::auth::Auth,
    /// The enforcement pipeline of `tools/call`.
    pipeline: Pipeline,
    /// Shared HTTP client for HTTP upstreams.
    http: HttpClient,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// One slot per configured server. A tokio mutex per server: probing an
    /// upstream awaits, concurrent first requests must not spawn two shared
    /// children, and a slow server must not hold up the others.
    modern: HashMap<String, tokio::sync::Mutex<Option<ModernUpstream>>>,
    /// Handshake-era upstream sessions the gateway holds for 2026-07-28
    /// clients of servers that speak only the handshake era, one per
    /// (server, principal, tenant); see [`Gateway::bridged`].
    bridges: Mutex<HashMap<BridgeKey, Arc<tokio::sync::Mutex<Option<Bridge>>>>>,
    /// What each server that speaks 2026-07-28 answered `server/discover`.
    discovered: Mutex<HashMap<String, Value>>,
    /// `limits.requests_per_second` per (principal, tenant), when set.
    rate: Option<governor::DefaultKeyedRateLimiter<(String, String)>>,
    /// The audit dir (`serve`), for the read-only transparency endpoints.
    audit_dir: Option<std::path::PathBuf>,
    /// What the fronts turned away: counted, and audited at a bounded rate.
    refusals: super::refusals::Refusals,
    /// Tokens exchanged on callers' behalf (servers with delegation).
    delegator: crate::upstream::delegation::Delegator,
    /// The connections that carry them, one per (server, principal, tenant).
    delegated: super::delegation::connections::Delegated,
    /// Held calls as tasks: this gateway's runner of approved ones.
    tasks: super::task_state::Runner,
}

impl Gateway {
    /// Build the gateway state from a checked config.
    /// `store` holds the idempotency ledger (redb for `serve`; `check`, which
    /// sends no `tools/call`, uses a memory store and leaves the file alone).
    pub(crate) fn new(
        config: Config,
        store: Arc<dyn Store>,
        policies: Policies,
        audit: Option<Arc<crate::audit::log::AuditLog>>,
    ) -> Arc<Gateway> {
        let config = Arc::new(config);
        let state_key = audit.as_ref().map(|a| a.signing_key());
        let audit_dir = audit.as_ref().map(|a| a.dir().to_owned());
        let mut pipeline = Pipeline::new(
            config.clone(),
            store,
            policies,
            audit.map(|a| a as Arc<dyn crate::audit::AuditSink>),
            Arc::new(SystemClock),
        );
        if let Some(key) = state_key {
            pipeline.set_state_key(key);
        }
        let auth = super::auth::Auth::new(&config);
        let delegator = crate::upstream::delegation::Delegator::new(&config);
        let modern = config
            .servers
            .keys()
            .map(|k| (k.clone(), tokio::sync::Mutex::new(None)))
            .collect();
        let rate = std::num::NonZeroU32::new(config.limits.requests_per_second).map(|per_second| {
            let burst = per_second.saturating_mul(std::num::NonZeroU32::MIN.saturating_add(1));
            governor::RateLimiter::keyed(governor::Quota::per_second(per_second).allow_burst(burst))
        });
        Arc::new(Gateway {
            config,
            auth,
            pipeline,
            http: HttpClient::new(),
            sessions: Mutex::new(HashMap::new()),
            modern,
            bridges: Mutex::new(HashMap::new()),
            discovered: Mutex::new(HashMap::new()),
            rate,
            audit_dir,
            refusals: Default::default(),
            delegator,
            delegated: Default::default(),
            tasks: super::task_state::Runner::default(),
        })
    }

    /// Held calls as tasks: the runner's state on this gateway.
    pub(crate) fn tasks(&self) -> &super::task_state::Runner {
        &self.tasks
    }

    /// Session `id` of `server`, if it belongs to (principal, tenant): the
    /// requester's session that holds a server's task it relays.
    pub(crate) fn session_of(
        &self,
        server: &str,
        id: &str,
        principal: &str,
        tenant: &str,
    ) -> Option<Arc<Session>> {
        let s = self.sessions.lock().get(id).cloned()?;
        (s.server == server && s.identity.principal == principal && s.identity.tenant == tenant)
            .then_some(s)
    }

    /// The open handshake-era sessions of (`server`, principal, tenant).
    pub(crate) fn sessions_of_owner(
        &self,
        server: &str,
        principal: &str,
        tenant: &str,
    ) -> Vec<Arc<Session>> {
        self.sessions
            .lock()
            .values()
            .filter(|s| {
                s.server == server
                    && s.identity.principal == principal
                    && s.identity.tenant == tenant
            })
            .cloned()
            .collect()
    }

    /// The loaded configuration.
    pub(crate) fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// Authentication: static tokens and identity providers.
    pub(crate) fn auth(&self) -> &super::auth::Auth {
        &self.auth
    }

    /// Token exchange on callers' behalf.
    pub(crate) fn delegator(&self) -> &crate::upstream::delegation::Delegator {
        &self.delegator
    }

    /// The delegated connections.
    pub(crate) fn delegated(&self) -> &super::delegation::connections::Delegated {
        &self.delegated
    }

    /// A front refused something before it reached the pipeline or an
    /// upstream: counted, and audited at a bounded rate
    /// ([`super::refusals`]).
    pub(crate) fn refused(&self, what: &'static str, server: Option<&str>, detail: &str) {
        self.refusals.refused(&self.pipeline, what, server, detail);
    }

    /// Count, log and (at a bounded rate) audit a client message that may
    /// not be relayed ([`crate::wire::toolcall`]).
    pub(crate) fn refuse_unrelayable(
        &self,
        server: &str,
        msg: &Message,
        why: crate::wire::toolcall::Unrelayable,
    ) {
        let method = crate::core::legible::text(msg.method());
        tracing::warn!(server, method = %method, "client message refused, nothing sent: {why}");
        self.refused(
            why.label(),
            Some(server),
            &format!("method `{method}`: {why}"),
        );
    }

    /// The enforcement pipeline of `tools/call`.
    pub(crate) fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// The audit dir (`serve`), for the read-only transparency endpoints.
    pub(crate) fn audit_dir(&self) -> Option<&std::path::Path> {
        self.audit_dir.as_deref()
    }

    /// One request of `identity` against `limits.requests_per_second`:
    /// `Err(wait)` when it is over, with how long until one would pass.
    /// Keys are authenticated identities only (configured ones, or the
    /// principals of genuine access tokens), so the limiter's memory is
    /// bounded by the people and agents the providers vouch for.
    pub(crate) fn rate_check(&self, identity: &Identity) -> Result<(), std::time::Duration> {
        let Some(rate) = &self.rate else {
            return Ok(());
        };
        let key = (identity.principal.clone(), identity.tenant.clone());
        rate.check_key(&key).map_err(|not_until| {
            not_until.wait_time_from(governor::clock::Clock::now(
                &governor::clock::DefaultClock::default(),
            ))
        })
    }

    /// How many handshake-era sessions `identity` holds now.
    pub(crate) fn sessions_of(&self, identity: &Identity) -> usize {
        self.sessions
            .lock()
            .values()
            .filter(|s| {
                s.identity.principal == identity.principal && s.identity.tenant == identity.tenant
            })
            .count()
    }

    /// A client's `initialize`: connect to `server`, relay the request, and
    /// on success register a session bound to `identity` (idempotency scope
    /// `scope` when the stdio bridge sent one, else the session id).
    pub(crate) async fn open_session(
        &self,
        server: &str,
        identity: Arc<Identity>,
        scope: Option<String>,
        init: Message,
    ) -> Opened {
        let id = init.id.clone().unwrap_or(Value::Null);
        let failed = |e: &UpstreamError| {
            tracing::warn!(server, "initialize failed: {e}");
            Opened::Refused(answer::upstream_failure(
                id.clone(),
                "initialize",
                e,
                Era::Handshake,
            ))
        };
        let (unsolicited, standalone) = mpsc::channel(UNSOLICITED_BUFFER);
        let conn = match self.connect_with(server, unsolicited.clone()).await {
            Ok(c) => c,
            Err(e) => return failed(&e),
        };
        let params = init.params.clone();
        let timeout = self.pipeline.call_timeout(server);
        let sent = match Passthrough::checked(server, init) {
            Ok(init) => conn.call(init, None, timeout, &Vec::new()).await,
            Err(e) => Err(e),
        };
        match sent {
            Ok(resp) if resp.error.is_none() => {
                let version = resp
                    .result
                    .as_ref()
                    .and_then(|r| serde_json::from_str::<Value>(r.get()).ok())
                    .and_then(|v| v.get("protocolVersion")?.as_str().map(str::to_owned));
                // The client can be asked for approvals when it declared
                // form elicitation (its own capability, not the upstream's).
                let elicits = params
                    .as_ref()
                    .and_then(|p| serde_json::from_str::<Value>(p.get()).ok())
                    .is_some_and(|p| {
                        crate::core::confirm::declares_elicitation(p.get("capabilities"))
                    });
                let asks = elicits
                    .then(|| Arc::new(crate::enforce::client::Asks::new(version.as_deref())));
                let session = self.add_session(
                    server,
                    identity,
                    scope,
                    conn,
                    (unsolicited, standalone),
                    asks,
                );
                *session.protocol_version.lock() = version;
                *session.init_params.lock() = params;
                // A stdio server runs one child per session, and a child may
                // list other tools than the one the catalog was fetched
                // from: its first call lists them again (DESIGN.md section
                // 12; the latest listing is what calls are judged by).
                if self
                    .config
                    .servers
                    .get(server)
                    .is_some_and(|c| c.command.is_some())
                {
                    self.pipeline.catalog().mark_unfetched(server);
                }
                tracing::info!(server, session = %session.id, principal = %session.identity.principal, "session opened");
                Opened::Session(session, resp)
            }
            other => {
                let grace = self.config.gateway.shutdown_grace;
                tokio::spawn(async move { conn.shutdown(grace).await });
                // Refused: an upstream that speaks only 2026-07-28 is
                // bridged (the gateway answers `initialize` itself).
                let refused = matches!(&other, Ok(_) | Err(UpstreamError::Refused { .. }));
                let bridges = self
                    .config
                    .servers
                    .get(server)
                    .is_some_and(|c| c.bridge_eras);
                if refused && bridges {
                    if let Some(opened) = self
                        .open_reverse(
                            server,
                            &identity,
                            scope.clone(),
                            id.clone(),
                            params.as_deref(),
                        )
                        .await
                    {
                        return opened;
                    }
                }
                match other {
                    Ok(refusal) => Opened::Refused(refusal),
                    Err(e) => failed(&e),
                }
            }
        }
    }

    /// Register a new session after a successful `initialize`.
    pub(crate) fn add_session(
        &self,
        server: &str,
        identity: Arc<Identity>,
        scope: Option<String>,
        conn: Arc<UpstreamConn>,
        (unsolicited, standalone): (mpsc::Sender<Message>, mpsc::Receiver<Message>),
        asks: Option<Arc<crate::enforce::client::Asks>>,
    ) -> Arc<Session> {
        let id = mint_session_id();
        let session = Arc::new(Session {
            scope: scope.unwrap_or_else(|| id.clone()),
            id: id.clone(),
            server: server.into(),
            identity,
            conn: Mutex::new(conn),
            unsolicited,
            healing: tokio::sync::Mutex::new(()),
            protocol_version: Mutex::new(None),
            init_params: Mutex::new(None),
            standalone: Arc::new(tokio::sync::Mutex::new(standalone)),
            sse: Mutex::default(),
            sse_sent: tokio::sync::Notify::new(),
            asks,
            envelope: None,
            last_used: Mutex::new(Instant::now()),
        });
        self.sessions.lock().insert(id, session.clone());
        session
    }

    /// The session `id` of `server`, if it exists and belongs to `identity`.
    pub(crate) fn session(
        &self,
        server: &str,
        id: &str,
        identity: &Identity,
    ) -> Option<Arc<Session>> {
        let s = self.sessions.lock().get(id).cloned()?;
        // Bound to its creator: another principal (or another server's
        // endpoint) gets "no such session", never someone else's stream.
        (s.server == server && *s.identity == *identity).then_some(s)
    }

    /// Remove a session and shut its upstream down.
    pub(crate) async fn close_session(&self, id: &str) {
        let removed = self.sessions.lock().remove(id);
        if let Some(s) = removed {
            s.shutdown_upstream(self.config.gateway.shutdown_grace)
                .await;
        }
    }

    /// Close sessions idle longer than `session_idle_timeout`.
    pub(crate) async fn sweep_idle(&self) {
        let limit = self.config.gateway.session_idle_timeout;
        let idle: Vec<String> = self
            .sessions
            .lock()
            .values()
            .filter(|s| {
                s.idle_for() > limit && (s.envelope.is_some() || s.conn().mux.in_flight() == 0)
            })
            .map(|s| s.id.clone())
            .collect();
        for id in idle {
            tracing::info!(session = %id, "closing idle session");
            self.close_session(&id).await;
        }
        self.delegated
            .sweep(limit, self.config.gateway.shutdown_grace)
            .await;
    }

    /// Shut every upstream down (gateway stopping).
    pub(crate) async fn shutdown(&self) {
        let all: Vec<Arc<Session>> = self.sessions.lock().drain().map(|(_, s)| s).collect();
        let mut modern = Vec::new();
        for slot in self.modern.values() {
            modern.extend(slot.lock().await.take());
        }
        let grace = self.config.gateway.shutdown_grace;
        let mut tasks = Vec::new();
        for s in all {
            tasks.push(tokio::spawn(
                async move { s.shutdown_upstream(grace).await },
            ));
        }
        for m in modern {
            if let ModernUpstream::Speaks(conn) = m {
                tasks.push(tokio::spawn(async move { conn.shutdown(grace).await }));
            }
        }
        for t in tasks {
            let _ = t.await;
        }
        self.delegated.shutdown(grace).await;
    }

    /// How many handshake-era sessions are open.
    pub(crate) fn session_count(&self) -> usize {
        self.sessions.lock().len()
    }
}

async fn drain(mut rx: mpsc::Receiver<Message>) {
    while rx.recv().await.is_some() {}
}

fn mint_session_id() -> String {
    // 128 random bits: unguessable, and visible ASCII as the spec requires.
    let bytes: [u8; 16] = rand::random();
    hex::encode(bytes)
}
