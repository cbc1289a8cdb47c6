//! The gateway relays MCP between a real client and the real example
//! server: handshake era over stdio and HTTP upstreams, notifications and
//! server-to-client requests, auth, origin, malformed and oversized input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use common::*;
use serde_json::{json, Value};

/// `tools/list` straight from a stdio example server, without the gateway.
fn direct_stdio_tools_list() -> String {
    let mut child = Command::new(example_server_bin())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    writeln!(stdin, r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-06-18","capabilities":{{}},"clientInfo":{{"name":"direct","version":"1"}}}}}}"#).unwrap();
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#
    )
    .unwrap();
    writeln!(stdin, r#"{{"jsonrpc":"2.0","id":2,"method":"tools/list"}}"#).unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    raw_tools(&line)
}

#[tokio::test]
async fn stdio_upstream_initialize_list_and_call() {
    let gw = Gateway::start();
    let mut c = Client::new(&gw.url("payments"));
    let init = c.initialize().await;
    assert_eq!(
        init.last()["result"]["serverInfo"]["name"],
        "payments-example"
    );
    assert_eq!(init.last()["id"], 0, "the client's own id comes back");

    let list = c
        .post(&json!({"jsonrpc":"2.0","id":"list-1","method":"tools/list"}))
        .await;
    assert_eq!(list.status, 200);
    assert_eq!(
        raw_tools(&list.response_text()),
        direct_stdio_tools_list(),
        "tools array must be byte-for-byte what the server sent"
    );

    let call = c
        .call(7, "charge_card", json!({"account":"acct_42","amount":120}))
        .await;
    let result = &call.last()["result"];
    assert_eq!(call.last()["id"], 7);
    assert_eq!(result["isError"], false, "{call:?}");
    assert!(result["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("charged 120 to acct_42"));
    assert_eq!(gw.executions("charge_card"), 1);
}

#[tokio::test]
async fn http_upstream_initialize_list_and_call() {
    let gw = Gateway::with_http_upstream();
    let mut c = Client::new(&gw.url("phttp"));
    c.initialize().await;
    let list = c
        .post(&json!({"jsonrpc":"2.0","id":2,"method":"tools/list"}))
        .await;

    let mut direct = Client::new(&gw.http_upstream.as_ref().unwrap().url());
    direct.initialize().await;
    let direct_list = direct
        .post(&json!({"jsonrpc":"2.0","id":2,"method":"tools/list"}))
        .await;
    assert_eq!(
        raw_tools(&list.response_text()),
        raw_tools(&direct_list.response_text())
    );

    let call = c.call(3, "refund", json!({"charge":"ch_1"})).await;
    assert_eq!(call.last()["result"]["content"][0]["text"], "refunded ch_1");
    assert_eq!(gw.executions("refund"), 1);
}

#[tokio::test]
async fn progress_notifications_are_relayed_on_the_request_stream() {
    for server in ["payments", "phttp"] {
        let gw = Gateway::with_http_upstream();
        let mut c = Client::new(&gw.url(server));
        c.initialize().await;
        let a = c
            .post(
                &json!({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{
                "name":"slow_report","arguments":{"steps":3},"_meta":{"progressToken":"tok-1"}}}),
            )
            .await;
        assert!(
            a.sse,
            "{server}: related messages need an SSE answer: {a:?}"
        );
        let progress: Vec<&Value> = a
            .messages
            .iter()
            .filter(|m| m["method"] == "notifications/progress")
            .collect();
        assert_eq!(progress.len(), 3, "{server}: {a:?}");
        assert!(progress
            .iter()
            .all(|p| p["params"]["progressToken"] == "tok-1"));
        assert_eq!(a.last()["id"], 5);
        assert_eq!(
            a.last()["result"]["content"][0]["text"],
            "report done in 3 steps"
        );
    }
}

#[tokio::test]
async fn server_to_client_request_round_trip() {
    for server in ["payments", "phttp"] {
        let gw = Gateway::with_http_upstream();
        let mut c = Client::new(&gw.url(server));
        c.initialize().await;
        let resp = c
            .request(reqwest::Method::POST)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(json!({"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"ask_model","arguments":{"question":"2+2?"}}}).to_string())
            .send()
            .await
            .unwrap();
        assert!(resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        // Read the stream until the sampling request arrives, answer it, then
        // read on to the tool's result.
        let mut stream = resp;
        let mut buf = String::new();
        let mut answered = false;
        let result = loop {
            let chunk = stream
                .chunk()
                .await
                .unwrap()
                .expect("stream ended before the result");
            buf.push_str(&String::from_utf8_lossy(&chunk));
            let msgs = parse_messages(&buf, true);
            if !answered {
                if let Some(req) = msgs
                    .iter()
                    .find(|m| m["method"] == "sampling/createMessage")
                {
                    assert_eq!(req["params"]["messages"][0]["content"]["text"], "2+2?");
                    let reply = json!({"jsonrpc":"2.0","id":req["id"],"result":{"role":"assistant","model":"test","content":{"type":"text","text":"four"}}});
                    let r = c.post(&reply).await;
                    assert_eq!(r.status, 202, "{server}: {r:?}");
                    answered = true;
                }
            }
            if let Some(done) = msgs.iter().find(|m| m["id"] == 11) {
                break done.clone();
            }
        };
        assert!(answered, "{server}: no sampling request was relayed");
        assert_eq!(
            result["result"]["content"][0]["text"], "the model said: four",
            "{server}"
        );
    }
}

#[tokio::test]
async fn a_server_is_reached_by_its_plain_name_and_by_its_encoded_name_alike() {
    // `POST /mcp/payments` goes from the connection straight to the
    // handler; the same name percent-encoded goes through the router,
    // whose path extractor decodes it. Both are the same server.
    let gw = Gateway::start();
    for server in ["payments", "p%61yments"] {
        let mut c = Client::new(&gw.url(server));
        c.initialize().await;
        let ok = c.call(1, "get_balance", json!({"account":"a"})).await;
        assert_eq!(ok.status, 200, "{server}: {ok:?}");
        assert_eq!(ok.last()["result"]["isError"], false, "{server}: {ok:?}");
    }
    // A path no route has is the router's 404 (nothing parsed, nothing run).
    for path in ["payments/extra", ""] {
        let c = Client::new(&gw.url(path));
        let a = c
            .post(&json!({"jsonrpc":"2.0","id":1,"method":"ping"}))
            .await;
        assert_eq!(a.status, 404, "/mcp/{path}: {a:?}");
    }
}

#[tokio::test]
async fn bad_token_unknown_server_and_foreign_origin_are_refused() {
    let gw = Gateway::start();
    let mut c = Client::new(&gw.url("payments"));
    c.token = "not-a-token".into();
    let a = c
        .post(&json!({"jsonrpc":"2.0","id":1,"method":"ping"}))
        .await;
    assert_eq!(a.status, 401);
    assert!(a.headers.contains_key("www-authenticate"));
    assert!(a.last()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("bearer token"));

    let c = Client::new(&gw.url("nope"));
    let a = c
        .post(&json!({"jsonrpc":"2.0","id":1,"method":"ping"}))
        .await;
    assert_eq!(a.status, 404);
    assert!(a.last()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("unknown server `nope`"));

    let c = Client::new(&gw.url("payments"));
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}});
    let evil = c
        .request(reqwest::Method::POST)
        .header("origin", "http://evil.example")
        .header("content-type", "application/json")
        .body(init.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(evil.status(), 403);
    let local = c
        .request(reqwest::Method::POST)
        .header("origin", "http://localhost:3000")
        .header("content-type", "application/json")
        .body(init.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(local.status(), 200);
}

#[tokio::test]
async fn malformed_json_gets_parse_error_and_connection_is_kept() {
    let gw = Gateway::start();
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    let bad = c.post_raw("{\"jsonrpc\":\"2.0\",\"id\":1,").await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.last()["error"]["code"], -32700);
    assert_eq!(bad.last()["id"], Value::Null);
    let not_rpc = c
        .post_raw("{\"jsonrpc\":\"1.0\",\"id\":1,\"method\":\"ping\"}")
        .await;
    assert_eq!(not_rpc.last()["error"]["code"], -32600);
    // Same client, same pooled connection: still served.
    let ok = c
        .post(&json!({"jsonrpc":"2.0","id":2,"method":"ping"}))
        .await;
    assert_eq!(ok.status, 200);
    assert_eq!(ok.last()["id"], 2);
}

#[tokio::test]
async fn oversized_body_is_refused_with_the_limit() {
    let gw = Gateway::start();
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    let big = "x".repeat(70_000);
    let a = c
        .call(3, "charge_card", json!({"account": big, "amount": 1}))
        .await;
    assert_eq!(a.status, 413);
    assert!(a.last()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("limits.max_body_bytes (65536 bytes)"));
    assert_eq!(gw.executions("charge_card"), 0);
}

#[tokio::test]
async fn sessions_are_bound_to_their_identity_and_deletable() {
    let gw = Gateway::start();
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    let mut thief = Client::new(&gw.url("payments"));
    thief.token = OTHER_TOKEN.into();
    thief.session = c.session.clone();
    let a = thief
        .post(&json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}))
        .await;
    assert_eq!(a.status, 404, "another principal must not use this session");

    let del = c.request(reqwest::Method::DELETE).send().await.unwrap();
    assert_eq!(del.status(), 200);
    let after = c
        .post(&json!({"jsonrpc":"2.0","id":2,"method":"ping"}))
        .await;
    assert_eq!(after.status, 404);

    let no_session = Client::new(&gw.url("payments"));
    let a = no_session
        .post(&json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}))
        .await;
    assert_eq!(a.status, 400);
    assert!(a.last()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("initialize"));
}

#[tokio::test]
async fn batch_members_are_answered_each() {
    let gw = Gateway::start();
    let mut c = Client::new(&gw.url("payments"));
    c.protocol = "2025-03-26".into();
    c.initialize().await;
    let a = c
        .post_raw(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"get_balance","arguments":{"account":"a"}}},{"bad":1}]"#)
        .await;
    assert_eq!(a.status, 200);
    let arr: Vec<Value> = serde_json::from_str(&a.text).unwrap();
    assert_eq!(arr.len(), 3, "{}", a.text);
    assert!(arr.iter().any(|m| m["id"] == 1 && m["result"].is_object()));
    assert!(arr
        .iter()
        .any(|m| m["id"] == 2 && m["result"]["content"][0]["text"] == "balance of a: 1200.00 EUR"));
    assert!(arr.iter().any(|m| m["error"]["code"] == -32600));
}

#[tokio::test]
async fn unreachable_and_crashing_upstreams_answer_clearly() {
    let gw = Gateway::start_with(Options {
        extra: "\n[servers.broken]\ncommand = \"/nonexistent/mcp-server\"\n".into(),
        ..Default::default()
    });
    let mut broken = Client::new(&gw.url("broken"));
    let a = broken
        .post(&json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}))
        .await;
    assert_eq!(
        a.last()["error"]["data"]["countersign"]["code"],
        "upstream_unavailable",
        "{a:?}"
    );
    assert!(a.last()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("/nonexistent/mcp-server"));
    broken.session = None;

    // The child executes the write and dies before answering.
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    gw.fault("charge_card", "exit_after_execute", 0);
    let a = c
        .call(3, "charge_card", json!({"account":"acct_1","amount":5}))
        .await;
    let result = &a.last()["result"];
    assert_eq!(result["isError"], true);
    assert_eq!(
        result["structuredContent"]["countersign"]["code"],
        "outcome_unknown"
    );
    assert!(result["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("Verify with a read"));
    assert_eq!(gw.executions("charge_card"), 1);

    // The gateway is still up and answers other sessions.
    let mut d = Client::new(&gw.url("payments"));
    d.initialize().await;
    let ok = d.call(4, "get_balance", json!({"account":"a"})).await;
    assert_eq!(ok.last()["result"]["isError"], false);
}

/// Read an SSE response until a message matches, or panic after `secs`.
async fn read_until(
    resp: &mut reqwest::Response,
    secs: u64,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let mut buf = String::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let chunk = tokio::time::timeout_at(deadline, resp.chunk())
            .await
            .expect("timed out waiting on the stream")
            .unwrap()
            .expect("stream ended");
        buf.push_str(&String::from_utf8_lossy(&chunk));
        if let Some(m) = parse_messages(&buf, true).into_iter().find(|m| pred(m)) {
            return m;
        }
    }
}

#[tokio::test]
async fn standalone_stream_carries_messages_of_no_request() {
    for server in ["payments", "phttp"] {
        let gw = Gateway::with_http_upstream();
        let mut c = Client::new(&gw.url(server));
        c.initialize().await;
        let mut stream = c
            .request(reqwest::Method::GET)
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        assert_eq!(stream.status(), 200, "{server}");
        let second = c
            .request(reqwest::Method::GET)
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        assert_eq!(
            second.status(),
            409,
            "{server}: one standalone stream per session"
        );
        let a = c
            .call(
                1,
                "notify_later",
                json!({"text": format!("hello from {server}")}),
            )
            .await;
        assert_eq!(a.last()["result"]["content"][0]["text"], "will notify");
        let note = read_until(&mut stream, 10, |m| m["method"] == "notifications/message").await;
        assert_eq!(note["params"]["data"], format!("hello from {server}"));
    }
}

#[tokio::test]
async fn client_cancellation_reaches_the_server_under_the_upstream_id() {
    let gw = Gateway::start();
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    gw.fault("get_balance", "delay", 3000);
    let url = c.url.clone();
    let session = c.session.clone().unwrap();
    let slow = tokio::spawn(async move {
        let mut c2 = Client::new(&url);
        c2.session = Some(session);
        c2.post(&json!({"jsonrpc":"2.0","id":"call-A","method":"tools/call","params":{"name":"get_balance","arguments":{"account":"a"}}}))
            .await
    });
    // Wait until the server has started executing it.
    for _ in 0..100 {
        if gw.executions("get_balance") == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let cancel = c
        .post(&json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"call-A","reason":"user"}}))
        .await;
    assert_eq!(cancel.status, 202);
    let mut seen = None;
    for _ in 0..100 {
        if let Some(r) = gw.records().into_iter().find(|r| r["event"] == "cancelled") {
            seen = Some(r);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let seen = seen.expect("the cancellation never reached the server");
    assert!(
        seen["requestId"].is_u64(),
        "the server must see its own (gateway-assigned) id: {seen}"
    );
    assert_eq!(seen["reason"], "user");
    slow.abort();
}

#[tokio::test]
async fn the_clients_token_never_reaches_an_http_upstream() {
    let gw = Gateway::start_with(Options {
        http_upstream: true,
        // Appended to [servers.phttp]: the gateway's own credential upstream.
        extra: "headers = { Authorization = \"Bearer upstream-credential\" }\n".into(),
        ..Default::default()
    });
    let mut c = Client::new(&gw.url("phttp"));
    c.initialize().await;
    c.call(1, "get_balance", json!({"account":"a"})).await;
    let rec = gw
        .records()
        .into_iter()
        .find(|r| r["event"] == "executed")
        .unwrap();
    assert_eq!(rec["authorization"], "Bearer upstream-credential");
    assert!(!rec.to_string().contains(TOKEN));
}

#[tokio::test]
async fn http_session_dropped_mid_call_is_outcome_unknown() {
    let gw = Gateway::with_http_upstream();
    let mut c = Client::new(&gw.url("phttp"));
    c.initialize().await;
    gw.fault("charge_card", "drop_session", 0);
    let a = c
        .call(1, "charge_card", json!({"account":"a","amount":2}))
        .await;
    assert_eq!(
        a.last()["result"]["structuredContent"]["countersign"]["code"],
        "outcome_unknown",
        "{a:?}"
    );
    assert_eq!(gw.executions("charge_card"), 1);
    // The same call again is a retry of a call whose outcome is unknown:
    // the ledger answers without sending it.
    let again = c
        .call(2, "charge_card", json!({"account":"a","amount":2}))
        .await;
    assert_eq!(
        again.last()["result"]["structuredContent"]["countersign"]["code"],
        "outcome_unknown"
    );
    // The upstream forgot the session; the gateway re-establishes it with the
    // client's initialize params and the next call runs there.
    let b = c
        .call(3, "charge_card", json!({"account":"a","amount":3}))
        .await;
    assert_eq!(b.last()["result"]["isError"], false, "{b:?}");
    assert_eq!(gw.executions("charge_card"), 2);
}

#[tokio::test]
async fn server_error_before_execution_passes_through() {
    let gw = Gateway::start();
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    gw.fault("refund", "error_before_execute", 0);
    let a = c.call(1, "refund", json!({"charge":"ch_1"})).await;
    assert_eq!(a.last()["error"]["code"], -32603);
    assert_eq!(
        a.last()["error"]["message"],
        "injected failure before execution"
    );
    assert_eq!(gw.executions("refund"), 0);
}

#[tokio::test]
async fn a_child_that_ignores_eof_and_sigterm_is_killed() {
    let gw = Gateway::start_with(Options {
        extra: format!(
            "\n[servers.stubborn]\ncommand = \"{}\"\nargs = [\"--stubborn\", \"--record\", \"{}\"]\n",
            example_server_bin().display(),
            Gateway::record_path_for_extra()
        ),
        ..Default::default()
    });
    let mut c = Client::new(&gw.url("stubborn"));
    c.initialize().await;
    c.call(1, "get_balance", json!({"account":"a"})).await;
    let text = std::fs::read_to_string(Gateway::record_path_for_extra()).unwrap();
    let pid = text
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok()?["pid"].as_u64())
        .unwrap();
    let _ = std::fs::remove_file(Gateway::record_path_for_extra());
    let del = c.request(reqwest::Method::DELETE).send().await.unwrap();
    assert_eq!(del.status(), 200);
    // grace is 500ms: EOF, then SIGTERM, then SIGKILL.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.split_whitespace().nth(2).unwrap_or("gone").to_owned();
    assert!(
        state == "gone" || state == "Z",
        "child {pid} still running after DELETE returned: {state}"
    );
}

#[tokio::test]
async fn session_requests_with_an_unknown_protocol_version_are_refused() {
    let gw = Gateway::start();
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    c.protocol = "1999-01-01".into();
    let a = c
        .post(&json!({"jsonrpc":"2.0","id":1,"method":"ping"}))
        .await;
    assert_eq!(a.status, 400);
    assert!(a.last()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("unsupported MCP-Protocol-Version `1999-01-01`"));
    let health = reqwest::get(format!("{}/healthz", gw.base()))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let body: Value = serde_json::from_str(&health.text().await.unwrap()).unwrap();
    assert_eq!(body["status"], "ok");
    assert_eq!(body["sessions"], 1);
}

#[tokio::test]
async fn a_parse_error_keeps_the_tcp_connection_open() {
    use std::io::{Read, Write};
    let gw = Gateway::start();
    let mut s = std::net::TcpStream::connect(&gw.addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut exchange = |body: &str| -> String {
        let req = format!(
            "POST /mcp/payments HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            gw.addr,
            body.len()
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        // Read the head, then exactly Content-Length bytes of body.
        while !buf.ends_with(b"\r\n\r\n") {
            s.read_exact(&mut byte)
                .expect("the gateway closed the connection");
            buf.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map(|v| v.trim().parse().unwrap())
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).unwrap();
        format!("{head}{}", String::from_utf8_lossy(&body))
    };
    let bad = exchange("{\"jsonrpc\":");
    assert!(bad.starts_with("http/1.1 400"), "{bad}");
    assert!(bad.contains("-32700"), "{bad}");
    assert!(!bad.contains("connection: close"), "{bad}");
    let good = exchange(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#,
    );
    assert!(
        good.starts_with("http/1.1 200"),
        "same socket, next request served: {good}"
    );
}

#[tokio::test]
async fn a_child_dying_after_receiving_a_write_is_reported_as_unknown_not_retried() {
    // The request was written to the child: the gateway cannot know whether
    // it ran, so it says so (even though this child died before executing).
    let gw = Gateway::start();
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    gw.fault("close_account", "exit_before_execute", 0);
    let a = c
        .call(1, "close_account", json!({"account":"acct_9"}))
        .await;
    assert_eq!(
        a.last()["result"]["structuredContent"]["countersign"]["code"],
        "outcome_unknown",
        "{a:?}"
    );
    assert_eq!(gw.executions("close_account"), 0);
    // The session's child is gone; the next call runs on a respawned one.
    let b = c.call(2, "get_balance", json!({"account":"a"})).await;
    assert_eq!(b.last()["result"]["isError"], false, "{b:?}");
}

#[tokio::test]
async fn batches_are_refused_after_2025_03_26() {
    let gw = Gateway::start();
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await; // negotiates 2025-06-18
    let a = c
        .post_raw(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"charge_card","arguments":{"account":"a","amount":1}}}]"#)
        .await;
    assert_eq!(a.status, 400);
    assert!(a.last()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("only part of protocol version 2025-03-26"));
    assert_eq!(gw.executions("charge_card"), 0);
}

#[tokio::test]
async fn an_idle_session_is_closed_and_its_upstream_child_stopped() {
    let record = Gateway::record_path_for_extra();
    let gw = Gateway::start_with(Options {
        gateway: "session_idle_timeout = \"1s\"".into(),
        extra: format!(
            "\n[servers.idle]\ncommand = \"{}\"\nargs = [\"--record\", \"{record}\"]\n",
            example_server_bin().display(),
        ),
        ..Default::default()
    });
    let mut c = Client::new(&gw.url("idle"));
    c.initialize().await;
    c.call(1, "get_balance", json!({"account":"a"})).await;
    let pid = std::fs::read_to_string(&record)
        .unwrap()
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok()?["pid"].as_u64())
        .unwrap();
    let _ = std::fs::remove_file(&record);
    // Idle for longer than the timeout (the sweep runs every half of it).
    gw.wait_for_log("closing idle session").await;
    let after = c
        .post(&json!({"jsonrpc":"2.0","id":2,"method":"ping"}))
        .await;
    assert_eq!(after.status, 404, "the idle session is gone: {after:?}");
    eventually(&format!("child {pid} stops"), || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        matches!(stat.split_whitespace().nth(2), None | Some("Z"))
    })
    .await;
}

/// Upstream credentials read from the gateway's environment and from a file:
/// the upstream gets them, the client's token never; no log line (at debug),
/// no `check --json` and no audit entry holds them.
#[tokio::test]
async fn upstream_credentials_from_env_and_file_reach_the_upstream_and_nothing_else() {
    const FROM_ENV: &str = "env-s3cret-7f3a9c";
    const FROM_FILE: &str = "file-s3cret-91be02";
    let secrets = tempfile::tempdir().unwrap();
    let key_file = secrets.path().join("api-key");
    std::fs::write(&key_file, format!("{FROM_FILE}\n")).unwrap();
    let gw = Gateway::start_with(Options {
        http_upstream: true,
        extra: format!(
            "headers = {{ Authorization = {{ env = \"PHTTP_TOKEN\", prefix = \"Bearer \" }}, \"X-Api-Key\" = {{ file = \"{}\" }} }}\n",
            key_file.display()
        ),
        gateway_env: vec![
            ("PHTTP_TOKEN".into(), FROM_ENV.into()),
            ("COUNTERSIGN_LOG".into(), "debug".into()),
        ],
        ..Default::default()
    });
    let mut c = Client::new(&gw.url("phttp"));
    c.initialize().await;
    let a = c.call(1, "get_balance", json!({"account":"a"})).await;
    assert_eq!(a.last()["result"]["isError"], false, "{a:?}");
    let rec = gw
        .records()
        .into_iter()
        .find(|r| r["event"] == "executed")
        .unwrap();
    assert_eq!(rec["authorization"], format!("Bearer {FROM_ENV}"));
    assert_eq!(rec["x_api_key"], FROM_FILE, "trailing newline removed");
    assert!(!rec.to_string().contains(TOKEN));
    // check --json, with the same environment as the gateway.
    let out = std::process::Command::new(countersign_bin())
        .args(["check", "--json", "--config"])
        .arg(gw.config_path())
        .env("PHTTP_TOKEN", FROM_ENV)
        .output()
        .unwrap();
    let report =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(report.contains("\"phttp\""), "{report}");
    wait_for_audit(&gw, "the call's entries", |e| {
        e.iter()
            .any(|x| x["kind"] == "completed" && x["tool"] == "get_balance")
    })
    .await;
    let audit: String = audit_segments(&gw.audit_dir())
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    assert!(audit.contains("get_balance"), "the audit log has the call");
    let logs = gw.log.lock().unwrap().join("\n");
    assert!(logs.contains("DEBUG"), "debug logging was on");
    for (what, text) in [
        ("check --json", &report),
        ("audit log", &audit),
        ("gateway log", &logs),
    ] {
        for secret in [FROM_ENV, FROM_FILE] {
            assert!(!text.contains(secret), "{what} holds a credential");
        }
    }
}

#[test]
fn serve_refuses_to_start_when_an_upstream_credential_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\npolicies = \"{}\"\n\n[servers.gh]\nurl = \"http://127.0.0.1:9/mcp\"\nheaders = {{ Authorization = {{ env = \"COUNTERSIGN_TEST_NO_SUCH_VAR\", prefix = \"Bearer \" }} }}\n",
            dir.path().join("data").display(),
            dir.path().display()
        ),
    )
    .unwrap();
    let (ok, out, err) = run_cli(&["serve", "--config", config.to_str().unwrap()]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("header `Authorization` of server `gh`: environment variable `COUNTERSIGN_TEST_NO_SUCH_VAR` is not set"),
        "{err}"
    );
    // A key the syntax does not know is named, with its line.
    std::fs::write(
        &config,
        "[servers.gh]\nurl = \"http://127.0.0.1:9/mcp\"\nheaders = { Authorization = { evn = \"X\" } }\n",
    )
    .unwrap();
    let (ok, _, err) = run_cli(&["serve", "--config", config.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("unknown key `evn`") && err.contains("line 3"),
        "{err}"
    );
}

/// Reads SSE frames from `resp` until `enough` says stop; returns the
/// (id, data) of every event, priming events included.
async fn sse_events(
    resp: reqwest::Response,
    enough: impl Fn(&[(Option<String>, String)]) -> bool,
) -> Vec<(Option<String>, String)> {
    let mut out = Vec::new();
    let mut buf = String::new();
    let mut resp = resp;
    while let Some(chunk) = resp.chunk().await.unwrap() {
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let frame: String = buf.drain(..end + 2).collect();
            let mut id = None;
            let mut data = String::new();
            for line in frame.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = Some(v.to_owned());
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                } else if line == "data:" {
                    // empty data
                }
            }
            out.push((id, data));
            if enough(&out) {
                return out;
            }
        }
    }
    out
}

/// A client whose SSE connection breaks mid-call resumes it with a GET and
/// `Last-Event-ID`: it gets the events after its last one and the answer,
/// and the call ran once.
#[tokio::test]
async fn a_broken_sse_stream_is_resumed_with_last_event_id() {
    let gw = Gateway::start();
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    let body = json!({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{
        "name":"slow_report","arguments":{"steps":20},"_meta":{"progressToken":"p"}}});
    let resp = c
        .request(reqwest::Method::POST)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    // The priming event (an id, empty data, retry), then two progress events;
    // then the connection breaks.
    let first = sse_events(resp, |e| e.len() >= 3).await;
    assert_eq!(first[0].1, "", "priming event: {first:?}");
    assert!(first[0].0.is_some(), "{first:?}");
    let last_id = first[2].0.clone().expect("events carry ids");
    let seen_progress: Vec<u64> = first[1..]
        .iter()
        .map(|(_, d)| {
            serde_json::from_str::<Value>(d).unwrap()["params"]["progress"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(seen_progress, [1, 2]);
    let resumed = c
        .request(reqwest::Method::GET)
        .header("accept", "text/event-stream")
        .header("last-event-id", &last_id)
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status(), 200);
    let rest = sse_events(resumed, |_| false).await;
    let messages: Vec<Value> = rest
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    let progress: Vec<u64> = messages
        .iter()
        .filter_map(|m| m["params"]["progress"].as_u64())
        .collect();
    assert_eq!(
        progress,
        (3..=20).collect::<Vec<u64>>(),
        "the rest, once each"
    );
    let answer = messages.last().unwrap();
    assert_eq!(answer["id"], 7, "{answer}");
    assert_eq!(
        answer["result"]["content"][0]["text"],
        "report done in 20 steps"
    );
    assert_eq!(gw.executions("slow_report"), 1);
    // An id the session never sent is refused, precisely.
    let bad = c
        .request(reqwest::Method::GET)
        .header("accept", "text/event-stream")
        .header("last-event-id", "999-1")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await.unwrap().contains("Last-Event-ID `999-1`"));
}
