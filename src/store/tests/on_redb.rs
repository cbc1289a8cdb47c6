//! The suite on redb, and what a reopen (after a crash or a clean stop)
//! must keep.

use super::*;

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
async fn redb_claims_a_key_straight_as_dispatched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.redb");
    {
        let store = RedbStore::open(&path).unwrap();
        claim_conformance(&store).await;
        let r = with_state(Record::reserve(&claim("z"), 0, 1000), State::Dispatched);
        assert!(store
            .reserve_dispatched("z".into(), r, 0, Some((8, "[8]".into())))
            .await
            .unwrap());
    }
    // On disk when it returned: reopened, the claim and its outbox row are
    // there, and recovery reads the call as sent.
    let store = RedbStore::open(&path).unwrap();
    assert_eq!(
        store.get("z").await.unwrap().unwrap().state,
        State::Dispatched
    );
    assert!(store
        .outbox()
        .await
        .unwrap()
        .contains(&(8, "[8]".to_owned())));
    assert_eq!(store.recover().await.unwrap().unknown, 1);
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
