//! The audit log (DESIGN.md section 8) of a real gateway run, checked by the
//! real `countersign audit verify` and `audit export`: it verifies; every
//! kind of tampering is caught at the right sequence number; a crash leaves
//! a truncated tail, not corruption.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

fn cli(args: &[&str]) -> (bool, String, String) {
    common::run_cli(args)
}

fn audit_dir(gw: &common::Gateway) -> PathBuf {
    gw.audit_dir()
}

use common::{audit_entries as entries, audit_segments as segments};

fn verify(dir: &Path, extra: &[&str]) -> (bool, String) {
    let mut args = vec!["audit", "verify", "--dir", dir.to_str().unwrap()];
    args.extend(extra);
    let (ok, out, err) = cli(&args);
    (ok, format!("{out}{err}"))
}

fn pubkey(dir: &Path) -> String {
    let (ok, out, err) = cli(&["audit", "pubkey", "--dir", dir.to_str().unwrap()]);
    assert!(ok, "{err}");
    out.trim().to_owned()
}

/// A gateway with the default policies and reviewer alice; a run with a
/// read, an approved write (and its replay), a drifted retry and a denied
/// call; then a clean stop.
async fn recorded_run(audit_extra: &str) -> (common::Gateway, tempfile::TempDir) {
    let (pdir, key) = common::default_policies_with_alice();
    let mut gw = common::Gateway::start_with(common::Options {
        policies: Some(pdir.path().to_owned()),
        extra: audit_extra.into(),
        ..Default::default()
    });
    let mut c = common::Client::new(&gw.url("payments"));
    c.initialize().await;
    c.post(&json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}))
        .await;
    c.call(2, "get_balance", json!({"account":"acct-1"})).await;
    let write = |id: i64, amount: i64| {
        json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
            "name":"charge_card","arguments":{"account":"acct-1","amount":amount},
            "_meta":{"dev.countersign/idempotency-key":"k-1"}}})
    };
    let pending = c.post(&write(3, 10)).await;
    let proposal = pending.last()["result"]["structuredContent"]["countersign"]["proposal_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (ok, out, err) = common::review_cli(
        &gw,
        &key,
        &["approve", &proposal, "--reason", "within the monthly plan"],
    );
    assert!(ok, "{out}{err}");
    assert_eq!(
        c.post(&write(4, 10)).await.last()["result"]["isError"],
        false
    );
    c.post(&write(5, 10)).await; // replayed
    c.post(&write(6, 11)).await; // drift: the same key, other arguments
    let revised = json!({"jsonrpc":"2.0","id":8,"method":"tools/call","params":{
        "name":"charge_card","arguments":{"account":"acct-1","amount":11},
        "_meta":{"dev.countersign/idempotency-key":"k-2"}}});
    c.post(&revised).await; // a new proposal, beside the approved one (its own key)
    let mut resent = revised.clone();
    resent["params"]["arguments"]["amount"] = json!(12);
    resent["id"] = json!(9);
    c.post(&resent).await; // the same key, other arguments: a revision
    c.call(7, "charge_card", json!({"account":"acct-1","amount":5000}))
        .await; // denied by the ceiling
    assert!(gw.terminate().success());
    (gw, pdir)
}

fn copy_dir(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, to.path().join(p.file_name().unwrap())).unwrap();
    }
    to
}

/// Rewrite the lines of a copy of the log with `f`.
fn tampered(dir: &Path, f: impl FnOnce(&mut Vec<String>)) -> tempfile::TempDir {
    let copy = copy_dir(dir);
    let seg = segments(copy.path()).pop().unwrap();
    let mut lines: Vec<String> = std::fs::read_to_string(&seg)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    f(&mut lines);
    std::fs::write(&seg, lines.join("\n") + "\n").unwrap();
    copy
}

fn seq_of(lines: &[String], kind: &str) -> (usize, u64) {
    lines
        .iter()
        .enumerate()
        .find_map(|(i, l)| {
            let e: Value = serde_json::from_str(l).unwrap();
            (e["kind"] == kind).then(|| (i, e["seq"].as_u64().unwrap()))
        })
        .unwrap_or_else(|| panic!("no {kind} entry"))
}

#[tokio::test]
async fn a_real_run_verifies_and_every_tampering_is_caught_at_its_entry() {
    let (gw, pdir) = recorded_run("").await;
    let dir = audit_dir(&gw);
    let all = entries(&dir);
    let kinds: Vec<&str> = all.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    for k in [
        "log_started",
        "call_received",
        "decision",
        "proposal_created",
        "approval_granted",
        "approval_consumed",
        "dispatched",
        "completed",
        "replayed",
        "proposal_revised",
        "rejected",
        "tools_learned",
        "checkpoint",
    ] {
        assert!(kinds.contains(&k), "no `{k}` entry in {kinds:?}");
    }
    // Every call entry names the call; decisions name their policies.
    for e in all.iter().filter(|e| e["kind"] == "call_received") {
        for f in [
            "call_digest",
            "idempotency_key",
            "principal",
            "tenant",
            "server",
            "tool",
            "arguments_digest",
        ] {
            assert!(e.contains_key(f), "{f} missing in {e:?}");
        }
    }
    let denied = all
        .iter()
        .find(|e| e["kind"] == "decision" && e["decision"] == "deny")
        .unwrap();
    assert_eq!(denied["policies"], json!(["default/charge-ceiling"]));
    // Cause before effect: the approved write's entries, in log order.
    let run: Vec<&str> = all
        .iter()
        .filter(|e| e.get("idempotency_key") == Some(&json!("k-1")))
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    let d = run.iter().position(|k| *k == "dispatched").unwrap();
    assert_eq!(
        &run[d - 3..=d + 1],
        [
            "call_received",
            "decision",
            "approval_consumed",
            "dispatched",
            "completed"
        ],
        "{run:?}"
    );
    assert_eq!(all.last().unwrap()["kind"], "checkpoint");
    assert_eq!(all.last().unwrap()["reason"], "shutdown");

    let key = pubkey(&dir);
    let reviewers = pdir.path().join("reviewers.toml");
    let pinned = [
        "--pubkey",
        key.as_str(),
        "--reviewers",
        reviewers.to_str().unwrap(),
    ];
    let (ok, out) = verify(&dir, &pinned);
    assert!(ok, "{out}");
    // The grant and the consumption both carry alice's signed statement.
    assert!(out.contains("2 reviewer statements verified"), "{out}");
    assert!(out.contains("clean-shutdown checkpoint"), "{out}");

    // Flip one byte inside entry 5.
    let t = tampered(&dir, |lines| {
        let mut bytes = lines[4].clone().into_bytes();
        let i = bytes.iter().position(|b| *b == b'"').unwrap() + 1;
        bytes[i] ^= 0x20;
        lines[4] = String::from_utf8(bytes).unwrap();
    });
    let (ok, out) = verify(t.path(), &pinned);
    assert!(!ok && out.contains("BROKEN at seq 5"), "{out}");
    // ...and names the segment file and the line it is on.
    assert!(out.contains(".jsonl:5)"), "{out}");

    // Delete entry 7.
    let t = tampered(&dir, |lines| {
        lines.remove(6);
    });
    let (ok, out) = verify(t.path(), &pinned);
    assert!(!ok && out.contains("BROKEN at seq 7"), "{out}");

    // Swap entries 8 and 9.
    let t = tampered(&dir, |lines| lines.swap(7, 8));
    let (ok, out) = verify(t.path(), &pinned);
    assert!(!ok && out.contains("BROKEN at seq 8"), "{out}");

    // Edit an argument inside the approved write's call_received entry.
    let mut edited_seq = 0;
    let t = tampered(&dir, |lines| {
        let (i, seq) = lines
            .iter()
            .enumerate()
            .find_map(|(i, l)| {
                let e: Value = serde_json::from_str(l).unwrap();
                (e["kind"] == "call_received" && e["tool"] == "charge_card")
                    .then(|| (i, e["seq"].as_u64().unwrap()))
            })
            .unwrap();
        edited_seq = seq;
        lines[i] = lines[i].replace("\"amount\":10", "\"amount\":1");
    });
    let (ok, out) = verify(t.path(), &pinned);
    assert!(
        !ok && out.contains(&format!("BROKEN at seq {edited_seq}")) && out.contains("edited"),
        "{out}"
    );

    // A checkpoint signed by another key.
    let other = {
        let kdir = tempfile::tempdir().unwrap();
        let (ok, entry, _) = cli(&[
            "keygen",
            "--name",
            "x",
            "--out",
            kdir.path().join("x.key").to_str().unwrap(),
        ]);
        assert!(ok);
        entry
            .lines()
            .find_map(|l| l.strip_prefix("public_key = \""))
            .unwrap()
            .trim_end_matches('"')
            .to_owned()
    };
    // The checkpoint the gateway published beside the log is met first
    // (it is held at its size, before the log's own checkpoint entry).
    let (ok, out) = verify(&dir, &["--pubkey", &other]);
    assert!(
        !ok && out.contains("the checkpoint the gateway published")
            && out.contains("is not signed by"),
        "{out}"
    );

    // An approval statement with a bad reviewer signature, in a chain
    // otherwise rebuilt to match (as a forger with write access would).
    let mut granted_seq = 0;
    let t = tampered(&dir, |lines| {
        let (i, seq) = seq_of(lines, "approval_granted");
        granted_seq = seq;
        let mut prev = String::new();
        for (j, line) in lines.iter_mut().enumerate() {
            let mut e: Map<String, Value> = serde_json::from_str(line).unwrap();
            if j < i {
                prev = e["hash"].as_str().unwrap().to_owned();
                continue;
            }
            if j == i {
                let sig = e["approval"]["signature"].as_str().unwrap().to_owned();
                let forged = if sig.starts_with('A') {
                    sig.replacen('A', "B", 1)
                } else {
                    format!("A{}", &sig[1..])
                };
                e["approval"]["signature"] = json!(forged);
            }
            e.insert("prev".into(), json!(prev));
            let h = countersign::audit::entry_hash(&e);
            e.insert("hash".into(), json!(h));
            prev = h;
            *line = serde_json::to_string(&e).unwrap();
        }
    });
    let (ok, out) = verify(t.path(), &["--reviewers", reviewers.to_str().unwrap()]);
    assert!(
        !ok && out.contains(&format!("BROKEN at seq {granted_seq}"))
            && out.contains("statement of reviewer `alice` does not verify"),
        "{out}"
    );
}

#[tokio::test]
async fn a_crash_leaves_a_truncated_tail_that_verify_reports_as_such() {
    let mut gw = common::Gateway::start_with(common::Options {
        ..Default::default()
    });
    let mut c = common::Client::new(&gw.url("payments"));
    c.initialize().await;
    // A slow write: the server executes at once and answers 3 s later.
    gw.fault("charge_card", "delay", 3000);
    let slow = {
        let c = std::sync::Arc::new(c);
        let c2 = c.clone();
        (
            c,
            tokio::spawn(async move {
                c2.post(
                    &json!({"jsonrpc":"2.0","id":9,"method":"tools/call","params":{
                "name":"charge_card","arguments":{"account":"a","amount":1},
                "_meta":{"dev.countersign/idempotency-key":"slow-1"}}}),
                )
                .await
            }),
        )
    };
    for _ in 0..100 {
        if gw.executions("charge_card") == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(gw.executions("charge_card"), 1);
    // The server ran it; the gateway dies at once. The dispatch entry was
    // committed with the ledger's `dispatched` record before the call went
    // out; the audit file may or may not have it yet.
    gw.kill();
    drop(slow);
    let dir = audit_dir(&gw);
    let in_file_before = entries(&dir)
        .into_iter()
        .any(|e| e["kind"] == "dispatched" && e["idempotency_key"] == "slow-1");
    let (ok, out) = verify(&dir, &[]);
    assert!(ok, "{out}");
    assert!(out.contains("truncation"), "{out}");
    // A write torn mid-line by the crash.
    let seg = segments(&dir).pop().unwrap();
    let mut f = std::fs::OpenOptions::new().append(true).open(&seg).unwrap();
    std::io::Write::write_all(&mut f, b"{\"seq\":1000,\"time\":\"2026-").unwrap();
    drop(f);
    let (ok, out) = verify(&dir, &[]);
    assert!(ok && out.contains("partial final line"), "{out}");

    // The next start cuts the torn line, says so, continues the chain, and
    // appends from the ledger's outbox what the crash kept out of the file.
    gw.start_again();
    gw.terminate();
    let dispatched: Vec<_> = entries(&dir)
        .into_iter()
        .filter(|e| e["kind"] == "dispatched" && e["idempotency_key"] == "slow-1")
        .collect();
    assert_eq!(
        dispatched.len(),
        1,
        "exactly one dispatch entry: {dispatched:?}"
    );
    assert_eq!(
        dispatched[0].get("recovered") == Some(&json!(true)),
        !in_file_before,
        "recovered from the outbox exactly when the crash kept it out of the file"
    );
    let (ok, out) = verify(&dir, &["--pubkey", &pubkey(&dir)]);
    assert!(ok && out.contains("clean-shutdown checkpoint"), "{out}");
    let restarted = entries(&dir)
        .into_iter()
        .filter(|e| e["kind"] == "log_started")
        .nth(1)
        .unwrap();
    assert_eq!(restarted["previous"]["clean_shutdown"], false);
    assert!(restarted["previous"]["torn_bytes_cut"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn exports_round_trip_as_jsonl_csv_and_ocsf() {
    let (gw, _pdir) = recorded_run(
        "\n[[budgets]]\nname = \"card-daily\"\ntools = [\"payments/charge_card\"]\namount = \"/amount\"\nper = \"principal\"\nwindow = \"24h\"\nlimit = 1000\nover = \"approval\"\n",
    )
    .await;
    let dir = audit_dir(&gw);
    let all = entries(&dir);
    let d = dir.to_str().unwrap();

    let (ok, jsonl, err) = cli(&["audit", "export", "--dir", d, "--format", "jsonl"]);
    assert!(ok, "{err}");
    let exported: Vec<Map<String, Value>> = jsonl
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(exported, all, "JSONL export is every entry, unchanged");

    let out = tempfile::tempdir().unwrap();
    let csv_path = out.path().join("audit.csv");
    let (ok, _, err) = cli(&[
        "audit",
        "export",
        "--dir",
        d,
        "--format",
        "csv",
        "--out",
        csv_path.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let csv = std::fs::read_to_string(&csv_path).unwrap();
    let mut rows = csv.lines();
    assert_eq!(
        rows.next().unwrap(),
        "seq,time,kind,principal,tenant,server,tool,call_digest,idempotency_key,decision,policies,proposal_id,reviewer,key_kind,reason,budgets,code,hash"
    );
    assert_eq!(rows.count(), all.len());
    assert!(
        csv.contains(",decision,agent-7,acme,payments,charge_card,"),
        "{csv}"
    );
    // The reviewer's word, and the budget's figures, for an auditor.
    assert!(
        csv.lines()
            .any(|l| l.contains(",alice,ed25519,within the monthly plan,")),
        "{csv}"
    );
    assert!(
        csv.contains("card-daily: spent 0 + amount 10 of limit 1000"),
        "{csv}"
    );

    let (ok, ocsf, err) = cli(&["audit", "export", "--dir", d, "--format", "ocsf"]);
    assert!(ok, "{err}");
    let events: Vec<Value> = ocsf
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), all.len());
    for (ev, e) in events.iter().zip(&all) {
        assert_eq!(ev["class_uid"], 6003);
        assert_eq!(ev["category_uid"], 6);
        assert_eq!(ev["type_uid"], 600399);
        assert_eq!(ev["activity_id"], 99);
        assert!(ev["time"].as_i64().unwrap() > 1_700_000_000_000);
        assert!(ev["severity_id"].is_u64() && ev["status_id"].is_u64());
        assert_eq!(ev["metadata"]["product"]["name"], "countersign");
        assert_eq!(ev["metadata"]["version"], "1.3.0");
        assert_eq!(ev["metadata"]["uid"], e["hash"]);
        assert_eq!(ev["metadata"]["sequence"], e["seq"]);
        if let Some(reviewer) = e.get("reviewer") {
            // The actor of an approval is its reviewer.
            assert_eq!(ev["actor"]["user"]["name"], *reviewer, "{ev}");
            assert_eq!(ev["actor"]["user"]["type"], "reviewer");
        } else if e.contains_key("principal") {
            assert_eq!(ev["actor"]["user"]["name"], e["principal"]);
            assert_eq!(ev["actor"]["user"]["domain"], e["tenant"]);
        }
        if e.contains_key("server") && e.contains_key("call_digest") {
            let uid = ev["api"]["request"]["uid"].as_str().unwrap_or_default();
            assert!(!uid.is_empty(), "a request uid: {ev}");
        }
        if e.contains_key("server") && e.contains_key("tool") {
            assert_eq!(ev["api"]["operation"], "tools/call");
            assert_eq!(
                ev["resources"][0]["name"],
                json!(format!(
                    "{}/{}",
                    e["server"].as_str().unwrap(),
                    e["tool"].as_str().unwrap()
                ))
            );
        }
    }
    let deny = events
        .iter()
        .find(|ev| {
            ev["activity_name"] == "decision" && ev["authorizations"][0]["decision"] == "deny"
        })
        .unwrap();
    assert_eq!(deny["status_id"], 2);
    assert_eq!(
        deny["authorizations"][0]["policy"]["uid"],
        "default/charge-ceiling"
    );

    // --since after the last entry: nothing; an unparsable time: a clear error.
    let (ok, none, _) = cli(&[
        "audit",
        "export",
        "--dir",
        d,
        "--since",
        "2100-01-01T00:00:00Z",
    ]);
    assert!(ok && none.is_empty());
    let (ok, _, err) = cli(&["audit", "export", "--dir", d, "--since", "yesterday"]);
    assert!(!ok && err.contains("not an RFC 3339 time"), "{err}");
}

#[tokio::test]
async fn arguments_are_recorded_as_configured_and_segments_rotate() {
    let (gw, _pdir) = recorded_run(
        "[audit]\narguments = \"redact\"\nredact = [\"/account\"]\nsegment_bytes = 4096\n",
    )
    .await;
    let dir = audit_dir(&gw);
    assert!(segments(&dir).len() > 1, "the log rotated");
    let (ok, out) = verify(&dir, &[]);
    assert!(ok, "{out}");
    let received: Vec<Map<String, Value>> = entries(&dir)
        .into_iter()
        .filter(|e| e["kind"] == "call_received")
        .collect();
    assert!(!received.is_empty());
    for e in &received {
        let account = e["arguments"]["account"].as_str().unwrap();
        assert!(account.starts_with("sha256:"), "redacted: {e:?}");
        assert_ne!(account, "acct-1");
        assert!(e["arguments_digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:"));
    }
    let charge = received
        .iter()
        .find(|e| e["tool"] == "charge_card")
        .unwrap();
    assert_eq!(charge["arguments"]["amount"], 10, "other fields stay");
}

/// An unattended read is one entry, its `completed`: who called what (the
/// call's digest, and the arguments as configured), the decision with its policies,
/// when it was received and answered, and no idempotency key (it has none).
/// A read the policies deny keeps the separate entries of any call, with
/// its derived key, so nothing about an exception is lost.
#[tokio::test]
async fn a_read_is_one_entry_and_a_denied_read_keeps_its_entries() {
    let (pdir, _key) = common::default_policies_with_alice();
    std::fs::write(
        pdir.path().join("frozen.cedar"),
        "@id(\"frozen-account\")\nforbid (principal, action == Action::\"call\", resource == Tool::\"payments/get_balance\")\nwhen { context.arguments has account && context.arguments.account == \"acct-frozen\" };\n",
    )
    .unwrap();
    let mut gw = common::Gateway::start_with(common::Options {
        policies: Some(pdir.path().to_owned()),
        ..Default::default()
    });
    let mut c = common::Client::new(&gw.url("payments"));
    c.initialize().await;
    let read = c.call(2, "get_balance", json!({"account":"acct-1"})).await;
    assert_eq!(read.last()["result"]["isError"], false, "{read:?}");
    let denied = c
        .call(3, "get_balance", json!({"account":"acct-frozen"}))
        .await;
    assert!(
        denied.last().to_string().contains("policy_denied"),
        "{denied:?}"
    );
    assert!(gw.terminate().success());
    let all = entries(&audit_dir(&gw));
    let balance: Vec<&Map<String, Value>> = all
        .iter()
        .filter(|e| e.get("tool") == Some(&json!("get_balance")))
        .collect();
    let kinds: Vec<&str> = balance
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["completed", "call_received", "decision"],
        "{balance:?}"
    );
    let e = balance[0];
    assert_eq!(e["decision"], "allow");
    assert_eq!(e["policies"], json!(["default/read-only"]));
    assert_eq!(e["is_error"], false);
    for f in [
        "call_digest",
        "principal",
        "tenant",
        "server",
        "received_at",
        "time",
    ] {
        assert!(e.contains_key(f), "{f} missing in {e:?}");
    }
    // Its arguments as `audit.arguments` says (`full` here): who read
    // which record is the evidence of an access log.
    assert_eq!(e["arguments"], json!({"account":"acct-1"}), "{e:?}");
    assert!(e["arguments_digest"]
        .as_str()
        .is_some_and(|d| d.starts_with("sha256:")));
    assert!(!e.contains_key("idempotency_key"), "{e:?}");
    // RFC 3339 times as the log writes them (a whole second has no
    // fraction): compared as milliseconds, not as text.
    let ms = |t: &Value| -> (String, u64) {
        let t = t.as_str().unwrap().trim_end_matches('Z');
        let (clock, frac) = t.split_once('.').unwrap_or((t, "0"));
        let hms: Vec<u64> = clock[11..].split(':').map(|n| n.parse().unwrap()).collect();
        let frac: u64 = format!("{frac:0<3}")[..3].parse().unwrap();
        let day = t[..10].to_owned();
        (day, ((hms[0] * 60 + hms[1]) * 60 + hms[2]) * 1000 + frac)
    };
    assert!(ms(&e["received_at"]) <= ms(&e["time"]), "{e:?}");
    // The denied read: its entries as any call's, with its derived key.
    for e in &balance[1..] {
        let key = e["idempotency_key"].as_str().unwrap_or_default();
        assert!(key.starts_with("derived:"), "{e:?}");
    }
    assert_eq!(balance[1]["arguments"], json!({"account":"acct-frozen"}));
    assert_eq!(balance[2]["decision"], "deny");
    assert_eq!(balance[2]["policies"], json!(["frozen/frozen-account"]));
    let (ok, out) = verify(&audit_dir(&gw), &[]);
    assert!(ok, "{out}");
}

/// An unattended read's one entry carries its arguments as
/// `audit.arguments` says: as they are under `full`, none under `digest`
/// (the digest only), the values at `audit.redact` pointers digested under
/// `redact`; and `audit export --follow` streams them so.
#[tokio::test]
async fn a_reads_arguments_are_in_its_entry_as_configured_and_follow_shows_them() {
    use std::io::BufRead;
    for mode in ["full", "digest", "redact"] {
        let gw = common::Gateway::start_with(common::Options {
            extra: match mode {
                "redact" => "[audit]\narguments = \"redact\"\nredact = [\"/account\"]\n".into(),
                _ => format!("[audit]\narguments = \"{mode}\"\n"),
            },
            ..Default::default()
        });
        let dir = audit_dir(&gw);
        let mut follow = std::process::Command::new(common::countersign_bin())
            .args(["audit", "export", "--follow", "--dir"])
            .arg(&dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
        let stdout = follow.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(serde_json::from_str(&line).unwrap()).is_err() {
                    break;
                }
            }
        });
        let mut c = common::Client::new(&gw.url("payments"));
        c.initialize().await;
        let read = c
            .call(
                2,
                "get_balance",
                json!({"account":"acct-7","currency":"EUR"}),
            )
            .await;
        assert_eq!(read.last()["result"]["isError"], false, "{read:?}");
        let e = tokio::time::timeout(std::time::Duration::from_secs(20), async {
            while let Some(e) = rx.recv().await {
                if e["kind"] == "completed" && e["tool"] == "get_balance" {
                    return e;
                }
            }
            panic!("{mode}: the export ended");
        })
        .await
        .unwrap_or_else(|_| panic!("{mode}: the read's entry never came out of --follow"));
        follow.kill().unwrap();
        follow.wait().unwrap();
        assert_eq!(e["decision"], "allow", "{mode}: {e}");
        assert!(
            e["arguments_digest"]
                .as_str()
                .is_some_and(|d| d.starts_with("sha256:")),
            "{mode}: {e}"
        );
        match mode {
            "full" => assert_eq!(
                e["arguments"],
                json!({"account":"acct-7","currency":"EUR"}),
                "{e}"
            ),
            "digest" => assert!(e.get("arguments").is_none(), "{e}"),
            _ => {
                let account = e["arguments"]["account"].as_str().unwrap_or_default();
                assert!(account.starts_with("sha256:"), "redacted: {e}");
                assert_eq!(e["arguments"]["currency"], "EUR", "other fields stay: {e}");
            }
        }
    }
}
