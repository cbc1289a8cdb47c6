//! The ledger as a service: the store plus in-process single-flight.
//!
//! For each key, the first call in this process is the *leader*; identical
//! calls that arrive while it is unresolved *follow* it and receive its
//! answer (no polling: they wait on a `watch` channel). Only the leader reads
//! and writes the store.
//!
//! The steps are explicit, and the enforcement pipeline calls them in
//! DESIGN.md section 3's order: [`Idempotency::lookup`] (replay, wait,
//! conflict, unknown, or lead the key), then, after the policy decision and
//! the approval lookup, [`Lead::reserve`] (the atomic {reserve key, consume
//! approval}), then [`Ticket::dispatch_with`] (durable `dispatched`), and
//! the ticket's end: complete, not dispatched or unknown. Nothing here can
//! send a call upstream: that takes the pipeline's permit.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::core::ledger::{judge, Answer, Claim, Record, State, Verdict};
use crate::core::refusal::Outcome;
use crate::core::time::{rfc3339, Clock};
use crate::store::{Reservation, Store, StoreError};

/// How an in-flight call settled, as its followers see it.
#[derive(Debug, Clone, PartialEq)]
pub enum Settled {
    /// The server answered (fresh or replayed): followers replay it.
    Answered {
        /// The answer.
        answer: Answer,
        /// When it first arrived (RFC 3339).
        answered_at: String,
    },
    /// The leader's call ended without an answer to share (not dispatched,
    /// outcome unknown, or refused); followers get the same verdict.
    Verdict(Outcome),
    /// Another process sharing the store leads the key: followers wait for
    /// its record, as the leader here does.
    Elsewhere,
}

/// How many times the pipeline looks for an approval again when the one it
/// chose was consumed (or expired) between its lookup and the reservation.
pub const GATE_ROUNDS: usize = 4;

struct Flight {
    /// What a ledger key's leader runs, to refuse a different call under
    /// the same key (`drift`, `remap`). `None` for a read's flight: its key
    /// holds the caller and the call's digest (which covers server, tool
    /// and arguments) and can never be a ledger key, so whoever finds it
    /// makes the same call; nothing is copied for it.
    call: Option<FlightCall>,
    tx: watch::Sender<Option<Settled>>,
}

struct FlightCall {
    digest: String,
    server: String,
    tool: String,
}

/// What the ledger lookup found for a call (DESIGN.md section 3, step
/// "ledger lookup").
pub enum Lookup {
    /// The key is free and this call leads it: decide, then reserve.
    Lead(Lead),
    /// An identical call already answered: this is its answer.
    Replay {
        /// The answer.
        answer: Answer,
        /// When it first arrived.
        answered_at: String,
    },
    /// An identical call is in flight in this process: wait for it.
    Follow(watch::Receiver<Option<Settled>>),
    /// Refused or unknown, without dispatch.
    Stop(Outcome),
    /// In flight in another process sharing the store (reserved or
    /// dispatched, with no leader here): wait for its record to settle.
    Elsewhere,
}

/// What [`Lead::reserve`] did.
pub enum Reserve {
    /// The key is reserved (and the approval, if any, consumed): dispatch
    /// through the ticket.
    Go(Box<Ticket>),
    /// The approval is no longer usable (found in this state): look for
    /// another; the key is still led, and free.
    Lost(Lead, crate::core::approval::ProposalState),
    /// Another process bound the key in between: this is what the call gets.
    Bound(Lookup),
}

/// Retention settings.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    /// How long answers to explicit keys are kept.
    pub explicit: Duration,
    /// How long answers to derived keys are kept (a repeat within it counts as a retry).
    pub derived: Duration,
}

/// The ledger service.
pub struct Idempotency {
    store: Arc<dyn Store>,
    retention: Retention,
    /// When answers are recorded.
    clock: Arc<dyn Clock>,
    // A blocking mutex: held for map operations only, never across an await.
    flights: Mutex<HashMap<String, Arc<Flight>>>,
}

impl Idempotency {
    /// A service over `store`.
    pub fn new(
        store: Arc<dyn Store>,
        retention: Retention,
        clock: Arc<dyn Clock>,
    ) -> Arc<Idempotency> {
        Arc::new(Idempotency {
            store,
            retention,
            clock,
            flights: Mutex::new(HashMap::new()),
        })
    }

    /// The store (for reconciliation and listing).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    fn flights(&self) -> parking_lot::MutexGuard<'_, HashMap<String, Arc<Flight>>> {
        self.flights.lock()
    }

    /// Join an in-flight identical call, or become the leader for the key.
    #[expect(
        clippy::result_large_err,
        reason = "the Err side is the lookup's answer itself, returned once per call"
    )]
    fn lead_or_follow(&self, claim: &Claim) -> Result<Arc<Flight>, Lookup> {
        self.lead_or_follow_as(claim, false)
    }

    /// [`Idempotency::lead_or_follow`]; a `read`'s flight keeps no call to
    /// compare (see [`Flight::call`]).
    #[expect(
        clippy::result_large_err,
        reason = "the Err side is the lookup's answer itself, returned once per call"
    )]
    fn lead_or_follow_as(&self, claim: &Claim, read: bool) -> Result<Arc<Flight>, Lookup> {
        let mut flights = self.flights();
        // One hash of the key for the look and the insert.
        let slot = match flights.entry(claim.key.clone()) {
            std::collections::hash_map::Entry::Vacant(v) => v,
            std::collections::hash_map::Entry::Occupied(o) => {
                let f = o.get();
                if let Some(led) = f.call.as_ref().filter(|c| c.digest != claim.digest) {
                    return Err(Lookup::Stop(
                        if led.tool != claim.tool || led.server != claim.server {
                            Outcome::Remap
                        } else {
                            Outcome::Drift
                        },
                    ));
                }
                tracing::debug!(server = %claim.server, tool = %claim.tool, "an identical call is in flight: waiting for its answer");
                return Err(Lookup::Follow(f.tx.subscribe()));
            }
        };
        let (tx, _) = watch::channel(None);
        let flight = Arc::new(Flight {
            call: (!read).then(|| FlightCall {
                digest: claim.digest.clone(),
                server: claim.server.clone(),
                tool: claim.tool.clone(),
            }),
            tx,
        });
        slot.insert(flight.clone());
        Ok(flight)
    }

    fn settle(&self, key: &str, flight: &Arc<Flight>, settled: Settled) {
        self.settle_with(key, flight, || settled);
    }

    /// End `flight` and tell its followers what `settled` makes. It is made
    /// only when a follower waits: most calls have none, and a read's
    /// answer would be copied for nobody.
    fn settle_with(&self, key: &str, flight: &Arc<Flight>, settled: impl FnOnce() -> Settled) {
        let mut flights = self.flights();
        // One hash for the usual case (the key still names this flight);
        // one that names another flight is put back.
        if let Some((k, other)) = flights.remove_entry(key) {
            if !Arc::ptr_eq(&other, flight) {
                flights.insert(k, other);
            }
        }
        drop(flights);
        // Followers subscribe under the lock, through the map: once the
        // flight is out of it, no follower can come that is not counted.
        if flight.tx.receiver_count() > 0 {
            flight.tx.send_replace(Some(settled()));
        }
    }

    /// Step "ledger lookup": what a call with this claim gets. A call that
    /// may run leads its key's flight from here on, so identical calls (same
    /// key) wait for it instead of racing it, while the pipeline decides.
    pub async fn lookup(self: &Arc<Self>, claim: Claim, now_ms: i64) -> Result<Lookup, StoreError> {
        let flight = match self.lead_or_follow(&claim) {
            Ok(f) => f,
            Err(other) => return Ok(other),
        };
        let existing = match self.store.get(&claim.key).await {
            Ok(e) => e,
            Err(e) => {
                self.settle(
                    &claim.key,
                    &flight,
                    Settled::Verdict(Outcome::NotDispatched),
                );
                return Err(e);
            }
        };
        if judge(existing.as_ref(), &claim, now_ms) == Verdict::Proceed {
            return Ok(Lookup::Lead(Lead {
                svc: self.clone(),
                claim,
                flight,
                done: false,
                fresh: existing.is_none(),
            }));
        }
        Ok(self.conclude(&claim, &flight, existing.as_ref(), now_ms))
    }

    /// The answer for a key bound by `rec`, shared with the flight's
    /// followers.
    fn conclude(
        &self,
        claim: &Claim,
        flight: &Arc<Flight>,
        rec: Option<&Record>,
        now_ms: i64,
    ) -> Lookup {
        let found = match (judge(rec, claim, now_ms), rec) {
            (
                Verdict::Replay,
                Some(Record {
                    answer: Some(answer),
                    answered_at,
                    ..
                }),
            ) => Lookup::Replay {
                answer: answer.clone(),
                answered_at: answered_at.clone().unwrap_or_default(),
            },
            (Verdict::Remap, _) => Lookup::Stop(Outcome::Remap),
            (Verdict::Drift, _) => Lookup::Stop(Outcome::Drift),
            // A record in flight with no leader in this process: another
            // process sharing the store leads it (the caller may wait for it
            // to settle), or a crash not yet recovered. Never run again.
            (_, Some(r)) if r.state.in_flight() && self.store.subscribe().is_some() => {
                Lookup::Elsewhere
            }
            // An unknown outcome, or a complete record without its answer
            // (damaged): never run again.
            _ => Lookup::Stop(Outcome::Unknown),
        };
        let settled = match &found {
            Lookup::Replay {
                answer,
                answered_at,
            } => Settled::Answered {
                answer: answer.clone(),
                answered_at: answered_at.clone(),
            },
            Lookup::Stop(o) => Settled::Verdict(o.clone()),
            Lookup::Elsewhere => Settled::Elsewhere,
            Lookup::Lead(_) | Lookup::Follow(_) => Settled::Verdict(Outcome::Unknown),
        };
        self.settle(&claim.key, flight, settled);
        found
    }

    /// Single-flight without the store, for read-only tools: identical reads
    /// in flight share one upstream call; a finished read is never replayed.
    pub fn coalesce_read(
        self: &Arc<Self>,
        claim: &Claim,
    ) -> Result<ReadLead, watch::Receiver<Option<Settled>>> {
        match self.lead_or_follow_as(claim, true) {
            Ok(flight) => Ok(ReadLead {
                svc: self.clone(),
                key: claim.key.clone(),
                flight,
                done: false,
            }),
            Err(Lookup::Follow(rx)) => Err(rx),
            // A different read under the same derived key cannot happen (the
            // digest is part of it); with an explicit key reads use the ledger.
            Err(_) => Err(watch::channel(Some(Settled::Verdict(Outcome::Drift))).1),
        }
    }
}

/// Wait for the leader of a flight to settle.
pub async fn follow(mut rx: watch::Receiver<Option<Settled>>) -> Settled {
    loop {
        if let Some(s) = rx.borrow_and_update().clone() {
            return s;
        }
        if rx.changed().await.is_err() {
            // The leader vanished without settling (it was cancelled
            // mid-flight): whatever it sent may have run.
            return Settled::Verdict(Outcome::Unknown);
        }
    }
}

/// The leader of a key between the lookup and the reservation. Dropped
/// without reserving (refused, or the call was cancelled), it frees its
/// followers with the outcome it was given (`not_dispatched` by default).
pub struct Lead {
    svc: Arc<Idempotency>,
    claim: Claim,
    flight: Arc<Flight>,
    done: bool,
    /// The lookup found no record under the key.
    fresh: bool,
}

impl Lead {
    /// The claim this call leads.
    pub fn claim(&self) -> &Claim {
        &self.claim
    }

    /// Whether the lookup found no record under the key, so that the
    /// reservation can be made with the dispatch ([`Lead::defer`]).
    pub fn fresh(&self) -> bool {
        self.fresh
    }

    /// The reservation, made with the dispatch instead of now: the ticket
    /// claims the key straight as `dispatched`, in the commit that makes
    /// the dispatch durable ([`Ticket::dispatch_with`]), one commit instead
    /// of two. Only for a call with no approval to consume and no guards to
    /// take (nothing has to see the key reserved before the dispatch), and
    /// best when [`Lead::fresh`]. Until then the key is held in this
    /// process only (its followers wait for the ticket); another process
    /// that finds it free races the claim, and one of the two claims it.
    pub fn defer(mut self, now_ms: i64) -> Box<Ticket> {
        let record = self.record(now_ms);
        self.done = true;
        self.ticket(self.claim.key.clone(), record, true)
    }

    /// The record that reserves the key at `now_ms`, kept as long as the
    /// key's kind (explicit or derived) is.
    fn record(&self, now_ms: i64) -> Record {
        let retention = &self.svc.retention;
        let ttl = if self.claim.explicit {
            retention.explicit
        } else {
            retention.derived
        };
        Record::reserve(&self.claim, now_ms, crate::core::time::ms(ttl))
    }

    /// The ticket that takes over this lead's flight.
    fn ticket(&self, key: String, record: Record, deferred: bool) -> Box<Ticket> {
        Box::new(Ticket {
            svc: self.svc.clone(),
            key,
            record,
            flight: self.flight.clone(),
            dispatched: false,
            finished: false,
            guarded: false,
            deferred,
        })
    }

    /// Step "atomic {reserve key, consume approval}": reserve the key, and
    /// consume `approval` in the same store transaction when one is given.
    /// Judged at `now_ms`, the time of the reservation (the pipeline may
    /// have held the call for minutes).
    pub async fn reserve(
        mut self,
        approval: Option<String>,
        now_ms: i64,
    ) -> Result<Reserve, StoreError> {
        let record = self.record(now_ms);
        let key = self.claim.key.clone();
        let reserved = self
            .svc
            .store
            .reserve_with(key.clone(), record.clone(), now_ms, approval)
            .await;
        match reserved {
            Err(e) => {
                self.refuse(Outcome::NotDispatched);
                Err(e)
            }
            // INVARIANT: only a successful reservation hands out a ticket
            // here (a deferred one, `Lead::defer`, can dispatch only by
            // claiming the key); the flight passes to it, so followers wait
            // for its answer.
            Ok(Reservation::Reserved) => {
                self.done = true;
                Ok(Reserve::Go(self.ticket(key, record, false)))
            }
            Ok(Reservation::Unapproved(state)) => Ok(Reserve::Lost(self, state)),
            Ok(Reservation::Bound(rec)) => {
                self.done = true;
                Ok(Reserve::Bound(self.svc.conclude(
                    &self.claim,
                    &self.flight,
                    Some(&rec),
                    now_ms,
                )))
            }
        }
    }

    /// The call ends before the reservation: the key stays free, and
    /// followers get `outcome`.
    pub fn refuse(mut self, outcome: Outcome) {
        self.done = true;
        self.svc
            .settle(&self.claim.key, &self.flight, Settled::Verdict(outcome));
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        if !self.done {
            self.svc.settle(
                &self.claim.key,
                &self.flight,
                Settled::Verdict(Outcome::NotDispatched),
            );
        }
    }
}

/// The leader's claim on a key, from reservation to the answer.
pub struct Ticket {
    svc: Arc<Idempotency>,
    key: String,
    record: Record,
    flight: Arc<Flight>,
    dispatched: bool,
    finished: bool,
    /// The call took guards (budgets, effect keys) under its key: a call
    /// proven not sent gives them back.
    guarded: bool,
    /// Nothing is in the store yet: the key is claimed with the dispatch
    /// ([`Lead::defer`]).
    deferred: bool,
}

/// What [`Ticket::dispatch_with`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Dispatch {
    /// The key is durably `dispatched`: the call may go.
    Dispatched,
    /// A deferred claim found the key held (another process claimed it
    /// since the lookup): nothing was written, the call must not go, and
    /// [`Ticket::taken`] hands the key's followers to its holder.
    Taken,
}

impl Ticket {
    /// The ledger key the ticket holds.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The call took guards under its key (see [`Ticket::not_dispatched`]).
    pub fn guarded(&mut self) {
        self.guarded = true;
    }

    /// `reserved → dispatched`, durably, before anything goes upstream (a
    /// deferred claim that found the key held is [`StoreError::Raced`]).
    pub async fn dispatch(&mut self) -> Result<(), StoreError> {
        match self.dispatch_with(None).await? {
            Dispatch::Dispatched => Ok(()),
            Dispatch::Taken => Err(StoreError::Raced(self.key.clone())),
        }
    }

    /// Whether the key is durably `dispatched` (the pipeline's permit stage
    /// checks it).
    pub fn is_dispatched(&self) -> bool {
        self.dispatched
    }

    /// [`Ticket::dispatch`], committing `outbox` (audit entries that must
    /// be on disk before the dispatch) in the same durable commit. A
    /// deferred ticket claims the key here ([`Lead::defer`]).
    pub async fn dispatch_with(
        &mut self,
        outbox: Option<(u64, String)>,
    ) -> Result<Dispatch, StoreError> {
        let mut next = self.record.clone();
        next.state = State::Dispatched;
        if self.deferred {
            let now = self.svc.clock.now_ms();
            let claimed = self
                .svc
                .store
                .reserve_dispatched(self.key.clone(), next.clone(), now, outbox)
                .await?;
            if !claimed {
                return Ok(Dispatch::Taken);
            }
            self.deferred = false;
        } else {
            let moved = self
                .svc
                .store
                .transition_with(self.key.clone(), State::Reserved, next.clone(), outbox)
                .await?;
            if !moved {
                return Err(StoreError::Raced(self.key.clone()));
            }
        }
        self.record = next;
        self.dispatched = true;
        Ok(Dispatch::Dispatched)
    }

    /// A deferred claim found the key held by another process: nothing of
    /// this call is in the store, and its followers wait for the holder as
    /// the caller does.
    pub fn taken(mut self) {
        self.finished = true;
        self.svc.settle(&self.key, &self.flight, Settled::Elsewhere);
    }

    /// The server answered: `complete`, and followers get the answer.
    ///
    /// `Err` when the store could not record it: the caller must not
    /// acknowledge the answer as the call's, since a retry would then find
    /// the record still `dispatched` (later `unknown`) and be told another
    /// story than the first answer. Duplicates waiting here get `unknown`.
    pub async fn complete(mut self, answer: Answer) -> Result<String, StoreError> {
        let answered_at = rfc3339(self.svc.clock.now_ms());
        let mut next = self.record.clone();
        next.state = State::Complete;
        next.answer = Some(answer.clone());
        next.answered_at = Some(answered_at.clone());
        self.finish(
            next,
            Settled::Answered {
                answer,
                answered_at: answered_at.clone(),
            },
        )
        .await?;
        Ok(answered_at)
    }

    /// Proven not sent (or refused unprocessed): the key is free again.
    pub async fn not_dispatched(mut self) {
        if self.guarded {
            // Not sent, not spent: its budget share and effect go back. A
            // release lost here (the store down) counts a call that did
            // not run: the safe side.
            if let Err(e) = self.svc.store.guards_release(&self.key).await {
                tracing::warn!(key = %self.key, "a call not sent keeps its budget share until its window ends: {e}");
            }
        }
        let mut next = self.record.clone();
        next.state = State::NotDispatched;
        // Left `reserved` on a failure: recovery frees it.
        let _ = self
            .finish(next, Settled::Verdict(Outcome::NotDispatched))
            .await;
    }

    /// Sent, answer lost: `unknown` until an operator reconciles it.
    pub async fn unknown(self) {
        self.unknown_telling(Vec::new()).await;
    }

    /// [`Ticket::unknown`], with `notices` (the webhooks' `outcome_unknown`)
    /// queued in the same commit. Returns whether the move was recorded
    /// (else the notices were not queued either).
    pub(crate) async fn unknown_telling(
        mut self,
        notices: Vec<crate::core::notify::Notice>,
    ) -> bool {
        let mut next = self.record.clone();
        next.state = State::Unknown;
        // Left `dispatched` on a failure: recovery makes it `unknown`.
        self.finish_telling(next, Settled::Verdict(Outcome::Unknown), notices)
            .await
            .is_ok()
    }

    /// The store failed to record how a call ended: keep trying (every
    /// 500 ms, for two minutes), so that the key does not stay held by a
    /// call that is over while this gateway lives: a dispatched call
    /// becomes `unknown` (listed by `reconcile --list`), an unsent one
    /// frees its key. A restart's recovery (or, on PostgreSQL, the other
    /// gateways once this one's lease lapses) does the same.
    fn settle_later(&self) {
        let (from, to) = if self.dispatched {
            (State::Dispatched, State::Unknown)
        } else {
            (State::Reserved, State::NotDispatched)
        };
        let mut next = self.record.clone();
        next.state = to;
        let release = self.guarded && !self.dispatched;
        retry_transition(self.svc.clone(), self.key.clone(), from, next, release);
    }

    /// A dispatched call's end that the store failed to record: a failed
    /// commit may still have landed (the database restarted between
    /// applying it and replying). Saying `outcome_unknown` then would be
    /// contradicted by the ledger, which replays the answer to a retry and
    /// lists nothing to reconcile (found by the chaos run on PostgreSQL).
    /// So ask the store again, for up to [`CONFIRM_FOR`]: the record is
    /// `next` (it landed), still `from` (write it again), or another state
    /// (settled elsewhere). Still unreachable after that: `failed`.
    async fn confirm(
        &self,
        from: State,
        next: &Record,
        failed: Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let until = tokio::time::Instant::now() + CONFIRM_FOR;
        while tokio::time::Instant::now() < until {
            tokio::time::sleep(CONFIRM_EVERY).await;
            match self.svc.store.get(&self.key).await {
                Ok(Some(r)) if &r == next => return Ok(()),
                Ok(Some(r)) if r.state == from => {
                    match self
                        .svc
                        .store
                        .transition(self.key.clone(), from, next.clone())
                        .await
                    {
                        Ok(true) => return Ok(()),
                        // Moved meanwhile: look at what it is now.
                        Ok(false) | Err(_) => continue,
                    }
                }
                Ok(_) => return Err(StoreError::SettledElsewhere(self.key.clone())),
                Err(e) => {
                    tracing::debug!(key = %self.key, "the store still cannot say how the call ended: {e}")
                }
            }
        }
        failed
    }

    async fn finish(&mut self, next: Record, settled: Settled) -> Result<(), StoreError> {
        self.finish_telling(next, settled, Vec::new()).await
    }

    async fn finish_telling(
        &mut self,
        next: Record,
        settled: Settled,
        notices: Vec<crate::core::notify::Notice>,
    ) -> Result<(), StoreError> {
        if self.deferred {
            // Never written: nothing to move, the key was never held.
            self.finished = true;
            self.svc.settle(&self.key, &self.flight, settled);
            return Ok(());
        }
        let from = if self.dispatched {
            State::Dispatched
        } else {
            State::Reserved
        };
        // A store failure here leaves the record `dispatched`, which recovery
        // turns into `unknown`: conservative, never a second execution. The
        // duplicates waiting here are told `unknown` too, as a retry will be.
        let mut result = match self
            .svc
            .store
            .transition_telling(self.key.clone(), from, next.clone(), None, notices)
            .await
        {
            Ok(true) => Ok(()),
            // The compare-and-set found another state: what this gateway
            // would say is not what the ledger says.
            Ok(false) => Err(StoreError::SettledElsewhere(self.key.clone())),
            Err(e) => Err(e),
        };
        // A failed move to `unknown` needs no confirming: the client is told
        // `unknown` whether it landed or not.
        if self.dispatched
            && next.state != State::Unknown
            && matches!(result, Err(ref e) if !matches!(e, StoreError::SettledElsewhere(_)))
        {
            result = self.confirm(from, &next, result).await;
        }
        let settled = match &result {
            Ok(()) => settled,
            Err(e) => {
                tracing::error!(key = %self.key, "ledger transition failed: {e}");
                if !matches!(e, StoreError::SettledElsewhere(_)) {
                    self.settle_later();
                }
                if self.dispatched {
                    Settled::Verdict(Outcome::Unknown)
                } else {
                    settled
                }
            }
        };
        self.finished = true;
        self.svc.settle(&self.key, &self.flight, settled);
        result
    }
}

impl Drop for Ticket {
    /// A ticket dropped unfinished (the call was cancelled): if it was
    /// dispatched the outcome is unknown, otherwise the key is freed.
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let (state, outcome) = if self.dispatched {
            (State::Unknown, Outcome::Unknown)
        } else {
            (State::NotDispatched, Outcome::NotDispatched)
        };
        let from = if self.dispatched {
            State::Dispatched
        } else {
            State::Reserved
        };
        let mut next = self.record.clone();
        next.state = state;
        let svc = self.svc.clone();
        let key = self.key.clone();
        svc.settle(&key, &self.flight, Settled::Verdict(outcome));
        if self.deferred {
            // Nothing of it was written, or (dropped while its claim was in
            // flight) its claim may have landed as `dispatched` with nothing
            // sent: left so, read as in flight and then `unknown`. Never
            // moved from here, where it may be another process's record.
            return;
        }
        // Not sent, not spent (as in `not_dispatched`). Released before the
        // key is freed, in the same task: a retry under the key cannot take
        // the guards meanwhile, since the key is still `reserved`, so the
        // release never undoes a later take.
        let release = self.guarded && !self.dispatched;
        retry_transition(svc, key, from, next, release);
    }
}

/// How long a dispatched call's end whose write failed is confirmed with the
/// store before the call is answered `outcome_unknown` (a database restart
/// takes a few seconds).
const CONFIRM_FOR: Duration = Duration::from_secs(10);
/// How often the store is asked meanwhile.
const CONFIRM_EVERY: Duration = Duration::from_millis(250);

/// Move `key` from `from` to `next` in a task of its own, trying again
/// every 500 ms for two minutes while the store fails. Done when it moved,
/// or when the record is in another state (settled by someone else).
fn retry_transition(
    svc: Arc<Idempotency>,
    key: String,
    from: State,
    next: Record,
    release_guards: bool,
) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    handle.spawn(async move {
        if release_guards {
            if let Err(e) = svc.store.guards_release(&key).await {
                tracing::warn!(key = %key, "a call not sent keeps its budget share until its window ends: {e}");
            }
        }
        for attempt in 0..240u32 {
            if attempt > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            match svc.store.transition(key.clone(), from, next.clone()).await {
                Ok(_) => return,
                Err(e) => tracing::debug!(%key, "cannot record the call's end yet: {e}"),
            }
        }
        tracing::error!(%key, "could not record the end of a call for two minutes; a restart's recovery will");
    });
}

/// The leader of a coalesced read.
pub struct ReadLead {
    svc: Arc<Idempotency>,
    key: String,
    flight: Arc<Flight>,
    done: bool,
}

impl ReadLead {
    /// Share the read's outcome with its followers.
    /// `settled` is made only when a follower waits.
    pub fn finish(mut self, settled: impl FnOnce() -> Settled) {
        self.done = true;
        self.svc.settle_with(&self.key, &self.flight, settled);
    }
}

impl Drop for ReadLead {
    fn drop(&mut self) {
        if !self.done {
            self.svc.settle(
                &self.key,
                &self.flight,
                Settled::Verdict(Outcome::NotDispatched),
            );
        }
    }
}

#[cfg(test)]
mod tests;
