//! Retry safety (DESIGN.md section 5), one test per fault row: reads are
//! retried across a healed session, writes never are once dispatched, lost
//! sessions are healed for the next call, and a failing upstream trips the
//! circuit breaker.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn pids(gw: &Gateway, tool: &str) -> Vec<u64> {
    gw.records()
        .iter()
        .filter(|r| r["event"] == "executed" && r["tool"] == tool)
        .filter_map(|r| r["pid"].as_u64())
        .collect()
}

#[tokio::test]
async fn read_with_the_child_dying_mid_call_is_retried_on_a_respawned_child() {
    let gw = Gateway::start();
    let c = listed(&gw, "payments").await;
    gw.fault("get_balance", "exit_after_execute", 0);
    let a = c.call(1, "get_balance", json!({"account":"acct_1"})).await;
    assert_eq!(a.last()["result"]["isError"], false, "{a:?}");
    assert_eq!(
        a.last()["result"]["content"][0]["text"],
        "balance of acct_1: 1200.00 EUR"
    );
    let p = pids(&gw, "get_balance");
    assert_eq!(
        p.len(),
        2,
        "executed twice: once by the dying child, once by the new one"
    );
    assert_ne!(p[0], p[1]);
}

#[tokio::test]
async fn write_with_the_child_dying_mid_call_is_unknown_and_the_session_heals() {
    let gw = Gateway::start();
    let c = listed(&gw, "payments").await;
    gw.fault("charge_card", "exit_after_execute", 0);
    let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge_card",
        "arguments":{"account":"a","amount":3},"_meta":{"dev.countersign/idempotency-key":"w-1"}}});
    let a = c.post(&call).await;
    assert_eq!(code(&a), "outcome_unknown");
    assert!(a.last()["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("Verify with a read"));
    assert_eq!(gw.executions("charge_card"), 1, "never re-sent");
    // The same key again: still unknown, still one execution.
    assert_eq!(code(&c.post(&call).await), "outcome_unknown");
    assert_eq!(gw.executions("charge_card"), 1);
    // The next call on the same client session runs on a respawned child.
    let b = c.call(2, "refund", json!({"charge":"ch_1"})).await;
    assert_eq!(b.last()["result"]["isError"], false, "{b:?}");
    assert_ne!(pids(&gw, "refund")[0], pids(&gw, "charge_card")[0]);
}

#[tokio::test]
async fn http_session_dropped_mid_call_read_retried_write_unknown() {
    let gw = Gateway::with_http_upstream();
    let c = listed(&gw, "phttp").await;
    gw.fault("get_balance", "drop_session", 0);
    let a = c.call(1, "get_balance", json!({"account":"x"})).await;
    assert_eq!(
        a.last()["result"]["isError"],
        false,
        "read retried on a new upstream session: {a:?}"
    );
    assert_eq!(gw.executions("get_balance"), 2);
    gw.fault("charge_card", "drop_session", 0);
    let w = c
        .call(2, "charge_card", json!({"account":"x","amount":1}))
        .await;
    assert_eq!(code(&w), "outcome_unknown");
    assert_eq!(gw.executions("charge_card"), 1);
    let next = c.call(3, "refund", json!({"charge":"ch_2"})).await;
    assert_eq!(next.last()["result"]["isError"], false, "{next:?}");
}

#[tokio::test]
async fn unannotated_tools_are_writes_unless_the_operator_says_otherwise() {
    let gw = Gateway::start();
    let c = listed(&gw, "payments").await;
    gw.fault("transfer", "exit_after_execute", 0);
    let a = c
        .call(1, "transfer", json!({"from":"a","to":"b","amount":1}))
        .await;
    assert_eq!(
        code(&a),
        "outcome_unknown",
        "no annotations means write-capable"
    );
    assert_eq!(gw.executions("transfer"), 1);

    let gw = Gateway::start_with(Options {
        extra: "\n[servers.payments.tools.transfer]\nread_only = true\n".into(),
        ..Default::default()
    });
    let c = listed(&gw, "payments").await;
    gw.fault("transfer", "exit_after_execute", 0);
    let a = c
        .call(1, "transfer", json!({"from":"a","to":"b","amount":1}))
        .await;
    assert_eq!(
        a.last()["result"]["isError"],
        false,
        "the override makes it retryable: {a:?}"
    );
    assert_eq!(gw.executions("transfer"), 2);
}

#[tokio::test]
async fn failure_before_dispatch_runs_nothing_and_leaves_the_key_free() {
    let gw = Gateway::start_with(Options {
        extra: "\n[retry]\nmax_attempts = 2\nbase_delay = \"10ms\"\n\n[servers.broken]\ncommand = \"/nonexistent/server\"\n".into(),
        ..Default::default()
    });
    let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge_card","arguments":{"amount":1},
        "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","dev.countersign/idempotency-key":"b-1"}}});
    for _ in 0..2 {
        let resp = modern_post(&gw.url("broken"), &body).send().await.unwrap();
        let a = answer(resp).await;
        // Reported, not unknown: the key stays free (a second try is judged afresh).
        assert_eq!(
            a.last()["result"]["structuredContent"]["countersign"]["code"],
            "upstream_unavailable",
            "{a:?}"
        );
    }
    assert_eq!(gw.executions("charge_card"), 0);
}

#[tokio::test]
async fn breaker_opens_answers_fast_and_closes_after_cooldown() {
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("healthy");
    let script = format!(
        "test -f {} && exec {} || exit 1",
        flag.display(),
        example_server_bin().display()
    );
    let gw = Gateway::start_with(Options {
        extra: format!(
            "\n[retry]\nmax_attempts = 1\n\n[circuit]\nfailure_threshold = 2\ncooldown = \"1s\"\n\n[servers.flaky]\ncommand = \"sh\"\nargs = [\"-c\", \"{}\"]\n",
            script.replace('"', "\\\"")
        ),
        ..Default::default()
    });
    let call = |id: i64| {
        let url = gw.url("flaky");
        async move {
            let body = json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":"get_balance","arguments":{"account":"a"},
                "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}});
            let resp = modern_post(&url, &body).send().await.unwrap();
            answer(resp).await
        }
    };
    for id in 1..=2 {
        let a = call(id).await;
        assert_eq!(code(&a), "upstream_unavailable", "{a:?}");
        assert!(a.last()["result"]["structuredContent"]["countersign"]
            .get("circuit")
            .is_none());
    }
    let open = call(3).await;
    assert_eq!(
        open.last()["result"]["structuredContent"]["countersign"]["circuit"],
        "open",
        "{open:?}"
    );
    // The upstream recovers; after the cooldown one trial call closes the circuit.
    std::fs::write(&flag, "").unwrap();
    let still_open = call(4).await;
    assert_eq!(
        still_open.last()["result"]["structuredContent"]["countersign"]["circuit"],
        "open"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let trial = call(5).await;
    assert_eq!(
        trial.last()["result"]["content"][0]["text"],
        "balance of a: 1200.00 EUR",
        "{trial:?}"
    );
    let closed = call(6).await;
    assert_eq!(closed.last()["result"]["isError"], false);
}

#[tokio::test]
async fn transient_server_errors_are_retried_for_reads_only() {
    let gw = Gateway::start();
    let c = listed(&gw, "payments").await;
    gw.fault("get_balance", "error_before_execute", 0);
    let a = c.call(1, "get_balance", json!({"account":"t"})).await;
    assert_eq!(
        a.last()["result"]["isError"],
        false,
        "-32603 on a read is retried: {a:?}"
    );
    assert_eq!(gw.executions("get_balance"), 1);
    gw.fault("refund", "error_before_execute", 0);
    let w = c.call(2, "refund", json!({"charge":"ch_t"})).await;
    assert_eq!(
        w.last()["error"]["code"],
        -32603,
        "a write's answer is final: {w:?}"
    );
    assert_eq!(gw.executions("refund"), 0);
}

#[tokio::test]
async fn a_timed_out_write_is_unknown_in_the_ledger_and_cancelled_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("rec.jsonl");
    let faults = dir.path().join("faults.json");
    std::fs::write(
        &faults,
        json!({"charge_card":{"fault":"delay","delay_ms":2000}}).to_string(),
    )
    .unwrap();
    let gw = Gateway::start_with(Options {
        extra: format!(
            "\n[servers.slow]\ncommand = \"{}\"\nargs = [\"--record\", \"{}\", \"--faults\", \"{}\"]\ncall_timeout = \"300ms\"\n",
            example_server_bin().display(),
            record.display(),
            faults.display()
        ),
        ..Default::default()
    });
    let c = listed(&gw, "slow").await;
    let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge_card",
        "arguments":{"account":"a","amount":1},"_meta":{"dev.countersign/idempotency-key":"t-1"}}});
    assert_eq!(code(&c.post(&call).await), "outcome_unknown");
    assert_eq!(
        code(&c.post(&call).await),
        "outcome_unknown",
        "the ledger holds it as unknown"
    );
    eventually("the server records the cancellation", || {
        std::fs::read_to_string(&record).is_ok_and(|t| t.contains("\"cancelled\""))
    })
    .await;
    let text = std::fs::read_to_string(&record).unwrap();
    assert_eq!(text.matches("\"executed\"").count(), 1);
    assert!(
        text.contains("\"cancelled\""),
        "notifications/cancelled reached the server: {text}"
    );
}

/// An HTTP upstream stops, the breaker opens, the upstream comes back on the
/// same port (knowing none of the old sessions). After the cooldown the first
/// read heals the session and succeeds, and the server ran it once.
#[tokio::test]
async fn the_breaker_closes_after_an_http_upstream_restarts() {
    let mut gw = Gateway::start_with(Options {
        http_upstream: true,
        extra: "\n[circuit]\nfailure_threshold = 3\ncooldown = \"1s\"\n".into(),
        ..Default::default()
    });
    let mut c = Client::new(&gw.url("phttp"));
    c.initialize().await;
    let ok = |a: &Answer| a.last()["result"]["isError"] == false;
    assert!(ok(&c.call(1, "get_balance", json!({"account":"a"})).await));
    let addr = gw.http_upstream.as_ref().unwrap().addr.clone();
    drop(gw.http_upstream.take()); // the upstream stops
    for id in 2..=4 {
        let a = c.call(id, "get_balance", json!({"account":"a"})).await;
        assert_eq!(code(&a), "upstream_unavailable", "{a:?}");
    }
    let a = c.call(5, "get_balance", json!({"account":"a"})).await;
    assert_eq!(countersign(&a)["circuit"], "open", "{a:?}");
    // A write refused by the open breaker ran nothing and keeps its key free.
    let charge = json!({"jsonrpc":"2.0","id":50,"method":"tools/call","params":{
        "name":"charge_card","arguments":{"account":"a","amount":5},
        "_meta":{"dev.countersign/idempotency-key":"k-open"}}});
    let a = c.post(&charge).await;
    assert_eq!(countersign(&a)["circuit"], "open", "{a:?}");
    let record = gw.dir.path().join("executions.jsonl");
    gw.http_upstream = Some(HttpUpstream::start_at(&addr, &record, &gw.faults_path()));
    let health = format!("{}/healthz", gw.base());
    // After the cooldown the circuit lets one trial through.
    let mut half_open = false;
    for _ in 0..100 {
        let h: Value =
            serde_json::from_slice(&reqwest::get(&health).await.unwrap().bytes().await.unwrap())
                .unwrap();
        if h["circuits"]["phttp"] == "half-open" {
            half_open = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(half_open, "the cooldown ended");
    let before = gw.executions("get_balance");
    let a = c.call(6, "get_balance", json!({"account":"a"})).await;
    assert!(ok(&a), "the trial heals the session and runs: {a:?}");
    assert_eq!(gw.executions("get_balance"), before + 1, "one trial");
    assert!(
        gw.log
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("lost its session")),
        "the old session was refused (404) and healed, not counted as a failure"
    );
    let h: Value =
        serde_json::from_slice(&reqwest::get(&health).await.unwrap().bytes().await.unwrap())
            .unwrap();
    assert_eq!(h["circuits"]["phttp"], "closed", "{h}");
    let a = c.post(&charge).await;
    assert!(ok(&a), "the key was free: {a:?}");
    assert_eq!(gw.executions("charge_card"), 1);
}
