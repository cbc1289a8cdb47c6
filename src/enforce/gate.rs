//! The approval gate as a service: the policy decision in force now and,
//! for a call that needs a yes, the approval it may consume (DESIGN.md
//! sections 6 and 14). Such a call is held up to `approvals.hold`; the
//! person at the client is asked when the policies let them confirm; the
//! resource version is read by the version probe, a stage of its own.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use tokio::sync::watch;
use tracing::Instrument;

use super::book::{Ask, Book, Found};
use super::call::{claim, explicit_version, parse, Call, CallCtx};
use super::client::Asker;
use super::judge::Judge;
use super::learn::Learner;
use super::outcome::CallOutcome;
use super::permit::Upstream;
use super::reads::Reads;
use crate::audit::trail::Trail;
use crate::audit::AuditSink;
use crate::core::approval::{Proposal, ProposalState};
use crate::core::canonical;
use crate::core::config::{Config, VersionProbe};
use crate::core::decision::Decision;
use crate::core::refusal::{ApprovalCode, ApprovalNote, Outcome, Question};
use crate::core::time::{ms, Clock};
use crate::wire::era::Era;
use crate::wire::jsonrpc::{raw, Message};
use crate::wire::sse::UpstreamEvent;

/// What the approval gate chose, as a value.
pub(crate) enum Chosen {
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

/// What the gate decides with (built by the pipeline).
pub(crate) struct Gate {
    pub(crate) config: Arc<Config>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) judge: Arc<Judge>,
    pub(crate) learner: Arc<Learner>,
    pub(crate) reads: Arc<Reads>,
    pub(crate) book: Arc<Book>,
    /// Signs the `requestState` of questions to the client.
    pub(crate) asker: Arc<Asker>,
    /// True once the gateway stops: held calls answer at once.
    pub(crate) draining: watch::Receiver<bool>,
    pub(crate) audit: Option<Arc<dyn AuditSink>>,
    /// Budgets and effect keys.
    pub(crate) guards: Arc<super::guards::Guarding>,
}

impl Gate {
    /// Sign questions to the client with `asker` from now on.
    pub(crate) fn set_asker(&mut self, asker: Arc<Asker>) {
        self.asker = asker;
    }

    /// Know the tool as the server lists it now; cached reads the listing
    /// made stale go.
    async fn learn<U: Upstream>(&self, ctx: &CallCtx<'_, U>, tool: &str) {
        let stale = self.learner.learn(ctx.server, tool, ctx.upstream).await;
        self.reads.forget(ctx.server, &stale);
    }

    /// The gate: the policy decision in force now, and for a call that
    /// needs a yes, the approval it may consume. Such a call is held up to
    /// `approvals.hold` (progress notifications when it sent a
    /// `progressToken`) and proceeds the moment a reviewer approves.
    pub(crate) async fn choose<U: Upstream>(
        &self,
        c: &Call<'_, U>,
        lost: Option<ProposalState>,
        claims: &[crate::core::guard::Claim],
        must_look: bool,
    ) -> Chosen {
        if let Some(state) = lost {
            tracing::debug!(lost = state.as_str(), "looking for an approval again");
        }
        // A call that becomes a task is not held: the task waits instead.
        let hold = match c.ctx.task {
            true => std::time::Duration::ZERO,
            false => self.config.approvals.hold,
        };
        let hold_until = Instant::now() + hold;
        // Set up on the first look only: an unattended call (the hot path)
        // pays for neither the subscription nor re-reading its params.
        let mut waiting = None;
        let mut progress = 0u64;
        // The proposal last put to the client: asked once per proposal.
        let mut asked: Option<String> = None;
        // The first look of a call that just arrived uses the tool as the
        // pipeline found it a moment ago (learnt and read then).
        let mut arrived = lost.is_none().then(|| c.tool.clone());
        loop {
            // The tool as the server lists it now: a definition that
            // changed while the call waited is not the one approved.
            let tool = match arrived.take() {
                Some(t) => t,
                None => {
                    self.learn(c.ctx, &c.call.tool).await;
                    self.learner.catalog().view(c.ctx.server, &c.call.tool)
                }
            };
            if tool.unavailable {
                return Chosen::Refuse(Outcome::NotDispatched);
            }
            let (policies, looked) =
                match self.judged(c, claims, must_look, waiting.is_none()).await {
                    Ok(held) => held,
                    Err(chosen) => return chosen,
                };
            let figures = looked.as_ref();
            let quorum = self.judge.policies().quorum(&policies);
            // Subscribed before the first look, so a decision made between
            // the look and the wait is not missed.
            let (changes, token) = waiting.get_or_insert_with(|| {
                let token = c
                    .request
                    .params_value()
                    .and_then(|p| p.get("_meta")?.get("progressToken").cloned());
                (self.book.subscribe(), token)
            });
            // The held path's steps are boxed where they are awaited: the
            // gate's future, which every call moves, stays small.
            let version = match Box::pin(self.resource_version(c)).await {
                Ok(v) => v,
                Err(reason) => {
                    tracing::warn!(tool = %c.call.tool, "resource version: {reason}");
                    return Chosen::Refuse(Outcome::Approval(ApprovalNote {
                        code: ApprovalCode::Stale,
                        proposal_id: None,
                        revises: None,
                        reason: Some(reason),
                        by_client: false,
                    }));
                }
            };
            let ask = self.ask(c, &tool, version.as_deref(), figures, &policies, &quorum);
            let reviewers = self.judge.policies();
            // Entries so far go first: the proposal this call may create
            // follows its cause in the log.
            c.trail.flush();
            let found = Box::pin(self.book.find(&ask, reviewers.reviewers())).await;
            if let Ok(Found::Usable(p) | Found::Wait(p)) = &found {
                traced_under(p, ask.trace.as_deref());
            }
            let proposal = match found {
                Ok(Found::Usable(p)) if p.confirmation.is_some() && !self.judge.may_confirm(c) => {
                    // A yes from the client counts only while the policies
                    // in force let the requester confirm this call.
                    if let Err(e) = Box::pin(self.book.invalidate(
                        &p,
                        "the policies no longer let the requester confirm this call in the client",
                    ))
                    .await
                    {
                        tracing::error!("approval book unavailable, refusing: {e}");
                        return Chosen::Refuse(Outcome::NotDispatched);
                    }
                    continue;
                }
                Ok(Found::Usable(p)) => {
                    return Chosen::Consume {
                        approval: self.approval_of(&p),
                        proposal: p.id,
                    };
                }
                Ok(Found::Refuse(note)) => return Chosen::Refuse(Outcome::Approval(note)),
                Ok(Found::Wait(p)) => p,
                Err(e) => {
                    tracing::error!("approval book unavailable, refusing: {e}");
                    return Chosen::Refuse(Outcome::NotDispatched);
                }
            };
            // A quorum takes reviewers: the requester's own yes in the
            // client never counts towards it, so they are not asked.
            if asked.as_deref() != Some(proposal.id.as_str())
                && proposal.quorum.is_single()
                && !c.ctx.task
            {
                asked = Some(proposal.id.clone());
                if let Some(question) = Box::pin(self.ask_client(c, &proposal)).await {
                    return Chosen::Refuse(Outcome::Ask(Box::new(question)));
                }
            }
            // Hold: wait for this proposal to be decided, sending progress.
            let span = crate::telemetry::stage!(
                "approval wait",
                countersign.proposal = %proposal.id,
                countersign.outcome = tracing::field::Empty,
            );
            let held = Box::pin(
                self.hold(
                    c,
                    &proposal,
                    changes,
                    token.as_ref(),
                    &mut progress,
                    hold_until,
                )
                .instrument(span.clone()),
            )
            .await;
            span.record(
                "countersign.outcome",
                if held.is_none() {
                    "decided"
                } else {
                    "approval_pending"
                },
            );
            if let Some(stop) = held {
                return stop;
            }
        }
    }

    /// One look's judgement: the guards' figures (when they are read
    /// before the decision) and the policies in force now. `Ok`: the
    /// policies (and guards) a person must decide under, with the figures;
    /// `Err`: what the gate chose without a person (a pass or a refusal).
    async fn judged<U: Upstream>(
        &self,
        c: &Call<'_, U>,
        claims: &[crate::core::guard::Claim],
        must_look: bool,
        first_look: bool,
    ) -> Result<(Vec<String>, Option<crate::core::guard::Figures>), Chosen> {
        // The budgets and effect keys it falls under, as they stand now
        // (read again at every look: a held call's figures move). Read
        // before the decision only when a policy may read them, when a
        // take refused the call (the figures say why) or while it is
        // held; an unattended call within them is checked by the take
        // alone, atomically, after its reservation.
        let early = !claims.is_empty()
            && (must_look || !first_look || self.judge.policies().reads_budgets());
        let mut looked = match early {
            true => Some(self.look(c, claims).await?),
            false => None,
        };
        // Revalidation right before execution: the policies in force now.
        let spending = looked.as_ref().map(|f| f.spending.as_slice());
        let decision = self.judge.decide_with(c, spending);
        if let Decision::Deny { .. } = decision {
            return Err(Chosen::Refuse(Outcome::Denied));
        }
        // A call a person must decide shows them the figures.
        if looked.is_none() && !claims.is_empty() && !matches!(decision, Decision::Allow { .. }) {
            looked = Some(self.look(c, claims).await?);
        }
        let figures = looked.as_ref();
        // A guard that denies refuses the call whatever the policies say.
        if let Some(refusal) = figures.and_then(crate::core::guard::Figures::refusal) {
            for (name, _) in figures.map(|f| f.stopped()).unwrap_or_default() {
                self.guards.metrics.guard_stop(&name, "refused");
            }
            c.trail.record(
                "rejected",
                vec![
                    ("reason", json!(refusal.code)),
                    ("guards", json!(refusal.sentences)),
                    (
                        "budgets",
                        super::guards::budgets_json(
                            &figures.map(|f| f.spending.clone()).unwrap_or_default(),
                        ),
                    ),
                ],
            );
            return Err(Chosen::Refuse(Outcome::Guarded(Box::new(refusal))));
        }
        let stopped: Vec<String> = figures
            .map(|f| f.stopped().into_iter().map(|(name, _)| name).collect())
            .unwrap_or_default();
        if first_look {
            for name in &stopped {
                self.guards.metrics.guard_stop(name, "held");
            }
        }
        let policies = match decision {
            Decision::Allow { .. } if stopped.is_empty() => return Err(Chosen::Pass),
            // Past a budget or repeating an effect: a person decides,
            // and the guards stand where the policies would.
            Decision::Allow { .. } => stopped,
            Decision::Deny { .. } => return Err(Chosen::Refuse(Outcome::Denied)),
            Decision::Approval { mut policies } => {
                policies.extend(stopped);
                policies
            }
        };
        Ok((policies, looked))
    }

    /// The figures of `claims` for `c` now; a guard store that does not
    /// answer refuses the call (fail closed: a budget unread is not a
    /// budget kept).
    async fn look<U: Upstream>(
        &self,
        c: &Call<'_, U>,
        claims: &[crate::core::guard::Claim],
    ) -> Result<crate::core::guard::Figures, Chosen> {
        self.guards.look(c, claims).await.map_err(|e| {
            tracing::error!("guards unavailable, refusing: {e}");
            Chosen::Refuse(Outcome::NotDispatched)
        })
    }

    /// What is put to the reviewers for `c`: the call, the tool as listed
    /// now, the figures, and the policies and quorum that hold it.
    fn ask<'a, U: Upstream>(
        &self,
        c: &'a Call<'_, U>,
        tool: &'a crate::core::catalog::ToolView,
        version: Option<&'a str>,
        figures: Option<&crate::core::guard::Figures>,
        policies: &'a [String],
        quorum: &'a crate::core::approval::Quorum,
    ) -> Ask<'a> {
        Ask {
            identity: &c.ctx.caller.identity,
            server: c.ctx.server,
            tool: &c.call.tool,
            arguments: &c.call.arguments,
            digest: &c.call.digest,
            resource_version: version,
            tool_definition: tool.digest.as_deref(),
            definition_change: self.learner.catalog().change_of(c.ctx.server, &c.call.tool),
            looks_like: tool.lookalike.clone(),
            headline: self
                .config
                .servers
                .get(c.ctx.server)
                .and_then(|s| s.tools.get(c.call.tool.as_str()))
                .and_then(|t| t.summary.as_deref())
                .and_then(|t| crate::core::headline::render(t, &c.call.arguments)),
            guards: figures
                .map(crate::core::guard::Figures::sentences)
                .unwrap_or_default(),
            risk: risk(c.annotations),
            policies,
            quorum,
            key: &c.claim.key,
            client_key: &c.claim.client_key,
            revises: c
                .call
                .reserved
                .meta
                .get("dev.countersign/revises")
                .and_then(serde_json::Value::as_str),
            // The request's SERVER span (the current one here): a
            // proposal remembers the request that asked for it.
            trace: crate::telemetry::on()
                .then(|| crate::telemetry::traceparent(&tracing::Span::current()))
                .flatten()
                .map(|t| t.traceparent),
        }
    }

    /// The approval a usable proposal gives the audit entry: the client's
    /// confirmation, or the reviewers' decision with the policy set each
    /// yes was given under and the one in force now, which decided the call
    /// again.
    fn approval_of(&self, p: &Proposal) -> Value {
        match &p.confirmation {
            Some(conf) => json!({ "channel": "client", "confirmation": conf }),
            None => {
                let mut v = serde_json::to_value(&p.decision).unwrap_or(Value::Null);
                // The policy set each yes was given under, and the
                // one in force now, which decided the call again.
                if let Some(o) = v.as_object_mut() {
                    let under: Vec<Value> = p
                        .approvals
                        .iter()
                        .map(|g| {
                            json!({
                                "reviewer": g.reviewer(),
                                "policy_set": g.signed.statement.policy_set,
                            })
                        })
                        .collect();
                    if !under.is_empty() {
                        o.insert("approvers".into(), Value::from(under));
                    }
                    o.insert(
                        "policy_set_now".into(),
                        json!(self.judge.policies().digest()),
                    );
                }
                v
            }
        }
    }

    /// Hold the call until `proposal` is decided (`None`: look again) or
    /// the hold ends (the answer), sending progress when it asked for it.
    async fn hold<U>(
        &self,
        c: &Call<'_, U>,
        proposal: &Proposal,
        changes: &mut tokio::sync::broadcast::Receiver<super::book::Event>,
        token: Option<&Value>,
        progress: &mut u64,
        hold_until: Instant,
    ) -> Option<Chosen> {
        let hold = self.config.approvals.hold;
        let mut draining = self.draining.clone();
        loop {
            let left = hold_until.saturating_duration_since(Instant::now());
            if left.is_zero() || *draining.borrow() {
                return Some(Chosen::Refuse(Outcome::Approval(
                    crate::core::review::pending(proposal),
                )));
            }
            let tick = self.config.approvals.progress_interval.min(left);
            tokio::select! {
                _ = draining.changed() => {
                    tracing::info!(proposal = %proposal.id, "shutting down: a held call answers approval_pending");
                    return Some(Chosen::Refuse(Outcome::Approval(crate::core::review::pending(proposal))));
                }
                change = changes.recv() => match change {
                    Ok(e) if e.proposal.id == proposal.id && e.proposal.state != ProposalState::Pending => return None,
                    Ok(_) => {}
                    // Missed some: look again rather than wait blind.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return None,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        return Some(Chosen::Refuse(Outcome::Approval(crate::core::review::pending(proposal))));
                    }
                },
                () = tokio::time::sleep(tick) => {
                    if let (Some(token), Some(events)) = (token, &c.ctx.events) {
                        *progress += 1;
                        let waited = hold.saturating_sub(hold_until.saturating_duration_since(Instant::now()));
                        let params = json!({
                            "progressToken": token,
                            "progress": *progress,
                            "message": format!(
                                "waiting for a reviewer to approve proposal {} ({}s so far)",
                                proposal.id, waited.as_secs()
                            ),
                        });
                        let _ = events
                            .send(UpstreamEvent::Message(Message::notification("notifications/progress", Some(raw(&params)))))
                            .await;
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
                if !crate::core::confirm::declares_elicitation(capabilities)
                    || !self.judge.may_confirm(c)
                {
                    return None;
                }
                match self.asker.question(&self.book, &c.subject(), p, now).await {
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
                if asks.asking(&p.id, now) || !self.judge.may_confirm(c) {
                    return None;
                }
                let expires = now.saturating_add(ms(self.config.approvals.client_ttl));
                let id = asks.ask(&p.id, &c.ctx.caller.identity.principal, expires, now)?;
                let request = super::client::elicitation(
                    &id,
                    &super::client::question_params(p, asks.with_mode),
                );
                if events.send(UpstreamEvent::Message(request)).await.is_ok() {
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
        let tool = self.learner.catalog().view(c.ctx.server, &probe.tool);
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
        let (request, call) = parse(&self.config, c.ctx.server, request).map_err(|_| failed())?;
        let (claim, _) = claim(c.ctx.caller, c.ctx.server, &call).map_err(|_| failed())?;
        let trail = Trail::new(
            self.audit.as_ref(),
            &c.ctx.caller.identity,
            c.ctx.server,
            &call,
            Some(&claim.client_key),
        );
        trail.received(false, true);
        let pc = Call {
            ctx: c.ctx,
            request: &request,
            call: &call,
            claim: &claim,
            annotations,
            tool,
            trail: &trail,
        };
        match self.judge.decide(&pc) {
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
}

/// The current (SERVER) span works under `p`: it names the proposal, and a
/// request other than the one that asked for it links to that one's span
/// (an approved call retried minutes later, in a trace of its own).
fn traced_under(p: &Proposal, here: Option<&str>) {
    if !crate::telemetry::on() {
        return;
    }
    let span = tracing::Span::current();
    span.record("countersign.proposal", p.id.as_str());
    if let Some(there) = p.trace.as_deref() {
        if Some(there) != here {
            crate::telemetry::link(&span, there);
        }
    }
}

/// A call's risk, as reviewers see it, from its effective annotations.
fn risk(a: crate::core::annotations::Annotations) -> crate::core::approval::Risk {
    use crate::core::approval::Risk;
    if a.read_only {
        Risk::Read
    } else if a.destructive {
        Risk::Destructive
    } else {
        Risk::Write
    }
}
