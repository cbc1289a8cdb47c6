//! Four eyes (DESIGN.md section 20) end to end: the real gateway, the real
//! example server and the real `countersign` CLI. The shipped policies with
//! their quorum rules (`policies/quorum.cedar`: closing an account takes
//! finance and a lead) and one more for the tests: a charge over 100 takes
//! two reviewers. Every case asserts how many times the server executed
//! the call.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};

use common::*;
use serde_json::{json, Value};

/// The test's own quorum rule, beside the shipped ones.
const CHARGES: &str = r#"
@id("big-charges-need-two")
@approvals("2")
permit (principal, action == Action::"call", resource == Tool::"payments/charge_card")
when {
  context.approved &&
  context.arguments has amount &&
  context.arguments.amount.greaterThan(decimal("100.0"))
};
"#;

/// The policy folder and the reviewers' key files: alice (leads, with two
/// keys: `alice.key` and `alice-phone.key`), bob (leads), dave (finance),
/// and `agent-7` (leads), named like the requester.
struct Folder {
    dir: tempfile::TempDir,
}

impl Folder {
    fn new() -> Folder {
        let dir = tempfile::tempdir().unwrap();
        let shipped = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policies");
        for f in ["schema.cedarschema", "default.cedar", "quorum.cedar"] {
            std::fs::copy(shipped.join(f), dir.path().join(f)).unwrap();
        }
        std::fs::write(dir.path().join("charges.cedar"), CHARGES).unwrap();
        let mut reviewers = String::new();
        let alice = [
            keygen(dir.path(), "alice", "alice"),
            keygen(dir.path(), "alice", "alice-phone"),
        ];
        reviewers.push_str(&format!(
            "[[reviewers]]\nname = \"alice\"\npublic_keys = [\"{}\", \"{}\"]\ngroups = [\"leads\"]\ntenants = [\"acme\"]\n\n",
            alice[0], alice[1]
        ));
        for (name, group) in [("bob", "leads"), ("dave", "finance"), ("agent-7", "leads")] {
            let key = keygen(dir.path(), name, name);
            reviewers.push_str(&format!(
                "[[reviewers]]\nname = \"{name}\"\npublic_key = \"{key}\"\ngroups = [\"{group}\"]\ntenants = [\"acme\"]\n\n"
            ));
        }
        std::fs::write(dir.path().join("reviewers.toml"), reviewers).unwrap();
        Folder { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn key(&self, file: &str) -> PathBuf {
        self.dir.path().join(format!("{file}.key"))
    }
}

/// A key for reviewer `name` in `FILE.key`; its public key.
fn keygen(dir: &Path, name: &str, file: &str) -> String {
    let out = std::process::Command::new(countersign_bin())
        .args(["keygen", "--name", name, "--out"])
        .arg(dir.join(format!("{file}.key")))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("public_key = \""))
        .and_then(|l| l.strip_suffix('"'))
        .unwrap()
        .to_owned()
}

fn gateway(folder: &Folder, extra: &str) -> Gateway {
    Gateway::start_with(Options {
        policies: Some(folder.path().to_owned()),
        extra: extra.into(),
        ..Default::default()
    })
}

async fn agent(gw: &Gateway) -> Client {
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    c
}

fn keyed(id: i64, tool: &str, args: Value, key: &str) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
        "name":tool,"arguments":args,
        "_meta":{"dev.countersign/idempotency-key":key}}})
}

fn charge(id: i64, amount: i64, key: &str) -> Value {
    keyed(
        id,
        "charge_card",
        json!({"account":"acct_1","amount":amount}),
        key,
    )
}

/// The proposal a held call names.
fn held(a: &Answer) -> String {
    assert_eq!(code(a), "approval_pending", "{a:?}");
    countersign(a)["proposal_id"].as_str().unwrap().to_owned()
}

fn ran(a: &Answer) -> bool {
    a.last()["result"]["isError"] == false
}

/// `countersign ARGS` as the reviewer of key file `who` against `gw`.
fn as_reviewer(gw: &Gateway, folder: &Folder, who: &str, args: &[&str]) -> (bool, String, String) {
    review_cli(gw, &folder.key(who), args)
}

fn approve(gw: &Gateway, folder: &Folder, who: &str, id: &str) -> String {
    let (ok, out, err) = as_reviewer(gw, folder, who, &["approve", id, "--reason", "checked"]);
    assert!(ok, "{who} could not approve: {out}{err}");
    out
}

fn shown(gw: &Gateway, folder: &Folder, id: &str) -> Value {
    let (ok, out, err) = as_reviewer(gw, folder, "dave", &["show", id, "--json"]);
    assert!(ok, "{err}");
    serde_json::from_str(&out).unwrap()
}

#[tokio::test]
async fn a_two_reviewer_charge_runs_after_the_second_approval_exactly_once() {
    let folder = Folder::new();
    let gw = gateway(&folder, "");
    let c = agent(&gw).await;
    let id = held(&c.post(&charge(1, 500, "two-1")).await);
    let out = approve(&gw, &folder, "alice", &id);
    assert!(
        out.contains("waits for more reviewers (1 of 2 approvals: alice (leads); needs one more)"),
        "{out}"
    );
    // One approval of two: the retry is still held, on the same proposal.
    assert_eq!(held(&c.post(&charge(2, 500, "two-1")).await), id);
    assert_eq!(gw.executions("charge_card"), 0);
    let (ok, text, err) = as_reviewer(&gw, &folder, "bob", &["show", &id]);
    assert!(ok, "{err}");
    assert!(
        text.contains("approvals  1 of 2 approvals: alice (leads); needs one more"),
        "{text}"
    );
    let (ok, list, _) = as_reviewer(&gw, &folder, "bob", &["pending"]);
    assert!(
        ok && list.contains("1 of 2 approvals: alice (leads)"),
        "{list}"
    );
    let out = approve(&gw, &folder, "bob", &id);
    assert!(out.starts_with(&format!("approved {id}")), "{out}");
    assert!(ran(&c.post(&charge(3, 500, "two-1")).await));
    let again = c.post(&charge(4, 500, "two-1")).await;
    assert_eq!(
        again.last()["result"]["_meta"]["dev.countersign/replayed"]["key"],
        "two-1",
        "{again:?}"
    );
    assert_eq!(gw.executions("charge_card"), 1);
    // Both reviewers, each under the policy set in force, in the evidence.
    let p = shown(&gw, &folder, &id);
    assert_eq!(p["state"], "consumed", "{p}");
    let digest = p["policy_set"].as_str().unwrap().to_owned();
    for g in p["approvals"].as_array().unwrap() {
        assert_eq!(g["statement"]["type"], "countersign.approval.v3", "{g}");
        assert_eq!(g["statement"]["policy_set"], digest.as_str(), "{g}");
    }
    wait_for_audit(
        &gw,
        "one entry per approval, one for the quorum, both digests at execution",
        |entries| {
            let partial = entries
                .iter()
                .filter(|e| e["kind"] == "approval_partial")
                .count();
            let granted = entries.iter().any(|e| {
                e["kind"] == "approval_granted" && e["approvers"] == json!(["alice", "bob"])
            });
            let consumed = entries.iter().any(|e| {
                e["kind"] == "approval_consumed"
                    && e["approval"]["policy_set_now"] == digest.as_str()
                    && e["approval"]["approvers"][1]["policy_set"] == digest.as_str()
            });
            partial == 2 && granted && consumed
        },
    )
    .await;
    // Every embedded statement verifies against the reviewers file, and an
    // exported approval names the policy set.
    let dir = gw.audit_dir();
    let reviewers = folder.path().join("reviewers.toml");
    let (ok, out, err) = run_cli(&[
        "audit",
        "verify",
        "--dir",
        dir.to_str().unwrap(),
        "--reviewers",
        reviewers.to_str().unwrap(),
    ]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = run_cli(&["audit", "export", "--dir", dir.to_str().unwrap()]);
    assert!(ok, "{err}");
    let exported = out
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["kind"] == "approval_partial")
        .unwrap();
    assert_eq!(
        exported["approval"]["statement"]["policy_set"],
        digest.as_str()
    );
}

#[tokio::test]
async fn one_reviewer_with_two_keys_counts_once_and_the_requester_not_at_all() {
    let folder = Folder::new();
    let gw = gateway(&folder, "");
    let c = agent(&gw).await;
    let id = held(&c.post(&charge(1, 500, "keys-1")).await);
    approve(&gw, &folder, "alice", &id);
    // alice again, with her other key: refused, and she still counts once.
    let (ok, out, err) = as_reviewer(&gw, &folder, "alice-phone", &["approve", &id]);
    assert!(!ok, "{out}");
    assert!(err.contains("reviewer `alice` already approved"), "{err}");
    assert!(err.contains("counts once"), "{err}");
    // The requester's own approval is refused.
    let (ok, out, err) = as_reviewer(&gw, &folder, "agent-7", &["approve", &id]);
    assert!(!ok, "{out}");
    assert!(err.contains("nobody approves their own call"), "{err}");
    assert_eq!(held(&c.post(&charge(2, 500, "keys-1")).await), id);
    let p = shown(&gw, &folder, &id);
    assert_eq!(p["approvals"].as_array().unwrap().len(), 1, "{p}");
    assert_eq!(gw.executions("charge_card"), 0);
    // Her phone's key is hers: it signs for her on another proposal.
    let other = held(&c.post(&charge(3, 600, "keys-2")).await);
    approve(&gw, &folder, "alice-phone", &other);
    approve(&gw, &folder, "bob", &other);
    assert!(ran(&c.post(&charge(4, 600, "keys-2")).await));
    assert_eq!(gw.executions("charge_card"), 1);
}

#[tokio::test]
async fn finance_and_leads_is_not_met_by_two_leads() {
    let folder = Folder::new();
    let gw = gateway(&folder, "");
    let c = agent(&gw).await;
    let close = |id| keyed(id, "close_account", json!({"account":"acct_9"}), "close-1");
    let id = held(&c.post(&close(1)).await);
    approve(&gw, &folder, "alice", &id);
    let out = approve(&gw, &folder, "bob", &id);
    assert!(out.contains("needs one more from finance"), "{out}");
    assert_eq!(held(&c.post(&close(2)).await), id);
    assert_eq!(gw.executions("close_account"), 0);
    let out = approve(&gw, &folder, "dave", &id);
    assert!(out.starts_with(&format!("approved {id}")), "{out}");
    assert!(ran(&c.post(&close(3)).await));
    assert_eq!(gw.executions("close_account"), 1);
}

#[tokio::test]
async fn a_denial_by_the_second_reviewer_ends_it() {
    let folder = Folder::new();
    let gw = gateway(&folder, "");
    let c = agent(&gw).await;
    let id = held(&c.post(&charge(1, 500, "deny-1")).await);
    approve(&gw, &folder, "alice", &id);
    let (ok, out, err) = as_reviewer(
        &gw,
        &folder,
        "bob",
        &["deny", &id, "--reason", "not this account"],
    );
    assert!(ok, "{out}{err}");
    let refused = c.post(&charge(2, 500, "deny-1")).await;
    assert_eq!(code(&refused), "approval_denied", "{refused:?}");
    assert_eq!(gw.executions("charge_card"), 0);
    // Decided: nobody adds to it any more.
    let (ok, _, err) = as_reviewer(&gw, &folder, "dave", &["approve", &id]);
    assert!(!ok && err.contains("too late"), "{err}");
    assert_eq!(gw.executions("charge_card"), 0);
}

#[tokio::test]
async fn an_approval_withdrawn_before_the_quorum_no_longer_counts() {
    let folder = Folder::new();
    let gw = gateway(&folder, "");
    let c = agent(&gw).await;
    let id = held(&c.post(&charge(1, 500, "wd-1")).await);
    approve(&gw, &folder, "alice", &id);
    let (ok, out, err) = as_reviewer(&gw, &folder, "alice", &["withdraw", &id]);
    assert!(ok, "{err}");
    assert!(out.contains("0 of 2 approvals; needs 2 more"), "{out}");
    // bob's is now the only one: not enough.
    approve(&gw, &folder, "bob", &id);
    assert_eq!(held(&c.post(&charge(2, 500, "wd-1")).await), id);
    assert_eq!(gw.executions("charge_card"), 0);
    // Nothing to withdraw for someone who did not approve.
    let (ok, _, err) = as_reviewer(&gw, &folder, "dave", &["withdraw", &id]);
    assert!(!ok && err.contains("has no approval"), "{err}");
    // Once the quorum is met, it is too late to take a yes back.
    approve(&gw, &folder, "dave", &id);
    let (ok, _, err) = as_reviewer(&gw, &folder, "bob", &["withdraw", &id]);
    assert!(!ok && err.contains("approved"), "{err}");
    assert!(ran(&c.post(&charge(3, 500, "wd-1")).await));
    assert_eq!(gw.executions("charge_card"), 1);
}

#[tokio::test]
async fn a_first_approval_that_expires_before_the_second_makes_a_new_proposal() {
    let folder = Folder::new();
    let gw = gateway(&folder, "");
    let c = agent(&gw).await;
    let id = held(&c.post(&charge(1, 500, "exp-1")).await);
    let (ok, out, err) = as_reviewer(&gw, &folder, "alice", &["approve", &id, "--ttl", "2s"]);
    assert!(ok, "{out}{err}");
    // The gateway's own record of when alice's yes stops counting.
    let until = shown(&gw, &folder, &id)["approvals"][0]["expires_ms"]
        .as_i64()
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    tokio::time::sleep(std::time::Duration::from_millis(
        (until - now).max(0) as u64 + 50,
    ))
    .await;
    let (ok, _, err) = as_reviewer(&gw, &folder, "bob", &["approve", &id]);
    assert!(!ok && err.contains("expired"), "{err}");
    let again = c.post(&charge(2, 500, "exp-1")).await;
    assert_eq!(code(&again), "approval_pending", "{again:?}");
    let fresh = proposal_id(&again);
    assert_ne!(fresh, id, "a new proposal");
    assert_eq!(shown(&gw, &folder, &id)["state"], "expired");
    assert_eq!(gw.executions("charge_card"), 0);
}

/// Two gateways on one PostgreSQL database, 20 rounds: the agent's charge
/// waits on gateway A, and two reviewers approve it at the same moment,
/// one through each gateway. Both approvals land (compare and set on the
/// proposal's revision), the quorum is met once, and each round runs
/// exactly once.
#[tokio::test]
async fn two_reviewers_at_once_through_two_gateways_make_one_execution_per_round() {
    let folder = Folder::new();
    let schema = common::pg::Schema::new();
    let start = || {
        common::pg::on(
            &schema,
            Options {
                policies: Some(folder.path().to_owned()),
                ..Default::default()
            },
        )
    };
    let (a, b) = (start(), start());
    let c = agent(&a).await;
    let runs = |gw: &Gateway| gw.executions("charge_card");
    for round in 1..=20i64 {
        let key = format!("pg-quorum-{round}");
        let id = held(&c.post(&charge(round * 10, 500, &key)).await);
        // Both at once: two CLI processes started together.
        let spawn = |gw: &Gateway, who: &str| {
            std::process::Command::new(countersign_bin())
                .args(["approve", &id, "--key"])
                .arg(folder.key(who))
                .args(["--gateway", &gw.base()])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (first, second) = (spawn(&a, "alice"), spawn(&b, "bob"));
        for (who, child) in [("alice", first), ("bob", second)] {
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "round {round}: {who}'s approval was refused: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let p = shown(&b, &folder, &id);
        assert_eq!(p["state"], "approved", "round {round}: {p}");
        assert_eq!(
            p["approvals"].as_array().unwrap().len(),
            2,
            "round {round}: {p}"
        );
        assert!(
            ran(&c.post(&charge(round * 10 + 1, 500, &key)).await),
            "round {round}"
        );
        assert!(
            ran(&c.post(&charge(round * 10 + 2, 500, &key)).await),
            "round {round}: replay"
        );
        assert_eq!(runs(&a) + runs(&b), round as usize, "round {round}");
    }
}
