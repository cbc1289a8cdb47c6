//! The upstream connections the gateway holds beside its client sessions:
//! how a connection to a server is opened (the shared kind, or one
//! caller's), the shared 2026-07-28 connection of each server, and the
//! handshake-era sessions it holds for 2026-07-28 clients of a server that
//! speaks only the older era.
use super::*;

/// What the gateway learned about a server's 2026-07-28 support.
#[derive(Clone)]
pub(crate) enum ModernUpstream {
    /// It answered `server/discover` with a modern version: shared connection.
    Speaks(Arc<UpstreamConn>),
    /// It is handshake-only; modern clients get the version error.
    Legacy,
}

/// Whose bridged session: (server, principal, tenant).
pub(super) type BridgeKey = (String, String, String);

/// A handshake-era upstream session held for 2026-07-28 clients, and what
/// the upstream's `initialize` said (to answer their `server/discover`).
#[derive(Clone)]
pub(crate) struct Bridge {
    /// The session (registered like a client's: swept when idle, healed
    /// when lost, closed at shutdown).
    pub session: Arc<Session>,
    /// The upstream's `initialize` result.
    pub init: Value,
}

impl Gateway {
    /// Open an upstream connection to `server` whose server messages of no
    /// request go to `unsolicited`.
    pub(crate) async fn connect_with(
        &self,
        server: &str,
        unsolicited: mpsc::Sender<Message>,
    ) -> Result<Arc<UpstreamConn>, UpstreamError> {
        self.open(server, unsolicited, false).await
    }

    /// A connection to `server`: the shared kind, or one caller's
    /// (`delegated`).
    pub(crate) async fn open(
        &self,
        server: &str,
        unsolicited: mpsc::Sender<Message>,
        delegated: bool,
    ) -> Result<Arc<UpstreamConn>, UpstreamError> {
        let cfg = self
            .config
            .servers
            .get(server)
            .ok_or_else(|| UpstreamError::Closed {
                server: server.into(),
                reason: "not configured".into(),
            })?;
        // The server's word that its tools changed makes the gateway fetch
        // the list again before the next call.
        let catalog = Arc::clone(self.pipeline.catalog());
        let name = server.to_owned();
        let stale = Box::new(move || {
            catalog.mark_stale(&name);
            tracing::info!(server = %name, "the server's tool list changed: it is fetched again before the next call");
        });
        let max_line = self.config.limits.max_line_bytes;
        if delegated {
            UpstreamConn::connect_delegated(server, cfg, &self.http, max_line, unsolicited, stale)
                .await
        } else {
            UpstreamConn::connect(server, cfg, &self.http, max_line, unsolicited, stale).await
        }
    }

    /// Open an upstream connection to `server`.
    pub(crate) async fn connect(
        &self,
        server: &str,
    ) -> Result<(Arc<UpstreamConn>, mpsc::Receiver<Message>), UpstreamError> {
        let (tx, rx) = mpsc::channel(UNSOLICITED_BUFFER);
        let conn = self.connect_with(server, tx).await?;
        Ok((conn, rx))
    }

    /// A handshake-era client's session with a server that refused its
    /// `initialize` and speaks 2026-07-28: the gateway answers `initialize`
    /// from what `server/discover` said, and the session's requests go over
    /// the server's shared 2026-07-28 connection with the client's
    /// capabilities and info in each request's `_meta` (see
    /// [`Session::enveloped`]). `None`: the server does not speak
    /// 2026-07-28 either, and the refusal stands.
    pub(super) async fn open_reverse(
        &self,
        server: &str,
        identity: &Arc<Identity>,
        scope: Option<String>,
        id: Value,
        params: Option<&RawValue>,
    ) -> Option<Opened> {
        let Ok(ModernUpstream::Speaks(conn)) = self.modern_upstream(server).await else {
            return None;
        };
        let discovered = self
            .discovered
            .lock()
            .get(server)
            .cloned()
            .unwrap_or(Value::Null);
        let params: Value = params
            .and_then(|p| serde_json::from_str(p.get()).ok())
            .unwrap_or(Value::Null);
        let asked = params.get("protocolVersion").and_then(Value::as_str);
        let version = asked
            .filter(|v| crate::wire::era::HANDSHAKE_VERSIONS.contains(v))
            .unwrap_or(crate::wire::era::HANDSHAKE_VERSIONS[0]);
        let mut envelope = own_envelope(MODERN_VERSIONS[0]);
        for (key, field) in [
            (crate::wire::era::META_CLIENT_CAPABILITIES, "capabilities"),
            (crate::wire::era::META_CLIENT_INFO, "clientInfo"),
        ] {
            if let Some(v) = params.get(field) {
                envelope.insert(key.into(), v.clone());
            }
        }
        let mut result = serde_json::json!({
            "protocolVersion": version,
            "capabilities": discovered.get("capabilities").cloned().unwrap_or_else(|| serde_json::json!({})),
            "serverInfo": discovered.get("serverInfo").cloned().unwrap_or_else(|| serde_json::json!({"name": server, "version": ""})),
        });
        if let Some(i) = discovered.get("instructions") {
            result["instructions"] = i.clone();
        }
        let (unsolicited, standalone) = mpsc::channel(UNSOLICITED_BUFFER);
        let sid = mint_session_id();
        let session = Arc::new(Session {
            scope: scope.unwrap_or_else(|| sid.clone()),
            id: sid.clone(),
            server: server.into(),
            identity: identity.clone(),
            conn: Mutex::new(conn),
            unsolicited,
            healing: tokio::sync::Mutex::new(()),
            protocol_version: Mutex::new(Some(version.to_owned())),
            init_params: Mutex::new(Some(raw(&params))),
            standalone: Arc::new(tokio::sync::Mutex::new(standalone)),
            sse: Mutex::default(),
            sse_sent: tokio::sync::Notify::new(),
            asks: None,
            envelope: Some(envelope),
            last_used: Mutex::new(Instant::now()),
        });
        self.sessions.lock().insert(sid, session.clone());
        tracing::info!(server, session = %session.id, principal = %identity.principal, "the upstream speaks only 2026-07-28: this handshake-era session is carried over it");
        Some(Opened::Session(
            session,
            Message::response(id, raw(&result)),
        ))
    }

    /// The handshake-era session that carries the 2026-07-28 requests of
    /// `identity` to `server`, a server that speaks only the handshake era:
    /// opened on first use with the gateway's own `initialize` (the latest
    /// handshake version, no client capabilities: a stateless client cannot
    /// answer a server's requests on a session it does not know of), healed
    /// like any session (re-initialized after a 404), and opened again
    /// after it was swept.
    ///
    /// Scoped to (server, principal, tenant): what a server keeps per
    /// session (subscriptions, log level, its own state) is never shared
    /// between principals or tenants, and one principal's stateless
    /// requests see one session, as they would see one stateless server. It
    /// is not an idempotency scope: keys stay those of a stateless request.
    /// Err: the upstream's refusal of `initialize`, or the gateway's account
    /// of the failure, as the answer to `id`.
    pub(crate) async fn bridged(
        &self,
        server: &str,
        identity: &Arc<Identity>,
        meta: &Value,
        id: Value,
    ) -> Result<Bridge, Message> {
        let key = (
            server.to_owned(),
            identity.principal.clone(),
            identity.tenant.clone(),
        );
        let slot = self.bridges.lock().entry(key).or_default().clone();
        let mut slot = slot.lock().await;
        if let Some(b) = slot.as_ref() {
            // Swept or closed: its upstream is gone, open another.
            if self.sessions.lock().contains_key(&b.session.id) {
                b.session.touch();
                return Ok(b.clone());
            }
        }
        let client_info = meta
            .get(crate::wire::era::META_CLIENT_INFO)
            .cloned()
            .unwrap_or_else(|| serde_json::json!({ "name": "countersign", "version": env!("CARGO_PKG_VERSION") }));
        let params = serde_json::json!({
            "protocolVersion": crate::wire::era::HANDSHAKE_VERSIONS[0],
            "capabilities": {},
            "clientInfo": client_info,
        });
        let init = Message::request(id.clone(), "initialize", Some(raw(&params)));
        match self
            .open_session(server, identity.clone(), None, init)
            .await
        {
            Opened::Session(session, resp) => {
                let init = resp
                    .result
                    .as_ref()
                    .and_then(|r| serde_json::from_str::<Value>(r.get()).ok())
                    .unwrap_or(Value::Null);
                // The session is the gateway's: its upstream gets the
                // `initialized` the client would have sent.
                let note = Message::notification("notifications/initialized", None);
                if let Err(e) = session
                    .conn()
                    .send(
                        Passthrough::checked(server, note).map_err(|e| {
                            answer::upstream_failure(id.clone(), "initialize", &e, Era::Modern)
                        })?,
                        &Vec::new(),
                    )
                    .await
                {
                    self.close_session(&session.id).await;
                    return Err(answer::upstream_failure(id, "initialize", &e, Era::Modern));
                }
                tracing::info!(server, session = %session.id, principal = %identity.principal, "holding a handshake-era session for a 2026-07-28 client");
                let bridge = Bridge { session, init };
                *slot = Some(bridge.clone());
                Ok(bridge)
            }
            Opened::Refused(m) => Err(m),
        }
    }

    /// The shared 2026-07-28 upstream of `server`, connecting and probing it
    /// on first use (and again after it was lost).
    pub(crate) async fn modern_upstream(
        &self,
        server: &str,
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
        let timeout = self.config.call_timeout(server);
        // The gateway's own request, with its own envelope: the verdict is
        // shared by every client of this server.
        let probe = Message::request(
            Value::from(0),
            "server/discover",
            Some(raw(
                &serde_json::json!({ "_meta": own_envelope(MODERN_VERSIONS[0]) }),
            )),
        );
        let headers = modern_headers("server/discover", None, MODERN_VERSIONS[0]);
        let verdict = match conn
            .call(
                Passthrough::checked(server, probe)?,
                None,
                timeout,
                &headers,
            )
            .await
        {
            Ok(resp) => {
                let result = resp
                    .result
                    .as_ref()
                    .and_then(|r| serde_json::from_str::<Value>(r.get()).ok());
                if let Some(r) = &result {
                    self.discovered.lock().insert(server.to_owned(), r.clone());
                }
                let speaks = result
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
