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

/// A gateway started with `options` under valgrind's callgrind, counting
/// nothing until told (`callgrind_control -i on`); its dumps go to the
/// returned folder.
fn under_callgrind(options: common::Options) -> (common::Gateway, tempfile::TempDir) {
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
        ..options
    });
    (gw, out)
}

#[tokio::test]
async fn a_read_costs_no_more_instructions_than_recorded() {
    let (gw, out) = under_callgrind(common::Options::default());
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

/// `tasks/get` on a task that waits for a reviewer costs at most 1.2 × a
/// read (DESIGN.md section 24's polling is a read of one task record, with
/// no store write): both counted in one gateway under callgrind, 200 of
/// each after a warm-up, each run dumped on its own.
#[tokio::test]
async fn polling_a_waiting_task_costs_at_most_a_fifth_more_than_a_read() {
    let (pdir, _alice) = common::default_policies_with_alice();
    let (gw, out) = under_callgrind(common::Options {
        policies: Some(pdir.path().to_owned()),
        approvals: "hold = \"0s\"\n".into(),
        extra: "\n[tasks]\npoll_interval = \"200ms\"\n".into(),
        ..Default::default()
    });
    let mut c = common::Client::new(&gw.url("payments"));
    c.protocol = "2025-11-25".into();
    c.initialize().await;
    // A charge needs a reviewer (the shipped policies): asked as a task,
    // it waits for one, and nobody decides it here.
    let created = c
        .post(
            &json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
            "name": "charge_card", "arguments": {"account": "acct-1", "amount": 12},
            "task": {}, "_meta": {"dev.countersign/idempotency-key": "poll-1"}}}),
        )
        .await;
    let task = created.last()["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {:?}", created.last()))
        .to_owned();
    let poll = |id: u64| json!({"jsonrpc":"2.0","id": id + 10_000,"method":"tasks/get","params":{"taskId": task}});
    for id in 0..WARMUP {
        read(&mut c, id).await;
        let got = c.post(&poll(id)).await;
        assert_eq!(got.last()["result"]["status"], "working", "{got:?}");
    }
    let pid = gw.pid().to_string();
    // Reads, dumped; then polls, dumped: each dump holds what ran since the
    // one before.
    callgrind_control(&["-i", "on", &pid]);
    for id in WARMUP..WARMUP + READS {
        read(&mut c, id).await;
    }
    callgrind_control(&["-i", "off", &pid]);
    callgrind_control(&["-d", &pid]);
    common::eventually("the reads' dump", || totals(out.path()) > 0).await;
    let reads = totals(out.path());
    callgrind_control(&["-i", "on", &pid]);
    for id in WARMUP..WARMUP + READS {
        let got = c.post(&poll(id)).await;
        assert_eq!(got.last()["result"]["status"], "working", "{got:?}");
    }
    callgrind_control(&["-i", "off", &pid]);
    callgrind_control(&["-d", &pid]);
    common::eventually("the polls' dump", || totals(out.path()) > reads).await;
    let per_read = reads / READS;
    let per_poll = (totals(out.path()) - reads) / READS;
    eprintln!("instructions (test build): per read {per_read}, per tasks/get {per_poll}");
    assert!(
        per_poll * 10 <= per_read * 12,
        "a tasks/get of a waiting task costs {per_poll} instructions, more than 1.2 × a read's {per_read}"
    );
}
