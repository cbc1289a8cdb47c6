//! One regression test per defect found by a chaos run and a bad-input
//! battery, each named after the defect, against the real gateway and the
//! example server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use serde_json::json;

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
    // Counted as malformed: an id of the wrong type is one way to try to
    // slip a call past the pipeline.
    wait_for_audit(&gw, "the refusal", |es| {
        es.iter()
            .any(|e| e["kind"] == "refused" && e["what"] == "malformed")
    })
    .await;
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
    let broken = report_server(&report, "broken");
    assert_eq!(broken["circuit"], "open", "{report}");
}

#[tokio::test]
async fn an_answer_already_given_survives_a_kill_right_after_it() {
    // A write is answered; the gateway is killed with SIGKILL 0 to 100 ms
    // later (the chaos run's window), in 5 ms steps, and restarted. The retry must get the
    // answer the client was already given, never `outcome_unknown`.
    let mut gw = Gateway::start();
    for round in 0..=20u64 {
        let mut c = Client::new(&gw.url("payments"));
        c.initialize().await;
        let key = format!("kill-{round}");
        let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"refund",
            "arguments":{"charge":format!("ch_{round}")},"_meta":{"dev.countersign/idempotency-key":key}}});
        let first = c.post(&call).await;
        assert_eq!(first.last()["result"]["isError"], false, "{first:?}");
        // The kill's moment after the answer is the test's input, not a wait.
        tokio::time::sleep(std::time::Duration::from_millis(round * 5)).await;
        gw.restart();
        let mut c = Client::new(&gw.url("payments"));
        c.initialize().await;
        let retry = c.post(&call).await;
        assert_eq!(
            retry.last()["result"]["_meta"]["dev.countersign/replayed"]["key"],
            key.as_str(),
            "round {round} (killed {} ms after the answer): {retry:?}",
            round * 5
        );
    }
    assert_eq!(gw.executions("refund"), 21);
}

#[tokio::test]
async fn a_client_value_cannot_forge_a_log_line() {
    let gw = Gateway::start();
    let c = listed(&gw, "payments").await;
    // The idempotency key is the client's own text, and the log names it
    // when the outcome is unknown.
    let forged = "2026-01-01T00:00:00Z  WARN countersign::forged: all is well";
    gw.fault("refund", "exit_after_execute", 0);
    let key = format!("k-1\n{forged}\u{1b}[2J");
    let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"refund",
        "arguments":{"charge":"ch_1"},"_meta":{"dev.countersign/idempotency-key":key}}});
    assert_eq!(code(&c.post(&call).await), "outcome_unknown");
    gw.wait_for_log("outcome unknown").await;
    let log = gw.log.lock().unwrap().clone();
    assert!(
        !log.iter().any(|l| l.starts_with(forged)),
        "a forged line: {log:#?}"
    );
    let line = log.iter().find(|l| l.contains("outcome unknown")).unwrap();
    assert!(
        line.contains("\\u{a}2026-01-01T00:00:00Z"),
        "escaped in place: {line}"
    );
    assert!(
        !log.iter().any(|l| l.contains('\u{1b}')),
        "no raw ESC: {log:#?}"
    );
}

#[tokio::test]
async fn a_tool_name_with_control_characters_is_refused_and_runs_nothing() {
    let gw = Gateway::start();
    let c = listed(&gw, "payments").await;
    for name in [
        "refund\u{0}",
        "refund\n2026-01-01T00:00:00Z WARN forged",
        "re\u{1b}fund",
    ] {
        let a = c
            .post(&json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":name,"arguments":{"charge":"ch_1"}}}))
            .await;
        assert_eq!(a.last()["error"]["code"], -32602, "{name:?}: {a:?}");
        let message = a.last()["error"]["message"].as_str().unwrap().to_owned();
        assert!(message.contains("control characters"), "{message}");
    }
    let long = "t".repeat(129);
    let a = c
        .post(&json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":long}}))
        .await;
    assert_eq!(a.last()["error"]["code"], -32602, "{a:?}");
    assert_eq!(gw.executions("refund"), 0);
}

#[tokio::test]
async fn a_body_that_cannot_be_read_is_a_bad_request_not_too_large() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let gw = Gateway::start();
    let addr = gw.base().trim_start_matches("http://").to_owned();
    // Malformed chunked encoding: a chunk size that is not hex.
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let req = format!(
        "POST /mcp/payments HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{{}}\r\n0\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("could not be read"), "{text}");
}

#[tokio::test]
async fn a_header_that_trickles_in_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let gw = Gateway::start_with(Options {
        gateway: "header_read_timeout = \"1s\"\n".into(),
        ..Default::default()
    });
    let addr = gw.base().trim_start_matches("http://").to_owned();
    let s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    // One header byte every 200 ms: the header never completes.
    let trickle = tokio::spawn(async move {
        let header = format!("POST /mcp/payments HTTP/1.1\r\nHost: {addr}\r\nX-Slow: ");
        wr.write_all(header.as_bytes()).await.unwrap();
        loop {
            if wr.write_all(b"a").await.is_err() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    });
    let mut out = Vec::new();
    let closed =
        tokio::time::timeout(std::time::Duration::from_secs(15), rd.read_to_end(&mut out)).await;
    trickle.abort();
    assert!(
        closed.is_ok(),
        "the gateway kept a trickling connection open for 15 s"
    );
}
