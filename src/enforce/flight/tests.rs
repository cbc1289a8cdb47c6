use super::*;
use crate::store::MemoryStore;

fn svc() -> Arc<Idempotency> {
    Idempotency::new(
        Arc::new(MemoryStore::default()),
        Retention {
            explicit: Duration::from_secs(3600),
            derived: Duration::from_secs(300),
        },
        Arc::new(crate::core::time::SystemClock),
    )
}

/// Lookup and, when the key is free, reserve it (no approval).
enum Begin {
    Go(Box<Ticket>),
    Replay { answer: Answer },
    Follow(watch::Receiver<Option<Settled>>),
    Stop(Outcome),
}

impl Idempotency {
    async fn begin(self: &Arc<Self>, claim: Claim) -> Result<Begin, StoreError> {
        let now = crate::core::time::now_ms();
        let found = match self.lookup(claim, now).await? {
            Lookup::Lead(lead) => match lead.reserve(None, now).await? {
                Reserve::Go(t) => return Ok(Begin::Go(t)),
                Reserve::Lost(..) => unreachable!("no approval was asked for"),
                Reserve::Bound(found) => found,
            },
            other => other,
        };
        Ok(match found {
            Lookup::Replay { answer, .. } => Begin::Replay { answer },
            Lookup::Follow(rx) => Begin::Follow(rx),
            Lookup::Stop(o) => Begin::Stop(o),
            Lookup::Elsewhere => Begin::Stop(Outcome::Unknown),
            Lookup::Lead(_) => unreachable!("a lookup after a reservation leads nothing"),
        })
    }
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
    t.complete(Answer::Result("{\"ok\":1}".into()))
        .await
        .unwrap();
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
        if s.store().get("k").await.unwrap().unwrap().state == State::Unknown {
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
async fn a_ticket_dropped_before_dispatch_gives_its_guards_back() {
    let s = svc();
    let budget = [crate::core::guard::Claim::budget(
        "card",
        "acme",
        "principal:a",
        rust_decimal::Decimal::from(600),
        rust_decimal::Decimal::from(1000),
        60_000,
        crate::core::config::Over::Approval,
    )];
    let now = crate::core::time::now_ms();
    let Begin::Go(mut t) = s.begin(claim("k", "d", "t")).await.unwrap() else {
        panic!()
    };
    assert!(
        s.store()
            .guards_take("k", &budget, false, now)
            .await
            .unwrap()
            .taken
    );
    t.guarded();
    // The call is cancelled before it is sent.
    drop(t);
    let mut spent = None;
    for _ in 0..200 {
        let rec = s.store().get("k").await.unwrap().unwrap();
        let look = s.store().guards_look("other", &budget, now).await.unwrap();
        if rec.state == State::NotDispatched {
            spent = Some(look.spent[0]);
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(
        spent,
        Some(rust_decimal::Decimal::ZERO),
        "the key is freed and its 600 no longer counts"
    );
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
            let mut s = Idempotency::new(store.clone(), retention, Arc::new(crate::core::time::SystemClock));
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
                        t.complete(answer.clone()).await.unwrap();
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
                        store.recover().await.unwrap();
                        s = Idempotency::new(store.clone(), retention, Arc::new(crate::core::time::SystemClock));
                    }
                    Step::Reconcile { key } => {
                        let k = format!("k{key}");
                        if let Some(mut r) = store.get(&k).await.unwrap().filter(|r| r.state == State::Unknown) {
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

/// Lead `claim`'s key (the lookup must find it free).
async fn lead(s: &Arc<Idempotency>, claim: Claim) -> Lead {
    match s.lookup(claim, crate::core::time::now_ms()).await.unwrap() {
        Lookup::Lead(lead) => lead,
        _ => panic!("the key is free"),
    }
}

#[tokio::test]
async fn a_deferred_ticket_claims_its_key_with_the_dispatch_and_its_followers_wait_for_it() {
    let s = svc();
    let l = lead(&s, claim("k", "d", "t")).await;
    assert!(l.fresh(), "no record under the key");
    let mut t = l.defer(crate::core::time::now_ms());
    assert_eq!(
        s.store().get("k").await.unwrap(),
        None,
        "nothing written yet"
    );
    let Begin::Follow(rx) = s.begin(claim("k", "d", "t")).await.unwrap() else {
        panic!("follower")
    };
    assert_eq!(t.dispatch_with(None).await.unwrap(), Dispatch::Dispatched);
    assert!(t.is_dispatched());
    assert_eq!(
        s.store().get("k").await.unwrap().unwrap().state,
        State::Dispatched
    );
    t.complete(Answer::Result("{\"ok\":1}".into()))
        .await
        .unwrap();
    let Settled::Answered { answer, .. } = follow(rx).await else {
        panic!("answer")
    };
    assert_eq!(answer, Answer::Result("{\"ok\":1}".into()));
    assert_eq!(
        s.store().get("k").await.unwrap().unwrap().state,
        State::Complete
    );
}

#[tokio::test]
async fn a_deferred_ticket_not_sent_writes_nothing_and_frees_its_key() {
    let s = svc();
    let t = lead(&s, claim("k", "d", "t"))
        .await
        .defer(crate::core::time::now_ms());
    let Begin::Follow(rx) = s.begin(claim("k", "d", "t")).await.unwrap() else {
        panic!("follower")
    };
    t.not_dispatched().await;
    assert_eq!(follow(rx).await, Settled::Verdict(Outcome::NotDispatched));
    assert_eq!(s.store().get("k").await.unwrap(), None);
    // Dropped unsent, too: nothing to move, and the key leads again.
    drop(lead(&s, claim("k", "d", "t")).await.defer(0));
    assert!(matches!(
        s.begin(claim("k", "d", "t")).await.unwrap(),
        Begin::Go(_)
    ));
    assert_eq!(
        s.store().get("k").await.unwrap().unwrap().state,
        State::Reserved
    );
}

#[tokio::test]
async fn a_deferred_claim_that_finds_the_key_held_writes_nothing_and_hands_followers_to_the_holder()
{
    let s = svc();
    let mut t = lead(&s, claim("k", "d", "t"))
        .await
        .defer(crate::core::time::now_ms());
    let Begin::Follow(rx) = s.begin(claim("k", "d", "t")).await.unwrap() else {
        panic!("follower")
    };
    // Another process sharing the store reserves the key meanwhile.
    let theirs = Record::reserve(&claim("k", "d", "t"), 0, i64::MAX / 2);
    s.store()
        .reserve("k".into(), theirs.clone(), 0)
        .await
        .unwrap();
    assert_eq!(
        t.dispatch_with(Some((1, "[1]".into()))).await.unwrap(),
        Dispatch::Taken
    );
    assert!(!t.is_dispatched());
    t.taken();
    assert_eq!(follow(rx).await, Settled::Elsewhere);
    assert_eq!(s.store().get("k").await.unwrap(), Some(theirs));
    assert!(s.store().outbox().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_key_whose_record_no_longer_binds_is_led_but_not_fresh() {
    let s = svc();
    let Begin::Go(t) = s.begin(claim("k", "d", "t")).await.unwrap() else {
        panic!()
    };
    t.not_dispatched().await;
    let l = lead(&s, claim("k", "d", "t")).await;
    assert!(!l.fresh(), "a not_dispatched record is there");
}
