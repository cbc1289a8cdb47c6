//! Audit transparency (DESIGN.md section 15) of a real gateway run: its
//! checkpoints, inclusion and consistency proofs are checked by
//! implementations nobody here wrote (`signed_note` for C2SP signed notes,
//! `tlog_tiles` for tlog checkpoints and RFC 6962 proofs, which also builds
//! the tree again from the log's entries); tampering, truncation and forks
//! are found with precise messages; a witness made here, whose checks are
//! those crates', cosigns what the gateway submits.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use base64::Engine;
use common::*;
use serde_json::{json, Value};
use signed_note::{Note as TheirNote, StandardVerifier, VerifierList};
use tlog_tiles::{
    check_record, check_tree, record_hash, stored_hashes, tree_hash, Hash as TheirHash, HashReader,
};

const ORIGIN: &str = "countersign.test/audit";

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

fn cli_ok(args: &[&str]) -> String {
    let (ok, out, err) = run_cli(args);
    assert!(ok, "countersign {args:?} failed:\n{out}{err}");
    out
}

fn dir_arg(gw: &Gateway) -> String {
    gw.audit_dir().display().to_string()
}

/// A gateway whose log checkpoints every 5 entries, with a fixed origin.
fn gateway(extra: &str) -> Gateway {
    Gateway::start_with(Options {
        extra: format!("\n[audit]\ncheckpoint_every = 5\norigin = \"{ORIGIN}\"\n{extra}"),
        ..Default::default()
    })
}

/// Some traffic: reads and writes through a session.
async fn traffic(gw: &Gateway, calls: i64) {
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    for i in 0..calls {
        let a = c
            .call(
                i + 1,
                "charge_card",
                json!({"account": format!("acct_{i}"), "amount": i + 1}),
            )
            .await;
        assert_eq!(a.status, 200, "{a:?}");
    }
}

/// The tree again, built by tlog_tiles from the log's own entries: leaf i
/// is the record hash of entry i+1's 32-byte `hash`.
struct Theirs(Vec<TheirHash>);

impl HashReader for Theirs {
    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<TheirHash>, tlog_tiles::Error> {
        Ok(indexes.iter().map(|&i| self.0[i as usize]).collect())
    }
}

fn their_tree(dir: &Path) -> (Theirs, Vec<[u8; 32]>) {
    let mut t = Theirs(Vec::new());
    let mut hashes = Vec::new();
    for (i, e) in audit_entries(dir).iter().enumerate() {
        assert_eq!(e["seq"], json!(i + 1));
        let h = e["hash"].as_str().unwrap().strip_prefix("sha256:").unwrap();
        let mut raw = [0u8; 32];
        hex::decode_to_slice(h, &mut raw).unwrap();
        let more = stored_hashes(i as u64, &raw, &t).unwrap();
        t.0.extend(more);
        hashes.push(raw);
    }
    (t, hashes)
}

fn their_hashes(v: &Value) -> Vec<TheirHash> {
    v["hashes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            TheirHash(
                b64()
                    .decode(h.as_str().unwrap())
                    .unwrap()
                    .try_into()
                    .unwrap(),
            )
        })
        .collect()
}

/// The note checked by signed_note with the vkey the gateway prints, and
/// read as a tlog checkpoint by tlog_tiles: (size, root).
fn their_checkpoint(note: &str, vkey: &str) -> (u64, TheirHash) {
    let n = TheirNote::from_bytes(note.as_bytes()).unwrap();
    let verifier = StandardVerifier::new(vkey).unwrap();
    let (verified, _) = n
        .verify(&VerifierList::new(vec![Box::new(verifier)]))
        .unwrap();
    assert_eq!(verified.len(), 1);
    let cp = tlog_tiles::Checkpoint::from_bytes(n.text()).unwrap();
    assert_eq!(cp.origin(), ORIGIN);
    (cp.size(), *cp.hash())
}

#[tokio::test]
async fn checkpoints_and_proofs_verify_with_implementations_nobody_here_wrote() {
    let mut gw = gateway("");
    traffic(&gw, 12).await;
    gw.terminate();
    let dir = dir_arg(&gw);
    let note = cli_ok(&["audit", "checkpoint", "--dir", &dir]);
    let vkey = cli_ok(&["audit", "pubkey", "--vkey", "--dir", &dir]);
    let (size, root) = their_checkpoint(&note, vkey.trim());
    let (theirs, leaves) = their_tree(&gw.audit_dir());
    // The shutdown checkpoint covers every entry before it.
    assert_eq!(size, leaves.len() as u64 - 1, "{note}");
    assert_eq!(
        tree_hash(size, &theirs).unwrap(),
        root,
        "tlog_tiles builds the same root from the log"
    );
    for seq in [1, 2, 7, size / 2, size] {
        let p: Value = serde_json::from_str(&cli_ok(&[
            "audit",
            "prove",
            &seq.to_string(),
            "--dir",
            &dir,
        ]))
        .unwrap();
        assert_eq!(p["tree_size"], json!(size));
        let leaf = record_hash(&leaves[(seq - 1) as usize]);
        check_record(&their_hashes(&p), size, root, seq - 1, leaf)
            .unwrap_or_else(|e| panic!("seq {seq}: {e:?}"));
        // Another entry's leaf is not included there.
        let other = record_hash(&leaves[(seq % size) as usize]);
        assert!(check_record(&their_hashes(&p), size, root, seq - 1, other).is_err());
    }
    for old in [1, 4, 5, 8, size - 1, size] {
        let p: Value = serde_json::from_str(&cli_ok(&[
            "audit",
            "prove",
            "--consistency",
            &old.to_string(),
            "--dir",
            &dir,
        ]))
        .unwrap();
        let old_root = tree_hash(old, &theirs).unwrap();
        check_tree(&their_hashes(&p), size, root, old, old_root)
            .unwrap_or_else(|e| panic!("{old}: {e:?}"));
    }
    // Every checkpoint the log holds, checked the same way.
    let notes: Vec<String> = audit_entries(&gw.audit_dir())
        .into_iter()
        .filter(|e| e["kind"] == "checkpoint")
        .map(|e| e["note"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        notes.len() >= 3,
        "a checkpoint every 5 entries and at the stop: {}",
        notes.len()
    );
    for n in &notes {
        let (s, r) = their_checkpoint(n, vkey.trim());
        assert_eq!(tree_hash(s, &theirs).unwrap(), r, "checkpoint {s}");
    }
    // The export with proofs: each entry checked on its own, by us and by
    // tlog_tiles.
    let export = gw.audit_dir().with_file_name("export.jsonl");
    cli_ok(&[
        "audit",
        "export",
        "--with-proofs",
        "--dir",
        &dir,
        "--out",
        export.to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(&export).unwrap();
    let mut rows = text.lines();
    let head: Value = serde_json::from_str(rows.next().unwrap()).unwrap();
    assert_eq!(head["checkpoint"].as_str().unwrap(), note);
    let mut n = 0;
    for row in rows {
        let row: Value = serde_json::from_str(row).unwrap();
        let seq = row["entry"]["seq"].as_u64().unwrap();
        let leaf = record_hash(&leaves[(seq - 1) as usize]);
        check_record(&their_hashes(&row["inclusion"]), size, root, seq - 1, leaf).unwrap();
        n += 1;
    }
    assert_eq!(n, size);
    let out = cli_ok(&[
        "audit",
        "check-export",
        export.to_str().unwrap(),
        "--pubkey",
        vkey.trim(),
    ]);
    assert!(out.contains(&format!("ok: {size} entries")), "{out}");
    // One entry of the export altered: check-export names it.
    let altered = text.replacen("acct_3", "acct_X", 1);
    std::fs::write(&export, altered).unwrap();
    let (ok, out, err) = run_cli(&[
        "audit",
        "check-export",
        export.to_str().unwrap(),
        "--pubkey",
        vkey.trim(),
    ]);
    assert!(!ok, "{out}");
    assert!(err.contains("edited"), "{err}");
    let out = cli_ok(&["audit", "verify", "--dir", &dir]);
    assert!(
        out.contains(&format!("merkle tree: {} entries", leaves.len())),
        "{out}"
    );
}
