//! The enforcement pipeline of one `tools/call` (DESIGN.md sections 3–6),
//! as one type with no HTTP in it.
//!
//! [`Pipeline::tool_call`] runs the stages in section 3's order, each a
//! named function below:
//!
//! 1. [`Pipeline::parse`]: strict parse and digest;
//! 2. [`Pipeline::claim`]: the idempotency key;
//! 3. unattended reads: [`Pipeline::decide`], then [`Pipeline::read`]
//!    (coalesced, no durable write, retried);
//! 4. everything else, per attempt ([`Pipeline::write`]):
//!    [`Pipeline::circuit`] → [`Pipeline::lookup`] (replay, wait, conflict,
//!    `outcome_unknown`) → [`Pipeline::gate`] (policy decision, approval
//!    lookup and revalidation, with [`Pipeline::resource_version`] and its
//!    probe) → [`Pipeline::reserve`] (atomic {reserve key, consume
//!    approval}) → [`Pipeline::dispatch`] (durable `dispatched`, with the
//!    audit entry) → [`issue`] (the permit) → the upstream →
//!    [`Pipeline::record`].
//!
//! A `tools/call` reaches an upstream only as a [`super::permit::Permit`],
//! which the last stage ([`issue`]) alone constructs: it owns the canonical
//! request and the ledger ticket, and [`ToolConn::call_tool`] takes it by
//! value.
//!
//! Store, upstream and clock come in through traits ([`crate::store::Store`],
//! [`Upstream`], [`Clock`]); the audit log is optional (commands other than
//! `serve` run without one).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::book::{Ask, Book, Found};
use super::flight::{
    follow, ApprovalCode, ApprovalNote, Idempotency, Lead, Lookup, Outcome, Question, ReadLead,
    Reserve, Retention, Settled, Ticket, GATE_ROUNDS,
};
use super::outcome::CallOutcome;
use super::permit::{issue, Hold, Sent, ToolConn, Upstream};
use super::upstream::UpstreamError;
use crate::audit::trail::Trail;
use crate::audit::AuditSink;
use crate::core::annotations::Annotations;
use crate::core::approval::{Proposal, ProposalState, Risk};
use crate::core::canonical::{self, CanonicalCall};
use crate::core::catalog::{Captured, Catalog, Definition, ToolView};
use crate::core::config::{Config, VersionProbe};
use crate::core::decision::{self, Decision, Policies};
use crate::core::identity::Identity;
use crate::core::ledger::{self, Answer, Claim};
use crate::core::recovery::{classify_response, Admission, Backoff, Breaker, ResponseClass};
use crate::core::time::{ms, rfc3339, Clock};
use crate::store::{Store, StoreError};
use crate::wire::era::Era;
use crate::wire::jsonrpc::{raw, Message};

/// Who is calling, for idempotency keys: the identity and the session scope
/// (the bridge's stable scope, the session id, or none when stateless).
#[derive(Debug, Clone)]
pub struct Caller {
    /// The authenticated identity.
    pub identity: Arc<Identity>,
    /// The session scope, if any.
    pub scope: Option<String>,
}

/// One request's context: who calls, which server, which era, where
/// related server messages (progress) go, and the upstream to use.
pub struct CallCtx<'a, U> {
    /// The caller.
    pub caller: &'a Caller,
    /// The configured server name.
    pub server: &'a str,
    /// The wire era of the request.
    pub era: Era,
    /// Where progress notifications and other related messages go, when the
    /// client can receive them.
    pub events: Option<mpsc::Sender<Message>>,
    /// The upstream the call goes to.
    pub upstream: &'a U,
    /// Handshake era: the session's open questions, when its client
    /// declared elicitation (the person at the client can be asked).
    pub asks: Option<Arc<super::client::Asks>>,
}

/// The most `tools/list` pages one catalog fetch reads.
const MAX_CATALOG_PAGES: usize = 100;

/// What one attempt ended with.
enum Attempt {
    /// Final.
    Done(CallOutcome),
    /// Proven not run (or a read): try again if attempts remain.
    Retry(CallOutcome),
}

/// Why a write attempt does not go on to dispatch.
enum Stop {
    /// It ended here, with this outcome.
    Done(CallOutcome),
    /// Another process sharing the store leads the key: wait for its record
    /// to settle, then look again.
    Elsewhere,
}

/// What the approval gate chose, as a value.
enum Gate {
    /// The policies allow the call unattended.
    Pass,
    /// Run under this approved proposal, consumed with the reservation.
    Consume {
        /// The proposal.
        proposal: String,
        /// The reviewer's signed decision, for the audit entry.
        approval: Value,
    },
    /// Do not run; the key stays free.
    Refuse(Outcome),
}

/// One call on its way through the stages.
struct Call<'a, U> {
    ctx: &'a CallCtx<'a, U>,
    /// The canonical request (params replaced by the JCS form).
    request: &'a Message,
    call: &'a CanonicalCall,
    claim: &'a Claim,
    annotations: Annotations,
    /// The tool as the catalog had it when the call arrived.
    tool: ToolView,
    trail: &'a Trail,
}

/// The enforcement pipeline and what it decides with.
pub struct Pipeline {
    /// The configuration in force.
    pub config: Arc<Config>,
    /// Effective tool annotations (shared with the upstream connections,
    /// which mark a server's list stale when it says it changed).
    pub catalog: Arc<Catalog>,
    /// The idempotency ledger with in-process single-flight.
    pub flights: Arc<Idempotency>,
    /// Proposals and approvals (same store as the ledger).
    pub book: Arc<Book>,
    /// The audit log (`serve` only).
    pub audit: Option<Arc<dyn AuditSink>>,
    clock: Arc<dyn Clock>,
    /// Where first-use pins are recorded.
    store: Arc<dyn Store>,
    /// One circuit breaker per configured server. A std mutex: held for a
    /// state change, never across an await.
    breakers: HashMap<String, Mutex<Breaker>>,
    /// The policy set in force; swapped whole by a reload.
    policies: RwLock<Arc<Policies>>,
    /// One catalog fetch at a time per server. A tokio mutex: held across
    /// the `tools/list` requests.
    fetching: HashMap<String, tokio::sync::Mutex<()>>,
    /// Answers of reads whose tool has a `cache_ttl`, per (server, tool),
    /// by tenant, principal and call digest. A std mutex: held for a
    /// lookup, an insert or a clear, never across an await.
    read_cache: Mutex<HashMap<(String, String), HashMap<String, CachedRead>>>,
    /// Tools whose `cache_ttl` was ignored because they may write (said
    /// once each in the log).
    cache_refused: Mutex<std::collections::HashSet<(String, String)>>,
    /// Calls, decision and ledger latency (`/metrics`).
    pub metrics: super::metrics::Metrics,
    /// Signs the `requestState` of questions to the client.
    asker: super::client::Asker,
    /// Set when the gateway stops: held calls answer at once.
    draining: tokio::sync::watch::Sender<bool>,
}

/// A cached read answer.
struct CachedRead {
    answer: Answer,
    answered_at: String,
    expires_ms: i64,
}

impl Pipeline {
    /// A pipeline over `store`, deciding with `policies`.
    pub fn new(
        config: Arc<Config>,
        store: Arc<dyn Store>,
        policies: Policies,
        audit: Option<Arc<dyn AuditSink>>,
        clock: Arc<dyn Clock>,
    ) -> Pipeline {
        let book = Arc::new(Book::new(
            store.clone(),
            config.approvals.clone(),
            audit.clone(),
            clock.clone(),
        ));
        let flights = Idempotency::new(
            store.clone(),
            Retention {
                explicit: config.idempotency.retention,
                derived: config.idempotency.derived_ttl,
            },
        );
        let breakers = config
            .servers
            .keys()
            .map(|k| {
                let b = Breaker::new(config.circuit.failure_threshold, config.circuit.cooldown);
                (k.clone(), Mutex::new(b))
            })
            .collect();
        let catalog = Arc::new(Catalog::new(
            config
                .servers
                .iter()
                .map(|(k, v)| (k.clone(), v.tools.clone()))
                .collect(),
        ));
        let fetching = config
            .servers
            .keys()
            .map(|k| (k.clone(), tokio::sync::Mutex::new(())))
            .collect();
        Pipeline {
            metrics: super::metrics::Metrics::new(),
            read_cache: Mutex::default(),
            cache_refused: Mutex::default(),
            fetching,
            store,
            config,
            catalog,
            flights,
            book,
            audit,
            clock,
            breakers,
            policies: RwLock::new(Arc::new(policies)),
            // A key of its own until the gateway's is set: commands that
            // run no gateway never ask a client.
            asker: super::client::Asker::new(ed25519_dalek::SigningKey::from_bytes(
                &rand::random::<[u8; 32]>(),
            )),
            draining: tokio::sync::watch::Sender::new(false),
        }
    }

    /// The gateway stops: every call held for an approval answers now with
    /// what is true (`approval_pending` and its proposal; nothing ran), and
    /// calls that would be held answer so at once, rather than being cut
    /// off when the listener closes. The proposals stay: the same call,
    /// sent again to any gateway, finds its approval.
    pub fn drain(&self) {
        self.draining.send_replace(true);
    }

    /// Sign questions to the client with the gateway's key (the audit
    /// log's), so that the states it issues verify against its public key.
    pub fn set_state_key(&mut self, key: ed25519_dalek::SigningKey) {
        self.asker = super::client::Asker::new(key);
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

    /// Each server's circuit breaker state: `closed`, `open` or `half-open`.
    pub fn circuits(&self) -> std::collections::BTreeMap<String, &'static str> {
        let now = breaker_now();
        self.breakers
            .iter()
            .map(|(server, b)| {
                let state = b.lock().unwrap_or_else(|p| p.into_inner()).state_name(now);
                (server.clone(), state)
            })
            .collect()
    }

    /// Append an audit entry (buffered), when there is a log.
    pub fn audit(&self, kind: &'static str, fields: serde_json::Map<String, Value>) {
        if let Some(a) = &self.audit {
            a.record(kind, fields);
        }
    }

    /// Pins recorded on first use by earlier runs, from the store (at
    /// start, before serving). Returns how many.
    pub async fn load_pins(&self) -> Result<usize, StoreError> {
        let mut pins = Vec::new();
        for text in self.store.first_use_pins().await? {
            let pin: FirstUse = serde_json::from_str(&text).map_err(|e| StoreError::Corrupt {
                what: "tool pin",
                reason: e.to_string(),
            })?;
            pins.push((pin.server, pin.pin));
        }
        let n = pins.len();
        self.catalog.load_first_use(pins);
        Ok(n)
    }

    /// A `tools/list` page relayed to a client: learn from it (never
    /// altering it). Returns how many tools it listed.
    pub fn observe_tools_list(&self, server: &str, result: &str) -> usize {
        let captured = self.catalog.capture(server, result);
        self.noted(server, &captured);
        if !captured.learned.is_empty() {
            // Relayed pages are not awaited on: the pin is in force in
            // memory already, and recorded in the store shortly.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let store = self.store.clone();
                let server = server.to_owned();
                rt.spawn(async move { record_first_use(&*store, &server, captured.learned).await });
            }
        }
        captured.tools
    }

    /// Say what a listing changed: cached reads of those tools go, and the
    /// audit log and the log record it.
    fn noted(&self, server: &str, captured: &Captured) {
        self.clear_cache(server, Some(&captured.touched()));
        if !captured.learned.is_empty() {
            let tools: Vec<Value> = captured
                .learned
                .iter()
                .map(|d| json!({"tool": d.name(), "digest": d.digest}))
                .collect();
            let mut f = serde_json::Map::new();
            f.insert("server".into(), json!(server));
            f.insert("tools".into(), Value::Array(tools));
            self.audit("tools_learned", f);
        }
        if !captured.changed.is_empty() || !captured.vanished.is_empty() {
            for ch in &captured.changed {
                let fields: Vec<&str> = ch.diff.iter().map(|d| d.pointer.as_str()).collect();
                tracing::warn!(server, tool = %ch.tool, before = %ch.before, after = %ch.after, changed = %fields.join(" "), "tool definition changed: calls need approval until `countersign tools accept {server}/{}`", ch.tool);
            }
            for t in &captured.vanished {
                tracing::warn!(server, tool = %t, "tool no longer listed by the server");
            }
            let mut f = serde_json::Map::new();
            f.insert("server".into(), json!(server));
            f.insert("changes".into(), json!(captured.changed));
            f.insert("vanished".into(), json!(captured.vanished));
            self.audit("tools_changed", f);
        }
    }

    /// The upstream `call_timeout` of `server`.
    pub fn call_timeout(&self, server: &str) -> Duration {
        self.config
            .servers
            .get(server)
            .map_or(Duration::from_secs(30), |c| c.call_timeout)
    }

    /// Run one `tools/call` request through every stage, and count how it
    /// ended.
    pub async fn tool_call<U: Upstream>(
        &self,
        ctx: &CallCtx<'_, U>,
        request: Message,
    ) -> CallOutcome {
        let (request, call) = match self.parse(ctx.server, request) {
            Ok(c) => c,
            Err(o) => {
                self.metrics
                    .call(ctx.server, super::metrics::UNLISTED_TOOL, &o);
                return o;
            }
        };
        let mut listed = false;
        let outcome = self.stages(ctx, request, &call, &mut listed).await;
        // Only names the server lists become label values: a client
        // inventing tool names cannot grow the metrics without bound.
        let tool = if listed {
            call.tool.as_str()
        } else {
            super::metrics::UNLISTED_TOOL
        };
        self.metrics.call(ctx.server, tool, &outcome);
        outcome
    }

    async fn stages<U: Upstream>(
        &self,
        ctx: &CallCtx<'_, U>,
        request: Message,
        call: &CanonicalCall,
        listed: &mut bool,
    ) -> CallOutcome {
        let (claim, explicit) = match self.claim(ctx.caller, ctx.server, call) {
            Ok(c) => c,
            Err(o) => return o,
        };
        self.learn(ctx, &call.tool).await;
        // Read once: the same view classifies the call and feeds the
        // policies.
        let tool = self.catalog.view(ctx.server, &call.tool);
        *listed = tool.digest.is_some();
        let annotations = tool.annotations;
        let trail = Trail::new(
            self.audit.as_ref(),
            &ctx.caller.identity,
            ctx.server,
            call,
            &claim.client_key,
        );
        trail.received(call, explicit, annotations.read_only);
        let c = Call {
            ctx,
            request: &request,
            call,
            claim: &claim,
            annotations,
            tool,
            trail: &trail,
        };
        if c.tool.unavailable {
            // A pinned tool the server no longer lists: whatever now answers
            // to that name is not what was reviewed.
            c.trail
                .record("rejected", vec![("reason", json!("tool_unavailable"))]);
            return CallOutcome::ToolUnavailable {
                server: ctx.server.to_owned(),
                tool: call.tool.clone(),
            };
        }
        if let Some(reply) = &call.reserved.reply {
            if let Some(stop) = self.reply(&c, reply).await {
                return stop;
            }
        }
        if annotations.read_only && !explicit {
            match self.decide(&c) {
                Decision::Allow { .. } => return self.read(&c).await,
                Decision::Deny { .. } => return refused(&c, Outcome::Denied),
                // A read the policies want approved goes through the
                // approval book and the ledger like a write: its yes is
                // single-use too.
                Decision::Approval { .. } => {}
            }
        }
        self.write(&c).await
    }

    /// Stage "the client's answer" (2026-07-28): a retry carrying the
    /// `requestState` of a question the gateway asked. The state is checked
    /// and the answer given to the book before the ledger is looked at, so
    /// that a forged, moved, expired or used state is refused as such.
    async fn reply<U>(&self, c: &Call<'_, U>, reply: &canonical::Reply) -> Option<CallOutcome> {
        let subject = self.subject(c);
        let replied = self
            .asker
            .reply(&self.book, &subject, reply, self.clock.now_ms())
            .await;
        match replied {
            super::client::Replied::Continue => None,
            super::client::Replied::Stop(why) => {
                let detail = match &why {
                    Outcome::Confirmation(r) => Some(r.reason.clone()),
                    _ => None,
                };
                let outcome = CallOutcome::Refused {
                    why,
                    key: c.claim.client_key.clone(),
                    tool: c.call.tool.clone(),
                };
                if let Some(detail) = detail {
                    tracing::warn!(tool = %c.call.tool, principal = %c.ctx.caller.identity.principal, "client answer refused: {detail}");
                    c.trail.record(
                        "rejected",
                        vec![
                            ("reason", json!(super::answer::code_of(&outcome))),
                            ("detail", json!(detail)),
                        ],
                    );
                }
                Some(outcome)
            }
            super::client::Replied::Invalid(text) => Some(CallOutcome::Invalid(text)),
            super::client::Replied::Store(e) => Some(ledger_unavailable(c, e)),
        }
    }

    fn subject<'b, U>(&self, c: &'b Call<'b, U>) -> super::client::Subject<'b> {
        super::client::Subject {
            identity: &c.ctx.caller.identity,
            server: c.ctx.server,
            tool: &c.call.tool,
            digest: &c.call.digest,
            tool_definition: c.tool.digest.as_deref(),
            key: &c.claim.key,
        }
    }

    /// May the person at the client answer this call's proposal? The
    /// switch `approvals.client`, then `Action::"confirm"` in the policies
    /// in force now.
    fn may_confirm<U>(&self, c: &Call<'_, U>) -> bool {
        if !self.config.approvals.client {
            return false;
        }
        let allowed = self.policies().may_confirm(&facts(c));
        match allowed {
            Ok(policies) => {
                tracing::debug!(tool = %c.call.tool, policies = %policies.join(","), "the client may confirm");
                true
            }
            Err(d) => {
                tracing::debug!(tool = %c.call.tool, "the client may not confirm ({d})");
                false
            }
        }
    }

    /// Stage "know the tool": the gateway keeps each server's tool list
    /// itself, so a call is classified by what the server declares whether
    /// or not the client ever listed tools. The list is fetched (every page)
    /// when the call names a tool it lacks (at most once per
    /// `catalog.unknown_tool_interval`), when it is older than
    /// `catalog.max_age`, and after the server said it changed. One fetch at
    /// a time per server; the others wait for it. A fetch that fails leaves
    /// the cautious defaults (write-capable).
    async fn learn<U: Upstream>(&self, ctx: &CallCtx<'_, U>, tool: &str) {
        let server = ctx.server;
        let cfg = &self.config.catalog;
        let due = |now: i64| match self.catalog.fetched_at(server) {
            None => true,
            Some(at) if now.saturating_sub(at) >= ms(cfg.max_age) => true,
            Some(at) => {
                !self.catalog.knows(server, tool)
                    && now.saturating_sub(at) >= ms(cfg.unknown_tool_interval)
            }
        };
        if !due(self.clock.now_ms()) {
            return;
        }
        let Some(one) = self.fetching.get(server) else {
            return;
        };
        let _one = one.lock().await;
        // Another call may have fetched it while this one waited.
        if !due(self.clock.now_ms()) {
            return;
        }
        let started = Instant::now();
        let mut cursor = None;
        let mut tools = Vec::new();
        // A bound on pages: a server whose cursors never end cannot hold
        // the call forever.
        for _ in 0..MAX_CATALOG_PAGES {
            let page = match ctx.upstream.list_tools(cursor.take()).await {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(server, "tool list not fetched: {e}");
                    return;
                }
            };
            let Some(result) = page.result.as_ref() else {
                let error = page.error_summary().unwrap_or_else(|| "no result".into());
                tracing::warn!(server, %error, "tool list refused by the server");
                // A refusal is an answer: the next fetch waits its interval
                // (`catalog.unknown_tool_interval`) like any other, rather
                // than one per call. What was known stays; the cautious
                // defaults cover the rest.
                self.catalog.mark_fetched(server, self.clock.now_ms());
                return;
            };
            tools.extend(crate::core::catalog::page_tools(result.get()));
            cursor = serde_json::from_str::<Value>(result.get())
                .ok()
                .and_then(|v| v.get("nextCursor")?.as_str().map(str::to_owned));
            if cursor.is_none() {
                break;
            }
        }
        if cursor.is_some() {
            // Not every page was read: nothing may be taken as gone.
            tracing::warn!(
                server,
                pages = MAX_CATALOG_PAGES,
                "tool list has more pages than countersign reads"
            );
            let captured = self
                .catalog
                .capture(server, &json!({ "tools": tools }).to_string());
            self.noted(server, &captured);
            record_first_use(&*self.store, server, captured.learned).await;
        } else {
            let profile = ctx.upstream.client_profile();
            let captured = self.catalog.replace(server, &tools, &profile);
            self.noted(server, &captured);
            // Awaited: a pin must be on disk before calls are judged by it.
            record_first_use(&*self.store, server, captured.learned).await;
        }
        let tools = tools.len();
        self.catalog.mark_fetched(server, self.clock.now_ms());
        // Cached reads of tools whose definition changed or that vanished
        // were dropped by `noted`. A server that said its list changed has
        // changed under them: all of its cached reads start over. A fetch
        // made only because a new stdio session (a new child) began keeps
        // the others within their `cache_ttl`.
        if self.catalog.take_said_changed(server) {
            self.clear_cache(server, None);
        }
        tracing::debug!(server, tools, elapsed = ?started.elapsed(), "tool list fetched");
    }

    /// The `cache_ttl` configured for the call's tool.
    fn cache_ttl<U>(&self, c: &Call<'_, U>) -> Option<Duration> {
        self.config
            .servers
            .get(c.ctx.server)?
            .tools
            .get(&c.call.tool)?
            .cache_ttl
    }

    fn cache_key<U>(c: &Call<'_, U>) -> String {
        let who = &c.ctx.caller.identity;
        ledger::storage_key(&who.tenant, &who.principal, &c.call.digest)
    }

    /// Forget cached reads of `server` (of the listed tools, or all).
    fn clear_cache(&self, server: &str, tools: Option<&[String]>) {
        let mut cache = self.read_cache.lock().unwrap_or_else(|p| p.into_inner());
        match tools {
            Some(tools) => {
                for t in tools {
                    cache.remove(&(server.to_owned(), t.clone()));
                }
            }
            None => cache.retain(|(s, _), _| s != server),
        }
    }

    /// A write-capable tool with a `cache_ttl`: never cached, and said so
    /// once.
    fn refuse_cache<U>(&self, c: &Call<'_, U>) {
        if self.cache_ttl(c).is_none() {
            return;
        }
        let first = self
            .cache_refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((c.ctx.server.to_owned(), c.call.tool.clone()));
        if first {
            tracing::warn!(server = %c.ctx.server, tool = %c.call.tool, "cache_ttl ignored: the tool may write, and writes are never cached");
        }
    }

    /// Stage 1, strict parse and canonical form: the forwarded `params` are
    /// the exact JCS bytes that were hashed, so what is checked (and later
    /// approved) is byte-for-byte what the server receives. A refusal is
    /// `-32602` and nothing is sent upstream.
    #[expect(
        clippy::result_large_err,
        reason = "the Err side is the call's outcome itself, returned once per call"
    )]
    fn parse(
        &self,
        server: &str,
        mut request: Message,
    ) -> Result<(Message, CanonicalCall), CallOutcome> {
        let limits = canonical::Limits {
            max_depth: self.config.limits.max_depth,
            max_arguments_bytes: self.config.limits.max_arguments_bytes,
        };
        let params = request.params.as_ref().map_or("null", |p| p.get());
        let call = canonical::canonicalize(server, params, limits)
            .map_err(|e| CallOutcome::Invalid(e.to_string()))?;
        tracing::debug!(server, tool = %call.tool, digest = %call.digest, "canonical call");
        let forward = serde_json::value::RawValue::from_string(call.forward_params_text())
            .map_err(|e| CallOutcome::Invalid(format!("canonical form is not JSON: {e}")))?;
        request.params = Some(forward);
        Ok((request, call))
    }

    /// Stage 2, the idempotency key: explicit, or derived from who calls,
    /// in which scope, and the digest. Namespaced by tenant and principal.
    #[expect(
        clippy::result_large_err,
        reason = "the Err side is the call's outcome itself, returned once per call"
    )]
    fn claim(
        &self,
        caller: &Caller,
        server: &str,
        call: &CanonicalCall,
    ) -> Result<(Claim, bool), CallOutcome> {
        let who = &caller.identity;
        let (client_key, explicit) = ledger::idempotency_key(
            &call.reserved,
            &who.principal,
            &who.tenant,
            caller.scope.as_deref(),
            &call.digest,
        )
        .map_err(|e| CallOutcome::Invalid(e.to_string()))?;
        let claim = Claim {
            key: ledger::storage_key(&who.tenant, &who.principal, &client_key),
            client_key,
            explicit,
            digest: call.digest.clone(),
            server: server.to_owned(),
            tool: call.tool.clone(),
        };
        Ok((claim, explicit))
    }

    /// The policy decision (DESIGN.md section 4) with the policies in force
    /// now; the determining policies go to the log and the audit trail,
    /// never to the agent.
    fn decide<U>(&self, c: &Call<'_, U>) -> Decision {
        let server = c.ctx.server;
        let who = &c.ctx.caller.identity;
        let started = Instant::now();
        let decision = self.policies().decide(&facts(c));
        self.metrics.decision(started.elapsed());
        match &decision {
            Decision::Allow { policies } => {
                tracing::debug!(%server, tool = %c.call.tool, policies = %policies.join(","), "policy: allow");
            }
            Decision::Approval { policies } => {
                tracing::info!(%server, tool = %c.call.tool, policies = %policies.join(","), principal = %who.principal, "policy: approval required");
            }
            Decision::Deny { .. } => {
                tracing::info!(%server, tool = %c.call.tool, principal = %who.principal, "policy: denied ({decision})");
            }
        }
        c.trail.decision(&decision);
        decision
    }

    /// Stage 3, an unattended read: identical reads in flight share one
    /// call, and a finished read is never replayed (reads stay fresh). No
    /// durable write; any failure may be retried (reading twice is
    /// harmless).
    async fn read<U: Upstream>(&self, c: &Call<'_, U>) -> CallOutcome {
        let ttl = self.cache_ttl(c);
        let key = (c.ctx.server.to_owned(), c.call.tool.clone());
        if ttl.is_some() {
            let now = self.clock.now_ms();
            let cache = self.read_cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(hit) = cache
                .get(&key)
                .and_then(|t| t.get(&Self::cache_key(c)))
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
        let outcome = self.read_fresh(c).await;
        if let (Some(ttl), CallOutcome::Answered(m)) = (ttl, &outcome) {
            // Only a successful result is kept: an error is asked again.
            if let (Some(Answer::Result(text)), [(_, ok)]) =
                (answer_of(m), answered_fields(m).as_slice())
            {
                if *ok == json!(false) {
                    let now = self.clock.now_ms();
                    let entry = CachedRead {
                        answer: Answer::Result(text),
                        answered_at: rfc3339(now),
                        expires_ms: now.saturating_add(ms(ttl)),
                    };
                    self.read_cache
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry(key)
                        .or_default()
                        .insert(Self::cache_key(c), entry);
                }
            }
        }
        outcome
    }

    /// A read that goes upstream.
    async fn read_fresh<U: Upstream>(&self, c: &Call<'_, U>) -> CallOutcome {
        let mut lead = match self.flights.coalesce_read(c.claim) {
            Ok(lead) => Box::new(lead),
            Err(rx) => return settled(c, follow(rx).await, false),
        };
        let mut attempt = 1;
        let outcome = loop {
            let (result, back) = self.read_once(c, lead).await;
            lead = back;
            if let Some(done) = self.next_attempt(c, result, &mut attempt).await {
                break done;
            }
        };
        lead.finish(shared(&outcome));
        c.trail.record("completed", completed_fields(&outcome));
        outcome
    }

    /// One read attempt.
    async fn read_once<U: Upstream>(
        &self,
        c: &Call<'_, U>,
        lead: Box<ReadLead>,
    ) -> (Attempt, Box<ReadLead>) {
        let Some(admitted) = self.admit(c) else {
            return (Attempt::Done(open_circuit(c)), lead);
        };
        let conn = match c.ctx.upstream.ready().await {
            Ok(conn) => conn,
            Err(e) => return (Attempt::Retry(self.failed(c, e, admitted)), lead),
        };
        let permit = match issue(c.request, Hold::Read(lead)) {
            Ok(p) => p,
            Err(Hold::Read(lead)) => {
                let refusal = refused(c, Outcome::NotDispatched);
                return (Attempt::Done(refusal), lead);
            }
            Err(Hold::Write(_)) => unreachable_hold(),
        };
        let timeout = self.call_timeout(c.ctx.server);
        let sent = conn.call_tool(permit, c.ctx.events.clone(), timeout).await;
        self.read_answer(c, sent, admitted)
    }

    fn read_answer<U>(
        &self,
        c: &Call<'_, U>,
        sent: Sent,
        admitted: Admitted<'_>,
    ) -> (Attempt, Box<ReadLead>) {
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
            Err(e) => Attempt::Retry(self.failed(c, e, admitted)),
        };
        (attempt, lead)
    }

    /// Stage 4, a call through the ledger, with retries only where a retry
    /// cannot run it twice (proven not dispatched).
    async fn write<U: Upstream>(&self, c: &Call<'_, U>) -> CallOutcome {
        if !c.annotations.read_only {
            self.refuse_cache(c);
        }
        let mut attempt = 1;
        loop {
            let result = self.write_once(c).await;
            if let Some(done) = self.next_attempt(c, result, &mut attempt).await {
                return done;
            }
        }
    }

    /// One attempt through the ledger.
    async fn write_once<U: Upstream>(&self, c: &Call<'_, U>) -> Attempt {
        if let Some(refusal) = self.circuit(c) {
            return Attempt::Done(refusal);
        }
        // How long an identical call waits for another gateway's flight:
        // the call's own upstream timeout, and a margin for the answer to be
        // recorded. Then `outcome_unknown`, as for any record that does not
        // settle.
        let deadline = Instant::now() + self.call_timeout(c.ctx.server) + Duration::from_secs(5);
        loop {
            // Subscribed before the read, so a settlement between the read
            // and the wait is not missed.
            let changes = self.flights.store().subscribe();
            let lead = match self.lookup(c).await {
                Ok(lead) => lead,
                Err(Stop::Done(done)) => return Attempt::Done(done),
                Err(Stop::Elsewhere) => match self.wait_elsewhere(c, changes, deadline).await {
                    Ok(()) => continue,
                    Err(done) => return Attempt::Done(done),
                },
            };
            let ticket = match self.reserve(c, lead).await {
                Ok(t) => t,
                Err(Stop::Done(done)) => return Attempt::Done(done),
                Err(Stop::Elsewhere) => match self.wait_elsewhere(c, changes, deadline).await {
                    Ok(()) => continue,
                    Err(done) => return Attempt::Done(done),
                },
            };
            return self.dispatch(c, ticket).await;
        }
    }

    /// Wait for a record another process leads (sharing the store) to
    /// settle: woken by its own settlement (LISTEN/NOTIFY), never by polling;
    /// a lagged receiver just looks again. At the deadline, or without a
    /// way to hear, the call ends `outcome_unknown`.
    async fn wait_elsewhere<U>(
        &self,
        c: &Call<'_, U>,
        changes: Option<tokio::sync::broadcast::Receiver<crate::store::StoreEvent>>,
        deadline: Instant,
    ) -> Result<(), CallOutcome> {
        let Some(mut rx) = changes else {
            return Err(self.unsettled_elsewhere(c).await);
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(self.unsettled_elsewhere(c).await);
        }
        let key = c.claim.key.clone();
        let settled_there = async {
            loop {
                match rx.recv().await {
                    Ok(crate::store::StoreEvent::Ledger(k)) if k == key => return,
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        std::future::pending::<()>().await;
                    }
                }
            }
        };
        match tokio::time::timeout(left, settled_there).await {
            Ok(()) => Ok(()),
            Err(_) => Err(self.unsettled_elsewhere(c).await),
        }
    }

    /// The answer for a key another gateway still holds at the end of the
    /// wait. Still `reserved` there: nothing was sent, and saying
    /// `outcome_unknown` would be a definitive answer the ledger contradicts
    /// once the key is freed (found by the chaos run on PostgreSQL); the
    /// agent is told to send it again. Unreadable: the ledger is
    /// unavailable, as for any lookup that fails (nothing was sent from
    /// here, and a retry follows the ledger). `dispatched`: unknown.
    async fn unsettled_elsewhere<U>(&self, c: &Call<'_, U>) -> CallOutcome {
        match self.flights.store().get(&c.claim.key).await {
            Ok(Some(r)) if r.state == crate::core::ledger::State::Reserved => {
                refused(c, Outcome::NotDispatched)
            }
            Err(e) => ledger_unavailable(c, e),
            _ => refused(c, Outcome::Unknown),
        }
    }

    /// Ledger lookup: replay, wait for the identical call in flight, refuse
    /// a conflict or a repeat of an unknown outcome, or lead the key.
    async fn lookup<U>(&self, c: &Call<'_, U>) -> Result<Lead, Stop> {
        let started = Instant::now();
        let found = self
            .flights
            .lookup(c.claim.clone(), self.clock.now_ms())
            .await;
        self.metrics.store("lookup", started.elapsed());
        let found = found.map_err(|e| Stop::Done(ledger_unavailable(c, e)))?;
        match found {
            Lookup::Lead(lead) => Ok(lead),
            Lookup::Follow(rx) => match follow(rx).await {
                Settled::Elsewhere => Err(Stop::Elsewhere),
                s => Err(Stop::Done(settled(c, s, true))),
            },
            Lookup::Elsewhere => Err(Stop::Elsewhere),
            other => Err(Stop::Done(concluded(c, other))),
        }
    }

    /// Policy decision → approval lookup and revalidation → the atomic
    /// {reserve key, consume approval}. When the approval the gate chose is
    /// gone by the reservation (a concurrent call with another key consumed
    /// it), the gate looks again, a few times at most.
    async fn reserve<U: Upstream>(
        &self,
        c: &Call<'_, U>,
        mut lead: Lead,
    ) -> Result<Box<Ticket>, Stop> {
        let mut lost = None;
        for _ in 0..GATE_ROUNDS {
            let (proposal, approval) = match self.gate(c, lost).await {
                Gate::Pass => (None, Value::Null),
                Gate::Consume { proposal, approval } => (Some(proposal), approval),
                Gate::Refuse(why) => {
                    lead.refuse(why.clone());
                    return Err(Stop::Done(refused(c, why)));
                }
            };
            // Judged at the time of the reservation: the gate may have
            // held the call for minutes.
            let now = self.clock.now_ms();
            let started = Instant::now();
            let reserved = lead.reserve(proposal.clone(), now).await;
            self.metrics.store("reserve", started.elapsed());
            match reserved {
                Err(e) => return Err(Stop::Done(ledger_unavailable(c, e))),
                Ok(Reserve::Go(ticket)) => {
                    if let Some(proposal) = proposal {
                        let reviewer = match approval.get("confirmation") {
                            Some(conf) => format!(
                                "the person at the client ({})",
                                conf.get("principal").and_then(Value::as_str).unwrap_or("?")
                            ),
                            None => approval
                                .get("statement")
                                .and_then(|s| s.get("reviewer"))
                                .and_then(Value::as_str)
                                .unwrap_or("?")
                                .to_owned(),
                        };
                        tracing::info!(server = %c.ctx.server, tool = %c.call.tool, %proposal, %reviewer, key = %c.claim.client_key, "approved: running the call (the approval is used up)");
                        self.book.changed(&proposal).await;
                        // With the reviewer's signed statement: the entry
                        // shows on its own which yes this execution used.
                        c.trail.record(
                            "approval_consumed",
                            vec![("proposal_id", json!(proposal)), ("approval", approval)],
                        );
                    }
                    return Ok(ticket);
                }
                Ok(Reserve::Lost(back, state)) => {
                    tracing::info!(tool = %c.call.tool, lost = state.as_str(), "the approval went to a concurrent call; looking again");
                    lead = back;
                    lost = Some(state);
                }
                // Another gateway reserved the key first: wait for it.
                Ok(Reserve::Bound(Lookup::Elsewhere)) => return Err(Stop::Elsewhere),
                Ok(Reserve::Bound(found)) => return Err(Stop::Done(concluded(c, found))),
            }
        }
        // The approval kept slipping away: fail closed.
        lead.refuse(Outcome::NotDispatched);
        Err(Stop::Done(refused(c, Outcome::NotDispatched)))
    }

    /// The gate: the policy decision in force now, and for a call that
    /// needs a yes, the approval it may consume. Such a call is held up to
    /// `approvals.hold` (progress notifications when it sent a
    /// `progressToken`) and proceeds the moment a reviewer approves.
    async fn gate<U: Upstream>(&self, c: &Call<'_, U>, lost: Option<ProposalState>) -> Gate {
        if let Some(state) = lost {
            tracing::debug!(lost = state.as_str(), "looking for an approval again");
        }
        let hold = self.config.approvals.hold;
        let hold_until = Instant::now() + hold;
        // Set up on the first look only: an unattended call (the hot path)
        // pays for neither the subscription nor re-reading its params.
        let mut waiting = None;
        let mut progress = 0u64;
        // The proposal last put to the client: asked once per proposal.
        let mut asked: Option<String> = None;
        loop {
            // The tool as the server lists it now: a definition that
            // changed while the call waited is not the one approved.
            self.learn(c.ctx, &c.call.tool).await;
            let tool = self.catalog.view(c.ctx.server, &c.call.tool);
            if tool.unavailable {
                return Gate::Refuse(Outcome::NotDispatched);
            }
            // Revalidation right before execution: the policies in force now.
            let policies = match self.decide(c) {
                Decision::Allow { .. } => return Gate::Pass,
                Decision::Deny { .. } => return Gate::Refuse(Outcome::Denied),
                Decision::Approval { policies } => policies,
            };
            // Subscribed before the first look, so a decision made between
            // the look and the wait is not missed.
            let (changes, token) = waiting.get_or_insert_with(|| {
                let token = c
                    .request
                    .params_value()
                    .and_then(|p| p.get("_meta")?.get("progressToken").cloned());
                (self.book.subscribe(), token)
            });
            let version = match self.resource_version(c).await {
                Ok(v) => v,
                Err(reason) => {
                    tracing::warn!(tool = %c.call.tool, "resource version: {reason}");
                    return Gate::Refuse(Outcome::Approval(ApprovalNote {
                        code: ApprovalCode::Stale,
                        proposal_id: None,
                        revises: None,
                        reason: Some(reason),
                        by_client: false,
                    }));
                }
            };
            let ask = Ask {
                identity: &c.ctx.caller.identity,
                server: c.ctx.server,
                tool: &c.call.tool,
                arguments: &c.call.arguments,
                digest: &c.call.digest,
                resource_version: version.as_deref(),
                tool_definition: tool.digest.as_deref(),
                definition_change: self.catalog.change_of(c.ctx.server, &c.call.tool),
                risk: risk(c.annotations),
                policies: &policies,
                key: &c.claim.key,
                client_key: &c.claim.client_key,
            };
            let reviewers = self.policies();
            // Entries so far go first: the proposal this call may create
            // follows its cause in the log.
            c.trail.flush();
            let proposal = match self.book.find(&ask, reviewers.reviewers()).await {
                Ok(Found::Usable(p)) if p.confirmation.is_some() && !self.may_confirm(c) => {
                    // A yes from the client counts only while the policies
                    // in force let the requester confirm this call.
                    if let Err(e) = self
                        .book
                        .invalidate(&p, "the policies no longer let the requester confirm this call in the client")
                        .await
                    {
                        tracing::error!("approval book unavailable, refusing: {e}");
                        return Gate::Refuse(Outcome::NotDispatched);
                    }
                    continue;
                }
                Ok(Found::Usable(p)) => {
                    let approval = match &p.confirmation {
                        Some(conf) => json!({ "channel": "client", "confirmation": conf }),
                        None => serde_json::to_value(&p.decision).unwrap_or(Value::Null),
                    };
                    return Gate::Consume {
                        proposal: p.id,
                        approval,
                    };
                }
                Ok(Found::Refuse(note)) => return Gate::Refuse(Outcome::Approval(note)),
                Ok(Found::Wait(p)) => p,
                Err(e) => {
                    tracing::error!("approval book unavailable, refusing: {e}");
                    return Gate::Refuse(Outcome::NotDispatched);
                }
            };
            if asked.as_deref() != Some(proposal.id.as_str()) {
                asked = Some(proposal.id.clone());
                if let Some(question) = self.ask_client(c, &proposal).await {
                    return Gate::Refuse(Outcome::Ask(Box::new(question)));
                }
            }
            // Hold: wait for this proposal to be decided, sending progress.
            let mut draining = self.draining.subscribe();
            loop {
                let left = hold_until.saturating_duration_since(Instant::now());
                if left.is_zero() || *draining.borrow() {
                    return Gate::Refuse(Outcome::Approval(super::book::pending(&proposal)));
                }
                let tick = self.config.approvals.progress_interval.min(left);
                tokio::select! {
                    _ = draining.changed() => {
                        tracing::info!(proposal = %proposal.id, "shutting down: a held call answers approval_pending");
                        return Gate::Refuse(Outcome::Approval(super::book::pending(&proposal)));
                    }
                    change = changes.recv() => match change {
                        Ok(e) if e.proposal.id == proposal.id && e.proposal.state != ProposalState::Pending => break,
                        Ok(_) => {}
                        // Missed some: look again rather than wait blind.
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                            return Gate::Refuse(Outcome::Approval(super::book::pending(&proposal)));
                        }
                    },
                    () = tokio::time::sleep(tick) => {
                        if let (Some(token), Some(events)) = (&*token, &c.ctx.events) {
                            progress += 1;
                            let waited = hold.saturating_sub(hold_until.saturating_duration_since(Instant::now()));
                            let params = json!({
                                "progressToken": token,
                                "progress": progress,
                                "message": format!(
                                    "waiting for a reviewer to approve proposal {} ({}s so far)",
                                    proposal.id, waited.as_secs()
                                ),
                            });
                            let _ = events
                                .send(Message::notification("notifications/progress", Some(raw(&params))))
                                .await;
                        }
                    }
                }
            }
        }
    }

    /// Put `p` to the person at the client when the policies permit
    /// `Action::"confirm"` and the client declared elicitation (DESIGN.md
    /// section 14). Handshake era: an `elicitation/create` on the call's
    /// response stream, and the call is held as for a reviewer (the answer
    /// comes back through the book). 2026-07-28: the question to return as
    /// `input_required`. A client that cannot be asked gets the reviewer
    /// path, unchanged.
    async fn ask_client<U>(&self, c: &Call<'_, U>, p: &Proposal) -> Option<Question> {
        let now = self.clock.now_ms();
        let asked = |via: &str| {
            c.trail.record(
                "confirmation_asked",
                vec![("proposal_id", json!(p.id)), ("via", json!(via))],
            );
            tracing::info!(proposal = %p.id, tool = %c.call.tool, via, "asking the person at the client");
        };
        match c.ctx.era {
            Era::Modern => {
                let capabilities = c
                    .call
                    .reserved
                    .other_meta
                    .get("io.modelcontextprotocol/clientCapabilities");
                if !crate::core::confirm::declares_elicitation(capabilities) || !self.may_confirm(c)
                {
                    return None;
                }
                match self
                    .asker
                    .question(&self.book, &self.subject(c), p, now)
                    .await
                {
                    Ok(q) => {
                        asked("input_required");
                        Some(q)
                    }
                    Err(e) => {
                        tracing::warn!(proposal = %p.id, "could not ask the client, the proposal waits for reviewers: {e}");
                        None
                    }
                }
            }
            Era::Handshake => {
                let (Some(asks), Some(events)) = (&c.ctx.asks, &c.ctx.events) else {
                    return None;
                };
                if asks.asking(&p.id, now) || !self.may_confirm(c) {
                    return None;
                }
                let expires = now.saturating_add(ms(self.config.approvals.client_ttl));
                let id = asks.ask(&p.id, &c.ctx.caller.identity.principal, expires, now)?;
                let request = super::client::elicitation(
                    &id,
                    &super::client::question_params(p, asks.with_mode),
                );
                if events.send(request).await.is_ok() {
                    asked("elicitation/create");
                }
                None
            }
        }
    }

    /// The resource version this call acts on: the operator's probe when one
    /// is configured (the gateway reads it itself), else the client's
    /// explicit `_meta` binding, else none. Errors fail closed.
    async fn resource_version<U: Upstream>(
        &self,
        c: &Call<'_, U>,
    ) -> Result<Option<String>, String> {
        let explicit = explicit_version(c.call).map(str::to_owned);
        let Some(probe) = self
            .config
            .servers
            .get(c.ctx.server)
            .and_then(|s| s.tools.get(&c.call.tool))
            .and_then(|t| t.version_probe.as_ref())
        else {
            return Ok(explicit);
        };
        let read = self.probe(c, probe).await?;
        if let Some(e) = explicit.filter(|e| *e != read) {
            return Err(format!(
                "the call binds resource version `{e}`, but the resource is at `{read}` now"
            ));
        }
        tracing::debug!(tool = %c.call.tool, version = %read, "resource version");
        Ok(Some(read))
    }

    /// The version probe, a stage of its own: a read-only tool of the same
    /// server, called as the requester through the parse, key, policy and
    /// read stages (never the approval gate: a probe that the policies do
    /// not allow unattended does not run).
    async fn probe<U: Upstream>(
        &self,
        c: &Call<'_, U>,
        probe: &VersionProbe,
    ) -> Result<String, String> {
        self.learn(c.ctx, &probe.tool).await;
        // A probe that could write is not a probe: never run it.
        let tool = self.catalog.view(c.ctx.server, &probe.tool);
        let annotations = tool.annotations;
        if !annotations.read_only {
            return Err(format!(
                "version probe `{}` is not a read-only tool (list tools first, or set read_only = true for it in the config)",
                probe.tool
            ));
        }
        let mut arguments = serde_json::Map::new();
        for (name, pointer) in &probe.arguments {
            let v = c.call.arguments.pointer(pointer).ok_or_else(|| {
                format!("version probe argument `{name}` points at `{pointer}`, which the call does not have")
            })?;
            arguments.insert(name.clone(), v.clone());
        }
        let mut meta = c.call.reserved.other_meta.clone();
        meta.remove("progressToken");
        let params = json!({ "name": probe.tool, "arguments": arguments, "_meta": meta });
        let request = Message::request(
            json!(format!("countersign-probe-{:x}", rand::random::<u64>())),
            "tools/call",
            Some(raw(&params)),
        );
        let failed = || format!("version probe `{}` failed", probe.tool);
        let (request, call) = self.parse(c.ctx.server, request).map_err(|_| failed())?;
        let (claim, _) = self
            .claim(c.ctx.caller, c.ctx.server, &call)
            .map_err(|_| failed())?;
        let trail = Trail::new(
            self.audit.as_ref(),
            &c.ctx.caller.identity,
            c.ctx.server,
            &call,
            &claim.client_key,
        );
        trail.received(&call, false, true);
        let pc = Call {
            ctx: c.ctx,
            request: &request,
            call: &call,
            claim: &claim,
            annotations,
            tool,
            trail: &trail,
        };
        match self.decide(&pc) {
            Decision::Allow { .. } => {}
            _ => {
                return Err(format!(
                    "version probe `{}` is not allowed unattended by the policies",
                    probe.tool
                ))
            }
        }
        // Never from the read cache: the version must be the one now.
        let CallOutcome::Answered(answer) = self.read_fresh(&pc).await else {
            return Err(failed());
        };
        let result: Value = answer
            .result
            .as_ref()
            .and_then(|r| serde_json::from_str(r.get()).ok())
            .ok_or_else(failed)?;
        if result.get("isError").and_then(Value::as_bool) == Some(true) {
            return Err(format!("version probe `{}` answered an error", probe.tool));
        }
        match result.pointer(&probe.pointer) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(Value::Null) | None => Err(format!(
                "version probe `{}` has nothing at `{}`",
                probe.tool, probe.pointer
            )),
            Some(other) => Ok(canonical::jcs(other)),
        }
    }

    /// Durable `dispatched` (with the audit entry that records it), the
    /// permit, the send, and the answer on the ledger.
    async fn dispatch<U: Upstream>(&self, c: &Call<'_, U>, mut ticket: Box<Ticket>) -> Attempt {
        // The breaker's trial is taken here, right before the upstream, so
        // that a call the ledger or the gate answered never uses it.
        let Some(admitted) = self.admit(c) else {
            ticket.not_dispatched().await;
            return Attempt::Done(open_circuit(c));
        };
        let conn = match c.ctx.upstream.ready().await {
            Ok(conn) => conn,
            Err(e) => {
                ticket.not_dispatched().await;
                c.trail
                    .record("not_dispatched", vec![("reason", json!(e.to_string()))]);
                return Attempt::Retry(self.failed(c, e, admitted));
            }
        };
        // The audit entry that records the dispatch (and the call's entries
        // before it) is on disk before a byte goes upstream: committed in the
        // ledger's outbox with the `dispatched` record, one fsync for both.
        // The audit writer appends it to the log and clears the row once
        // its own file is fsynced; startup repairs a crash in between.
        let started = Instant::now();
        let durable = match c.trail.stage_dispatch() {
            None => ticket.dispatch().await,
            Some((log, Ok(staged))) => {
                let outbox = Some((staged.id, staged.text.clone()));
                let r = ticket.dispatch_with(outbox).await;
                match &r {
                    Ok(()) => log.record_staged(staged),
                    Err(_) => log.unstage(staged),
                }
                r
            }
            // An audit log without the ledger's outbox cannot make the
            // dispatch entry durable with the dispatch (`serve` always
            // attaches it): no evidence, no dispatch.
            Some((_, Err(_))) => {
                tracing::error!("refusing a call: the audit log has no ledger outbox attached");
                ticket.not_dispatched().await;
                return Attempt::Done(CallOutcome::AuditUnavailable);
            }
        };
        self.metrics.store("dispatched", started.elapsed());
        if let Err(e) = durable {
            // Nothing was sent: free the key now, before answering, so a
            // retry finds it free (not a reservation without a leader,
            // which reads as an unknown outcome).
            ticket.not_dispatched().await;
            c.trail
                .record("not_dispatched", vec![("reason", json!(e.to_string()))]);
            return Attempt::Done(ledger_unavailable(c, e));
        }
        let permit = match issue(c.request, Hold::Write(ticket)) {
            Ok(p) => p,
            Err(Hold::Write(ticket)) => {
                ticket.not_dispatched().await;
                return Attempt::Done(refused(c, Outcome::NotDispatched));
            }
            Err(Hold::Read(_)) => unreachable_hold(),
        };
        let timeout = self.call_timeout(c.ctx.server);
        let sent = conn.call_tool(permit, c.ctx.events.clone(), timeout).await;
        self.record(c, sent, admitted).await
    }

    /// Record the answer: `complete`, `not_dispatched` (refused unprocessed
    /// or proven unsent), or `unknown` (sent, answer lost).
    async fn record<U>(&self, c: &Call<'_, U>, sent: Sent, admitted: Admitted<'_>) -> Attempt {
        let ticket = match sent.hold {
            Hold::Write(t) => t,
            Hold::Read(_) => unreachable_hold(),
        };
        match sent.answer {
            Ok(resp) => {
                admitted.record(true);
                let class = classify_response(&resp);
                if class == ResponseClass::Refused {
                    // The server refused it unprocessed: provably not run.
                    ticket.not_dispatched().await;
                    c.trail.record(
                        "not_dispatched",
                        vec![("reason", json!("refused unprocessed by the server"))],
                    );
                } else if class == ResponseClass::Cancelled {
                    // A cancellation answer is not the call's answer: the
                    // server may have run it first. Never final, never
                    // replayed: unknown until an operator reconciles it.
                    ticket.unknown().await;
                    let reason = "the server answered that the request was cancelled";
                    c.trail
                        .record("outcome_unknown", vec![("reason", json!(reason))]);
                    return Attempt::Done(CallOutcome::Failed(UpstreamError::Lost {
                        server: c.ctx.server.to_owned(),
                        reason: reason.to_owned(),
                    }));
                } else if let Some(answer) = answer_of(&resp) {
                    let started = Instant::now();
                    let recorded = ticket.complete(answer).await;
                    self.metrics.store("complete", started.elapsed());
                    if let Err(e) = recorded {
                        // The call ran, but its answer is not in the ledger:
                        // acknowledging it now would let a retry be told
                        // `outcome_unknown` after a success (found by the
                        // chaos run, a database restart mid-answer). Say
                        // unknown now, as every retry will.
                        let reason = format!(
                            "the server answered, but the gateway could not record the answer ({e}); the call ran"
                        );
                        c.trail
                            .record("outcome_unknown", vec![("reason", json!(reason))]);
                        return Attempt::Done(CallOutcome::Failed(UpstreamError::Lost {
                            server: c.ctx.server.to_owned(),
                            reason,
                        }));
                    }
                    tracing::info!(server = %c.ctx.server, tool = %c.call.tool, key = %c.claim.client_key, "executed: the write ran and its answer is recorded");
                    c.trail.record("completed", answered_fields(&resp));
                } else {
                    ticket.unknown().await;
                    c.trail
                        .record("outcome_unknown", vec![("reason", json!("no answer"))]);
                }
                Attempt::Done(CallOutcome::Answered(resp))
            }
            Err(e) if !e.class().possibly_executed() => {
                ticket.not_dispatched().await;
                c.trail
                    .record("not_dispatched", vec![("reason", json!(e.to_string()))]);
                Attempt::Retry(self.failed(c, e, admitted))
            }
            Err(e) => {
                ticket.unknown().await;
                tracing::warn!(server = %c.ctx.server, tool = %c.call.tool, key = %c.claim.client_key, "outcome unknown: {e}");
                c.trail
                    .record("outcome_unknown", vec![("reason", json!(e.to_string()))]);
                Attempt::Done(self.failed(c, e, admitted))
            }
        }
    }

    /// After an attempt: the outcome to give, or `None` after pausing when a
    /// retry is due (`retry.*`: capped exponential backoff with jitter).
    async fn next_attempt<U>(
        &self,
        c: &Call<'_, U>,
        result: Attempt,
        attempt: &mut u32,
    ) -> Option<CallOutcome> {
        let cfg = &self.config.retry;
        let backoff = Backoff {
            max_attempts: cfg.max_attempts,
            base: cfg.base_delay,
            max: cfg.max_delay,
        };
        match result {
            Attempt::Done(o) => Some(o),
            Attempt::Retry(o) if *attempt >= backoff.max_attempts => Some(o),
            Attempt::Retry(_) => {
                *attempt += 1;
                let pause = backoff.delay(*attempt, rand::random::<f64>());
                tracing::info!(server = %c.ctx.server, attempt = *attempt, pause = %humantime::format_duration(pause), "retrying a call that is safe to retry");
                tokio::time::sleep(pause).await;
                None
            }
        }
    }

    /// The breaker's fast check, before anything is reserved: `Some`
    /// refusal while the circuit is open. Takes no trial.
    fn circuit<U>(&self, c: &Call<'_, U>) -> Option<CallOutcome> {
        let breaker = self.breakers.get(c.ctx.server)?;
        let open = breaker
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_open(breaker_now());
        open.then(|| open_circuit(c))
    }

    /// The breaker's admission, right before the upstream (`None`: the
    /// circuit refuses). The trial of a half-open circuit is taken here and
    /// only here.
    fn admit<'b, U>(&'b self, c: &Call<'b, U>) -> Option<Admitted<'b>> {
        let server = c.ctx.server;
        let Some(breaker) = self.breakers.get(server) else {
            return Some(Admitted {
                server,
                breaker: None,
                trial: false,
            });
        };
        let admission = change_breaker(server, breaker, |b| b.admit(breaker_now()));
        (admission != Admission::Refuse).then_some(Admitted {
            server,
            breaker: Some(breaker),
            trial: admission == Admission::Trial,
        })
    }

    /// An upstream failure, counted by the breaker when it says the
    /// upstream is unhealthy (otherwise the admission is returned unused).
    fn failed<U>(&self, c: &Call<'_, U>, e: UpstreamError, admitted: Admitted<'_>) -> CallOutcome {
        if e.class().unhealthy() {
            admitted.record(false);
        }
        tracing::warn!(server = %c.ctx.server, dispatched = e.dispatched(), "upstream call failed: {e}");
        CallOutcome::Failed(e)
    }
}

/// The breakers' clock: tokio's, so that a test with a paused runtime can
/// move a cooldown along without waiting for it.
fn breaker_now() -> Instant {
    tokio::time::Instant::now().into_std()
}

fn open_circuit<U>(c: &Call<'_, U>) -> CallOutcome {
    CallOutcome::CircuitOpen {
        server: c.ctx.server.to_owned(),
    }
}

/// Change a breaker, logging the change of state it makes (every one).
fn change_breaker<T>(
    server: &str,
    breaker: &Mutex<Breaker>,
    f: impl FnOnce(&mut Breaker) -> T,
) -> T {
    let now = breaker_now();
    let mut b = breaker.lock().unwrap_or_else(|p| p.into_inner());
    let before = b.state_name(now);
    let out = f(&mut b);
    let after = b.state_name(now);
    if before != after {
        tracing::warn!(server, from = before, to = after, "circuit breaker");
    }
    out
}

/// The breaker's leave for one attempt to reach the upstream. It records
/// how the attempt went; dropped without a record (the attempt never
/// reached the upstream, or failed in a way that says nothing of its
/// health), a trial gives its slot back, so the breaker never stays
/// half-open with a trial nobody will finish.
struct Admitted<'a> {
    server: &'a str,
    breaker: Option<&'a Mutex<Breaker>>,
    trial: bool,
}

impl Admitted<'_> {
    fn record(mut self, ok: bool) {
        if let Some(b) = self.breaker.take() {
            change_breaker(self.server, b, |b| {
                if ok {
                    b.success();
                } else {
                    b.failure(breaker_now());
                }
            });
        }
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        if let (true, Some(b)) = (self.trial, self.breaker) {
            change_breaker(self.server, b, Breaker::release);
        }
    }
}

#[track_caller]
fn unreachable_hold() -> ! {
    // INVARIANT: a read's permit comes back as a read, a write's as a write;
    // the pipeline builds both, and the upstream can only hand them back.
    unreachable!("a ledger hold came back of the other kind")
}

/// `_meta["dev.countersign/resource-version"]`: a version the client binds
/// explicitly (DESIGN.md section 6).
/// The facts of a call the policies decide on (the tool as the catalog had
/// it when the call arrived).
fn facts<'b, U>(c: &'b Call<'b, U>) -> decision::Call<'b> {
    decision::Call {
        identity: &c.ctx.caller.identity,
        server: c.ctx.server,
        tool: &c.call.tool,
        annotations: c.annotations,
        definition_changed: c.tool.changed,
        arguments: &c.call.arguments,
        digest: &c.call.digest,
        resource_version: explicit_version(c.call),
    }
}

fn explicit_version(call: &CanonicalCall) -> Option<&str> {
    call.reserved
        .meta
        .get("dev.countersign/resource-version")
        .and_then(Value::as_str)
}

fn risk(a: Annotations) -> Risk {
    if a.read_only {
        Risk::Read
    } else if a.destructive {
        Risk::Destructive
    } else {
        Risk::Write
    }
}

fn refused<U>(c: &Call<'_, U>, why: Outcome) -> CallOutcome {
    // Audit entries of refusals the ledger or a stale version made (policy
    // and approval refusals have theirs).
    match &why {
        Outcome::Drift => c.trail.record("rejected", vec![("reason", json!("drift"))]),
        Outcome::Remap => c.trail.record("rejected", vec![("reason", json!("remap"))]),
        Outcome::Unknown => c
            .trail
            .record("outcome_unknown", vec![("repeat", json!(true))]),
        Outcome::Approval(note) if note.code == ApprovalCode::Stale => c.trail.record(
            "rejected",
            vec![
                ("reason", json!("stale")),
                ("detail", json!(note.reason)),
                ("proposal_id", json!(note.proposal_id)),
            ],
        ),
        _ => {}
    }
    CallOutcome::Refused {
        why,
        key: c.claim.client_key.clone(),
        tool: c.call.tool.clone(),
    }
}

/// A replay or a stop the ledger concluded.
fn concluded<U>(c: &Call<'_, U>, found: Lookup) -> CallOutcome {
    match found {
        Lookup::Replay {
            answer,
            answered_at,
        } => {
            c.trail
                .record("replayed", vec![("first_answered_at", json!(answered_at))]);
            CallOutcome::Replayed {
                answer,
                key: c.claim.client_key.clone(),
                answered_at,
            }
        }
        Lookup::Stop(why) => refused(c, why),
        // Not produced once the key is bound; fail closed all the same.
        Lookup::Lead(_) | Lookup::Follow(_) | Lookup::Elsewhere => refused(c, Outcome::Unknown),
    }
}

/// What a follower gets from its leader: a write's answer as a replay, a
/// read's as a joined answer, or the leader's verdict.
fn settled<U>(c: &Call<'_, U>, s: Settled, write: bool) -> CallOutcome {
    match s {
        Settled::Answered {
            answer,
            answered_at,
        } if write => CallOutcome::Replayed {
            answer,
            key: c.claim.client_key.clone(),
            answered_at,
        },
        Settled::Answered { answer, .. } => CallOutcome::Joined(answer),
        Settled::Verdict(why) => CallOutcome::Refused {
            why,
            key: c.claim.client_key.clone(),
            tool: c.call.tool.clone(),
        },
        // Only a write's follower waits for another process; anything else
        // that meets one never runs it again.
        Settled::Elsewhere => CallOutcome::Refused {
            why: Outcome::Unknown,
            key: c.claim.client_key.clone(),
            tool: c.call.tool.clone(),
        },
    }
}

fn ledger_unavailable<U>(c: &Call<'_, U>, e: StoreError) -> CallOutcome {
    tracing::error!(tool = %c.call.tool, "refusing a call: {e}");
    CallOutcome::LedgerUnavailable(e)
}

/// The part of a response the ledger keeps.
fn answer_of(resp: &Message) -> Option<Answer> {
    match (&resp.result, &resp.error) {
        (Some(r), _) => Some(Answer::Result(r.get().to_owned())),
        (None, Some(e)) => Some(Answer::Error(e.get().to_owned())),
        _ => None,
    }
}

/// What a read's followers get.
fn shared(outcome: &CallOutcome) -> Settled {
    match outcome {
        CallOutcome::Answered(resp) => match answer_of(resp) {
            Some(answer) => Settled::Answered {
                answer,
                answered_at: String::new(),
            },
            None => Settled::Verdict(Outcome::NotDispatched),
        },
        _ => Settled::Verdict(Outcome::NotDispatched),
    }
}

/// `completed` fields of an upstream answer: whether it is an error.
fn answered_fields(answer: &Message) -> Vec<(&'static str, Value)> {
    let is_error = answer.error.is_some()
        || answer.result.as_ref().is_some_and(|r| {
            serde_json::from_str::<Value>(r.get())
                .ok()
                .and_then(|v| v.get("isError")?.as_bool())
                .unwrap_or(false)
        });
    vec![("is_error", json!(is_error))]
}

/// `completed` fields of any outcome: whether it is an error, and the code
/// when countersign itself answered.
fn completed_fields(outcome: &CallOutcome) -> Vec<(&'static str, Value)> {
    match outcome {
        CallOutcome::Answered(m) => answered_fields(m),
        other => {
            let mut f = vec![("is_error", json!(true))];
            if let Some(code) = super::answer::code_of(other) {
                f.push(("code", json!(code)));
            }
            f
        }
    }
}

/// A first-use pin as stored.
#[derive(serde::Serialize, serde::Deserialize)]
struct FirstUse {
    server: String,
    pin: Definition,
}

/// Record first-use pins in the store, in one durable commit. A failure is
/// logged: the pins hold in memory for this run, and the next run pins on
/// first use again.
async fn record_first_use(store: &dyn Store, server: &str, learned: Vec<Definition>) {
    if learned.is_empty() {
        return;
    }
    let pins: Vec<(String, String)> = learned
        .into_iter()
        .filter_map(|pin| {
            let key = json!([server, pin.name()]).to_string();
            let value = FirstUse {
                server: server.to_owned(),
                pin,
            };
            Some((key, serde_json::to_string(&value).ok()?))
        })
        .collect();
    let n = pins.len();
    if let Err(e) = store.pin_first_use(pins).await {
        tracing::error!(server, tools = n, "first-use pins not recorded: {e}");
    }
}
