//! The store's conformance suite: the same rules checked against every
//! store (memory, redb, PostgreSQL on a real server), and the helpers other
//! stores' tests share.

use super::*;
use crate::core::ledger::{Answer, Claim};

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
        id: id.into(),
        state,
        created_ms: 0,
        updated_ms: 0,
        server: "s".into(),
        tool: "t".into(),
        arguments: serde_json::json!({}),
        call_digest: "d1".into(),
        requester: "r".into(),
        requester_aka: Vec::new(),
        client: None,
        tenant: "acme".into(),
        resource_version: None,
        tool_definition: None,
        definition_change: None,
        risk: crate::core::approval::Risk::Write,
        policies: vec![],
        revises: None,
        beside: None,
        call_key: None,
        headline: None,
        joined: 0,
        decision: None,
        quorum: Default::default(),
        approvals: Vec::new(),
        denials: Vec::new(),
        revision: 0,
        expires_ms,
        consumed_by: None,
        reason: None,
        confirmation: None,
        asked_by: Vec::new(),
        trace: None,
        withdrawn: Vec::new(),
        looks_like: None,
        guards: vec![],
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

#[tokio::test]
async fn memory_store_conforms() {
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

/// Gateway `id` on `config`, holding its lease.
async fn leased(config: &tokio_postgres::Config, id: &str) -> PgStore {
    let (mut store, _) = PgStore::connect(config.clone(), None, 2, id).await.unwrap();
    store.start_lease(LEASE).await.unwrap();
    store
}

/// Gateway `id` was paused past its lease.
async fn lapse(client: &tokio_postgres::Client, id: &str) {
    client
        .execute(
            "UPDATE gateways SET lease_until_ms = 0 WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
}

/// A schema of its own in the local PostgreSQL (127.0.0.1:5432, trust
/// auth, database `test`), dropped when the guard goes.
pub(crate) struct PgSchema {
    name: String,
}

impl PgSchema {
    pub(crate) async fn new() -> (PgSchema, tokio_postgres::Config) {
        let name = format!("cs_test_{:016x}", rand::random::<u64>());
        let mut admin = tokio_postgres::Config::new();
        admin
            .host("127.0.0.1")
            .port(5432)
            .user("postgres")
            .dbname("test");
        let (client, conn) = admin
            .connect(tokio_postgres::NoTls)
            .await
            .expect("PostgreSQL at 127.0.0.1:5432 (database test): `.ci/run` starts it");
        tokio::spawn(conn);
        client
            .batch_execute(&format!("CREATE SCHEMA {name}"))
            .await
            .unwrap();
        let mut config = admin.clone();
        config.options(format!("-c search_path={name}"));
        (PgSchema { name }, config)
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Synchronous: the test's runtime may be gone by now.
        let _ = std::process::Command::new("psql")
            .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-qc"])
            .arg(format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
            .output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_conforms() {
    let (_schema, config) = PgSchema::new().await;
    let (mut store, migrated) = PgStore::connect(config.clone(), None, 4, "gw-a")
        .await
        .unwrap();
    let lease = std::time::Duration::from_secs(10);
    store.start_lease(lease).await.unwrap();
    assert_eq!(migrated.from, 0);
    assert_eq!(migrated.to, postgres::MIGRATIONS.len());
    conformance(&store).await;
    inputs_conformance(&store).await;
    approval_conformance(&store).await;
    outbox_conformance(&store).await;
    pin_conformance(&store).await;
    notify_conformance(&store).await;
    super::tasks::conformance::tasks_conformance(&store).await;
    super::console::tests::console_conformance(&store).await;
    // The audit writer clears the outbox from its own thread, outside any
    // runtime, and drops the future: the request is made all the same.
    assert!(!store.outbox().await.unwrap().is_empty());
    std::thread::scope(|t| {
        t.spawn(|| drop(store.outbox_clear(u64::MAX)));
    });
    let mut cleared = false;
    for _ in 0..200 {
        if store.outbox().await.unwrap().is_empty() {
            cleared = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(cleared, "outbox_clear from a plain thread");
    // Migrations are applied once: a second gateway finds them done.
    let (_again, migrated) = PgStore::connect(config, None, 2, "gw-b").await.unwrap();
    assert_eq!(migrated.from, migrated.to);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_a_newer_schema_and_recovers_only_its_own_rows() {
    let (_schema, config) = PgSchema::new().await;
    let a = leased(&config, "gw-a").await;
    let b = leased(&config, "gw-b").await;
    for (store, key) in [(&a, "ka"), (&b, "kb")] {
        let r = Record::reserve(&claim("d"), 0, 1000);
        store.reserve(key.into(), r.clone(), 0).await.unwrap();
        assert!(dispatch(store, key, &r).await);
    }
    // Gateway A restarts: its own dispatched call is unknown, B's is B's.
    assert_eq!(a.recover().await.unwrap().unknown, 1);
    assert_eq!(a.get("ka").await.unwrap().unwrap().state, State::Unknown);
    assert_eq!(a.get("kb").await.unwrap().unwrap().state, State::Dispatched);
    // A schema from a newer countersign is refused, with the reason.
    let (client, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client
        .batch_execute("INSERT INTO countersign_migrations (version) VALUES (999)")
        .await
        .unwrap();
    let Err(e) = PgStore::connect(config, None, 2, "gw-c").await else {
        panic!("a newer schema must be refused");
    };
    assert!(
        e.to_string().contains("newer than this countersign knows"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_whose_lease_lapsed_dispatches_nothing_and_its_calls_are_settled() {
    let (_schema, config) = PgSchema::new().await;
    let mut a = leased(&config, "gw-a").await;
    let b = leased(&config, "gw-b").await;
    let r = Record::reserve(&claim("d"), 0, 1000);
    a.reserve("sent".into(), r.clone(), 0).await.unwrap();
    assert!(dispatch(&a, "sent", &r).await);
    a.reserve("held".into(), r.clone(), 0).await.unwrap();
    // A is paused past its lease (as SIGSTOP would): its lease is over.
    let (client, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    lapse(&client, "gw-a").await;
    // A wakes up: its reservation cannot be dispatched.
    assert!(
        !dispatch(&a, "held", &r).await,
        "no dispatch on a lapsed lease"
    );
    // A takes its lease again (a new epoch), as it does when it finds
    // the lapse: what it reserved before still cannot be dispatched.
    a.start_lease(LEASE).await.unwrap();
    assert!(
        !dispatch(&a, "held", &r).await,
        "a reservation from before the lapse is never dispatched"
    );
    assert!(a
        .transition(
            "held".into(),
            State::Reserved,
            with_state(r.clone(), State::NotDispatched)
        )
        .await
        .unwrap());
    a.reserve("held".into(), r.clone(), 0).await.unwrap();
    assert!(
        dispatch(&a, "held", &r).await,
        "reserved again under the new lease, it runs"
    );
    // The lease lapses again (A paused once more).
    lapse(&client, "gw-a").await;
    a.reserve("held2".into(), r.clone(), 0).await.unwrap();
    // B settles A's calls: the one sent is unknown, never free; the one
    // only reserved was never sent, and its key is free.
    b.gc(0).await.unwrap();
    assert_eq!(b.get("sent").await.unwrap().unwrap().state, State::Unknown);
    assert_eq!(b.get("held").await.unwrap().unwrap().state, State::Unknown);
    assert_eq!(b.get("held2").await.unwrap(), None);
    assert!(matches!(
        b.reserve("held2".into(), r, 0).await.unwrap(),
        Reservation::Reserved
    ));
}

/// Grouped writes under load: two gateways reserve the same 64 keys at
/// once, in opposite orders (so their batches take row locks both
/// ways); each key is reserved exactly once. The winners dispatch with
/// an outbox row each and complete, all at once: every move lands, an
/// outbox row for each dispatch and none for a write that did not move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_grouped_writes_keep_every_key_once_across_gateways() {
    let (_schema, config) = PgSchema::new().await;
    let a = std::sync::Arc::new(leased(&config, "gw-a").await);
    let b = std::sync::Arc::new(leased(&config, "gw-b").await);
    let keys: Vec<String> = (0..64).map(|i| format!("k{i:02}")).collect();
    let r = Record::reserve(&claim("d"), 0, 1000);
    let mut tasks = Vec::new();
    for (store, order) in [(a.clone(), false), (b.clone(), true)] {
        let mut keys = keys.clone();
        if order {
            keys.reverse();
        }
        for key in keys {
            let (store, r) = (store.clone(), r.clone());
            tasks.push(tokio::spawn(async move {
                let got = store.reserve(key.clone(), r, 0).await.unwrap();
                (key, order, got)
            }));
        }
    }
    let mut won: std::collections::BTreeMap<String, bool> = Default::default();
    for t in tasks {
        let (key, by_b, got) = t.await.unwrap();
        match got {
            Reservation::Reserved => {
                assert!(
                    won.insert(key.clone(), by_b).is_none(),
                    "{key} reserved twice"
                );
            }
            Reservation::Bound(_) => {}
            other => panic!("{key}: {other:?}"),
        }
    }
    assert_eq!(won.len(), 64, "every key reserved by one gateway");
    // Dispatch (with an outbox row) and complete every winner at once,
    // plus a dispatch of each key by the gateway that lost it: those
    // must not move, and leave no outbox row.
    let mut tasks = Vec::new();
    for (i, (key, by_b)) in won.iter().enumerate() {
        for mine in [true, false] {
            let store = if *by_b == mine { b.clone() } else { a.clone() };
            let (key, r) = (key.clone(), r.clone());
            let id = u64::try_from(i).unwrap() * 2 + u64::from(mine);
            tasks.push(tokio::spawn(async move {
                let moved = store
                    .transition_with(
                        key.clone(),
                        State::Reserved,
                        with_state(r.clone(), State::Dispatched),
                        Some((id, format!("[{id}]"))),
                    )
                    .await
                    .unwrap();
                assert_eq!(moved, mine, "{key}: only its own gateway dispatches it");
                if moved {
                    let mut done = with_state(r, State::Complete);
                    done.answer = Some(Answer::Result("{}".into()));
                    assert!(store
                        .transition(key, State::Dispatched, done)
                        .await
                        .unwrap());
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let complete = a.list(Some(State::Complete)).await.unwrap();
    assert_eq!(complete.len(), 64);
    let outbox = a.outbox().await.unwrap().len() + b.outbox().await.unwrap().len();
    assert_eq!(outbox, 64, "one outbox row per dispatch that moved");
}

#[tokio::test]
async fn redb_says_when_a_commit_waits_for_its_fsync_and_when_it_came() {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(&dir.path().join("ledger.redb")).unwrap();
    assert!(!store.unflushed(), "nothing committed yet");
    // A reservation is kept in memory only (a crash frees it anyway).
    let r = Record::reserve(&claim("d1"), 0, 1000);
    store.reserve("k".into(), r.clone(), 0).await.unwrap();
    assert!(!store.unflushed(), "nothing on disk waits");
    // Freeing it is journaled without an fsync of its own.
    assert!(store
        .transition(
            "k".into(),
            State::Reserved,
            with_state(r, State::NotDispatched)
        )
        .await
        .unwrap());
    assert!(store.unflushed(), "shown before the caller is answered");
    // The idle flush carries it within 100 ms.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while store.unflushed() {
        assert!(std::time::Instant::now() < deadline, "never flushed");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // The memory store keeps nothing on disk: never unflushed.
    let memory = MemoryStore::default();
    memory
        .reserve("k".into(), Record::reserve(&claim("d1"), 0, 1000), 0)
        .await
        .unwrap();
    assert!(!memory.unflushed());
}

#[tokio::test]
async fn redb_pins_conform_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.redb");
    {
        let store = RedbStore::open(&path).unwrap();
        pin_conformance(&store).await;
    }
    let store = RedbStore::open(&path).unwrap();
    assert_eq!(store.first_use_pins().await.unwrap().len(), 2);
    assert!(
        !store
            .use_nonce("alice/n1".into(), 5_000, 1_003)
            .await
            .unwrap(),
        "a nonce used before the restart is still used"
    );
}

#[tokio::test]
async fn redb_outbox_conforms_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.redb");
    {
        let store = RedbStore::open(&path).unwrap();
        outbox_conformance(&store).await;
    }
    let store = RedbStore::open(&path).unwrap();
    assert_eq!(store.outbox().await.unwrap(), vec![(5, "[5]".to_owned())]);
}

#[tokio::test]
async fn redb_approvals_conform_and_decisions_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.redb");
    {
        let store = RedbStore::open(&path).unwrap();
        approval_conformance(&store).await;
    }
    let store = RedbStore::open(&path).unwrap();
    assert_eq!(
        store.get_proposal("p2").await.unwrap().unwrap().state,
        ProposalState::Approved
    );
    assert_eq!(store.proposals_of("t2", "ann").await.unwrap().len(), 1);
    drop(store);
    // A ledger made before the index by requester: it is built at open.
    {
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        for index in redb_store::proposals_index_for_tests() {
            assert!(txn.delete_table(index).unwrap());
        }
        txn.commit().unwrap();
    }
    let store = RedbStore::open(&path).unwrap();
    assert_eq!(store.proposals_of("t2", "ann").await.unwrap().len(), 1);
    assert_eq!(store.proposals_of("acme", "r").await.unwrap().len(), 1);
    let open: Vec<String> = store
        .open_proposals()
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.id)
        .collect();
    assert!(
        open.contains(&"q1".to_owned()) && !open.contains(&"q3".to_owned()),
        "the open ones, found again: {open:?}"
    );
}

#[tokio::test]
async fn redb_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(&dir.path().join("ledger.redb")).unwrap();
    conformance(&store).await;
    inputs_conformance(&store).await;
}

/// The console's entries conform, and a passkey's counter survives a
/// restart (a replayed assertion stays refused).
#[tokio::test]
async fn redb_console_state_conforms_and_counters_survive_reopen() {
    use super::console::{counter_key, ConsoleState, Counted};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.redb");
    {
        let store = RedbStore::open(&path).unwrap();
        super::console::tests::console_conformance(&store).await;
    }
    let store = RedbStore::open(&path).unwrap();
    assert_eq!(
        store
            .passkey_counter(counter_key("alice", "cred"), 6)
            .await
            .unwrap(),
        Counted::Behind { last: 6 }
    );
}

#[tokio::test]
async fn redb_tasks_conform_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.redb");
    {
        let store = RedbStore::open(&path).unwrap();
        super::tasks::conformance::tasks_conformance(&store).await;
    }
    let store = RedbStore::open(&path).unwrap();
    let kept = store
        .task_get("t-b")
        .await
        .unwrap()
        .expect("a task survives a reopen");
    assert_eq!(kept.key, "k2");
}

#[tokio::test]
async fn redb_notices_conform_and_survive_reopen_with_their_leases_void() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.redb");
    {
        let store = RedbStore::open(&path).unwrap();
        notify_conformance(&store).await;
        // A notice leased for a minute by a process that then dies.
        let mut n = store.notices_claim("g1", 0, 0, 0).await.unwrap();
        assert!(n.is_empty());
        let now = crate::core::time::now_ms();
        let mut dying = proposal("pd", ProposalState::Pending, None);
        dying.id = "pd".into();
        assert!(store
            .put_proposal_with(dying, None, vec![notice_at("ev-9", "a", now)])
            .await
            .unwrap());
        n = store.notices_claim("g1", now, 60_000, 10).await.unwrap();
        assert_eq!(n.len(), 1);
    }
    let store = RedbStore::open(&path).unwrap();
    let (status, queued) = store.notify_status().await.unwrap();
    assert_eq!(queued, 2, "b's retry and the leased one");
    assert_eq!(status["a"].delivered, 2, "ev-1 and the ledger move's ev-u");
    assert_eq!(status["b"].retried, 1);
    // The next process takes the dead one's notice at once.
    let now = crate::core::time::now_ms();
    let taken = store.notices_claim("g2", now, 60_000, 10).await.unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].id, "ev-9");
}

#[tokio::test]
async fn redb_journal_survives_a_crash_and_applies_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.redb");
    let r = Record::reserve(&claim("d1"), 0, 1000);
    let mut done = with_state(r.clone(), State::Complete);
    done.answer = Some(Answer::Result("{}".into()));
    {
        let store = RedbStore::open(&path).unwrap();
        for k in ["a", "b", "c"] {
            store.reserve(k.into(), r.clone(), 0).await.unwrap();
        }
        let id = |k: &str| u64::from(k.as_bytes()[0]);
        for k in ["a", "b"] {
            assert!(store
                .transition_with(
                    k.into(),
                    State::Reserved,
                    with_state(r.clone(), State::Dispatched),
                    Some((id(k), format!("[{k}]")))
                )
                .await
                .unwrap());
        }
        assert!(store
            .transition("b".into(), State::Dispatched, done.clone())
            .await
            .unwrap());
        assert_eq!(store.outbox_clear(id("a")).await.unwrap(), 1);
        // Nothing of this is in redb yet: it is in the journal.
        assert!(
            std::fs::metadata(path.with_extension("journal"))
                .unwrap()
                .len()
                > 16
        );
        store.crash_on_drop();
    }
    for round in 0..2 {
        // Replayed at the first open, and not again at the second (the
        // clean stop in between left an empty journal).
        let store = RedbStore::open(&path).unwrap();
        let state = |k: &'static str| {
            let store = &store;
            async move { store.get(k).await.unwrap().map(|r| r.state) }
        };
        assert_eq!(state("a").await, Some(State::Dispatched), "round {round}");
        assert_eq!(store.get("b").await.unwrap(), Some(done.clone()));
        assert_eq!(state("c").await, None, "a reservation is not kept");
        assert_eq!(
            store.outbox().await.unwrap(),
            vec![(u64::from(b'b'), "[b]".to_owned())]
        );
    }
    let store = RedbStore::open(&path).unwrap();
    assert_eq!(store.recover().await.unwrap().unknown, 1);
}

#[tokio::test]
async fn redb_dispatched_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.redb");
    {
        let store = RedbStore::open(&path).unwrap();
        let r = Record::reserve(&claim("d1"), 0, 1000);
        store.reserve("k".into(), r.clone(), 0).await.unwrap();
        assert!(store
            .transition(
                "k".into(),
                State::Reserved,
                with_state(r, State::Dispatched)
            )
            .await
            .unwrap());
    }
    let store = RedbStore::open(&path).unwrap();
    assert_eq!(
        store.get("k").await.unwrap().unwrap().state,
        State::Dispatched
    );
    assert_eq!(store.recover().await.unwrap().unknown, 1);
}
