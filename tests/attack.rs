//! One regression test per finding of an attack on countersign from
//! outside, each named after what it found, against the real gateway and
//! peers nobody here wrote: a lenient stdio server built on PyPI's generic
//! `json-rpc` dispatcher, which runs a `tools/call` sent without an id.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::PathBuf;

use common::bridge::Bridge;
use common::*;
use serde_json::{json, Value};

const METRICS_TOKEN: &str = "tok-metrics";

/// A gateway with the lenient server as `lenient` (it speaks 2026-07-28
/// too) and as `legacy` (handshake era only, so 2026-07-28 clients are
/// carried over a session the gateway holds), and the file where the server
/// records its `wire_money` executions.
struct Lenient {
    gw: Gateway,
    record: PathBuf,
    _dir: tempfile::TempDir,
}

impl Lenient {
    fn start() -> Lenient {
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("runs.jsonl");
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/peers/lenient_server.py");
        let python = peer_python();
        let server = |name: &str, extra: &str| {
            format!(
                "\n[servers.{name}]\ncommand = \"{}\"\nargs = [\"{}\", \"{}\"{extra}]\n",
                python.display(),
                script.display(),
                record.display()
            )
        };
        let gw = Gateway::start_with(Options {
            extra: format!(
                "{}{}\n[metrics]\ntoken_sha256 = \"{}\"\n",
                server("lenient", ""),
                server("legacy", ", \"--handshake-only\""),
                sha(METRICS_TOKEN)
            ),
            ..Default::default()
        });
        Lenient {
            gw,
            record,
            _dir: dir,
        }
    }

    /// What the lenient server ran: (with an id, without one).
    fn wire_money_runs(&self) -> (usize, usize) {
        let text = std::fs::read_to_string(&self.record).unwrap_or_default();
        let runs: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let without = runs.iter().filter(|r| r["id"].is_null()).count();
        (runs.len() - without, without)
    }
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
    let l = Lenient::start();
    let Lenient { gw, .. } = &l;
    let c = listed(gw, "lenient").await;
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
    assert_eq!(l.wire_money_runs(), (0, 0));
    assert_eq!(refusals(gw, "tool_call_without_id").await, 1);
    // The same call as a request goes through the pipeline, and runs once.
    let call = c
        .call(3, "wire_money", json!({"to":"mallory","amount":900}))
        .await;
    assert_eq!(call.last()["result"]["isError"], false, "{call:?}");
    assert_eq!(l.wire_money_runs(), (1, 0));
    wait_for_audit(gw, "the refusal", |es| {
        es.iter()
            .any(|e| e["kind"] == "refused" && e["what"] == "tool_call_without_id")
    })
    .await;
}

#[tokio::test]
async fn a_method_spelled_like_tools_call_is_refused_and_never_runs() {
    let l = Lenient::start();
    let Lenient { gw, .. } = &l;
    let c = listed(gw, "lenient").await;
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
    assert_eq!(l.wire_money_runs(), (0, 0));
    assert_eq!(refusals(gw, "tool_call_lookalike").await, 3);
}

#[tokio::test]
async fn a_tool_call_without_an_id_in_a_batch_is_dropped_and_counted() {
    let l = Lenient::start();
    let Lenient { gw, .. } = &l;
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
    assert_eq!(l.wire_money_runs(), (0, 0));
    assert_eq!(refusals(gw, "tool_call_without_id").await, 1);
    assert_eq!(refusals(gw, "tool_call_lookalike").await, 1);
}

#[tokio::test]
async fn a_tool_call_without_an_id_in_the_stateless_era_never_reaches_a_lenient_server() {
    let l = Lenient::start();
    let Lenient { gw, .. } = &l;
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
    assert_eq!(l.wire_money_runs(), (0, 0));
    assert_eq!(refusals(gw, "tool_call_without_id").await, 2);
}

#[tokio::test]
async fn a_tool_call_without_an_id_through_the_stdio_bridge_never_reaches_a_lenient_server() {
    let l = Lenient::start();
    let Lenient { gw, .. } = &l;
    let mut b = Bridge::for_server(gw, "lenient", &[]);
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
    assert_eq!(l.wire_money_runs(), (0, 0));
    assert_eq!(refusals(gw, "tool_call_without_id").await, 1);
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
    proposal_id(&a)
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

/// Whether `text` holds a character a terminal would obey instead of
/// showing (a line break aside).
fn obeyed(text: &str) -> Option<char> {
    text.chars().find(|c| {
        (*c != '\n' && c.is_control())
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    })
}

#[tokio::test]
async fn show_and_pending_draw_a_deceiving_proposal_as_what_it_is() {
    let (pdir, alice) = default_policies_with_alice();
    let gw = Gateway::start_with(Options {
        policies: Some(pdir.path().to_owned()),
        ..Default::default()
    });
    let c = listed(&gw, "payments").await;
    // The key erases the real line above it and poses as `amount 9`.
    let args = json!({
        "account": "acct_1",
        "amount": 900,
        "zz\r\u{1b}[2K\u{1b}[1A\u{1b}[2K\r  amount              ": 9,
        "memo": "ok\u{7}\u{202e}9 tnuoma\u{200d}",
    });
    let held = c.call(1, "charge_card", args).await;
    assert_eq!(code(&held), "approval_pending", "{held:?}");
    let id = proposal_id(&held);
    let (ok, shown, err) = review_cli(&gw, &alice, &["show", &id]);
    assert!(ok, "{err}");
    assert_eq!(obeyed(&shown), None, "{shown}");
    let amount = shown
        .lines()
        .find(|l| l.trim_start().starts_with("amount"))
        .unwrap_or_else(|| panic!("{shown}"));
    assert!(amount.trim_end().ends_with(" 900"), "{amount}");
    assert!(
        shown.contains(
            r#""zz\u{d}\u{1b}[2K\u{1b}[1A\u{1b}[2K\u{d}  amount              " (unusual key) 9"#
        ),
        "{shown}"
    );
    assert!(
        shown.contains(r#""ok\u0007\u202e9 tnuoma\u200d""#),
        "{shown}"
    );
    let (ok, list, err) = review_cli(&gw, &alice, &["pending"]);
    assert!(ok, "{err}");
    assert_eq!(obeyed(&list), None, "{list}");
    assert!(list.contains(&id), "{list}");
    assert_eq!(gw.executions("charge_card"), 0);
}

#[tokio::test]
async fn a_batch_runs_no_more_than_the_rate_limits_burst() {
    let gw = Gateway::start_with(Options {
        limits: "requests_per_second = 1\nmax_batch_members = 500\n".into(),
        extra: format!("\n[metrics]\ntoken_sha256 = \"{}\"\n", sha(METRICS_TOKEN)),
        ..Default::default()
    });
    let mut c = Client::new(&gw.url("payments"));
    c.protocol = "2025-03-26".into();
    c.initialize().await;
    let batch: Vec<Value> = (0..500)
        .map(|i| {
            json!({"jsonrpc":"2.0","id":i,"method":"tools/call","params":{"name":"refund",
                "arguments":{"charge":format!("ch_{i}")}}})
        })
        .collect();
    // The limiter has to let the batch's POST itself in: wait as long as
    // its 429 says, then send it.
    let a = loop {
        let a = c.post(&Value::Array(batch.clone())).await;
        if a.status != 429 {
            break a;
        }
        let wait: u64 = a.headers["retry-after"].to_str().unwrap().parse().unwrap();
        tokio::time::sleep(std::time::Duration::from_secs(wait.max(1))).await;
    };
    assert_eq!(a.status, 200, "{a:?}");
    let answers = a.last().as_array().unwrap().clone();
    assert_eq!(answers.len(), 500);
    let limited = answers
        .iter()
        .filter(|m| {
            m["error"]["message"]
                .as_str()
                .is_some_and(|t| t.contains("too many requests"))
        })
        .count();
    let ran = gw.executions("refund");
    // A burst is twice the rate: 2. The POST took one.
    assert!(ran <= 2, "{ran} ran under a 1/s limit");
    assert_eq!(ran + limited, 500, "every member is answered");
    assert!(refusals(&gw, "rate_limited").await >= 498);
}

#[tokio::test]
async fn a_call_to_an_unlisted_lookalike_tool_is_refused_before_any_proposal() {
    let (pdir, alice) = default_policies_with_alice();
    let gw = Gateway::start_with(Options {
        policies: Some(pdir.path().to_owned()),
        ..Default::default()
    });
    let c = listed(&gw, "payments").await;
    for (id, name) in [
        (1, "ｃｈａｒｇｅ_card"),
        (2, "chаrge_card"),
        (3, "wire_money"),
    ] {
        let a = c
            .call(id, name, json!({"account":"acct_1","amount":900}))
            .await;
        assert_eq!(code(&a), "tool_unavailable", "{name}: {a:?}");
    }
    let a = c
        .call(
            4,
            "ｃｈａｒｇｅ_card",
            json!({"account":"acct_1","amount":900}),
        )
        .await;
    assert_eq!(countersign(&a)["looks_like"], "charge_card", "{a:?}");
    let (ok, list, err) = review_cli(&gw, &alice, &["pending"]);
    assert!(ok, "{err}");
    assert!(list.contains("no pending proposals"), "{list}");
    assert_eq!(gw.executions("charge_card"), 0);
}

#[tokio::test]
async fn a_line_with_a_key_twice_fails_audit_verify() {
    let mut gw = Gateway::start();
    let c = listed(&gw, "payments").await;
    let a = c.call(1, "refund", json!({"charge":"ch_1"})).await;
    assert_eq!(a.last()["result"]["isError"], false, "{a:?}");
    assert!(gw.terminate().success());
    let dir = gw.audit_dir();
    let (ok, out, err) = run_cli(&["audit", "verify", "--dir", dir.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    let segment = audit_segments(&dir).pop().unwrap();
    let text = std::fs::read_to_string(&segment).unwrap();
    let (at, line) = text
        .lines()
        .enumerate()
        .find(|(_, l)| {
            l.contains("\"kind\":\"call_received\"") && l.contains("\"tool\":\"refund\"")
        })
        .unwrap();
    let edited: Vec<String> = text
        .lines()
        .enumerate()
        .map(|(i, l)| {
            if i == at {
                format!("{{\"tool\":\"get_balance\",{}", &line[1..])
            } else {
                l.to_owned()
            }
        })
        .collect();
    std::fs::write(&segment, edited.join("\n") + "\n").unwrap();
    let (ok, out, err) = run_cli(&["audit", "verify", "--dir", dir.to_str().unwrap()]);
    assert!(!ok, "{out}{err}");
    let said = out + &err;
    assert!(said.contains("duplicate key `tool`"), "{said}");
}

#[tokio::test]
async fn a_csv_export_shows_agent_text_as_text_not_as_a_formula() {
    let mut gw = Gateway::start();
    let c = listed(&gw, "payments").await;
    let formula = "=HYPERLINK(\"http://evil.example\",\"click\")";
    let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"refund",
        "arguments":{"charge":"ch_1"},"_meta":{"dev.countersign/idempotency-key":formula}}});
    let a = c.post(&call).await;
    assert_eq!(a.last()["result"]["isError"], false, "{a:?}");
    assert!(gw.terminate().success());
    let dir = gw.audit_dir();
    let (ok, out, err) = run_cli(&[
        "audit",
        "export",
        "--format",
        "csv",
        "--dir",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let mut rows = csv::Reader::from_reader(out.as_bytes());
    let cells: Vec<String> = rows
        .records()
        .flat_map(|r| r.unwrap().iter().map(str::to_owned).collect::<Vec<_>>())
        .collect();
    assert!(
        cells.iter().any(|c| c == &format!("'{formula}")),
        "{cells:?}"
    );
    for cell in &cells {
        assert!(
            !cell.starts_with(['=', '+', '-', '@', '\t', '\r']),
            "a cell a spreadsheet would run: {cell}"
        );
    }
}

#[tokio::test]
async fn a_body_trickled_in_is_cut_off_and_nothing_runs() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let gw = Gateway::start_with(Options {
        gateway: "body_read_timeout = \"300ms\"\n".into(),
        extra: format!("\n[metrics]\ntoken_sha256 = \"{}\"\n", sha(METRICS_TOKEN)),
        ..Default::default()
    });
    let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"refund",
        "arguments":{"charge":"ch_1"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}})
    .to_string();
    let mut s = tokio::net::TcpStream::connect(&gw.addr).await.unwrap();
    let head = format!(
        "POST /mcp/payments HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {TOKEN}\r\n\
         content-type: application/json\r\naccept: application/json, text/event-stream\r\n\
         mcp-protocol-version: 2026-07-28\r\nmcp-method: tools/call\r\nmcp-name: refund\r\n\
         content-length: {}\r\n\r\n",
        gw.addr,
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    // One byte of the body, then nothing: the gateway answers on its own.
    s.write_all(&body.as_bytes()[..1]).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
        if answer.windows(4).any(|w| w == b"\r\n\r\n") && answer.ends_with(b"}") {
            break;
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_read_timeout"), "{answer}");
    assert_eq!(gw.executions("refund"), 0);
    assert_eq!(refusals(&gw, "body_timeout").await, 1);
}

#[tokio::test]
async fn refused_tokens_and_origins_are_counted_and_audited() {
    let l = Lenient::start();
    let Lenient { gw, .. } = &l;
    for _ in 0..3 {
        let r = reqwest::Client::new()
            .post(gw.url("payments"))
            .bearer_auth("forged-token")
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
    }
    let r = reqwest::Client::new()
        .post(gw.url("payments"))
        .bearer_auth(TOKEN)
        .header("origin", "https://evil.example")
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(refusals(gw, "token").await, 3);
    assert_eq!(refusals(gw, "origin").await, 1);
    // Repeated refusals: one audit entry per kind and interval, which
    // never holds the token.
    wait_for_audit(gw, "the refusals", |es| {
        es.iter()
            .any(|e| e["kind"] == "refused" && e["what"] == "token")
            && es
                .iter()
                .any(|e| e["kind"] == "refused" && e["what"] == "origin")
    })
    .await;
    let entries = audit_entries(&gw.audit_dir());
    let tokens: Vec<_> = entries
        .iter()
        .filter(|e| e["kind"] == "refused" && e["what"] == "token")
        .collect();
    assert_eq!(tokens.len(), 1, "{tokens:?}");
    assert!(!serde_json::to_string(&entries)
        .unwrap()
        .contains("forged-token"));
}

/// F4 (second attack): the notifications of a batch were relayed without
/// the rate limiter, so one HTTP request under 2/s became 20,000 messages
/// upstream. Every member now counts, and a batch has a cap.
#[tokio::test]
async fn f4_notifications_in_a_batch_are_rate_limited_and_a_batch_is_capped() {
    let gw = Gateway::start_with(Options {
        limits: "requests_per_second = 1\n".into(),
        ..Default::default()
    });
    let mut c = Client::new(&gw.url("payments"));
    c.protocol = "2025-03-26".into();
    c.initialize().await;
    let notes = |n: usize| -> Vec<Value> {
        (0..n)
            .map(|_| json!({"jsonrpc":"2.0","method":"notifications/roots/list_changed"}))
            .collect()
    };
    // Over the cap: refused whole, nothing relayed.
    let too_many = loop {
        let a = c.post(&Value::Array(notes(101))).await;
        if a.status != 429 {
            break a;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    };
    assert_eq!(too_many.status, 400, "{too_many:?}");
    assert!(
        too_many.response_text().contains("max_batch_members"),
        "{too_many:?}"
    );
    // At the cap: admitted, and no more relayed than the burst allows.
    let a = loop {
        let a = c.post(&Value::Array(notes(100))).await;
        if a.status != 429 {
            break a;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    };
    assert_eq!(a.status, 202, "{a:?}");
    // What reached the server: the example server records every
    // notifications/roots/list_changed it gets.
    let relayed = || {
        gw.records()
            .iter()
            .filter(|r| r["event"] == "notification")
            .count()
    };
    eventually("a relayed notification reached the server", || {
        relayed() >= 1
    })
    .await;
    assert!(relayed() <= 2, "{} of 100 relayed under 1/s", relayed());
}

/// F9 (second attack): the ledger, its journal, the decision inputs (full
/// arguments) and the audit files were created 0644. Every data file is now
/// the owner's only (0600) and every data folder 0700; `serve` warns of
/// older ones and `check` names them.
#[cfg(unix)]
#[tokio::test]
async fn f9_every_data_file_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let gw = Gateway::start_with(Options {
        extra: "\n[policy]\ninputs = true\n".into(),
        ..Default::default()
    });
    let c = listed(&gw, "payments").await;
    let a = c
        .call(7, "charge_card", json!({"account": "acct-1", "amount": 5}))
        .await;
    assert!(a.last()["result"].is_object(), "{a:?}");
    assert_eq!(gw.executions("charge_card"), 1);
    let data = gw.dir.path().join("data");
    eventually("the audit log and the inputs are written", || {
        data.join("audit").exists() && data.join("ledger.inputs.redb").exists()
    })
    .await;
    let mut seen = Vec::new();
    let mut stack = vec![data.clone()];
    while let Some(p) = stack.pop() {
        let meta = std::fs::symlink_metadata(&p).unwrap();
        let mode = meta.permissions().mode() & 0o777;
        if meta.is_dir() {
            assert_eq!(mode, 0o700, "{} is {mode:o}", p.display());
            stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        } else {
            assert_eq!(mode, 0o600, "{} is {mode:o}", p.display());
            seen.push(p.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    for name in ["ledger.redb", "ledger.inputs.redb", "gateway.key"] {
        assert!(seen.iter().any(|s| s == name), "{name} not among {seen:?}");
    }
    assert!(
        seen.iter().any(|s| s.ends_with(".jsonl")),
        "an audit segment: {seen:?}"
    );
    // A file others can read (made by hand, or by an older release):
    // `check` names it.
    let inputs = data.join("ledger.inputs.redb");
    std::fs::set_permissions(&inputs, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = gw.cli(&["check"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{} is readable by other users of this host: chmod 600 it",
            inputs.display()
        )),
        "{err}"
    );
}

/// A webhook receiver that keeps every body it is sent.
struct Hook {
    bodies: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Hook {
    async fn start() -> Hook {
        let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let kept = bodies.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |body: String| {
                let kept = kept.clone();
                async move {
                    kept.lock().unwrap().push(body);
                    axum::http::StatusCode::OK
                }
            }),
        );
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Hook { bodies, port, task }
    }

    fn bodies(&self) -> Vec<String> {
        self.bodies.lock().unwrap().clone()
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One run of F2's workload: held charges whose accounts are `accounts`
/// (each a revision of the one before), the last approved and run; then
/// everything that left the gateway's store, as text: the audit segments,
/// the three export formats, the webhook bodies, the exported spans and the
/// exported decision inputs. Also the full inputs export, which must hold
/// the accounts (what is redacted was there to redact).
async fn f2_run(accounts: &[String]) -> (Vec<(String, String)>, String, Vec<Value>) {
    const SECRET: &str = "whsec-f2-0123456789";
    let hook = Hook::start().await;
    let otlp = common::otlp::Receiver::start("ok");
    let (pdir, alice) = default_policies_with_alice();
    let mut gw = Gateway::start_with(Options {
        policies: Some(pdir.path().to_owned()),
        gateway_env: vec![("CS_WEBHOOK_SECRET".into(), SECRET.into())],
        extra: format!(
            "\n[audit]\narguments = \"redact\"\nredact = [\"/account\"]\n\
             \n[policy]\ninputs = true\n\
             \n[telemetry]\nendpoint = \"{}\"\nexport_interval = \"50ms\"\narguments = true\n\
             \n[notify]\n\n[[notify.webhooks]]\nname = \"ops\"\nurl = \"http://127.0.0.1:{}/hook\"\n\
             secret = {{ env = \"CS_WEBHOOK_SECRET\" }}\ninclude_arguments = true\n",
            otlp.endpoint(),
            hook.port
        ),
        ..Default::default()
    });
    let c = listed(&gw, "payments").await;
    let charge = |id: i64, account: &str, key: &str| {
        json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
            "name":"charge_card","arguments":{"account":account,"amount":12},
            "_meta":{"dev.countersign/idempotency-key":key}}})
    };
    let mut last = String::new();
    // One call (one key) resent with another account each time: each
    // proposal revises the one before, with the account in its diff.
    for (i, account) in accounts.iter().enumerate() {
        let held = c.post(&charge(i as i64 + 1, account, "f2")).await;
        assert_eq!(code(&held), "approval_pending", "{held:?}");
        last = proposal_id(&held);
    }
    let (ok, out, err) = review_cli(&gw, &alice, &["approve", &last]);
    assert!(ok, "{out}{err}");
    let n = accounts.len() - 1;
    let ran = c.post(&charge(100, &accounts[n], "f2")).await;
    assert_eq!(ran.last()["result"]["isError"], false, "{ran:?}");
    // Every sink has had its part: the revisions and the run in the log,
    // the created and decided events at the hook, the run's span.
    wait_for_audit(&gw, "the revisions and the run", |entries| {
        entries
            .iter()
            .filter(|e| e["kind"] == "proposal_revised")
            .count()
            == n
            && entries.iter().any(|e| e["kind"] == "completed")
    })
    .await;
    eventually("the webhook events", || {
        let b = hook.bodies();
        b.iter().filter(|b| b.contains("proposal_created")).count() == accounts.len()
            && b.iter().any(|b| b.contains("proposal_decided"))
    })
    .await;
    otlp.wait("the run's span", |spans| {
        spans.iter().any(|s| {
            s["kind"] == "SPAN_KIND_SERVER"
                && s["name"] == "tools/call charge_card"
                && !s["attributes"]["gen_ai.tool.call.arguments"].is_null()
        })
    });
    gw.wait_for_log("decision inputs are kept").await;
    gw.terminate();
    let mut sinks = Vec::new();
    for entry in std::fs::read_dir(gw.audit_dir()).unwrap() {
        let path = entry.unwrap().path();
        if let Ok(text) = std::fs::read_to_string(&path) {
            sinks.push((format!("audit file {}", path.display()), text));
        }
    }
    for format in ["jsonl", "csv", "ocsf"] {
        let out = std::process::Command::new(countersign_bin())
            .args(["audit", "export", "--format", format, "--dir"])
            .arg(gw.audit_dir())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        sinks.push((
            format!("audit export --format {format}"),
            String::from_utf8(out.stdout).unwrap(),
        ));
    }
    for (i, body) in hook.bodies().into_iter().enumerate() {
        sinks.push((format!("webhook body {i}"), body));
    }
    for (i, e) in otlp.exports().into_iter().enumerate() {
        use base64::Engine;
        let raw = base64::engine::general_purpose::STANDARD
            .decode(e["raw"].as_str().unwrap())
            .unwrap();
        sinks.push((
            format!("OTLP export {i}"),
            format!("{e}\n{}", String::from_utf8_lossy(&raw)),
        ));
    }
    let inputs = gw.cli(&["policy", "inputs", "export"]);
    assert!(inputs.status.success(), "{inputs:?}");
    sinks.push((
        "policy inputs export".into(),
        String::from_utf8(inputs.stdout).unwrap(),
    ));
    let full = gw.cli(&["policy", "inputs", "export", "--full"]);
    assert!(full.status.success(), "{full:?}");
    let spans = otlp.spans();
    (sinks, String::from_utf8(full.stdout).unwrap(), spans)
}

/// F2 (second attack): with `audit.arguments = "redact"`, a revision's
/// `changes` carried the redacted values' `before` and `after` in clear
/// into the hash-chained log. One redaction function now serves every
/// sink; this property holds for any accounts: none of them appears in
/// the log, its exports, the webhooks, the traces or the inputs export,
/// and each appears there as its digest.
#[test]
fn f2_no_redacted_value_reaches_the_log_the_exports_the_webhooks_or_the_traces() {
    use proptest::prelude::*;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 3,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &proptest::collection::vec("acct_[a-z0-9]{12}", 2..4),
            |accounts| {
                let (sinks, full, spans) = rt.block_on(f2_run(&accounts));
                for account in &accounts {
                    for (name, text) in &sinks {
                        let line = text.lines().find(|l| l.contains(account.as_str()));
                        prop_assert!(line.is_none(), "{account} in {name}: {line:?}");
                    }
                    // It was there to redact, and its digest stands for it.
                    prop_assert!(full.contains(account.as_str()), "{account} kept: {full}");
                    let digest = format!(
                        "sha256:{}",
                        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
                            format!("\"{account}\"").as_bytes()
                        ))
                    );
                    let log = &sinks
                        .iter()
                        .find(|(n, _)| n == "audit export --format jsonl")
                        .unwrap()
                        .1;
                    prop_assert!(log.contains(&digest), "{account}'s digest in the log");
                }
                // The revisions' changes are there, their values digests.
                let log = &sinks
                    .iter()
                    .find(|(n, _)| n == "audit export --format jsonl")
                    .unwrap()
                    .1;
                let revised: Vec<Value> = log
                    .lines()
                    .map(|l| serde_json::from_str::<Value>(l).unwrap())
                    .filter(|e| e["kind"] == "proposal_revised")
                    .collect();
                prop_assert_eq!(revised.len(), accounts.len() - 1);
                for r in &revised {
                    let change = &r["revises"]["changes"][0];
                    prop_assert_eq!(&change["pointer"], "/account");
                    prop_assert!(change["before"].as_str().unwrap().starts_with("sha256:"));
                    prop_assert!(change["after"].as_str().unwrap().starts_with("sha256:"));
                }
                // The webhook keeps the arguments it asked for, less the
                // redacted value; the span keeps the rest of them too.
                let hooks: Vec<&String> = sinks
                    .iter()
                    .filter(|(n, _)| n.starts_with("webhook"))
                    .map(|(_, t)| t)
                    .collect();
                prop_assert!(hooks.iter().all(|b| b.contains("\"amount\":12")));
                let span = spans
                    .iter()
                    .find(|s| {
                        s["name"] == "tools/call charge_card"
                            && !s["attributes"]["gen_ai.tool.call.arguments"].is_null()
                    })
                    .unwrap();
                let shown = span["attributes"]["gen_ai.tool.call.arguments"]
                    .as_str()
                    .unwrap();
                prop_assert!(
                    shown.contains("\"account\":\"sha256:") && shown.contains("\"amount\":12"),
                    "{}",
                    shown
                );
                Ok(())
            },
        )
        .unwrap();
}

/// A reviewer entry made by the real `countersign keygen`, of tenant
/// `acme` and group `leads`, with `extra` lines; returns the key's path.
fn add_reviewer(dir: &std::path::Path, name: &str, extra: &str) -> PathBuf {
    let (key, entry) = lead_of_acme(dir, name);
    let file = dir.join("reviewers.toml");
    let mut text = std::fs::read_to_string(&file).unwrap_or_default();
    text.push_str(&format!("\n{}\n{extra}\n", entry.trim_end()));
    std::fs::write(&file, text).unwrap();
    key
}

/// F5 (second attack): reviewer `henry` approved the write of his own agent
/// `idp:henry`: the guard compared the reviewer's name with the principal,
/// and an issuer's principal always holds a `:`. The requester's subject,
/// its token's `email` and a reviewer's `principals` are now compared too,
/// by every surface (the CLI here; the console and the TUI decide through
/// the same control path), against a real OpenID provider.
#[tokio::test]
async fn f5_a_reviewer_never_approves_the_call_of_their_own_identity_provider_principal() {
    use common::idp::*;
    let dir = tempfile::tempdir().unwrap();
    let idp = provider(free_port(), &dir.path().join("keys.json"), "k1");
    let (pdir, alice) = default_policies_with_alice();
    // The same person three ways: by subject (the reviewer's name is the
    // token's `sub`), by a listed principal, by the token's `email`.
    let by_subject = add_reviewer(pdir.path(), "agent-bob", "");
    let by_principal = add_reviewer(pdir.path(), "bobby", "principals = [\"corp:agent-bob\"]");
    let by_email = add_reviewer(pdir.path(), "robert", "principals = [\"bob@acme.example\"]");
    let gw = Gateway::start_with(Options {
        policies: Some(pdir.path().to_owned()),
        extra: format!(
            "\n[[auth.issuers]]\nname = \"corp\"\nissuer = \"{}\"\ntenant_claim = \"tid\"\n",
            issuer(idp.port)
        ),
        ..Default::default()
    });
    let resource = format!("{}/mcp/payments", gw.base());
    let mut c = Client::new(&gw.url("payments"));
    c.token = token_as(idp.port, "agent-bob", "bob-secret", &resource).await;
    let init = c.initialize().await;
    assert_eq!(init.status, 200, "{init:?}");
    let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
        "name":"charge_card","arguments":{"account":"a","amount":12},
        "_meta":{"dev.countersign/idempotency-key":"f5-1"}}});
    let held = c.post(&call).await;
    assert_eq!(code(&held), "approval_pending", "{held:?}");
    let id = proposal_id(&held);
    for (who, key) in [
        ("agent-bob", &by_subject),
        ("bobby", &by_principal),
        ("robert", &by_email),
    ] {
        let (ok, out, err) = review_cli(&gw, key, &["approve", &id]);
        assert!(!ok, "{who} approved their own call: {out}");
        assert!(
            err.contains("nobody approves their own call"),
            "{who}: {err}"
        );
    }
    let still = c.post(&call).await;
    assert_eq!(code(&still), "approval_pending", "{still:?}");
    assert_eq!(gw.executions("charge_card"), 0);
    // Someone else's yes runs it.
    let (ok, out, err) = review_cli(&gw, &alice, &["approve", &id]);
    assert!(ok, "{out}{err}");
    let ran = c.post(&call).await;
    assert_eq!(ran.last()["result"]["isError"], false, "{ran:?}");
    assert_eq!(gw.executions("charge_card"), 1);
}

/// F3 (second attack): the console's POST routes read bodies with no
/// deadline, and 1,030 slow uploads by nobody signed in held every
/// connection: agents were answered 503. Now every route's body has one
/// deadline from the request's start, and console requests share a budget
/// of their own: past it they are answered 503 and closed. With 30 slow
/// uploads against 24 connections and a console budget of 3, an agent's
/// call goes through, and the 3 uploads let in are cut at the deadline.
#[tokio::test]
async fn f3_slow_console_uploads_never_hold_the_connections_agents_need() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let gw = Gateway::start_with(Options {
        gateway: "body_read_timeout = \"2s\"\n".into(),
        limits: "max_connections = 24\nmax_console_requests = 3\n".into(),
        extra: format!(
            "\n[review]\nenabled = true\n\n[metrics]\ntoken_sha256 = \"{}\"\n",
            sha(METRICS_TOKEN)
        ),
        ..Default::default()
    });
    let finished = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut held = Vec::new();
    for _ in 0..30 {
        let mut s = tokio::net::TcpStream::connect(&gw.addr).await.unwrap();
        let head = format!(
            "POST /review/sign-in HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
             content-length: 1000\r\n\r\n{{",
            gw.addr
        );
        // Refused at once, the gateway may have closed it already.
        let _ = s.write_all(head.as_bytes()).await;
        let finished = finished.clone();
        held.push(tokio::spawn(async move {
            let mut answer = Vec::new();
            let _ = s.read_to_end(&mut answer).await;
            finished
                .lock()
                .unwrap()
                .push(String::from_utf8_lossy(&answer).into_owned());
        }));
    }
    // All but the budget's three are answered and closed.
    eventually("27 uploads answered", || {
        finished.lock().unwrap().len() == 27
    })
    .await;
    let answers = finished.lock().unwrap().clone();
    assert!(
        answers.iter().all(|a| a.starts_with("HTTP/1.1 503")),
        "{answers:?}"
    );
    assert!(
        answers
            .iter()
            .any(|a| a.contains("limits.max_console_requests")),
        "the console's own budget refused some: {answers:?}"
    );
    // The three hold their permits, and an agent still gets through.
    let c = listed(&gw, "payments").await;
    let a = c.call(1, "get_balance", json!({"account": "acct-1"})).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.last()["result"]["isError"], false, "{a:?}");
    // At the deadline the three are cut off, with a 408 that says why.
    for h in held {
        h.await.unwrap();
    }
    let answers = finished.lock().unwrap().clone();
    let cut: Vec<&String> = answers
        .iter()
        .filter(|a| a.starts_with("HTTP/1.1 408"))
        .collect();
    assert_eq!(cut.len(), 3, "{answers:?}");
    assert!(
        cut.iter().all(|a| a.contains("body_read_timeout")),
        "{cut:?}"
    );
    assert!(refusals(&gw, "console_busy").await >= 1);
    assert_eq!(refusals(&gw, "body_timeout").await, 3);
}

/// F11 (second attack): a value that mixes scripts (`pаypal.com`, a
/// Cyrillic `а`) or looks like ASCII text it is not (fullwidth digits) was
/// shown with no warning. `pending` flags it and `show` marks it beside the
/// value (the console: `tests/console.rs` `f11_…`; the TUI reads the same
/// flags, and the in-client question and the webhooks' sentences carry the
/// same marks).
#[tokio::test]
async fn f11_values_that_could_pass_for_others_are_flagged_to_reviewers() {
    let (pdir, alice) = default_policies_with_alice();
    let gw = Gateway::start_with(Options {
        policies: Some(pdir.path().to_owned()),
        ..Default::default()
    });
    let c = listed(&gw, "payments").await;
    let a = c
        .post(
            &json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"transfer",
            "arguments":{"from":"acct_1","to":"p\u{430}ypal.com","amount":5,"memo":"\u{ff11}00"},
            "_meta":{"dev.countersign/idempotency-key":"f11-1"}}}),
        )
        .await;
    assert_eq!(code(&a), "approval_pending", "{a:?}");
    let id = proposal_id(&a);
    let (ok, pending, err) = review_cli(&gw, &alice, &["pending"]);
    assert!(ok, "{err}");
    assert!(
        pending.contains(r"/to mixed scripts: p\u{430}ypal.com"),
        "{pending}"
    );
    assert!(
        pending.contains(r"/memo looks like ASCII: \u{ff11}00"),
        "{pending}"
    );
    let (ok, shown, err) = review_cli(&gw, &alice, &["show", &id]);
    assert!(ok, "{err}");
    let line = shown
        .lines()
        .find(|l| l.trim_start().starts_with("to "))
        .unwrap();
    assert!(
        line.contains(r"(mixed scripts: p\u{430}ypal.com)"),
        "{shown}"
    );
    // A plain value is not marked.
    let from = shown
        .lines()
        .find(|l| l.trim_start().starts_with("from "))
        .unwrap();
    assert!(!from.contains('('), "{shown}");
}
