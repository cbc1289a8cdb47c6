//! Power loss, seen from outside: a real gateway runs under `strace`, and
//! every file and folder it makes under its data dir must have its entry in
//! its folder fsynced (a power cut forgets an entry whose folder was not
//! fsynced, and the file with it), in the same thread, after it was made:
//! before the gateway starts serving for what it makes at its start, and
//! before it stops for the rest.
//! Exempt: `audit/tree.hashes` (derived, checked at every start),
//! `audit/writer.lock` (a lock, its content never read), and temporary files
//! (renamed over their real names, whose folder is fsynced then).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use common::*;
use serde_json::json;

/// The path in the first `"…"` of a strace line.
fn quoted(line: &str) -> Option<&str> {
    let start = line.find('"')? + 1;
    let end = start + line[start..].find('"')?;
    Some(&line[start..end])
}

/// The second quoted path (a rename's target).
fn second_quoted(line: &str) -> Option<&str> {
    let first = line.find('"')? + 1;
    let after = first + line[first..].find('"')? + 1;
    quoted(&line[after..])
}

/// `= N` at the end of a syscall line: its result.
fn result(line: &str) -> Option<i64> {
    line.rsplit("= ")
        .next()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Per thread: what it made under `data`, and which folders it fsynced
/// after each making (by the order of its own lines).
fn unsynced_entries(trace_dir: &Path, data: &Path) -> Vec<String> {
    let exempt = |p: &str| {
        p.ends_with("tree.hashes")
            || p.ends_with("writer.lock")
            || p.ends_with(".tmp")
            || p.ends_with(".new")
    };
    let mut missing = Vec::new();
    let mut made_any = false;
    let mut saw_listening = false;
    for entry in std::fs::read_dir(trace_dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        // Made but not yet followed by an fsync of their folder.
        let mut waiting: BTreeMap<PathBuf, String> = BTreeMap::new();
        let mut fds: BTreeMap<i64, PathBuf> = BTreeMap::new();
        // strace cannot tell an open that created from one that did not:
        // the first time a thread names a path is its making.
        let mut seen: BTreeSet<PathBuf> = BTreeSet::new();
        let mut listening = false;
        for line in text.lines() {
            let call = line.split('(').next().unwrap_or("");
            let ok = result(line).is_some_and(|r| r >= 0);
            let made = match call {
                "openat" if ok && line.contains("O_CREAT") => quoted(line).map(PathBuf::from),
                "mkdir" | "mkdirat" if ok => quoted(line).map(PathBuf::from),
                "rename" | "renameat" | "renameat2" if ok => second_quoted(line).map(PathBuf::from),
                _ => None,
            };
            if let Some(p) = made.filter(|p| p.starts_with(data)) {
                let name = p.to_string_lossy().into_owned();
                let renamed = call.starts_with("rename");
                if !exempt(&name) && (renamed || seen.insert(p.clone())) {
                    made_any = true;
                    waiting.insert(p.parent().unwrap().to_owned(), name);
                }
            }
            if call == "openat" && ok {
                if let (Some(p), Some(fd)) = (quoted(line), result(line)) {
                    seen.insert(PathBuf::from(p));
                    fds.insert(fd, PathBuf::from(p));
                }
            }
            // Serving starts: what was made so far must be durable now.
            if call == "write" && line.contains("countersign: listening on") {
                listening = true;
                missing.extend(waiting.values().map(|n| format!("{n} (before serving)")));
                waiting.clear();
            }
            if call == "fsync" {
                let fd: Option<i64> = line["fsync(".len()..]
                    .split(')')
                    .next()
                    .and_then(|n| n.parse().ok());
                if let Some(dir) = fd.and_then(|fd| fds.get(&fd)) {
                    // Every entry made in that folder so far is durable.
                    waiting.retain(|folder, _| folder != dir);
                }
            }
        }
        missing.extend(waiting.into_values());
        saw_listening |= listening;
    }
    assert!(saw_listening, "no thread said it was listening");
    assert!(
        made_any,
        "the trace shows no file made under {}",
        data.display()
    );
    missing
}

#[tokio::test]
async fn every_file_and_folder_made_in_the_data_dir_has_its_folder_entry_fsynced() {
    let traces = tempfile::tempdir().unwrap();
    let prefix = traces.path().join("t");
    let mut gw = Gateway::start_with(Options {
        wrapper: vec![
            "strace".into(),
            "-f".into(),
            "-ff".into(),
            "-qq".into(),
            "-e".into(),
            "trace=openat,mkdir,mkdirat,rename,renameat,renameat2,fsync,write".into(),
            "-s".into(),
            "64".into(),
            "-o".into(),
            prefix.display().to_string(),
        ],
        ..Default::default()
    });
    let c = listed(&gw, "payments").await;
    let a = c
        .call(1, "charge_card", json!({"account": "acct-1", "amount": 5}))
        .await;
    assert_eq!(a.last()["result"]["isError"], false, "{a:?}");
    let data = gw.dir.path().join("data");
    // A clean stop of the gateway itself (strace's child): strace ends with
    // it, its traces whole.
    let children =
        std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", gw.pid())).unwrap();
    let tracee = children
        .split_whitespace()
        .next()
        .expect("the traced gateway");
    let stopped = std::process::Command::new("kill")
        .args(["-TERM", tracee])
        .status()
        .unwrap();
    assert!(stopped.success());
    assert!(gw.wait_exit().success(), "the gateway stopped cleanly");
    let made: BTreeSet<String> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for name in ["gateway-id", "ledger.redb", "ledger.journal", "audit"] {
        assert!(made.contains(name), "{name} not among {made:?}");
    }
    let missing = unsynced_entries(traces.path(), &data);
    assert!(
        missing.is_empty(),
        "made without an fsync of their folder: {missing:?}"
    );
}
