//! Tool calls on a caller's behalf (DESIGN.md section 23), in one room: the
//! rule ([`of`], which asks the same [`crate::core::config::mode`] the
//! pipeline refuses an undelegable caller with), the connections held for
//! callers ([`connections`]), the exchange at dispatch and what a 401 from
//! the server does. At dispatch, under the permit, the caller's token is
//! traded for one meant for the server
//! ([`crate::upstream::delegation::Delegator`]) and the call goes out on a
//! connection of that caller's own.
//!
//! One upstream connection per (server, principal, tenant), built without
//! the server's static headers, so its service credential is never sent
//! beside or instead of the person's token. Over a handshake-era server the
//! connection is its own upstream session, opened with the caller's token
//! (servers bind a session to the credential that opened it) and the
//! gateway's own `initialize`. It is opened at the first dispatch, never
//! before: a held or denied call opens nothing and mints nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::mpsc;

pub(crate) mod connections;

use super::gateway::Gateway;
use crate::core::identity::{Identity, SubjectToken};
use crate::enforce::permit::{Permit, Sent};
use crate::upstream::delegation::DelegationError;
use crate::upstream::{ExtraHeaders, Passthrough, UpstreamConn, UpstreamError};
use crate::wire::jsonrpc::{raw, Message};
use crate::wire::sse::UpstreamEvent;
use connections::Held;

/// How `caller`'s call to `server` goes out: on the caller's behalf
/// (`Some`), when the server delegates and the caller's verified token
/// comes from its delegation issuer ([`crate::core::config::mode`] says
/// `Delegated`); else (`None`) under the server's own credential. A caller
/// the rule refuses never gets here: the pipeline refused it
/// (`delegation_unavailable`) before anything was decided or held.
pub(crate) fn of<'a>(
    gw: &'a Gateway,
    server: &str,
    caller: &'a crate::enforce::call::Caller,
) -> Option<Delegate<'a>> {
    // Most callers carry no subject token: nothing else is looked at.
    let subject = caller.subject.as_deref()?;
    let config = gw.config().servers.get(server)?.delegation.as_ref();
    match crate::core::config::mode(config, Some(subject)) {
        Ok(crate::core::config::Mode::Delegated) => Some(Delegate {
            gw,
            server: server.to_owned(),
            identity: &caller.identity,
            subject,
        }),
        _ => None,
    }
}

/// What a call needs to go out on its caller's behalf.
pub(crate) struct Delegate<'a> {
    pub gw: &'a Gateway,
    pub server: String,
    pub identity: &'a Arc<Identity>,
    pub subject: &'a SubjectToken,
}

impl Delegate<'_> {
    /// Send the permitted call as the caller: the token (cached, or
    /// exchanged now), the caller's connection, the call. Failing before
    /// the call is written, nothing was sent.
    pub(crate) async fn call_tool(
        &self,
        permit: Permit,
        events: Option<mpsc::Sender<UpstreamEvent>>,
        timeout: Duration,
        extra: &ExtraHeaders,
    ) -> Sent {
        let delegator = self.gw.delegator();
        let now = crate::core::time::now_ms();
        let mut evidence = json!({
            "issuer": self.subject.issuer,
            "subject": self.identity.principal,
        });
        let token = match delegator
            .token(&self.server, self.identity, self.subject, now)
            .await
        {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(server = %self.server, principal = %self.identity.principal, reason = %e.reason(), "no token on the caller's behalf: {e}");
                evidence["refused"] = json!(e.reason());
                return unsent(permit, self.failure(&e)).delegated(evidence);
            }
        };
        if let (Value::Object(m), Some(e)) = (token.evidence(), evidence.as_object_mut()) {
            e.extend(m);
        }
        // The request is already in its era's shape: a 2026-07-28 request
        // (its headers name the version) goes out stateless, a
        // handshake-era one on the caller's own upstream session.
        let modern = extra
            .iter()
            .any(|(k, _)| k.as_str() == "mcp-protocol-version");
        let conn = match self.conn(&token.access_token, modern).await {
            Ok(c) => c,
            Err(e) => return unsent(permit, e).delegated(evidence),
        };
        let sent = conn.call_tool(permit, events, timeout, extra).await;
        if let Some(UpstreamError::Refused { status: 401, .. }) = sent.failure() {
            // The server does not take this token (revoked, or its keys
            // rotated): it is not used again, and never replaced by the
            // service credential.
            delegator.refused(&self.server, self.identity);
        }
        sent.delegated(evidence)
    }

    fn failure(&self, e: &DelegationError) -> UpstreamError {
        UpstreamError::Delegation {
            server: self.server.clone(),
            reason: e.reason(),
            detail: e.to_string(),
        }
    }

    /// The caller's connection to the server, sending `token` from now on:
    /// the open one, or a new one (a new upstream session over the
    /// handshake era, opened with the token).
    async fn conn(&self, token: &str, modern: bool) -> Result<Arc<UpstreamConn>, UpstreamError> {
        let key = (
            self.server.clone(),
            self.identity.principal.clone(),
            self.identity.tenant.clone(),
            modern,
        );
        let slot = self
            .gw
            .delegated()
            .slots
            .lock()
            .entry(key)
            .or_default()
            .clone();
        let mut held = slot.lock().await;
        if let Some(h) = held.as_mut().filter(|h| !h.conn.is_closed()) {
            h.conn.set_bearer(token)?;
            h.used = Instant::now();
            return Ok(h.conn.clone());
        }
        // None of the server's static headers: the caller's token is set
        // per call.
        let (tx, unsolicited) = mpsc::channel(super::gateway::UNSOLICITED_BUFFER);
        let conn = self.gw.open(&self.server, tx, true).await?;
        // Nothing listens for this connection's unattributed messages.
        tokio::spawn(async move {
            let mut rx = unsolicited;
            while rx.recv().await.is_some() {}
        });
        conn.set_bearer(token)?;
        if !modern {
            if let Err(e) = self.initialize(&conn).await {
                conn.shutdown(Duration::ZERO).await;
                // Not the call: whatever the handshake met, the call itself
                // was never sent.
                return Err(match e {
                    e if !e.dispatched() => e,
                    e => UpstreamError::Connect {
                        server: self.server.clone(),
                        reason: format!("the caller's upstream session could not be opened: {e}"),
                    },
                });
            }
        }
        tracing::info!(server = %self.server, principal = %self.identity.principal, modern, "opened a connection on the caller's behalf");
        *held = Some(Held {
            conn: conn.clone(),
            used: Instant::now(),
        });
        Ok(conn)
    }

    /// The gateway's own `initialize` and `notifications/initialized` on a
    /// new handshake-era connection (no client capabilities: the caller's
    /// client does not hear this session's server requests).
    async fn initialize(&self, conn: &UpstreamConn) -> Result<(), UpstreamError> {
        let params = json!({
            "protocolVersion": crate::wire::era::HANDSHAKE_VERSIONS[0],
            "capabilities": {},
            "clientInfo": { "name": "countersign", "version": env!("CARGO_PKG_VERSION") },
        });
        let id = Value::from(format!("countersign-delegated-{:x}", rand::random::<u64>()));
        let init = Message::request(id, "initialize", Some(raw(&params)));
        let timeout = self.gw.pipeline().call_timeout(&self.server);
        let resp = conn
            .call(
                Passthrough::checked(&self.server, init)?,
                None,
                timeout,
                &Vec::new(),
            )
            .await?;
        if let Some(e) = resp.error_code() {
            return Err(UpstreamError::Connect {
                server: self.server.clone(),
                reason: format!("the server refused the caller's initialize ({e})"),
            });
        }
        let note = Message::notification("notifications/initialized", None);
        conn.send(Passthrough::checked(&self.server, note)?, &Vec::new())
            .await
    }
}

/// The permit spent without sending: the call fails with `e`.
fn unsent(permit: Permit, e: UpstreamError) -> Sent {
    let (_request, receipt) = permit.spend();
    receipt.sent(Err(e))
}
