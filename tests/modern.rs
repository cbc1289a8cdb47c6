//! The 2026-07-28 era through the gateway: no handshake, per-request `_meta`,
//! `Mcp-Method`/`Mcp-Name` headers checked against the body.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use serde_json::{json, Value};

const V: &str = "2026-07-28";

fn call_body(id: i64, tool: &str, args: Value) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
        "name": tool, "arguments": args,
        "_meta": {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {}}}})
}

async fn post(gw: &Gateway, server: &str, body: &Value, headers: &[(&str, &str)]) -> Answer {
    let mut req = reqwest::Client::new()
        .post(gw.url(server))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    answer(req.body(body.to_string()).send().await.unwrap()).await
}

#[tokio::test]
async fn stateless_calls_over_stdio_and_http_upstreams() {
    let gw = Gateway::with_http_upstream();
    for server in ["payments", "phttp"] {
        let a = post(
            &gw,
            server,
            &call_body(1, "get_balance", json!({"account":"acct_7"})),
            &[
                ("mcp-protocol-version", V),
                ("mcp-method", "tools/call"),
                ("mcp-name", "get_balance"),
            ],
        )
        .await;
        assert_eq!(a.status, 200, "{server}: {a:?}");
        assert!(
            a.headers.get("mcp-session-id").is_none(),
            "no sessions in this era"
        );
        assert_eq!(a.last()["result"]["resultType"], "complete");
        assert_eq!(
            a.last()["result"]["content"][0]["text"],
            "balance of acct_7: 1200.00 EUR"
        );
    }
    assert_eq!(gw.executions("get_balance"), 2);
}

#[tokio::test]
async fn header_body_mismatches_are_rejected_before_anything_runs() {
    let gw = Gateway::start();
    let body = call_body(1, "charge_card", json!({"account":"a","amount":1}));
    let cases: [(&[(&str, &str)], &str); 5] = [
        (
            &[("mcp-method", "tools/call"), ("mcp-name", "charge_card")],
            "MCP-Protocol-Version header is missing",
        ),
        (
            &[
                ("mcp-protocol-version", "2025-06-18"),
                ("mcp-method", "tools/call"),
                ("mcp-name", "charge_card"),
            ],
            "does not match _meta",
        ),
        (
            &[
                ("mcp-protocol-version", V),
                ("mcp-method", "tools/list"),
                ("mcp-name", "charge_card"),
            ],
            "Mcp-Method `tools/list`",
        ),
        (
            &[
                ("mcp-protocol-version", V),
                ("mcp-method", "tools/call"),
                ("mcp-name", "get_balance"),
            ],
            "Mcp-Name `get_balance`",
        ),
        (
            &[("mcp-protocol-version", V), ("mcp-method", "tools/call")],
            "Mcp-Name header is missing",
        ),
    ];
    for (headers, expect) in cases {
        let a = post(&gw, "payments", &body, headers).await;
        assert_eq!(a.status, 400, "{expect}: {a:?}");
        assert_eq!(a.last()["error"]["code"], -32020, "{expect}");
        assert!(
            a.last()["error"]["message"]
                .as_str()
                .unwrap()
                .contains(expect),
            "{expect}: {a:?}"
        );
    }
    // A base64-sentinel Mcp-Name is decoded before comparing.
    let a = post(
        &gw,
        "payments",
        &call_body(2, "get_balance", json!({"account":"x"})),
        &[
            ("mcp-protocol-version", V),
            ("mcp-method", "tools/call"),
            ("mcp-name", "=?base64?Z2V0X2JhbGFuY2U=?="),
        ],
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(gw.executions("charge_card"), 0);
}

#[tokio::test]
async fn unknown_versions_get_the_standard_version_error() {
    let gw = Gateway::start();
    let mut body = call_body(1, "get_balance", json!({"account":"x"}));
    body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("2099-01-01");
    let a = post(
        &gw,
        "payments",
        &body,
        &[
            ("mcp-protocol-version", "2099-01-01"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "get_balance"),
        ],
    )
    .await;
    assert_eq!(a.status, 400);
    assert_eq!(a.last()["error"]["code"], -32022);
    let supported = a.last()["error"]["data"]["supported"].as_array().unwrap();
    assert!(supported.contains(&json!(V)) && supported.contains(&json!("2025-11-25")));
    // GET and DELETE do not exist in this era.
    let get = reqwest::Client::new()
        .get(gw.url("payments"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), 405);
}

/// Poll the example server's record until a cancellation shows up.
async fn wait_for_cancellation(gw: &Gateway) -> Option<Value> {
    for _ in 0..150 {
        if let Some(r) = gw.records().into_iter().find(|r| r["event"] == "cancelled") {
            return Some(r);
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    None
}

#[tokio::test]
async fn closing_the_response_stream_cancels_upstream() {
    let gw = Gateway::start();
    let mut body = call_body(1, "slow_report", json!({"steps": 20}));
    body["params"]["_meta"]["progressToken"] = json!("p-1");
    let mut resp = modern_post(&gw.url("payments"), &body)
        .send()
        .await
        .unwrap();
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    // The first progress event proves the call is running; then hang up.
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("notifications/progress"));
    drop(resp);
    let seen = wait_for_cancellation(&gw)
        .await
        .expect("closing the stream did not cancel upstream");
    assert!(seen["requestId"].is_u64(), "{seen}");
}

#[tokio::test]
async fn hanging_up_on_a_json_answer_cancels_upstream() {
    let gw = Gateway::start();
    gw.fault("get_balance", "delay", 3000);
    let res = modern_post(
        &gw.url("payments"),
        &call_body(1, "get_balance", json!({"account":"a"})),
    )
    // No progress precedes the answer, so it would come as one JSON body.
    .timeout(std::time::Duration::from_millis(400))
    .send()
    .await;
    assert!(res.is_err(), "the client gave up before the answer");
    assert!(
        wait_for_cancellation(&gw).await.is_some(),
        "the upstream was not told"
    );
}

/// A version probe is a request of the gateway's own, made while it serves
/// a client's call of another tool: over HTTP in 2026-07-28 its `Mcp-Name`
/// names the probe's tool, not the client's, or a server that checks the
/// headers against the body (the example server does) refuses it and the
/// call cannot even be proposed.
#[tokio::test]
async fn a_version_probe_goes_upstream_under_its_own_name() {
    let (pdir, _key) = default_policies_with_alice();
    let gw = Gateway::start_with(Options {
        http_upstream: true,
        policies: Some(pdir.path().to_owned()),
        extra: "\n[servers.phttp.tools.charge_card]\nversion_probe = { tool = \"get_account\", \
                arguments = { account = \"/account\" }, pointer = \"/structuredContent/version\" }\n"
            .into(),
        ..Default::default()
    });
    let a = post(
        &gw,
        "phttp",
        &call_body(1, "charge_card", json!({"account":"acct_7","amount":3})),
        &[
            ("mcp-protocol-version", V),
            ("mcp-method", "tools/call"),
            ("mcp-name", "charge_card"),
        ],
    )
    .await;
    let decision = &a.last()["result"]["_meta"]["dev.countersign/decision"];
    assert_eq!(decision["code"], "approval_pending", "{a:?}");
    assert_eq!(gw.executions("get_account"), 1, "the probe ran: {a:?}");
    assert_eq!(gw.executions("charge_card"), 0);
    drop(pdir);
}
