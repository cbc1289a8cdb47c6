//! `countersign serve` and `countersign check` as commands: config errors,
//! health reports with effective annotations, clean shutdown.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::Value;

#[test]
fn bad_config_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[gateway]\nlisten = \"127.0.0.1:0\"\n\n[servers.p]\ncommand = \"x\"\nread_onyl = true\n",
    )
    .unwrap();
    let out = Command::new(countersign_bin())
        .args(["serve", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 6") && err.contains("read_onyl"), "{err}");

    let out = Command::new(countersign_bin())
        .args(["serve", "--config", "/nonexistent.toml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read config file"));
}

#[test]
fn check_reports_health_and_effective_annotations() {
    let gw = Gateway::start_with(Options {
        extra: "\n[servers.payments.tools.transfer]\nread_only = true\n".into(),
        ..Default::default()
    });
    let out = Command::new(countersign_bin())
        .args(["check", "--json", "--config"])
        .arg(gw.config_path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report[0]["server"], "payments");
    assert_eq!(report[0]["up"], true);
    let tool = |name: &str| common::report_tool(&report, "payments", name);
    assert_eq!(tool("get_balance")["read_only"], true);
    assert_eq!(tool("close_account")["destructive"], true);
    assert_eq!(tool("charge_card")["read_only"], false);
    assert_eq!(
        tool("transfer")["read_only"],
        true,
        "the operator override wins over the missing hint"
    );
    assert_eq!(tool("refund")["destructive"], false);

    let broken = Gateway::start_with(Options {
        extra: "\n[servers.broken]\ncommand = \"/nonexistent/server\"\n".into(),
        ..Default::default()
    });
    let out = Command::new(countersign_bin())
        .args(["check", "--config"])
        .arg(broken.config_path())
        .output()
        .unwrap();
    assert!(!out.status.success(), "a down upstream must fail the check");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("broken") && l.contains("down")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("payments") && l.contains(" up ")),
        "{text}"
    );
}

#[tokio::test]
async fn sigterm_stops_the_gateway_and_its_children() {
    let mut gw = Gateway::start();
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    c.call(1, "get_balance", serde_json::json!({"account":"a"}))
        .await;
    let pid = gw.records()[0]["pid"].as_u64().unwrap();
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    let status = gw.terminate();
    assert!(status.success(), "{status:?}");
    let mut gone = false;
    for _ in 0..40 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Gone, or a zombie awaiting its reaper.
        if stat.is_empty() || stat.split_whitespace().nth(2) == Some("Z") {
            gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(gone, "the upstream child {pid} outlived the gateway");
}
