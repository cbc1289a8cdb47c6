//! The write path as a service: a call through the ledger, attempt by
//! attempt (DESIGN.md section 3): the breaker's fast check, the ledger
//! lookup, the gate and the atomic {reserve key, consume approval}, the
//! durable `dispatched` with its audit entry, the permit, the upstream and
//! the answer on the ledger. A retry happens only where it cannot run the
//! call twice (proven not dispatched).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tracing::Instrument;

use super::book::Book;
use super::breakers::{Admitted, Breakers};
use super::call::Call;
use super::client::Asker;
use super::flight::{
    follow, Dispatch, Idempotency, Lead, Lookup, Reserve, Settled, Ticket, GATE_ROUNDS,
};
use super::gate::{Chosen, Gate};
use super::guards::NotTaken;
use super::metrics::Metrics;
use super::outcome::CallOutcome;
use super::outcome::{answer_of, answered_fields};
use super::permit::{issue, Hold, Sent, ToolConn, Upstream};
use super::reads::Reads;
use super::retry::{failed, next_attempt, unreachable_hold, Attempt};
use super::upstream::UpstreamError;
use crate::core::config::Config;
use crate::core::guard::Claim;
use crate::core::recovery::{classify_response, ResponseClass};
use crate::core::refusal::Outcome;
use crate::core::time::Clock;

/// Why a write attempt does not go on to dispatch.
enum Stop {
    /// It ended here, with this outcome.
    Done(CallOutcome),
    /// Another process sharing the store leads the key: wait for its record
    /// to settle, then look again.
    Elsewhere,
    /// Another call took the last of a budget (or made the effect) first:
    /// the key is free again; look again, and decide on the new figures.
    Again,
}

/// A deferred claim found the key held by another process sharing the
/// store ([`Dispatch::Taken`]): nothing was written or sent.
struct ClaimedElsewhere;

/// What the write path runs a call through (built by the pipeline).
pub(crate) struct Writes {
    pub(crate) config: Arc<Config>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) flights: Arc<Idempotency>,
    pub(crate) book: Arc<Book>,
    pub(crate) breakers: Arc<Breakers>,
    pub(crate) reads: Arc<Reads>,
    pub(crate) metrics: Arc<Metrics>,
    /// Tells the webhooks of writes whose answer was lost.
    pub(crate) announcer: Arc<super::announce::Announcer>,
    pub(crate) gate: Gate,
}

impl Writes {
    /// The facts of `c`'s `outcome_unknown` for the webhooks: who, which
    /// tool, why, the idempotency key only as a digest.
    fn lost_facts<U>(c: &Call<'_, U>, reason: &str) -> serde_json::Map<String, Value> {
        use sha2::Digest;
        let who = &c.ctx.caller.identity;
        let mut f = serde_json::Map::new();
        f.insert("requester".into(), json!(who.principal));
        if let Some(client) = &who.client {
            f.insert("client".into(), json!(client));
        }
        f.insert("tenant".into(), json!(who.tenant));
        f.insert("server".into(), json!(c.ctx.server));
        f.insert("tool".into(), json!(c.call.tool));
        f.insert(
            "key_digest".into(),
            json!(format!(
                "sha256:{}",
                hex::encode(sha2::Sha256::digest(c.claim.client_key.as_bytes()))
            )),
        );
        f.insert("call_digest".into(), json!(c.call.digest));
        f.insert("reason".into(), json!(reason));
        f.insert("command".into(), json!("countersign reconcile --list"));
        f
    }

    /// `c` was sent and its answer is lost: its record moves to `unknown`,
    /// and the webhooks' `outcome_unknown` is queued in the same commit. If
    /// the move could not be recorded, the event is queued on its own.
    async fn lost<U>(&self, c: &Call<'_, U>, ticket: Box<Ticket>, reason: &str) {
        let notices = self.unknown_notices(c, reason);
        let told = !notices.is_empty();
        if ticket.unknown_telling(notices).await {
            if told {
                self.announcer.queued();
            }
        } else {
            self.announcer.incident(
                crate::core::config::EventKind::OutcomeUnknown,
                Some(&c.ctx.caller.identity.tenant),
                Self::lost_facts(c, reason),
            );
        }
    }

    /// The webhooks' `outcome_unknown` notices for `c`, to commit with the
    /// move that makes its record `unknown`.
    fn unknown_notices<U>(
        &self,
        c: &Call<'_, U>,
        reason: &str,
    ) -> Vec<crate::core::notify::Notice> {
        self.announcer.notices(
            crate::core::config::EventKind::OutcomeUnknown,
            Some(&c.ctx.caller.identity.tenant),
            Self::lost_facts(c, reason),
        )
    }

    /// Sign questions to the client with `asker` from now on.
    pub(crate) fn set_asker(&mut self, asker: Arc<Asker>) {
        self.gate.set_asker(asker);
    }

    /// Stage 4, a call through the ledger, with retries only where a retry
    /// cannot run it twice (proven not dispatched).
    pub(crate) async fn write<U: Upstream>(&self, c: &Call<'_, U>) -> CallOutcome {
        if !c.annotations.read_only {
            self.reads.refuse_cache(c.ctx.server, &c.call.tool);
        }
        // The budgets and effect keys the call falls under; an amount that
        // is missing or not a number is refused before anything is kept.
        let claims = match self.gate.guards.covers(c.ctx.server, &c.call.tool) {
            false => Vec::new(),
            true => match self.gate.guards.claims(c) {
                Ok(claims) => claims,
                Err(why) => {
                    c.trail.record(
                        "rejected",
                        vec![("reason", json!("invalid_params")), ("detail", json!(why))],
                    );
                    return CallOutcome::Invalid(why);
                }
            },
        };
        let mut attempt = 1;
        loop {
            let result = self.write_once(c, &claims).await;
            if let Some(done) =
                next_attempt(&self.config.retry, c.ctx.server, result, &mut attempt).await
            {
                return done;
            }
        }
    }

    /// One attempt through the ledger.
    async fn write_once<U: Upstream>(&self, c: &Call<'_, U>, claims: &[Claim]) -> Attempt {
        // The breaker's fast check, before anything is reserved.
        if self.breakers.is_open(c.ctx.server) {
            return Attempt::Done(c.open_circuit());
        }
        // How long an identical call waits for another gateway's flight:
        // the call's own upstream timeout, and a margin for the answer to be
        // recorded. Then `outcome_unknown`, as for any record that does not
        // settle.
        let deadline =
            Instant::now() + self.config.call_timeout(c.ctx.server) + Duration::from_secs(5);
        let mut raced = 0;
        // The reservation may be made with the dispatch (one commit) until
        // a deferred claim finds the key taken: from then on, the long way.
        let mut defer = true;
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
                Err(Stop::Again) => continue,
            };
            let ticket = match self.reserve(c, lead, claims, raced > 0, defer).await {
                Ok(t) => t,
                Err(Stop::Done(done)) => return Attempt::Done(done),
                // Bounded: a call that keeps losing the last of a budget
                // fails closed.
                Err(Stop::Again) if raced < GATE_ROUNDS => {
                    raced += 1;
                    continue;
                }
                Err(Stop::Again) => return Attempt::Done(c.refused(Outcome::NotDispatched)),
                Err(Stop::Elsewhere) => match self.wait_elsewhere(c, changes, deadline).await {
                    Ok(()) => continue,
                    Err(done) => return Attempt::Done(done),
                },
            };
            match self.dispatch(c, ticket).await {
                Ok(done) => return done,
                // Another process claimed the key since the lookup: wait
                // for it as for any key held elsewhere, then look again.
                Err(ClaimedElsewhere) => {
                    defer = false;
                    match self.wait_elsewhere(c, changes, deadline).await {
                        Ok(()) => continue,
                        Err(done) => return Attempt::Done(done),
                    }
                }
            }
        }
    }

    /// Wait for a record another process leads (sharing the store) to
    /// settle: woken by its own settlement (LISTEN/NOTIFY), never by polling;
    /// a lagged receiver just looks again. `Ok` means look again. At the
    /// deadline, or without a way to hear, the call ends as
    /// [`Writes::unsettled_elsewhere`] says.
    async fn wait_elsewhere<U>(
        &self,
        c: &Call<'_, U>,
        changes: Option<tokio::sync::broadcast::Receiver<crate::store::StoreEvent>>,
        deadline: Instant,
    ) -> Result<(), CallOutcome> {
        let Some(mut rx) = changes else {
            return self.unsettled_elsewhere(c).await;
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return self.unsettled_elsewhere(c).await;
        }
        let key = c.claim.key.clone();
        let store = self.flights.store();
        // Announce the wait, then look once more: a settlement between the
        // reservation that found the key held and the announcement was
        // told to nobody. A store that cannot take the wait is a store that
        // cannot answer: the deadline's answer, as without a way to hear.
        if let Err(e) = store.wait_for(key.clone()).await {
            tracing::warn!("ledger: cannot wait on a key held elsewhere: {e}");
            return self.unsettled_elsewhere(c).await;
        }
        let waited = || async {
            if let Err(e) = store.waited(key.clone()).await {
                tracing::debug!("ledger: the end of a wait was not recorded: {e}");
            }
        };
        let held = match store.get(&key).await {
            Ok(Some(r)) => r.state.in_flight(),
            // Freed meanwhile: look again.
            Ok(None) => false,
            // Unreadable: wait, and the deadline's answer reads it again.
            Err(_) => true,
        };
        if !held {
            waited().await;
            return Ok(());
        }
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
        let heard = tokio::time::timeout(left, settled_there).await;
        waited().await;
        match heard {
            Ok(()) => Ok(()),
            Err(_) => self.unsettled_elsewhere(c).await,
        }
    }

    /// The answer for a key another gateway still holds at the end of the
    /// wait (`Ok`: the record moved meanwhile, look again).
    /// - Still `reserved` there: nothing was sent, and saying
    ///   `outcome_unknown` would be a definitive answer the ledger
    ///   contradicts once the key is freed (found by the chaos run on
    ///   PostgreSQL); the agent is told to send it again.
    /// - Unreadable: the ledger is unavailable, as for any lookup that fails
    ///   (nothing was sent from here, and a retry follows the ledger).
    /// - `dispatched`: the record is moved to `unknown` first (compare-and-
    ///   set, with the webhooks' `outcome_unknown` in the same commit), and
    ///   only then is the call answered `outcome_unknown`. Answering unknown
    ///   while the record stays `dispatched` let the holder complete it
    ///   afterwards (its answer was confirmed after a database restart), so
    ///   `reconcile --list` never listed a key an agent was told is unknown
    ///   (found by the chaos run on PostgreSQL). The holder's own
    ///   compare-and-set then fails, and it answers unknown too.
    async fn unsettled_elsewhere<U>(&self, c: &Call<'_, U>) -> Result<(), CallOutcome> {
        use crate::core::ledger::State;
        let store = self.flights.store();
        let rec = match store.get(&c.claim.key).await {
            Ok(Some(r)) => r,
            // Settled and gone meanwhile: the lookup says what it is now.
            Ok(None) => return Ok(()),
            Err(e) => return Err(c.ledger_unavailable(e)),
        };
        match rec.state {
            State::Reserved => Err(c.refused(Outcome::NotDispatched)),
            State::Dispatched => {
                let reason = "another gateway sent the call and did not record its end in time";
                let notices = self.unknown_notices(c, reason);
                let told = !notices.is_empty();
                let mut next = rec;
                next.state = State::Unknown;
                match store
                    .transition_telling(c.claim.key.clone(), State::Dispatched, next, None, notices)
                    .await
                {
                    Ok(true) => {
                        if told {
                            self.announcer.queued();
                        }
                        tracing::warn!(server = %c.ctx.server, tool = %c.call.tool, key = %c.claim.client_key, "outcome unknown: {reason}");
                        // Its own entry: this gateway settled the record
                        // (not a repeat of an unknown the ledger held).
                        c.trail
                            .record("outcome_unknown", vec![("reason", json!(reason))]);
                        Err(CallOutcome::Refused {
                            why: Outcome::Unknown,
                            key: c.claim.client_key.clone(),
                            tool: c.call.tool.clone(),
                        })
                    }
                    Ok(false) => Ok(()),
                    Err(e) => Err(c.ledger_unavailable(e)),
                }
            }
            // Settled meanwhile (unknown, complete, freed): look again.
            _ => Ok(()),
        }
    }

    /// Ledger lookup: replay, wait for the identical call in flight, refuse
    /// a conflict or a repeat of an unknown outcome, or lead the key.
    async fn lookup<U>(&self, c: &Call<'_, U>) -> Result<Lead, Stop> {
        let started = Instant::now();
        let span = ledger_span("ledger lookup");
        let found = self
            .flights
            .lookup(c.claim.clone(), self.clock.now_ms())
            .instrument(span.clone())
            .await;
        self.metrics.store("lookup", started.elapsed());
        if !span.is_none() {
            let state = match &found {
                Ok(Lookup::Lead(_)) => "free",
                Ok(Lookup::Replay { .. }) => "completed",
                Ok(Lookup::Follow(_)) => "in_flight",
                Ok(Lookup::Stop(Outcome::Unknown)) => "unknown",
                Ok(Lookup::Stop(_)) => "refused",
                Ok(Lookup::Elsewhere) => "in_flight_elsewhere",
                Err(_) => "unavailable",
            };
            span.record("countersign.ledger_state", state);
        }
        let found = found.map_err(|e| Stop::Done(c.ledger_unavailable(e)))?;
        match found {
            Lookup::Lead(lead) => Ok(lead),
            Lookup::Follow(rx) => match follow(rx).await {
                Settled::Elsewhere => Err(Stop::Elsewhere),
                s => Err(Stop::Done(c.settled(s, true))),
            },
            Lookup::Elsewhere => Err(Stop::Elsewhere),
            other => Err(Stop::Done(c.concluded(other))),
        }
    }

    /// Policy decision → approval lookup and revalidation → the atomic
    /// {reserve key, consume approval}. When the approval the gate chose is
    /// gone by the reservation (a concurrent call with another key consumed
    /// it), the gate looks again, a few times at most.
    ///
    /// A call that may go with nothing to consume and no guards to take,
    /// under a key the lookup found free, is reserved with its dispatch
    /// when `defer` allows ([`Lead::defer`]): nothing needs to see it
    /// reserved before, and the durable `dispatched` commit claims the key.
    async fn reserve<U: Upstream>(
        &self,
        c: &Call<'_, U>,
        mut lead: Lead,
        claims: &[Claim],
        must_look: bool,
        defer: bool,
    ) -> Result<Box<Ticket>, Stop> {
        let mut lost = None;
        for _ in 0..GATE_ROUNDS {
            let (proposal, approval) = match self.gate.choose(c, lost, claims, must_look).await {
                Chosen::Pass => (None, Value::Null),
                Chosen::Consume { proposal, approval } => (Some(proposal), approval),
                Chosen::Refuse(why) => {
                    lead.refuse(why.clone());
                    return Err(Stop::Done(c.refused(why)));
                }
            };
            // Judged at the time of the reservation: the gate may have
            // held the call for minutes.
            let now = self.clock.now_ms();
            if defer && proposal.is_none() && claims.is_empty() && lead.fresh() {
                return Ok(lead.defer(now));
            }
            let started = Instant::now();
            let span = ledger_span("ledger reserve");
            let reserved = lead
                .reserve(proposal.clone(), now)
                .instrument(span.clone())
                .await;
            self.metrics.store("reserve", started.elapsed());
            if !span.is_none() {
                let state = match &reserved {
                    Ok(Reserve::Go(_)) => "reserved",
                    Ok(Reserve::Lost(..)) => "free",
                    Ok(Reserve::Bound(_)) => "bound_elsewhere",
                    Err(_) => "unavailable",
                };
                span.record("countersign.ledger_state", state);
                if let Some(p) = &proposal {
                    span.record("countersign.proposal", p.as_str());
                }
            }
            match reserved {
                Err(e) => return Err(Stop::Done(c.ledger_unavailable(e))),
                Ok(Reserve::Go(mut ticket)) => {
                    // The guards, atomically, before anything is dispatched:
                    // an approved call may go over.
                    if !claims.is_empty() {
                        let taken = self
                            .gate
                            .guards
                            .take(c, claims, &mut ticket, proposal.is_some())
                            .await;
                        match taken {
                            Ok(()) => {}
                            Err(NotTaken::Raced) => {
                                tracing::debug!(tool = %c.call.tool, "its budgets or effect keys stop the call: deciding again on their figures");
                                ticket.not_dispatched().await;
                                return Err(Stop::Again);
                            }
                            Err(NotTaken::Store(e)) => {
                                ticket.not_dispatched().await;
                                return Err(Stop::Done(c.ledger_unavailable(e)));
                            }
                        }
                    }
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
                Ok(Reserve::Bound(found)) => return Err(Stop::Done(c.concluded(found))),
            }
        }
        // The approval kept slipping away: fail closed.
        lead.refuse(Outcome::NotDispatched);
        Err(Stop::Done(c.refused(Outcome::NotDispatched)))
    }

    /// Durable `dispatched` (with the audit entry that records it), the
    /// permit, the send, and the answer on the ledger.
    async fn dispatch<U: Upstream>(
        &self,
        c: &Call<'_, U>,
        mut ticket: Box<Ticket>,
    ) -> Result<Attempt, ClaimedElsewhere> {
        // The breaker's trial is taken here, right before the upstream, so
        // that a call the ledger or the gate answered never uses it.
        let Some(admitted) = self.breakers.admit(c.ctx.server) else {
            ticket.not_dispatched().await;
            return Ok(Attempt::Done(c.open_circuit()));
        };
        // The upstream's futures (kilobytes) are boxed where they are
        // awaited: the call's own futures above them stay small, and a
        // future is copied whole wherever it is moved.
        let conn = match Box::pin(c.ctx.upstream.ready()).await {
            Ok(conn) => conn,
            Err(e) => {
                ticket.not_dispatched().await;
                c.trail
                    .record("not_dispatched", vec![("reason", json!(e.to_string()))]);
                return Ok(Attempt::Retry(failed(c.ctx.server, e, admitted)));
            }
        };
        // The audit entry that records the dispatch (and the call's entries
        // before it) is on disk before a byte goes upstream: committed in the
        // ledger's outbox with the `dispatched` record, one fsync for both.
        // The audit writer appends it to the log and clears the row once
        // its own file is fsynced; startup repairs a crash in between.
        let started = Instant::now();
        let span = ledger_span("ledger dispatch");
        let durable = async {
            match c.trail.stage_dispatch() {
                None => ticket.dispatch_with(None).await.map_err(Some),
                Some((log, Ok(staged))) => {
                    let outbox = Some((staged.id, staged.text.clone()));
                    let r = ticket.dispatch_with(outbox).await;
                    match &r {
                        Ok(Dispatch::Dispatched) => log.record_staged(staged),
                        Ok(Dispatch::Taken) | Err(_) => log.unstage(staged),
                    }
                    r.map_err(Some)
                }
                // An audit log without the ledger's outbox cannot make the
                // dispatch entry durable with the dispatch (`serve` always
                // attaches it): no evidence, no dispatch.
                Some((_, Err(_))) => Err(None),
            }
        }
        .instrument(span.clone())
        .await;
        let durable = match durable {
            Ok(Dispatch::Dispatched) => Ok(()),
            Ok(Dispatch::Taken) => {
                span.record("countersign.ledger_state", "in_flight_elsewhere");
                ticket.taken();
                return Err(ClaimedElsewhere);
            }
            Err(Some(e)) => Err(e),
            Err(None) => {
                tracing::error!("refusing a call: the audit log has no ledger outbox attached");
                ticket.not_dispatched().await;
                return Ok(Attempt::Done(CallOutcome::AuditUnavailable));
            }
        };
        span.record(
            "countersign.ledger_state",
            if durable.is_ok() {
                "dispatched"
            } else {
                "unavailable"
            },
        );
        self.metrics.store("dispatched", started.elapsed());
        if let Err(e) = durable {
            // Nothing was sent: free the key now, before answering, so a
            // retry finds it free (not a reservation without a leader,
            // which reads as an unknown outcome).
            ticket.not_dispatched().await;
            c.trail
                .record("not_dispatched", vec![("reason", json!(e.to_string()))]);
            return Ok(Attempt::Done(c.ledger_unavailable(e)));
        }
        let permit = match issue(c.request, Hold::Write(ticket)) {
            Ok(p) => p,
            Err(Hold::Write(ticket)) => {
                ticket.not_dispatched().await;
                return Ok(Attempt::Done(c.refused(Outcome::NotDispatched)));
            }
            Err(Hold::Read(_)) => unreachable_hold(),
        };
        let timeout = self.config.call_timeout(c.ctx.server);
        let sent = Box::pin(conn.call_tool(permit, c.ctx.events.clone(), timeout)).await;
        Ok(self.record(c, sent, admitted).await)
    }

    /// Record the answer: `complete`, `not_dispatched` (refused unprocessed
    /// or proven unsent), or `unknown` (sent, answer lost).
    async fn record<U>(&self, c: &Call<'_, U>, sent: Sent, admitted: Admitted<'_>) -> Attempt {
        let ticket = match sent.hold {
            Hold::Write(t) => t,
            Hold::Read(_) => unreachable_hold(),
        };
        if let Some(evidence) = sent.delegated {
            c.trail.delegated(evidence);
        }
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
                    let reason = "the server answered that the request was cancelled";
                    self.lost(c, ticket, reason).await;
                    c.trail
                        .record("outcome_unknown", vec![("reason", json!(reason))]);
                    return Attempt::Done(CallOutcome::Failed(UpstreamError::Lost {
                        server: c.ctx.server.to_owned(),
                        reason: reason.to_owned(),
                    }));
                } else if let Some(answer) = answer_of(&resp) {
                    let started = Instant::now();
                    let span = ledger_span("ledger complete");
                    let recorded = ticket.complete(answer).instrument(span.clone()).await;
                    self.metrics.store("complete", started.elapsed());
                    span.record(
                        "countersign.ledger_state",
                        if recorded.is_ok() {
                            "completed"
                        } else {
                            "unavailable"
                        },
                    );
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
                        // The ticket is spent: the event goes on its own.
                        self.announcer.incident(
                            crate::core::config::EventKind::OutcomeUnknown,
                            Some(&c.ctx.caller.identity.tenant),
                            Self::lost_facts(c, &reason),
                        );
                        return Attempt::Done(CallOutcome::Failed(UpstreamError::Lost {
                            server: c.ctx.server.to_owned(),
                            reason,
                        }));
                    }
                    // Debug, as a read's is: the audit log records every
                    // write, signed; at `info` a line per call cost more
                    // than a Cedar decision (docs/performance.md).
                    tracing::debug!(server = %c.ctx.server, tool = %c.call.tool, key = %c.claim.client_key, "executed: the write ran and its answer is recorded");
                    c.trail.record("completed", answered_fields(&resp));
                } else {
                    self.lost(c, ticket, "no answer").await;
                    c.trail
                        .record("outcome_unknown", vec![("reason", json!("no answer"))]);
                }
                Attempt::Done(CallOutcome::Answered(resp))
            }
            // No token could be had for the caller: nothing was sent, and
            // trying again at once would ask the provider the same thing.
            Err(e @ UpstreamError::Delegation { .. }) => {
                ticket.not_dispatched().await;
                c.trail
                    .record("not_dispatched", vec![("reason", json!(e.to_string()))]);
                Attempt::Done(failed(c.ctx.server, e, admitted))
            }
            Err(e) if !e.class().possibly_executed() => {
                ticket.not_dispatched().await;
                c.trail
                    .record("not_dispatched", vec![("reason", json!(e.to_string()))]);
                Attempt::Retry(failed(c.ctx.server, e, admitted))
            }
            Err(e) => {
                self.lost(c, ticket, &e.to_string()).await;
                tracing::warn!(server = %c.ctx.server, tool = %c.call.tool, key = %c.claim.client_key, "outcome unknown: {e}");
                c.trail
                    .record("outcome_unknown", vec![("reason", json!(e.to_string()))]);
                Attempt::Done(failed(c.ctx.server, e, admitted))
            }
        }
    }
}

/// A ledger transition's span (none when traces are off).
fn ledger_span(name: &'static str) -> tracing::Span {
    let span = crate::telemetry::stage!(
        "ledger",
        countersign.ledger_state = tracing::field::Empty,
        countersign.proposal = tracing::field::Empty,
        otel.name = tracing::field::Empty,
    );
    span.record("otel.name", name);
    span
}
