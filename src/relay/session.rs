//! Client sessions and the gateway's shared state.
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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::annotations::Catalog;
use crate::config::Config;
use crate::decision::Policies;
use crate::idempotency::{Idempotency, Retention};
use crate::identity::{Identities, Identity};
use crate::jsonrpc::{raw, Message};
use crate::recovery::Breaker;
use crate::relay::upstream::{HttpClient, UpstreamConn, UpstreamError};
use crate::relay::{META_PROTOCOL_VERSION, MODERN_VERSIONS};
use crate::store::Store;

/// How many server messages wait for a client's standalone stream.
const UNSOLICITED_BUFFER: usize = 256;

/// One handshake-era client session.
pub struct Session {
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
    last_used: Mutex<Instant>,
}

impl Session {
    /// The current upstream connection.
    pub fn conn(&self) -> Arc<UpstreamConn> {
        lock(&self.conn).clone()
    }

    /// The connection to use now: the current one, or a healed one when it
    /// was lost (child exited, upstream session expired).
    pub async fn healthy_conn(&self, gw: &Gateway) -> Result<Arc<UpstreamConn>, UpstreamError> {
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
        let params = lock(&self.init_params).clone();
        let init = Message::request(Value::from("countersign-heal"), "initialize", params);
        let timeout = gw
            .config
            .servers
            .get(&self.server)
            .map_or(Duration::from_secs(30), |c| c.call_timeout);
        let healed = async {
            let resp = conn.call(init, None, timeout, &Vec::new()).await?;
            if resp.error.is_some() {
                return Err(UpstreamError::Refused {
                    server: self.server.clone(),
                    status: 0,
                });
            }
            conn.send(
                Message::notification("notifications/initialized", None),
                &Vec::new(),
            )
            .await
        }
        .await;
        if let Err(e) = healed {
            conn.shutdown(gw.config.gateway.shutdown_grace).await;
            return Err(e);
        }
        *lock(&self.conn) = conn.clone();
        let grace = gw.config.gateway.shutdown_grace;
        let old = current;
        tokio::spawn(async move { old.shutdown(grace).await });
        tracing::info!(server = %self.server, session = %self.id, "upstream connection healed");
        Ok(conn)
    }

    /// Note activity (for the idle sweep).
    pub fn touch(&self) {
        *lock(&self.last_used) = Instant::now();
    }

    fn idle_for(&self) -> Duration {
        lock(&self.last_used).elapsed()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the gateway learned about a server's 2026-07-28 support.
#[derive(Clone)]
pub enum ModernUpstream {
    /// It answered `server/discover` with a modern version: shared connection.
    Speaks(Arc<UpstreamConn>),
    /// It is handshake-only; modern clients get the version error.
    Legacy,
}

/// Everything the front needs: config, identities, sessions, catalog.
pub struct Gateway {
    /// The loaded configuration.
    pub config: Config,
    /// Bearer tokens.
    pub identities: Identities,
    /// Tool annotations captured from `tools/list`.
    pub catalog: Catalog,
    /// Shared HTTP client for HTTP upstreams.
    pub http: HttpClient,
    /// The idempotency ledger.
    pub idempotency: Arc<Idempotency>,
    /// Proposals and approvals (same store as the ledger).
    pub book: Arc<crate::control::book::Book>,
    /// The audit log (`serve` only; commands that send no tools/call run
    /// without one).
    pub audit: Option<Arc<crate::audit::log::AuditLog>>,
    /// One circuit breaker per configured server.
    breakers: HashMap<String, Mutex<Breaker>>,
    /// The policy set in force; swapped whole by a reload.
    policies: std::sync::RwLock<Arc<Policies>>,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// One slot per configured server. A tokio mutex per server: probing an
    /// upstream awaits, concurrent first requests must not spawn two shared
    /// children, and a slow server must not hold up the others.
    modern: HashMap<String, tokio::sync::Mutex<Option<ModernUpstream>>>,
}

impl Gateway {
    /// Build the gateway state from a checked config.
    /// `store` holds the idempotency ledger (redb for `serve`; `check`, which
    /// sends no `tools/call`, uses a memory store and leaves the file alone).
    pub fn new(
        config: Config,
        store: Arc<dyn Store>,
        policies: Policies,
        audit: Option<Arc<crate::audit::log::AuditLog>>,
    ) -> Arc<Gateway> {
        let book = Arc::new(crate::control::book::Book::new(
            store.clone(),
            config.approvals.clone(),
            audit.clone(),
        ));
        let idempotency = Idempotency::new(
            store,
            Retention {
                explicit: config.idempotency.retention,
                derived: config.idempotency.derived_ttl,
            },
        );
        let identities = Identities::from_config(&config.identities);
        let breakers = config
            .servers
            .keys()
            .map(|k| {
                (
                    k.clone(),
                    Mutex::new(Breaker::new(
                        config.circuit.failure_threshold,
                        config.circuit.cooldown,
                    )),
                )
            })
            .collect();
        let modern = config
            .servers
            .keys()
            .map(|k| (k.clone(), tokio::sync::Mutex::new(None)))
            .collect();
        let catalog = Catalog::new(
            config
                .servers
                .iter()
                .map(|(k, v)| (k.clone(), v.tools.clone()))
                .collect(),
        );
        Arc::new(Gateway {
            config,
            identities,
            catalog,
            http: HttpClient::new(),
            sessions: Mutex::new(HashMap::new()),
            modern,
            idempotency,
            book,
            audit,
            breakers,
            policies: std::sync::RwLock::new(Arc::new(policies)),
        })
    }

    /// Append an audit entry (buffered), when there is a log.
    pub fn audit(&self, kind: &'static str, fields: serde_json::Map<String, serde_json::Value>) {
        if let Some(a) = &self.audit {
            a.record(kind, fields);
        }
    }

    /// Open an upstream connection to `server` whose server messages of no
    /// request go to `unsolicited`.
    pub async fn connect_with(
        &self,
        server: &str,
        unsolicited: mpsc::Sender<Message>,
    ) -> Result<Arc<UpstreamConn>, UpstreamError> {
        let cfg = self
            .config
            .servers
            .get(server)
            .ok_or_else(|| UpstreamError::Closed {
                server: server.into(),
                reason: "not configured".into(),
            })?;
        UpstreamConn::connect(
            server,
            cfg,
            &self.http,
            self.config.limits.max_line_bytes,
            unsolicited,
        )
        .await
    }

    /// The policy set in force now.
    pub fn policies(&self) -> Arc<Policies> {
        self.policies
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Put a new policy set in force (a successful reload).
    pub fn set_policies(&self, policies: Policies) {
        *self.policies.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(policies);
    }

    /// The circuit breaker of `server`.
    pub fn breaker(&self, server: &str) -> Option<&Mutex<Breaker>> {
        self.breakers.get(server)
    }

    /// Open an upstream connection to `server`.
    pub async fn connect(
        &self,
        server: &str,
    ) -> Result<(Arc<UpstreamConn>, mpsc::Receiver<Message>), UpstreamError> {
        let (tx, rx) = mpsc::channel(UNSOLICITED_BUFFER);
        let conn = self.connect_with(server, tx).await?;
        Ok((conn, rx))
    }

    /// Register a new session after a successful `initialize`.
    pub fn add_session(
        &self,
        server: &str,
        identity: Arc<Identity>,
        scope: Option<String>,
        conn: Arc<UpstreamConn>,
        unsolicited: mpsc::Sender<Message>,
        standalone: mpsc::Receiver<Message>,
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
            last_used: Mutex::new(Instant::now()),
        });
        lock(&self.sessions).insert(id, session.clone());
        session
    }

    /// The session `id` of `server`, if it exists and belongs to `identity`.
    pub fn session(&self, server: &str, id: &str, identity: &Identity) -> Option<Arc<Session>> {
        let s = lock(&self.sessions).get(id).cloned()?;
        // Bound to its creator: another principal (or another server's
        // endpoint) gets "no such session", never someone else's stream.
        (s.server == server && *s.identity == *identity).then_some(s)
    }

    /// Remove a session and shut its upstream down.
    pub async fn close_session(&self, id: &str) {
        let removed = lock(&self.sessions).remove(id);
        if let Some(s) = removed {
            s.conn().shutdown(self.config.gateway.shutdown_grace).await;
        }
    }

    /// Close sessions idle longer than `session_idle_timeout`.
    pub async fn sweep_idle(&self) {
        let limit = self.config.gateway.session_idle_timeout;
        let idle: Vec<String> = lock(&self.sessions)
            .values()
            .filter(|s| s.idle_for() > limit && s.conn().mux.in_flight() == 0)
            .map(|s| s.id.clone())
            .collect();
        for id in idle {
            tracing::info!(session = %id, "closing idle session");
            self.close_session(&id).await;
        }
    }

    /// Shut every upstream down (gateway stopping).
    pub async fn shutdown(&self) {
        let all: Vec<Arc<Session>> = lock(&self.sessions).drain().map(|(_, s)| s).collect();
        let mut modern = Vec::new();
        for slot in self.modern.values() {
            modern.extend(slot.lock().await.take());
        }
        let grace = self.config.gateway.shutdown_grace;
        let mut tasks = Vec::new();
        for s in all {
            tasks.push(tokio::spawn(async move { s.conn().shutdown(grace).await }));
        }
        for m in modern {
            if let ModernUpstream::Speaks(conn) = m {
                tasks.push(tokio::spawn(async move { conn.shutdown(grace).await }));
            }
        }
        for t in tasks {
            let _ = t.await;
        }
    }

    /// How many handshake-era sessions are open.
    pub fn session_count(&self) -> usize {
        lock(&self.sessions).len()
    }

    /// The shared 2026-07-28 upstream of `server`, connecting and probing it
    /// on first use (and again after it was lost).
    pub async fn modern_upstream(
        &self,
        server: &str,
        meta: &Value,
    ) -> Result<ModernUpstream, UpstreamError> {
        let Some(slot) = self.modern.get(server) else {
            return Err(UpstreamError::Closed {
                server: server.into(),
                reason: "not configured".into(),
            });
        };
        let mut slot = slot.lock().await;
        if let Some(known) = slot.as_ref() {
            match known {
                ModernUpstream::Speaks(conn) if conn.is_closed() => {}
                other => return Ok(other.clone()),
            }
        }
        let (conn, unsolicited) = self.connect(server).await?;
        // Nothing listens for unattributed messages in this era: drain them.
        tokio::spawn(drain(unsolicited));
        let timeout = self
            .config
            .servers
            .get(server)
            .map_or(Duration::from_secs(30), |c| c.call_timeout);
        let probe = Message::request(
            Value::from(0),
            "server/discover",
            Some(raw(&serde_json::json!({ "_meta": meta }))),
        );
        let headers = modern_headers("server/discover", None, MODERN_VERSIONS[0]);
        let verdict = match conn.call(probe, None, timeout, &headers).await {
            Ok(resp) => {
                let speaks = resp
                    .result
                    .as_ref()
                    .and_then(|r| serde_json::from_str::<Value>(r.get()).ok())
                    .and_then(|v| v.get("supportedVersions").cloned())
                    .and_then(|v| v.as_array().cloned())
                    .is_some_and(|vs| {
                        vs.iter()
                            .any(|v| v.as_str().is_some_and(|v| MODERN_VERSIONS.contains(&v)))
                    });
                if speaks {
                    ModernUpstream::Speaks(conn)
                } else {
                    conn.shutdown(self.config.gateway.shutdown_grace).await;
                    ModernUpstream::Legacy
                }
            }
            // A refusal (400, 404, 405...) is a legacy server's answer to a
            // modern request.
            Err(UpstreamError::Refused { .. }) => {
                conn.shutdown(self.config.gateway.shutdown_grace).await;
                ModernUpstream::Legacy
            }
            Err(e) => {
                conn.shutdown(self.config.gateway.shutdown_grace).await;
                return Err(e);
            }
        };
        tracing::info!(
            server,
            modern = matches!(verdict, ModernUpstream::Speaks(_)),
            "probed upstream era"
        );
        *slot = Some(verdict.clone());
        Ok(verdict)
    }
}

async fn drain(mut rx: mpsc::Receiver<Message>) {
    while rx.recv().await.is_some() {}
}

/// 2026-07-28 request metadata headers for an upstream POST.
pub fn modern_headers(
    method: &str,
    name: Option<&str>,
    version: &str,
) -> super::upstream::ExtraHeaders {
    let mut h = Vec::new();
    if let Ok(v) = http::HeaderValue::try_from(version) {
        h.push((http::HeaderName::from_static("mcp-protocol-version"), v));
    }
    if let Ok(v) = http::HeaderValue::try_from(method) {
        h.push((http::HeaderName::from_static("mcp-method"), v));
    }
    if let Some(name) = name {
        if let Ok(v) = http::HeaderValue::try_from(encode_header_value(name)) {
            h.push((http::HeaderName::from_static("mcp-name"), v));
        }
    }
    h
}

/// Encode a value for `Mcp-Name` / `Mcp-Param-*`: plain when it is visible
/// ASCII without edge spaces, else the `=?base64?…?=` sentinel form.
pub fn encode_header_value(value: &str) -> String {
    use base64::Engine;
    let plain = !value.is_empty()
        && value.bytes().all(|b| (0x20..0x7f).contains(&b))
        && !value.starts_with(' ')
        && !value.ends_with(' ')
        && (!value.starts_with("=?base64?") || !value.ends_with("?="));
    if plain {
        value.to_owned()
    } else {
        format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode(value)
        )
    }
}

/// Decode an `Mcp-Name` / `Mcp-Param-*` header value.
pub fn decode_header_value(value: &str) -> Option<String> {
    use base64::Engine;
    match value
        .strip_prefix("=?base64?")
        .and_then(|v| v.strip_suffix("?="))
    {
        Some(b64) => {
            let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
            String::from_utf8(bytes).ok()
        }
        None => Some(value.to_owned()),
    }
}

/// The protocol version a 2026-07-28 request declares in `params._meta`.
pub fn declared_version(params: Option<&Value>) -> Option<String> {
    params?
        .get("_meta")?
        .get(META_PROTOCOL_VERSION)?
        .as_str()
        .map(str::to_owned)
}

fn mint_session_id() -> String {
    // 128 random bits: unguessable, and visible ASCII as the spec requires.
    let bytes: [u8; 16] = rand::random();
    hex::encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_value_encoding() {
        assert_eq!(encode_header_value("get_weather"), "get_weather");
        assert_eq!(
            encode_header_value("Hello, 世界"),
            "=?base64?SGVsbG8sIOS4lueVjA==?="
        );
        assert_eq!(encode_header_value(" padded "), "=?base64?IHBhZGRlZCA=?=");
        assert_eq!(
            encode_header_value("=?base64?literal?="),
            "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?="
        );
        for v in [
            "get_weather",
            "Hello, 世界",
            " padded ",
            "line1\nline2",
            "=?base64?literal?=",
        ] {
            assert_eq!(
                decode_header_value(&encode_header_value(v)).as_deref(),
                Some(v)
            );
        }
        assert_eq!(decode_header_value("=?base64?!!?="), None);
    }
}
