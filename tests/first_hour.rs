//! What a new user meets in the first hour, tried as they would: the
//! messages of the commands they type, logs read from a file, an export
//! piped into `head`, a live export, and a gateway that is down.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;

#[test]
fn a_missing_config_file_is_named_once_with_what_to_pass() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(common::countersign_bin())
        .current_dir(dir.path())
        .args(["check"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot read config file `countersign.toml`"),
        "{err}"
    );
    assert_eq!(
        err.matches("No such file or directory").count(),
        1,
        "the cause is said once: {err}"
    );
    assert!(err.contains("--config"), "{err}");
}

#[tokio::test]
async fn check_prints_each_tools_effective_annotations() {
    let gw = common::Gateway::start();
    let (ok, out, err) =
        common::run_cli_async(&["check", "--config", gw.config_path().to_str().unwrap()]).await;
    assert!(ok, "{out}{err}");
    let line = |tool: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(&format!("{tool} ")))
            .unwrap_or_else(|| panic!("no line for {tool}: {out}"))
            .to_owned()
    };
    assert!(line("get_balance").contains("read-only"), "{out}");
    assert!(
        line("close_account").contains("write, destructive"),
        "{out}"
    );
    // No annotations at all: the MCP defaults, the most cautious reading.
    assert!(line("transfer").contains("write, destructive"), "{out}");
    assert!(line("charge_card").contains("write;"), "{out}");
}

#[tokio::test]
async fn logs_written_to_a_file_carry_no_escape_codes() {
    // The gateway's stderr is a pipe here, as in a desktop client's log file.
    let mut gw = common::Gateway::start();
    let c = common::listed(&gw, "payments").await;
    c.call(2, "get_balance", json!({"account": "acct-1"})).await;
    gw.wait_for_log("listening on").await;
    gw.terminate();
    let log = gw.log.lock().unwrap().join("\n");
    assert!(log.contains("INFO"), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "an ESC byte in a log read from a file: {log:?}"
    );
}

/// Entries of a gateway's audit log after a few calls.
async fn gateway_with_entries() -> common::Gateway {
    let gw = common::Gateway::start();
    let c = common::listed(&gw, "payments").await;
    for i in 0..30 {
        c.call(10 + i, "get_balance", json!({"account": "acct-1"}))
            .await;
    }
    common::wait_for_audit(&gw, "30 completed reads", |e| {
        e.iter().filter(|e| e["kind"] == "completed").count() >= 30
    })
    .await;
    gw
}

#[tokio::test]
async fn an_export_into_a_closed_pipe_is_not_an_error_about_the_log() {
    let gw = gateway_with_entries().await;
    let dir = gw.audit_dir();
    let mut child = Command::new(common::countersign_bin())
        .args(["audit", "export", "--dir", dir.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // `| head -1`: read one line, then close the pipe.
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.contains("\"seq\":1"), "{first}");
    drop(stdout);
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}: {err}");
    assert!(!err.contains("Broken pipe"), "{err}");
    assert!(!err.contains("audit log"), "{err}");
}

#[tokio::test]
async fn export_follow_streams_new_entries_as_they_are_written() {
    let gw = common::Gateway::start();
    let c = common::listed(&gw, "payments").await;
    let dir = gw.audit_dir();
    common::wait_for_audit(&gw, "the first entries", |e| !e.is_empty()).await;
    let mut child = Command::new(common::countersign_bin())
        .args([
            "audit",
            "export",
            "--follow",
            "--dir",
            dir.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<serde_json::Value>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            if tx.send(v).is_err() {
                break;
            }
        }
    });
    // What was there first, then a call made after the export started.
    c.call(2, "get_balance", json!({"account": "acct-follow"}))
        .await;
    let found = tokio::time::timeout(Duration::from_secs(20), async {
        let mut seqs = Vec::new();
        while let Some(e) = rx.recv().await {
            seqs.push(e["seq"].as_u64().unwrap());
            if e["kind"] == "completed" && e["tool"] == "get_balance" {
                return seqs;
            }
        }
        panic!("the export ended");
    })
    .await
    .expect("the new call's entries never came out of --follow");
    // In order, from the first entry, none twice.
    assert_eq!(found.first(), Some(&1));
    assert!(found.windows(2).all(|w| w[1] == w[0] + 1), "{found:?}");
    // Still following: it has not exited.
    assert!(child.try_wait().unwrap().is_none());
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test]
async fn verify_on_a_running_gateway_calls_its_tail_live_not_truncated() {
    let mut gw = gateway_with_entries().await;
    let dir = gw.audit_dir();
    let out = Command::new(common::countersign_bin())
        .args(["audit", "verify", "--dir", dir.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("live: a gateway is writing this log"),
        "{text}"
    );
    assert!(!text.contains("truncation"), "{text}");
    // A second gateway on the same data dir is refused (its ledger and its
    // audit log are this one's; the audit log's own lock is tested with
    // the writer).
    let config = gw.config_path();
    let second = Command::new(common::countersign_bin())
        .args(["serve", "--config", config.to_str().unwrap()])
        .env("COUNTERSIGN_LOG", "error")
        .output()
        .unwrap();
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        err.contains("is a gateway") && err.contains("running on this data"),
        "{err}"
    );
    // Stopped cleanly: neither live nor truncated.
    gw.terminate();
    let out = Command::new(common::countersign_bin())
        .args(["audit", "verify", "--dir", dir.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("ends with a clean-shutdown checkpoint") && !text.contains("live:"),
        "{text}"
    );
}

#[tokio::test]
async fn the_bridge_says_connection_refused_and_how_long_it_retries() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = tokio::process::Command::new(common::countersign_bin())
        .args([
            "stdio",
            "--server",
            "payments",
            "--gateway",
            &format!("http://127.0.0.1:{port}"),
            "--reconnect-for",
            "1s",
        ])
        .env("COUNTERSIGN_TOKEN", common::TOKEN)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n")
        .await
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let answer = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("no answer from the bridge")
        .unwrap()
        .unwrap();
    assert!(answer.contains("Connection refused"), "{answer}");
    assert!(answer.contains("--reconnect-for 1s"), "{answer}");
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is not reachable (Connection refused") && err.contains("(--reconnect-for)"),
        "{err}"
    );
    assert!(!err.contains("error sending request for url"), "{err}");
}

#[tokio::test]
async fn reviewers_can_live_outside_the_policy_checkout_and_are_hot_reloaded() {
    // The policy folder as a read-only checkout would have it: no reviewers.
    let pdir = tempfile::tempdir().unwrap();
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    for f in ["schema.cedarschema", "default.cedar"] {
        std::fs::copy(shipped.join(f), pdir.path().join(f)).unwrap();
    }
    let local = tempfile::tempdir().unwrap();
    let reviewers = local.path().join("reviewers.toml");
    let gw = common::Gateway::start_with(common::Options {
        policies: Some(pdir.path().to_owned()),
        approvals: format!("hold = \"0s\"\nreviewers = \"{}\"\n", reviewers.display()),
        ..Default::default()
    });
    let c = common::listed(&gw, "payments").await;
    let charge = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{
        "name":"charge_card","arguments":{"account":"acct-1","amount":5},
        "_meta":{"dev.countersign/idempotency-key":"local-1"}}});
    let held = c.post(&charge).await;
    assert_eq!(common::code(&held), "approval_pending", "{held:?}");
    let id = common::proposal_id(&held);
    // The README's step: keygen appends the entry to the local file.
    let key = local.path().join("keys/alice.key");
    let (ok, entry, err) = common::run_cli_async(&[
        "keygen",
        "--name",
        "alice",
        "--groups",
        "leads",
        "--out",
        key.to_str().unwrap(),
    ])
    .await;
    assert!(ok, "{err}");
    std::fs::write(&reviewers, entry).unwrap();
    gw.wait_for_log("policies reloaded").await;
    let (ok, out, err) = common::review_cli(&gw, &key, &["approve", &id]);
    assert!(ok, "{out}{err}");
    let ran = c.post(&charge).await;
    assert!(ran.response_text().contains("charged"), "{ran:?}");
    assert_eq!(gw.executions("charge_card"), 1);
    // The policy folder was never written.
    assert!(!pdir.path().join("reviewers.toml").exists());
}

/// Runs `args` with its standard output a pipe whose reader is already
/// closed (`| head -1` that has read its line): stderr and the exit.
fn into_a_closed_pipe(args: &[&str]) -> (std::process::ExitStatus, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(common::countersign_bin())
        .args(args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn every_printing_command_ends_quietly_on_a_closed_pipe() {
    let (pdir, key) = common::default_policies_with_alice();
    let mut gw = common::Gateway::start_with(common::Options {
        policies: Some(pdir.path().to_owned()),
        extra: "\n[policy]\ninputs = true\n".into(),
        ..Default::default()
    });
    let c = common::listed(&gw, "payments").await;
    let held = c
        .call(1, "refund", json!({"charge": "ch_1", "amount": 5}))
        .await;
    let id = common::proposal_id(&held);
    c.call(2, "get_balance", json!({"account": "acct-1"})).await;
    common::wait_for_audit(&gw, "the read's entry", |e| {
        e.iter().any(|e| e["kind"] == "completed")
    })
    .await;
    let config = gw.config_path().display().to_string();
    let audit = gw.audit_dir().display().to_string();
    let policies = pdir.path().display().to_string();
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/policies");
    let tests = format!("{shipped}/tests.toml");
    let keyfile = key.display().to_string();
    let base = gw.base();
    let newkey = pdir.path().join("bob.key").display().to_string();
    let reviewer = ["--key", &keyfile, "--gateway", &base];
    let running: Vec<Vec<&str>> = vec![
        vec!["policy", "check", "--dir", &policies],
        vec!["policy", "test", &tests, "--dir", shipped],
        vec!["policy", "diff", shipped, shipped, "--cases", &tests],
        vec![
            "policy", "schema", "--server", "payments", "--config", &config,
        ],
        vec!["check", "--config", &config],
        vec!["tools", "list", "--config", &config],
        vec!["audit", "verify", "--dir", &audit],
        vec!["audit", "export", "--dir", &audit],
        vec!["audit", "pubkey", "--dir", &audit],
        vec!["keygen", "--name", "bob", "--out", &newkey],
        [&["pending"][..], &reviewer].concat(),
        [&["show", &id][..], &reviewer].concat(),
        [&["budgets"][..], &reviewer].concat(),
        [
            "reconcile",
            "--list",
            "--config",
            &config,
            "--reviewer-key",
            &keyfile,
            "--gateway",
            &base,
        ]
        .to_vec(),
        vec!["reviewer", "invite", "carol", "--config", &config],
        vec!["help"],
    ];
    for args in &running {
        let (status, err) = into_a_closed_pipe(args);
        assert!(
            status.success() && !err.contains("panicked") && !err.contains("Broken pipe"),
            "`countersign {}` into a closed pipe: {status:?}\n{err}",
            args.join(" ")
        );
    }
    // The decision inputs and the checkpoint of a stopped gateway.
    assert!(gw.terminate().success());
    let stopped: Vec<Vec<&str>> = vec![
        vec!["policy", "inputs", "export", "--config", &config],
        vec!["policy", "diff", shipped, shipped, "--config", &config],
        vec!["audit", "checkpoint", "--dir", &audit],
        vec!["audit", "prove", "1", "--dir", &audit],
        vec!["audit", "export", "--with-proofs", "--dir", &audit],
    ];
    for args in &stopped {
        let (status, err) = into_a_closed_pipe(args);
        assert!(
            status.success() && !err.contains("panicked") && !err.contains("Broken pipe"),
            "`countersign {}` into a closed pipe: {status:?}\n{err}",
            args.join(" ")
        );
    }
}

#[tokio::test]
async fn two_sessions_charges_have_different_ids() {
    let gw = common::Gateway::start();
    let mut ids = Vec::new();
    for _ in 0..2 {
        // A session of its own: on stdio, an example server process of its own.
        let c = common::listed(&gw, "payments").await;
        let a = c
            .call(1, "charge_card", json!({"account": "acct-1", "amount": 5}))
            .await;
        let text = a.response_text();
        let id = text
            .split("(charge ")
            .nth(1)
            .and_then(|t| t.split(')').next())
            .unwrap_or_else(|| panic!("no charge id in {text}"))
            .to_owned();
        ids.push(id);
    }
    assert_ne!(ids[0], ids[1], "one id for two charges looks like a replay");
}

/// The README's set-up command and five-step quick start, run as written
/// (in a folder with the clone's `policies/` and `examples/countersign.toml`,
/// this run's binaries for `target/release`, a free port for 7373, and a
/// 1 s `approvals.hold` for the example's 10 s): a read runs, a charge is
/// held, approved, and runs once through two more sends; the log verifies.
#[tokio::test]
async fn the_readme_quick_start_runs_as_written() {
    use common::docs::{example_clone, said, sh, sh_blocks, spawn, Background};
    let setup = sh_blocks("README.md", "## Set up", Some("## Quick start"));
    let steps = sh_blocks("README.md", "## Quick start", Some("## Guides"));
    assert_eq!(steps.len(), 4, "{steps:#?}");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (port, rw) = example_clone(d);
    // HOME for `~/.countersign/alice.key`.
    let home = d.join("home");
    std::fs::create_dir_all(&home).unwrap();
    // Another port than 7373: the README says to set COUNTERSIGN_GATEWAY.
    let in_home = |script: &str| {
        format!(
            "export HOME={} COUNTERSIGN_GATEWAY=http://127.0.0.1:{port}\n{}",
            home.display(),
            rw.apply(script)
        )
    };

    let serve = setup
        .iter()
        .flat_map(|b| b.lines())
        .find_map(|l| {
            l.split("&& ")
                .nth(1)
                .filter(|c| c.contains("countersign serve"))
        })
        .expect("the set-up command that runs the gateway");
    let mut gateway = spawn(d, &rw.apply(serve));
    common::wait_listening(&mut gateway, "the gateway");
    let _gateway = Background(gateway);

    // 1. A reviewer.
    let out = sh(d, &in_home(&steps[0]));
    assert!(out.status.success(), "{}", said(&out));
    common::eventually("the gateway reads the new reviewer", || {
        std::fs::read_to_string(d.join(".countersign/reviewers.toml"))
            .is_ok_and(|t| t.contains("alice"))
    })
    .await;
    // 2. A read runs.
    let out = sh(d, &in_home(&steps[1]));
    assert!(said(&out).contains("balance of acct_42"), "{}", said(&out));
    // 3. The charge is held.
    let out = sh(d, &in_home(&steps[2]));
    let held = said(&out);
    assert!(held.contains("approval_pending"), "{held}");
    let id = held
        .split("\"proposal_id\":\"")
        .nth(1)
        .and_then(|t| t.split('"').next())
        .expect("a proposal id")
        .to_owned();
    // 4. Pending shows it; approve it.
    let out = sh(d, &in_home(&steps[3].replace("p-…", &id)));
    assert!(
        out.status.success() && said(&out).contains(&id),
        "{}",
        said(&out)
    );
    // 5. Sent again: it runs; and again: the same answer, no second charge.
    let first = said(&sh(d, &in_home(&steps[2])));
    assert!(first.contains("charged 12.5 to acct_42"), "{first}");
    let again = said(&sh(d, &in_home(&steps[2])));
    assert!(again.contains("charged 12.5 to acct_42"), "{again}");
    let charges = std::fs::read_to_string(d.join(".countersign/payments-executions.jsonl"))
        .unwrap()
        .lines()
        .filter(|l| l.contains("\"tool\":\"charge_card\""))
        .count();
    assert_eq!(charges, 1, "one charge through three sends");
    let out = sh(
        d,
        &in_home("countersign audit verify --dir .countersign/audit"),
    );
    assert!(out.status.success(), "{}", said(&out));
}

/// docs/policies.md's walk-through, run as written in a fresh git
/// repository holding the clone's `policies/` and example configuration:
/// the shadow set's disagreement counted out of every call decided, and
/// the change diffed from git revisions.
#[tokio::test]
async fn the_policies_walk_through_runs_as_written() {
    use common::docs::{example_clone, said, sh, sh_blocks, spawn, Background};
    let steps = sh_blocks("docs/policies.md", "## Walk-through", Some("## Policies"));
    assert_eq!(steps.len(), 5, "{steps:#?}");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_, rw) = example_clone(d);
    let git = "git init -q -b main && git -c user.name=t -c user.email=t@example.com add -A \
               && git -c user.name=t -c user.email=t@example.com commit -qm policies";
    let out = sh(d, git);
    assert!(out.status.success(), "{}", said(&out));

    // 1. The changed set beside the one in force.
    let out = sh(d, &rw.apply(&steps[0]));
    assert!(out.status.success(), "{}", said(&out));
    // 2. The gateway with the shadow set.
    let mut gateway = spawn(d, &rw.apply(steps[1].trim()));
    common::wait_listening(&mut gateway, "the gateway");
    let gateway = Background(gateway);
    // 3. A refund: held by the set in force.
    let out = said(&sh(d, &rw.apply(&steps[2])));
    assert!(out.contains("approval_pending"), "{out}");
    common::eventually("the disagreement is in the audit log", || {
        common::audit_entries(&d.join(".countersign/audit"))
            .iter()
            .any(|e| e["kind"] == "shadow_disagreement")
    })
    .await;
    // 4. The diff over the calls seen, as the guide prints it.
    let out = said(&sh(d, &rw.apply(&steps[3])));
    assert!(
        out.contains("on the calls of the last day: 1 of 1 calls would be decided otherwise (1 towards allow)")
            && out.contains("payments/refund  approval -> allow (loosens)  1"),
        "{out}"
    );
    drop(gateway);
    // 5. The change against the last commit, from git; the folder put back.
    let out = sh(d, &rw.apply(&steps[4]));
    let diff = said(&out);
    assert!(
        out.status.success()
            && diff.contains("under policies@HEAD and then policies")
            && diff.contains("payments/refund  approval -> allow (loosens)"),
        "{diff}"
    );
    let status = sh(d, "git status --porcelain policies");
    assert!(said(&status).trim().is_empty(), "{}", said(&status));
}
