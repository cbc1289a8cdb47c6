//! Every `tools/call` goes through the strict parse and is forwarded as its
//! canonical (RFC 8785) form: what the gateway hashes is byte-for-byte what
//! the server receives, and malformed arguments never reach the server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::{json, Value};

#[tokio::test]
async fn arguments_reach_the_server_as_jcs_bytes_without_reserved_inputs() {
    let gw = Gateway::with_http_upstream();
    for server in ["payments", "phttp"] {
        let mut c = Client::new(&gw.url(server));
        c.initialize().await;
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"charge_card",
            "arguments":{{"z":1E30,"amount":4.50,"account":"acct_1","_idempotency_key":"key-1"}},
            "_meta":{{"dev.countersign/idempotency-key":"key-{server}","progressToken":"p-1"}}}}}}"#
        );
        let a = c.post_raw(body).await;
        assert_eq!(a.last()["result"]["isError"], false, "{server}: {a:?}");
    }
    let records: Vec<Value> = gw
        .records()
        .into_iter()
        .filter(|r| r["event"] == "executed")
        .collect();
    assert_eq!(records.len(), 2);
    for r in records {
        assert_eq!(
            r["raw_arguments"], r#"{"account":"acct_1","amount":4.5,"z":1e+30}"#,
            "{r}"
        );
        assert_eq!(
            r["raw_meta"], r#"{"progressToken":"p-1"}"#,
            "reserved _meta keys are stripped: {r}"
        );
    }
}

#[tokio::test]
async fn malformed_arguments_are_refused_before_dispatch() {
    let gw = Gateway::start();
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    let deep = format!("{}1{}", "[".repeat(70), "]".repeat(70));
    let big = format!("\"{}\"", "x".repeat(40_000));
    let cases: Vec<(String, &str)> = vec![
        (
            r#"{"account":"a","amount":1,"amount":1000}"#.into(),
            "duplicate key `amount`",
        ),
        (
            r#"{"account":"a","amount":9007199254740993}"#.into(),
            "cannot be represented exactly",
        ),
        (
            r#"{"account":"\ud800","amount":1}"#.into(),
            "lone surrogate",
        ),
        (
            format!(r#"{{"account":"a","amount":1,"n":{deep}}}"#),
            "deeper than limits.max_depth (64)",
        ),
        (
            format!(r#"{{"account":{big},"amount":1}}"#),
            "more than limits.max_arguments_bytes (32768)",
        ),
        (r#"[1,2]"#.into(), "params.arguments"),
    ];
    for (i, (args, expect)) in cases.iter().enumerate() {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"charge_card","arguments":{args}}}}}"#
        );
        let a = c.post_raw(body).await;
        assert_eq!(a.status, 200, "{expect}: {a:?}");
        assert_eq!(a.last()["id"], i, "{expect}");
        assert_eq!(a.last()["error"]["code"], -32602, "{expect}: {a:?}");
        let message = a.last()["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(expect),
            "expected `{expect}` in `{message}`"
        );
    }
    assert_eq!(
        gw.executions("charge_card"),
        0,
        "nothing malformed may reach the server"
    );
    // The session is still good.
    let ok = c
        .call(99, "charge_card", json!({"account":"a","amount":1}))
        .await;
    assert_eq!(ok.last()["result"]["isError"], false);
}

#[tokio::test]
async fn modern_calls_are_canonicalized_too() {
    let gw = Gateway::start();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"refund","arguments":{"charge":"ch_1","amount":1.0},
        "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
    let body: Value = serde_json::from_str(body).unwrap();
    let resp = modern_post(&gw.url("payments"), &body)
        .send()
        .await
        .unwrap();
    let a = answer(resp).await;
    assert_eq!(a.last()["result"]["isError"], false, "{a:?}");
    let r = gw
        .records()
        .into_iter()
        .find(|r| r["event"] == "executed")
        .unwrap();
    assert_eq!(r["raw_arguments"], r#"{"amount":1,"charge":"ch_1"}"#);
}
