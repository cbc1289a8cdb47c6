//! The bad-input catalogue: each class of bad input against the running
//! gateway (the example server behind it) gets a precise error, dispatches
//! nothing (the server's execution record stays empty), and leaves the
//! gateway alive (`/healthz` answers and a good call still runs).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What came back for one bad input.
struct Got {
    status: u16,
    text: String,
}

/// One request as raw bytes on a fresh connection; the whole answer.
async fn raw(gw: &Gateway, bytes: &[u8]) -> Got {
    let addr = gw.base().trim_start_matches("http://").to_owned();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Got { status, text }
}

/// A POST to `path` with `headers` and `body` (`Connection: close`).
async fn post(gw: &Gateway, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Got {
    let addr = gw.base().trim_start_matches("http://").to_owned();
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    )
    .into_bytes();
    for (k, v) in headers {
        req.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
    }
    req.extend_from_slice(b"\r\n");
    req.extend_from_slice(body);
    raw(gw, &req).await
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

fn call_body(args: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"charge_card","arguments":{args}}}}}"#
    )
}

/// The gateway is alive: `/healthz` answers, and a read still runs.
async fn alive(gw: &Gateway, c: &Client, what: &str) {
    let h = reqwest::get(format!("{}/healthz", gw.base())).await;
    assert!(
        h.is_ok_and(|r| r.status().is_success()),
        "{what}: /healthz does not answer"
    );
    let r = c
        .call(99, "get_balance", json!({"account": "acct-1"}))
        .await;
    assert!(
        r.response_text().contains("balance"),
        "{what}: a good call no longer runs: {r:?}"
    );
}

struct Case {
    name: &'static str,
    status: u16,
    says: &'static str,
    got: Got,
}

#[tokio::test]
async fn every_class_of_bad_input_gets_a_precise_error_and_runs_nothing() {
    let gw = Gateway::start_with(Options {
        extra: "\n[[identities]]\ntoken_sha256 = \"".to_owned()
            + &sha("other-tenant-token")
            + "\"\nprincipal = \"mallory\"\ntenant = \"evil\"\n",
        ..Default::default()
    });
    let mut c = listed(&gw, "payments").await;
    let sid = c.session.clone().unwrap();
    // A session of another identity.
    let mut other = Client::new(&gw.url("payments"));
    other.token = "other-tenant-token".into();
    other.initialize().await;
    let other_sid = other.session.clone().unwrap();
    let auth = bearer();
    let h = |extra: &[(&'static str, String)]| -> Vec<(String, String)> {
        let mut v = vec![
            ("Authorization".to_owned(), auth.clone()),
            ("Mcp-Session-Id".to_owned(), sid.clone()),
            ("Mcp-Protocol-Version".to_owned(), "2025-06-18".to_owned()),
        ];
        for (k, val) in extra {
            v.retain(|(n, _)| !n.eq_ignore_ascii_case(k));
            v.push(((*k).to_owned(), val.clone()));
        }
        v
    };
    let send = |headers: Vec<(String, String)>, path: &'static str, body: Vec<u8>| {
        let gw = &gw;
        async move {
            let hs: Vec<(&str, &str)> = headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            post(gw, path, &hs, &body).await
        }
    };
    let p = "/mcp/payments";
    let deep = format!("{}1{}", "[".repeat(10_000), "]".repeat(10_000));
    let long_name = "a".repeat(10_000);
    let mut cases = Vec::new();
    macro_rules! case {
        ($name:expr, $status:expr, $says:expr, $got:expr) => {
            cases.push(Case {
                name: $name,
                status: $status,
                says: $says,
                got: $got,
            });
        };
    }

    // Bodies and framing.
    case!(
        "not JSON",
        400,
        "-32700",
        send(h(&[]), p, b"hello".to_vec()).await
    );
    case!(
        "truncated JSON",
        400,
        "-32700",
        send(
            h(&[]),
            p,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge_card""#
                .to_vec()
        )
        .await
    );
    case!(
        "empty body",
        400,
        "-32700",
        send(h(&[]), p, Vec::new()).await
    );
    case!(
        "a batch where the session forbids batches",
        400,
        "batch",
        send(
            h(&[]),
            p,
            format!("[{}]", call_body(r#"{"account":"a","amount":1}"#)).into_bytes()
        )
        .await
    );
    case!(
        "an empty batch",
        400,
        "-32600",
        send(h(&[]), p, b"[]".to_vec()).await
    );
    case!(
        "an object as request id",
        400,
        "-32600",
        send(h(&[]), p, br#"{"jsonrpc":"2.0","id":{"a":1},"method":"tools/call","params":{"name":"charge_card","arguments":{}}}"#.to_vec()).await
    );
    case!(
        "a boolean as request id",
        400,
        "-32600",
        send(h(&[]), p, br#"{"jsonrpc":"2.0","id":true,"method":"tools/call","params":{"name":"charge_card","arguments":{}}}"#.to_vec()).await
    );
    case!(
        "a fractional request id",
        400,
        "-32600",
        send(h(&[]), p, br#"{"jsonrpc":"2.0","id":1.5,"method":"tools/call","params":{"name":"charge_card","arguments":{}}}"#.to_vec()).await
    );
    case!(
        "jsonrpc is not 2.0",
        400,
        "-32600",
        send(h(&[]), p, br#"{"jsonrpc":"1.0","id":1,"method":"tools/call","params":{"name":"charge_card","arguments":{}}}"#.to_vec()).await
    );
    case!(
        "method is not a string",
        400,
        "-32600",
        send(
            h(&[]),
            p,
            br#"{"jsonrpc":"2.0","id":1,"method":5,"params":{}}"#.to_vec()
        )
        .await
    );
    case!(
        "a body over limits.max_body_bytes",
        413,
        "65536",
        send(
            h(&[]),
            p,
            call_body(&format!(
                r#"{{"account":"{}","amount":1}}"#,
                "x".repeat(70_000)
            ))
            .into_bytes()
        )
        .await
    );
    case!(
        "10,000-deep nesting",
        200,
        "-3260",
        send(
            h(&[]),
            p,
            call_body(&format!(r#"{{"account":"a","amount":1,"deep":{deep}}}"#)).into_bytes()
        )
        .await
    );
    case!(
        "params are an array",
        200,
        "-32602",
        send(
            h(&[]),
            p,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":["charge_card"]}"#.to_vec()
        )
        .await
    );
    case!(
        "no tool name",
        200,
        "-32602",
        send(
            h(&[]),
            p,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{}}}"#.to_vec()
        )
        .await
    );
    case!(
        "arguments are a string",
        200,
        "-32602",
        send(h(&[]), p, br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge_card","arguments":"x"}}"#.to_vec()).await
    );

    // Answers to the gateway's own question (approval in the client).
    case!(
        "a requestState that is not a string",
        200,
        "params.requestState` must be a string",
        send(h(&[]), p, br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge_card","arguments":{},"requestState":7}}"#.to_vec()).await
    );
    case!(
        "inputResponses that are not an object",
        200,
        "params.inputResponses` must be an object",
        send(h(&[]), p, br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge_card","arguments":{},"inputResponses":[1]}}"#.to_vec()).await
    );
    case!(
        "countersign's answer mixed with answers to the upstream's questions",
        200,
        "send only the answer countersign asked for",
        send(h(&[]), p, br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge_card","arguments":{},"requestState":"countersign.1.x.y","inputResponses":{"dev.countersign/confirm":{"action":"accept"},"other":{}}}}"#.to_vec()).await
    );
    case!(
        "a forged requestState of countersign's form",
        200,
        "confirmation_invalid",
        send(h(&[]), p, br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge_card","arguments":{"account":"a","amount":1},"requestState":"countersign.1.e30.AAAA","inputResponses":{"dev.countersign/confirm":{"action":"accept","content":{"approve":true}}}}}"#.to_vec()).await
    );

    // Numbers and strings.
    case!(
        "duplicate keys in the arguments",
        200,
        "duplicate",
        send(
            h(&[]),
            p,
            call_body(r#"{"account":"a","amount":1,"amount":1000}"#).into_bytes()
        )
        .await
    );
    case!(
        "duplicate keys in the envelope",
        400,
        "duplicate",
        send(h(&[]), p, br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{"name":"charge_card","arguments":{"account":"a","amount":1}}}"#.to_vec()).await
    );
    case!(
        "a lone surrogate",
        200,
        "surrogate",
        send(
            h(&[]),
            p,
            call_body(r#"{"account":"\ud800","amount":1}"#).into_bytes()
        )
        .await
    );
    case!(
        "an integer beyond 2^53",
        200,
        "9007199254740993",
        send(
            h(&[]),
            p,
            call_body(r#"{"account":"a","amount":9007199254740993}"#).into_bytes()
        )
        .await
    );
    case!(
        "invalid UTF-8",
        400,
        "-32700",
        send(
            h(&[]),
            p,
            [
                call_body(r#"{"account":"#).as_bytes(),
                b"\"\xff\xfe\",\"amount\":1}}}"
            ]
            .concat()
        )
        .await
    );
    case!(
        "NaN is not JSON",
        400,
        "-32700",
        send(
            h(&[]),
            p,
            call_body(r#"{"account":"a","amount":NaN}"#).into_bytes()
        )
        .await
    );

    // Identity and routing.
    let body = call_body(r#"{"account":"a","amount":1}"#).into_bytes();
    let no_token: Vec<(String, String)> = h(&[])
        .into_iter()
        .filter(|(k, _)| k != "Authorization")
        .collect();
    case!(
        "no token",
        401,
        "bearer token",
        send(no_token, p, body.clone()).await
    );
    case!(
        "a wrong token",
        401,
        "bearer token",
        send(
            h(&[("Authorization", "Bearer nope".into())]),
            p,
            body.clone()
        )
        .await
    );
    case!(
        "an empty bearer token",
        401,
        "bearer token",
        send(h(&[("Authorization", "Bearer ".into())]), p, body.clone()).await
    );
    case!(
        "a token without Bearer",
        401,
        "bearer token",
        send(h(&[("Authorization", TOKEN.into())]), p, body.clone()).await
    );
    case!(
        "another identity's session id",
        404,
        "session",
        send(h(&[("Mcp-Session-Id", other_sid.clone())]), p, body.clone()).await
    );
    case!(
        "a made-up session id",
        404,
        "session",
        send(
            h(&[("Mcp-Session-Id", "0123456789abcdef".into())]),
            p,
            body.clone()
        )
        .await
    );
    case!(
        "a foreign Origin",
        403,
        "origin",
        send(
            h(&[("Origin", "https://evil.example".into())]),
            p,
            body.clone()
        )
        .await
    );
    case!(
        "an unknown server",
        404,
        "unknown server",
        send(h(&[]), "/mcp/nope", body.clone()).await
    );
    case!(
        "a path trick in the server name",
        404,
        "",
        send(h(&[]), "/mcp/..%2Fpayments", body.clone()).await
    );
    case!(
        "a NUL in the server name",
        404,
        "",
        send(h(&[]), "/mcp/payments%00", body.clone()).await
    );
    case!(
        "a server name with ../",
        404,
        "",
        send(h(&[]), "/mcp/../payments", body.clone()).await
    );
    case!(
        "a very long tool name",
        200,
        "-32602",
        send(h(&[]), p, format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{long_name}","arguments":{{}}}}}}"#).into_bytes()).await
    );
    case!(
        "a control character in the tool name",
        200,
        "-32602",
        send(h(&[]), p, br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge\u0007card","arguments":{}}}"#.to_vec()).await
    );

    // Idempotency keys.
    case!(
        "an explicit key that is a number",
        200,
        "-32602",
        send(h(&[]), p, br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge_card","arguments":{"account":"a","amount":1},"_meta":{"dev.countersign/idempotency-key":42}}}"#.to_vec()).await
    );
    case!(
        "an empty explicit key",
        200,
        "-32602",
        send(h(&[]), p, br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge_card","arguments":{"account":"a","amount":1},"_meta":{"dev.countersign/idempotency-key":""}}}"#.to_vec()).await
    );
    case!(
        "a 10,000-character explicit key",
        200,
        "-32602",
        send(h(&[]), p, format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"charge_card","arguments":{{"account":"a","amount":1}},"_meta":{{"dev.countersign/idempotency-key":"{long_name}"}}}}}}"#).into_bytes()).await
    );

    // Headers.
    case!(
        "an unknown protocol version in a session",
        400,
        "version",
        send(
            h(&[("Mcp-Protocol-Version", "1999-01-01".into())]),
            p,
            body.clone()
        )
        .await
    );
    let modern_mismatch = send(
        vec![
            ("Authorization".into(), auth.clone()),
            ("Mcp-Protocol-Version".into(), "2026-07-28".into()),
            ("Mcp-Method".into(), "tools/list".into()),
            ("Mcp-Name".into(), "charge_card".into()),
        ],
        p,
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge_card","arguments":{"account":"a","amount":1},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#.to_vec(),
    )
    .await;
    case!(
        "2026-07-28 headers that disagree with the body",
        400,
        "Mcp-Method",
        modern_mismatch
    );
    let addr = gw.base().trim_start_matches("http://").to_owned();
    case!(
        "a CR in a header value",
        400,
        "",
        raw(&gw, format!("POST {p} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\rX-Evil: 1\r\nContent-Length: 2\r\n\r\n{{}}").as_bytes()).await
    );
    case!(
        "a bare LF inside a header value",
        400,
        "",
        raw(&gw, format!("POST {p} HTTP/1.1\r\nHost: {addr}\r\nX-A: a\nb: c\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 2\r\n\r\n{{}}").as_bytes()).await
    );

    // Event streams.
    case!(
        "an SSE GET without a session",
        405,
        "Mcp-Session-Id",
        raw(&gw, format!("GET {p} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nAccept: text/event-stream\r\nConnection: close\r\n\r\n").as_bytes()).await
    );
    case!(
        "a DELETE of another identity's session",
        404,
        "session",
        raw(&gw, format!("DELETE {p} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nMcp-Session-Id: {other_sid}\r\nConnection: close\r\n\r\n").as_bytes()).await
    );

    let mut failures = Vec::new();
    for case in &cases {
        let body_at = case.got.text.find("\r\n\r\n").map_or(0, |i| i + 4);
        let body = &case.got.text[body_at..];
        if case.got.status != case.status
            || !body.to_lowercase().contains(&case.says.to_lowercase())
        {
            failures.push(format!(
                "{}: expected {} with `{}`, got {}:\n{}",
                case.name, case.status, case.says, case.got.status, case.got.text
            ));
        }
        // A JSON-RPC error or a tool error, never a result that ran.
        if case.got.status == 200 {
            let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
            if v.get("error").is_none() && v["result"]["isError"] != true {
                failures.push(format!(
                    "{}: answered 200 without an error: {body}",
                    case.name
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} classes:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
    assert_eq!(gw.executions("charge_card"), 0, "a bad input ran a charge");
    c.protocol = "2025-06-18".into();
    alive(&gw, &c, "after the catalogue").await;

    // Keys that bind: drift and remap run nothing more after one run.
    let keyed = |args: Value, tool: &str| {
        json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{
            "name": tool, "arguments": args,
            "_meta": {"dev.countersign/idempotency-key": "bind-1"}}})
    };
    let first = c
        .post(&keyed(json!({"account":"a","amount":1}), "charge_card"))
        .await;
    assert!(first.response_text().contains("charged"), "{first:?}");
    let drift = c
        .post(&keyed(json!({"account":"a","amount":2}), "charge_card"))
        .await;
    assert_eq!(code(&drift), "drift_rejected", "{drift:?}");
    let remap = c.post(&keyed(json!({"charge":"ch_1"}), "refund")).await;
    assert_eq!(code(&remap), "remap_rejected", "{remap:?}");
    assert_eq!(gw.executions("charge_card"), 1);
    assert_eq!(gw.executions("refund"), 0);
    alive(&gw, &c, "after drift and remap").await;
    assert!(cases.len() + 2 >= 40, "{} classes", cases.len() + 2);
}

#[tokio::test]
async fn an_unknown_tool_is_not_executed() {
    let gw = Gateway::start();
    let c = listed(&gw, "payments").await;
    let r = c.call(5, "no_such_tool", json!({})).await;
    let text = r.response_text();
    assert!(
        r.last().get("error").is_some() || r.last()["result"]["isError"] == true,
        "{text}"
    );
    assert!(gw.records().iter().all(|e| e["tool"] != "no_such_tool"));
    alive(&gw, &c, "after an unknown tool").await;
}

#[tokio::test]
async fn idle_connections_beyond_the_cap_are_told_and_closed() {
    let gw = Gateway::start_with(Options {
        limits: "max_connections = 8\n".into(),
        ..Default::default()
    });
    let addr = gw.base().trim_start_matches("http://").to_owned();
    // Eight idle connections hold every slot.
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    // Accepted in order: wait until the gateway counts them all.
    let mut got = None;
    for _ in 0..100 {
        let g = raw(
            &gw,
            format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await;
        if g.status == 503 {
            got = Some(g);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let got = got.expect("a ninth connection was served");
    assert!(got.text.contains("limits.max_connections"), "{}", got.text);
    // Closing them frees the slots.
    drop(idle);
    let mut ok = false;
    for _ in 0..100 {
        if reqwest::get(format!("{}/healthz", gw.base()))
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ok, "slots were not freed when connections closed");
}

#[tokio::test]
async fn sessions_per_identity_and_the_request_rate_are_capped() {
    let gw = Gateway::start_with(Options {
        limits: "max_sessions_per_identity = 2\nrequests_per_second = 5\n".into(),
        ..Default::default()
    });
    let mut a = Client::new(&gw.url("payments"));
    a.initialize().await;
    let mut b = Client::new(&gw.url("payments"));
    b.initialize().await;
    let third = Client::new(&gw.url("payments"))
        .post(&json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}))
        .await;
    assert_eq!(third.status, 429, "{third:?}");
    assert!(
        third.response_text().contains("max_sessions_per_identity"),
        "{third:?}"
    );
    // Over 5 per second (bursts of 10): some are refused with Retry-After,
    // and none of those ran.
    let mut refused = 0;
    for i in 0..30 {
        let r = a
            .call(
                100 + i,
                "charge_card",
                json!({"account": format!("r-{i}"), "amount": 1}),
            )
            .await;
        if r.status == 429 {
            refused += 1;
            assert!(r.headers.get("retry-after").is_some(), "{r:?}");
            assert!(r.response_text().contains("requests_per_second"), "{r:?}");
        }
    }
    assert!(refused > 0, "30 requests at once were never limited");
    let ran = gw
        .records()
        .iter()
        .filter(|e| e["event"] == "executed" && e["tool"] == "charge_card")
        .count();
    assert_eq!(ran, 30 - refused, "a refused request ran");
}
