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

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use serde_json::{json, Value};

use super::book::{Ask, Book, Found};
use super::breakers::{Admitted, Breakers};
use super::call::{
    answer_of, answered_fields, concluded, explicit_version, facts, failed, ledger_unavailable,
    next_attempt, open_circuit, refused, risk, settled, unreachable_hold, Attempt, Call,
};
pub use super::call::{CallCtx, Caller};
use super::flight::{
    follow, ApprovalCode, ApprovalNote, Idempotency, Lead, Lookup, Outcome, Question, Reserve,
    Retention, Settled, Ticket, GATE_ROUNDS,
};
use super::learn::Learner;
use super::outcome::CallOutcome;
use super::permit::{issue, Hold, Sent, ToolConn, Upstream};
use super::reads::Reads;
use super::upstream::UpstreamError;
use crate::audit::trail::Trail;
use crate::audit::AuditSink;
use crate::core::approval::{Proposal, ProposalState};
use crate::core::canonical::{self, CanonicalCall};
use crate::core::catalog::Catalog;
use crate::core::config::{Config, VersionProbe};
use crate::core::decision::{Decision, Policies};
use crate::core::ledger::{self, Claim};
use crate::core::recovery::{classify_response, ResponseClass};
use crate::core::time::{ms, Clock};
use crate::store::{Store, StoreError};
use crate::wire::era::Era;
use crate::wire::jsonrpc::{raw, Message};

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

/// The enforcement pipeline and the services it decides with.
pub struct Pipeline {
    config: Arc<Config>,
    /// Catalog learning and first-use pins.
    learner: Learner,
    /// The idempotency ledger with in-process single-flight.
    flights: Arc<Idempotency>,
    /// Proposals and approvals (same store as the ledger).
    book: Arc<Book>,
    /// The read path and its cache.
    reads: Reads,
    /// One circuit breaker per configured server.
    breakers: Arc<Breakers>,
    /// The audit log (`serve` only).
    audit: Option<Arc<dyn AuditSink>>,
    clock: Arc<dyn Clock>,
    /// The policy set in force; swapped whole by a reload.
    policies: RwLock<Arc<Policies>>,
    /// Calls, decision and ledger latency (`/metrics`).
    metrics: super::metrics::Metrics,
    /// Signs the `requestState` of questions to the client.
    asker: super::client::Asker,
    /// Set when the gateway stops: held calls answer at once.
    draining: tokio::sync::watch::Sender<bool>,
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
            clock.clone(),
        );
        let breakers = Arc::new(Breakers::new(&config));
        let reads = Reads::new(
            config.clone(),
            clock.clone(),
            flights.clone(),
            breakers.clone(),
        );
        let learner = Learner::new(config.clone(), store, audit.clone(), clock.clone());
        Pipeline {
            metrics: super::metrics::Metrics::new(),
            learner,
            reads,
            config,
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

    /// The configuration in force.
    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// Effective tool annotations and pins (shared with the upstream
    /// connections, which mark a server's list stale when it says it
    /// changed).
    pub fn catalog(&self) -> &Arc<Catalog> {
        self.learner.catalog()
    }

    /// Proposals and approvals.
    pub fn book(&self) -> &Arc<Book> {
        &self.book
    }

    /// The store behind the ledger, the book and the pins.
    pub fn store(&self) -> &Arc<dyn Store> {
        self.flights.store()
    }

    /// The audit log, when there is one (`serve`).
    pub fn audit_sink(&self) -> Option<&Arc<dyn AuditSink>> {
        self.audit.as_ref()
    }

    /// The clock the pipeline judges time by.
    pub fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    /// The Prometheus metrics the pipeline keeps.
    pub fn metrics(&self) -> &super::metrics::Metrics {
        &self.metrics
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
        self.policies.read().clone()
    }

    /// Put a new policy set in force (a successful reload).
    pub fn set_policies(&self, policies: Policies) {
        *self.policies.write() = Arc::new(policies);
    }

    /// Each server's circuit breaker state: `closed`, `open` or `half-open`.
    pub fn circuits(&self) -> std::collections::BTreeMap<String, &'static str> {
        self.breakers.states()
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
        self.learner.load_pins().await
    }

    /// A `tools/list` page relayed to a client: learn from it (never
    /// altering it). Returns how many tools it listed.
    pub fn observe_tools_list(&self, server: &str, result: &str) -> usize {
        let (tools, stale) = self.learner.observe(server, result);
        self.reads.forget(server, &stale);
        tools
    }

    /// The upstream `call_timeout` of `server`.
    pub fn call_timeout(&self, server: &str) -> Duration {
        self.config.call_timeout(server)
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
        let tool = self.catalog().view(ctx.server, &call.tool);
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
                Decision::Allow { .. } => return self.reads.read(&c).await,
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

    /// Stage "know the tool": the catalog is fetched when the call needs
    /// it ([`Learner::learn`]), and the cached reads it made stale go.
    async fn learn<U: Upstream>(&self, ctx: &CallCtx<'_, U>, tool: &str) {
        let stale = self.learner.learn(ctx.server, tool, ctx.upstream).await;
        self.reads.forget(ctx.server, &stale);
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

    /// Stage 4, a call through the ledger, with retries only where a retry
    /// cannot run it twice (proven not dispatched).
    async fn write<U: Upstream>(&self, c: &Call<'_, U>) -> CallOutcome {
        if !c.annotations.read_only {
            self.reads.refuse_cache(c.ctx.server, &c.call.tool);
        }
        let mut attempt = 1;
        loop {
            let result = self.write_once(c).await;
            if let Some(done) =
                next_attempt(&self.config.retry, c.ctx.server, result, &mut attempt).await
            {
                return done;
            }
        }
    }

    /// One attempt through the ledger.
    async fn write_once<U: Upstream>(&self, c: &Call<'_, U>) -> Attempt {
        // The breaker's fast check, before anything is reserved.
        if self.breakers.is_open(c.ctx.server) {
            return Attempt::Done(open_circuit(c));
        }
        // How long an identical call waits for another gateway's flight:
        // the call's own upstream timeout, and a margin for the answer to be
        // recorded. Then `outcome_unknown`, as for any record that does not
        // settle.
        let deadline = Instant::now() + self.call_timeout(c.ctx.server) + Duration::from_secs(5);
        loop {
            // Subscribed before the read, so a settlement between the read
            // and the wait is not missed.
            let changes = self.store().subscribe();
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
        match self.store().get(&c.claim.key).await {
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
            let tool = self.catalog().view(c.ctx.server, &c.call.tool);
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
                definition_change: self.catalog().change_of(c.ctx.server, &c.call.tool),
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
        let tool = self.catalog().view(c.ctx.server, &probe.tool);
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
        let CallOutcome::Answered(answer) = self.reads.fresh(&pc).await else {
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
        let Some(admitted) = self.breakers.admit(c.ctx.server) else {
            ticket.not_dispatched().await;
            return Attempt::Done(open_circuit(c));
        };
        let conn = match c.ctx.upstream.ready().await {
            Ok(conn) => conn,
            Err(e) => {
                ticket.not_dispatched().await;
                c.trail
                    .record("not_dispatched", vec![("reason", json!(e.to_string()))]);
                return Attempt::Retry(failed(c.ctx.server, e, admitted));
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
                Attempt::Retry(failed(c.ctx.server, e, admitted))
            }
            Err(e) => {
                ticket.unknown().await;
                tracing::warn!(server = %c.ctx.server, tool = %c.call.tool, key = %c.claim.client_key, "outcome unknown: {e}");
                c.trail
                    .record("outcome_unknown", vec![("reason", json!(e.to_string()))]);
                Attempt::Done(failed(c.ctx.server, e, admitted))
            }
        }
    }
}
