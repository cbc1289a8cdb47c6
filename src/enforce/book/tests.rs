use std::collections::BTreeSet;

use ed25519_dalek::SigningKey;
use proptest::prelude::*;

use super::*;
use crate::core::approval::Verdict;
use crate::core::ledger::{Claim, Record, State};
use crate::core::time::SystemClock;
use crate::store::MemoryStore;
use crate::store::{
    Inputs, Ledger, Outbox, Proposals, Recovery, Reservation, Seen, StoreFuture, Tasks,
};

/// The memory store, yielding before every operation: two decisions
/// joined in one task interleave at each store call, as two gateways'
/// do at each round trip.
#[derive(Default)]
struct Yielding(MemoryStore);

macro_rules! yielding {
    ($store:expr, $inner:ident => $call:expr) => {{
        let $inner = &$store.0;
        Box::pin(async move {
            tokio::task::yield_now().await;
            $call.await
        })
    }};
}

/// No guards in these tests.
impl crate::store::guards::Guards for Yielding {}

/// Passkey counters as the memory store keeps them.
impl crate::store::console::ConsoleState for Yielding {
    fn passkey_counter(
        &self,
        key: String,
        counter: u32,
    ) -> StoreFuture<'_, crate::store::console::Counted> {
        yielding!(self, s => s.passkey_counter(key, counter))
    }
}

impl Store for Yielding {}

impl Ledger for Yielding {
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>> {
        yielding!(self, s => s.get(key))
    }

    fn reserve_with(
        &self,
        key: String,
        record: Record,
        now_ms: i64,
        approval: Option<String>,
    ) -> StoreFuture<'_, Reservation> {
        yielding!(self, s => s.reserve_with(key, record, now_ms, approval))
    }

    fn transition_telling(
        &self,
        key: String,
        from: State,
        to: Record,
        outbox: Option<(u64, String)>,
        notices: Vec<crate::core::notify::Notice>,
    ) -> StoreFuture<'_, bool> {
        yielding!(self, s => s.transition_telling(key, from, to, outbox, notices))
    }

    fn recover(&self) -> StoreFuture<'_, Recovery> {
        yielding!(self, s => s.recover())
    }

    fn gc(&self, now_ms: i64) -> StoreFuture<'_, usize> {
        yielding!(self, s => s.gc(now_ms))
    }

    fn list(&self, state: Option<State>) -> StoreFuture<'_, Vec<(String, Record)>> {
        yielding!(self, s => s.list(state))
    }
}

impl Proposals for Yielding {
    fn put_proposal_with(
        &self,
        proposal: Proposal,
        expect: Option<ProposalState>,
        notices: Vec<crate::core::notify::Notice>,
    ) -> StoreFuture<'_, bool> {
        yielding!(self, s => s.put_proposal_with(proposal, expect, notices))
    }

    fn get_proposal<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Proposal>> {
        yielding!(self, s => s.get_proposal(id))
    }

    fn list_proposals(&self) -> StoreFuture<'_, Vec<Proposal>> {
        yielding!(self, s => s.list_proposals())
    }

    fn gc_proposals(&self, before_ms: i64) -> StoreFuture<'_, usize> {
        yielding!(self, s => s.gc_proposals(before_ms))
    }
}

impl Outbox for Yielding {
    fn outbox(&self) -> StoreFuture<'_, Vec<(u64, String)>> {
        yielding!(self, s => s.outbox())
    }

    fn outbox_clear(&self, upto: u64) -> StoreFuture<'_, usize> {
        yielding!(self, s => s.outbox_clear(upto))
    }
}

impl Seen for Yielding {
    fn pin_first_use(&self, pins: Vec<(String, String)>) -> StoreFuture<'_, usize> {
        yielding!(self, s => s.pin_first_use(pins))
    }

    fn first_use_pins(&self) -> StoreFuture<'_, Vec<String>> {
        yielding!(self, s => s.first_use_pins())
    }

    fn use_nonce(&self, n: String, until: i64, now: i64) -> StoreFuture<'_, bool> {
        yielding!(self, s => s.use_nonce(n, until, now))
    }
}

impl Inputs for Yielding {}

impl Tasks for Yielding {}

/// Reviewers by index: alice (leads, two keys), bob (leads), dave
/// (finance), erin (finance and leads), and `agent-7`, the requester
/// (leads).
const NAMES: [&str; 5] = ["alice", "bob", "dave", "erin", "agent-7"];

fn signing(who: usize, key: usize) -> SigningKey {
    // alice's second key is her own; everyone else has one.
    let seed = if who == 0 && key == 1 {
        99
    } else {
        who as u8 + 1
    };
    SigningKey::from_bytes(&[seed; 32])
}

fn reviewers() -> Reviewers {
    let pk = |w, k| crate::core::reviewers::format_public_key(&signing(w, k).verifying_key());
    let groups = [
        "[\"leads\"]",
        "[\"leads\"]",
        "[\"finance\"]",
        "[\"finance\", \"leads\"]",
        "[\"leads\"]",
    ];
    let mut text = String::new();
    for (i, name) in NAMES.iter().enumerate() {
        let keys = if i == 0 {
            format!("public_keys = [\"{}\", \"{}\"]", pk(0, 0), pk(0, 1))
        } else {
            format!("public_key = \"{}\"", pk(i, 0))
        };
        text.push_str(&format!(
            "[[reviewers]]\nname = \"{name}\"\n{keys}\ngroups = {}\ntenants = [\"acme\"]\n",
            groups[i]
        ));
    }
    Reviewers::parse(&text).unwrap_or_else(|e| panic!("{e:?}"))
}

fn pending(quorum: Quorum) -> Proposal {
    Proposal {
        quorum,
        ..Proposal::pending(
            "p-1".into(),
            "acme".into(),
            "agent-7".into(),
            "payments".into(),
            "charge_card".into(),
            serde_json::json!({"amount": 500}),
            "sha256:aa".into(),
        )
    }
}

const POLICY_SET: &str = "sha256:model";

/// `who` approves (or denies) `p-1` with key `key` through `book`.
async fn decide(
    book: &Book,
    reviewers: &Reviewers,
    who: usize,
    key: usize,
    verdict: Verdict,
) -> Result<Proposal, DecideError> {
    let now = crate::core::time::now_ms();
    let shown = book
        .get("p-1")
        .await?
        .ok_or_else(|| DecideError::NotFound("p-1".into()))?;
    let st = shown.statement(
        verdict,
        NAMES[who],
        "model",
        &rfc3339(now),
        &rfc3339(now + 600_000),
        Some(POLICY_SET),
    );
    let sig = st.sign(&signing(who, key)).unwrap_or_default();
    let reviewer = reviewers
        .get(NAMES[who])
        .cloned()
        .unwrap_or_else(|| panic!("{who}"));
    let under = Under {
        policy_set: POLICY_SET,
        reviewers,
    };
    book.decide(
        "p-1",
        st,
        Proof::Ed25519(&sig),
        &reviewer,
        under,
        |_| Ok(()),
    )
    .await
}

#[derive(Debug, Clone)]
enum Step {
    Approve {
        who: usize,
        key: usize,
        gw: usize,
    },
    /// Two reviewers at once, through the two gateways.
    Race {
        a: usize,
        b: usize,
    },
    Withdraw {
        who: usize,
        gw: usize,
    },
    Deny {
        who: usize,
        gw: usize,
    },
    /// An execution with a fresh idempotency key consumes `p-1`.
    Execute,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (0usize..5, 0usize..2, 0usize..2).prop_map(|(who, key, gw)| Step::Approve { who, key, gw }),
        3 => (0usize..5, 0usize..5).prop_map(|(a, b)| Step::Race { a, b }),
        2 => (0usize..5, 0usize..2).prop_map(|(who, gw)| Step::Withdraw { who, gw }),
        1 => (0usize..5, 0usize..2).prop_map(|(who, gw)| Step::Deny { who, gw }),
        3 => Just(Step::Execute),
    ]
}

fn quorum() -> impl Strategy<Value = Quorum> {
    prop_oneof![
        Just(Quorum {
            approvals: 2,
            from: vec![],
            denials: 1
        }),
        Just(Quorum {
            approvals: 1,
            from: vec!["finance".into(), "leads".into()],
            denials: 2
        }),
        Just(Quorum {
            approvals: 3,
            from: vec!["finance".into()],
            denials: 2
        }),
    ]
}

/// The model's own judgement of a quorum: distinct approvers other than
/// the requester, enough of them, and the groups covered one person
/// each (tried over every assignment, not with the gateway's matching).
fn met(q: &Quorum, approvers: &BTreeSet<usize>, reviewers: &Reviewers) -> bool {
    let people: Vec<&Reviewer> = approvers
        .iter()
        .filter(|w| NAMES[**w] != "agent-7")
        .filter_map(|w| reviewers.get(NAMES[*w]))
        .collect();
    if (people.len() as u32) < q.needed() {
        return false;
    }
    fn cover(groups: &[String], people: &[&Reviewer], used: &mut Vec<bool>) -> bool {
        let Some((g, rest)) = groups.split_first() else {
            return true;
        };
        for (i, r) in people.iter().enumerate() {
            if !used[i] && r.groups.contains(g) {
                used[i] = true;
                if cover(rest, people, used) {
                    return true;
                }
                used[i] = false;
            }
        }
        false
    }
    cover(&q.from, &people, &mut vec![false; people.len()])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
    /// Reviewers approving (one at a time and two at once through two
    /// gateways), withdrawing and denying, interleaved with executions
    /// that try to consume the proposal, against a model. Invariants:
    /// no approval is lost and none counts twice; the requester never
    /// counts; never more than one execution, and never one without
    /// the quorum.
    #[test]
    fn quorum_model(q in quorum(), steps in proptest::collection::vec(step(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let store: Arc<dyn Store> = Arc::new(Yielding::default());
            let config = ApprovalsConfig::default();
            let books = [
                Book::new(store.clone(), config.clone(), None, Arc::new(SystemClock)),
                Book::new(store.clone(), config, None, Arc::new(SystemClock)),
            ];
            let reviewers = reviewers();
            let mut first = pending(q.clone());
            assert!(books[0].write(&mut first, None).await.unwrap());
            // The model: who approved (names), who denied, whether it
            // was settled, how many executions.
            let mut approvers: BTreeSet<usize> = BTreeSet::new();
            let mut deniers: BTreeSet<usize> = BTreeSet::new();
            let mut executions = 0;
            let mut keys = 0;
            for st in steps {
                let state = books[0].get("p-1").await.unwrap().unwrap().state;
                match st {
                    Step::Approve { who, key, gw } => {
                        let r = decide(&books[gw], &reviewers, who, key, Verdict::Approve).await;
                        let fresh = state == ProposalState::Pending
                            && !approvers.contains(&who)
                            && !deniers.contains(&who)
                            && NAMES[who] != "agent-7";
                        assert_eq!(r.is_ok(), fresh, "{who} approves: {r:?}");
                        if r.is_ok() {
                            approvers.insert(who);
                        }
                    }
                    Step::Race { a, b } => {
                        let (ra, rb) = tokio::join!(
                            decide(&books[0], &reviewers, a, 0, Verdict::Approve),
                            decide(&books[1], &reviewers, b, 0, Verdict::Approve)
                        );
                        // One person through two gateways counts once.
                        if a == b {
                            assert!(!(ra.is_ok() && rb.is_ok()), "{a} counted twice");
                        }
                        if ra.is_ok() {
                            approvers.insert(a);
                        }
                        if rb.is_ok() {
                            approvers.insert(b);
                        }
                    }
                    Step::Withdraw { who, gw } => {
                        let r = books[gw].withdraw("p-1", reviewers.get(NAMES[who]).unwrap()).await;
                        let can = state == ProposalState::Pending && approvers.contains(&who);
                        assert_eq!(r.is_ok(), can, "{who} withdraws: {r:?}");
                        if r.is_ok() {
                            approvers.remove(&who);
                        }
                    }
                    Step::Deny { who, gw } => {
                        let r = decide(&books[gw], &reviewers, who, 0, Verdict::Deny).await;
                        if r.is_ok() {
                            deniers.insert(who);
                        }
                    }
                    Step::Execute => {
                        keys += 1;
                        let claim = Claim {
                            key: format!("k{keys}"),
                            client_key: format!("k{keys}"),
                            explicit: true,
                            digest: "sha256:aa".into(),
                            server: "payments".into(),
                            tool: "charge_card".into(),
                        };
                        let now = crate::core::time::now_ms();
                        let record = Record::reserve(&claim, now, 600_000);
                        let r = store
                            .reserve_with(claim.key.clone(), record, now, Some("p-1".into()))
                            .await
                            .unwrap();
                        if r == Reservation::Reserved {
                            executions += 1;
                            assert!(executions <= 1, "a second execution");
                            assert!(met(&q, &approvers, &reviewers), "ran without the quorum: {approvers:?}");
                        }
                    }
                }
                // What the store holds is what the model says: no
                // approval lost, none twice.
                let stored = books[0].get("p-1").await.unwrap().unwrap();
                let names: BTreeSet<&str> = stored.approvals.iter().map(Given::reviewer).collect();
                let want: BTreeSet<&str> = approvers.iter().map(|w| NAMES[*w]).collect();
                if stored.state != ProposalState::Denied {
                    assert_eq!(names, want);
                }
                assert_eq!(stored.approvals.len(), names.len(), "an approval counted twice");
                // Approved exactly when the model says the quorum is met
                // (and nothing ended it first).
                match stored.state {
                    ProposalState::Approved | ProposalState::Consumed => {
                        assert!(met(&q, &approvers, &reviewers), "approved without the quorum");
                    }
                    ProposalState::Pending => {
                        assert!(!met(&q, &approvers, &reviewers), "the quorum is met, yet pending");
                    }
                    _ => {}
                }
            }
        });
    }
}
