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
/// Writes counted (each reserves, dispatches durably and completes).
const WRITES: u64 = 100;

/// The figure docs/performance.md records for a `what` ("read" or
/// "write"), from its line `guard: N instructions per WHAT (test build)`.
fn recorded(what: &str) -> u64 {
    let doc = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/performance.md");
    let text = std::fs::read_to_string(&doc).unwrap();
    let suffix = format!(" instructions per {what} (test build)");
    text.lines()
        .find_map(|l| {
            let rest = l.trim().strip_prefix("guard: ")?;
            let n = rest.strip_suffix(suffix.as_str())?;
            n.replace(',', "").parse().ok()
        })
        .unwrap_or_else(|| panic!("docs/performance.md has no line `guard: N{suffix}`"))
}

/// The instructions `gw` executes while `each` runs `n` times (counting
/// switched on, then off, then dumped: a dump holds what ran since the one
/// before, and the folder `out` keeps every dump).
async fn counted(gw: &common::Gateway, out: &Path, n: u64, mut each: impl AsyncFnMut(u64)) -> u64 {
    let before = totals(out);
    let pid = gw.pid().to_string();
    callgrind_control(&["-i", "on", &pid]);
    for i in 0..n {
        each(i).await;
    }
    callgrind_control(&["-i", "off", &pid]);
    callgrind_control(&["-d", &pid]);
    // The dump is written by the gateway's process: wait for its totals.
    common::eventually("the callgrind dump", || totals(out) > before).await;
    totals(out) - before
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
    let per_read = counted(&gw, out.path(), READS, async |i| {
        read(&mut c, WARMUP + i).await
    })
    .await
        / READS;
    let line = recorded("read");
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
    let per_read = counted(&gw, out.path(), READS, async |i| {
        read(&mut c, WARMUP + i).await
    })
    .await
        / READS;
    let per_poll = counted(&gw, out.path(), READS, async |i| {
        let got = c.post(&poll(WARMUP + i)).await;
        assert_eq!(got.last()["result"]["status"], "working", "{got:?}");
    })
    .await
        / READS;
    eprintln!("instructions (test build): per read {per_read}, per tasks/get {per_poll}");
    assert!(
        per_poll * 10 <= per_read * 12,
        "a tasks/get of a waiting task costs {per_poll} instructions, more than 1.2 × a read's {per_read}"
    );
}

/// A write (a `charge_card` the policies allow, each with a key of its
/// own: reserved, durably dispatched, completed, four audit entries) costs
/// at most 1.2 × the figure docs/performance.md records ("Guard").
#[tokio::test]
async fn a_write_costs_no_more_instructions_than_recorded() {
    let pdir = tempfile::tempdir().unwrap();
    std::fs::copy(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policies/schema.cedarschema"),
        pdir.path().join("schema.cedarschema"),
    )
    .unwrap();
    std::fs::write(
        pdir.path().join("all.cedar"),
        "@id(\"allow-all\")\npermit (principal, action, resource);\n",
    )
    .unwrap();
    let (gw, out) = under_callgrind(common::Options {
        policies: Some(pdir.path().to_owned()),
        ..Default::default()
    });
    let mut c = common::Client::new(&gw.url("payments"));
    c.initialize().await;
    let write = async |id: u64| {
        let answer = c
            .post(
                &json!({"jsonrpc":"2.0","id": id + 2,"method":"tools/call","params":{
                "name": "charge_card", "arguments": {"account": "acct-1", "amount": 5},
                "_meta": {"dev.countersign/idempotency-key": format!("guard-{id}")}}}),
            )
            .await;
        assert_eq!(answer.last()["result"]["isError"], false, "{answer:?}");
    };
    for id in 0..WARMUP {
        write(id).await;
    }
    let per_write =
        counted(&gw, out.path(), WRITES, async |i| write(WARMUP + i).await).await / WRITES;
    let line = recorded("write");
    eprintln!("instructions per write (test build): {per_write}; recorded: {line}");
    assert!(
        per_write * 10 <= line * 12,
        "a write costs {per_write} instructions in the test build, more than 1.2 × the {line} \
         recorded in docs/performance.md (guard). If the increase is intended, record the new \
         figure there with its reason."
    );
}
