//! The store's conformance suite: the same rules checked against every
//! store (memory, redb, PostgreSQL on a real server), and the helpers other
//! stores' tests share.

use super::*;
use crate::core::approval::{Proposal, ProposalState};
use crate::core::ledger::{Answer, Claim, Record};
use crate::core::notify::Notice;

mod on_postgres;
mod on_redb;
pub(crate) use on_postgres::PgSchema;

pub(crate) fn claim(digest: &str) -> Claim {
    Claim {
        key: "k".into(),
        client_key: "k".into(),
        explicit: true,
        digest: digest.into(),
        server: "s".into(),
        tool: "t".into(),
    }
}

pub(crate) fn with_state(mut r: Record, s: State) -> Record {
    r.state = s;
    r
}

/// The conformance suite every store must pass.
async fn conformance(store: &dyn Store) {
    let r = Record::reserve(&claim("d1"), 0, 1000);
    assert_eq!(store.get("k").await.unwrap(), None);
    assert_eq!(
        store.reserve("k".into(), r.clone(), 0).await.unwrap(),
        Reservation::Reserved
    );
    // A second reservation of a bound key writes nothing and returns the binder.
    let other = Record::reserve(&claim("d2"), 1, 1000);
    assert_eq!(
        store.reserve("k".into(), other.clone(), 1).await.unwrap(),
        Reservation::Bound(r.clone())
    );
    // Compare-and-set.
    let dispatched = with_state(r.clone(), State::Dispatched);
    assert!(store
        .transition("k".into(), State::Reserved, dispatched.clone())
        .await
        .unwrap());
    assert!(
        !store
            .transition("k".into(), State::Reserved, dispatched.clone())
            .await
            .unwrap(),
        "the state moved on"
    );
    let mut done = with_state(r.clone(), State::Complete);
    done.answer = Some(Answer::Result("{}".into()));
    assert!(store
        .transition("k".into(), State::Dispatched, done.clone())
        .await
        .unwrap());
    assert_eq!(store.get("k").await.unwrap(), Some(done.clone()));
    // Not allowed: a complete call is never dispatched again.
    assert!(store
        .transition("k".into(), State::Complete, dispatched)
        .await
        .is_err());
    // Expired complete records free the key; gc forgets them.
    assert_eq!(
        store
            .reserve("k".into(), other.clone(), 5000)
            .await
            .unwrap(),
        Reservation::Reserved
    );
    assert_eq!(store.get("k").await.unwrap().unwrap().digest, "d2");
    // not_dispatched frees the key at once.
    assert!(store
        .transition(
            "k".into(),
            State::Reserved,
            with_state(other.clone(), State::NotDispatched)
        )
        .await
        .unwrap());
    assert_eq!(
        store.reserve("k".into(), r.clone(), 6000).await.unwrap(),
        Reservation::Reserved
    );
    // Recovery: reserved → freed, dispatched → unknown.
    let a = Record::reserve(&claim("a"), 0, 1000);
    store.reserve("a".into(), a.clone(), 0).await.unwrap();
    assert!(store
        .transition(
            "a".into(),
            State::Reserved,
            with_state(a.clone(), State::Dispatched)
        )
        .await
        .unwrap());
    let rec = store.recover().await.unwrap();
    assert_eq!(
        rec,
        Recovery {
            freed: 1,
            unknown: 1
        }
    );
    assert_eq!(store.get("k").await.unwrap(), None);
    assert_eq!(store.get("a").await.unwrap().unwrap().state, State::Unknown);
    // Unknown survives gc, even far in the future.
    assert_eq!(store.gc(i64::MAX).await.unwrap(), 0);
    assert_eq!(store.list(Some(State::Unknown)).await.unwrap().len(), 1);
    // Reconciliation.
    assert!(store
        .transition(
            "a".into(),
            State::Unknown,
            with_state(a.clone(), State::NotDispatched)
        )
        .await
        .unwrap());
    assert_eq!(store.gc(0).await.unwrap(), 1);
    assert!(store.list(None).await.unwrap().is_empty());
}

pub(super) fn proposal(id: &str, state: ProposalState, expires_ms: Option<i64>) -> Proposal {
    Proposal {
        state,
        expires_ms,
        ..Proposal::pending(
            id.into(),
            "acme".into(),
            "r".into(),
            "s".into(),
            "t".into(),
            serde_json::json!({}),
            "d1".into(),
        )
    }
}

/// The approval half of the suite: proposals compare-and-set, and
/// {reserve, consume} is one atomic step.
async fn approval_conformance(store: &dyn Store) {
    let p = proposal("p1", ProposalState::Pending, None);
    assert!(store.put_proposal(p.clone(), None).await.unwrap());
    assert!(
        !store.put_proposal(p.clone(), None).await.unwrap(),
        "an id is created once"
    );
    // Two writers that read revision 0: the first wins, the second is
    // refused (it reads again and applies its change over the first's).
    let mut first = p.clone();
    first.joined = 1;
    first.revision = 1;
    let mut second = p.clone();
    second.joined = 7;
    second.revision = 1;
    assert!(store
        .put_proposal(first.clone(), Some(ProposalState::Pending))
        .await
        .unwrap());
    assert!(
        !store
            .put_proposal(second, Some(ProposalState::Pending))
            .await
            .unwrap(),
        "a write over a revision that moved on is refused"
    );
    assert_eq!(store.get_proposal("p1").await.unwrap(), Some(first));
    let mut approved = proposal("p1", ProposalState::Approved, Some(1000));
    approved.revision = 2;
    assert!(!store
        .put_proposal(approved.clone(), Some(ProposalState::Approved))
        .await
        .unwrap());
    assert!(store
        .put_proposal(approved.clone(), Some(ProposalState::Pending))
        .await
        .unwrap());
    assert_eq!(
        store.get_proposal("p1").await.unwrap(),
        Some(approved.clone())
    );

    // Consumption needs a matching digest: nothing is written otherwise.
    let other = Record::reserve(&claim("d2"), 0, 1000);
    assert_eq!(
        store
            .reserve_with("k1".into(), other, 10, Some("p1".into()))
            .await
            .unwrap(),
        Reservation::Unapproved(ProposalState::Invalidated)
    );
    assert_eq!(store.get("k1").await.unwrap(), None);
    // Expired: refused, nothing written.
    let r = Record::reserve(&claim("d1"), 0, 1000);
    assert_eq!(
        store
            .reserve_with("k1".into(), r.clone(), 1000, Some("p1".into()))
            .await
            .unwrap(),
        Reservation::Unapproved(ProposalState::Expired)
    );
    assert_eq!(store.get("k1").await.unwrap(), None);
    // Reserve and consume together.
    assert_eq!(
        store
            .reserve_with("k1".into(), r.clone(), 10, Some("p1".into()))
            .await
            .unwrap(),
        Reservation::Reserved
    );
    let consumed = store.get_proposal("p1").await.unwrap().unwrap();
    assert_eq!(consumed.state, ProposalState::Consumed);
    assert_eq!(consumed.consumed_by.as_deref(), Some("k1"));
    assert_eq!(
        consumed.revision, 3,
        "consumption is a write like any other"
    );
    // Another key cannot use it; the key that consumed it can again once
    // its attempt is proven not sent.
    assert_eq!(
        store
            .reserve_with("k2".into(), r.clone(), 11, Some("p1".into()))
            .await
            .unwrap(),
        Reservation::Unapproved(ProposalState::Consumed)
    );
    assert_eq!(store.get("k2").await.unwrap(), None);
    assert!(store
        .transition(
            "k1".into(),
            State::Reserved,
            with_state(r.clone(), State::NotDispatched)
        )
        .await
        .unwrap());
    assert_eq!(
        store
            .reserve_with("k1".into(), r.clone(), 12, Some("p1".into()))
            .await
            .unwrap(),
        Reservation::Reserved
    );
    // A bound key wins over the approval: nothing consumed.
    let p2 = proposal("p2", ProposalState::Approved, Some(1000));
    assert!(store.put_proposal(p2, None).await.unwrap());
    assert!(matches!(
        store
            .reserve_with("k1".into(), r.clone(), 13, Some("p2".into()))
            .await
            .unwrap(),
        Reservation::Bound(_)
    ));
    assert_eq!(
        store.get_proposal("p2").await.unwrap().unwrap().state,
        ProposalState::Approved
    );
    assert_eq!(
        store
            .reserve_with("k3".into(), r, 13, Some("missing".into()))
            .await
            .unwrap(),
        Reservation::Unapproved(ProposalState::Invalidated)
    );
    // Retention forgets final proposals only.
    assert_eq!(store.gc_proposals(i64::MAX).await.unwrap(), 1);
    let left: Vec<String> = store
        .list_proposals()
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.id)
        .collect();
    assert_eq!(left, vec!["p2".to_owned()]);
    proposals_of_conformance(store).await;
}

/// A requester's proposals, and no one else's (another tenant's
/// requester of the same name, a requester whose name runs into the
/// tenant's), before and after retention.
async fn proposals_of_conformance(store: &dyn Store) {
    let made = |id: &str, tenant: &str, requester: &str, state| {
        let mut p = proposal(id, state, None);
        (p.tenant, p.requester) = (tenant.into(), requester.into());
        p
    };
    for p in [
        made("q1", "t1", "ann", ProposalState::Pending),
        made("q2", "t1", "ann", ProposalState::Denied),
        made("q3", "t2", "ann", ProposalState::Pending),
        made("q4", "t1", "annie", ProposalState::Pending),
        made("q5", "t1a", "nn", ProposalState::Pending),
    ] {
        assert!(store.put_proposal(p, None).await.unwrap());
    }
    let ids = |mut ps: Vec<Proposal>| {
        ps.sort_by(|a, b| a.id.cmp(&b.id));
        ps.into_iter().map(|p| p.id).collect::<Vec<_>>()
    };
    assert_eq!(
        ids(store.proposals_of("t1", "ann").await.unwrap()),
        ["q1", "q2"]
    );
    assert_eq!(ids(store.proposals_of("t2", "ann").await.unwrap()), ["q3"]);
    assert!(store.proposals_of("t1", "bob").await.unwrap().is_empty());
    // A change of state keeps it in its requester's list.
    let mut q1 = store.get_proposal("q1").await.unwrap().unwrap();
    q1.state = ProposalState::Approved;
    q1.revision += 1;
    assert!(store
        .put_proposal(q1, Some(ProposalState::Pending))
        .await
        .unwrap());
    assert_eq!(
        ids(store.proposals_of("t1", "ann").await.unwrap()),
        ["q1", "q2"]
    );
    // The open ones: pending and approved, not denied.
    let open = ids(store.open_proposals().await.unwrap());
    assert!(
        ["q1", "q3", "q4", "q5"]
            .iter()
            .all(|q| open.contains(&(*q).to_owned()))
            && !open.contains(&"q2".to_owned()),
        "{open:?}"
    );
    // Retention takes the final one from the list too.
    store.gc_proposals(i64::MAX).await.unwrap();
    assert_eq!(ids(store.proposals_of("t1", "ann").await.unwrap()), ["q1"]);
    let mut q3 = store.get_proposal("q3").await.unwrap().unwrap();
    q3.state = ProposalState::Expired;
    q3.revision += 1;
    assert!(store
        .put_proposal(q3, Some(ProposalState::Pending))
        .await
        .unwrap());
    assert!(!ids(store.open_proposals().await.unwrap()).contains(&"q3".to_owned()));
}

/// The outbox: a row commits only with the move it rides on.
async fn outbox_conformance(store: &dyn Store) {
    let r = Record::reserve(&claim("d1"), 0, 1000);
    store.reserve("o".into(), r.clone(), 0).await.unwrap();
    let dispatched = with_state(r.clone(), State::Dispatched);
    // A transition that does not move writes no row.
    assert!(!store
        .transition_with(
            "o".into(),
            State::Dispatched,
            with_state(r.clone(), State::Complete),
            Some((1, "[1]".into()))
        )
        .await
        .unwrap());
    assert!(store.outbox().await.unwrap().is_empty());
    assert!(store
        .transition_with(
            "o".into(),
            State::Reserved,
            dispatched,
            Some((2, "[2]".into()))
        )
        .await
        .unwrap());
    store.reserve("p".into(), r.clone(), 0).await.unwrap();
    assert!(store
        .transition_with(
            "p".into(),
            State::Reserved,
            with_state(r, State::Dispatched),
            Some((5, "[5]".into()))
        )
        .await
        .unwrap());
    assert_eq!(
        store.outbox().await.unwrap(),
        vec![(2, "[2]".to_owned()), (5, "[5]".to_owned())]
    );
    assert_eq!(store.outbox_clear(4).await.unwrap(), 1);
    assert_eq!(store.outbox().await.unwrap(), vec![(5, "[5]".to_owned())]);
}

/// A key claimed straight as `dispatched` (a reservation and its
/// dispatch in one commit): only a key no record holds, with its outbox
/// row and only with it; afterwards a record like any other.
pub(super) async fn claim_conformance(store: &dyn Store) {
    let r = Record::reserve(&claim("d1"), 0, 1000);
    let dispatched = with_state(r.clone(), State::Dispatched);
    assert!(store
        .reserve_dispatched("f".into(), dispatched.clone(), 0, Some((3, "[3]".into())))
        .await
        .unwrap());
    assert_eq!(store.get("f").await.unwrap(), Some(dispatched.clone()));
    assert_eq!(store.outbox().await.unwrap(), vec![(3, "[3]".to_owned())]);
    // A held key: nothing written, no outbox row.
    assert!(!store
        .reserve_dispatched("f".into(), dispatched.clone(), 1, Some((4, "[4]".into())))
        .await
        .unwrap());
    store.reserve("g".into(), r.clone(), 0).await.unwrap();
    assert!(!store
        .reserve_dispatched("g".into(), dispatched.clone(), 1, Some((5, "[5]".into())))
        .await
        .unwrap());
    assert_eq!(store.get("g").await.unwrap(), Some(r.clone()));
    assert_eq!(store.outbox().await.unwrap(), vec![(3, "[3]".to_owned())]);
    // Only `dispatched` is claimed so.
    assert_eq!(
        store
            .reserve_dispatched("h".into(), r.clone(), 0, None)
            .await
            .unwrap_err(),
        StoreError::Forbidden {
            from: State::Reserved,
            to: State::Reserved
        }
    );
    assert_eq!(store.get("h").await.unwrap(), None);
    // It settles as any dispatched record, and a crash makes it unknown.
    let mut done = with_state(r.clone(), State::Complete);
    done.answer = Some(Answer::Result("{}".into()));
    assert!(store
        .transition("f".into(), State::Dispatched, done.clone())
        .await
        .unwrap());
    assert_eq!(store.get("f").await.unwrap(), Some(done));
    assert!(store
        .reserve_dispatched("i".into(), dispatched, 0, None)
        .await
        .unwrap());
    assert_eq!(store.recover().await.unwrap().unknown, 1);
    assert_eq!(store.get("i").await.unwrap().unwrap().state, State::Unknown);
}

#[tokio::test]
async fn memory_store_conforms() {
    claim_conformance(&MemoryStore::default()).await;
    conformance(&MemoryStore::default()).await;
    approval_conformance(&MemoryStore::default()).await;
    outbox_conformance(&MemoryStore::default()).await;
    pin_conformance(&MemoryStore::default()).await;
    notify_conformance(&MemoryStore::default()).await;
    inputs_conformance(&MemoryStore::default()).await;
    super::tasks::conformance::tasks_conformance(&MemoryStore::default()).await;
    super::console::tests::console_conformance(&MemoryStore::default()).await;
}

fn input(tenant: &str, time_ms: i64, n: u32) -> InputRow {
    InputRow {
        key: format!("{time_ms:020}-{n}"),
        tenant: tenant.into(),
        time_ms,
        inputs: format!("{{\"n\":{n}}}"),
    }
}

/// Decision inputs: kept in time order, read from a time on and per
/// tenant, erased per tenant, collected by age and by count (oldest
/// first).
async fn inputs_conformance(store: &dyn Store) {
    let rows: Vec<InputRow> = (0..6)
        .map(|i| {
            input(
                if i % 2 == 0 { "acme" } else { "globex" },
                1_000 * i64::from(i),
                i,
            )
        })
        .collect();
    store.inputs_put(rows.clone()).await.unwrap();
    assert_eq!(store.inputs_since(0, None).await.unwrap(), rows);
    assert_eq!(
        store.inputs_since(3_000, None).await.unwrap(),
        rows[3..].to_vec()
    );
    let acme = store.inputs_since(0, Some("acme".into())).await.unwrap();
    assert_eq!(
        acme.iter().map(|r| r.time_ms).collect::<Vec<_>>(),
        [0, 2_000, 4_000]
    );
    // Retention: older than 1 s goes; then at most 3 rows, the newest.
    assert_eq!(store.inputs_gc(1_000, 100).await.unwrap(), 1);
    assert_eq!(store.inputs_gc(0, 3).await.unwrap(), 2);
    assert_eq!(
        store.inputs_since(0, None).await.unwrap(),
        rows[3..].to_vec()
    );
    // Erase per tenant.
    assert_eq!(store.inputs_erase("globex".into()).await.unwrap(), 2);
    assert_eq!(
        store.inputs_since(0, None).await.unwrap(),
        vec![rows[4].clone()]
    );
    // A tenant with any text in it reads back whole.
    let odd = InputRow {
        tenant: "a:b\nc".into(),
        ..input("", 9_000, 9)
    };
    store.inputs_put(vec![odd.clone()]).await.unwrap();
    assert_eq!(store.inputs_since(9_000, None).await.unwrap(), vec![odd]);
}

/// The notification queue: notices commit with the proposal change
/// they announce (or not at all), are leased to one deliverer at a
/// time, come back when a lease lapses, and leave only when delivered;
/// each webhook's status counts what happened.
/// A fresh notice of event `id` for webhook `hook`, due at `now`.
fn notice_at(id: &str, hook: &str, now: i64) -> Notice {
    Notice {
        id: id.into(),
        webhook: hook.into(),
        event: serde_json::json!({"id": id, "kind": "proposal_created"}),
        created_ms: now,
        attempts: 0,
        next_ms: now,
        last_error: None,
        gave_up: false,
        lease: None,
    }
}

async fn notify_conformance(store: &dyn Store) {
    let now = crate::core::time::now_ms();
    let notice = |id: &str, hook: &str| notice_at(id, hook, now);
    let mut p = proposal("pn", ProposalState::Pending, None);
    p.revision = 1;
    // A refused write (nothing to compare with) queues nothing.
    assert!(!store
        .put_proposal_with(
            p.clone(),
            Some(ProposalState::Pending),
            vec![notice("ev-0", "a")]
        )
        .await
        .unwrap());
    assert_eq!(store.notify_status().await.unwrap().1, 0);
    assert!(store
        .put_proposal_with(p, None, vec![notice("ev-1", "a"), notice("ev-1", "b")])
        .await
        .unwrap());
    assert_eq!(store.notify_status().await.unwrap().1, 2);
    let got = store.notices_claim("g1", now, 60_000, 10).await.unwrap();
    assert_eq!(got.len(), 2);
    assert!(got
        .iter()
        .all(|n| n.lease.as_ref().is_some_and(|(o, _)| o == "g1")));
    // Leased: nobody else takes them.
    assert!(store
        .notices_claim("g2", now, 60_000, 10)
        .await
        .unwrap()
        .is_empty());
    let a = got.iter().find(|n| n.webhook == "a").unwrap().clone();
    let b = got.iter().find(|n| n.webhook == "b").unwrap().clone();
    store
        .notice_settle(a, Settle::Delivered(now))
        .await
        .unwrap();
    store
        .notice_settle(
            b,
            Settle::Failed {
                at_ms: now,
                error: "HTTP 500".into(),
                retry_ms: Some(now + 60_000),
            },
        )
        .await
        .unwrap();
    let (status, queued) = store.notify_status().await.unwrap();
    assert_eq!(queued, 1, "the delivered one is gone");
    assert_eq!(status["a"].delivered, 1);
    assert_eq!(status["a"].last_success_ms, Some(now));
    assert_eq!(status["b"].retried, 1);
    assert_eq!(status["b"].last_error.as_deref(), Some("HTTP 500"));
    // Not due before its retry time.
    assert!(store
        .notices_claim("g2", now, 60_000, 10)
        .await
        .unwrap()
        .is_empty());
    // Queued on its own; a lease that lapses (its deliverer died) is
    // taken over.
    store
        .notices_enqueue(vec![notice("ev-2", "a")])
        .await
        .unwrap();
    let first = store.notices_claim("g1", now, 1, 10).await.unwrap();
    assert_eq!(first.len(), 1);
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    let later = crate::core::time::now_ms();
    let taken = store.notices_claim("g2", later, 60_000, 10).await.unwrap();
    assert_eq!(taken.len(), 1, "the lapsed lease is taken over");
    assert_eq!(taken[0].id, "ev-2");
    // With a ledger move: queued only when the record moves.
    let r = Record::reserve(&claim("dn"), 0, 60_000);
    store.reserve("kn".into(), r.clone(), 0).await.unwrap();
    assert!(dispatch(store, "kn", &r).await);
    let unknown = with_state(r.clone(), State::Unknown);
    let before = store.notify_status().await.unwrap().1;
    assert!(!store
        .transition_telling(
            "kn".into(),
            State::Reserved,
            with_state(r.clone(), State::NotDispatched),
            None,
            vec![notice("ev-x", "a")]
        )
        .await
        .unwrap());
    assert_eq!(
        store.notify_status().await.unwrap().1,
        before,
        "no move, no notice"
    );
    assert!(store
        .transition_telling(
            "kn".into(),
            State::Dispatched,
            unknown,
            None,
            vec![notice("ev-u", "a")]
        )
        .await
        .unwrap());
    assert_eq!(store.notify_status().await.unwrap().1, before + 1);
    let u = store
        .notices_claim("gu", crate::core::time::now_ms(), 60_000, 10)
        .await
        .unwrap();
    let u: Vec<Notice> = u.into_iter().filter(|n| n.id == "ev-u").collect();
    assert_eq!(u.len(), 1);
    store
        .notice_settle(u[0].clone(), Settle::Delivered(now))
        .await
        .unwrap();
    // Given up: kept for the record, never claimed again.
    store
        .notice_settle(
            taken[0].clone(),
            Settle::Failed {
                at_ms: later,
                error: "connection refused".into(),
                retry_ms: None,
            },
        )
        .await
        .unwrap();
    let (status, queued) = store.notify_status().await.unwrap();
    assert_eq!(status["a"].gave_up, 1);
    assert_eq!(queued, 1, "only b's retry waits");
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    assert!(store
        .notices_claim("g3", crate::core::time::now_ms(), 60_000, 10)
        .await
        .unwrap()
        .iter()
        .all(|n| n.id != "ev-2"));
}

async fn pin_conformance(store: &dyn Store) {
    assert!(store.first_use_pins().await.unwrap().is_empty());
    let pin = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    assert_eq!(
        store.pin_first_use(vec![pin("a", "first")]).await.unwrap(),
        1
    );
    assert_eq!(
        store
            .pin_first_use(vec![pin("a", "second"), pin("b", "other")])
            .await
            .unwrap(),
        1,
        "the first pin stays"
    );
    assert_eq!(store.pin_first_use(Vec::new()).await.unwrap(), 0);
    let mut all = store.first_use_pins().await.unwrap();
    all.sort();
    assert_eq!(all, ["first", "other"]);
    nonce_conformance(store).await;
}

/// A nonce is used once until it expires; nonces are not pins.
async fn nonce_conformance(store: &dyn Store) {
    let use_once = |n: &str, until: i64, now: i64| store.use_nonce(n.to_owned(), until, now);
    assert!(use_once("alice/n1", 1_000, 100).await.unwrap());
    assert!(!use_once("alice/n1", 1_000, 200).await.unwrap(), "a replay");
    assert!(use_once("alice/n2", 1_000, 200).await.unwrap());
    assert!(use_once("bob/n1", 1_000, 200).await.unwrap());
    // Past its expiry it can no longer be told from a new one (the
    // request's signed time refuses such a replay first).
    assert!(use_once("alice/n1", 5_000, 1_001).await.unwrap());
    assert!(!use_once("alice/n1", 5_000, 1_002).await.unwrap());
    assert_eq!(store.first_use_pins().await.unwrap().len(), 2);
}

const LEASE: std::time::Duration = std::time::Duration::from_secs(10);

/// Reserved → dispatched in `store`; whether it moved.
pub(crate) async fn dispatch(store: &dyn Store, key: &str, r: &Record) -> bool {
    store
        .transition(
            key.into(),
            State::Reserved,
            with_state(r.clone(), State::Dispatched),
        )
        .await
        .unwrap()
}

/// A failure of the database keeps the database's own error as its cause
/// (the CLI prints the chain), and stays `Clone` and comparable: a batch of
/// calls shares one error.
#[test]
fn a_backend_error_keeps_its_cause() {
    let e = StoreError::backend("write", std::io::Error::other("disk full"));
    assert_eq!(e.to_string(), "ledger store: write: disk full");
    let cause = std::error::Error::source(&e).expect("the cause is kept");
    assert_eq!(cause.to_string(), "disk full");
    assert_eq!(e.clone(), e);
    assert_ne!(
        e,
        StoreError::backend("write", std::io::Error::other("disk gone"))
    );
}
