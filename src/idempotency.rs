//! The ledger as a service: the store plus in-process single-flight.
//!
//! For each key, the first call in this process is the *leader*; identical
//! calls that arrive while it is unresolved *follow* it and receive its
//! answer (no polling: they wait on a `watch` channel). Only the leader reads
//! and writes the store. A leader that gets to dispatch holds a [`Ticket`],
//! which is the only way to obtain a [`Permit`], which is the only way to
//! send a `tools/call` upstream.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::ledger::{judge, Answer, Claim, Record, State, Verdict};
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
}

/// Why an approval-gated call did not run (DESIGN.md section 7 codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalCode {
    /// `approval_pending`: a reviewer has not decided yet.
    Pending,
    /// `approval_denied`.
    Denied,
    /// `approval_expired`.
    Expired,
    /// `stale_resource_version`.
    Stale,
}

/// The approval side of a refusal: which proposal, and what to tell the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalNote {
    /// The code.
    pub code: ApprovalCode,
    /// The proposal the agent's call waits on (or was refused by).
    pub proposal_id: Option<String>,
    /// The proposal this one revises, if any.
    pub revises: Option<String>,
    /// A reviewer's reason (denials) or the gateway's (stale versions).
    pub reason: Option<String>,
}

/// A non-answer outcome shared with followers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Sent, answer lost.
    Unknown,
    /// Proven not sent; the caller may try again.
    NotDispatched,
    /// The key is bound to another tool.
    Remap,
    /// The key is bound to other arguments.
    Drift,
    /// The policies deny the call.
    Denied,
    /// The call needs (or lost, or was refused) a human approval.
    Approval(ApprovalNote),
}

/// What the gate between the ledger lookup and the reservation decided
/// (DESIGN.md section 3's order: policy decision → approval lookup and
/// revalidation → atomic {reserve key, consume approval}).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Run without an approval: the policies allow it unattended.
    Pass,
    /// Run under this approved proposal, consumed in the same store
    /// transaction that reserves the key.
    Consume(String),
    /// Do not run; the key stays free.
    Refuse(Outcome),
}

/// How many times the gate is asked again when the approval it chose was
/// consumed (or expired) between its lookup and the reservation.
const GATE_ROUNDS: usize = 4;

struct Flight {
    digest: String,
    server: String,
    tool: String,
    tx: watch::Sender<Option<Settled>>,
}

/// What [`Idempotency::begin`] decided for a call.
pub enum Begin {
    /// This call runs: dispatch through the ticket.
    Go(Box<Ticket>),
    /// An identical call already answered (or is answering): this is its answer.
    Replay {
        /// The answer.
        answer: Answer,
        /// When it first arrived.
        answered_at: String,
    },
    /// An identical call is in flight: wait for it.
    Follow(watch::Receiver<Option<Settled>>),
    /// Refused or unknown, without dispatch.
    Stop(Outcome),
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
    // A std mutex: held for map operations only, never across an await.
    flights: Mutex<HashMap<String, Arc<Flight>>>,
}

fn now_ms() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp_nanos() as i64 / 1_000_000
}

fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

impl Idempotency {
    /// A service over `store`.
    pub fn new(store: Arc<dyn Store>, retention: Retention) -> Arc<Idempotency> {
        Arc::new(Idempotency {
            store,
            retention,
            flights: Mutex::new(HashMap::new()),
        })
    }

    /// The store (for reconciliation and listing).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    fn flights(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Flight>>> {
        self.flights.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Join an in-flight identical call, or become the leader for the key.
    fn lead_or_follow(&self, claim: &Claim) -> Result<Arc<Flight>, Begin> {
        let mut flights = self.flights();
        if let Some(f) = flights.get(&claim.key) {
            if f.digest != claim.digest {
                return Err(Begin::Stop(
                    if f.tool != claim.tool || f.server != claim.server {
                        Outcome::Remap
                    } else {
                        Outcome::Drift
                    },
                ));
            }
            return Err(Begin::Follow(f.tx.subscribe()));
        }
        let (tx, _) = watch::channel(None);
        let flight = Arc::new(Flight {
            digest: claim.digest.clone(),
            server: claim.server.clone(),
            tool: claim.tool.clone(),
            tx,
        });
        flights.insert(claim.key.clone(), flight.clone());
        Ok(flight)
    }

    fn settle(&self, key: &str, flight: &Arc<Flight>, settled: Settled) {
        let mut flights = self.flights();
        if flights.get(key).is_some_and(|f| Arc::ptr_eq(f, flight)) {
            flights.remove(key);
        }
        drop(flights);
        flight.tx.send_replace(Some(settled));
    }

    /// Order step "ledger lookup": decide what a write call with this claim
    /// gets, reserving the key when it runs.
    pub async fn begin(self: &Arc<Self>, claim: Claim) -> Result<Begin, StoreError> {
        self.begin_gated(claim, |_| async { Gate::Pass }).await
    }

    /// [`Idempotency::begin`] with a gate between the ledger lookup and the
    /// reservation (DESIGN.md section 3's order): a replay, a wait or a
    /// conflict is answered first; only a call that would run meets the gate,
    /// and a gate that says no leaves the key free. The gate runs while this
    /// call leads its key's flight, so identical calls (same key) wait for
    /// it instead of racing it. When the approval the gate chose is no
    /// longer usable at reservation time (a concurrent call with another key
    /// consumed it), the gate is asked again, told what it lost.
    pub async fn begin_gated<G, F>(
        self: &Arc<Self>,
        claim: Claim,
        mut gate: G,
    ) -> Result<Begin, StoreError>
    where
        G: FnMut(Option<crate::approval::ProposalState>) -> F,
        F: std::future::Future<Output = Gate>,
    {
        let flight = match self.lead_or_follow(&claim) {
            Ok(f) => f,
            Err(other) => return Ok(other),
        };
        let now = now_ms();
        let ttl = if claim.explicit {
            self.retention.explicit
        } else {
            self.retention.derived
        };
        let ttl_ms = ttl.as_millis().min(i64::MAX as u128) as i64;
        let result = async {
            let existing = self.store.get(&claim.key)?;
            let existing = match judge(existing.as_ref(), &claim, now) {
                Verdict::Proceed => {
                    let mut lost = None;
                    let mut bound = None;
                    for _ in 0..GATE_ROUNDS {
                        let approval = match gate(lost).await {
                            Gate::Refuse(refusal) => return Ok(Begin::Stop(refusal)),
                            Gate::Pass => None,
                            Gate::Consume(id) => Some(id),
                        };
                        // The gate may have waited (a held call): judge
                        // expiry against the time of the reservation.
                        let now = now_ms();
                        let record = Record::reserve(&claim, now, ttl_ms);
                        match self
                            .store
                            .reserve_with(claim.key.clone(), record.clone(), now, approval)
                            .await?
                        {
                            Reservation::Reserved => {
                                return Ok(Begin::Go(Box::new(Ticket {
                                    svc: self.clone(),
                                    key: claim.key.clone(),
                                    record,
                                    flight: flight.clone(),
                                    dispatched: false,
                                    finished: false,
                                })))
                            }
                            // Another process claimed it in between.
                            Reservation::Bound(rec) => {
                                bound = Some(rec);
                                break;
                            }
                            Reservation::Unapproved(state) => lost = Some(state),
                        }
                    }
                    if bound.is_none() {
                        // The approval kept slipping away: fail closed.
                        return Ok(Begin::Stop(Outcome::NotDispatched));
                    }
                    bound
                }
                _ => existing,
            };
            Ok(self.verdict_for(existing.as_ref(), &claim, now))
        }
        .await;
        match &result {
            Ok(Begin::Go(_)) => {}
            Ok(Begin::Replay {
                answer,
                answered_at,
            }) => self.settle(
                &claim.key,
                &flight,
                Settled::Answered {
                    answer: answer.clone(),
                    answered_at: answered_at.clone(),
                },
            ),
            Ok(Begin::Stop(o)) => self.settle(&claim.key, &flight, Settled::Verdict(o.clone())),
            // A record in flight with no leader in this process: its leader
            // is gone (another process, or a crash not yet recovered). Never
            // re-execute: the outcome is unknown.
            Ok(Begin::Follow(_)) => {
                self.settle(&claim.key, &flight, Settled::Verdict(Outcome::Unknown))
            }
            Err(_) => self.settle(
                &claim.key,
                &flight,
                Settled::Verdict(Outcome::NotDispatched),
            ),
        }
        match result {
            Ok(Begin::Follow(_)) => Ok(Begin::Stop(Outcome::Unknown)),
            other => other,
        }
    }

    fn verdict_for(&self, rec: Option<&Record>, claim: &Claim, now: i64) -> Begin {
        match (judge(rec, claim, now), rec) {
            (
                Verdict::Replay,
                Some(Record {
                    answer: Some(answer),
                    answered_at,
                    ..
                }),
            ) => Begin::Replay {
                answer: answer.clone(),
                answered_at: answered_at.clone().unwrap_or_default(),
            },
            (Verdict::Wait, _) => Begin::Follow(watch::channel(None).1),
            (Verdict::Remap, _) => Begin::Stop(Outcome::Remap),
            (Verdict::Drift, _) => Begin::Stop(Outcome::Drift),
            // Unknown, or a complete record without its answer (damaged):
            // never run again.
            _ => Begin::Stop(Outcome::Unknown),
        }
    }

    /// Single-flight without the store, for read-only tools: identical reads
    /// in flight share one upstream call; a finished read is never replayed.
    pub fn coalesce_read(
        self: &Arc<Self>,
        claim: &Claim,
    ) -> Result<ReadLead, watch::Receiver<Option<Settled>>> {
        match self.lead_or_follow(claim) {
            Ok(flight) => Ok(ReadLead {
                svc: self.clone(),
                key: claim.key.clone(),
                flight,
                done: false,
            }),
            Err(Begin::Follow(rx)) => Err(rx),
            // A different read under the same derived key cannot happen (the
            // digest is part of it); with an explicit key reads use `begin`.
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

/// Proof that a call's key is durably `dispatched`: the one thing the relay
/// needs to send a `tools/call` upstream. Only [`Ticket::dispatch`] makes one.
#[derive(Debug)]
pub struct Permit {
    _private: (),
}

/// The leader's claim on a key, from reservation to the answer.
pub struct Ticket {
    svc: Arc<Idempotency>,
    key: String,
    record: Record,
    flight: Arc<Flight>,
    dispatched: bool,
    finished: bool,
}

impl Ticket {
    /// `reserved → dispatched`, durably, before anything goes upstream.
    pub async fn dispatch(&mut self) -> Result<Permit, StoreError> {
        self.dispatch_with(None).await
    }

    /// [`Ticket::dispatch`], committing `outbox` (audit entries that must
    /// be on disk before the dispatch) in the same durable commit.
    pub async fn dispatch_with(
        &mut self,
        outbox: Option<(u64, String)>,
    ) -> Result<Permit, StoreError> {
        let mut next = self.record.clone();
        next.state = State::Dispatched;
        let moved = self
            .svc
            .store
            .transition_with(self.key.clone(), State::Reserved, next.clone(), outbox)
            .await?;
        if !moved {
            return Err(StoreError(format!(
                "key `{}` changed state before dispatch",
                self.key
            )));
        }
        self.record = next;
        self.dispatched = true;
        Ok(Permit { _private: () })
    }

    /// The server answered: `complete`, and followers get the answer.
    pub async fn complete(mut self, answer: Answer) -> String {
        let answered_at = now_rfc3339();
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
        .await;
        answered_at
    }

    /// Proven not sent (or refused unprocessed): the key is free again.
    pub async fn not_dispatched(mut self) {
        let mut next = self.record.clone();
        next.state = State::NotDispatched;
        self.finish(next, Settled::Verdict(Outcome::NotDispatched))
            .await;
    }

    /// Sent, answer lost: `unknown` until an operator reconciles it.
    pub async fn unknown(mut self) {
        let mut next = self.record.clone();
        next.state = State::Unknown;
        self.finish(next, Settled::Verdict(Outcome::Unknown)).await;
    }

    async fn finish(&mut self, next: Record, settled: Settled) {
        let from = if self.dispatched {
            State::Dispatched
        } else {
            State::Reserved
        };
        // A store failure here leaves the record `dispatched`, which recovery
        // turns into `unknown`: conservative, never a second execution.
        if let Err(e) = self
            .svc
            .store
            .transition(self.key.clone(), from, next)
            .await
        {
            tracing::error!(key = %self.key, "ledger transition failed: {e}");
        }
        self.finished = true;
        self.svc.settle(&self.key, &self.flight, settled);
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
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(e) = svc.store.transition(key.clone(), from, next).await {
                    tracing::error!(%key, "ledger transition after cancellation failed: {e}");
                }
            });
        }
    }
}

/// The leader of a coalesced read.
pub struct ReadLead {
    svc: Arc<Idempotency>,
    key: String,
    flight: Arc<Flight>,
    done: bool,
}

impl ReadLead {
    /// A read-only call needs no durable record before it goes out (it is
    /// retried, never `unknown`); leading its flight is its permit.
    pub fn permit(&self) -> Permit {
        Permit { _private: () }
    }

    /// Share the read's outcome with its followers.
    pub fn finish(mut self, settled: Settled) {
        self.done = true;
        self.svc.settle(&self.key, &self.flight, settled);
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
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    fn svc() -> Arc<Idempotency> {
        Idempotency::new(
            Arc::new(MemoryStore::default()),
            Retention {
                explicit: Duration::from_secs(3600),
                derived: Duration::from_secs(300),
            },
        )
    }

    fn claim(key: &str, digest: &str, tool: &str) -> Claim {
        Claim {
            key: key.into(),
            client_key: key.into(),
            explicit: true,
            digest: digest.into(),
            server: "s".into(),
            tool: tool.into(),
        }
    }

    #[tokio::test]
    async fn followers_share_the_leaders_answer() {
        let s = svc();
        let Begin::Go(mut t) = s.begin(claim("k", "d", "t")).await.unwrap() else {
            panic!("leader")
        };
        let Begin::Follow(rx) = s.begin(claim("k", "d", "t")).await.unwrap() else {
            panic!("follower")
        };
        let Begin::Stop(Outcome::Drift) = s.begin(claim("k", "other", "t")).await.unwrap() else {
            panic!("drift")
        };
        let Begin::Stop(Outcome::Remap) = s.begin(claim("k", "other", "u")).await.unwrap() else {
            panic!("remap")
        };
        t.dispatch().await.unwrap();
        t.complete(Answer::Result("{\"ok\":1}".into())).await;
        let Settled::Answered { answer, .. } = follow(rx).await else {
            panic!("answer")
        };
        assert_eq!(answer, Answer::Result("{\"ok\":1}".into()));
        let Begin::Replay { answer, .. } = s.begin(claim("k", "d", "t")).await.unwrap() else {
            panic!("replay")
        };
        assert_eq!(answer, Answer::Result("{\"ok\":1}".into()));
    }

    #[tokio::test]
    async fn a_dropped_dispatched_ticket_is_unknown_and_never_reruns() {
        let s = svc();
        let Begin::Go(mut t) = s.begin(claim("k", "d", "t")).await.unwrap() else {
            panic!()
        };
        t.dispatch().await.unwrap();
        drop(t);
        tokio::task::yield_now().await;
        for _ in 0..50 {
            if s.store().get("k").unwrap().unwrap().state == State::Unknown {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(matches!(
            s.begin(claim("k", "d", "t")).await.unwrap(),
            Begin::Stop(Outcome::Unknown)
        ));
    }

    #[tokio::test]
    async fn not_dispatched_frees_the_key() {
        let s = svc();
        let Begin::Go(t) = s.begin(claim("k", "d", "t")).await.unwrap() else {
            panic!()
        };
        t.not_dispatched().await;
        assert!(matches!(
            s.begin(claim("k", "d", "t")).await.unwrap(),
            Begin::Go(_)
        ));
    }

    #[derive(Debug, Clone)]
    enum Step {
        Arrive { key: u8, digest: u8 },
        Complete { leader: u8 },
        Lose { leader: u8 },
        Restart,
        Reconcile { key: u8 },
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0u8..3, 0u8..2).prop_map(|(key, digest)| Step::Arrive { key, digest }),
            2 => (0u8..8).prop_map(|leader| Step::Complete { leader }),
            1 => (0u8..8).prop_map(|leader| Step::Lose { leader }),
            1 => Just(Step::Restart),
            1 => (0u8..3).prop_map(|key| Step::Reconcile { key }),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config { cases: 200, ..Default::default() })]
        /// Random interleavings of arrivals, completions, losses, restarts
        /// and reconciliations against a model. Invariants: at most one
        /// dispatch per key between two frees, and every follower gets what
        /// its leader got.
        #[test]
        fn ledger_model(steps in proptest::collection::vec(step(), 1..60)) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
                let retention = Retention { explicit: Duration::from_secs(3600), derived: Duration::from_secs(300) };
                let mut s = Idempotency::new(store.clone(), retention);
                // Per key: dispatches since the key was last free.
                let mut dispatches: HashMap<String, usize> = HashMap::new();
                type Leader = (String, Box<Ticket>, Vec<watch::Receiver<Option<Settled>>>);
                let mut leaders: Vec<Leader> = Vec::new();
                let mut answered: HashMap<String, Answer> = HashMap::new();
                for st in steps {
                    match st {
                        Step::Arrive { key, digest } => {
                            let k = format!("k{key}");
                            let c = claim(&k, &format!("d{key}-{digest}"), "t");
                            match s.begin(c).await.unwrap() {
                                Begin::Go(mut t) => {
                                    t.dispatch().await.unwrap();
                                    let n = dispatches.entry(k.clone()).or_default();
                                    *n += 1;
                                    assert!(*n <= 1, "second dispatch for {k}");
                                    leaders.push((k, t, Vec::new()));
                                }
                                Begin::Follow(rx) => {
                                    let l = leaders.iter_mut().find(|(lk, _, _)| *lk == k).expect("a follower has a leader");
                                    l.2.push(rx);
                                }
                                Begin::Replay { answer, .. } => {
                                    assert_eq!(Some(&answer), answered.get(&k), "replay of {k} is its answer");
                                }
                                Begin::Stop(_) => {}
                            }
                        }
                        Step::Complete { leader } | Step::Lose { leader } if leaders.is_empty() => { let _ = leader; }
                        Step::Complete { leader } => {
                            let (k, t, followers) = leaders.remove(leader as usize % leaders.len());
                            let answer = Answer::Result(format!("\"{k}-{}\"", answered.len()));
                            t.complete(answer.clone()).await;
                            answered.insert(k.clone(), answer.clone());
                            for rx in followers {
                                let got = follow(rx).await;
                                assert!(matches!(got, Settled::Answered { answer: ref a, .. } if *a == answer), "{got:?}");
                            }
                        }
                        Step::Lose { leader } => {
                            let (_, t, followers) = leaders.remove(leader as usize % leaders.len());
                            t.unknown().await;
                            for rx in followers {
                                assert_eq!(follow(rx).await, Settled::Verdict(Outcome::Unknown));
                            }
                        }
                        Step::Restart => {
                            // Tickets die with the process: dispatched → unknown.
                            for (_, t, followers) in leaders.drain(..) {
                                drop(t);
                                for rx in followers {
                                    assert_eq!(follow(rx).await, Settled::Verdict(Outcome::Unknown));
                                }
                            }
                            tokio::task::yield_now().await;
                            store.recover().unwrap();
                            s = Idempotency::new(store.clone(), retention);
                        }
                        Step::Reconcile { key } => {
                            let k = format!("k{key}");
                            if let Some(mut r) = store.get(&k).unwrap().filter(|r| r.state == State::Unknown) {
                                r.state = State::NotDispatched;
                                assert!(store.transition(k.clone(), State::Unknown, r).await.unwrap());
                                dispatches.remove(&k);
                            }
                        }
                    }
                }
            });
        }
    }
}
