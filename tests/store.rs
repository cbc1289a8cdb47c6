//! The gateway on PostgreSQL (`[store] url`): the local server at
//! 127.0.0.1:5432 (trust auth, database `test`), one schema per test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::pg::{on, Schema};
use common::*;
use serde_json::json;

/// POST one stateless-era message to `url`.
async fn post_stateless(url: &str, body: &serde_json::Value) -> Answer {
    answer(modern_post(url, body).send().await.unwrap()).await
}

/// A keyed `charge_card` in the stateless era (2026-07-28): no session, so
/// it can go to either gateway.
fn stateless_charge(id: i64, account: &str, amount: i64, key: &str) -> serde_json::Value {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
        "name":"charge_card","arguments":{"account":account,"amount":amount},
        "_meta":{"dev.countersign/idempotency-key":key,
                 "io.modelcontextprotocol/protocolVersion":"2026-07-28"}}})
}

#[tokio::test]
async fn a_gateway_on_postgres_keeps_its_ledger_there_across_a_restart() {
    let schema = Schema::new();
    let mut gw = on(&schema, Options::default());
    let version = countersign::store::postgres::MIGRATIONS.len();
    gw.wait_for_log(&format!(
        "PostgreSQL, schema migrated from version 0 to {version}"
    ))
    .await;
    // /healthz says the store answers.
    let health: serde_json::Value = serde_json::from_slice(
        &reqwest::get(format!("{}/healthz", gw.base()))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(health["store"], "ok", "{health}");
    // `check` asks the gateway at `gateway.listen`: name the port it got.
    let config = std::fs::read_to_string(gw.config_path()).unwrap();
    let addr = gw.base().trim_start_matches("http://").to_owned();
    std::fs::write(
        gw.config_path(),
        config.replacen("\"127.0.0.1:0\"", &format!("\"{addr}\""), 1),
    )
    .unwrap();
    let out = gw.cli(&["check"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("store ok"), "check reports the store: {text}");
    let charge = |id: i64| {
        json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
            "name":"charge_card","arguments":{"account":"a","amount":5},
            "_meta":{"dev.countersign/idempotency-key":"pg-k1"}}})
    };
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    let first = c.post(&charge(1)).await;
    assert_eq!(first.last()["result"]["isError"], false, "{first:?}");
    assert_eq!(
        psql(&format!("SELECT state FROM {}.ledger", schema.0)),
        "complete"
    );
    // The dispatch's audit entries went through the outbox in PostgreSQL,
    // which the audit writer clears once its own file is fsynced.
    wait_for_audit(&gw, "the dispatch entry", |e| {
        e.iter().any(|x| x["kind"] == "dispatched")
    })
    .await;
    eventually("the outbox cleared", || {
        psql(&format!("SELECT count(*) FROM {}.audit_outbox", schema.0)) == "0"
    })
    .await;
    gw.restart();
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    let again = c.post(&charge(2)).await;
    assert!(
        again.last()["result"]["_meta"]["dev.countersign/replayed"].is_object(),
        "the answer comes from the ledger in PostgreSQL: {again:?}"
    );
    assert_eq!(gw.executions("charge_card"), 1);
    // `store migrate` finds the schema up to date.
    let out = gw.cli(&["store", "migrate"]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("already at version {version}")));
}

#[test]
fn a_password_in_the_store_url_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        "[store]\nurl = \"postgres://app:s3cret@127.0.0.1/test\"\n",
    )
    .unwrap();
    let (ok, out, err) = run_cli(&["store", "migrate", "--config", config.to_str().unwrap()]);
    assert!(!ok, "{out}");
    assert!(err.contains("store.url holds a password"), "{err}");
    assert!(
        !err.contains("s3cret"),
        "the password is not repeated: {err}"
    );
}

/// Two gateways on one database: the proposal of a call held on A is listed
/// by B, and a reviewer's yes given through B runs the call held on A at once
/// (LISTEN/NOTIFY; the hold is far longer than the test takes), exactly once.
#[tokio::test]
async fn an_approval_through_gateway_b_runs_the_call_held_on_gateway_a() {
    let schema = Schema::new();
    let (pdir, key) = default_policies_with_alice();
    let start = || {
        on(
            &schema,
            Options {
                policies: Some(pdir.path().to_owned()),
                approvals: "hold = \"60s\"\nprogress_interval = \"10s\"\n".into(),
                ..Default::default()
            },
        )
    };
    let (a, b) = (start(), start());
    let mut c = Client::new(&a.url("payments"));
    c.initialize().await;
    let held = tokio::spawn(async move {
        c.post(
            &json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
            "name":"charge_card","arguments":{"account":"acct_1","amount":12},
            "_meta":{"dev.countersign/idempotency-key":"two-gw"}}}),
        )
        .await
    });
    // B lists the proposal A made.
    let mut id = None;
    for _ in 0..200 {
        let (ok, out, _) = review_cli(&b, &key, &["pending", "--json"]);
        if ok {
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            if let Some(p) = v["proposals"].as_array().and_then(|p| p.first()) {
                id = p["id"].as_str().map(str::to_owned);
                break;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let id = id.expect("gateway B lists the proposal made on A");
    let (ok, out, err) = review_cli(&b, &key, &["approve", &id]);
    assert!(ok, "{out}{err}");
    // Within half its hold: a call the notification did not wake would
    // still be waiting here, and answer `approval_pending` at the end of it.
    let answer = tokio::time::timeout(std::time::Duration::from_secs(30), held)
        .await
        .expect("the held call on A was not woken by the decision made on B")
        .unwrap();
    assert_eq!(answer.last()["result"]["isError"], false, "{answer:?}");
    assert_eq!(a.executions("charge_card") + b.executions("charge_card"), 1);
}

/// Duplicates of one keyed charge split across two gateways on one database:
/// the server runs it once, and every duplicate gets the same answer (those
/// that reach the gateway not running it wait for its record to settle,
/// woken by LISTEN/NOTIFY).
#[tokio::test]
async fn duplicates_across_two_gateways_run_once_and_share_the_answer() {
    let schema = Schema::new();
    let (a, b) = (
        on(&schema, Options::default()),
        on(&schema, Options::default()),
    );
    // Whichever gateway reserves the key, its server holds the call a while.
    a.fault("charge_card", "delay", 400);
    b.fault("charge_card", "delay", 400);
    let mut clients = Vec::new();
    for gw in [&a, &b] {
        let mut c = Client::new(&gw.url("payments"));
        c.initialize().await;
        clients.push(std::sync::Arc::new(c));
    }
    let mut calls = Vec::new();
    for n in 0..50 {
        let c = clients[n % 2].clone();
        calls.push(tokio::spawn(async move {
            let a = c
                .post(
                    &json!({"jsonrpc":"2.0","id":n,"method":"tools/call","params":{
                    "name":"charge_card","arguments":{"account":"acct_9","amount":3},
                    "_meta":{"dev.countersign/idempotency-key":"dup-across"}}}),
                )
                .await;
            a.last()["result"].clone()
        }));
    }
    let mut texts = std::collections::BTreeSet::new();
    let mut answered = 0;
    for call in calls {
        let result = call.await.unwrap();
        assert_eq!(result["isError"], false, "{result}");
        texts.insert(result["content"].to_string());
        answered += 1;
    }
    assert_eq!(answered, 50);
    assert_eq!(texts.len(), 1, "one answer for all 50: {texts:?}");
    assert_eq!(a.executions("charge_card") + b.executions("charge_card"), 1);
}

/// Two gateways keep their own audit logs; every entry names its gateway;
/// `audit verify` checks both, and finds a tampered entry in either;
/// `audit export` merges them in time order.
#[tokio::test]
async fn audit_logs_of_two_gateways_verify_and_export_as_one() {
    let schema = Schema::new();
    let (a, b) = (
        on(&schema, Options::default()),
        on(&schema, Options::default()),
    );
    for (n, gw) in [&a, &b].into_iter().enumerate() {
        let mut c = Client::new(&gw.url("payments"));
        c.initialize().await;
        let r = c
            .post(
                &json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
                "name":"charge_card","arguments":{"account":"a","amount":1},
                "_meta":{"dev.countersign/idempotency-key": format!("audit-{n}")}}}),
            )
            .await;
        assert_eq!(r.last()["result"]["isError"], false, "{r:?}");
        wait_for_audit(gw, "the completed entry", |e| {
            e.iter().any(|x| x["kind"] == "completed")
        })
        .await;
    }
    let dirs = [a.audit_dir(), b.audit_dir()];
    let ids: Vec<String> = dirs
        .iter()
        .map(|d| audit_entries(d)[0]["gateway"].as_str().unwrap().to_owned())
        .collect();
    assert_ne!(ids[0], ids[1], "each gateway names itself");
    for d in &dirs {
        assert!(audit_entries(d).iter().all(|e| e["gateway"].is_string()));
    }
    let args = |cmd: &str| {
        let mut v: Vec<String> = vec!["audit".into(), cmd.into()];
        for d in &dirs {
            v.push("--dir".into());
            v.push(d.display().to_string());
        }
        v
    };
    let run = |v: Vec<String>| {
        let refs: Vec<&str> = v.iter().map(String::as_str).collect();
        run_cli(&refs)
    };
    let (ok, out, err) = run(args("export"));
    assert!(ok, "{err}");
    let merged: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: std::collections::BTreeSet<&str> = merged
        .iter()
        .filter_map(|e| e["gateway"].as_str())
        .collect();
    assert_eq!(names.len(), 2, "both logs in one export");
    let times: Vec<i64> = merged
        .iter()
        .map(|e| countersign::core::time::parse_rfc3339(e["time"].as_str().unwrap()).unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "in time order");
    let (ok, out, err) = run(args("verify"));
    assert!(ok, "{out}{err}");
    // A tampered entry in B's log is found (B stopped first: its log is
    // closed with a checkpoint).
    let mut b = b;
    b.terminate();
    let seg = audit_segments(&dirs[1])[0].clone();
    let text = std::fs::read_to_string(&seg).unwrap();
    std::fs::write(&seg, text.replacen("\"amount\":1", "\"amount\":9", 1)).unwrap();
    let (ok, out, _) = run(args("verify"));
    assert!(!ok, "{out}");
    assert!(out.contains(&dirs[1].display().to_string()), "{out}");
}

/// Gateway A is killed (SIGKILL) after `dispatched`, the server executing:
/// the retry on B answers `outcome_unknown` (A's lease lapses, B settles its
/// record as unknown, never free), the count stays 1, and a reviewer
/// reconciles it through B.
#[tokio::test]
async fn a_gateway_killed_after_dispatch_leaves_an_unknown_that_another_reconciles() {
    let schema = Schema::new();
    let (pdir, key) = default_policies_with_alice();
    // Charges run unattended here: the test is about the ledger.
    std::fs::write(pdir.path().join("default.cedar"), ALLOW_ALL).unwrap();
    let start = || {
        on(
            &schema,
            Options {
                extra: "lease = \"1s\"\n".into(),
                policies: Some(pdir.path().to_owned()),
                // The sweep that settles a lapsed gateway's calls runs every second.
                gateway: "session_idle_timeout = \"2s\"\n".into(),
                ..Default::default()
            },
        )
    };
    let (mut a, b) = (start(), start());
    a.fault("charge_card", "delay", 30_000);
    let body = |id: i64| stateless_charge(id, "acct_k", 4, "killed-k");
    let url_a = a.url("payments");
    let in_flight = tokio::spawn(async move { modern_post(&url_a, &body(1)).send().await });
    eventually("the server runs the call", || {
        a.executions("charge_card") == 1
    })
    .await;
    a.kill();
    let _ = in_flight.await;
    let retry = post_stateless(&b.url("payments"), &body(2)).await;
    assert_eq!(code(&retry), "outcome_unknown", "{retry:?}");
    assert_eq!(b.executions("charge_card"), 0, "B never ran it");
    eventually("A's record settled as unknown", || {
        psql(&format!(
            "SELECT state FROM {}.ledger WHERE key LIKE '%killed-k%'",
            schema.0
        )) == "unknown"
    })
    .await;
    // Through B's control API, signed with the reviewer's key.
    let out = std::process::Command::new(countersign_bin())
        .args([
            "reconcile",
            "killed-k",
            "--tenant",
            "acme",
            "--principal",
            "agent-7",
            "--executed",
            "--note",
            "seen in the PSP",
            "--reviewer-key",
        ])
        .arg(&key)
        .args(["--gateway", &b.base()])
        .output()
        .unwrap();
    let (ok, out, err) = (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(ok, "{out}{err}");
    let replayed = post_stateless(&b.url("payments"), &body(3)).await;
    assert!(replayed.text.contains("seen in the PSP"), "{replayed:?}");
    assert_eq!(a.executions("charge_card") + b.executions("charge_card"), 1);
}

/// A retry through gateway B waits for the call gateway A sent; when B's
/// wait ends first, B moves the record to `unknown` before it answers
/// `outcome_unknown`, so A, whose answer comes later, cannot complete it
/// behind B's back: both answers and the ledger say unknown, and
/// `reconcile --list` lists the key. (Before, B answered unknown while A
/// then recorded the answer, and the key was in no list.)
#[tokio::test]
async fn an_unknown_answer_for_a_call_held_elsewhere_is_what_the_ledger_says() {
    let schema = Schema::new();
    let (pdir, key) = default_policies_with_alice();
    std::fs::write(pdir.path().join("default.cedar"), ALLOW_ALL).unwrap();
    // A waits for its server up to 30 s; B waits for A's flight its own
    // call timeout and 5 s, about 6 s.
    let start = |call_timeout: &str| {
        on(
            &schema,
            Options {
                call_timeout: call_timeout.into(),
                policies: Some(pdir.path().to_owned()),
                ..Default::default()
            },
        )
    };
    let (a, b) = (start("30s"), start("1s"));
    a.fault("charge_card", "delay", 9_000);
    let body = |id: i64| stateless_charge(id, "acct_h", 6, "held-there");
    let url_a = a.url("payments");
    let on_a = tokio::spawn(async move { post_stateless(&url_a, &body(1)).await });
    eventually("A's server runs the call", || {
        a.executions("charge_card") == 1
    })
    .await;
    let on_b = post_stateless(&b.url("payments"), &body(2)).await;
    assert_eq!(code(&on_b), "outcome_unknown", "{on_b:?}");
    wait_for_audit(&b, "B's own outcome_unknown, with why", |entries| {
        entries.iter().any(|e| {
            e["kind"] == "outcome_unknown"
                && e["idempotency_key"] == "held-there"
                && e["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("another gateway sent the call"))
        })
    })
    .await;
    assert_eq!(
        psql(&format!(
            "SELECT state FROM {}.ledger WHERE key LIKE '%held-there%'",
            schema.0
        )),
        "unknown",
        "the ledger says unknown when B says so"
    );
    let on_a = on_a.await.unwrap();
    assert_eq!(
        code(&on_a),
        "outcome_unknown",
        "A's late answer does not contradict the ledger: {on_a:?}"
    );
    assert_eq!(
        psql(&format!(
            "SELECT state FROM {}.ledger WHERE key LIKE '%held-there%'",
            schema.0
        )),
        "unknown"
    );
    let listed = std::process::Command::new(countersign_bin())
        .args(["reconcile", "--list", "--reviewer-key"])
        .arg(&key)
        .args(["--gateway", &a.base()])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.status.success() && out.contains("held-there"),
        "{out}{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    assert_eq!(a.executions("charge_card") + b.executions("charge_card"), 1);
}

#[test]
fn offline_reconcile_refuses_a_shared_ledger_and_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway]\ndata_dir = \"{}\"\n[store]\nurl = \"postgres://postgres@127.0.0.1:5432/test\"\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let (ok, _, err) = run_cli(&["reconcile", "--list", "--config", config.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("reconcile through one of them"), "{err}");
}

/// A gateway paused (SIGSTOP) between its reservation and its dispatch
/// until its lease lapsed cannot dispatch when it resumes (SIGCONT): the
/// statement that records `dispatched` checks the lease and the epoch the
/// key was reserved under. The call ends not dispatched, and a retry runs
/// it once.
///
/// To pause the gateway exactly there, the test holds a lock on the ledger
/// that every insert waits for (reads do not): the gateway's reservation
/// waits on it, the gateway is stopped, the lease lapses on the database's
/// clock, and the lock is let go, so the reservation commits while the
/// gateway is still stopped.
#[tokio::test]
async fn a_gateway_paused_past_its_lease_dispatches_nothing_after_it_resumes() {
    let schema = Schema::new();
    let start = || {
        on(
            &schema,
            Options {
                extra: "lease = \"1s\"\n".into(),
                ..Default::default()
            },
        )
    };
    let (a, b) = (start(), start());
    let id_a = std::fs::read_to_string(a.dir.path().join("data/gateway-id")).unwrap();
    let id_a = id_a.trim().to_owned();
    let (db, conn) = "host=127.0.0.1 port=5432 user=postgres dbname=test"
        .parse::<tokio_postgres::Config>()
        .unwrap()
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let ours: i32 = db
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    // A failed wait below must not leave the lock held for the schema's
    // drop to wait on forever: the server ends the session after 30 s.
    db.batch_execute(&format!(
        "SET idle_in_transaction_session_timeout = '30s';
         BEGIN; LOCK TABLE {}.ledger IN SHARE MODE",
        schema.0
    ))
    .await
    .unwrap();
    let body = |id: i64| stateless_charge(id, "acct_p", 6, "paused-k");
    let url_a = a.url("payments");
    let held = tokio::spawn(async move { post_stateless(&url_a, &body(1)).await });
    // Inserts into the ledger that wait for this test's lock (other tests'
    // gateways run on other schemas, and their waits are not ours): the
    // call's claim, its reservation made with its dispatch in one statement.
    let waiting = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE {ours} = ANY(pg_blocking_pids(pid))
         AND query LIKE '%INSERT INTO ledger%'"
    );
    eventually("A's claim waits on the lock", || psql(&waiting) == "1").await;
    a.signal("STOP");
    eventually("A's lease lapsed, on the database's clock", || {
        psql(&format!(
            "SELECT count(*) FROM {}.gateways WHERE id = '{id_a}'
             AND lease_until_ms < (extract(epoch from clock_timestamp()) * 1000)::bigint",
            schema.0
        )) == "1"
    })
    .await;
    db.batch_execute("COMMIT").await.unwrap();
    eventually("the claim ran while A is stopped", || psql(&waiting) == "0").await;
    a.signal("CONT");
    let first = held.await.unwrap();
    assert_eq!(code(&first), "upstream_unavailable", "{first:?}");
    assert!(first.text.contains("did not run"), "{first:?}");
    assert_eq!(a.executions("charge_card"), 0, "A dispatched nothing");
    // The key was never dispatched: the claim, run on the database's clock
    // after the lapse, inserted nothing.
    let state = psql(&format!(
        "SELECT state FROM {}.ledger WHERE key LIKE '%paused-k%'",
        schema.0
    ));
    assert!(state.is_empty(), "never dispatched: {state:?}");
    wait_for_audit(&a, "A's not_dispatched entry", |e| {
        e.iter().any(|x| {
            x["kind"] == "not_dispatched" && x["reason"].to_string().contains("lease has lapsed")
        })
    })
    .await;
    // A took its lease again, under a new epoch.
    a.wait_for_log("taking it again under a new epoch").await;
    // A retry through B runs it once; through A it is then replayed.
    let retry = post_stateless(&b.url("payments"), &body(2)).await;
    assert_eq!(retry.last()["result"]["isError"], false, "{retry:?}");
    let again = post_stateless(&a.url("payments"), &body(3)).await;
    assert!(
        again.last()["result"]["_meta"]["dev.countersign/replayed"].is_object(),
        "{again:?}"
    );
    assert_eq!(a.executions("charge_card") + b.executions("charge_card"), 1);
}

/// The certificate the local PostgreSQL serves, self-signed for
/// `localhost` (`.ci/setup-postgres` makes sure TLS is on with one).
fn server_cert() -> String {
    psql("SHOW ssl_cert_file")
}

/// `[store]` over TLS to `localhost` with `tls` as `[store.tls]`.
fn tls_store(schema: &Schema, app: &str, tls: &str) -> String {
    format!(
        "\n[store]\nurl = \"postgres://postgres@localhost:5432/test?sslmode=require&application_name={app}&options=-c%20search_path%3D{}\"\npool_size = 2\n{tls}",
        schema.0
    )
}

/// With `sslmode=require` every connection of the gateway (pool, writers,
/// listener) is TLS, the server's certificate checked against
/// `[store.tls] ca_file`, and calls run as on plain TCP.
#[tokio::test]
async fn a_gateway_reaches_postgres_over_verified_tls() {
    let schema = Schema::new();
    let app = format!("cs-tls-{:08x}", rand::random::<u32>());
    let gw = Gateway::start_with(Options {
        extra: tls_store(
            &schema,
            &app,
            &format!("[store.tls]\nca_file = \"{}\"\n", server_cert()),
        ),
        ..Default::default()
    });
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    let a = c
        .post(
            &json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
            "name":"charge_card","arguments":{"account":"acct_t","amount":2},
            "_meta":{"dev.countersign/idempotency-key":"tls-k"}}}),
        )
        .await;
    assert_eq!(a.last()["result"]["isError"], false, "{a:?}");
    let conns = psql(&format!(
        "SELECT count(*) FILTER (WHERE s.ssl), count(*) FROM pg_stat_activity a
         JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = '{app}'"
    ));
    let (tls, all) = conns.split_once('|').unwrap();
    let all: usize = all.parse().unwrap();
    assert!(
        all >= 4,
        "the pool, the writers that wrote and the listener: {conns}"
    );
    assert_eq!(tls, all.to_string(), "every connection is TLS: {conns}");
}

/// A certificate the gateway cannot check stops it before it serves, with
/// what to set; `sslmode=prefer` (which would fall back to plain TCP) is
/// refused.
#[test]
fn an_unchecked_database_certificate_or_sslmode_prefer_is_refused() {
    let schema = Schema::new();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    let data = dir.path().join("data");
    let write = |store: String| {
        std::fs::write(
            &config,
            format!("[gateway]\ndata_dir = \"{}\"\n{store}", data.display()),
        )
        .unwrap();
    };
    // Mozilla's roots do not include the server's self-signed certificate.
    write(tls_store(&schema, "cs-untrusted", ""));
    let (ok, out, err) = run_cli(&["store", "migrate", "--config", config.to_str().unwrap()]);
    assert!(!ok, "{out}");
    assert!(err.contains("set [store.tls] ca_file"), "{err}");
    write(tls_store(&schema, "cs-prefer", "").replace("sslmode=require", "sslmode=prefer"));
    let (ok, out, err) = run_cli(&["store", "migrate", "--config", config.to_str().unwrap()]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("sslmode=prefer falls back to plain TCP"),
        "{err}"
    );
    // Trusted, the same url migrates.
    write(tls_store(
        &schema,
        "cs-trusted",
        &format!("[store.tls]\nca_file = \"{}\"\n", server_cert()),
    ));
    let (ok, out, err) = run_cli(&["store", "migrate", "--config", config.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("schema migrated from version 0"), "{out}");
}

/// Approval in the client across gateways: a question asked by one gateway
/// (its `requestState` signed with its own key) is answered through the
/// other, which verifies the state against the key recorded on the shared
/// proposal; the call runs once, and the state replayed through the first
/// is used up.
#[tokio::test]
async fn a_client_answer_may_reach_another_gateway_on_the_same_database() {
    let schema = Schema::new();
    let (pdir, _alice) = default_policies_with_alice();
    let opts = || Options {
        policies: Some(pdir.path().to_owned()),
        ..Default::default()
    };
    let a = on(&schema, opts());
    let b = on(&schema, opts());
    let call = |reply: Option<(&str, serde_json::Value)>| {
        let mut body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
            "name":"charge_card","arguments":{"account":"acct_7","amount":9},
            "_meta":{"dev.countersign/idempotency-key":"pg-confirm",
                     "io.modelcontextprotocol/protocolVersion":"2026-07-28",
                     "io.modelcontextprotocol/clientCapabilities":{"elicitation":{}}}}});
        if let Some((state, answer)) = reply {
            body["params"]["requestState"] = json!(state);
            body["params"]["inputResponses"] = json!({"dev.countersign/confirm": answer});
        }
        body
    };
    let send = |gw: &Gateway, body: serde_json::Value| {
        let url = gw.url("payments");
        async move {
            let r = answer(
                modern_post_as(&url, &body, SOLO_TOKEN)
                    .send()
                    .await
                    .unwrap(),
            )
            .await;
            r.last()["result"].clone()
        }
    };
    let first = send(&a, call(None)).await;
    assert_eq!(first["resultType"], "input_required", "{first}");
    let state = first["requestState"].as_str().unwrap().to_owned();
    let yes = json!({"action": "accept", "content": {"approve": true}});
    let ran = send(&b, call(Some((&state, yes.clone())))).await;
    assert!(
        ran["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("charged 9 to acct_7"),
        "{ran}"
    );
    let again = send(&a, call(Some((&state, yes)))).await;
    assert_eq!(
        again["structuredContent"]["countersign"]["code"], "confirmation_used",
        "{again}"
    );
    assert_eq!(a.executions("charge_card") + b.executions("charge_card"), 1);
}
