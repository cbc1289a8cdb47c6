//! At most once per idempotency key, with the real gateway, the example
//! server and its execution record: replays, concurrent duplicates, drift
//! and remap, crashes, lost answers and reconciliation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn keyed(id: i64, tool: &str, args: Value, key: &str) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
        "name": tool, "arguments": args, "_meta": {"dev.countersign/idempotency-key": key}}})
}

#[tokio::test]
async fn five_identical_calls_one_execution_five_identical_answers() {
    let gw = Gateway::start();
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    let mut answers = Vec::new();
    for id in 1..=5 {
        let a = c
            .post(&keyed(
                id,
                "charge_card",
                json!({"account":"acct_42","amount":120}),
                "order-1",
            ))
            .await;
        assert_eq!(a.last()["id"], id, "each retry gets its own id back");
        answers.push(a.last()["result"].clone());
    }
    assert_eq!(gw.executions("charge_card"), 1);
    assert!(
        answers[0]["_meta"]
            .get("dev.countersign/replayed")
            .is_none(),
        "the first is fresh"
    );
    for a in &answers[1..] {
        assert_eq!(a["content"], answers[0]["content"]);
        assert_eq!(a["_meta"]["dev.countersign/replayed"]["key"], "order-1");
        assert!(a["_meta"]["dev.countersign/replayed"]["first_answered_at"]
            .as_str()
            .unwrap()
            .contains('T'));
    }
}

#[tokio::test]
async fn fifty_concurrent_duplicates_one_execution() {
    let gw = Gateway::start();
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    gw.fault("charge_card", "delay", 300);
    let mut tasks = Vec::new();
    for id in 0..50 {
        let (url, session) = (c.url.clone(), c.session.clone());
        tasks.push(tokio::spawn(async move {
            let mut c2 = Client::new(&url);
            c2.session = session;
            c2.post(&keyed(
                id,
                "charge_card",
                json!({"account":"a","amount":7}),
                "burst",
            ))
            .await
        }));
    }
    let mut contents = Vec::new();
    for t in tasks {
        let a = t.await.unwrap();
        assert_eq!(a.last()["result"]["isError"], false, "{a:?}");
        contents.push(a.last()["result"]["content"].clone());
    }
    assert_eq!(gw.executions("charge_card"), 1);
    assert!(
        contents.iter().all(|c| *c == contents[0]),
        "every duplicate got the original's answer"
    );
}

#[tokio::test]
async fn drift_and_remap_are_refused_and_run_nothing() {
    let gw = Gateway::start();
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    c.post(&keyed(
        1,
        "charge_card",
        json!({"account":"a","amount":5}),
        "k-1",
    ))
    .await;
    let drift = c
        .post(&keyed(
            2,
            "charge_card",
            json!({"account":"a","amount":500}),
            "k-1",
        ))
        .await;
    assert_eq!(code(&drift), "drift_rejected");
    let remap = c
        .post(&keyed(3, "refund", json!({"charge":"ch_1"}), "k-1"))
        .await;
    assert_eq!(code(&remap), "remap_rejected");
    assert_eq!(gw.executions("charge_card"), 1);
    assert_eq!(gw.executions("refund"), 0);
    // Another principal's identical key is another record.
    let mut other = Client::new(&gw.url("payments"));
    other.token = OTHER_TOKEN.into();
    other.initialize().await;
    let a = other
        .post(&keyed(4, "refund", json!({"charge":"ch_1"}), "k-1"))
        .await;
    assert_eq!(a.last()["result"]["isError"], false);
    assert_eq!(gw.executions("refund"), 1);
}

#[tokio::test]
async fn derived_keys_catch_retries_but_reads_stay_fresh() {
    let gw = Gateway::start();
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    let w1 = c
        .call(1, "charge_card", json!({"account":"a","amount":1}))
        .await;
    let w2 = c
        .call(2, "charge_card", json!({"account":"a","amount":1}))
        .await;
    assert_eq!(
        gw.executions("charge_card"),
        1,
        "an identical write in the same session is a retry"
    );
    assert_eq!(
        w2.last()["result"]["content"],
        w1.last()["result"]["content"]
    );
    assert!(
        w2.last()["result"]["_meta"]["dev.countersign/replayed"]["key"]
            .as_str()
            .unwrap()
            .starts_with("derived:")
    );
    // Another session is another scope.
    let mut d = Client::new(&gw.url("payments"));
    d.initialize().await;
    d.call(3, "charge_card", json!({"account":"a","amount":1}))
        .await;
    assert_eq!(gw.executions("charge_card"), 2);
    // Reads are never replayed, whether or not the client listed tools:
    // the gateway lists them itself.
    c.call(4, "get_balance", json!({"account":"a"})).await;
    c.call(5, "get_balance", json!({"account":"a"})).await;
    assert_eq!(gw.executions("get_balance"), 2);
    c.post(&json!({"jsonrpc":"2.0","id":6,"method":"tools/list"}))
        .await;
    c.call(7, "get_balance", json!({"account":"b"})).await;
    c.call(8, "get_balance", json!({"account":"b"})).await;
    assert_eq!(gw.executions("get_balance"), 4);
}

#[tokio::test]
async fn server_exit_after_execute_is_unknown_until_reconciled() {
    let mut gw = Gateway::start();
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    gw.fault("charge_card", "exit_after_execute", 0);
    let call = keyed(1, "charge_card", json!({"account":"a","amount":9}), "pay-9");
    let a = c.post(&call).await;
    assert_eq!(code(&a), "outcome_unknown");
    // The session's child died with it; a new session retries the same key.
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    let again = c.post(&call).await;
    assert_eq!(code(&again), "outcome_unknown", "never re-executed");
    assert_eq!(gw.executions("charge_card"), 1);

    // The operator checks and says it did not happen (on the stopped gateway).
    gw.kill();
    let list = gw.cli(&["reconcile", "--list"]);
    assert!(
        String::from_utf8_lossy(&list.stdout).contains("pay-9"),
        "{list:?}"
    );
    let out = gw.cli(&[
        "reconcile",
        "pay-9",
        "--tenant",
        "acme",
        "--principal",
        "agent-7",
        "--not-executed",
        "--note",
        "checked the processor",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    gw.start_again();
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    let run = c.post(&call).await;
    assert_eq!(run.last()["result"]["isError"], false, "{run:?}");
    assert_eq!(
        gw.executions("charge_card"),
        2,
        "runs once more after reconciliation"
    );
    let replay = c.post(&call).await;
    assert!(replay.last()["result"]["_meta"]["dev.countersign/replayed"].is_object());
    assert_eq!(gw.executions("charge_card"), 2);
}

#[tokio::test]
async fn reconcile_refuses_while_the_gateway_runs_and_checks_its_input() {
    let gw = Gateway::start();
    let out = gw.cli(&[
        "reconcile",
        "nope",
        "--tenant",
        "acme",
        "--principal",
        "agent-7",
        "--executed",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is a gateway running"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn gateway_killed_mid_call_then_retry_is_unknown() {
    let mut gw = Gateway::start();
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    gw.fault("charge_card", "delay", 3000);
    let call = keyed(
        1,
        "charge_card",
        json!({"account":"a","amount":11}),
        "crash-1",
    );
    let (url, session) = (c.url.clone(), c.session.clone());
    let pending = tokio::spawn(async move {
        let mut c2 = Client::new(&url);
        c2.session = session;
        c2.request(reqwest::Method::POST)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(call.to_string())
            .send()
            .await
    });
    for _ in 0..100 {
        if gw.executions("charge_card") == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(gw.executions("charge_card"), 1, "the server is executing");
    gw.restart(); // SIGKILL, then start again on the same ledger
    let _ = pending.await;
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    let retry = c
        .post(&keyed(
            2,
            "charge_card",
            json!({"account":"a","amount":11}),
            "crash-1",
        ))
        .await;
    assert_eq!(code(&retry), "outcome_unknown", "{retry:?}");
    // The retry's own account is in the audit log: the gateway is done
    // with it, and it dispatched nothing.
    wait_for_audit(&gw, "the retry's outcome_unknown entry", |entries| {
        entries.iter().any(|e| {
            e["kind"] == "outcome_unknown"
                && e["idempotency_key"] == "crash-1"
                && e["repeat"] == true
        })
    })
    .await;
    assert_eq!(gw.executions("charge_card"), 1);
}

#[tokio::test]
async fn answers_survive_a_kill_once_flushed() {
    // Completed answers are fsynced by the next dispatch or an idle flush
    // (within 100 ms): after that, even SIGKILL keeps them replayable.
    let mut gw = Gateway::start_with(Options {
        extra: format!("\n[metrics]\ntoken_sha256 = \"{}\"\n", sha(METRICS_TOKEN)),
        ..Default::default()
    });
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    let call = keyed(1, "refund", json!({"charge":"ch_7"}), "refund-7");
    let first = c.post(&call).await;
    assert_eq!(first.last()["result"]["isError"], false);
    // The answer's commit is in the ledger; the gauge says when its fsync
    // came (the idle flush, with no dispatch to carry it).
    wait_until_flushed(&gw).await;
    gw.restart();
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    let again = c.post(&call).await;
    assert_eq!(
        again.last()["result"]["_meta"]["dev.countersign/replayed"]["key"],
        "refund-7",
        "{again:?}"
    );
    assert_eq!(gw.executions("refund"), 1);
}

#[tokio::test]
async fn concurrent_identical_reads_share_one_call_and_write_nothing() {
    let gw = Gateway::start();
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    c.post(&json!({"jsonrpc":"2.0","id":0,"method":"tools/list"}))
        .await;
    gw.fault("get_balance", "delay", 300);
    let mut tasks = Vec::new();
    for id in 0..10 {
        let (url, session) = (c.url.clone(), c.session.clone());
        tasks.push(tokio::spawn(async move {
            let mut c2 = Client::new(&url);
            c2.session = session;
            c2.call(id, "get_balance", json!({"account":"z"})).await
        }));
    }
    for t in tasks {
        let a = t.await.unwrap();
        assert_eq!(
            a.last()["result"]["content"][0]["text"],
            "balance of z: 1200.00 EUR"
        );
        assert!(
            a.last()["result"].get("_meta").is_none(),
            "a shared read is not a replay"
        );
    }
    assert_eq!(
        gw.executions("get_balance"),
        1,
        "in-flight duplicates share one call"
    );
    // Finished reads are not kept: the same read again runs again.
    c.call(20, "get_balance", json!({"account":"z"})).await;
    assert_eq!(gw.executions("get_balance"), 2);
}

const METRICS_TOKEN: &str = "scraper-token-1";

/// Wait (up to 10 s) until `/metrics` says no ledger commit waits for its
/// fsync.
async fn wait_until_flushed(gw: &Gateway) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut last = String::new();
    while std::time::Instant::now() < deadline {
        let resp = reqwest::Client::new()
            .get(format!("{}/metrics", gw.base()))
            .bearer_auth(METRICS_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        last = resp.text().await.unwrap();
        if last.lines().any(|l| l == "countersign_ledger_unflushed 0") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the ledger was not flushed within 10 s:\n{last}");
}
