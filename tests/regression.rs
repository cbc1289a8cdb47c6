//! One regression test per defect found by a chaos run and a bad-input
//! battery, each named after the defect, against the real gateway and the
//! example server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::json;

/// A client whose `tools/list` told the gateway which tools read.
async fn listed(gw: &Gateway, server: &str) -> Client {
    let mut c = Client::new(&gw.url(server));
    c.initialize().await;
    c.post(&json!({"jsonrpc":"2.0","id":0,"method":"tools/list"}))
        .await;
    c
}

#[tokio::test]
async fn a_null_or_fractional_request_id_is_refused_and_runs_nothing() {
    let gw = Gateway::start();
    let c = listed(&gw, "payments").await;
    for id in ["null", "1.5"] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"refund","arguments":{{"charge":"ch_1"}}}}}}"#
        );
        let a = c.post_raw(body).await;
        assert_eq!(a.status, 400, "{id}: {a:?}");
        assert_eq!(a.last()["error"]["code"], -32600, "{id}: {a:?}");
    }
    // The same call with an integer id runs, so nothing else refused them.
    let ok = c.call(2, "refund", json!({"charge":"ch_1"})).await;
    assert_eq!(ok.last()["result"]["isError"], false, "{ok:?}");
    assert_eq!(gw.executions("refund"), 1);
}

#[tokio::test]
async fn a_write_answered_request_cancelled_over_http_is_unknown_and_listed_for_reconciliation() {
    let mut gw = Gateway::with_http_upstream();
    let c = listed(&gw, "phttp").await;
    // The server runs the charge, then answers -32800 "Request cancelled".
    gw.fault("charge_card", "cancelled_after_execute", 0);
    let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge_card",
        "arguments":{"account":"a","amount":7},"_meta":{"dev.countersign/idempotency-key":"cx-1"}}});
    let first = c.post(&call).await;
    assert_eq!(code(&first), "outcome_unknown", "{first:?}");
    let retry = c.post(&call).await;
    assert_eq!(
        code(&retry),
        "outcome_unknown",
        "never replayed as a cancellation: {retry:?}"
    );
    assert_eq!(gw.executions("charge_card"), 1);
    assert!(gw.terminate().success());
    let out = gw.cli(&["reconcile", "--list"]);
    assert!(out.status.success(), "{out:?}");
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(listed.contains("cx-1"), "{listed}");
}
