//! `countersign serve` and `countersign check` as commands: config errors,
//! health reports with effective annotations, clean shutdown.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

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

#[test]
fn keygen_appends_its_entry_to_a_reviewers_file_whose_folder_does_not_exist_yet() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(".countersign/reviewers.toml");
    for (name, groups) in [("alice", "leads"), ("bob", "finance")] {
        let out = Command::new(countersign_bin())
            .arg("keygen")
            .arg("--out")
            .arg(dir.path().join(format!("keys/{name}.key")))
            .args(["--name", name, "--groups", groups, "--append"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stderr).contains("appended this entry"));
    }
    // Both entries, as TOML the gateway reads.
    let text = std::fs::read_to_string(&file).unwrap();
    let parsed: toml::Value = toml::from_str(&text).unwrap();
    let names: Vec<&str> = parsed["reviewers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alice", "bob"], "{text}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(file.parent().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}

#[test]
fn deny_without_a_reason_says_that_the_reason_is_missing_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(countersign_bin())
        .args(["deny", "p-1"])
        .env("COUNTERSIGN_KEY", dir.path().join("alice.key"))
        .env("COUNTERSIGN_GATEWAY", "http://127.0.0.1:9")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("deny needs a reason"), "{err}");
    assert!(err.contains("--reason"), "{err}");
    // Not clap's usage line, which marked --key and --gateway as missing too.
    assert!(
        !err.contains("Usage:") && !err.contains("--key <KEY>"),
        "{err}"
    );
}

#[test]
fn serve_listens_where_countersign_listen_says_over_the_config() {
    // The configured address cannot be bound here (TEST-NET-1): only the
    // override lets the gateway start.
    let gw = Gateway::start_with(Options {
        listen: "192.0.2.1:9".into(),
        gateway_env: vec![("COUNTERSIGN_LISTEN".into(), "127.0.0.1:0".into())],
        ..Default::default()
    });
    assert!(gw.base().starts_with("http://127.0.0.1:"), "{}", gw.base());
}

#[test]
fn the_example_config_finds_the_example_server_next_to_the_binary() {
    // A folder without `target/`: the example configuration's default path
    // is not there, and the example server next to `countersign` is used.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("countersign.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\n[servers.payments]\ncommand = \"target/release/examples/payments_server\"\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let out = Command::new(countersign_bin())
        .args(["check", "--json", "--config"])
        .arg(&config)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report[0]["up"], true, "{report}");
    // Any other command is run as written: a missing one is down.
    std::fs::write(
        &config,
        format!(
            "[gateway]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\n[servers.payments]\ncommand = \"target/debug/examples/payments_server\"\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let out = Command::new(countersign_bin())
        .args(["check", "--json", "--config"])
        .arg(&config)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
}
