//! The suite on PostgreSQL (a schema of each test's own on the local
//! server), and what only several gateways sharing it show.

use super::*;

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
    /// A fresh schema, or `None` when no PostgreSQL answers at
    /// 127.0.0.1:5432 and `COUNTERSIGN_REQUIRE_SERVICES` is not set: the
    /// test then says it is skipped and returns (the quick loop on a
    /// machine with only Rust). `.ci/run` sets the variable, so there a
    /// missing server fails the test instead of skipping it.
    pub(crate) async fn new() -> Option<(PgSchema, tokio_postgres::Config)> {
        let name = format!("cs_test_{:016x}", rand::random::<u64>());
        let mut admin = tokio_postgres::Config::new();
        admin
            .host("127.0.0.1")
            .port(5432)
            .user("postgres")
            .dbname("test");
        let (client, conn) = match admin.connect(tokio_postgres::NoTls).await {
            Ok(c) => c,
            Err(e) if std::env::var_os("COUNTERSIGN_REQUIRE_SERVICES").is_none() => {
                // Straight to stderr, past the test harness's capture: the
                // skip shows in the run's output.
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "skipped: this test needs PostgreSQL at 127.0.0.1:5432, database test ({e}); `.ci/run` starts it"
                );
                return None;
            }
            Err(e) => panic!(
                "PostgreSQL at 127.0.0.1:5432 (database test) is required here (COUNTERSIGN_REQUIRE_SERVICES): {e}"
            ),
        };
        tokio::spawn(conn);
        client
            .batch_execute(&format!("CREATE SCHEMA {name}"))
            .await
            .unwrap();
        let mut config = admin.clone();
        config.options(format!("-c search_path={name}"));
        Some((PgSchema { name }, config))
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
    let Some((_schema, config)) = PgSchema::new().await else {
        return;
    };
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
    let Some((_schema, config)) = PgSchema::new().await else {
        return;
    };
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
    let Some((_schema, config)) = PgSchema::new().await else {
        return;
    };
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

/// A key claimed straight as `dispatched` on PostgreSQL: the suite, and
/// the lease: a gateway whose lease lapsed, or that took it again since it
/// asked, claims nothing and is told so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_claims_a_key_straight_as_dispatched_only_under_its_lease() {
    let Some((_schema, config)) = PgSchema::new().await else {
        return;
    };
    let mut a = leased(&config, "gw-a").await;
    claim_conformance(&a).await;
    let r = with_state(Record::reserve(&claim("d"), 0, 1000), State::Dispatched);
    let (client, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    lapse(&client, "gw-a").await;
    assert_eq!(
        a.reserve_dispatched("late".into(), r.clone(), 0, Some((9, "[9]".into())))
            .await
            .unwrap_err(),
        StoreError::Fenced
    );
    assert_eq!(a.get("late").await.unwrap(), None);
    assert!(a.outbox().await.unwrap().iter().all(|(id, _)| *id != 9));
    // A new lease: claimed.
    a.start_lease(LEASE).await.unwrap();
    assert!(a
        .reserve_dispatched("late".into(), r.clone(), 0, Some((9, "[9]".into())))
        .await
        .unwrap());
    // Another gateway that finds the key held is told so, and writes nothing.
    let b = leased(&config, "gw-b").await;
    assert!(!b
        .reserve_dispatched("late".into(), r, 0, Some((10, "[10]".into())))
        .await
        .unwrap());
    assert_eq!(
        b.get("late").await.unwrap().unwrap().state,
        State::Dispatched
    );
    assert!(b.outbox().await.unwrap().is_empty());
}

/// Two gateways claim the same 64 keys straight as `dispatched` at once,
/// in opposite orders, each claim with its outbox row: each key is claimed
/// by exactly one, with one outbox row, and the winner's answer lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_claims_each_key_once_across_gateways() {
    let Some((_schema, config)) = PgSchema::new().await else {
        return;
    };
    let a = std::sync::Arc::new(leased(&config, "gw-a").await);
    let b = std::sync::Arc::new(leased(&config, "gw-b").await);
    let r = with_state(Record::reserve(&claim("d"), 0, 1000), State::Dispatched);
    let mut tasks = Vec::new();
    for (n, store) in [a.clone(), b.clone()].into_iter().enumerate() {
        let mut keys: Vec<String> = (0..64).map(|i| format!("k{i:02}")).collect();
        if n == 1 {
            keys.reverse();
        }
        for (i, key) in keys.into_iter().enumerate() {
            let (store, r) = (store.clone(), r.clone());
            let id = u64::try_from(i * 2 + n).unwrap();
            tasks.push(tokio::spawn(async move {
                let won = store
                    .reserve_dispatched(key.clone(), r.clone(), 0, Some((id, format!("[{id}]"))))
                    .await
                    .unwrap();
                if won {
                    let mut done = with_state(r, State::Complete);
                    done.answer = Some(Answer::Result("{}".into()));
                    assert!(store
                        .transition(key.clone(), State::Dispatched, done)
                        .await
                        .unwrap());
                }
                (key, won)
            }));
        }
    }
    let mut won: std::collections::BTreeMap<String, usize> = Default::default();
    for t in tasks {
        let (key, w) = t.await.unwrap();
        *won.entry(key).or_default() += usize::from(w);
    }
    assert_eq!(won.len(), 64);
    assert!(
        won.values().all(|n| *n == 1),
        "each key claimed once: {won:?}"
    );
    assert_eq!(a.list(Some(State::Complete)).await.unwrap().len(), 64);
    let outbox = a.outbox().await.unwrap().len() + b.outbox().await.unwrap().len();
    assert_eq!(outbox, 64, "one outbox row per claim that landed");
}

/// Grouped writes under load: two gateways reserve the same 64 keys at
/// once, in opposite orders (so their batches take row locks both
/// ways); each key is reserved exactly once. The winners dispatch with
/// an outbox row each and complete, all at once: every move lands, an
/// outbox row for each dispatch and none for a write that did not move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_grouped_writes_keep_every_key_once_across_gateways() {
    let Some((_schema, config)) = PgSchema::new().await else {
        return;
    };
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

/// A settled record is announced only when a gateway waits on its key
/// (`wait_for`): N gateways do not each hear every write. Notifications
/// arrive in commit order, so the one awaited key heard first proves the
/// unawaited one before it was never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_is_announced_only_to_a_gateway_that_waits_on_it() {
    let Some((_schema, config)) = PgSchema::new().await else {
        return;
    };
    let a = leased(&config, "gw-a").await;
    let b = leased(&config, "gw-b").await;
    let mut heard = b.subscribe().expect("PostgreSQL announces changes");
    let settle = |key: &'static str| {
        let a = &a;
        async move {
            let r = Record::reserve(&claim("d"), 0, 1000);
            assert_eq!(
                a.reserve(key.into(), r.clone(), 0).await.unwrap(),
                Reservation::Reserved
            );
            assert!(a
                .transition(
                    key.into(),
                    State::Reserved,
                    with_state(r.clone(), State::Dispatched)
                )
                .await
                .unwrap());
            let mut done = with_state(r, State::Complete);
            done.answer = Some(Answer::Result("{}".into()));
            assert!(a
                .transition(key.into(), State::Dispatched, done)
                .await
                .unwrap());
        }
    };
    settle("nobody-waits").await;
    b.wait_for("b-waits".into()).await.unwrap();
    settle("b-waits").await;
    // The channel is the database's, not the schema's: tests running beside
    // this one in other schemas announce their own keys on it. Only this
    // test's two keys say anything here.
    let before = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        let mut before = Vec::new();
        loop {
            match heard.recv().await {
                Ok(StoreEvent::Ledger(k)) if k == "b-waits" => return before,
                Ok(StoreEvent::Ledger(k)) if k == "nobody-waits" => before.push(k),
                Ok(_) => {}
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await
    .expect("the awaited settlement was announced");
    assert!(
        before.is_empty(),
        "the unawaited settlement was announced: {before:?}"
    );
    // The wait ended: the next settlement of that key is not announced.
    b.waited("b-waits".into()).await.unwrap();
    let (client, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    let waits = || async {
        client
            .query_one("SELECT count(*) FROM ledger_waiters", &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    assert_eq!(waits().await, 0);
    // A wait its gateway never ended (it stopped mid-wait) is forgotten by
    // the sweep once it is ten minutes old, and not before.
    b.wait_for("left-behind".into()).await.unwrap();
    let now = crate::core::time::now_ms();
    a.gc(now).await.unwrap();
    assert_eq!(waits().await, 1, "a wait of now is kept");
    a.gc(now + 601_000).await.unwrap();
    assert_eq!(waits().await, 0, "a wait over ten minutes old is forgotten");
}

/// A task created or changed through one gateway is announced to the
/// others: a `tasks/result` waiting there wakes at once instead of at its
/// next look. The listener starts with the store, so the first writes may
/// come before it listens: each round writes a task of its own and waits
/// for it to be heard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_changed_through_one_gateway_is_announced_to_another() {
    /// Whether task `id` is heard within two seconds.
    async fn hear(heard: &mut tokio::sync::broadcast::Receiver<StoreEvent>, id: &str) -> bool {
        tokio::time::timeout(std::time::Duration::from_secs(2), async {
            loop {
                match heard.recv().await {
                    Ok(StoreEvent::Task(t)) if t == id => return,
                    Ok(_) => {}
                    Err(e) => panic!("{e}"),
                }
            }
        })
        .await
        .is_ok()
    }
    let Some((_schema, config)) = PgSchema::new().await else {
        return;
    };
    let a = leased(&config, "gw-a").await;
    let b = leased(&config, "gw-b").await;
    let mut heard = b.subscribe().expect("PostgreSQL announces changes");
    let mut made = None;
    for round in 0..10 {
        let id = format!("t-{round}");
        let t = crate::store::tasks::conformance::task(&id, &id, "p1", round);
        a.task_create(t.clone()).await.unwrap();
        if hear(&mut heard, &id).await {
            made = Some(t);
            break;
        }
    }
    let mut t = made.expect("a task created through gw-a was announced to gw-b");
    // Once listening, every change is heard, not only a creation.
    t.revision += 1;
    t.state = crate::core::task::TaskState::Cancelled;
    assert!(a.task_put(t.clone()).await.unwrap());
    assert!(
        hear(&mut heard, &t.id).await,
        "a task changed through gw-a was announced to gw-b"
    );
}

/// Concurrent lookups share grouped statements, and each gets the record of
/// its own key: present or not, the same key asked twice at once, and a
/// record written just before its lookup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_lookups_each_get_their_own_keys_record() {
    let Some((_schema, config)) = PgSchema::new().await else {
        return;
    };
    let a = std::sync::Arc::new(leased(&config, "gw-a").await);
    for i in (0..64).step_by(2) {
        let r = Record::reserve(&claim(&format!("d{i}")), 0, 1000);
        assert_eq!(
            a.reserve(format!("k{i}"), r, 0).await.unwrap(),
            Reservation::Reserved
        );
    }
    let mut lookups = Vec::new();
    for round in 0..2 {
        for i in 0..64 {
            let a = a.clone();
            lookups.push(tokio::spawn(async move {
                (round, i, a.get(&format!("k{i}")).await.unwrap())
            }));
        }
    }
    for l in lookups {
        let (round, i, found) = l.await.unwrap();
        match found {
            Some(r) => {
                assert_eq!(i % 2, 0, "round {round}: k{i} has no record");
                assert_eq!(r.digest, format!("d{i}"), "round {round}: k{i}");
            }
            None => assert_eq!(i % 2, 1, "round {round}: k{i} has a record"),
        }
    }
    // Read your writes: a record that was written is found at once.
    let r = Record::reserve(&claim("fresh"), 0, 1000);
    a.reserve("k-new".into(), r, 0).await.unwrap();
    assert_eq!(a.get("k-new").await.unwrap().unwrap().digest, "fresh");
}
