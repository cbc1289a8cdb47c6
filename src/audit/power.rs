//! Tests: the audit log after a power cut. A real log is written (entries
//! buffered and fsynced, checkpoints signed, segments rotated, restarts);
//! at an acknowledged durable entry its folder is copied, and the copy is
//! cut as a disk may leave it: every byte fsynced is kept, the last
//! segment's unsynced tail is kept in part, lost or zeroed, `tree.hashes`
//! (never fsynced) is kept, cut, zeroed, torn by a sector or lost, and the
//! checkpoint file is kept or, as an older release could leave it, empty.
//! The gateway then opens the cut log and goes on. It must keep every
//! acknowledged entry, never sign a root that is not its log's, and stay
//! level with every checkpoint it had signed: `audit verify`, given the
//! checkpoint signed before the cut, passes.

use std::path::Path;
use std::time::Duration;

use proptest::prelude::*;
use serde_json::{json, Map, Value};

use super::log::{AuditLog, Settings};
use super::segment::segments;
use super::tree::TREE_FILE;
use super::verify::{verify_dir_with, Also};
use super::{ArgumentMode, CHECKPOINT_FILE};

/// One step of the workload.
#[derive(Debug, Clone)]
enum Step {
    /// Entries handed to the writer, not waited for.
    Buffered(u8),
    /// One entry acknowledged once fsynced.
    Durable,
    /// A clean stop and a start.
    Restart,
}

/// What happens to `tree.hashes` in the cut.
#[derive(Debug, Clone)]
enum Tree {
    Kept,
    /// Cut to this share (percent) of its length, at any byte.
    Cut(u8),
    /// Zeros over this share of its length (ext4's unwritten blocks).
    Zeroed(u8),
    /// One 512-byte sector, at this share of the length, torn.
    Torn(u8),
    Lost,
}

#[derive(Debug, Clone)]
struct Cut {
    /// After which acknowledged durable entry (counted from 0).
    after: usize,
    /// Share (percent) of the last segment's unsynced tail kept.
    tail_keeps: u8,
    /// The kept unsynced tail reads as zeros.
    tail_zeroed: bool,
    tree: Tree,
    /// The checkpoint file is empty (as one written without an fsync).
    checkpoint_empty: bool,
}

fn settings(dir: &Path) -> Settings {
    Settings {
        dir: dir.to_owned(),
        checkpoint_every: 3,
        checkpoint_interval: Duration::from_secs(60),
        segment_bytes: 1200,
        arguments: ArgumentMode::Full,
        redact: vec![],
        gateway: Some("gw-power".into()),
        origin: None,
    }
}

fn marked(k: usize) -> Map<String, Value> {
    json!({ "ack": k }).as_object().unwrap().clone()
}

/// The files of `dir`, read now: the checkpoint file first, so that what
/// it covers (fsynced before it was signed) is in the segments read after.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let read = |name: &str| std::fs::read(dir.join(name)).ok();
    if let Some(b) = read(CHECKPOINT_FILE) {
        out.push((CHECKPOINT_FILE.to_owned(), b));
    }
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == CHECKPOINT_FILE || name.ends_with(".new") {
            continue;
        }
        if let Ok(b) = std::fs::read(entry.path()) {
            out.push((name, b));
        }
    }
    out
}

/// The size (entries) a checkpoint note covers.
fn covered(note: &[u8]) -> u64 {
    let text = String::from_utf8_lossy(note);
    super::note::Note::parse(&text)
        .and_then(|n| super::note::Checkpoint::parse(&n.text))
        .map_or(0, |cp| cp.size)
}

/// Seq of the entry carrying `"ack": k`, and where its line ends: (segment
/// index among `segs`, byte offset).
fn find_line(
    segs: &[(String, Vec<u8>)],
    pred: impl Fn(&Map<String, Value>) -> bool,
) -> Option<(u64, usize, usize)> {
    for (i, (_, bytes)) in segs.iter().enumerate() {
        let mut start = 0;
        for line in bytes.split_inclusive(|b| *b == b'\n') {
            start += line.len();
            if line.last() != Some(&b'\n') {
                break;
            }
            let Ok(e) = serde_json::from_slice::<Map<String, Value>>(line) else {
                continue;
            };
            if pred(&e) {
                return Some((e["seq"].as_u64()?, i, start));
            }
        }
    }
    None
}

/// The cut state of a snapshot, written into `to`.
fn cut_into(
    to: &Path,
    files: Vec<(String, Vec<u8>)>,
    after: usize,
    cut: &Cut,
) -> Result<(), String> {
    let cp_size = files
        .iter()
        .find(|(n, _)| n == CHECKPOINT_FILE)
        .map_or(0, |(_, b)| covered(b));
    let (mut segs, others): (Vec<_>, Vec<_>) =
        files.into_iter().partition(|(n, _)| n.ends_with(".jsonl"));
    segs.sort();
    let (acked, _, _) = find_line(&segs, |e| e.get("ack") == Some(&json!(after)))
        .ok_or_else(|| format!("acknowledged entry {after} is not in the log"))?;
    // Durable: every entry up to the acknowledged one, and up to what the
    // checkpoint file covers (fsynced before it was signed).
    let durable = acked.max(cp_size);
    let (_, seg, end) = find_line(&segs, |e| e["seq"].as_u64() == Some(durable))
        .ok_or_else(|| format!("entry {durable} is not in the log"))?;
    // Every segment before the last was fsynced when the next was made.
    let last = segs.len() - 1;
    let from = if seg == last { end } else { 0 };
    let bytes = &mut segs[last].1;
    let tail = bytes.len() - from;
    let kept = from + tail * usize::from(cut.tail_keeps) / 100;
    bytes.truncate(kept);
    if cut.tail_zeroed {
        bytes[from..].fill(0);
    }
    for (name, mut b) in others.into_iter().chain(segs) {
        if name == TREE_FILE {
            let share = |p: u8| b.len() * usize::from(p) / 100;
            match cut.tree {
                Tree::Kept => {}
                Tree::Cut(p) => b.truncate(share(p)),
                Tree::Zeroed(p) => {
                    let n = share(p);
                    b[..n].fill(0);
                }
                Tree::Torn(p) => {
                    let at = share(p) / 512 * 512;
                    let to = (at + 512).min(b.len());
                    b[at..to].fill(0xee);
                }
                Tree::Lost => continue,
            }
        }
        if name == CHECKPOINT_FILE && cut.checkpoint_empty {
            b.clear();
        }
        std::fs::write(to.join(&name), b).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// One case: the workload, a cut, a reopen, more entries, a check.
fn power_case(steps: &[Step], cut: &Cut, trust_the_tree: bool) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut log = AuditLog::open(settings(dir.path())).map_err(|e| e.to_string())?;
    let mut acked = 0;
    let mut files = None;
    for step in steps {
        match step {
            Step::Buffered(n) => {
                for i in 0..*n {
                    log.record(
                        "call_received",
                        json!({ "i": i }).as_object().unwrap().clone(),
                    );
                }
            }
            Step::Durable => {
                rt.block_on(log.record_durable("dispatched", marked(acked)))?;
                if acked == cut.after {
                    files = Some(snapshot(dir.path()));
                    break;
                }
                acked += 1;
            }
            Step::Restart => {
                drop(log);
                log = AuditLog::open(settings(dir.path())).map_err(|e| e.to_string())?;
            }
        }
    }
    let files = match files {
        Some(f) => f,
        None => return Ok(()),
    };
    drop(log);
    let signed = files
        .iter()
        .find(|(n, _)| n == CHECKPOINT_FILE)
        .map(|(_, b)| String::from_utf8_lossy(b).into_owned());
    let cut_dir = tempfile::tempdir().unwrap();
    cut_into(cut_dir.path(), files, cut.after, cut)?;

    super::log::TRUST_THE_TREE.with(|t| t.set(trust_the_tree));
    let reopened = AuditLog::open(settings(cut_dir.path()));
    super::log::TRUST_THE_TREE.with(|t| t.set(false));
    let log = reopened.map_err(|e| format!("the cut log does not open: {e}"))?;
    for k in 0..2 {
        rt.block_on(log.record_durable("dispatched", marked(1000 + k)))?;
    }
    drop(log);

    let also = Also {
        checkpoints: signed
            .into_iter()
            .map(|text| ("signed before the cut".to_owned(), text))
            .collect(),
        witnesses: vec![],
    };
    let report = verify_dir_with(cut_dir.path(), None, None, also).map_err(|e| e.to_string())?;
    if let Some(b) = &report.brk {
        return Err(format!("audit verify after the cut: {}", b.reason));
    }
    if !report.ended_clean {
        return Err("the log after the restart does not end with its shutdown checkpoint".into());
    }
    let mut seen = Vec::new();
    for seg in segments(cut_dir.path()).unwrap() {
        for line in std::fs::read_to_string(seg).unwrap().lines() {
            let e: Map<String, Value> = serde_json::from_str(line).map_err(|e| e.to_string())?;
            if let Some(k) = e.get("ack").and_then(Value::as_u64) {
                seen.push(k);
            }
        }
    }
    for k in 0..=cut.after as u64 {
        if !seen.contains(&k) {
            return Err(format!(
                "acknowledged entry {k} was lost (log holds {seen:?})"
            ));
        }
    }
    Ok(())
}

fn strategy() -> impl Strategy<Value = (Vec<Step>, Cut)> {
    let step = prop_oneof![
        4 => (1u8..5).prop_map(Step::Buffered),
        4 => Just(Step::Durable),
        1 => Just(Step::Restart),
    ];
    let tree = prop_oneof![
        Just(Tree::Kept),
        (0u8..=100).prop_map(Tree::Cut),
        (0u8..=100).prop_map(Tree::Zeroed),
        (0u8..100).prop_map(Tree::Torn),
        Just(Tree::Lost),
    ];
    proptest::collection::vec(step, 1..24).prop_flat_map(move |steps| {
        let durable = steps.iter().filter(|s| matches!(s, Step::Durable)).count();
        (
            Just(steps),
            (
                0..durable.max(1),
                prop_oneof![Just(0u8), Just(100u8), 0u8..=100],
                any::<bool>(),
                tree.clone(),
                prop_oneof![4 => Just(false), 1 => Just(true)],
            )
                .prop_map(
                    |(after, tail_keeps, tail_zeroed, tree, checkpoint_empty)| Cut {
                        after,
                        tail_keeps,
                        tail_zeroed,
                        tree,
                        checkpoint_empty,
                    },
                ),
        )
    })
}

fn runner(cases: u32) -> proptest::test_runner::TestRunner {
    proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases,
        failure_persistence: None,
        ..Default::default()
    })
}

/// The power-loss property of the audit log (see the module's doc).
#[test]
fn audit_power_loss_keeps_every_acknowledged_entry_and_never_signs_a_wrong_root() {
    let cases = std::env::var("COUNTERSIGN_POWER_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    runner(cases)
        .run(&strategy(), |(steps, cut)| {
            power_case(&steps, &cut, false).map_err(TestCaseError::fail)
        })
        .unwrap();
}

/// The property catches a gateway that trusts its tree file after a cut
/// (as before: no check against the log when the signed checkpoint is
/// unreadable or the tree is longer than it).
#[test]
fn audit_power_loss_property_catches_a_trusted_tree() {
    let mut r = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: 256,
        failure_persistence: None,
        max_shrink_iters: 0,
        ..Default::default()
    });
    let found = r.run(&strategy(), |(steps, cut)| {
        power_case(&steps, &cut, true).map_err(TestCaseError::fail)
    });
    let why = found
        .expect_err("a trusted tree went unnoticed")
        .to_string();
    eprintln!("{why}");
    assert!(why.contains("root") || why.contains("checkpoint"), "{why}");
}
