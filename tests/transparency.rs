//! Audit transparency (DESIGN.md section 15) of a real gateway run: its
//! checkpoints, inclusion and consistency proofs are checked by
//! implementations nobody here wrote (`signed_note` for C2SP signed notes,
//! `tlog_tiles` for tlog checkpoints and RFC 6962 proofs, which also builds
//! the tree again from the log's entries); tampering, truncation and forks
//! are found with precise messages; a witness made here, whose checks are
//! those crates', cosigns what the gateway submits.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

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

/// A stopped gateway's log, and its latest checkpoint copied elsewhere.
async fn stopped_run() -> (Gateway, std::path::PathBuf, u64) {
    let mut gw = gateway("");
    traffic(&gw, 8).await;
    gw.terminate();
    let held = gw.audit_dir().with_file_name("held.note");
    std::fs::copy(gw.audit_dir().join("checkpoint"), &held).unwrap();
    let note = std::fs::read_to_string(&held).unwrap();
    let size: u64 = note.lines().nth(1).unwrap().parse().unwrap();
    (gw, held, size)
}

fn verify(gw: &Gateway, extra: &[&str]) -> (bool, String) {
    let dir = dir_arg(gw);
    let mut args = vec!["audit", "verify", "--dir", dir.as_str()];
    args.extend(extra);
    let (ok, out, err) = run_cli(&args);
    (ok, format!("{out}{err}"))
}

/// The last segment's lines, to cut or change.
fn last_segment(gw: &Gateway) -> (std::path::PathBuf, Vec<String>) {
    let seg = audit_segments(&gw.audit_dir()).pop().unwrap();
    let lines = std::fs::read_to_string(&seg)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    (seg, lines)
}

fn write_lines(path: &Path, lines: &[String]) {
    std::fs::write(
        path,
        lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
    )
    .unwrap();
}

#[tokio::test]
async fn a_truncation_after_a_checkpoint_held_elsewhere_is_reported() {
    let (gw, held, size) = stopped_run().await;
    let (ok, out) = verify(&gw, &["--checkpoint", held.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("the log holds it (size {size}, root matches)")),
        "{out}"
    );
    let (seg, mut lines) = last_segment(&gw);
    lines.truncate(lines.len() - 5);
    write_lines(&seg, &lines);
    // The checkpoint the gateway published beside the log says what
    // happened, without being asked...
    let (ok, out) = verify(&gw, &[]);
    assert!(!ok, "{out}");
    assert!(
        out.contains(&format!(
            "covers {size} entries, and the log has {}: 4 entries were removed from its end (seq {} to {size} are missing)",
            size - 4,
            size - 3
        )) && out.contains("the checkpoint the gateway published"),
        "{out}"
    );
    // The gateway itself will not sign over it.
    let out = std::process::Command::new(countersign_bin())
        .args(["serve", "--config"])
        .arg(gw.config_path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no longer holds what this gateway signed"),
        "{err}"
    );
    // ...and when it is cut away too, the log alone looks like a crash...
    std::fs::remove_file(gw.audit_dir().join("checkpoint")).unwrap();
    let (ok, out) = verify(&gw, &[]);
    assert!(
        ok && out.contains("truncation") && !out.contains("BROKEN"),
        "{out}"
    );
    // ...and only the checkpoint held elsewhere says what happened.
    let (ok, out) = verify(&gw, &["--expect-checkpoint", held.to_str().unwrap()]);
    assert!(!ok, "{out}");
    assert!(
        out.contains(&format!("truncated: {} (signed by the gateway) covers {size} entries, and the log has {}: 4 entries were removed from its end", held.display(), size - 4)),
        "{out}"
    );
}

#[tokio::test]
async fn an_edited_or_deleted_entry_is_named_at_its_seq() {
    let (gw, held, _) = stopped_run().await;
    let (seg, lines) = last_segment(&gw);
    let mut edited = lines.clone();
    edited[3] = edited[3].replacen(r#""tool":"charge_card""#, r#""tool":"refund""#, 1);
    assert_ne!(edited[3], lines[3], "the entry names its tool");
    write_lines(&seg, &edited);
    let (ok, out) = verify(&gw, &["--checkpoint", held.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        out.contains("BROKEN at seq 4") && out.contains("it was edited"),
        "{out}"
    );
    let mut deleted = lines.clone();
    deleted.remove(5);
    write_lines(&seg, &deleted);
    let (ok, out) = verify(&gw, &["--checkpoint", held.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        out.contains("BROKEN at seq 6") && out.contains("an entry was removed"),
        "{out}"
    );
}

/// Someone with the files but not the key rewrites an entry and the chain
/// after it, and takes the signatures out of the log's own checkpoints: the
/// chain verifies again, and the checkpoint held elsewhere does not.
#[tokio::test]
async fn a_history_rewritten_without_the_key_is_found_by_a_checkpoint_held_elsewhere() {
    let (gw, held, size) = stopped_run().await;
    let (seg, lines) = last_segment(&gw);
    let mut prev = String::new();
    let mut rewritten = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let mut e: serde_json::Map<String, Value> = serde_json::from_str(line).unwrap();
        if i == 3 {
            e.insert("tool".into(), json!("refund"));
        }
        if e["kind"] == "checkpoint" {
            e.insert("kind".into(), json!("noted"));
            for k in ["note", "signature", "checkpoint"] {
                e.remove(k);
            }
        }
        e.remove("hash");
        e.insert("prev".into(), json!(prev));
        let h = countersign::audit::entry_hash(&e);
        e.insert("hash".into(), json!(h));
        prev = h;
        rewritten.push(countersign::core::canonical::jcs(&Value::Object(e)));
    }
    write_lines(&seg, &rewritten);
    // The checkpoint the gateway published beside the log catches it...
    let (ok, out) = verify(&gw, &[]);
    assert!(!ok, "{out}");
    // ...and with that file rewritten away too, the chain holds together.
    std::fs::remove_file(gw.audit_dir().join("checkpoint")).unwrap();
    let (ok, out) = verify(&gw, &[]);
    assert!(ok, "the rewritten chain holds together on its own: {out}");
    let (ok, out) = verify(&gw, &["--checkpoint", held.to_str().unwrap()]);
    assert!(!ok, "{out}");
    assert!(
        out.contains(&format!(
            "rewritten: the log's first {size} entries do not hash to the root of {}",
            held.display()
        )),
        "{out}"
    );
}

#[tokio::test]
async fn two_signed_checkpoints_of_one_size_with_different_roots_are_a_fork() {
    let (gw, held, size) = stopped_run().await;
    // The gateway's key signs a second history of the same size (what a
    // gateway whose key was taken, or a buggy one, would do).
    let key = countersign::audit::log::load_or_create_key(&gw.audit_dir()).unwrap();
    let other = countersign::audit::note::sign(
        &countersign::audit::note::Checkpoint {
            origin: ORIGIN.into(),
            size,
            root: [9; 32],
        },
        &key,
    );
    let forged = gw.audit_dir().with_file_name("other.note");
    std::fs::write(&forged, other.render()).unwrap();
    let (ok, out) = verify(
        &gw,
        &[
            "--checkpoint",
            held.to_str().unwrap(),
            "--checkpoint",
            forged.to_str().unwrap(),
        ],
    );
    assert!(!ok, "{out}");
    assert!(
        out.contains(&format!(
            "fork: {} and {} are two checkpoints of size {size} with different roots",
            held.display(),
            forged.display()
        )),
        "{out}"
    );
    // And one not signed by the gateway at all is refused as such.
    let stranger = countersign::audit::note::sign(
        &countersign::audit::note::Checkpoint {
            origin: ORIGIN.into(),
            size,
            root: [9; 32],
        },
        &ed25519_dalek::SigningKey::from_bytes(&[5; 32]),
    );
    std::fs::write(&forged, stranger.render()).unwrap();
    let (ok, out) = verify(&gw, &["--checkpoint", forged.to_str().unwrap()]);
    assert!(!ok);
    assert!(out.contains("is not signed by"), "{out}");
}

#[tokio::test]
async fn a_verifier_without_a_shell_gets_the_checkpoint_and_proofs_over_http() {
    let gw = gateway("");
    traffic(&gw, 6).await;
    let http = reqwest::Client::new();
    // The checkpoint file appears with the first checkpoint.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let note = loop {
        let r = http
            .get(format!("{}/audit/checkpoint", gw.base()))
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            break r.text().await.unwrap();
        }
        assert!(std::time::Instant::now() < deadline, "no checkpoint served");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let dir = dir_arg(&gw);
    let vkey = cli_ok(&["audit", "pubkey", "--vkey", "--dir", &dir]);
    let (size, root) = their_checkpoint(&note, vkey.trim());
    let (theirs, leaves) = their_tree(&gw.audit_dir());
    let get = |path: String| {
        let http = http.clone();
        let url = format!("{}{path}", gw.base());
        async move {
            serde_json::from_str::<Value>(
                &http.get(url).send().await.unwrap().text().await.unwrap(),
            )
            .unwrap()
        }
    };
    let p = get(format!("/audit/proof/inclusion?seq=3&size={size}")).await;
    check_record(&their_hashes(&p), size, root, 2, record_hash(&leaves[2])).unwrap();
    let p = get(format!("/audit/proof/consistency?old=2&size={size}")).await;
    check_tree(
        &their_hashes(&p),
        size,
        root,
        2,
        tree_hash(2, &theirs).unwrap(),
    )
    .unwrap();
    let r = http
        .get(format!("{}/audit/proof/inclusion?seq=100000", gw.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("is not in a tree of"));
}

// ------------------------------------------------------------ a witness

/// A minimal C2SP tlog-witness: it checks the log's signature with
/// signed_note and the consistency proof with tlog_tiles, keeps the latest
/// size and root it cosigned, and cosigns (tlog-cosignature/v1).
struct Witness {
    name: String,
    key: ed25519_dalek::SigningKey,
    /// The log's verifier key, once the test knows it.
    log_vkey: std::sync::Mutex<Option<String>>,
    state: std::sync::Mutex<Option<(u64, TheirHash)>>,
    /// Statuses answered, in order.
    answered: std::sync::Mutex<Vec<u16>>,
    /// Answer the next submission with 422, whatever it holds.
    refuse_next: std::sync::atomic::AtomicBool,
}

impl Witness {
    fn vkey(&self) -> String {
        use sha2::Digest;
        let pk = self.key.verifying_key().to_bytes();
        let mut h = sha2::Sha256::new();
        h.update(self.name.as_bytes());
        h.update([b'\n', 0x04]);
        h.update(pk);
        let id = &h.finalize()[..4];
        let mut raw = vec![0x04];
        raw.extend_from_slice(&pk);
        format!("{}+{}+{}", self.name, hex::encode(id), b64().encode(raw))
    }

    fn add_checkpoint(&self, body: &str) -> (u16, &'static str, String) {
        let (status, kind, answer) = self.judge(body);
        self.answered.lock().unwrap().push(status);
        (status, kind, answer)
    }

    fn judge(&self, body: &str) -> (u16, &'static str, String) {
        let text = "text/plain";
        let Some((head, note)) = body.split_once("\n\n") else {
            return (400, text, "no blank line".into());
        };
        let mut lines = head.lines();
        let Some(old) = lines
            .next()
            .and_then(|l| l.strip_prefix("old "))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            return (400, text, "no old size".into());
        };
        let proof: Vec<TheirHash> = lines
            .map(|l| TheirHash(b64().decode(l).unwrap().try_into().unwrap()))
            .collect();
        let Some(vkey) = self.log_vkey.lock().unwrap().clone() else {
            return (404, text, "unknown log".into());
        };
        let Ok(n) = TheirNote::from_bytes(note.as_bytes()) else {
            return (400, text, "not a note".into());
        };
        let verifiers = VerifierList::new(vec![Box::new(StandardVerifier::new(&vkey).unwrap())]);
        if n.verify(&verifiers).is_err() {
            return (403, text, "no valid signature".into());
        }
        let cp = tlog_tiles::Checkpoint::from_bytes(n.text()).unwrap();
        if cp.origin() != ORIGIN {
            return (404, text, "unknown origin".into());
        }
        if old > cp.size() {
            return (400, text, "old beyond size".into());
        }
        let mut state = self.state.lock().unwrap();
        let (held, held_root) = state.unwrap_or((0, TheirHash([0; 32])));
        if old != held {
            return (409, "text/x.tlog.size", format!("{held}\n"));
        }
        if self
            .refuse_next
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            return (422, text, "refused on purpose".into());
        }
        if old == cp.size() && held_root != *cp.hash() {
            return (409, "text/x.tlog.size", format!("{held}\n"));
        }
        if old > 0
            && old < cp.size()
            && check_tree(&proof, cp.size(), *cp.hash(), old, held_root).is_err()
        {
            return (422, text, "the consistency proof does not verify".into());
        }
        *state = Some((cp.size(), *cp.hash()));
        // tlog-cosignature/v1: key id || timestamp || Ed25519 over
        // "cosignature/v1\ntime T\n" and the checkpoint text.
        use ed25519_dalek::Signer;
        use sha2::Digest;
        let time: u64 = 1_800_000_000;
        let mut msg = format!("cosignature/v1\ntime {time}\n").into_bytes();
        msg.extend_from_slice(n.text());
        let mut h = sha2::Sha256::new();
        h.update(self.name.as_bytes());
        h.update([b'\n', 0x04]);
        h.update(self.key.verifying_key().to_bytes());
        let mut sig = h.finalize()[..4].to_vec();
        sig.extend_from_slice(&time.to_be_bytes());
        sig.extend_from_slice(&self.key.sign(&msg).to_bytes());
        (
            200,
            "text/plain",
            format!("\u{2014} {} {}\n", self.name, b64().encode(sig)),
        )
    }
}

async fn start_witness(w: std::sync::Arc<Witness>) -> String {
    use axum::routing::post;
    let app = axum::Router::new().route(
        "/add-checkpoint",
        post(move |body: String| {
            let w = w.clone();
            async move {
                let (status, kind, answer) = w.add_checkpoint(&body);
                (
                    axum::http::StatusCode::from_u16(status).unwrap(),
                    [(axum::http::header::CONTENT_TYPE, kind)],
                    answer,
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

fn cosigned(gw: &Gateway) -> Vec<serde_json::Map<String, Value>> {
    audit_entries(&gw.audit_dir())
        .into_iter()
        .filter(|e| e["kind"] == "checkpoint_cosigned")
        .collect()
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_witness_cosigns_consistent_checkpoints_refuses_an_inconsistent_one_and_verify_checks_it()
{
    let w = std::sync::Arc::new(Witness {
        name: "witness.test/w1".into(),
        key: ed25519_dalek::SigningKey::from_bytes(&[42; 32]),
        log_vkey: Default::default(),
        state: Default::default(),
        answered: Default::default(),
        refuse_next: Default::default(),
    });
    let url = start_witness(w.clone()).await;
    let mut gw = gateway(&format!(
        "\n[audit.witness]\nurl = \"{url}\"\nkey = \"{}\"\n",
        w.vkey()
    ));
    // The witness is told the log's key, as its operator would configure it.
    let pubkey = cli_ok(&["audit", "pubkey", "--dir", &dir_arg(&gw)]);
    let raw = b64()
        .decode(pubkey.trim().strip_prefix("ed25519:").unwrap())
        .unwrap();
    let vk = ed25519_dalek::VerifyingKey::from_bytes(&raw.try_into().unwrap()).unwrap();
    *w.log_vkey.lock().unwrap() = Some(signed_note::new_ed25519_verifier_key(ORIGIN, &vk));

    traffic(&gw, 6).await;
    wait_until("two cosigned checkpoints", || cosigned(&gw).len() >= 2).await;
    // The cosignature goes beside the checkpoint, in the checkpoint file.
    let file = gw.audit_dir().join("checkpoint");
    wait_until("the cosignature in the checkpoint file", || {
        std::fs::read_to_string(&file)
            .unwrap()
            .contains("\u{2014} witness.test/w1 ")
    })
    .await;

    // The witness refuses the gateway's next submission (422): the gateway
    // reports it and carries on.
    w.refuse_next
        .store(true, std::sync::atomic::Ordering::SeqCst);
    traffic(&gw, 3).await;
    gw.wait_for_log("found the consistency proof invalid").await;

    // A restart forgets the witness's size: the first submission says
    // `old 0`, gets 409 with the size the witness holds, and proves from it.
    gw.restart();
    let before = cosigned(&gw).len();
    traffic(&gw, 4).await;
    wait_until("a cosignature after the restart", || {
        cosigned(&gw).len() > before
    })
    .await;
    let answered = w.answered.lock().unwrap().clone();
    let conflict = answered
        .iter()
        .rposition(|&s| s == 409)
        .expect("a 409 after the restart");
    assert_eq!(answered.get(conflict + 1), Some(&200), "{answered:?}");

    gw.terminate();
    // Once the gateway is stopped (the witness's state holds still): a
    // checkpoint the log never made (another root, a larger size),
    // signed with the gateway's key, with a proof from the witness's size:
    // the witness refuses it, and its state does not move.
    let (held, _) = w.state.lock().unwrap().unwrap();
    let key = countersign::audit::log::load_or_create_key(&gw.audit_dir()).unwrap();
    let forged = countersign::audit::note::sign(
        &countersign::audit::note::Checkpoint {
            origin: ORIGIN.into(),
            size: held + 3,
            root: [7; 32],
        },
        &key,
    );
    let p: Value = serde_json::from_str(&cli_ok(&[
        "audit",
        "prove",
        "--consistency",
        &held.to_string(),
        "--dir",
        &dir_arg(&gw),
    ]))
    .unwrap();
    let mut body = format!("old {held}\n");
    for h in p["hashes"].as_array().unwrap() {
        body.push_str(h.as_str().unwrap());
        body.push('\n');
    }
    body.push('\n');
    body.push_str(&forged.render());
    let r = reqwest::Client::new()
        .post(format!("{url}/add-checkpoint"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    assert_eq!(w.state.lock().unwrap().unwrap().0, held);

    let dir = dir_arg(&gw);
    let (ok, out, err) = run_cli(&["audit", "verify", "--dir", &dir, "--witness", &w.vkey()]);
    assert!(ok, "{out}{err}");
    let n = cosigned(&gw).len();
    assert!(
        out.contains(&format!("{n} witness cosignatures verified")),
        "{out}"
    );
    // Another key of the same name verifies none of them.
    let (ok, out, _) = run_cli(&[
        "audit",
        "verify",
        "--dir",
        &dir,
        "--witness",
        &Witness {
            name: "witness.test/w1".into(),
            key: ed25519_dalek::SigningKey::from_bytes(&[43; 32]),
            log_vkey: Default::default(),
            state: Default::default(),
            answered: Default::default(),
            refuse_next: Default::default(),
        }
        .vkey(),
    ]);
    assert!(
        ok && !out.contains("witness cosignatures verified"),
        "{out}"
    );
}
