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

#[tokio::test]
async fn every_breaker_change_is_logged_and_shown_by_healthz_and_check() {
    let gw = Gateway::start_with(Options {
        extra: "\n[retry]\nmax_attempts = 1\n\n[circuit]\nfailure_threshold = 1\ncooldown = \"1h\"\n\n[servers.broken]\ncommand = \"/nonexistent/server\"\n".into(),
        ..Default::default()
    });
    // 2026-07-28: no handshake, so the call itself meets the dead upstream.
    let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"anything",
        "arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}});
    let a = answer(modern_post(&gw.url("broken"), &call).send().await.unwrap()).await;
    assert_eq!(code(&a), "upstream_unavailable", "{a:?}");
    gw.wait_for_log("circuit breaker").await;
    let line = gw
        .log
        .lock()
        .unwrap()
        .iter()
        .find(|l| l.contains("circuit breaker"))
        .cloned()
        .unwrap();
    assert!(
        line.contains("broken") && line.contains("closed") && line.contains("open"),
        "{line}"
    );
    let body = reqwest::get(format!("{}/healthz", gw.base()))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let health: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(health["circuits"]["broken"], "open", "{health}");
    assert_eq!(health["circuits"]["payments"], "closed", "{health}");
    // `check` asks the gateway at `gateway.listen`: name the port it got.
    let config = std::fs::read_to_string(gw.config_path()).unwrap();
    let addr = gw.base().trim_start_matches("http://").to_owned();
    let config = config.replacen("\"127.0.0.1:0\"", &format!("\"{addr}\""), 1);
    std::fs::write(gw.config_path(), config).unwrap();
    let out = gw.cli(&["check", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let broken = report
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["server"] == "broken")
        .unwrap();
    assert_eq!(broken["circuit"], "open", "{report}");
}
