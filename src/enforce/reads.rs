//! The read path as a service: an unattended read goes upstream with no
//! durable write, identical reads in flight share one call, any failure
//! may be retried (reading twice is harmless), and a tool with a
//! `cache_ttl` is answered from a cache of successful results.
//!
//! The cache is keyed per (server, tool), then by tenant, principal and call
//! digest, so one principal's answer is never another's. Catalog learning
//! says which entries a listing made stale ([`Reads::forget`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::json;

use super::breakers::{Admitted, Breakers};
use super::call::Call;
use super::flight::{follow, Idempotency, ReadLead};
use super::learn::Stale;
use super::outcome::CallOutcome;
use super::outcome::{answer_of, is_error};
use super::permit::{issue, Hold, Sent, ToolConn, Upstream};
use super::retry::{failed, next_attempt, unreachable_hold, Attempt};
use super::upstream::UpstreamError;
use crate::core::config::Config;
use crate::core::ledger::{self, Answer};
use crate::core::recovery::{classify_response, ResponseClass};
use crate::core::refusal::Outcome;
use crate::core::time::{ms, rfc3339, Clock};

/// A cached read answer.
struct CachedRead {
    answer: Answer,
    answered_at: String,
    expires_ms: i64,
}

/// Cached answers per (server, tool), by tenant, principal and digest.
type Cache = HashMap<(String, String), HashMap<String, CachedRead>>;

/// The read path and its cache.
pub(crate) struct Reads {
    config: Arc<Config>,
    clock: Arc<dyn Clock>,
    flights: Arc<Idempotency>,
    breakers: Arc<Breakers>,
    /// A blocking mutex: held for a lookup, an insert or a clear, never
    /// across an await.
    cache: Mutex<Cache>,
    /// Tools whose `cache_ttl` was ignored because they may write (said
    /// once each in the log).
    refused: Mutex<HashSet<(String, String)>>,
}

impl Reads {
    /// The read path over `flights` (single-flight of identical reads) and
    /// `breakers`.
    pub(crate) fn new(
        config: Arc<Config>,
        clock: Arc<dyn Clock>,
        flights: Arc<Idempotency>,
        breakers: Arc<Breakers>,
    ) -> Reads {
        Reads {
            config,
            clock,
            flights,
            breakers,
            cache: Mutex::default(),
            refused: Mutex::default(),
        }
    }

    /// An unattended read: from the cache when the tool has a `cache_ttl`
    /// and a fresh answer is there, else upstream (and kept, when it is a
    /// successful result and the tool has a `cache_ttl`).
    pub(crate) async fn read<U: Upstream>(&self, c: &Call<'_, U>) -> CallOutcome {
        let ttl = self.ttl(c.ctx.server, &c.call.tool);
        // Built only for a tool that is cached.
        let key = || (c.ctx.server.to_owned(), c.call.tool.clone());
        if ttl.is_some() {
            let now = self.clock.now_ms();
            let cache = self.cache.lock();
            if let Some(hit) = cache
                .get(&key())
                .and_then(|t| t.get(&entry_key(c)))
                .filter(|hit| hit.expires_ms > now)
            {
                c.trail.record(
                    "completed",
                    vec![("is_error", json!(false)), ("cached", json!(true))],
                );
                return CallOutcome::Cached {
                    answer: hit.answer.clone(),
                    answered_at: hit.answered_at.clone(),
                };
            }
        }
        let outcome = self.fresh(c).await;
        if let (Some(ttl), CallOutcome::Answered(m)) = (ttl, &outcome) {
            // Only a successful result is kept: an error is asked again.
            if let (false, Some(Answer::Result(text))) = (is_error(m), answer_of(m)) {
                let now = self.clock.now_ms();
                let entry = CachedRead {
                    answer: Answer::Result(text),
                    answered_at: rfc3339(now),
                    expires_ms: now.saturating_add(ms(ttl)),
                };
                self.cache
                    .lock()
                    .entry(key())
                    .or_default()
                    .insert(entry_key(c), entry);
            }
        }
        outcome
    }

    /// A read that goes upstream, never from the cache (the version probe
    /// reads the version as it is now).
    pub(crate) async fn fresh<U: Upstream>(&self, c: &Call<'_, U>) -> CallOutcome {
        let mut lead = match self.flights.coalesce_read(c.claim) {
            Ok(lead) => Box::new(lead),
            Err(rx) => return c.settled(follow(rx).await, false),
        };
        let mut attempt = 1;
        let outcome = loop {
            let (result, back) = self.once(c, lead).await;
            lead = back;
            if let Some(done) =
                next_attempt(&self.config.retry, c.ctx.server, result, &mut attempt).await
            {
                break done;
            }
        };
        lead.finish(|| outcome.shared());
        c.trail.record("completed", outcome.completed_fields());
        outcome
    }

    /// One read attempt.
    async fn once<U: Upstream>(
        &self,
        c: &Call<'_, U>,
        lead: Box<ReadLead>,
    ) -> (Attempt, Box<ReadLead>) {
        let server = c.ctx.server;
        let Some(admitted) = self.breakers.admit(server) else {
            return (Attempt::Done(c.open_circuit()), lead);
        };
        // The upstream's futures (kilobytes) are boxed where they are
        // awaited: the call's own futures above them stay small, and a
        // future is copied whole wherever it is moved.
        let conn = match Box::pin(c.ctx.upstream.ready()).await {
            Ok(conn) => conn,
            Err(e) => return (Attempt::Retry(failed(server, e, admitted)), lead),
        };
        let permit = match issue(c.request, Hold::Read(lead)) {
            Ok(p) => p,
            Err(Hold::Read(lead)) => {
                let refusal = c.refused(Outcome::NotDispatched);
                return (Attempt::Done(refusal), lead);
            }
            Err(Hold::Write(_)) => unreachable_hold(),
        };
        let timeout = self.config.call_timeout(server);
        let mut sent = Box::pin(conn.call_tool(permit, c.ctx.events.clone(), timeout)).await;
        if let Some(evidence) = sent.delegated.take() {
            c.trail.delegated(evidence);
        }
        answered(server, sent, admitted)
    }

    /// Forget the cached reads a listing made stale.
    pub(crate) fn forget(&self, server: &str, stale: &Stale) {
        let mut cache = self.cache.lock();
        match stale {
            Stale::Tools(tools) => {
                for t in tools {
                    cache.remove(&(server.to_owned(), t.clone()));
                }
            }
            Stale::Server => cache.retain(|(s, _), _| s != server),
        }
    }

    /// A write-capable tool with a `cache_ttl`: never cached, and said so
    /// once.
    pub(crate) fn refuse_cache(&self, server: &str, tool: &str) {
        if self.ttl(server, tool).is_none() {
            return;
        }
        let first = self
            .refused
            .lock()
            .insert((server.to_owned(), tool.to_owned()));
        if first {
            tracing::warn!(
                server,
                tool,
                "cache_ttl ignored: the tool may write, and writes are never cached"
            );
        }
    }

    /// The `cache_ttl` configured for `tool`.
    fn ttl(&self, server: &str, tool: &str) -> Option<Duration> {
        self.config.servers.get(server)?.tools.get(tool)?.cache_ttl
    }
}

/// A cache entry's key within its (server, tool): the ledger's storage key
/// of the digest, so tenant and principal are part of it.
fn entry_key<U>(c: &Call<'_, U>) -> String {
    let who = &c.ctx.caller.identity;
    ledger::storage_key(&who.tenant, &who.principal, &c.call.digest)
}

/// A read's answer: final, or retried when the server said it was
/// transient or cancelled, or when the upstream failed.
fn answered(server: &str, sent: Sent, admitted: Admitted<'_>) -> (Attempt, Box<ReadLead>) {
    let lead = match sent.hold {
        Hold::Read(lead) => lead,
        Hold::Write(_) => unreachable_hold(),
    };
    let attempt = match sent.answer {
        Ok(resp) => {
            admitted.record(true);
            let class = classify_response(&resp);
            if matches!(class, ResponseClass::Transient | ResponseClass::Cancelled) {
                Attempt::Retry(CallOutcome::Answered(resp))
            } else {
                Attempt::Done(CallOutcome::Answered(resp))
            }
        }
        // No token for the caller: asking the provider again at once would
        // get the same answer.
        Err(e @ UpstreamError::Delegation { .. }) => Attempt::Done(failed(server, e, admitted)),
        Err(e) => Attempt::Retry(failed(server, e, admitted)),
    };
    (attempt, lead)
}
