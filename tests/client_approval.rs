//! Approval in the client (DESIGN.md section 14) through the real gateway,
//! the example server, and the official Python MCP SDK as the client, in
//! both wire eras: `elicitation/create` in a session, `input_required` with
//! a signed `requestState` in 2026-07-28. The shipped policies let `dev-1`
//! (group `solo`) confirm non-destructive calls; reviewer `alice` (group
//! `leads`) approves anything but her own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// The SDK's two eras: its `mode` and the version it must negotiate.
const ERAS: [(&str, &str); 2] = [("legacy", "2025-11-25"), ("auto", "2026-07-28")];

fn gateway() -> (Gateway, tempfile::TempDir, std::path::PathBuf) {
    let (pdir, key) = default_policies_with_alice();
    let gw = Gateway::start_with(Options {
        policies: Some(pdir.path().to_owned()),
        // Held while the person answers (handshake era).
        approvals: "hold = \"30s\"\nprogress_interval = \"300ms\"\n".into(),
        ..Default::default()
    });
    (gw, pdir, key)
}

/// One call by the SDK as `dev-1`; what it saw.
fn client(
    gw: &Gateway,
    mode: &str,
    tool: &str,
    key: &str,
    answer: &str,
    go: Option<&Path>,
) -> Value {
    client_in_background(gw, mode, tool, key, answer, go)
        .join()
        .unwrap()
}

/// One call by the SDK as `dev-1`, on a thread of its own (while the test
/// plays the reviewer).
fn client_in_background(
    gw: &Gateway,
    mode: &str,
    tool: &str,
    key: &str,
    answer: &str,
    go: Option<&Path>,
) -> std::thread::JoinHandle<Value> {
    let url = gw.url("payments");
    let owned: Vec<String> = [url.as_str(), SOLO_TOKEN, mode, tool, key, answer]
        .iter()
        .map(|s| (*s).to_owned())
        .chain(go.map(|p| p.display().to_string()))
        .collect();
    std::thread::spawn(move || {
        let args: Vec<&str> = owned.iter().map(String::as_str).collect();
        let (ok, out, err) = run_peer_script("confirm_client.py", &args);
        assert!(ok, "the SDK client failed:\nstdout: {out}\nstderr: {err}");
        serde_json::from_str(out.lines().last().unwrap_or("")).unwrap()
    })
}

/// The id of the pending proposal of `tool`, as reviewer alice lists it
/// (waits for it to appear).
fn pending_proposal(gw: &Gateway, alice: &Path, tool: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let (ok, out, err) = review_cli(gw, alice, &["pending", "--json"]);
        assert!(ok, "{err}");
        let listed: Value = serde_json::from_str(&out).unwrap();
        let found = listed["proposals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["tool"] == tool && p["state"] == "pending")
            .and_then(|p| p["id"].as_str().map(str::to_owned));
        if let Some(id) = found {
            return id;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no pending proposal for {tool}");
}

/// Audit entries of `kind` (for `proposal`), once at least `n` are written
/// (the writer is asynchronous), or all there are after 10 s.
fn audited(
    gw: &Gateway,
    kind: &str,
    proposal: Option<&str>,
    n: usize,
) -> Vec<serde_json::Map<String, Value>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found: Vec<_> = audit_entries(&gw.audit_dir())
            .into_iter()
            .filter(|e| e["kind"] == kind)
            .filter(|e| {
                proposal.is_none_or(|p| e.get("proposal_id").and_then(Value::as_str) == Some(p))
            })
            .collect();
        if found.len() >= n || Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn code_of(seen: &Value) -> &str {
    seen["structured"]["countersign"]["code"]
        .as_str()
        .unwrap_or("")
}

#[test]
fn the_person_at_the_client_approves_and_the_write_runs_once() {
    let (gw, _p, _alice) = gateway();
    for (n, (mode, version)) in ERAS.iter().enumerate() {
        let seen = client(
            &gw,
            mode,
            "charge_card",
            &format!("yes-{mode}"),
            "accept",
            None,
        );
        assert_eq!(seen["protocol_version"], *version, "{seen}");
        let asked = seen["asked"].as_array().unwrap();
        assert_eq!(asked.len(), 1, "asked once: {seen}");
        let message = asked[0]["message"].as_str().unwrap();
        assert!(
            message.contains("dev-1 of acme wants payments/charge_card (a write)"),
            "{message}"
        );
        assert!(
            message.contains(r#"{"account":"acct_7","amount":3}"#),
            "the canonical copy: {message}"
        );
        assert_eq!(asked[0]["schema"]["required"], json!(["approve"]), "{seen}");
        assert_eq!(seen["is_error"], false, "{seen}");
        assert!(
            seen["text"]
                .as_str()
                .unwrap()
                .starts_with("charged 3 to acct_7"),
            "{seen}"
        );
        assert_eq!(gw.executions("charge_card"), n + 1, "{mode}: once");
    }
    let granted = audited(&gw, "approval_granted", None, 2);
    assert_eq!(granted.len(), 2, "{granted:?}");
    for e in &granted {
        assert_eq!(e["channel"], "client");
        assert_eq!(e["confirmation"]["principal"], "dev-1");
        assert_eq!(e["confirmation"]["reason"], "my own agent");
    }
    let vias: Vec<&str> = granted
        .iter()
        .map(|e| e["confirmation"]["via"].as_str().unwrap())
        .collect();
    assert_eq!(vias, ["elicitation/create", "input_required"]);
    let consumed = audited(&gw, "approval_consumed", None, 2);
    assert_eq!(consumed.len(), 2, "each yes used once: {consumed:?}");
    assert!(consumed
        .iter()
        .all(|e| e["approval"]["channel"] == "client"));
    // The log with client-channel entries verifies.
    let dir = gw.audit_dir().display().to_string();
    let (ok, out, err) = run_cli(&["audit", "verify", "--dir", &dir]);
    assert!(ok, "{out}{err}");
}

/// A desktop client behind the stdio bridge (`countersign stdio`) is asked
/// too: the bridge relays the question and posts the answer back.
#[test]
fn a_client_behind_the_stdio_bridge_is_asked_and_its_yes_runs_the_call() {
    let (gw, _p, _alice) = gateway();
    let via = format!(
        "stdio|{}|{}|payments",
        countersign_bin().display(),
        gw.base()
    );
    for (n, (mode, version)) in ERAS.iter().enumerate() {
        let (ok, out, err) = run_peer_script(
            "confirm_client.py",
            &[
                &via,
                SOLO_TOKEN,
                mode,
                "charge_card",
                &format!("bridge-{mode}"),
                "accept",
            ],
        );
        assert!(ok, "{out}{err}");
        let seen: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        assert_eq!(seen["protocol_version"], *version, "{seen}");
        assert_eq!(seen["asked"].as_array().unwrap().len(), 1, "{seen}");
        assert_eq!(seen["is_error"], false, "{seen}");
        assert_eq!(gw.executions("charge_card"), n + 1);
    }
}

#[test]
fn a_decline_is_approval_denied_and_nothing_runs() {
    let (gw, _p, _alice) = gateway();
    // Other calls per era: a denied proposal refuses the identical call
    // again without asking.
    for ((mode, _), tool) in ERAS.iter().zip(["charge_card", "refund"]) {
        let seen = client(&gw, mode, tool, &format!("no-{mode}"), "decline", None);
        assert_eq!(seen["asked"].as_array().unwrap().len(), 1, "{seen}");
        assert_eq!(seen["is_error"], true, "{seen}");
        assert_eq!(code_of(&seen), "approval_denied", "{seen}");
        assert_eq!(
            seen["structured"]["countersign"]["channel"], "client",
            "{seen}"
        );
        assert!(
            seen["text"]
                .as_str()
                .unwrap()
                .contains("the person at the client declined"),
            "{seen}"
        );
    }
    assert_eq!(gw.executions("charge_card") + gw.executions("refund"), 0);
    let denied = audited(&gw, "approval_denied", None, 2);
    assert_eq!(denied.len(), 2);
    assert!(denied.iter().all(|e| e["channel"] == "client"));
}

/// Destructive tools are never put to the client under the shipped
/// policies, and a client that declares no elicitation is never asked:
/// both wait for a reviewer, exactly as before.
#[test]
fn destructive_tools_and_clients_without_elicitation_need_a_reviewer() {
    let (gw, _p, alice) = gateway();
    for (mode, _) in ERAS {
        for (tool, answer) in [("close_account", "accept"), ("charge_card", "none")] {
            let call =
                client_in_background(&gw, mode, tool, &format!("rev-{mode}-{tool}"), answer, None);
            let id = pending_proposal(&gw, &alice, tool);
            let (ok, out, err) = review_cli(&gw, &alice, &["approve", &id]);
            assert!(ok, "{out}{err}");
            let seen = call.join().unwrap();
            assert_eq!(
                seen["asked"],
                json!([]),
                "{mode} {tool}: never asked in the client: {seen}"
            );
            assert_eq!(seen["is_error"], false, "{mode} {tool}: {seen}");
        }
    }
    assert_eq!(gw.executions("close_account"), 2);
    assert_eq!(gw.executions("charge_card"), 2);
    let granted = audited(&gw, "approval_granted", None, 4);
    assert_eq!(granted.len(), 4);
    // Written before the grants they would precede: none was asked.
    assert!(audited(&gw, "confirmation_asked", None, 0).is_empty());
    assert!(granted
        .iter()
        .all(|e| e["channel"] == "reviewer" && e["reviewer"] == "alice"));
}

/// A reviewer and the person at the client both answer one proposal:
/// whichever answer lands first wins, the call runs once, and the other
/// answer is reported as too late.
#[test]
fn a_reviewer_and_the_client_both_answer_and_exactly_one_wins() {
    let (gw, _p, alice) = gateway();
    // The reviewer first: the client's callback waits for the go.
    for (mode, _) in ERAS {
        let go = gw.faults_path().with_file_name(format!("go-{mode}"));
        let call = client_in_background(
            &gw,
            mode,
            "charge_card",
            &format!("race-{mode}"),
            "accept",
            Some(&go),
        );
        let id = pending_proposal(&gw, &alice, "charge_card");
        let (ok, out, err) = review_cli(&gw, &alice, &["approve", &id]);
        assert!(ok, "{out}{err}");
        std::fs::write(&go, "").unwrap();
        let seen = call.join().unwrap();
        assert_eq!(seen["is_error"], false, "{mode}: {seen}");
        assert_eq!(seen["asked"].as_array().unwrap().len(), 1, "{mode}: {seen}");
        let late = audited(&gw, "confirmation_too_late", Some(&id), 1);
        assert_eq!(
            late.len(),
            1,
            "{mode}: the client's late yes is recorded: {late:?}"
        );
        assert!(
            late[0]["reason"]
                .as_str()
                .unwrap()
                .contains("reviewer alice answered first"),
            "{late:?}"
        );
    }
    assert_eq!(gw.executions("charge_card"), 2, "one execution per call");
    // The client first: the reviewer is told it is too late.
    let seen = client(&gw, "legacy", "charge_card", "client-first", "accept", None);
    assert_eq!(seen["is_error"], false, "{seen}");
    let granted = audited(&gw, "approval_granted", None, 3);
    let id = granted
        .iter()
        .find(|e| e["channel"] == "client")
        .and_then(|e| e["proposal_id"].as_str())
        .unwrap()
        .to_owned();
    let (ok, out, err) = review_cli(&gw, &alice, &["approve", &id]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("too late") && err.contains("the person at the client (dev-1)"),
        "{err}"
    );
    assert_eq!(gw.executions("charge_card"), 3);
}

fn modern_call(args: Value, key: &str, reply: Option<(&str, Value)>) -> Value {
    let mut params = json!({
        "name": "charge_card",
        "arguments": args,
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
            "dev.countersign/idempotency-key": key,
        },
    });
    if let Some((state, response)) = reply {
        params["requestState"] = json!(state);
        params["inputResponses"] = json!({ "dev.countersign/confirm": response });
    }
    json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": params})
}

async fn send(gw: &Gateway, body: &Value) -> Value {
    let a = answer(
        modern_post_as(&gw.url("payments"), body, SOLO_TOKEN)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
    a.last()["result"].clone()
}

/// On the wire, a `requestState` altered by one byte, sent with another
/// call, replayed after its use, or presented by another principal is
/// refused with its own code, and none of them runs anything.
#[tokio::test]
async fn request_states_that_are_altered_moved_or_replayed_are_refused_on_the_wire() {
    let (gw, _p, _alice) = gateway();
    let yes = json!({"action": "accept", "content": {"approve": true}});
    let args = json!({"account": "acct_7", "amount": 4});
    let first = send(&gw, &modern_call(args.clone(), "w-1", None)).await;
    assert_eq!(first["resultType"], "input_required", "{first}");
    let state = first["requestState"].as_str().unwrap().to_owned();
    let mut bytes = state.clone().into_bytes();
    let at = bytes.len() - 10;
    bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
    let altered = String::from_utf8(bytes).unwrap();
    let r = send(
        &gw,
        &modern_call(args.clone(), "w-1", Some((&altered, yes.clone()))),
    )
    .await;
    assert_eq!(
        r["structuredContent"]["countersign"]["code"], "confirmation_invalid",
        "{r}"
    );
    let other = json!({"account": "acct_7", "amount": 40});
    let r = send(&gw, &modern_call(other, "w-2", Some((&state, yes.clone())))).await;
    assert_eq!(
        r["structuredContent"]["countersign"]["code"], "confirmation_mismatch",
        "{r}"
    );
    assert!(
        r["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("call_digest"),
        "{r}"
    );
    // Another identity (agent-7) presenting dev-1's state.
    let a = answer(
        modern_post(
            &gw.url("payments"),
            &modern_call(args.clone(), "w-1", Some((&state, yes.clone()))),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(
        a.last()["result"]["structuredContent"]["countersign"]["code"],
        "confirmation_mismatch",
        "{a:?}"
    );
    assert_eq!(gw.executions("charge_card"), 0);
    let r = send(
        &gw,
        &modern_call(args.clone(), "w-1", Some((&state, yes.clone()))),
    )
    .await;
    assert_ne!(r["isError"], json!(true), "the genuine answer runs it: {r}");
    assert!(
        r["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("charged 4"),
        "{r}"
    );
    let r = send(&gw, &modern_call(args.clone(), "w-1", Some((&state, yes)))).await;
    assert_eq!(
        r["structuredContent"]["countersign"]["code"], "confirmation_used",
        "{r}"
    );
    assert_eq!(gw.executions("charge_card"), 1);
    let rejected = audited(&gw, "rejected", None, 4);
    let reasons: Vec<&str> = rejected
        .iter()
        .filter_map(|e| e["reason"].as_str())
        .collect();
    for code in [
        "confirmation_invalid",
        "confirmation_mismatch",
        "confirmation_used",
    ] {
        assert!(reasons.contains(&code), "{code} audited: {reasons:?}");
    }
}

/// The same refusals with the Python SDK sending the state back by hand
/// (its session API): altered by one byte, with another call, expired (a
/// state the test signs with the gateway's own key, so only the expiry is
/// wrong), then the genuine answer, then that answer again.
#[test]
fn the_python_sdk_sending_altered_moved_expired_and_used_states_is_refused() {
    use std::io::{BufRead, Write};
    let (gw, _p, _alice) = gateway();
    let script =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/peers/state_client.py");
    let mut child = std::process::Command::new(peer_python())
        .arg(script)
        .args([gw.url("payments").as_str(), SOLO_TOKEN])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let first: Value = serde_json::from_str(&line).unwrap_or_else(|e| {
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        panic!("{e}: {line} {err}")
    });
    assert_eq!(first["protocol_version"], "2026-07-28");
    let state = first["state"].as_str().unwrap();
    let mut claims = countersign::core::confirm::open(state).unwrap().claims;
    claims.expires_ms = countersign::core::time::now_ms() - 1_000;
    let key = countersign::audit::log::load_or_create_key(&gw.audit_dir()).unwrap();
    let expired = countersign::core::confirm::seal(&claims, &key);
    writeln!(child.stdin.take().unwrap(), "{expired}").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{line}");
    let results: Value = serde_json::from_str(&line).unwrap();
    let r = results["results"].as_array().unwrap();
    assert_eq!(r[0], "confirmation_invalid", "{r:?}");
    assert_eq!(r[1], "confirmation_mismatch", "{r:?}");
    assert_eq!(r[2], "confirmation_expired", "{r:?}");
    assert!(
        r[3].as_str()
            .unwrap()
            .starts_with("ran: charged 5 to acct_7"),
        "{r:?}"
    );
    assert_eq!(r[4], "confirmation_used", "{r:?}");
    assert_eq!(gw.executions("charge_card"), 1, "nothing refused ran");
}

/// A call that needs two reviewers is never put to the person at the
/// client, in either era: their yes would be the requester's own, which
/// never counts towards a quorum. It waits for reviewers, and nothing runs.
#[test]
fn a_call_that_needs_two_reviewers_is_never_put_to_the_client() {
    let (pdir, _alice) = default_policies_with_alice();
    std::fs::write(
        pdir.path().join("four-eyes.cedar"),
        "@id(\"charges-need-two\")\n@approvals(\"2\")\n\
         permit (principal, action == Action::\"call\", resource == Tool::\"payments/charge_card\")\n\
         when { context.approved };\n",
    )
    .unwrap();
    let gw = Gateway::start_with(Options {
        policies: Some(pdir.path().to_owned()),
        approvals: "hold = \"1s\"\nprogress_interval = \"300ms\"\n".into(),
        ..Default::default()
    });
    for (mode, _) in ERAS {
        let seen = client(
            &gw,
            mode,
            "charge_card",
            &format!("two-{mode}"),
            "accept",
            None,
        );
        assert_eq!(seen["asked"], json!([]), "{mode}: never asked: {seen}");
        assert_eq!(code_of(&seen), "approval_pending", "{mode}: {seen}");
    }
    assert!(audited(&gw, "confirmation_asked", None, 0).is_empty());
    assert_eq!(gw.executions("charge_card"), 0);
}
