//! The read path's cost, counted in instructions: the gateway (this test
//! build) runs under valgrind's callgrind in front of the example server,
//! and the instructions of all its threads over a run of reads are counted.
//! Unlike a time, the count does not move with the machine or its load, so
//! the test can hold a line: a read may cost at most 1.2 × the figure
//! recorded in docs/performance.md ("Guard"). A change that makes reads
//! dearer on purpose updates that figure, with its reason, in the same
//! commit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

/// Reads counted (after a warm-up that is not).
const READS: u64 = 200;
const WARMUP: u64 = 30;

/// The figure docs/performance.md records for this test, from its line
/// `guard: N instructions per read (test build)`.
fn recorded() -> u64 {
    let doc = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/performance.md");
    let text = std::fs::read_to_string(&doc).unwrap();
    text.lines()
        .find_map(|l| {
            let rest = l.trim().strip_prefix("guard: ")?;
            let n = rest.strip_suffix(" instructions per read (test build)")?;
            n.replace(',', "").parse().ok()
        })
        .expect("docs/performance.md has no line `guard: N instructions per read (test build)`")
}

fn callgrind_control(args: &[&str]) {
    let out = Command::new("callgrind_control")
        .args(args)
        .output()
        .expect("callgrind_control runs (valgrind is installed)");
    assert!(out.status.success(), "callgrind_control {args:?}: {out:?}");
}

/// The instructions of every thread in the dumps under `dir` (the lines
/// `totals: N` of each part).
fn totals(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("cg.out"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .flat_map(|t| {
            t.lines()
                .filter_map(|l| l.strip_prefix("totals: "))
                .filter_map(|n| n.trim().parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// One read through the gateway, answered.
async fn read(c: &mut common::Client, id: u64) {
    let account = format!("acct-{}", id % 7);
    let answer = c
        .call(id as i64 + 2, "get_balance", json!({ "account": account }))
        .await;
    assert_eq!(answer.last()["result"]["isError"], false, "{answer:?}");
}

#[tokio::test]
async fn a_read_costs_no_more_instructions_than_recorded() {
    let valgrind = Command::new("valgrind").arg("--version").output();
    assert!(
        valgrind.is_ok_and(|o| o.status.success()),
        "this test needs valgrind (apt-get install valgrind)"
    );
    let out = tempfile::tempdir().unwrap();
    let cg = out.path().join("cg.out");
    let gw = common::Gateway::start_with(common::Options {
        wrapper: vec![
            "valgrind".into(),
            "--tool=callgrind".into(),
            "--instr-atstart=no".into(),
            format!("--callgrind-out-file={}", cg.display()),
            format!("--log-file={}", out.path().join("valgrind.log").display()),
        ],
        ..Default::default()
    });
    let mut c = common::Client::new(&gw.url("payments"));
    c.initialize().await;
    for id in 0..WARMUP {
        read(&mut c, id).await;
    }
    let pid = gw.pid().to_string();
    callgrind_control(&["-i", "on", &pid]);
    for id in WARMUP..WARMUP + READS {
        read(&mut c, id).await;
    }
    callgrind_control(&["-i", "off", &pid]);
    callgrind_control(&["-d", &pid]);
    // The dump is written by the gateway's process: wait for its totals.
    common::eventually("the callgrind dump", || totals(out.path()) > 0).await;
    let per_read = totals(out.path()) / READS;
    let line = recorded();
    eprintln!("instructions per read (test build): {per_read}; recorded: {line}");
    assert!(
        per_read * 10 <= line * 12,
        "a read costs {per_read} instructions in the test build, more than 1.2 × the {line} recorded \
         in docs/performance.md (guard). If the increase is intended, record the new figure there \
         with its reason."
    );
}
