//! The enforcement pipeline of one `tools/call` (DESIGN.md sections 3–6),
//! as one type with no HTTP in it: the order of the stages, each run by a
//! service that owns its state.
//!
//! [`Pipeline::tool_call`] runs them in section 3's order:
//!
//! 1. `parse` ([`super::call`]): strict parse and digest;
//! 2. `claim` ([`super::call`]): the idempotency key;
//! 3. `learn` ([`super::learn`]): the server's tool list, fetched when the
//!    call needs it;
//! 4. `reply`: a 2026-07-28 retry carrying the answer to the gateway's
//!    question;
//! 5. unattended reads: the decision ([`super::judge`]), then the read
//!    path ([`super::reads`]: cached, coalesced, no durable write,
//!    retried);
//! 6. everything else goes through the ledger, attempt by attempt
//!    ([`super::writes`]): the breaker's fast check → the ledger lookup
//!    (replay, wait, conflict, `outcome_unknown`) → the gate
//!    ([`super::gate`]: policy decision, approval lookup and revalidation,
//!    the resource version and its probe) → the atomic {reserve key,
//!    consume approval} → durable `dispatched`, with the audit entry →
//!    [`super::permit::issue`] (the permit) → the upstream → the answer on
//!    the ledger.
//!
//! A `tools/call` reaches an upstream only as a [`super::permit::Permit`],
//! which the last stage alone constructs: it owns the canonical request and
//! the ledger ticket, and [`super::permit::ToolConn::call_tool`] takes it
//! by value.
//!
//! Store, upstream and clock come in through traits ([`crate::store::Store`],
//! [`Upstream`], [`Clock`]); the audit log is optional (commands other than
//! `serve` run without one).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::book::Book;
use super::breakers::Breakers;
use super::call::{claim_with, explicit_key, parse, read_claim, Call};
pub use super::call::{CallCtx, Caller};
use super::client::{Asker, Replied};
use super::flight::{Idempotency, Retention};
use super::gate::Gate;
use super::judge::Judge;
use super::learn::Learner;
use super::metrics::Metrics;
use super::outcome::CallOutcome;
use super::permit::Upstream;
use super::reads::Reads;
use super::writes::Writes;
use crate::audit::trail::Trail;
use crate::audit::AuditSink;
use crate::core::canonical::{self, CanonicalCall};
use crate::core::catalog::Catalog;
use crate::core::config::Config;
use crate::core::decision::{Decision, Policies};
use crate::core::refusal::Outcome;
use crate::core::time::Clock;
use crate::store::{Store, StoreError};
use crate::wire::jsonrpc::Message;

/// The enforcement pipeline and the services it runs a call through.
pub struct Pipeline {
    config: Arc<Config>,
    /// Some server delegates (then each call looks its server up).
    delegates: bool,
    /// Catalog learning and first-use pins.
    learner: Arc<Learner>,
    /// The policy decision.
    judge: Arc<Judge>,
    /// The read path and its cache.
    reads: Arc<Reads>,
    /// The write path (with the gate).
    writes: Writes,
    /// The idempotency ledger with in-process single-flight.
    flights: Arc<Idempotency>,
    /// Proposals and approvals (same store as the ledger).
    book: Arc<Book>,
    /// One circuit breaker per configured server.
    breakers: Arc<Breakers>,
    /// The audit log (`serve` only).
    audit: Option<Arc<dyn AuditSink>>,
    clock: Arc<dyn Clock>,
    /// Calls, decision and ledger latency (`/metrics`).
    metrics: Arc<Metrics>,
    /// Signs the `requestState` of questions to the client.
    asker: Arc<Asker>,
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
        let book = Arc::new(
            Book::new(
                store.clone(),
                config.approvals.clone(),
                audit.clone(),
                clock.clone(),
            )
            .notifying(
                config.notify.webhooks.clone(),
                config.audit.redaction().to_vec(),
            ),
        );
        let flights = Idempotency::new(
            store.clone(),
            Retention {
                explicit: config.idempotency.retention,
                derived: config.idempotency.derived_ttl,
            },
            clock.clone(),
        );
        let metrics = Arc::new(Metrics::new());
        let announcer = Arc::new(super::announce::Announcer::new(
            store.clone(),
            config.notify.webhooks.clone(),
            clock.clone(),
            book.queued(),
        ));
        let breakers = Arc::new(Breakers::new(&config).announcing(announcer.clone()));
        let reads = Arc::new(Reads::new(
            config.clone(),
            clock.clone(),
            flights.clone(),
            breakers.clone(),
        ));
        let guards = Arc::new(super::guards::Guarding {
            config: config.clone(),
            store: store.clone(),
            metrics: metrics.clone(),
            clock: clock.clone(),
        });
        let learner = Arc::new(
            Learner::new(config.clone(), store, audit.clone(), clock.clone())
                .announcing(announcer.clone()),
        );
        let judge = Arc::new(Judge::new(config.clone(), policies, metrics.clone()));
        // A key of its own until the gateway's is set: commands that run no
        // gateway never ask a client.
        let asker = Arc::new(Asker::new(ed25519_dalek::SigningKey::from_bytes(
            &rand::random::<[u8; 32]>(),
        )));
        let draining = tokio::sync::watch::Sender::new(false);
        let gate = Gate {
            config: config.clone(),
            clock: clock.clone(),
            judge: judge.clone(),
            learner: learner.clone(),
            reads: reads.clone(),
            book: book.clone(),
            asker: asker.clone(),
            draining: draining.subscribe(),
            audit: audit.clone(),
            guards,
        };
        let writes = Writes {
            config: config.clone(),
            clock: clock.clone(),
            flights: flights.clone(),
            book: book.clone(),
            breakers: breakers.clone(),
            reads: reads.clone(),
            metrics: metrics.clone(),
            announcer,
            gate,
        };
        Pipeline {
            delegates: config.servers.values().any(|s| s.delegation.is_some()),
            config,
            learner,
            judge,
            reads,
            writes,
            flights,
            book,
            breakers,
            audit,
            clock,
            metrics,
            asker,
            draining,
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
    pub fn metrics(&self) -> &Metrics {
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
        self.asker = Arc::new(Asker::new(key));
        self.writes.set_asker(self.asker.clone());
    }

    /// The policy set in force now.
    pub fn policies(&self) -> Arc<Policies> {
        self.judge.policies()
    }

    /// Put a new policy set in force (a successful reload).
    pub fn set_policies(&self, policies: Policies) {
        self.judge.set_policies(policies);
    }

    /// Decide every call under `policies` too, without enforcing them (the
    /// shadow set, `[policy] shadow`), or stop (`None`).
    pub fn set_shadow(&self, policies: Option<Policies>) {
        self.judge.shadow().set(policies);
    }

    /// Keep each call's decision inputs in the store (`[policy] inputs`):
    /// starts the task that writes them and collects old ones. Call it in a
    /// runtime, once.
    pub fn start_inputs(&self, clock: Arc<dyn Clock>) {
        let p = &self.config.policy;
        let (recorder, task) = super::inputs::Recorder::new(
            self.store().clone(),
            clock,
            p.inputs_retention,
            p.inputs_max_rows,
        );
        tokio::spawn(task);
        self.judge.record_inputs(recorder);
    }

    /// Write the decision inputs recorded so far (at a clean stop).
    pub async fn flush_inputs(&self) {
        self.judge.flush_inputs().await;
    }

    /// The shadow policy set, when one is loaded.
    pub fn shadow(&self) -> Option<Arc<Policies>> {
        self.judge.shadow().policies()
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

    /// The delegation of `server`, if it has one.
    fn delegation(&self, server: &str) -> Option<&crate::core::config::DelegationConfig> {
        if !self.delegates {
            return None;
        }
        self.config.servers.get(server)?.delegation.as_ref()
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
        let (request, call) = match parse(&self.config, ctx.server, request) {
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
        let explicit_key = match explicit_key(call) {
            Ok(k) => k,
            Err(o) => return o,
        };
        self.learn(ctx, &call.tool).await;
        // Read once: the same view classifies the call and feeds the
        // policies.
        let tool = self.catalog().view(ctx.server, &call.tool);
        *listed = tool.digest.is_some();
        let annotations = tool.annotations;
        // An unattended read derives no idempotency key: it never touches
        // the ledger (a read the policies hold or deny gets its key then).
        // Traces on or off, the same: observability never changes what the
        // audit log records.
        let unattended =
            annotations.read_only && explicit_key.is_none() && call.reserved.reply.is_none();
        let (claim, explicit) = if unattended {
            (read_claim(ctx.caller, ctx.server, call), false)
        } else {
            claim_with(ctx.caller, ctx.server, call, explicit_key)
        };
        if crate::telemetry::on() {
            // On the request's SERVER span: the key as a digest only (a key
            // may carry an order number or a customer's id); the arguments
            // only when the operator opted in. An unattended read's key is
            // derived for the span alone.
            let span = tracing::Span::current();
            let derived;
            let key = if unattended {
                derived = claim_with(ctx.caller, ctx.server, call, None).0;
                &derived.key
            } else {
                &claim.key
            };
            span.record("countersign.key_digest", crate::telemetry::key_digest(key));
            if crate::telemetry::records_arguments() {
                // The collector is someone else's system: the values
                // `audit.redact` names are not sent there either.
                let redact = self.config.audit.redaction();
                if redact.is_empty() {
                    span.record("gen_ai.tool.call.arguments", call.arguments_jcs.as_str());
                } else {
                    let shown = crate::core::redact::redacted(&call.arguments, redact);
                    span.record(
                        "gen_ai.tool.call.arguments",
                        crate::core::canonical::jcs(&shown).as_str(),
                    );
                }
            }
        }
        let trail = Trail::new(
            self.audit.as_ref(),
            &ctx.caller.identity,
            ctx.server,
            call,
            (!unattended).then_some(claim.client_key.as_str()),
        );
        trail.received(explicit, annotations.read_only);
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
            // A tool the server's complete listing lacks (pinned and gone,
            // never listed, or a lookalike of a listed name): whatever
            // answers to that name is not a tool anyone reviewed, and no
            // proposal is made that a reviewer could misread.
            let mut fields = vec![("reason", json!("tool_unavailable"))];
            if let Some(l) = &c.tool.lookalike {
                fields.push(("looks_like", json!(l)));
            }
            c.trail.record("rejected", fields);
            return CallOutcome::ToolUnavailable {
                server: ctx.server.to_owned(),
                tool: call.tool.clone(),
                lookalike: c.tool.lookalike.clone(),
            };
        }
        // A server called as the person who asks: a caller whose
        // credential cannot be traded at its provider is refused before
        // anything is decided or held (a reviewer never approves a call
        // that could only run under the gateway's own credential).
        if let Some(d) = self.delegation(ctx.server) {
            if let Err(why) = crate::core::config::mode(Some(d), ctx.caller.subject.as_deref()) {
                c.trail.record(
                    "rejected",
                    vec![
                        ("reason", json!("delegation_unavailable")),
                        ("issuer", json!(why.issuer)),
                    ],
                );
                return CallOutcome::DelegationUnavailable {
                    server: ctx.server.to_owned(),
                    issuer: why.issuer,
                };
            }
        }
        if let Some(reply) = &call.reserved.reply {
            if let Some(stop) = Box::pin(self.reply(&c, reply)).await {
                return stop;
            }
        }
        // The write path's future is large and the read path's small: boxed,
        // a read does not carry (and move) the write path's state.
        if !annotations.read_only || explicit {
            return Box::pin(self.writes.write(&c)).await;
        }
        // A read under a budget or an effect key is counted like a write:
        // through the ledger, with a key.
        let guarded = self.writes.gate.guards.covers(ctx.server, &call.tool);
        let decision = self.judge.decide(&c);
        if let (Decision::Allow { .. }, false) = (&decision, guarded) {
            return self.reads.read(&c).await;
        }
        // Held or denied: the read has a key from now on.
        let keyed;
        let c = if unattended {
            keyed = claim_with(ctx.caller, ctx.server, call, None).0;
            trail.keyed(&keyed.client_key);
            Call { claim: &keyed, ..c }
        } else {
            c
        };
        match decision {
            Decision::Deny { .. } => c.refused(Outcome::Denied),
            // A read the policies want approved goes through the approval
            // book and the ledger like a write: its yes is single-use too.
            _ => Box::pin(self.writes.write(&c)).await,
        }
    }

    /// Stage "the client's answer" (2026-07-28): a retry carrying the
    /// `requestState` of a question the gateway asked. The state is checked
    /// and the answer given to the book before the ledger is looked at, so
    /// that a forged, moved, expired or used state is refused as such.
    async fn reply<U>(&self, c: &Call<'_, U>, reply: &canonical::Reply) -> Option<CallOutcome> {
        let subject = c.subject();
        let replied = self
            .asker
            .reply(&self.book, &subject, reply, self.clock.now_ms())
            .await;
        match replied {
            Replied::Continue => None,
            Replied::Stop(why) => {
                let detail = match &why {
                    Outcome::Confirmation(r) => Some(r.reason.clone()),
                    _ => None,
                };
                let outcome = CallOutcome::Refused {
                    why,
                    key: c.client_key(),
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
            Replied::Invalid(text) => Some(CallOutcome::Invalid(text)),
            Replied::Store(e) => Some(c.ledger_unavailable(e)),
        }
    }

    /// Stage "know the tool": the catalog is fetched when the call needs
    /// it ([`Learner::learn`]), and the cached reads it made stale go.
    async fn learn<U: Upstream>(&self, ctx: &CallCtx<'_, U>, tool: &str) {
        let stale = self.learner.learn(ctx.server, tool, ctx.upstream).await;
        self.reads.forget(ctx.server, &stale);
    }
}
