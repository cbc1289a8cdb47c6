//! Traces end to end (DESIGN.md section 18), against a real OTLP receiver:
//! `tests/peers/otlp_receiver.py` decodes the OTLP/HTTP protobuf the
//! gateway sends with the official `opentelemetry-proto` messages.
//!
//! The client is the Python `mcp` SDK with the OpenTelemetry SDK set up: it
//! makes a CLIENT span of its own per request and injects its context into
//! `params._meta`. The upstream is a Python SDK server (stdio), which
//! continues the context it finds in `_meta` in a SERVER span of its own.
//! So one trace shows the agent, the gateway and the server, each span
//! made by a different program, and a parent that does not match is a
//! broken propagation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine;
use common::otlp::Receiver;
use common::*;
use serde_json::{json, Value};

/// `charge_card` with `arguments` (JSON text, sent as written) and `meta`,
/// which must succeed.
async fn charge(c: &Client, id: impl std::fmt::Display, arguments: &str, meta: &Value) {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"charge_card","arguments":{arguments},"_meta":{meta}}}}}"#
    );
    let a = c.post_raw(body).await;
    assert_eq!(a.last()["result"]["isError"], false, "{a:?}");
}

/// The example server's execution records.
fn executed(gw: &Gateway) -> Vec<Value> {
    gw.records()
        .into_iter()
        .filter(|r| r["event"] == "executed")
        .collect()
}

fn peers() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/peers")
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

fn find(spans: &[Value], pred: impl Fn(&Value) -> bool) -> Option<&Value> {
    spans.iter().find(|s| pred(s))
}

/// The gateway span named `name` of kind `kind` in trace `trace`.
fn gateway_span<'a>(spans: &'a [Value], trace: &str, kind: &str, name: &str) -> Option<&'a Value> {
    find(spans, |s| {
        s["service"] == "countersign"
            && s["trace_id"] == trace
            && s["kind"] == kind
            && s["name"] == name
    })
}

/// The children of `parent` (by span id) made by the gateway.
fn children<'a>(spans: &'a [Value], parent: &Value) -> Vec<&'a Value> {
    spans
        .iter()
        .filter(|s| {
            s["service"] == "countersign"
                && s["trace_id"] == parent["trace_id"]
                && s["parent_span_id"] == parent["span_id"]
        })
        .collect()
}

/// Wait until trace `trace` has the gateway's SERVER span for `tool` and
/// the upstream's own SERVER span for it.
fn wait_through(rx: &Receiver, what: &str, trace: &str, tool: &str) -> Vec<Value> {
    let name = format!("tools/call {tool}");
    rx.wait(what, |spans| {
        spans.iter().any(|s| {
            s["service"] == "pay-server" && s["trace_id"] == trace && s["name"] == name.as_str()
        }) && gateway_span(spans, trace, "SPAN_KIND_SERVER", &name).is_some()
    })
}

fn child<'a>(spans: &'a [Value], parent: &Value, name: &str) -> &'a Value {
    let kids = children(spans, parent);
    kids.iter()
        .find(|s| s["name"] == name)
        .copied()
        .unwrap_or_else(|| panic!("no `{name}` under {}: {kids:#?}", parent["name"]))
}

/// What the SDK client printed, and the trace id of its CLIENT span for
/// the `tools/call` (the only one of that name in a trace of its own).
struct Step {
    out: Value,
    trace: String,
}

fn run_client(
    gw: &Gateway,
    rx: &Receiver,
    mode: &str,
    step: &str,
    key: &str,
    account: &str,
) -> Step {
    let before: BTreeSet<String> = rx
        .spans()
        .iter()
        .map(|s| s["span_id"].as_str().unwrap().to_owned())
        .collect();
    let out = Command::new(peer_python())
        .arg(peers().join("trace_client.py"))
        .args([&gw.url("pay"), TOKEN, mode, step, key, account])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", rx.endpoint())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "trace_client.py {mode} {step}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let tool = if step == "read" {
        "get_balance"
    } else {
        "charge_card"
    };
    let name = format!("MCP send tools/call {tool}");
    let spans = rx.wait("the SDK client's span", |spans| {
        spans.iter().any(|s| {
            s["service"] == "agent"
                && s["name"] == name
                && !before.contains(s["span_id"].as_str().unwrap())
        })
    });
    let trace = find(&spans, |s| {
        s["service"] == "agent"
            && s["name"] == name
            && !before.contains(s["span_id"].as_str().unwrap())
    })
    .unwrap()["trace_id"]
        .as_str()
        .unwrap()
        .to_owned();
    Step {
        out: printed,
        trace,
    }
}

fn traced_gateway(rx: &Receiver, state: &Path, policies: PathBuf, extra: &str) -> Gateway {
    Gateway::start_with(Options {
        policies: Some(policies),
        extra: format!(
            r#"
[telemetry]
endpoint = "{endpoint}"
export_interval = "50ms"
{extra}

[servers.pay]
command = "{python}"
args = ["{server}", "{state}"]
call_timeout = "20s"
env = {{ OTEL_EXPORTER_OTLP_ENDPOINT = "{endpoint}" }}
"#,
            endpoint = rx.endpoint(),
            python = peer_python().display(),
            server = peers().join("trace_server.py").display(),
            state = state.display(),
        ),
        ..Default::default()
    })
}

/// A read, a held write, the same write once approved, and its replay,
/// from the Python SDK in `mode`: four traces, each continuing the SDK's
/// own, with the spans and attributes of the conventions; the approved
/// retry linked to the call that asked for the approval; the server given
/// the gateway's CLIENT span as its parent; and nothing in the export that
/// names an argument value, the idempotency key or the token.
fn four_traces(mode: &str) {
    let rx = Receiver::start("ok");
    let (pdir, alice) = default_policies_with_alice();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("charges.jsonl");
    let gw = traced_gateway(&rx, &state, pdir.path().to_owned(), "");
    let account = format!("acct-SECRET-{mode}");
    let key = format!("key-SECRET-{mode}");

    // 1. A read: the SDK's CLIENT span → the gateway's SERVER span →
    // decision and CLIENT spans → the server's SERVER span.
    let read = run_client(&gw, &rx, mode, "read", &key, &account);
    assert_eq!(read.out["is_error"], false, "{}", read.out);
    let spans = wait_through(&rx, "the read's trace", &read.trace, "get_balance");
    let agent = find(&spans, |s| {
        s["service"] == "agent"
            && s["trace_id"] == read.trace
            && s["name"] == "MCP send tools/call get_balance"
    })
    .unwrap();
    let server = gateway_span(
        &spans,
        &read.trace,
        "SPAN_KIND_SERVER",
        "tools/call get_balance",
    )
    .unwrap();
    assert_eq!(
        server["parent_span_id"], agent["span_id"],
        "the client's trace is continued: {server:#}"
    );
    assert_eq!(attr(server, "mcp.method.name"), "tools/call");
    assert_eq!(
        attr(server, "mcp.protocol.version"),
        &read.out["protocol_version"]
    );
    assert_eq!(attr(server, "gen_ai.operation.name"), "execute_tool");
    assert_eq!(attr(server, "gen_ai.tool.name"), "get_balance");
    assert_eq!(attr(server, "client.address"), "127.0.0.1");
    assert!(attr(server, "client.port").is_i64(), "{server:#}");
    assert!(attr(server, "jsonrpc.request.id").is_string(), "{server:#}");
    assert_eq!(attr(server, "countersign.outcome"), "ok");
    assert_eq!(attr(server, "countersign.replayed"), false);
    assert!(attr(server, "error.type").is_null(), "{server:#}");
    // `mcp.session.id` exists in the handshake era only.
    assert_eq!(
        attr(server, "mcp.session.id").is_string(),
        mode == "legacy",
        "{server:#}"
    );
    let decision = child(&spans, server, "decision");
    assert_eq!(attr(decision, "countersign.decision"), "allow");
    assert_eq!(attr(decision, "countersign.policies"), "default/read-only");
    let upstream = child(&spans, server, "tools/call get_balance");
    assert_eq!(upstream["kind"], "SPAN_KIND_CLIENT");
    assert_eq!(attr(upstream, "network.transport"), "pipe");
    let at_server = find(&spans, |s| {
        s["service"] == "pay-server"
            && s["trace_id"] == read.trace
            && s["name"] == "tools/call get_balance"
    })
    .unwrap();
    assert_eq!(
        at_server["parent_span_id"], upstream["span_id"],
        "the server continues the gateway's CLIENT span from `_meta`"
    );

    // 2. A write the policies hold: its proposal on the span, the stages
    // that ran, and no CLIENT span (nothing was sent).
    let held = run_client(&gw, &rx, mode, "write", &key, &account);
    assert_eq!(held.out["is_error"], true, "{}", held.out);
    let proposal = held.out["meta"]["dev.countersign/decision"]["proposal_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let spans = rx.wait("the held write's trace", |spans| {
        gateway_span(
            spans,
            &held.trace,
            "SPAN_KIND_SERVER",
            "tools/call charge_card",
        )
        .is_some()
            && spans
                .iter()
                .filter(|s| s["service"] == "countersign" && s["trace_id"] == held.trace)
                .count()
                >= 4
    });
    let asked = gateway_span(
        &spans,
        &held.trace,
        "SPAN_KIND_SERVER",
        "tools/call charge_card",
    )
    .unwrap();
    assert_eq!(attr(asked, "countersign.outcome"), "approval_pending");
    assert_eq!(attr(asked, "countersign.proposal"), proposal.as_str());
    assert_eq!(
        attr(asked, "error.type"),
        "tool_error",
        "the answer has isError"
    );
    assert!(attr(asked, "countersign.key_digest")
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    assert_eq!(
        attr(child(&spans, asked, "decision"), "countersign.decision"),
        "approval"
    );
    assert_eq!(
        attr(
            child(&spans, asked, "ledger lookup"),
            "countersign.ledger_state"
        ),
        "free"
    );
    let wait = child(&spans, asked, "approval wait");
    assert_eq!(attr(wait, "countersign.proposal"), proposal.as_str());
    assert!(
        children(&spans, asked)
            .iter()
            .all(|s| s["kind"] != "SPAN_KIND_CLIENT" || s["name"] == "tools/list"),
        "a held call sends nothing: {:#?}",
        children(&spans, asked)
    );
    // A log line written inside the call names its trace.
    let logged = gw.log.lock().unwrap().iter().any(|l| {
        l.contains("policy: approval required") && l.contains(&format!("trace_id={}", held.trace))
    });
    assert!(logged, "no log line joined to trace {}", held.trace);

    // 3. Approved, and sent again minutes later in a trace of its own: it
    // runs once, its span links to the one that asked, and the server got
    // the gateway's CLIENT span as its context in `_meta`.
    let (ok, out, err) = review_cli(&gw, &alice, &["approve", &proposal]);
    assert!(ok, "{out}{err}");
    let ran = run_client(&gw, &rx, mode, "write", &key, &account);
    assert_eq!(ran.out["is_error"], false, "{}", ran.out);
    let spans = wait_through(&rx, "the approved write's trace", &ran.trace, "charge_card");
    let approved = gateway_span(
        &spans,
        &ran.trace,
        "SPAN_KIND_SERVER",
        "tools/call charge_card",
    )
    .unwrap();
    assert_eq!(attr(approved, "countersign.proposal"), proposal.as_str());
    assert_eq!(attr(approved, "countersign.outcome"), "ok");
    assert_eq!(
        approved["links"],
        json!([{"trace_id": held.trace, "span_id": asked["span_id"]}]),
        "the retry links to the span that created the proposal"
    );
    assert_eq!(
        attr(
            child(&spans, approved, "ledger reserve"),
            "countersign.ledger_state"
        ),
        "reserved"
    );
    assert_eq!(
        attr(
            child(&spans, approved, "ledger dispatch"),
            "countersign.ledger_state"
        ),
        "dispatched"
    );
    assert_eq!(
        attr(
            child(&spans, approved, "ledger complete"),
            "countersign.ledger_state"
        ),
        "completed"
    );
    let sent = child(&spans, approved, "tools/call charge_card");
    let received: Vec<Value> = std::fs::read_to_string(&state)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(received.len(), 1, "it ran once: {received:?}");
    assert_eq!(
        received[0]["traceparent"],
        format!("00-{}-{}-01", ran.trace, sent["span_id"].as_str().unwrap()),
        "the server received the CLIENT span's context in `_meta`"
    );
    assert_eq!(
        received[0]["account"],
        account.as_str(),
        "the arguments arrive unchanged"
    );

    // 4. The same call again: a replay, and nothing sent.
    let again = run_client(&gw, &rx, mode, "write", &key, &account);
    assert_eq!(again.out["is_error"], false, "{}", again.out);
    let spans = rx.wait("the replay's trace", |spans| {
        gateway_span(
            spans,
            &again.trace,
            "SPAN_KIND_SERVER",
            "tools/call charge_card",
        )
        .is_some()
    });
    let replay = gateway_span(
        &spans,
        &again.trace,
        "SPAN_KIND_SERVER",
        "tools/call charge_card",
    )
    .unwrap();
    assert_eq!(attr(replay, "countersign.replayed"), true);
    assert_eq!(attr(replay, "countersign.outcome"), "replayed");
    assert!(
        gateway_span(
            &spans,
            &again.trace,
            "SPAN_KIND_CLIENT",
            "tools/call charge_card"
        )
        .is_none(),
        "a replay sends nothing upstream"
    );
    assert_eq!(std::fs::read_to_string(&state).unwrap().lines().count(), 1);

    // What the gateway exported never names an argument value, the key or
    // the token, in any byte.
    let exports: Vec<Value> = rx
        .exports()
        .into_iter()
        .filter(|e| {
            e["services"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s == "countersign")
        })
        .collect();
    assert!(!exports.is_empty());
    for e in &exports {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(e["raw"].as_str().unwrap())
            .unwrap();
        let raw = String::from_utf8_lossy(&raw);
        for secret in [account.as_str(), key.as_str(), TOKEN] {
            assert!(
                !raw.contains(secret),
                "`{secret}` in an export to the collector"
            );
        }
    }
}

#[test]
fn a_read_a_held_write_its_approval_and_a_replay_are_traced_handshake_era() {
    four_traces("legacy");
}

#[test]
fn a_read_a_held_write_its_approval_and_a_replay_are_traced_2026_07_28() {
    four_traces("2026-07-28");
}

/// The gateway's context goes upstream in `_meta` (and in the header over
/// HTTP); the arguments the server receives and the call's digest are
/// exactly those of the same call without a trace context; a client's
/// `tracestate` travels on with its trace (W3C).
#[tokio::test]
async fn a_trace_context_in_meta_changes_neither_the_arguments_nor_the_digest() {
    let rx = Receiver::start("ok");
    let gw = Gateway::start_with(Options {
        http_upstream: true,
        extra: format!(
            "\n[telemetry]\nendpoint = \"{}\"\nexport_interval = \"50ms\"\n",
            rx.endpoint()
        ),
        ..Default::default()
    });
    let client_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_parent = format!("00-{client_trace}-00f067aa0ba902b7-01");
    for server in ["payments", "phttp"] {
        let mut c = Client::new(&gw.url(server));
        c.initialize().await;
        for (i, meta) in [
            json!({"progressToken": "p-1", "dev.countersign/idempotency-key": format!("plain-{server}")}),
            json!({"progressToken": "p-1", "dev.countersign/idempotency-key": format!("traced-{server}"),
                   "traceparent": client_parent, "tracestate": "vendor=1"}),
        ]
        .into_iter()
        .enumerate()
        {
            let arguments = r#"{"z":1E30,"amount":4.50,"account":"acct_1"}"#;
            charge(&c, i, arguments, &meta).await;
        }
    }
    let executed = executed(&gw);
    assert_eq!(executed.len(), 4, "{executed:?}");
    for r in &executed {
        assert_eq!(
            r["raw_arguments"], r#"{"account":"acct_1","amount":4.5,"z":1e+30}"#,
            "the bytes that were hashed: {r}"
        );
        let meta: Value = serde_json::from_str(r["raw_meta"].as_str().unwrap()).unwrap();
        assert_eq!(meta["progressToken"], "p-1", "{r}");
        let sent = meta["traceparent"].as_str().unwrap();
        // W3C: the client's `tracestate` travels with its trace.
        let continued = sent.contains(client_trace);
        assert_eq!(
            meta.get("tracestate").and_then(Value::as_str),
            continued.then_some("vendor=1"),
            "{r}"
        );
        assert_ne!(sent, client_parent, "the gateway's own span goes upstream");
        if let Some(header) = r["traceparent_header"].as_str() {
            assert_eq!(
                header, sent,
                "over HTTP the header carries the same context"
            );
        }
    }
    let traced: Vec<&Value> = executed
        .iter()
        .filter(|r| r["raw_meta"].as_str().unwrap().contains(client_trace))
        .collect();
    assert_eq!(
        traced.len(),
        2,
        "the client's trace continued upstream: {executed:?}"
    );
    assert_eq!(
        executed
            .iter()
            .filter(|r| r["traceparent_header"].is_string())
            .count(),
        2,
        "the HTTP upstream got the header both times"
    );
    wait_for_audit(&gw, "four dispatches", |e| {
        e.iter().filter(|e| e["kind"] == "dispatched").count() == 4
    })
    .await;
    // The gateway's CLIENT span to the HTTP upstream names it.
    let spans = rx.wait("the CLIENT spans to phttp", |spans| {
        spans.iter().any(|s| {
            s["kind"] == "SPAN_KIND_CLIENT"
                && s["name"] == "tools/call charge_card"
                && attr(s, "countersign.server") == "phttp"
        })
    });
    let to_http = find(&spans, |s| {
        s["kind"] == "SPAN_KIND_CLIENT" && attr(s, "countersign.server") == "phttp"
    })
    .unwrap();
    assert_eq!(attr(to_http, "server.address"), "127.0.0.1", "{to_http:#}");
    assert!(attr(to_http, "server.port").is_i64(), "{to_http:#}");
    assert_eq!(attr(to_http, "network.transport"), "tcp");

    // A context in the HTTP header alone is continued too.
    let header_trace = "0af7651916cd43dd8448eb211c80319c";
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    let resp = c
        .request(reqwest::Method::POST)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("traceparent", format!("00-{header_trace}-b7ad6b7169203331-01"))
        .body(r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"get_balance","arguments":{"account":"acct_1"}}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(answer(resp).await.last()["result"]["isError"], false);
    let spans = rx.wait("the span continuing the header's trace", |spans| {
        gateway_span(
            spans,
            header_trace,
            "SPAN_KIND_SERVER",
            "tools/call get_balance",
        )
        .is_some()
    });
    let continued = gateway_span(
        &spans,
        header_trace,
        "SPAN_KIND_SERVER",
        "tools/call get_balance",
    )
    .unwrap();
    assert_eq!(continued["parent_span_id"], "b7ad6b7169203331");

    // One digest per server, with or without the context.
    let entries = audit_entries(&gw.audit_dir());
    for server in ["payments", "phttp"] {
        let digests: BTreeSet<&str> = entries
            .iter()
            .filter(|e| e.get("server").and_then(Value::as_str) == Some(server))
            .filter(|e| e.get("tool").and_then(Value::as_str) == Some("charge_card"))
            .filter_map(|e| e.get("call_digest").and_then(Value::as_str))
            .collect();
        assert_eq!(digests.len(), 1, "{server}: {digests:?}");
    }
}

const METRICS_TOKEN: &str = "scraper-token-traces";

/// A gateway whose `/metrics` answers [`METRICS_TOKEN`], exporting to `rx`
/// with `telemetry` added to its `[telemetry]`.
fn metered(rx: &Receiver, telemetry: &str) -> Gateway {
    Gateway::start_with(Options {
        extra: format!(
            "\n[metrics]\ntoken_sha256 = \"{}\"\n\n[telemetry]\nendpoint = \"{}\"\n{telemetry}\n",
            sha(METRICS_TOKEN),
            rx.endpoint()
        ),
        ..Default::default()
    })
}

async fn scrape(gw: &Gateway) -> String {
    scrape_metrics(gw, METRICS_TOKEN).await
}

/// A collector that accepts and never answers: every call is answered,
/// the spans that do not fit the queue are dropped and counted, and the
/// drop is logged once.
#[tokio::test]
async fn a_collector_that_never_answers_drops_spans_and_counts_them() {
    let rx = Receiver::start("hang");
    let gw = metered(
        &rx,
        "export_interval = \"10ms\"\nmax_queue = 4\nmax_batch = 2\ntimeout = \"60s\"",
    );
    let c = listed(&gw, "payments").await;
    for i in 0..30 {
        let a = c
            .call(100 + i, "get_balance", json!({"account": format!("a-{i}")}))
            .await;
        assert_eq!(a.last()["result"]["isError"], false, "call {i}: {a:?}");
    }
    let scrape = scrape(&gw).await;
    let count = |result: &str| -> u64 {
        scrape
            .lines()
            .find(|l| l.starts_with(&format!("countersign_trace_spans{{result=\"{result}\"}}")))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {result} count in:\n{scrape}"))
    };
    assert!(count("dropped") > 0, "{scrape}");
    assert_eq!(count("exported"), 0, "{scrape}");
    gw.wait_for_log("the export queue is full").await;
    let warned = gw
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("the export queue is full"))
        .count();
    assert_eq!(warned, 1, "logged once");
}

/// Set by the standard variables alone, with `parentbased_always_off`: a
/// call whose client sent a sampled context is traced (under the variable's
/// service name) and the upstream gets the gateway's context; a call
/// without one is dropped, makes no span of the gateway's own, and reaches
/// the upstream without a `traceparent`.
#[tokio::test]
async fn the_otel_variables_configure_it_and_a_dropped_trace_sends_no_context() {
    let rx = Receiver::start("ok");
    let gw = Gateway::start_with(Options {
        gateway_env: vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), rx.endpoint()),
            (
                "OTEL_TRACES_SAMPLER".into(),
                "parentbased_always_off".into(),
            ),
            ("OTEL_SERVICE_NAME".into(), "gw-from-env".into()),
        ],
        extra: "\n[telemetry]\nexport_interval = \"50ms\"\n".into(),
        ..Default::default()
    });
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    let client_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = format!("00-{client_trace}-00f067aa0ba902b7-01");
    for (amount, meta) in [
        (3, json!({ "traceparent": parent })),
        (4, json!({ "progressToken": "p-4" })),
    ] {
        let arguments = format!(r#"{{"amount":{amount},"account":"acct_1"}}"#);
        charge(&c, amount, &arguments, &meta).await;
    }
    let executed = executed(&gw);
    assert_eq!(executed.len(), 2, "{executed:?}");
    let meta_of = |amount: i64| -> Value {
        let r = executed
            .iter()
            .find(|r| r["arguments"]["amount"] == amount)
            .unwrap();
        serde_json::from_str(r["raw_meta"].as_str().unwrap_or("{}")).unwrap()
    };
    let sampled = meta_of(3)["traceparent"].as_str().unwrap().to_owned();
    assert!(
        sampled.contains(client_trace) && sampled != parent,
        "{sampled}"
    );
    assert!(
        meta_of(4).get("traceparent").is_none(),
        "a dropped trace sends no context of the gateway's own: {}",
        meta_of(4)
    );
    let spans = rx.wait("the sampled call's SERVER span", |spans| {
        spans
            .iter()
            .any(|s| s["trace_id"] == client_trace && s["kind"] == "SPAN_KIND_SERVER")
    });
    let server = find(&spans, |s| {
        s["trace_id"] == client_trace && s["kind"] == "SPAN_KIND_SERVER"
    })
    .unwrap();
    assert_eq!(server["service"], "gw-from-env", "OTEL_SERVICE_NAME");
}

/// A trace the sampler drops makes no span and sends no context of the
/// gateway's own: the server gets the client's `_meta` as it came.
#[tokio::test]
async fn a_dropped_trace_makes_no_span_and_passes_the_clients_context_on() {
    let rx = Receiver::start("ok");
    let gw = metered(&rx, "sampler = \"always_off\"");
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let meta = json!({ "traceparent": parent });
    charge(&c, 1, r#"{"amount":3,"account":"acct_1"}"#, &meta).await;
    let executed = executed(&gw);
    assert_eq!(executed.len(), 1);
    let meta: Value = serde_json::from_str(executed[0]["raw_meta"].as_str().unwrap()).unwrap();
    assert_eq!(meta["traceparent"], parent, "passed on as it came");
    let scrape = scrape(&gw).await;
    for result in ["exported", "dropped", "failed"] {
        let line = format!("countersign_trace_spans{{result=\"{result}\"}} 0");
        assert!(scrape.lines().any(|l| l == line), "{line} in:\n{scrape}");
    }
}

/// Arguments and results are recorded only when the operator opts in:
/// then as the canonical arguments (JCS) and the result's text.
#[tokio::test]
async fn arguments_and_results_are_recorded_only_when_opted_in() {
    for opted_in in [false, true] {
        let rx = Receiver::start("ok");
        let gw = metered(
            &rx,
            &format!("export_interval = \"50ms\"\narguments = {opted_in}\nresults = {opted_in}"),
        );
        let c = listed(&gw, "payments").await;
        let a = c
            .call(
                1,
                "get_balance",
                json!({"account": "acct-opt-in", "z": 1E3}),
            )
            .await;
        assert_eq!(a.last()["result"]["isError"], false, "{a:?}");
        let spans = rx.wait("the read's SERVER span", |spans| {
            spans
                .iter()
                .any(|s| s["kind"] == "SPAN_KIND_SERVER" && s["name"] == "tools/call get_balance")
        });
        let server = find(&spans, |s| {
            s["kind"] == "SPAN_KIND_SERVER" && s["name"] == "tools/call get_balance"
        })
        .unwrap();
        let arguments = attr(server, "gen_ai.tool.call.arguments");
        let result = attr(server, "gen_ai.tool.call.result");
        if opted_in {
            assert_eq!(
                arguments, r#"{"account":"acct-opt-in","z":1000}"#,
                "{server:#}"
            );
            let result: Value = serde_json::from_str(result.as_str().unwrap()).unwrap();
            assert!(result["content"].is_array(), "{server:#}");
        } else {
            assert!(arguments.is_null() && result.is_null(), "{server:#}");
            let exports = rx.exports();
            assert!(!exports.is_empty());
            for e in exports {
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(e["raw"].as_str().unwrap())
                    .unwrap();
                assert!(!String::from_utf8_lossy(&raw).contains("acct-opt-in"));
            }
        }
    }
}

/// Observability never changes evidence: the same calls, traces on and
/// off, leave the same audit entries, with the same fields and the same
/// values, apart from what differs between any two runs (times, the hash
/// chain, and ids made at random: sessions, proposals, keys derived from a
/// session).
#[tokio::test]
async fn traces_on_or_off_the_audit_log_is_the_same() {
    let rx = Receiver::start("ok");
    let traced = format!(
        "\n[telemetry]\nendpoint = \"{}\"\nexport_interval = \"50ms\"\n",
        rx.endpoint()
    );
    let mut logs = Vec::new();
    for extra in [String::new(), traced] {
        let gw = Gateway::start_with(Options {
            extra,
            ..Default::default()
        });
        let c = listed(&gw, "payments").await;
        // An unattended read, a write with a key, a write without one.
        let read = c.call(1, "get_balance", json!({"account": "acct_1"})).await;
        assert_eq!(read.last()["result"]["isError"], false, "{read:?}");
        let keyed = c
            .post(&json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"charge_card",
                "arguments":{"account":"acct_1","amount":7},"_meta":{"dev.countersign/idempotency-key":"same-key"}}}))
            .await;
        assert_eq!(keyed.last()["result"]["isError"], false, "{keyed:?}");
        let derived = c
            .call(3, "charge_card", json!({"account": "acct_2", "amount": 5}))
            .await;
        assert_eq!(derived.last()["result"]["isError"], false, "{derived:?}");
        wait_for_audit(&gw, "the three calls' outcomes", |es| {
            es.iter().filter(|e| e["kind"] == "completed").count() >= 3
        })
        .await;
        let entries: Vec<Value> = audit_entries(&gw.audit_dir())
            .into_iter()
            .filter(|e| e.contains_key("tool"))
            .map(|e| Value::Object(stable(e)))
            .collect();
        logs.push(entries);
    }
    assert!(logs[0].len() >= 7, "{:#?}", logs[0]);
    assert_eq!(
        logs[0], logs[1],
        "traces off (left) and on (right) recorded different evidence"
    );
}

/// An audit entry without what differs between any two runs: each such
/// field is kept by name (its presence is evidence), its value replaced.
fn stable(mut e: serde_json::Map<String, Value>) -> serde_json::Map<String, Value> {
    const VOLATILE: &[&str] = &[
        "time",
        "ts",
        "seq",
        "hash",
        "prev",
        "gateway",
        "outbox",
        "session",
        "proposal_id",
        "elapsed_ms",
        "duration_ms",
        "answered_at",
        "dispatched_at",
        "received_at",
        "expires",
        "expires_at",
    ];
    for (k, v) in e.iter_mut() {
        if VOLATILE.contains(&k.as_str()) {
            *v = Value::from("(varies)");
        }
    }
    // A key derived from the session varies with it; an explicit one not.
    if let Some(k) = e.get_mut("idempotency_key") {
        if k != "same-key" {
            *k = Value::from("(derived)");
        }
    }
    e
}
