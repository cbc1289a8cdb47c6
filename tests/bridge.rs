//! `countersign stdio`: a stdio-only client through the bridge, including a
//! gateway restart under it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::bridge::Bridge;
use common::*;
use serde_json::{json, Value};

#[test]
fn bridge_relays_survives_bad_lines_and_a_gateway_restart() {
    let mut gw = Gateway::start();
    let mut b = Bridge::start(&gw);
    b.send(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"stdio-test","version":"1"}}}"#);
    assert_eq!(
        b.answer(json!(1))["result"]["serverInfo"]["name"],
        "payments-example"
    );
    b.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);

    b.send("{this is not json");
    let err = b.recv();
    assert_eq!(err["error"]["code"], -32700, "{err}");

    b.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#);
    let list = b.answer(json!(2));
    assert!(list["result"]["tools"].as_array().unwrap().len() >= 8);

    b.send(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"charge_card","arguments":{"account":"acct_1","amount":3}}}"#);
    assert_eq!(b.answer(json!(3))["result"]["isError"], false);

    // The gateway dies and comes back on the same address: the bridge
    // re-initializes on its own and the client never notices.
    gw.restart();
    b.send(r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"get_balance","arguments":{"account":"acct_1"}}}"#);
    let after = b.answer(json!(4));
    assert_eq!(
        after["result"]["content"][0]["text"], "balance of acct_1: 1200.00 EUR",
        "{after}"
    );
    assert_eq!(gw.executions("charge_card"), 1);
    assert_eq!(gw.executions("get_balance"), 1);
}

#[test]
fn bridge_without_token_says_what_to_do() {
    let out = Command::new(countersign_bin())
        .args(["stdio", "--server", "payments"])
        .env_remove("COUNTERSIGN_TOKEN")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        out.stdout.is_empty(),
        "stdout is the protocol; errors go to stderr"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("COUNTERSIGN_TOKEN is not set"));
}

#[test]
fn bridge_refuses_an_overlong_line_and_keeps_going() {
    let gw = Gateway::start();
    let mut b = Bridge::start_with(&gw, &["--max-line-bytes", "2048"]);
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"name":"charge_card","arguments":{{"account":"{}","amount":1}}}}}}"#,
        "x".repeat(5000)
    );
    b.send(&huge);
    let err = b.recv();
    assert_eq!(err["error"]["code"], -32600, "{err}");
    assert!(err["error"]["message"]
        .as_str()
        .unwrap()
        .contains("longer than 2048 bytes"));
    b.send(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"stdio-test","version":"1"}}}"#);
    assert_eq!(
        b.answer(json!(1))["result"]["serverInfo"]["name"],
        "payments-example"
    );
    assert_eq!(gw.executions("charge_card"), 0);
}

#[test]
fn a_2026_client_cancelling_through_the_bridge_cancels_upstream() {
    let gw = Gateway::start();
    let mut b = Bridge::start(&gw);
    b.send(
        &json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
            "name":"slow_report","arguments":{"steps":20},
            "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",
                     "io.modelcontextprotocol/clientCapabilities":{},"progressToken":"p-1"}}})
        .to_string(),
    );
    // Progress proves the call is running upstream.
    let first = b.recv();
    assert_eq!(first["method"], "notifications/progress", "{first}");
    // In 2026-07-28 there is no session to send `notifications/cancelled`
    // to: the bridge closes the request's stream, which the gateway turns
    // into a cancellation upstream.
    b.send(
        &json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}})
            .to_string(),
    );
    let mut seen = None;
    for _ in 0..150 {
        if let Some(r) = gw.records().into_iter().find(|r| r["event"] == "cancelled") {
            seen = Some(r);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let seen = seen.expect("the cancellation never reached the upstream");
    assert!(seen["requestId"].is_u64(), "{seen}");
}

#[test]
fn a_token_from_a_command_is_fetched_again_when_the_gateway_refuses_it() {
    let gw = Gateway::start();
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran-once");
    // The first run prints a token the gateway does not know (an expired
    // one, say); every later run prints the right one.
    let cmd = format!(
        "if [ -e '{0}' ]; then echo {TOKEN}; else touch '{0}'; echo expired-token; fi",
        ran.display()
    );
    let mut child = Command::new(countersign_bin())
        .args(["stdio", "--server", "payments", "--gateway", &gw.base()])
        .args(["--token-command", &cmd])
        .env_remove("COUNTERSIGN_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    writeln!(
        stdin,
        "{}",
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
            "protocolVersion":"2025-06-18","capabilities":{},
            "clientInfo":{"name":"t","version":"0"}}})
    )
    .unwrap();
    stdin.flush().unwrap();
    let answer: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert!(answer["result"]["protocolVersion"].is_string(), "{answer}");
    assert!(ran.exists(), "the command ran for the first token");
    let _ = child.kill();
    let _ = child.wait();
}
