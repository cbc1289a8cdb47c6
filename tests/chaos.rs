//! The short chaos runs (`examples/chaos/main.rs`): 500 keyed writes from 8
//! agents while the gateway is killed and restarted, its upstream is killed
//! (the stdio children, or the example server over HTTP) and faults are
//! injected, ten times in all; the at-most-once invariants checked from the
//! example server's execution record. On PostgreSQL, two gateways share the
//! ledger, either is killed, and the database is restarted too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

use serde_json::Value;

/// The runs on PostgreSQL restart the database: one at a time (the test
/// harness runs a file's tests in parallel).
static ONE_DATABASE_RUN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn chaos(extra: &[&str]) -> Value {
    chaos_with(500, 10, "20261201", extra)
}

fn chaos_with(calls: usize, kills: usize, seed: &str, extra: &[&str]) -> Value {
    let chaos = common::example_server_bin().parent().unwrap().join("chaos");
    assert!(
        chaos.exists(),
        "no {}: cargo build --examples",
        chaos.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(&chaos)
        .args(["--calls", &calls.to_string(), "--kills", &kills.to_string()])
        .args([
            "--agents",
            "8",
            "--json",
            "--seed",
            seed,
            "--deadline-secs",
            "180",
        ])
        .args(extra)
        .arg("--work")
        .arg(dir.path())
        .arg("--countersign")
        .arg(common::countersign_bin())
        .arg("--server")
        .arg(common::example_server_bin())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap_or("null"))
        .unwrap_or_else(|e| panic!("no summary ({e}):\n{stdout}\n{stderr}"));
    assert_eq!(summary["definitive"], calls, "{summary}");
    assert_eq!(summary["kills"], kills, "{summary}");
    for broken in [
        "duplicates",
        "lost_acknowledged",
        "changed_answers",
        "unknown_not_listed",
    ] {
        assert_eq!(
            summary[broken],
            serde_json::json!([]),
            "{broken}: {summary}"
        );
    }
    // Every execution is an acknowledged call or an unknown one that ran.
    assert_eq!(
        summary["executions"].as_u64().unwrap(),
        summary["acknowledged"].as_u64().unwrap()
            + summary["outcome_unknown_that_ran"].as_u64().unwrap(),
        "{summary}"
    );
    assert!(
        summary["ok"] == true && out.status.success(),
        "{summary}\n{stderr}"
    );
    // Every process the run started (gateways, the example server) is gone
    // with it: none names the run's folder any more.
    // (A stdio child of a killed gateway exits on its closed stdin: given
    // up to 5 s to go.)
    let running = || {
        let out = Command::new("pgrep")
            .arg("-af")
            .arg(dir.path())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !running().is_empty() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let left = running();
    assert!(left.is_empty(), "left running after the chaos run:\n{left}");
    summary
}

#[test]
fn five_hundred_calls_ten_kills_no_duplicate_and_no_lost_answer() {
    chaos(&[]);
}

#[test]
fn the_same_over_an_http_upstream_killed_and_dropping_sessions() {
    let summary = chaos(&["--http"]);
    assert!(
        summary["actions"]
            .as_object()
            .unwrap()
            .keys()
            .all(|k| k != "child_sigkill"),
        "{summary}"
    );
}

#[test]
fn the_same_on_postgresql_with_two_gateways_and_database_restarts() {
    let _one = ONE_DATABASE_RUN.lock().unwrap_or_else(|e| e.into_inner());
    // With a budget both gateways share: unattended spending never passes
    // it (the driver checks the server's record, in exact decimals).
    let summary = chaos(&[
        "--postgres",
        "postgres://postgres@127.0.0.1:5432/test",
        "--budget",
        "400000",
    ]);
    assert_eq!(summary["store"], "postgres, two gateways", "{summary}");
    let budget = &summary["budget"];
    assert_eq!(budget["ok"], true, "{summary}");
    assert!(
        budget["refused"].as_u64().unwrap() > 0,
        "the budget was reached: {summary}"
    );
    let spent: f64 = budget["spent_unattended"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(spent > 300_000.0 && spent <= 400_000.0, "{summary}");
}

/// A fresh seed for a run (`CHAOS_SEED` replays one), printed.
fn fresh_seed(what: &str) -> String {
    let seed = std::env::var("CHAOS_SEED").unwrap_or_else(|_| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
            .to_string()
    });
    eprintln!("{what} chaos seed: {seed} (CHAOS_SEED={seed} replays it)");
    seed
}

/// Reviewers approve, deny, withdraw and let proposals expire while either
/// of two gateways is killed and the database restarts. A fresh seed each
/// run (`CHAOS_SEED` replays one); the summary names it.
#[test]
fn approvals_under_kills_on_postgresql_with_two_gateways() {
    let _one = ONE_DATABASE_RUN.lock().unwrap_or_else(|e| e.into_inner());
    let seed = fresh_seed("approval");
    let summary = chaos_with(
        300,
        6,
        &seed,
        &[
            "--approvals",
            "--postgres",
            "postgres://postgres@127.0.0.1:5432/test",
        ],
    );
    let a = &summary["approvals"];
    for broken in [
        "executed_without_quorum",
        "consumed_without_execution_or_listed_unknown",
        "approval_counted_for_two_executions",
        "refused_but_ran",
        "proposal_created_not_delivered",
        "proposal_created_under_two_ids",
        "audit_verify_failed",
    ] {
        assert_eq!(a[broken], serde_json::json!([]), "{broken}: {summary}");
    }
    // A third of the calls were held, and the reviewers did each thing.
    assert_eq!(a["held_calls"], 100, "{summary}");
    for fate in ["approve", "deny"] {
        assert!(
            a["fates"][fate].as_u64().unwrap_or(0) > 0,
            "no {fate}: {summary}"
        );
    }
    assert!(a["reviewer_approvals"].as_u64().unwrap() > 0, "{summary}");
    assert!(
        a["passkey_decisions_in_the_console"].as_u64().unwrap() > 0,
        "no decision went through the review console: {summary}"
    );
}

/// Held calls as MCP tasks under kills: the agents wait on their tasks
/// (polling whichever of two gateways on PostgreSQL answers) while gateways,
/// children and the database are killed and the reviewers decide. Every
/// task ends; none that says the tool ran did not run, none that says it
/// did not ran; no key runs twice. The era alternates with the seed.
#[test]
fn tasks_under_kills_on_postgresql_with_two_gateways() {
    let _one = ONE_DATABASE_RUN.lock().unwrap_or_else(|e| e.into_inner());
    let seed = fresh_seed("task");
    let modern = seed.bytes().last().is_some_and(|b| b % 2 == 1);
    let mut extra = vec![
        "--approvals",
        "--tasks",
        "--postgres",
        "postgres://postgres@127.0.0.1:5432/test",
    ];
    if modern {
        extra.push("--modern");
    }
    let summary = chaos_with(150, 5, &seed, &extra);
    let t = &summary["tasks"];
    assert_eq!(t["contradictions"], serde_json::json!([]), "{summary}");
    assert_eq!(t["lost"], serde_json::json!([]), "{summary}");
    assert_eq!(
        t["ended"], 50,
        "every held call was a task that ended: {summary}"
    );
    assert!(t["approved_executed"].as_u64().unwrap() > 0, "{summary}");
    assert!(t["denied_not_executed"].as_u64().unwrap() > 0, "{summary}");
    let a = &summary["approvals"];
    for broken in [
        "executed_without_quorum",
        "approval_counted_for_two_executions",
        "refused_but_ran",
    ] {
        assert_eq!(a[broken], serde_json::json!([]), "{broken}: {summary}");
    }
}
