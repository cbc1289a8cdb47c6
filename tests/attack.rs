//! One regression test per finding of an attack on countersign from
//! outside, each named after what it found, against the real gateway and
//! peers nobody here wrote: a lenient stdio server built on PyPI's generic
//! `json-rpc` dispatcher, which runs a `tools/call` sent without an id.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;

use common::bridge::Bridge;
use common::*;
use serde_json::{json, Value};

const METRICS_TOKEN: &str = "tok-metrics";

/// A gateway with the lenient server as `lenient` (it speaks 2026-07-28
/// too) and as `legacy` (handshake era only, so 2026-07-28 clients are
/// carried over a session the gateway holds), recording `wire_money`
/// executions in `record`.
fn lenient_gateway(record: &std::path::Path) -> Gateway {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/peers/lenient_server.py");
    let python = peer_python();
    let server = |name: &str, extra: &str| {
        format!(
            "\n[servers.{name}]\ncommand = \"{}\"\nargs = [\"{}\", \"{}\"{extra}]\n",
            python.display(),
            script.display(),
            record.display()
        )
    };
    Gateway::start_with(Options {
        extra: format!(
            "{}{}\n[metrics]\ntoken_sha256 = \"{}\"\n",
            server("lenient", ""),
            server("legacy", ", \"--handshake-only\""),
            sha(METRICS_TOKEN)
        ),
        ..Default::default()
    })
}

/// What the lenient server ran: (with an id, without one).
fn wire_money_runs(record: &std::path::Path) -> (usize, usize) {
    let text = std::fs::read_to_string(record).unwrap_or_default();
    let runs: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let without = runs.iter().filter(|r| r["id"].is_null()).count();
    (runs.len() - without, without)
}

/// `countersign_refusals_total{what}` as the gateway counts it.
async fn refusals(gw: &Gateway, what: &str) -> u64 {
    let text = scrape_metrics(gw, METRICS_TOKEN).await;
    let needle = format!("countersign_refusals_total{{what=\"{what}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&needle))
        .map_or(0, |n| n.trim().parse().unwrap())
}

fn wire_money_note() -> Value {
    json!({"jsonrpc":"2.0","method":"tools/call","params":{"name":"wire_money",
        "arguments":{"to":"mallory","amount":900}}})
}

#[tokio::test]
async fn a_tool_call_without_an_id_in_a_session_never_reaches_a_lenient_server() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("runs.jsonl");
    let gw = lenient_gateway(&record);
    let c = listed(&gw, "lenient").await;
    let refused = c.post(&wire_money_note()).await;
    assert_eq!(refused.status, 400, "{refused:?}");
    assert_eq!(refused.last()["error"]["code"], -32600, "{refused:?}");
    assert!(
        refused.response_text().contains("without an `id`"),
        "{refused:?}"
    );
    // A request behind it on the same stdio pipe: had the notification gone
    // upstream, the server would have run it before answering this.
    let after = c.call(2, "get_balance", json!({"account":"a"})).await;
    assert_eq!(after.last()["result"]["isError"], false, "{after:?}");
    assert_eq!(wire_money_runs(&record), (0, 0));
    assert_eq!(refusals(&gw, "tool_call_without_id").await, 1);
    // The same call as a request goes through the pipeline, and runs once.
    let call = c
        .call(3, "wire_money", json!({"to":"mallory","amount":900}))
        .await;
    assert_eq!(call.last()["result"]["isError"], false, "{call:?}");
    assert_eq!(wire_money_runs(&record), (1, 0));
    wait_for_audit(&gw, "the refusal", |es| {
        es.iter()
            .any(|e| e["kind"] == "refused" && e["what"] == "tool_call_without_id")
    })
    .await;
}

#[tokio::test]
async fn a_method_spelled_like_tools_call_is_refused_and_never_runs() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("runs.jsonl");
    let gw = lenient_gateway(&record);
    let c = listed(&gw, "lenient").await;
    // The lenient server maps `TOOLS/CALL` and `tools/call ` to its handler.
    for (id, method) in [
        (5, "TOOLS/CALL"),
        (6, "tools/call "),
        (7, "ｔｏｏｌｓ/ｃａｌｌ"),
    ] {
        let a = c
            .post(
                &json!({"jsonrpc":"2.0","id":id,"method":method,"params":{"name":"wire_money",
                "arguments":{"to":"mallory","amount":900}}}),
            )
            .await;
        assert_eq!(a.last()["error"]["code"], -32600, "{method}: {a:?}");
        assert!(
            a.response_text()
                .contains("could be taken for `tools/call`"),
            "{a:?}"
        );
    }
    assert_eq!(wire_money_runs(&record), (0, 0));
    assert_eq!(refusals(&gw, "tool_call_lookalike").await, 3);
}

#[tokio::test]
async fn a_tool_call_without_an_id_in_a_batch_is_dropped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("runs.jsonl");
    let gw = lenient_gateway(&record);
    let mut c = Client::new(&gw.url("lenient"));
    c.protocol = "2025-03-26".into();
    c.initialize().await;
    let batch = json!([
        wire_money_note(),
        {"jsonrpc":"2.0","method":"TOOLS/CALL","params":{"name":"wire_money","arguments":{"to":"m","amount":1}}},
        {"jsonrpc":"2.0","id":"after","method":"tools/call","params":{"name":"get_balance","arguments":{"account":"a"}}},
    ]);
    let a = c.post(&batch).await;
    assert_eq!(a.status, 200, "{a:?}");
    let answers = a.last().as_array().unwrap().clone();
    assert_eq!(answers.len(), 1, "notifications get no answer: {answers:?}");
    assert_eq!(answers[0]["id"], "after");
    // Another request after the batch, on the same pipe.
    let after = c.call(9, "get_balance", json!({"account":"a"})).await;
    assert_eq!(after.last()["result"]["isError"], false, "{after:?}");
    assert_eq!(wire_money_runs(&record), (0, 0));
    assert_eq!(refusals(&gw, "tool_call_without_id").await, 1);
    assert_eq!(refusals(&gw, "tool_call_lookalike").await, 1);
}

#[tokio::test]
async fn a_tool_call_without_an_id_in_the_stateless_era_never_reaches_a_lenient_server() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("runs.jsonl");
    let gw = lenient_gateway(&record);
    let meta = json!({"io.modelcontextprotocol/protocolVersion":"2026-07-28",
        "io.modelcontextprotocol/clientCapabilities":{},
        "io.modelcontextprotocol/clientInfo":{"name":"attacker","version":"1"}});
    // `lenient` speaks 2026-07-28 itself; `legacy` is carried over a
    // handshake-era session the gateway holds.
    for server in ["lenient", "legacy"] {
        let mut note = wire_money_note();
        note["params"]["_meta"] = meta.clone();
        let a = answer(modern_post(&gw.url(server), &note).send().await.unwrap()).await;
        assert_eq!(a.status, 400, "{server}: {a:?}");
        assert!(a.response_text().contains("without an `id`"), "{a:?}");
        let read = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_balance",
            "arguments":{"account":"a"},"_meta":meta}});
        let after = answer(modern_post(&gw.url(server), &read).send().await.unwrap()).await;
        assert_eq!(
            after.last()["result"]["isError"],
            false,
            "{server}: {after:?}"
        );
    }
    assert_eq!(wire_money_runs(&record), (0, 0));
    assert_eq!(refusals(&gw, "tool_call_without_id").await, 2);
}

#[tokio::test]
async fn a_tool_call_without_an_id_through_the_stdio_bridge_never_reaches_a_lenient_server() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("runs.jsonl");
    let gw = lenient_gateway(&record);
    let mut b = Bridge::for_server(&gw, "lenient", &[]);
    b.send(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"stdio-attacker","version":"1"}}}"#);
    assert_eq!(
        b.answer(json!(1))["result"]["serverInfo"]["name"],
        "lenient"
    );
    b.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    b.send(&wire_money_note().to_string());
    b.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"get_balance","arguments":{"account":"a"}}}"#);
    // The notification gets no answer over stdio; the next line out is the
    // read's answer.
    let next = b.recv();
    assert_eq!(next["id"], 2, "{next}");
    assert_eq!(next["result"]["isError"], false, "{next}");
    assert_eq!(wire_money_runs(&record), (0, 0));
    assert_eq!(refusals(&gw, "tool_call_without_id").await, 1);
}

/// Two reviewers must approve a charge: the policy folder and the key files
/// of alice and bob (both leads).
fn two_reviewer_folder() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let shipped = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policies");
    for f in ["schema.cedarschema", "default.cedar"] {
        std::fs::copy(shipped.join(f), dir.path().join(f)).unwrap();
    }
    std::fs::write(
        dir.path().join("two.cedar"),
        "@id(\"charges-need-two\")\n@approvals(\"2\")\npermit (principal, action == Action::\"call\", resource == Tool::\"payments/charge_card\")\nwhen { context.approved };\n",
    )
    .unwrap();
    let mut entries = String::new();
    for name in ["alice", "bob"] {
        let out = std::process::Command::new(countersign_bin())
            .args([
                "keygen",
                "--name",
                name,
                "--groups",
                "leads",
                "--tenants",
                "acme",
                "--out",
            ])
            .arg(dir.path().join(format!("{name}.key")))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        entries.push_str(&String::from_utf8(out.stdout).unwrap());
        entries.push('\n');
    }
    std::fs::write(dir.path().join("reviewers.toml"), entries).unwrap();
    dir
}

fn reviewer(
    gw: &Gateway,
    folder: &tempfile::TempDir,
    name: &str,
) -> countersign::cli::client::Client {
    let key =
        countersign::cli::client::load_key(&folder.path().join(format!("{name}.key"))).unwrap();
    countersign::cli::client::Client::new(&gw.base(), &key).unwrap()
}

/// A charge held for approval: its proposal id.
async fn held_charge(gw: &Gateway) -> String {
    let c = listed(gw, "payments").await;
    let a = c
        .call(1, "charge_card", json!({"account":"acct_1","amount":900}))
        .await;
    assert_eq!(code(&a), "approval_pending", "{a:?}");
    countersign(&a)["proposal_id"].as_str().unwrap().to_owned()
}

/// Who has approved proposal `id` so far, as the gateway says.
async fn approvers(c: &countersign::cli::client::Client, id: &str) -> Vec<String> {
    let p = c.proposal(id).await.unwrap();
    p["approvals"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| g["statement"]["reviewer"].as_str().unwrap().to_owned())
        .collect()
}

/// Send a captured request again, exactly as it was (the same method,
/// path, headers and body), to the gateway at `base`, on a new connection.
async fn replay(
    c: &countersign::cli::client::Client,
    captured: &reqwest::RequestBuilder,
    base: &str,
) -> String {
    let built = captured.try_clone().unwrap().build().unwrap();
    let mut again = reqwest::Client::new().request(
        built.method().clone(),
        format!("{base}{}", built.url().path()),
    );
    for (name, value) in built.headers() {
        again = again.header(name, value);
    }
    again = again.body(built.body().unwrap().as_bytes().unwrap().to_vec());
    let err = c.send(again).await.expect_err("a replay must be refused");
    err.to_string()
}

#[tokio::test]
async fn a_replayed_approval_or_withdrawal_is_refused_across_a_restart() {
    use countersign::core::approval::Verdict;
    let folder = two_reviewer_folder();
    let mut gw = Gateway::start_with(Options {
        policies: Some(folder.path().to_owned()),
        ..Default::default()
    });
    let id = held_charge(&gw).await;
    let alice = reviewer(&gw, &folder, "alice");
    let approve = alice
        .decision_request(
            &id,
            Verdict::Approve,
            "",
            std::time::Duration::from_secs(600),
        )
        .await
        .unwrap();
    alice.send(approve.try_clone().unwrap()).await.unwrap();
    assert_eq!(approvers(&alice, &id).await, ["alice"]);
    let withdraw = alice.signed(
        reqwest::Method::POST,
        &format!("/v1/proposals/{id}/withdraw"),
        b"{}".to_vec(),
    );
    alice.send(withdraw.try_clone().unwrap()).await.unwrap();
    assert!(approvers(&alice, &id).await.is_empty());
    // The captured approval, sent again: refused, and still withdrawn.
    let e = replay(&alice, &approve, &gw.base()).await;
    assert!(e.contains("401") && e.contains("already used"), "{e}");
    assert!(approvers(&alice, &id).await.is_empty());
    // The same statement in a freshly signed request: still withdrawn.
    let body: Value = serde_json::from_slice(
        approve
            .try_clone()
            .unwrap()
            .build()
            .unwrap()
            .body()
            .unwrap()
            .as_bytes()
            .unwrap(),
    )
    .unwrap();
    let e = alice
        .call(
            reqwest::Method::POST,
            &format!("/v1/proposals/{id}/decision"),
            Some(&body),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("was withdrawn"), "{e}");
    assert!(approvers(&alice, &id).await.is_empty());

    gw.restart();
    let alice = reviewer(&gw, &folder, "alice");
    let e = replay(&alice, &approve, &gw.base()).await;
    assert!(e.contains("already used"), "after a restart: {e}");
    // Alice approves anew; the captured withdrawal cannot take it back.
    alice
        .decide(
            &id,
            Verdict::Approve,
            "",
            std::time::Duration::from_secs(600),
        )
        .await
        .unwrap();
    let e = replay(&alice, &withdraw, &gw.base()).await;
    assert!(e.contains("already used"), "{e}");
    assert_eq!(approvers(&alice, &id).await, ["alice"]);
    assert_eq!(gw.executions("charge_card"), 0);
    wait_for_audit(&gw, "the refused replay", |es| {
        es.iter()
            .any(|e| e["kind"] == "refused" && e["what"] == "control_replay")
    })
    .await;
}

#[tokio::test]
async fn a_replayed_approval_is_refused_by_another_gateway_on_postgres() {
    use countersign::core::approval::Verdict;
    let folder = two_reviewer_folder();
    let schema = common::pg::Schema::new();
    let opts = || Options {
        policies: Some(folder.path().to_owned()),
        ..Default::default()
    };
    let a = common::pg::on(&schema, opts());
    let b = common::pg::on(&schema, opts());
    let id = held_charge(&a).await;
    let at_a = reviewer(&a, &folder, "alice");
    let at_b = reviewer(&b, &folder, "alice");
    let approve = at_a
        .decision_request(
            &id,
            Verdict::Approve,
            "",
            std::time::Duration::from_secs(600),
        )
        .await
        .unwrap();
    at_a.send(approve.try_clone().unwrap()).await.unwrap();
    at_a.withdraw(&id).await.unwrap();
    // The captured request, replayed at the other gateway.
    let e = replay(&at_b, &approve, &b.base()).await;
    assert!(e.contains("already used"), "{e}");
    assert!(approvers(&at_b, &id).await.is_empty());
}
