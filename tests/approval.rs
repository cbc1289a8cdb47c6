//! Approval binding (DESIGN.md section 6) end to end: the real gateway, the
//! real example server and the real `countersign` CLI. Every case asserts
//! how many times the server executed the call.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{code, countersign};
use serde_json::{json, Value};

/// Reviewers: alice (leads, acme), bob (globex only), and a reviewer named
/// like the requester (`agent-7`), to try self-approval.
struct Review {
    gw: common::Gateway,
    pdir: tempfile::TempDir,
    keys: PathBuf,
}

fn policies_src() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policies")
}

async fn cli(args: &[&str]) -> (bool, String, String) {
    common::run_cli_async(args).await
}

fn keygen(dir: &Path, name: &str, groups: &str, tenants: &str) -> String {
    let out = std::process::Command::new(common::countersign_bin())
        .args(["keygen", "--name", name, "--out"])
        .arg(dir.join(format!("{name}.key")))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .replace("groups = []", &format!("groups = {groups}"))
        .replace("tenants = [\"*\"]", &format!("tenants = {tenants}"))
}

impl Review {
    fn start(approvals: &str, extra: &str) -> Review {
        let pdir = tempfile::tempdir().unwrap();
        for f in ["schema.cedarschema", "default.cedar"] {
            std::fs::copy(policies_src().join(f), pdir.path().join(f)).unwrap();
        }
        let keys = pdir.path().join("keys");
        std::fs::create_dir(&keys).unwrap();
        let mut reviewers = String::new();
        reviewers.push_str(&keygen(&keys, "alice", "[\"leads\"]", "[\"acme\"]"));
        reviewers.push_str(&keygen(&keys, "bob", "[]", "[\"globex\"]"));
        reviewers.push_str(&keygen(&keys, "agent-7", "[\"leads\"]", "[\"acme\"]"));
        // carol reviews acme but is in no group.
        reviewers.push_str(&keygen(&keys, "carol", "[]", "[\"acme\"]"));
        // mallory has a key but is not registered.
        let _ = keygen(&keys, "mallory", "[]", "[\"acme\"]");
        std::fs::write(pdir.path().join("reviewers.toml"), reviewers).unwrap();
        let gw = common::Gateway::start_with(common::Options {
            policies: Some(pdir.path().to_owned()),
            approvals: approvals.into(),
            extra: extra.into(),
            ..Default::default()
        });
        Review { gw, pdir, keys }
    }

    /// A gateway (calls not held) where agent-7's `charge_card` of 10 under
    /// key `k-1` waits on proposal `id`.
    async fn with_pending_charge() -> (Review, common::Client, String) {
        let r = Review::start("hold = \"0s\"", "");
        let c = r.client(common::TOKEN).await;
        let id = proposal_id(&call(&c, 1, CHARGE, charge(10), "k-1").await);
        (r, c, id)
    }

    /// A signed control API client for a reviewer.
    fn api(&self, name: &str) -> countersign::cli::client::Client {
        countersign::cli::client::Client::new(&self.gw.base(), &self.key_file(name)).unwrap()
    }

    fn key_file(&self, name: &str) -> countersign::core::reviewers::KeyFile {
        countersign::cli::client::load_key(Path::new(&self.key(name))).unwrap()
    }

    /// Wait until the gateway logs a policy folder reload.
    async fn wait_for_reload(&self, what: &str) {
        for _ in 0..60 {
            if self
                .gw
                .log
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.contains("policies reloaded"))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{what}");
    }

    fn key(&self, name: &str) -> String {
        self.keys.join(format!("{name}.key")).display().to_string()
    }

    async fn cli(&self, reviewer: &str, args: &[&str]) -> (bool, String, String) {
        let key = self.key(reviewer);
        let base = self.gw.base();
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--key", &key, "--gateway", &base]);
        cli(&all).await
    }

    async fn approve(&self, reviewer: &str, id: &str) {
        let (ok, out, err) = self
            .cli(reviewer, &["approve", id, "--reason", "looks right"])
            .await;
        assert!(ok, "approve failed: {out}{err}");
    }

    async fn pending(&self, reviewer: &str) -> Vec<Value> {
        let (ok, out, err) = self.cli(reviewer, &["pending", "--json"]).await;
        assert!(ok, "{err}");
        serde_json::from_str::<Value>(&out).unwrap()["proposals"]
            .as_array()
            .unwrap()
            .clone()
    }

    async fn client(&self, token: &str) -> common::Client {
        let mut c = common::Client::new(&self.gw.url("payments"));
        c.token = token.into();
        c.initialize().await;
        c.post(&json!({"jsonrpc":"2.0","id":0,"method":"tools/list"}))
            .await;
        c
    }
}

/// A `tools/call` with an explicit idempotency key.
async fn call(c: &common::Client, id: i64, tool: &str, args: Value, key: &str) -> common::Answer {
    c.post(
        &json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
        "name": tool, "arguments": args, "_meta": {"dev.countersign/idempotency-key": key}}}),
    )
    .await
}

fn proposal_id(a: &common::Answer) -> String {
    countersign(a)["proposal_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no proposal id in {a:?}"))
        .to_owned()
}

fn ran(a: &common::Answer) -> bool {
    a.last()["result"]["isError"] == false
}

const CHARGE: &str = "charge_card";

fn charge(amount: i64) -> Value {
    json!({"account": "acct-1", "amount": amount, "currency": "EUR"})
}

#[tokio::test]
async fn a_write_without_approval_makes_one_proposal_however_often_it_is_retried() {
    let r = Review::start("hold = \"0s\"", "");
    let c = r.client(common::TOKEN).await;
    let first = call(&c, 1, CHARGE, charge(10), "k-1").await;
    assert_eq!(code(&first), "approval_pending", "{first:?}");
    let id = proposal_id(&first);
    assert!(
        first.text.contains(&id),
        "the agent is told the proposal id"
    );

    // 20 identical retries while pending: 10 in a row, 10 at once.
    for i in 0..10 {
        let a = call(&c, 10 + i, CHARGE, charge(10), "k-1").await;
        assert_eq!(proposal_id(&a), id);
    }
    let c = std::sync::Arc::new(c);
    let racers: Vec<_> = (0..10)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move { call(&c, 30 + i, CHARGE, charge(10), "k-1").await })
        })
        .collect();
    for t in racers {
        assert_eq!(proposal_id(&t.await.unwrap()), id);
    }
    // The same call under other derived keys (no explicit key) joins it too.
    let derived = c.call(50, CHARGE, charge(10)).await;
    assert_eq!(proposal_id(&derived), id);

    let pending = r.pending("alice").await;
    assert_eq!(pending.len(), 1, "{pending:?}");
    let p = &pending[0];
    assert_eq!(p["id"], json!(id));
    // The gateway's own canonical copy, not the agent's text.
    assert_eq!(
        p["arguments"],
        json!({"account":"acct-1","amount":10,"currency":"EUR"})
    );
    assert_eq!(p["requester"], "agent-7");
    assert_eq!(p["tenant"], "acme");
    // Sequential retries join it; concurrent ones also share the first call's flight.
    assert!(p["joined"].as_u64().unwrap() >= 11, "{p}");
    assert!(p["call_digest"].as_str().unwrap().starts_with("sha256:"));
    assert_eq!(r.gw.executions(CHARGE), 0);

    // The human-readable listing and detail say the same.
    let (ok, out, _) = r.cli("alice", &["pending"]).await;
    assert!(
        ok && out.contains(&id) && out.contains("payments/charge_card"),
        "{out}"
    );
    let (ok, out, _) = r.cli("alice", &["show", &id]).await;
    assert!(
        ok && out.contains("agent-7 of acme wants payments/charge_card (a write) with account acct-1, amount 10, currency EUR"),
        "{out}"
    );
    assert!(out.contains("amount") && out.contains("10"), "{out}");
}

#[tokio::test]
async fn an_approved_call_runs_once_and_a_new_key_needs_a_new_approval() {
    let (r, c, id) = Review::with_pending_charge().await;
    r.approve("alice", &id).await;

    let run = call(&c, 2, CHARGE, charge(10), "k-1").await;
    assert!(ran(&run), "{run:?}");
    assert_eq!(r.gw.executions(CHARGE), 1);
    // The same call retried: the ledger replays, nothing runs again.
    let again = call(&c, 3, CHARGE, charge(10), "k-1").await;
    assert!(ran(&again));
    assert!(again.last()["result"]["_meta"]["dev.countersign/replayed"].is_object());
    assert_eq!(r.gw.executions(CHARGE), 1);

    // Same call, new key: the approval was used up.
    let fresh = call(&c, 4, CHARGE, charge(10), "k-2").await;
    assert_eq!(code(&fresh), "approval_pending", "{fresh:?}");
    assert_ne!(proposal_id(&fresh), id);
    assert_eq!(r.gw.executions(CHARGE), 1);
    let (_, shown, _) = r.cli("alice", &["show", &id, "--json"]).await;
    let shown: Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["state"], "consumed");
    assert!(shown["consumed_by"].as_str().unwrap().contains("k-1"));
}

#[tokio::test]
async fn drifted_arguments_and_another_tool_never_ride_on_an_approval() {
    let (r, c, id) = Review::with_pending_charge().await;
    r.approve("alice", &id).await;

    // Another call (its own key) for another amount: not run, and not a
    // revision: shown beside the approved one, as a separate call.
    let other = call(&c, 5, CHARGE, charge(12), "k-5").await;
    assert_eq!(code(&other), "approval_pending", "{other:?}");
    assert!(countersign(&other).get("revises").is_none(), "{other:?}");
    let (_, shown, _) = r
        .cli("alice", &["show", &proposal_id(&other), "--json"])
        .await;
    let shown: Value = serde_json::from_str(&shown).unwrap();
    assert!(shown["revises"].is_null(), "{shown}");
    assert_eq!(shown["beside"]["proposal_id"], json!(id), "{shown}");
    let (_, text, _) = r.cli("alice", &["show", &proposal_id(&other)]).await;
    assert!(
        text.contains("another call by the same requester") && !text.contains("->"),
        "{text}"
    );

    // The same call (its key) with a changed amount: not run; a new
    // proposal flagged as its revision.
    let drift = call(&c, 2, CHARGE, charge(11), "k-1").await;
    assert_eq!(code(&drift), "approval_pending", "{drift:?}");
    assert_eq!(countersign(&drift)["revises"], json!(id));
    let rev = proposal_id(&drift);
    let (_, shown, _) = r.cli("alice", &["show", &rev, "--json"]).await;
    let shown: Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(
        shown["revises"],
        json!({"proposal_id": id, "changes": [{"pointer": "/amount", "before": 10, "after": 11}]})
    );
    let (_, text, _) = r.cli("alice", &["show", &rev]).await;
    assert!(
        text.contains("/amount") && text.contains("10 -> 11"),
        "{text}"
    );

    // Another tool with the same arguments: not run.
    let remap = call(&c, 3, "transfer", charge(10), "k-3").await;
    assert_eq!(code(&remap), "approval_pending", "{remap:?}");
    assert_ne!(proposal_id(&remap), id);
    assert_eq!(r.gw.executions(CHARGE), 0);
    assert_eq!(r.gw.executions("transfer"), 0);

    // The approved call itself still runs, once.
    assert!(ran(&call(&c, 4, CHARGE, charge(10), "k-4").await));
    assert_eq!(r.gw.executions(CHARGE), 1);
}

#[tokio::test]
async fn an_approval_is_bound_to_its_requester_and_tenant() {
    let r = Review::start("hold = \"0s\"", "");
    let c7 = r.client(common::TOKEN).await;
    let id = proposal_id(&call(&c7, 1, CHARGE, charge(10), "k-1").await);
    r.approve("alice", &id).await;

    let c9 = r.client(common::OTHER_TOKEN).await;
    let other_requester = call(&c9, 2, CHARGE, charge(10), "k-1").await;
    assert_eq!(code(&other_requester), "approval_pending");
    assert_ne!(proposal_id(&other_requester), id);

    let globex = r.client(common::GLOBEX_TOKEN).await;
    let other_tenant = call(&globex, 3, CHARGE, charge(10), "k-1").await;
    assert_eq!(code(&other_tenant), "approval_pending");
    assert_ne!(proposal_id(&other_tenant), id);
    assert_eq!(r.gw.executions(CHARGE), 0);

    // Reviewers see only their tenants: bob (globex) sees globex's proposal
    // and none of acme's, and cannot approve acme's.
    let bobs = r.pending("bob").await;
    assert_eq!(bobs.len(), 1, "{bobs:?}");
    assert_eq!(bobs[0]["tenant"], "globex");
    let (ok, _, err) = r
        .cli("bob", &["approve", &proposal_id(&other_requester)])
        .await;
    assert!(!ok && err.contains("no proposal"), "{err}");

    assert!(ran(&call(&c7, 4, CHARGE, charge(10), "k-1").await));
    assert_eq!(r.gw.executions(CHARGE), 1);
}

#[tokio::test]
async fn an_expired_approval_answers_approval_expired() {
    let (r, c, id) = Review::with_pending_charge().await;
    let (ok, out, err) = r.cli("alice", &["approve", &id, "--ttl", "1s"]).await;
    assert!(ok, "{out}{err}");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let late = call(&c, 2, CHARGE, charge(10), "k-1").await;
    assert_eq!(code(&late), "approval_expired", "{late:?}");
    assert_eq!(r.gw.executions(CHARGE), 0);
    // A fresh proposal asks again; the expired one says why.
    assert_ne!(proposal_id(&late), id);
    let (_, shown, _) = r.cli("alice", &["show", &id, "--json"]).await;
    assert_eq!(
        serde_json::from_str::<Value>(&shown).unwrap()["state"],
        "expired"
    );
}

#[tokio::test]
async fn a_resource_changed_after_approval_is_stale_and_does_not_run() {
    let probe = r#"
[servers.payments.tools.charge_card]
version_probe = { tool = "get_account", arguments = { account = "/account" }, pointer = "/structuredContent/version" }
"#;
    let r = Review::start("hold = \"0s\"", probe);
    let c = r.client(common::TOKEN).await;
    let first = call(&c, 1, CHARGE, charge(10), "k-1").await;
    let id = proposal_id(&first);
    let (_, shown, _) = r.cli("alice", &["show", &id, "--json"]).await;
    assert_eq!(
        serde_json::from_str::<Value>(&shown).unwrap()["resource_version"],
        "v1",
        "the proposal records the version the reviewer sees"
    );
    r.approve("alice", &id).await;
    // The account changes before the agent comes back.
    std::fs::write(
        r.gw.faults_path(),
        json!({"_versions": {"acct-1": "v2"}}).to_string(),
    )
    .unwrap();
    let stale = call(&c, 2, CHARGE, charge(10), "k-1").await;
    assert_eq!(code(&stale), "stale_resource_version", "{stale:?}");
    assert_eq!(r.gw.executions(CHARGE), 0);
    let (_, shown, _) = r.cli("alice", &["show", &id, "--json"]).await;
    assert_eq!(
        serde_json::from_str::<Value>(&shown).unwrap()["state"],
        "invalidated",
        "a mismatch voids the approval"
    );
    // The new proposal carries the new version, and approving it runs the call.
    let renewed = proposal_id(&stale);
    let (_, shown, _) = r.cli("alice", &["show", &renewed, "--json"]).await;
    assert_eq!(
        serde_json::from_str::<Value>(&shown).unwrap()["resource_version"],
        "v2"
    );
    r.approve("alice", &renewed).await;
    assert!(ran(&call(&c, 3, CHARGE, charge(10), "k-1").await));
    assert_eq!(r.gw.executions(CHARGE), 1);
}

#[tokio::test]
async fn an_explicit_resource_version_binds_the_approval() {
    let r = Review::start("hold = \"0s\"", "");
    let c = r.client(common::TOKEN).await;
    let with_version = |v: &str| {
        json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
            "name": CHARGE, "arguments": charge(10),
            "_meta": {"dev.countersign/idempotency-key": "k-1", "dev.countersign/resource-version": v}}})
    };
    let id = proposal_id(&c.post(&with_version("etag-1")).await);
    r.approve("alice", &id).await;
    let stale = c.post(&with_version("etag-2")).await;
    assert_eq!(code(&stale), "stale_resource_version", "{stale:?}");
    assert_eq!(r.gw.executions(CHARGE), 0);
}

#[tokio::test]
async fn self_approval_forged_signatures_and_unknown_reviewers_are_refused() {
    let (r, c, id) = Review::with_pending_charge().await;

    // A reviewer approving their own call.
    let (ok, _, err) = r.cli("agent-7", &["approve", &id]).await;
    assert!(
        !ok && err.contains("reviewer `agent-7` may not approve this call: forbidden by policy")
            && err.contains("no-self-approval")
            && err.contains("nobody approves their own call"),
        "{err}"
    );
    // An unregistered reviewer.
    let (ok, _, err) = r.cli("mallory", &["approve", &id]).await;
    assert!(!ok && err.contains("not in reviewers.toml"), "{err}");

    // Forged: alice's request carrying a statement signed by mallory's key.
    let alice = r.api("alice");
    let mallory = r.key_file("mallory");
    let shown = alice.proposal(&id).await.unwrap();
    let policy_set = shown["policy_set"].as_str().unwrap().to_owned();
    let p: countersign::core::approval::Proposal =
        serde_json::from_value(countersign::cli::client::strip_view(shown)).unwrap();
    let now = time::OffsetDateTime::now_utc();
    let fmt = |t: time::OffsetDateTime| {
        t.replace_nanosecond(0)
            .unwrap()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    };
    let statement = p.statement(
        countersign::core::approval::Verdict::Approve,
        "alice",
        "",
        &fmt(now),
        &fmt(now + time::Duration::minutes(5)),
        Some(&policy_set),
    );
    let forged = statement.sign(&mallory.signing_key().unwrap()).unwrap();
    let path = format!("/v1/proposals/{id}/decision");
    let post = |body: Value| {
        let (alice, path) = (&alice, path.clone());
        async move { alice.call(reqwest::Method::POST, &path, Some(&body)).await }
    };
    let err = post(json!({"statement": statement, "signature": forged}))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("does not verify"), "{err}");

    // Tampered: a genuine signature, then the digest changed.
    let genuine = statement
        .sign(&r.key_file("alice").signing_key().unwrap())
        .unwrap();
    let mut tampered = serde_json::to_value(&statement).unwrap();
    tampered["call_digest"] = json!("sha256:00");
    let err = post(json!({"statement": tampered, "signature": genuine}))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("`call_digest`"), "{err}");
    // And a signature over another reviewer's name.
    let mut renamed = statement.clone();
    renamed.reviewer = "bob".into();
    let err = post(json!({"statement": renamed, "signature": genuine}))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("bob"), "{err}");

    // No signature at all on the request.
    let unsigned = reqwest::get(format!("{}/v1/proposals", r.gw.base()))
        .await
        .unwrap();
    assert_eq!(unsigned.status(), 401);

    // Still pending, nothing ran; the genuine statement is accepted.
    let still = alice.proposal(&id).await.unwrap();
    assert_eq!(still["state"], "pending");
    assert_eq!(r.gw.executions(CHARGE), 0);
    post(json!({"statement": statement, "signature": genuine}))
        .await
        .unwrap();
    assert!(ran(&call(&c, 2, CHARGE, charge(10), "k-1").await));
    assert_eq!(r.gw.executions(CHARGE), 1);
}

#[tokio::test]
async fn twenty_calls_with_different_keys_racing_for_one_approval_run_once() {
    let r = Review::start("hold = \"0s\"", "");
    let c = std::sync::Arc::new(r.client(common::TOKEN).await);
    let id = proposal_id(&call(&c, 1, CHARGE, charge(10), "k-0").await);
    r.approve("alice", &id).await;
    let racers: Vec<_> = (0..20)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move {
                call(&c, 100 + i, CHARGE, charge(10), &format!("race-{i}")).await
            })
        })
        .collect();
    let mut runs = 0;
    for t in racers {
        let a = t.await.unwrap();
        if ran(&a) {
            runs += 1;
        } else {
            assert_eq!(code(&a), "approval_pending", "{a:?}");
        }
    }
    assert_eq!(runs, 1);
    assert_eq!(r.gw.executions(CHARGE), 1);
}

#[tokio::test]
async fn a_policy_revoked_between_approval_and_execution_stops_the_call() {
    let (r, c, id) = Review::with_pending_charge().await;
    r.approve("alice", &id).await;
    std::fs::write(
        r.pdir.path().join("freeze.cedar"),
        "@id(\"freeze\")\nforbid (principal, action == Action::\"call\", resource == Tool::\"payments/charge_card\");\n",
    )
    .unwrap();
    r.wait_for_reload("the policy edit was not picked up").await;
    let a = call(&c, 2, CHARGE, charge(10), "k-1").await;
    assert_eq!(code(&a), "policy_denied", "{a:?}");
    assert_eq!(r.gw.executions(CHARGE), 0);
}

#[tokio::test]
async fn a_held_call_gets_progress_then_its_result_when_approved() {
    let r = Review::start("hold = \"30s\"\nprogress_interval = \"200ms\"", "");
    let c = std::sync::Arc::new(r.client(common::TOKEN).await);
    let held = {
        let c = c.clone();
        tokio::spawn(async move {
            c.post(
                &json!({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{
                "name": CHARGE, "arguments": charge(10),
                "_meta": {"progressToken": "tok-7", "dev.countersign/idempotency-key": "k-held"}}}),
            )
            .await
        })
    };
    let mut id = None;
    for _ in 0..100 {
        if let Some(p) = r.pending("alice").await.first() {
            id = p["id"].as_str().map(str::to_owned);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let id = id.expect("the held call made no proposal");
    // Let a few progress notifications go out before approving.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(r.gw.executions(CHARGE), 0, "nothing runs while held");
    r.approve("alice", &id).await;
    let a = held.await.unwrap();
    assert!(a.sse, "progress turns the answer into a stream: {a:?}");
    let progress: Vec<&Value> = a
        .messages
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .collect();
    assert!(progress.len() >= 2, "{a:?}");
    assert!(progress
        .iter()
        .all(|p| p["params"]["progressToken"] == "tok-7"));
    assert!(progress[0]["params"]["message"]
        .as_str()
        .unwrap()
        .contains(&id));
    assert!(ran(&a), "the held call ran without a retry: {a:?}");
    assert_eq!(a.last()["id"], 7);
    assert_eq!(r.gw.executions(CHARGE), 1);
}

#[tokio::test]
async fn a_denied_call_answers_approval_denied_with_the_reason() {
    let (r, c, id) = Review::with_pending_charge().await;
    let (ok, _, err) = r.cli("alice", &["deny", &id]).await;
    assert!(
        !ok && err.contains("--reason"),
        "a denial needs a reason: {err}"
    );
    let (ok, out, err) = r
        .cli("alice", &["deny", &id, "--reason", "wrong account"])
        .await;
    assert!(ok, "{out}{err}");
    let a = call(&c, 2, CHARGE, charge(10), "k-1").await;
    assert_eq!(code(&a), "approval_denied");
    assert!(a.text.contains("wrong account"), "{a:?}");
    assert_eq!(r.gw.executions(CHARGE), 0);
}

#[tokio::test]
async fn a_refused_approval_names_the_group_that_is_missing() {
    let r = Review::start("hold = \"0s\"", "");
    let c = r.client(common::TOKEN).await;
    let id = proposal_id(
        &call(
            &c,
            1,
            "close_account",
            json!({"account": "acct-1"}),
            "k-close",
        )
        .await,
    );
    // carol is in no group; the shipped policies let only `leads` approve a
    // destructive tool, and the refusal says so rather than blaming
    // self-approval.
    let (ok, _, err) = r.cli("carol", &["approve", &id]).await;
    assert!(!ok, "{err}");
    assert!(
        err.contains("no policy lets reviewer `carol` (no groups) approve `payments/close_account` (destructive)")
            && err.contains("name group leads"),
        "{err}"
    );
    assert!(!err.contains("self-approval"), "{err}");
    // A lead approves it.
    r.approve("alice", &id).await;
    assert!(ran(&call(
        &c,
        2,
        "close_account",
        json!({"account": "acct-1"}),
        "k-close"
    )
    .await));
    assert_eq!(r.gw.executions("close_account"), 1);
}

#[tokio::test]
async fn keygen_makes_a_missing_folder_and_takes_groups() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("new/.countersign/dana.key");
    let (ok, out, err) = cli(&["keygen", "--name", "dana", "--out", key.to_str().unwrap()]).await;
    assert!(ok, "{err}");
    let folder = key.parent().unwrap();
    assert_eq!(
        std::fs::metadata(folder).unwrap().permissions().mode() & 0o777,
        0o700,
        "a folder for private keys is its owner's alone"
    );
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // Without --groups the entry says what the shipped policies need.
    assert!(
        out.contains("groups = []") && out.contains("--groups leads"),
        "{out}"
    );
    let key2 = dir.path().join("new/.countersign/erin.key");
    let (ok, out, err) = cli(&[
        "keygen",
        "--name",
        "erin",
        "--groups",
        "leads",
        "--tenants",
        "acme,globex",
        "--out",
        key2.to_str().unwrap(),
    ])
    .await;
    assert!(ok, "{err}");
    assert!(
        out.contains("groups = [\"leads\"]") && out.contains("tenants = [\"acme\", \"globex\"]"),
        "{out}"
    );
    // The entry parses as a reviewers file.
    let parsed: toml::Value = toml::from_str(&out).unwrap();
    assert_eq!(parsed["reviewers"][0]["name"].as_str(), Some("erin"));
}

#[tokio::test]
async fn keygen_writes_a_private_key_only_its_owner_can_read() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let entry = keygen(dir.path(), "carol", "[]", "[\"acme\"]");
    assert!(entry.contains("name = \"carol\"") && entry.contains("public_key = \"ed25519:"));
    let key = dir.path().join("carol.key");
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // Never overwritten.
    let (ok, _, err) = cli(&["keygen", "--name", "carol", "--out", key.to_str().unwrap()]).await;
    assert!(!ok && err.contains("never overwrites"), "{err}");
    // A key file others can read is refused by the commands that use it.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (ok, _, err) = cli(&["pending", "--key", key.to_str().unwrap()]).await;
    assert!(!ok && err.contains("chmod 600"), "{err}");
}

#[tokio::test]
async fn an_approval_survives_a_gateway_crash_and_a_lost_answer_never_frees_it() {
    let mut r = Review::start("hold = \"0s\"", "");
    let c = r.client(common::TOKEN).await;
    let id = proposal_id(&call(&c, 1, CHARGE, charge(10), "k-1").await);
    r.approve("alice", &id).await;
    // SIGKILL: the signed decision was durable before `approve` returned.
    r.gw.restart();
    let c = r.client(common::TOKEN).await;

    // The approved call runs, and the server dies before answering.
    r.gw.fault(CHARGE, "exit_after_execute", 0);
    let lost = call(&c, 2, CHARGE, charge(10), "k-1").await;
    assert_eq!(code(&lost), "outcome_unknown", "{lost:?}");
    assert_eq!(r.gw.executions(CHARGE), 1);
    // The same key follows the ledger: unknown, never a second consumption.
    let again = call(&c, 3, CHARGE, charge(10), "k-1").await;
    assert_eq!(code(&again), "outcome_unknown", "{again:?}");
    // Another key does not inherit the used approval.
    let other = call(&c, 4, CHARGE, charge(10), "k-2").await;
    assert_eq!(code(&other), "approval_pending", "{other:?}");
    assert_eq!(r.gw.executions(CHARGE), 1);

    // A reviewer reconciles through the running gateway.
    let base = r.gw.base();
    let key = r.key("alice");
    let (ok, out, err) = cli(&[
        "reconcile",
        "--list",
        "--reviewer-key",
        &key,
        "--gateway",
        &base,
    ])
    .await;
    assert!(
        ok && out.contains("k-1") && out.contains("payments/charge_card"),
        "{out}{err}"
    );
    let (ok, out, err) = cli(&[
        "reconcile",
        "k-1",
        "--tenant",
        "acme",
        "--principal",
        "agent-7",
        "--executed",
        "--note",
        "seen in the PSP dashboard",
        "--reviewer-key",
        &key,
        "--gateway",
        &base,
    ])
    .await;
    assert!(ok, "{out}{err}");
    let replayed = call(&c, 5, CHARGE, charge(10), "k-1").await;
    assert!(ran(&replayed), "{replayed:?}");
    assert!(
        replayed.text.contains("seen in the PSP dashboard"),
        "{replayed:?}"
    );
    assert_eq!(r.gw.executions(CHARGE), 1);
    // bob (globex) cannot reconcile acme's calls.
    let (ok, _, err) = cli(&[
        "reconcile",
        "k-1",
        "--tenant",
        "acme",
        "--principal",
        "agent-7",
        "--not-executed",
        "--reviewer-key",
        &r.key("bob"),
        "--gateway",
        &base,
    ])
    .await;
    assert!(!ok && err.contains("no unknown outcome"), "{err}");
}

#[tokio::test]
async fn the_event_stream_shows_new_proposals_and_decisions_live() {
    use futures_util::StreamExt;
    let r = Review::start("hold = \"0s\"", "");
    let alice = r.api("alice");
    let resp = alice
        .signed(reqwest::Method::GET, "/v1/events", Vec::new())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.bytes_stream();
    let mut seen = String::new();
    // The stream is open before anything happens.
    while !seen.contains("subscribed") {
        seen.push_str(&String::from_utf8_lossy(
            &body.next().await.unwrap().unwrap(),
        ));
    }
    let c = r.client(common::TOKEN).await;
    let id = proposal_id(&call(&c, 1, CHARGE, charge(10), "k-1").await);
    // bob's tenant gets a proposal too; alice must not see it.
    let globex = r.client(common::GLOBEX_TOKEN).await;
    let hidden = proposal_id(&call(&globex, 2, CHARGE, charge(10), "k-1").await);
    r.approve("alice", &id).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !(seen.contains("event: proposal_updated") && seen.contains("\"approved\"")) {
        let chunk = tokio::time::timeout_at(deadline, body.next())
            .await
            .expect("no approval event")
            .unwrap()
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.contains("event: proposal_created"), "{seen}");
    assert!(seen.contains(&id), "{seen}");
    assert!(
        !seen.contains(&hidden),
        "another tenant's proposal leaked: {seen}"
    );
}

#[tokio::test]
async fn the_control_api_refuses_bad_requests_with_a_reason() {
    let r = Review::start("hold = \"0s\"", "");
    let alice = r.api("alice");
    let err = alice
        .call(reqwest::Method::GET, "/v1/proposals?state=bogus", None)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unknown state `bogus`"), "{err}");
    let err = alice
        .call(
            reqwest::Method::POST,
            "/v1/proposals/p-0/decision",
            Some(&json!({"nope": 1})),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("\"statement\""), "{err}");
    let err = alice.proposal("p-does-not-exist").await.unwrap_err();
    assert!(
        err.to_string().contains("no proposal `p-does-not-exist`"),
        "{err}"
    );
    // A signature made for another path does not open this one.
    let auth = countersign::core::signed_request::authorization(
        &r.key_file("alice").signing_key().unwrap(),
        "alice",
        "GET",
        "/v1/outcomes",
        &countersign::core::time::rfc3339(
            (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64,
        ),
        b"",
    );
    let resp = reqwest::Client::new()
        .get(format!("{}/v1/proposals", r.gw.base()))
        .header("authorization", auth)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    assert!(resp.text().await.unwrap().contains("does not verify"));
    // A request signed too long ago (a replay).
    let old = countersign::core::signed_request::authorization(
        &r.key_file("alice").signing_key().unwrap(),
        "alice",
        "GET",
        "/v1/proposals",
        "2026-01-01T00:00:00Z",
        b"",
    );
    let resp = reqwest::Client::new()
        .get(format!("{}/v1/proposals", r.gw.base()))
        .header("authorization", old)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    assert!(resp
        .text()
        .await
        .unwrap()
        .contains("too far from the gateway's clock"));
}

#[tokio::test]
async fn an_approval_by_a_reviewer_removed_since_does_not_run() {
    let (r, c, id) = Review::with_pending_charge().await;
    r.approve("alice", &id).await;
    // alice leaves: the policy repository drops her entry.
    let file = r.pdir.path().join("reviewers.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    let without: String = text
        .split("[[reviewers]]")
        .filter(|e| !e.trim().is_empty() && !e.contains("name = \"alice\""))
        .map(|e| format!("[[reviewers]]{e}"))
        .collect();
    std::fs::write(&file, without).unwrap();
    r.wait_for_reload("the reviewers edit was not picked up")
        .await;
    let a = call(&c, 2, CHARGE, charge(10), "k-1").await;
    assert_eq!(code(&a), "approval_pending", "{a:?}");
    assert_ne!(proposal_id(&a), id);
    assert_eq!(r.gw.executions(CHARGE), 0);
    let (_, shown, _) = r.cli("bob", &["show", &id, "--json"]).await;
    assert!(shown.is_empty(), "bob does not see acme: {shown}");
    let (_, shown, _) = r.cli("agent-7", &["show", &id, "--json"]).await;
    let shown: Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["state"], "invalidated");
    assert!(shown["reason"]
        .as_str()
        .unwrap()
        .contains("no longer registered"));
}

#[tokio::test]
async fn a_requester_flooding_proposals_is_capped_and_nothing_runs() {
    let r = Review::start("hold = \"0s\"\nmax_pending = 3", "");
    let c = r.client(common::TOKEN).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let a = call(&c, i, CHARGE, charge(100 + i), &format!("flood-{i}")).await;
        ids.push(proposal_id(&a));
    }
    let over = call(&c, 10, CHARGE, charge(999), "flood-x").await;
    assert_eq!(code(&over), "approval_pending", "{over:?}");
    assert!(countersign(&over)["proposal_id"].is_null(), "{over:?}");
    assert!(over.text.contains("max_pending"), "{over:?}");
    // Retrying a call that already has a proposal still joins it.
    let again = call(&c, 11, CHARGE, charge(100), "flood-0").await;
    assert_eq!(proposal_id(&again), ids[0]);
    // Another requester is not affected.
    let c9 = r.client(common::OTHER_TOKEN).await;
    assert!(countersign(&call(&c9, 12, CHARGE, charge(5), "k").await)["proposal_id"].is_string());
    assert_eq!(r.pending("alice").await.len(), 4);
    // Once a reviewer decides one, there is room again.
    let (ok, _, err) = r
        .cli("alice", &["deny", &ids[1], "--reason", "duplicate"])
        .await;
    assert!(ok, "{err}");
    let now = call(&c, 13, CHARGE, charge(999), "flood-x").await;
    assert!(countersign(&now)["proposal_id"].is_string(), "{now:?}");
    assert_eq!(r.gw.executions(CHARGE), 0);
}

/// A non-loopback address of this machine (the source address of its
/// default route; no packet is sent).
fn outside_address() -> std::net::IpAddr {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    s.connect("192.0.2.1:9")
        .expect("this test needs a non-loopback IPv4 address (a default route)");
    let ip = s.local_addr().unwrap().ip();
    assert!(!ip.is_loopback(), "no non-loopback address: {ip}");
    ip
}

#[tokio::test]
async fn the_control_api_refuses_non_loopback_peers_unless_allowed() {
    let ip = outside_address();
    for (remote, expect_ok) in [(false, false), (true, true)] {
        let (pdir, key) = common::default_policies_with_alice();
        let gw = common::Gateway::start_with(common::Options {
            listen: "0.0.0.0:0".into(),
            policies: Some(pdir.path().to_owned()),
            approvals: format!("hold = \"0s\"\nremote_control = {remote}\n"),
            ..Default::default()
        });
        let port = gw.addr.rsplit(':').next().unwrap();
        let base = format!("http://{ip}:{port}");
        let (ok, out, err) = cli(&[
            "pending",
            "--key",
            key.to_str().unwrap(),
            "--gateway",
            &base,
        ])
        .await;
        if expect_ok {
            assert!(
                ok,
                "remote_control = true lets a signed request in: {out}{err}"
            );
        } else {
            assert!(!ok && err.contains("loopback peers only"), "{out}{err}");
            // The same request over loopback works.
            let (ok, _, err) = common::review_cli(&gw, &key, &["pending"]);
            assert!(ok, "{err}");
        }
    }
}
