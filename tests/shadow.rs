//! Shadow policies and `policy diff` (DESIGN.md section 22), over the real
//! gateway and the example server: a shadow set never changes what happens,
//! its disagreements are counted and audited, and `policy diff` reports
//! them, and the moves between two commits of a policy folder in a real git
//! repository.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Map, Value};

use common::{code, countersign};

const METRICS_TOKEN: &str = "scraper-token-1";

fn policies_src() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policies")
}

/// A folder with the shipped schema and default policies, plus `extra`.
fn folder(dir: &Path, extra: &str) {
    std::fs::create_dir_all(dir).unwrap();
    for f in ["schema.cedarschema", "default.cedar"] {
        std::fs::copy(policies_src().join(f), dir.join(f)).unwrap();
    }
    if !extra.is_empty() {
        std::fs::write(dir.join("next.cedar"), extra).unwrap();
    }
}

const LOOSEN_REFUNDS: &str = r#"
@id("refunds-unattended")
permit (principal, action == Action::"call", resource == Tool::"payments/refund");

@id("no-transfers")
forbid (principal, action == Action::"call", resource == Tool::"payments/transfer");
"#;

struct Shadowed {
    gw: common::Gateway,
    shadow: PathBuf,
    keys: PathBuf,
    _dirs: tempfile::TempDir,
}

impl Shadowed {
    fn start(shadow_extra: &str) -> Shadowed {
        let dirs = tempfile::tempdir().unwrap();
        let enforced = dirs.path().join("policies");
        let shadow = dirs.path().join("policies-next");
        folder(&enforced, "");
        folder(&shadow, shadow_extra);
        let keys = dirs.path().join("keys");
        let out = std::process::Command::new(common::countersign_bin())
            .args(["keygen", "--name", "alice", "--groups", "leads", "--out"])
            .arg(keys.join("alice.key"))
            .arg("--append")
            .arg(enforced.join("reviewers.toml"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let gw = common::Gateway::start_with(common::Options {
            policies: Some(enforced),
            extra: format!(
                "\n[policy]\nshadow = \"{}\"\n\n[metrics]\ntoken_sha256 = \"{}\"\n",
                shadow.display(),
                common::sha(METRICS_TOKEN)
            ),
            ..Default::default()
        });
        Shadowed {
            gw,
            shadow,
            keys,
            _dirs: dirs,
        }
    }

    async fn client(&self) -> common::Client {
        let mut c = common::Client::new(&self.gw.url("payments"));
        c.initialize().await;
        c.post(&json!({"jsonrpc":"2.0","id":0,"method":"tools/list"}))
            .await;
        c
    }

    async fn approve(&self, id: &str) {
        let key = self.keys.join("alice.key").display().to_string();
        let base = self.gw.base();
        let (ok, out, err) = common::run_cli_async(&[
            "approve",
            id,
            "--reason",
            "ok",
            "--key",
            &key,
            "--gateway",
            &base,
        ])
        .await;
        assert!(ok, "approve: {out}{err}");
    }

    fn disagreements(&self) -> Vec<Map<String, Value>> {
        common::audit_entries(&self.gw.audit_dir())
            .into_iter()
            .filter(|e| e["kind"] == "shadow_disagreement")
            .collect()
    }

    async fn metric(&self, tool: &str, from: &str, to: &str) -> f64 {
        let text = reqwest::Client::new()
            .get(format!("{}/metrics", self.gw.base()))
            .bearer_auth(METRICS_TOKEN)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let m = openmetrics_parser::openmetrics::parse_openmetrics(&text)
            .unwrap_or_else(|e| panic!("not OpenMetrics ({e:?}):\n{text}"));
        let Some(f) = m.families.get("countersign_shadow_disagreements") else {
            return 0.0;
        };
        let value = f
            .iter_samples()
            .find(|s| {
                let l = s.get_labelset().unwrap();
                l.get_label_value("server") == Some("payments")
                    && l.get_label_value("tool") == Some(tool)
                    && l.get_label_value("from") == Some(from)
                    && l.get_label_value("to") == Some(to)
            })
            .map_or(0.0, |s| match &s.value {
                openmetrics_parser::OpenMetricsValue::Counter(c) => c.value.as_f64(),
                other => panic!("not a counter: {other:?}"),
            });
        value
    }
}

async fn keyed(c: &common::Client, id: i64, tool: &str, args: Value, key: &str) -> common::Answer {
    c.post(
        &json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
        "name": tool, "arguments": args, "_meta": {"dev.countersign/idempotency-key": key}}}),
    )
    .await
}

#[tokio::test]
async fn a_shadow_set_that_loosens_refunds_changes_nothing_and_counts_each_refund_once() {
    let s = Shadowed::start(LOOSEN_REFUNDS);
    let c = s.client().await;
    for i in 0..20 {
        let key = format!("refund-{i}");
        let args = json!({"charge": format!("ch_{i}")});
        // Enforcement as before: the refund waits for a reviewer.
        let held = keyed(&c, 100 + i, "refund", args.clone(), &key).await;
        assert_eq!(code(&held), "approval_pending", "{held:?}");
        let id = countersign(&held)["proposal_id"]
            .as_str()
            .unwrap()
            .to_owned();
        s.approve(&id).await;
        // The retry runs it (and is the same call for the shadow: same key).
        let ran = keyed(&c, 200 + i, "refund", args, &key).await;
        assert_eq!(ran.last()["result"]["isError"], false, "{ran:?}");
    }
    assert_eq!(
        s.gw.executions("refund"),
        20,
        "each refund ran once, after its approval"
    );
    // A transfer the shadow set would deny: held as before.
    let transfer = keyed(
        &c,
        300,
        "transfer",
        json!({"from":"a","to":"b","amount":5}),
        "t-1",
    )
    .await;
    assert_eq!(code(&transfer), "approval_pending", "{transfer:?}");
    assert_eq!(s.gw.executions("transfer"), 0);
    // A read both sets allow: no disagreement.
    let read = c.call(301, "get_balance", json!({"account":"a"})).await;
    assert_eq!(read.last()["result"]["isError"], false);

    common::wait_for_audit(&s.gw, "21 disagreements", |all| {
        all.iter()
            .filter(|e| e["kind"] == "shadow_disagreement")
            .count()
            >= 21
    })
    .await;
    let found = s.disagreements();
    let refunds: Vec<_> = found.iter().filter(|e| e["tool"] == "refund").collect();
    assert_eq!(refunds.len(), 20, "{found:#?}");
    for e in &refunds {
        assert_eq!(e["from"], "approval");
        assert_eq!(e["to"], "allow");
        assert_eq!(e["principal"], "agent-7");
        assert!(e["call_digest"].as_str().unwrap().starts_with("sha256:"));
        assert_eq!(e["policies"], json!(["default/writes-need-approval"]));
        assert!(
            e["shadow_policies"]
                .as_array()
                .unwrap()
                .contains(&json!("next/refunds-unattended")),
            "{e:?}"
        );
        assert!(
            e.get("arguments").is_none(),
            "no arguments in a disagreement: {e:?}"
        );
    }
    let transfers: Vec<_> = found.iter().filter(|e| e["tool"] == "transfer").collect();
    assert_eq!(transfers.len(), 1, "{found:#?}");
    assert_eq!(transfers[0]["from"], "approval");
    assert_eq!(transfers[0]["to"], "deny");
    assert_eq!(
        transfers[0]["shadow_policies"],
        json!(["next/no-transfers"])
    );
    assert_eq!(s.metric("refund", "approval", "allow").await, 20.0);
    assert_eq!(s.metric("transfer", "approval", "deny").await, 1.0);

    // `policy diff --shadow` over the gateway's audit log.
    let dir = s.gw.audit_dir().display().to_string();
    let (ok, out, err) = common::run_cli_async(&[
        "policy", "diff", "--shadow", "--dir", &dir, "--format", "json",
    ])
    .await;
    assert!(ok, "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    // One denominator, as in the inputs form: every call decided (20
    // refunds, each with its retry, a transfer, a read), not only the 21
    // that disagreed.
    assert_eq!(report["looked_at"], 22, "{report}");
    let moves = report["moves"].as_array().unwrap();
    let refund = moves.iter().find(|m| m["tool"] == "refund").unwrap();
    assert_eq!(refund["calls"], 20);
    assert_eq!(refund["loosens"], true);
    assert_eq!(refund["examples"].as_array().unwrap().len(), 3);
    // A loosening fails the gate when asked.
    let (ok, _, _) = common::run_cli_async(&[
        "policy",
        "diff",
        "--shadow",
        "--dir",
        &dir,
        "--fail-on",
        "loosen",
    ])
    .await;
    assert!(!ok, "--fail-on loosen exits 1 when a call would loosen");
    let (ok, out, _) = common::run_cli_async(&["policy", "diff", "--shadow", "--dir", &dir]).await;
    assert!(
        ok && out.contains("payments/refund  approval -> allow (loosens)  20"),
        "{out}"
    );
    assert!(
        out.contains("on the calls of the last day: 21 of 22 calls would be decided otherwise"),
        "{out}"
    );
}

#[tokio::test]
async fn a_broken_shadow_edit_is_logged_with_its_line_and_enforcement_is_untouched() {
    let s = Shadowed::start(LOOSEN_REFUNDS);
    let c = s.client().await;
    std::fs::write(
        s.shadow.join("broken.cedar"),
        "@id(\"oops\")\npermit (principal, action, resource)\nwhen { resource.readOnly &&& true };\n",
    )
    .unwrap();
    s.gw.wait_for_log("shadow policies in").await;
    let line =
        s.gw.log
            .lock()
            .unwrap()
            .iter()
            .find(|l| l.contains("shadow policies in"))
            .cloned()
            .unwrap();
    assert!(line.contains("broken.cedar:3"), "file and line: {line}");
    assert!(line.contains("enforcement unchanged"), "{line}");
    // Enforcement as before, and the last good shadow set still decides.
    let held = keyed(&c, 1, "refund", json!({"charge": "ch_x"}), "r-x").await;
    assert_eq!(code(&held), "approval_pending", "{held:?}");
    let read = c.call(2, "get_balance", json!({"account":"a"})).await;
    assert_eq!(read.last()["result"]["isError"], false);
    common::wait_for_audit(&s.gw, "the previous shadow set still compares", |all| {
        all.iter()
            .any(|e| e["kind"] == "shadow_disagreement" && e["tool"] == "refund")
    })
    .await;
    // Fixed: loaded again.
    std::fs::remove_file(s.shadow.join("broken.cedar")).unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let n =
                s.gw.log
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|l| l.contains("shadow policies loaded"))
                    .count();
            if n >= 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the fixed shadow set is loaded again");
}

#[tokio::test]
async fn a_shadow_evaluation_error_counts_as_a_shadow_deny_never_an_allow() {
    // A permit whose condition overflows at evaluation: Cedar skips an
    // erroring policy; the shadow, like the set in force, denies on it.
    let s = Shadowed::start(
        "@id(\"overflows\")\npermit (principal, action == Action::\"call\", resource == Tool::\"payments/refund\")\nwhen { 9223372036854775807 + 1 > 0 };\n",
    );
    let c = s.client().await;
    let held = keyed(&c, 1, "refund", json!({"charge": "ch_1"}), "r-1").await;
    assert_eq!(
        code(&held),
        "approval_pending",
        "enforcement unchanged: {held:?}"
    );
    common::wait_for_audit(&s.gw, "the erroring shadow decision", |all| {
        all.iter().any(|e| e["kind"] == "shadow_disagreement")
    })
    .await;
    let found = s.disagreements();
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0]["from"], "approval");
    assert_eq!(
        found[0]["to"], "deny",
        "an error is a shadow deny: {:?}",
        found[0]
    );
    assert!(
        found[0]["shadow_errors"]
            .as_array()
            .is_some_and(|e| !e.is_empty()),
        "{:?}",
        found[0]
    );
    assert_eq!(s.metric("refund", "approval", "allow").await, 0.0);
    assert_eq!(s.metric("refund", "approval", "deny").await, 1.0);
}

fn git(repo: &Path, args: &[&str]) {
    let out = std::process::Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(args)
        .current_dir(repo)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
}

const CASES: &str = r#"
[[case]]
name = "a refund"
principal = "agent-7"
tenant = "acme"
server = "payments"
tool = "refund"
annotations = { destructive = false }
arguments = { charge = "ch_1" }
expect = "approval"

[[case]]
name = "a transfer"
principal = "agent-7"
tenant = "acme"
server = "payments"
tool = "transfer"
arguments = { from = "a", to = "b", amount = 5 }
expect = "approval"

[[case]]
name = "a read"
principal = "agent-7"
tenant = "acme"
server = "payments"
tool = "get_balance"
annotations = { read_only = true, destructive = false }
arguments = { account = "acct_42" }
expect = "allow"
"#;

#[test]
fn policy_diff_between_two_commits_of_a_policy_folder_shows_what_moves() {
    let repo = tempfile::tempdir().unwrap();
    let r = repo.path();
    git(r, &["init", "-q", "-b", "main"]);
    folder(&r.join("policies"), "");
    std::fs::write(r.join("policies/cases.toml"), CASES).unwrap();
    git(r, &["add", "-A"]);
    git(r, &["commit", "-qm", "base"]);
    // The change under review: refunds unattended, transfers denied.
    std::fs::write(r.join("policies/next.cedar"), LOOSEN_REFUNDS).unwrap();
    git(r, &["add", "-A"]);
    git(r, &["commit", "-qm", "loosen refunds, forbid transfers"]);
    // The base branch checked out beside it, as a CI job would.
    let outside = tempfile::tempdir().unwrap();
    let base = outside.path().join("base");
    git(
        r,
        &[
            "worktree",
            "add",
            "-q",
            &base.display().to_string(),
            "HEAD~1",
        ],
    );
    let diff = |extra: &[&str]| {
        let mut args = vec![
            "policy".to_owned(),
            "diff".into(),
            base.join("policies").display().to_string(),
            r.join("policies").display().to_string(),
            "--cases".into(),
            r.join("policies/cases.toml").display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        common::run_cli(&args)
    };
    let (ok, out, err) = diff(&["--format", "markdown"]);
    assert!(ok, "{err}");
    let shown = out
        .replace(&base.display().to_string(), "BASE")
        .replace(&r.display().to_string(), "REPO");
    insta::assert_snapshot!("policy_diff_markdown", shown);
    let (ok, out, _) = diff(&["--format", "json"]);
    assert!(ok);
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["looked_at"], 3);
    assert_eq!(report["moves"].as_array().unwrap().len(), 2, "{report}");
    // --fail-on loosen: 1 exactly when something loosened.
    assert!(!diff(&["--fail-on", "loosen"]).0);
    std::fs::write(
        r.join("policies/next.cedar"),
        "@id(\"no-transfers\")\nforbid (principal, action == Action::\"call\", resource == Tool::\"payments/transfer\");\n",
    )
    .unwrap();
    git(r, &["commit", "-qam", "only forbid transfers"]);
    assert!(diff(&["--fail-on", "loosen"]).0, "tightening only: passes");
    assert!(!diff(&["--fail-on", "any"]).0, "but it moves");
    // The same from git revisions, in the repository, without a worktree:
    // `--base-rev` against the folder as it is, then two revisions.
    let in_repo = |extra: &[&str]| {
        let out = std::process::Command::new(common::countersign_bin())
            .args(["policy", "diff", "--cases", "policies/cases.toml"])
            .args(extra)
            .current_dir(r)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, out, err) = in_repo(&["--base-rev", "HEAD~2", "--format", "json"]);
    assert!(ok, "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["moves"].as_array().unwrap().len(), 1, "{report}");
    assert_eq!(report["moves"][0]["tool"], "transfer", "{report}");
    assert!(
        report["over"]
            .as_str()
            .unwrap()
            .contains("under policies@HEAD~2 and then policies"),
        "{report}"
    );
    let (ok, out, err) = in_repo(&["--base-rev", "HEAD~2", "--head-rev", "HEAD~1"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("2 of 3 cases") && out.contains("policies@HEAD~1"),
        "{out}"
    );
    let (ok, _, err) = in_repo(&["--base-rev", "no-such-branch"]);
    assert!(!ok && err.contains("no-such-branch"), "{err}");
    // Without cases, it says what to give.
    let (ok, _, err) = common::run_cli(&[
        "policy",
        "diff",
        &base.join("policies").display().to_string(),
        &r.join("policies").display().to_string(),
    ]);
    assert!(!ok && err.contains("--cases"), "{err}");
}

#[tokio::test]
async fn kept_decision_inputs_feed_policy_diff_and_are_exported_and_erased_per_tenant() {
    let dirs = tempfile::tempdir().unwrap();
    let base = dirs.path().join("base");
    let head = dirs.path().join("head");
    folder(&base, "");
    folder(&head, LOOSEN_REFUNDS);
    let (key, entry) = common::lead_of_acme(dirs.path(), "alice");
    std::fs::write(base.join("reviewers.toml"), entry).unwrap();
    let mut gw = common::Gateway::start_with(common::Options {
        policies: Some(base.clone()),
        extra: "\n[policy]\ninputs = true\ninputs_retention = \"1h\"\n".into(),
        ..Default::default()
    });
    let c = {
        let mut c = common::Client::new(&gw.url("payments"));
        c.initialize().await;
        c.post(&json!({"jsonrpc":"2.0","id":0,"method":"tools/list"}))
            .await;
        c
    };
    for i in 0..3 {
        let a = keyed(
            &c,
            i,
            "refund",
            json!({"charge": format!("ch_{i}")}),
            &format!("r-{i}"),
        )
        .await;
        assert_eq!(code(&a), "approval_pending");
        // The same call again: recorded once.
        keyed(
            &c,
            10 + i,
            "refund",
            json!({"charge": format!("ch_{i}")}),
            &format!("r-{i}"),
        )
        .await;
    }
    let read = c.call(20, "get_balance", json!({"account": "a"})).await;
    assert_eq!(read.last()["result"]["isError"], false);
    // globex's call, to erase apart.
    let mut g = common::Client::new(&gw.url("payments"));
    g.token = common::GLOBEX_TOKEN.into();
    g.initialize().await;
    keyed(
        &g,
        1,
        "transfer",
        json!({"from": "a", "to": "b", "amount": 5}),
        "t-1",
    )
    .await;
    // While the gateway runs on redb it holds the files: without a key the
    // command says what to give; with a reviewer's key it reads through the
    // gateway, in the reviewer's tenants only (alice reviews acme).
    let config_path = gw.config_path().display().to_string();
    let (ok, _, err) = common::run_cli(&["policy", "inputs", "export", "--config", &config_path]);
    assert!(!ok && err.contains("--key"), "{err}");
    let (ok, out, err) = common::review_cli(
        &gw,
        &key,
        &["policy", "inputs", "export", "--config", &config_path],
    );
    assert!(ok, "{err}");
    let live: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(live.len(), 4, "3 refunds and a read of acme: {out}");
    assert!(live.iter().all(|r| r["tenant"] == "acme"), "{out}");
    let (ok, out, err) = common::review_cli(
        &gw,
        &key,
        &[
            "policy",
            "diff",
            &base.display().to_string(),
            &head.display().to_string(),
            "--config",
            &config_path,
            "--format",
            "json",
        ],
    );
    assert!(ok, "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["looked_at"], 4, "{report}");
    // A clean stop writes what waits, and leaves the redb file to the
    // commands.
    gw.wait_for_log("decision inputs are kept").await;
    gw.terminate();
    let config = gw.config_path().display().to_string();

    let (ok, out, err) = common::run_cli(&["policy", "inputs", "export", "--config", &config]);
    assert!(ok, "{err}");
    let rows: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        rows.len(),
        5,
        "3 refunds once each, a read, a transfer: {out}"
    );
    let refund = rows.iter().find(|r| r["tool"] == "refund").unwrap();
    assert_eq!(refund["principal"], "agent-7");
    assert_eq!(refund["tenant"], "acme");
    assert_eq!(refund["groups"], json!(["agents"]));
    assert_eq!(refund["decision"], "approval");
    assert!(refund["arguments"]["charge"].is_string(), "{refund}");

    // policy diff from the store: the refunds would loosen, the transfer would be denied.
    let (ok, out, err) = common::run_cli(&[
        "policy",
        "diff",
        &base.display().to_string(),
        &head.display().to_string(),
        "--config",
        &config,
        "--format",
        "json",
    ]);
    assert!(ok, "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["looked_at"], 5, "{report}");
    let moves = report["moves"].as_array().unwrap();
    let refunds = moves.iter().find(|m| m["tool"] == "refund").unwrap();
    assert_eq!(
        (
            refunds["from"].as_str(),
            refunds["to"].as_str(),
            refunds["calls"].as_u64()
        ),
        (Some("approval"), Some("allow"), Some(3))
    );
    assert!(
        moves
            .iter()
            .any(|m| m["tool"] == "transfer" && m["to"] == "deny"),
        "{report}"
    );

    // Erase one tenant: the other's stay.
    let (ok, _, err) = common::run_cli(&[
        "policy", "inputs", "erase", "--tenant", "globex", "--config", &config,
    ]);
    assert!(ok && err.contains("erased 1"), "{err}");
    let (_, out, _) = common::run_cli(&["policy", "inputs", "export", "--config", &config]);
    assert_eq!(out.lines().count(), 4);
    assert!(!out.contains("globex"));
    let (_, out, _) = common::run_cli(&[
        "policy", "inputs", "export", "--tenant", "acme", "--config", &config,
    ]);
    assert_eq!(out.lines().count(), 4);

    // Without kept inputs and without cases, it says what to turn on.
    let off = dirs.path().join("off.toml");
    std::fs::write(&off, "[gateway]\ndata_dir = \"x\"\n").unwrap();
    let (ok, _, err) = common::run_cli(&[
        "policy",
        "diff",
        &base.display().to_string(),
        &head.display().to_string(),
        "--config",
        &off.display().to_string(),
    ]);
    assert!(
        !ok && err.contains("[policy] inputs = true") && err.contains("--cases"),
        "{err}"
    );
}
