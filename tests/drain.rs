//! Stopping the gateway answers every call it holds: a write held for an
//! approval and a duplicate waiting with it each get `approval_pending`
//! with the proposal, and nothing runs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

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

/// The gateway run in this process through the same type `serve` runs it
/// with: started, one write through it, then stopped. Every background
/// task ends and is waited for, none panicked, the listener is closed, the
/// audit log ends with the shutdown checkpoint after the call's entries,
/// and the store is let go of last: reopened, it holds the call as
/// complete with its journal folded into the database.
#[tokio::test]
async fn a_running_gateway_stops_in_order() {
    stops_in_order(2, false).await;
}

/// [`a_running_gateway_stops_in_order`] with one CPU's worth of serving:
/// the connections on the main runtime, one of them still open (a request
/// whose body never comes) through the stop: the grace runs out, and the
/// connection is dropped at the stop, as a serving thread's runtime drops
/// its own, so the store is still let go of last.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_gateway_serving_on_its_main_runtime_stops_in_order() {
    stops_in_order(1, true).await;
}

/// Start with `serving` threads, run one write, (`hold_open`) have a
/// request read by the gateway whose body never comes, stop, and check the
/// order.
async fn stops_in_order(serving: usize, hold_open: bool) {
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(policies.join("allow-all.cedar"), ALLOW_ALL).unwrap();
    let data = dir.path().join("data");
    let config_path = dir.path().join("countersign.toml");
    let text = format!(
        r#"
[gateway]
listen = "127.0.0.1:0"
data_dir = "{data}"
policies = "{policies}"
shutdown_grace = "2s"

[[identities]]
token_sha256 = "{token}"
principal = "agent-7"
tenant = "acme"

[servers.payments]
command = "{bin}"
args = ["--record", "{record}"]
"#,
        data = data.display(),
        policies = policies.display(),
        token = sha(TOKEN),
        bin = example_server_bin().display(),
        record = dir.path().join("executions.jsonl").display(),
    );
    std::fs::write(&config_path, &text).unwrap();
    let config = countersign::core::config::Config::parse(&text, &config_path).unwrap();
    let running = countersign::cli::running::start_serving(config, serving)
        .await
        .unwrap();
    let addr = running.local_addr();
    let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
        "name":"charge_card",
        "arguments":{"account":"acct_42","amount":5},
        "_meta":{
            "io.modelcontextprotocol/protocolVersion":"2026-07-28",
            "io.modelcontextprotocol/clientCapabilities":{},
            "dev.countersign/idempotency-key":"stop-1"}}});
    let text = modern_post(&format!("http://{addr}/mcp/payments"), &body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert!(answer.get("result").is_some(), "{answer}");
    let mut open = None;
    if hold_open {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /mcp/payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
             Content-Type: application/json\r\nContent-Length: 50\r\nExpect: 100-continue\r\n\r\n"
        );
        tcp.write_all(head.as_bytes()).await.unwrap();
        // `100 Continue` comes when the gateway starts reading the body:
        // the request is in flight.
        let mut got = Vec::new();
        while !String::from_utf8_lossy(&got).contains("100 Continue") {
            let mut buf = [0u8; 256];
            let n = tcp.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
        open = Some(tcp);
    }

    let stopped = running.shutdown().await;
    for task in ["sweep", "tasks", "policy reload"] {
        assert!(stopped.background.contains(&task), "{stopped:?}");
    }
    assert_eq!(stopped.ended, stopped.background.len(), "{stopped:?}");
    assert!(stopped.panicked.is_empty(), "{stopped:?}");
    // Cut short exactly when a request was left open.
    assert_eq!(stopped.cut_short, hold_open, "{stopped:?}");
    assert!(stopped.store_closed, "{stopped:?}");
    drop(open);
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the listener is closed"
    );

    // The shutdown checkpoint comes after the call's entries.
    let entries = audit_entries(&data.join("audit"));
    let kinds: Vec<&str> = entries
        .iter()
        .filter_map(|e| e.get("kind").and_then(Value::as_str))
        .collect();
    let completed = kinds.iter().rposition(|k| *k == "completed");
    let checkpoint = kinds.iter().rposition(|k| k.contains("checkpoint"));
    assert!(
        completed.is_some() && checkpoint > completed,
        "the last checkpoint follows the call: {kinds:?}"
    );

    // Reopened, the store has the call complete, and its journal is
    // folded into the database (nothing left to replay).
    let journal = data.join("ledger.journal");
    let left = std::fs::metadata(&journal).map_or(0, |m| m.len());
    let store = countersign::store::RedbStore::open(&data.join("ledger.redb")).unwrap();
    use countersign::store::Ledger;
    let records = store.list(None).await.unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(
        records[0].1.state,
        countersign::core::ledger::State::Complete
    );
    // A journal's header is 16 bytes; a frame is more.
    assert!(
        left <= 16,
        "the journal still holds {left} bytes after a clean stop"
    );
}
