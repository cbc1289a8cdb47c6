//! Numbers exact to the last bit, against the real gateway: a number an
//! agent sends reaches the server as the double it named, with the digest an
//! independent RFC 8785 implementation gives; a replay and a cached read
//! carry the server's own bytes (its numbers, its escapes), both eras; and a
//! reviewer sees the agent's number, not a neighbour.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::PathBuf;

use common::*;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// The canonical text of `v` by npm's `canonicalize` (run by Node in
/// `.ci/cache/jcs`, where `.ci/setup-peers` installs it).
fn their_jcs(v: &Value) -> String {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("v.json");
    // One element: the script prints each element's canonical text.
    std::fs::write(&file, format!("[{v}]")).unwrap();
    let out = std::process::Command::new("node")
        .current_dir(peers_cache().join("jcs"))
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/peers/jcs_numbers.mjs"))
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim_end().to_owned()
}

#[tokio::test]
async fn an_agents_seventeen_digit_amount_reaches_the_server_as_the_same_double() {
    let gw = Gateway::start();
    let c = listed(&gw, "payments").await;
    for (id, amount) in [(1, "1944.4099999999999"), (2, "1825.4299999999998")] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"charge_card","arguments":{{"account":"acct_1","amount":{amount}}}}}}}"#
        );
        let a = c.post_raw(body).await;
        assert_eq!(a.last()["result"]["isError"], false, "{a:?}");
        // The text the server received names the agent's double.
        let record = gw
            .records()
            .into_iter()
            .rfind(|r| r["event"] == "executed" && r["tool"] == "charge_card")
            .unwrap();
        let raw = record["raw_arguments"].as_str().unwrap().to_owned();
        assert_eq!(raw, format!(r#"{{"account":"acct_1","amount":{amount}}}"#));
        // The digest is the one an independent JCS gives for the agent's
        // own arguments.
        let sent: Value = serde_json::from_str(&format!(
            r#"{{"server":"payments","tool":"charge_card","arguments":{{"account":"acct_1","amount":{amount}}}}}"#
        ))
        .unwrap();
        let independent = format!("sha256:{}", hex::encode(Sha256::digest(their_jcs(&sent))));
        wait_for_audit(&gw, "the call's digest", |es| {
            es.iter()
                .any(|e| e["kind"] == "call_received" && e["call_digest"] == independent.as_str())
        })
        .await;
    }
}

#[tokio::test]
async fn a_reviewer_sees_the_agents_number_not_a_neighbour() {
    let (pdir, alice) = default_policies_with_alice();
    let gw = Gateway::start_with(Options {
        policies: Some(pdir.path().to_owned()),
        ..Default::default()
    });
    let c = listed(&gw, "payments").await;
    let held = c
        // The shipped schema types `amount` as a Cedar decimal (four
        // places): a rate the schema leaves untyped carries the 17 digits.
        .post_raw(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge_card","arguments":{"account":"acct_1","amount":12,"fx_rate":1944.4099999999999}}}"#)
        .await;
    assert_eq!(code(&held), "approval_pending", "{held:?}");
    let id = proposal_id(&held);
    let (ok, shown, err) = review_cli(&gw, &alice, &["show", &id]);
    assert!(ok, "{err}");
    assert!(
        shown.contains("fx_rate 1944.4099999999999"),
        "the sentence: {shown}"
    );
    let line = shown
        .lines()
        .find(|l| l.trim_start().starts_with("fx_rate"))
        .unwrap();
    assert!(line.trim_end().ends_with(" 1944.4099999999999"), "{line}");
}

/// A gateway with PyPI's `json-rpc`-based server as `lenient` (its answers
/// written by Python's `json`: shortest float reprs, `\u00e9`, surrogate
/// pairs), `statement_read` cached for a minute.
fn python_server() -> (Gateway, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/peers/lenient_server.py");
    let gw = Gateway::start_with(Options {
        extra: format!(
            "\n[servers.lenient]\ncommand = \"{}\"\nargs = [\"{}\", \"{}\"]\n\
             [servers.lenient.tools.statement_read]\ncache_ttl = \"1m\"\n",
            peer_python().display(),
            script.display(),
            dir.path().join("runs.jsonl").display()
        ),
        ..Default::default()
    });
    (gw, dir)
}

/// The raw text of member `name` of the answer's `result`, as the client
/// received it.
fn raw_member(a: &Answer, name: &str) -> String {
    let body = &a.text;
    let data = if a.sse {
        body.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .rfind(|l| l.contains("\"result\""))
            .unwrap()
            .to_owned()
    } else {
        body.clone()
    };
    let result = countersign::wire::jsonrpc::Message::parse(data.as_bytes())
        .unwrap()
        .result
        .unwrap();
    countersign::wire::members::members(result.get())
        .unwrap()
        .into_iter()
        .find(|m| m.key == name)
        .unwrap_or_else(|| panic!("no `{name}` in {}", result.get()))
        .value
        .to_owned()
}

#[tokio::test]
async fn a_replay_and_a_cached_read_carry_the_servers_own_bytes_in_both_eras() {
    let (gw, _dir) = python_server();
    let c = listed(&gw, "lenient").await;
    let call = |id: i64, tool: &str, key: Option<&str>| {
        let mut params = json!({"name": tool, "arguments": {"account": "a"}});
        if let Some(k) = key {
            params["_meta"] = json!({"dev.countersign/idempotency-key": k});
        }
        json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":params})
    };
    let first = c.post(&call(1, "statement", Some("st-1"))).await;
    let original = raw_member(&first, "structuredContent");
    assert!(
        original.contains("1944.4099999999999") && original.contains(r"Caf\u00e9"),
        "{original}"
    );
    assert!(
        original.contains(r"\ud83d\ude00") && original.contains("1e+21"),
        "{original}"
    );
    let content = raw_member(&first, "content");
    // A retry with the key: the same bytes, marked as a replay.
    let replay = c.post(&call(2, "statement", Some("st-1"))).await;
    assert!(
        replay.last()["result"]["_meta"]["dev.countersign/replayed"].is_object(),
        "{replay:?}"
    );
    assert_eq!(raw_member(&replay, "structuredContent"), original);
    assert_eq!(raw_member(&replay, "content"), content);
    // The same through 2026-07-28: `resultType` added, nothing else moved.
    let mut modern = call(3, "statement", Some("st-1"));
    modern["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("2026-07-28");
    let m = answer(
        modern_post(&gw.url("lenient"), &modern)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(m.last()["result"]["resultType"], "complete", "{m:?}");
    assert_eq!(raw_member(&m, "structuredContent"), original);
    // A cached read: the first answer's bytes again.
    let read = c.post(&call(4, "statement_read", None)).await;
    let cached = c.post(&call(5, "statement_read", None)).await;
    assert!(
        cached.last()["result"]["_meta"]["dev.countersign/cached"].is_object(),
        "{cached:?}"
    );
    assert_eq!(
        raw_member(&cached, "structuredContent"),
        raw_member(&read, "structuredContent")
    );
    assert_eq!(raw_member(&cached, "structuredContent"), original);
    // Value for value too, as a client that stores the balance reads it.
    assert_eq!(
        cached.last()["result"]["structuredContent"]["balance"].as_f64(),
        Some(1944.4099999999999)
    );
    let ran = std::fs::read_to_string(_dir.path().join("runs.jsonl.statements")).unwrap();
    assert_eq!(
        ran.lines().collect::<Vec<_>>(),
        ["statement", "statement_read"]
    );
}

#[test]
fn every_build_parses_numbers_correctly_rounded_not_only_the_tests() {
    // The tests' dev-dependencies (serde_jcs) turn serde_json's
    // `float_roundtrip` on for every test build; a release build has only
    // the normal dependencies. This asks cargo what a normal build gets.
    let out = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "tree",
            "--edges",
            "normal,features",
            "-i",
            "serde_json",
            "--offline",
            "--locked",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8(out.stdout).unwrap();
    assert!(
        tree.contains(r#"serde_json feature "float_roundtrip""#),
        "a normal build parses numbers with serde_json's default parser, which is not correctly rounded:\n{tree}"
    );
}
