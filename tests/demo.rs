//! `countersign demo`, end to end: each claim it narrates is checked here
//! against the example server's execution record and the audit log.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::process::Command;

use serde_json::Value;

fn lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn the_demo_shows_what_it_says_it_shows() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(common::countersign_bin())
        .args(["demo", "--json", "--dir"])
        .arg(dir.path())
        .arg("--server-bin")
        .arg(common::example_server_bin())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let shown: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();

    // The narration names each step.
    for claim in [
        "approval_pending",
        "five times",
        "drift_rejected",
        "outcome_unknown",
        "reconciles the key as executed",
        "ok: the chain is intact and ends with a clean-shutdown checkpoint",
        "made for this demo only",
        "Instead of approval_pending it gets task",
        "approved-executed",
    ] {
        assert!(stdout.contains(claim), "`{claim}` not narrated:\n{stdout}");
    }

    // The server's own record: the approved charge once (five sends), the
    // drifted amount never, the killed charge once (its retries never sent),
    // and the charge the tasks client waited for, once.
    let executed: Vec<Value> = lines(&dir.path().join("executions.jsonl"))
        .into_iter()
        .filter(|e| e["event"] == "executed" && e["tool"] == "charge_card")
        .collect();
    let amounts: Vec<f64> = executed
        .iter()
        .map(|e| e["arguments"]["amount"].as_f64().unwrap())
        .collect();
    assert_eq!(amounts, vec![42.0, 7.0, 12.0], "{executed:?}");
    assert_eq!(shown["task_status"], "completed");
    assert_eq!(shown["task_disposition"], "approved-executed");
    assert_eq!(shown["executions_after_five_sends"], 1);
    assert_eq!(shown["replayed"], 4);

    // The audit log says the same.
    let audit = common::audit_entries(&dir.path().join("data/audit"));
    let of = |kind: &str, key: &str| {
        audit
            .iter()
            .filter(|e| e["kind"] == kind && e["idempotency_key"] == key)
            .count()
    };
    assert_eq!(of("dispatched", "demo-charge-1"), 1);
    assert_eq!(of("replayed", "demo-charge-1"), 4, "{audit:?}");
    assert_eq!(of("rejected", "demo-charge-1"), 1);
    assert_eq!(of("dispatched", "demo-charge-2"), 1);
    assert!(of("outcome_unknown", "demo-charge-2") >= 1);
    let granted: Vec<_> = audit
        .iter()
        .filter(|e| e["kind"] == "approval_granted")
        .collect();
    assert_eq!(granted.len(), 3);
    assert_eq!(of("dispatched", "demo-charge-3"), 1);
    for kind in ["task_created", "task_claimed", "task_completed"] {
        assert_eq!(
            audit.iter().filter(|e| e["kind"] == kind).count(),
            1,
            "one `{kind}`"
        );
    }
    assert!(granted
        .iter()
        .all(|e| e["approval"]["statement"]["reviewer"] == "demo-reviewer"));
    assert_eq!(
        audit.iter().filter(|e| e["kind"] == "reconciled").count(),
        1
    );
    assert_eq!(audit.last().unwrap()["kind"], "checkpoint");
    assert_eq!(shown["verify_ok"], true);
    // And it verifies with the command a user would type.
    let (ok, out, _) = common::run_cli(&[
        "audit",
        "verify",
        "--dir",
        dir.path().join("data/audit").to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
}

#[test]
fn the_demo_without_the_example_server_says_how_to_build_it() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, _, err) = common::run_cli(&[
        "demo",
        "--dir",
        dir.path().to_str().unwrap(),
        "--server-bin",
        "/nonexistent/payments_server",
    ]);
    assert!(!ok);
    assert!(
        err.contains("cargo build --release --bins --examples"),
        "{err}"
    );
}

#[tokio::test]
async fn demo_keep_leaves_the_gateway_running_with_what_to_try_next() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(common::countersign_bin())
        .args(["demo", "--keep", "--json", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let shown: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let pid: i32 = stdout
        .split("keeps running (pid ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {stdout}"));
    // Stopped at the end of the test, whatever it finds.
    struct Kill(i32);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = Command::new("kill").arg(self.0.to_string()).status();
        }
    }
    let _kill = Kill(pid);
    for next in [
        "countersign-review --key",
        "countersign pending",
        "countersign stdio",
        "mcpServers",
    ] {
        assert!(stdout.contains(next), "`{next}` not suggested:\n{stdout}");
    }
    let health = reqwest::get(format!("{}/healthz", shown["gateway"].as_str().unwrap()))
        .await
        .unwrap();
    assert_eq!(health.status().as_u16(), 200);
    // The reviewer's key it printed works against the running gateway.
    let key = dir.path().join("demo-reviewer.key");
    let (ok, out, err) = common::run_cli(&[
        "pending",
        "--key",
        key.to_str().unwrap(),
        "--gateway",
        shown["gateway"].as_str().unwrap(),
    ]);
    assert!(ok, "{out}{err}");
}
