//! Stopping the gateway answers every call it holds: a write held for an
//! approval and a duplicate waiting with it each get `approval_pending`
//! with the proposal, and nothing runs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// Wait (up to 20 s) until `n` gateway log lines contain `needle`.
async fn wait_for_lines(gw: &Gateway, needle: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen = gw
            .log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count();
        if seen >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{seen} of {n} log lines with `{needle}`"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn sigint_answers_a_held_write_and_its_waiting_duplicate() {
    let (pdir, _key) = default_policies_with_alice();
    let gw = Gateway::start_with(Options {
        policies: Some(pdir.path().to_owned()),
        // Held far longer than the test: only the drain can answer them.
        approvals: "hold = \"10m\"\n".into(),
        gateway_env: vec![(
            "COUNTERSIGN_LOG".into(),
            "info,countersign::enforce::flight=debug".into(),
        )],
        ..Default::default()
    });
    let call = |id: i64| {
        json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
            "name":"charge_card",
            "arguments":{"account":"acct_42","amount":5},
            "_meta":{
                "io.modelcontextprotocol/protocolVersion":"2026-07-28",
                "io.modelcontextprotocol/clientCapabilities":{},
                "dev.countersign/idempotency-key":"drain-1"}}})
    };
    let url = gw.url("payments");
    let url1 = url.clone();
    let held =
        tokio::spawn(
            async move { answer(modern_post(&url1, &call(1)).send().await.unwrap()).await },
        );
    wait_for_lines(&gw, "proposal created", 1).await;
    let url2 = url.clone();
    let duplicate =
        tokio::spawn(
            async move { answer(modern_post(&url2, &call(2)).send().await.unwrap()).await },
        );
    wait_for_lines(&gw, "an identical call is in flight", 1).await;
    gw.signal("INT");
    let status = tokio::task::spawn_blocking(move || gw_wait(gw))
        .await
        .unwrap();
    assert!(status.success(), "the gateway stopped cleanly: {status:?}");
    for (name, a) in [
        ("held", held.await.unwrap()),
        ("duplicate", duplicate.await.unwrap()),
    ] {
        let result = &a.last()["result"];
        let decision = &result["_meta"]["dev.countersign/decision"];
        assert_eq!(decision["code"], "approval_pending", "{name}: {a:?}");
        assert!(decision["proposal_id"].is_string(), "{name}: {a:?}");
        assert_eq!(result["isError"], Value::Bool(true), "{name}");
    }
    drop(pdir);
}

/// Wait for the stopped gateway and return how it exited, checking that
/// nothing ran.
fn gw_wait(mut gw: Gateway) -> std::process::ExitStatus {
    let status = gw.wait_exit();
    assert_eq!(gw.executions("charge_card"), 0, "nothing ran");
    status
}
