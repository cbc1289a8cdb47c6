//! The review console in a real browser: Debian's Chromium driven by
//! Playwright, with a CDP virtual authenticator (ctap2, internal, resident
//! keys, user verification), against the real gateway and the example
//! server. Invite, enrol, sign in, approve and deny with a passkey, quorums
//! mixed with CLI reviewers, and every refusal with nothing run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::{json, Value};

/// A gateway with the console on, its policy folder (the shipped policies,
/// `extra_policy` beside them, `reviewers.toml` as `reviewers`), and the
/// browser's state between runs.
struct Console {
    gw: Gateway,
    policies: tempfile::TempDir,
    state: tempfile::TempDir,
    base: String,
}

impl Console {
    fn start(extra_policy: &str, reviewers: &str) -> Console {
        Console::start_with(extra_policy, reviewers, "")
    }

    fn start_with(extra_policy: &str, reviewers: &str, extra_config: &str) -> Console {
        let policies = tempfile::tempdir().unwrap();
        let shipped = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policies");
        for f in ["schema.cedarschema", "default.cedar"] {
            std::fs::copy(shipped.join(f), policies.path().join(f)).unwrap();
        }
        if !extra_policy.is_empty() {
            std::fs::write(policies.path().join("extra.cedar"), extra_policy).unwrap();
        }
        std::fs::write(policies.path().join("reviewers.toml"), reviewers).unwrap();
        let gw = Gateway::start_with(Options {
            policies: Some(policies.path().to_owned()),
            extra: format!("\n[review]\nenabled = true\n{extra_config}"),
            ..Default::default()
        });
        let port = gw.addr.rsplit(':').next().unwrap().to_owned();
        Console {
            base: format!("http://localhost:{port}"),
            gw,
            policies,
            state: tempfile::tempdir().unwrap(),
        }
    }

    /// Run `steps` in the browser as user `who` (their authenticator and
    /// cookies kept between runs): one result per step.
    fn browser(&self, who: &str, steps: Value) -> Vec<Value> {
        let plan = json!({
            "state": self.state.path().join(format!("{who}.json")),
            "base": self.base,
            "steps": steps,
        });
        let out = Command::new("node")
            .current_dir(peers_cache().join("browser"))
            .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/peers/console_browser.mjs"))
            .arg(plan.to_string())
            .output()
            .expect("node: `.ci/setup-peers` installs playwright-core and Chromium");
        assert!(
            out.status.success(),
            "the browser run failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
    }

    /// `countersign reviewer invite NAME ...`: the enrolment link's path.
    fn invite(&self, name: &str, groups: &str, ttl: &str) -> String {
        let out = self.gw.cli(&[
            "reviewer",
            "invite",
            name,
            "--groups",
            groups,
            "--tenants",
            "acme",
            "--ttl",
            ttl,
        ]);
        assert!(out.status.success(), "{out:?}");
        let link = String::from_utf8(out.stdout).unwrap();
        let at = link.find("/review/enrol/").unwrap();
        link[at..].trim().to_owned()
    }

    /// Enrol `who` through `link` in the browser: the entry it shows.
    fn enrol(&self, who: &str, link: &str) -> String {
        let r = self.browser(
            who,
            json!([{"goto": link}, {"click": "enrol"}, {"count": "[data-action=enrol]"}]),
        );
        let entry = r[1]["entry"].as_str().unwrap_or_default().to_owned();
        assert!(entry.starts_with("[[reviewers]]"), "{r:?}");
        // The page ends finished: no button to make a second passkey.
        assert_eq!(r[2]["count"], 0, "{r:?}");
        entry
    }

    /// Write `reviewers.toml` and wait until the gateway has loaded it.
    async fn reviewers(&self, text: &str) {
        let count = || {
            self.gw
                .log
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.contains("policies reloaded"))
                .count()
        };
        let before = count();
        std::fs::write(self.policies.path().join("reviewers.toml"), text).unwrap();
        eventually("the reviewers file reloaded", || count() > before).await;
    }

    fn sign_in(&self, who: &str) {
        let r = self.browser(
            who,
            json!([{"goto": "/review/sign-in"}, {"click": "sign-in"}]),
        );
        assert!(r[1]["url"].as_str().unwrap().ends_with("/review/"), "{r:?}");
    }
}

/// A charge held for approval by the agent's session: the client and the
/// proposal id.
async fn held(gw: &Gateway, key: &str, amount: i64) -> (Client, Value, String) {
    let c = listed(gw, "payments").await;
    let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge_card",
        "arguments":{"account":"acct_1","amount":amount},"_meta":{"dev.countersign/idempotency-key":key}}});
    let a = c.post(&call).await;
    assert_eq!(code(&a), "approval_pending", "{a:?}");
    let id = proposal_id(&a);
    (c, call, id)
}

/// An ed25519 reviewer made with `countersign keygen`: the key file and the
/// entry.
fn keygen(dir: &Path, name: &str) -> (PathBuf, String) {
    let key = dir.join(format!("{name}.key"));
    let out = Command::new(countersign_bin())
        .args([
            "keygen",
            "--name",
            name,
            "--groups",
            "finance",
            "--tenants",
            "acme",
            "--out",
        ])
        .arg(&key)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    (key, String::from_utf8(out.stdout).unwrap())
}

#[tokio::test]
async fn invite_enrol_sign_in_and_approve_a_held_charge_that_then_runs_once() {
    let console = Console::start("", "");
    let link = console.invite("alice", "leads", "1h");
    let entry = console.enrol("alice", &link);
    assert!(
        entry.contains("name = \"alice\"") && entry.contains("alg = \"ES256\""),
        "{entry}"
    );
    // `reviewer enrolled` prints the same entry on the gateway's host.
    let out = console.gw.cli(&["reviewer", "enrolled"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(entry.trim()),
        "{out:?}"
    );
    // `--append` merges it into a reviewers file that lists alice already
    // (an ed25519 reviewer adding a passkey): her entry keeps its groups.
    let merged_file = console.state.path().join("reviewers-merged.toml");
    std::fs::write(
        &merged_file,
        "# reviewed in git\n[[reviewers]]\nname = \"alice\"\ngroups = [\"finance\"]\ntenants = [\"acme\"]\npublic_key = \"ed25519:AAAA\"\n",
    )
    .unwrap();
    let out = console.gw.cli(&[
        "reviewer",
        "enrolled",
        "--append",
        merged_file.to_str().unwrap(),
    ]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{out:?}");
    assert!(
        said.contains("is listed already") && said.contains("keeps its groups [finance]"),
        "{said}"
    );
    let merged = std::fs::read_to_string(&merged_file).unwrap();
    assert!(
        merged.starts_with("# reviewed in git")
            && merged.contains("ed25519:AAAA")
            && merged.contains("passkeys")
            && merged.matches("[[reviewers]]").count() == 1,
        "{merged}"
    );
    console.reviewers(&entry).await;
    console.sign_in("alice");
    let (c, call, id) = held(&console.gw, "ch-1", 120).await;
    let shots = std::env::var_os("COUNTERSIGN_SCREENSHOTS").map(PathBuf::from);
    let shot = |name: &str| {
        shots
            .as_ref()
            .unwrap_or(&console.state.path().to_owned())
            .join(name)
    };
    let r = console.browser(
        "alice",
        json!([
            {"goto": "/review/"},
            {"text": format!("[data-role=proposal][data-id='{id}']")},
            {"goto": format!("/review/p/{id}")},
            {"text": "[data-role=quorum]"},
            {"viewport": [1280, 900]},
            {"screenshot": shot("console-desktop.png")},
            {"viewport": [390, 844]},
            {"layout": "approve"},
            {"screenshot": shot("console-phone.png")},
            {"fill": {"reason": "invoice 42 checked"}},
            {"click": "approve"},
            // Decided: no control is left on the page, and once reloaded it
            // says who decided, when and why, and what comes next.
            {"count": "[data-action=approve], [data-action=deny]"},
            {"goto": format!("/review/p/{id}")},
            {"text": "[data-role=state]"},
            {"text": "[data-role=decisions]"},
            {"count": "[data-action=approve], [data-action=deny]"},
            {"text": "[data-role=outcome]"},
            {"goto": "/review/history"},
            {"text": format!("[data-role=proposal][data-id='{id}']")},
            // The decided page and the history, as docs/ shows them.
            {"viewport": [1280, 900]},
            {"goto": format!("/review/p/{id}")},
            {"screenshot": shot("console-decided.png")},
            {"goto": "/review/history"},
            {"screenshot": shot("console-history.png")},
        ]),
    );
    assert!(
        r[1]["text"]
            .as_str()
            .unwrap()
            .contains("payments/charge_card"),
        "{r:?}"
    );
    assert_eq!(r[3]["text"], "needs one approval", "{r:?}");
    // A phone shows the proposal and the approve button, no horizontal scroll.
    assert_eq!(r[7]["scrollWidth"], r[7]["clientWidth"], "{r:?}");
    assert_eq!(r[7]["visible"], true, "{r:?}");
    assert!(
        r[10]["status"]
            .as_str()
            .unwrap()
            .starts_with("approved, recorded"),
        "{r:?}"
    );
    assert_eq!(r[11]["count"], 0, "{r:?}");
    assert_eq!(r[13]["text"], "approved", "{r:?}");
    let decided = r[14]["text"].as_str().unwrap();
    assert!(
        decided.contains("alice (leads) approved at")
            && decided.contains("with a passkey")
            && decided.contains("invoice 42 checked"),
        "{r:?}"
    );
    // Local time beside UTC (the browser's zone; the UTC instant in brackets).
    assert!(decided.contains("Z)"), "{decided}");
    assert_eq!(r[15]["count"], 0, "{r:?}");
    assert!(
        r[16]["text"]
            .as_str()
            .unwrap()
            .starts_with("Approved, not used yet"),
        "{r:?}"
    );
    let row = r[18]["text"].as_str().unwrap();
    assert!(
        row.contains("approved")
            && row.contains("alice (approved)")
            && row.contains("invoice 42 checked"),
        "{r:?}"
    );
    // The agent's retry runs it, once; another retry is a replay. (A new
    // connection: the gateway closed the idle one while the browser ran.)
    let mut c = c;
    c.http = reqwest::Client::new();
    let ran = c.post(&call).await;
    assert_eq!(ran.last()["result"]["isError"], false, "{ran:?}");
    let again = c.post(&call).await;
    assert!(again.last()["result"]["_meta"]["dev.countersign/replayed"].is_object());
    assert_eq!(console.gw.executions("charge_card"), 1);
    // The page now says that it ran.
    let r = console.browser(
        "alice",
        json!([{"goto": format!("/review/p/{id}")}, {"text": "[data-role=outcome]"}]),
    );
    assert!(
        r[1]["text"]
            .as_str()
            .unwrap()
            .starts_with("Ran once; its answer came at"),
        "{r:?}"
    );
    // The audit log holds the passkey statement, and verifies offline
    // against the reviewers file.
    wait_for_audit(&console.gw, "the passkey approval", |es| {
        es.iter().any(|e| {
            e["kind"] == "approval_granted"
                && e["approval"]["passkey"]["client_data_json"].is_string()
        })
    })
    .await;
    let mut gw = console.gw;
    assert!(gw.terminate().success());
    let dir = gw.audit_dir();
    let reviewers = console.policies.path().join("reviewers.toml");
    let (ok, out, err) = run_cli(&[
        "audit",
        "verify",
        "--dir",
        dir.to_str().unwrap(),
        "--reviewers",
        reviewers.to_str().unwrap(),
    ]);
    assert!(ok, "{out}{err}");
    // The export says which kind of key signed.
    let (ok, csv, err) = run_cli(&[
        "audit",
        "export",
        "--format",
        "csv",
        "--dir",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(csv.lines().next().unwrap().contains("key_kind"), "{csv}");
    assert!(
        csv.lines()
            .any(|l| l.contains("approval_granted") && l.contains(",passkey,")),
        "{csv}"
    );
    // And someone else's code checks the proof from the exported fields:
    // py_webauthn (Duo Labs), with the public key from reviewers.toml.
    let (ok, jsonl, err) = run_cli(&[
        "audit",
        "export",
        "--format",
        "jsonl",
        "--dir",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let granted = jsonl
        .lines()
        .find(|l| l.contains("\"approval_granted\"") && l.contains("\"passkey\""))
        .unwrap();
    let export = console.state.path().join("granted.json");
    std::fs::write(&export, granted).unwrap();
    let (ok, out, err) = run_peer_script(
        "verify_passkey_approval.py",
        &[export.to_str().unwrap(), reviewers.to_str().unwrap()],
    );
    assert!(ok, "{out}{err}");
    assert!(out.contains("verified: alice approved"), "{out}");
}

#[tokio::test]
async fn a_two_reviewer_rule_is_met_by_a_passkey_and_a_cli_reviewer_in_either_order() {
    let two = "@id(\"charges-need-two\")\n@approvals(\"2\")\npermit (principal, action == Action::\"call\", resource == Tool::\"payments/charge_card\")\nwhen { context.approved };\n";
    let console = Console::start(two, "");
    let entry = console.enrol("alice", &console.invite("alice", "leads", "1h"));
    let (bob_key, bob) = keygen(console.state.path(), "bob");
    console.reviewers(&format!("{entry}\n{bob}")).await;
    console.sign_in("alice");
    for (n, passkey_first) in [(1, true), (2, false)] {
        let (c, call, id) = held(&console.gw, &format!("two-{n}"), 100 + n).await;
        let by_passkey = || {
            let r = console.browser(
                "alice",
                json!([{"goto": format!("/review/p/{id}")}, {"click": "approve"}]),
            );
            r[1]["status"].as_str().unwrap().to_owned()
        };
        let by_cli = || {
            let (ok, out, err) =
                review_cli(&console.gw, &bob_key, &["approve", &id, "--reason", "ok"]);
            assert!(ok, "{out}{err}");
            out
        };
        let (first, second) = if passkey_first {
            let a = by_passkey();
            (a, by_cli())
        } else {
            let b = by_cli();
            (b, by_passkey())
        };
        assert!(
            first.contains("1 of 2 approvals") || first.contains("waits for more reviewers"),
            "{first}"
        );
        assert!(second.contains("approved"), "{second}");
        let mut c = c;
        c.http = reqwest::Client::new();
        let ran = c.post(&call).await;
        assert_eq!(ran.last()["result"]["isError"], false, "{ran:?}");
        assert_eq!(console.gw.executions("charge_card"), n as usize);
    }
}

#[tokio::test]
async fn a_denial_with_a_reason_gives_approval_denied_and_nothing_runs() {
    let console = Console::start("", "");
    let entry = console.enrol("alice", &console.invite("alice", "leads", "1h"));
    console.reviewers(&entry).await;
    console.sign_in("alice");
    let (c, call, id) = held(&console.gw, "deny-1", 50).await;
    let r = console.browser(
        "alice",
        json!([
            {"goto": format!("/review/p/{id}")},
            {"click": "deny"},
            // The second time by keyboard alone: Tab to the reason, type it,
            // Tab to deny, press Enter.
            {"tab_to": "reason"},
            {"type": "not this account"},
            {"tab_to": "deny"},
            {"press": "Enter"},
            {"count": "[data-action=approve], [data-action=deny]"},
            {"goto": "/review/history"},
            {"text": format!("[data-role=proposal][data-id='{id}']")},
            {"goto": format!("/review/p/{id}")},
            {"text": "[data-role=outcome]"},
        ]),
    );
    // Without a reason the gateway says it needs one; with one it is denied.
    assert!(
        r[1]["status"].as_str().unwrap().contains("needs a reason"),
        "{r:?}"
    );
    assert_eq!(r[2]["focused"], true, "{r:?}");
    assert_eq!(r[4]["focused"], true, "{r:?}");
    assert!(
        r[5]["status"]
            .as_str()
            .unwrap()
            .starts_with("denied, recorded"),
        "{r:?}"
    );
    assert_eq!(r[6]["count"], 0, "no control is left once denied: {r:?}");
    let row = r[8]["text"].as_str().unwrap();
    assert!(
        row.contains("denied")
            && row.contains("alice (denied)")
            && row.contains("not this account"),
        "{r:?}"
    );
    assert_eq!(r[10]["text"], "Denied: the call did not run.", "{r:?}");
    let mut c = c;
    c.http = reqwest::Client::new();
    let a = c.post(&call).await;
    assert_eq!(code(&a), "approval_denied", "{a:?}");
    assert!(a.response_text().contains("not this account"), "{a:?}");
    assert_eq!(console.gw.executions("charge_card"), 0);
}

#[tokio::test]
async fn every_refusal_has_a_precise_message_and_nothing_runs() {
    let console = Console::start("", "");
    // A passkey not (yet) in reviewers.toml cannot sign in.
    let entry = console.enrol("alice", &console.invite("alice", "leads", "1h"));
    let r = console.browser(
        "alice",
        json!([{"goto": "/review/sign-in"}, {"click": "sign-in"}]),
    );
    assert!(
        r[1]["status"]
            .as_str()
            .unwrap()
            .contains("is not in reviewers.toml"),
        "{r:?}"
    );
    // The failed sign-in is audited with the passkey and the address.
    let refused = audit_entries(&console.gw.audit_dir())
        .into_iter()
        .find(|e| e["kind"] == "console_sign_in_refused")
        .expect("a refused sign-in in the audit log");
    assert!(
        refused["reason"]
            .as_str()
            .unwrap()
            .contains("is not in reviewers.toml"),
        "{refused:?}"
    );
    assert_eq!(refused["address"], "127.0.0.1", "{refused:?}");
    assert!(refused["credential_id"]
        .as_str()
        .is_some_and(|c| !c.is_empty()));
    // An enrolment link used twice, and one after it expired.
    let link = console.invite("carol", "leads", "1h");
    console.enrol("carol", &link);
    let r = console.browser("carol", json!([{"goto": link}]));
    assert_eq!(r[0]["code"], 410, "{r:?}");
    assert!(
        r[0]["status"]
            .as_str()
            .unwrap()
            .contains("was used already"),
        "{r:?}"
    );
    let expired = console.invite("dora", "leads", "1ms");
    let r = console.browser("dora", json!([{"goto": expired}]));
    assert!(
        r[0]["status"].as_str().unwrap().contains("expired"),
        "{r:?}"
    );
    // Each invitation is audited: made, used, lapsed, and each refused use.
    let log = audit_entries(&console.gw.audit_dir());
    let kinds_for = |who: &str| -> Vec<String> {
        log.iter()
            .filter(|e| e.get("reviewer").is_some_and(|r| r == who))
            .map(|e| e["kind"].as_str().unwrap().to_owned())
            .collect()
    };
    let carol = kinds_for("carol");
    let invited = carol.iter().position(|k| k == "reviewer_invited");
    let enrolled = carol.iter().position(|k| k == "reviewer_enrolled");
    assert!(invited.is_some() && invited < enrolled, "{carol:?}");
    let dora = kinds_for("dora");
    assert!(dora.contains(&"enrolment_expired".to_owned()), "{dora:?}");
    assert!(!dora.contains(&"reviewer_invited".to_owned()), "{dora:?}");
    let refusals: Vec<_> = log
        .iter()
        .filter(|e| e["kind"] == "enrolment_refused")
        .map(|e| e["reason"].as_str().unwrap_or(""))
        .collect();
    assert!(
        refusals.iter().any(|r| r.contains("was used already")),
        "{refusals:?}"
    );
    assert!(
        refusals.iter().any(|r| r.contains("expired")),
        "{refusals:?}"
    );

    console.reviewers(&entry).await;
    console.sign_in("alice");
    let (_, _, a) = held(&console.gw, "r-a", 10).await;
    let (_, _, b) = held(&console.gw, "r-b", 20).await;
    // An assertion made for proposal A's statement, sent for proposal B.
    let r = console.browser(
        "alice",
        json!([
            {"capture": a},
            {"goto": format!("/review/p/{b}")},
            {"post": {"path": format!("/review/p/{b}/decide"), "body": "captured"}},
        ]),
    );
    assert_eq!(r[0]["captured"], true, "{r:?}");
    assert_eq!(r[2]["status"], 422, "{r:?}");
    assert!(
        r[2]["body"].as_str().unwrap().contains(&a),
        "names the other proposal: {r:?}"
    );
    // User verification off; an assertion made at another origin (a
    // phishing page on this host, with the same relying party id).
    let r = console.browser(
        "alice",
        json!([
            {"goto": format!("/review/p/{b}")},
            {"uv": false},
            {"assertion": {"path": format!("/review/p/{b}"), "decision": "approve", "uv": "discouraged"}},
            {"uv": true},
            {"assertion": {"path": format!("/review/p/{b}"), "decision": "approve", "elsewhere": true}},
        ]),
    );
    assert_eq!(r[2]["status"], 422, "{r:?}");
    assert!(
        r[2]["body"]
            .as_str()
            .unwrap()
            .contains("user verification (UV) is not set"),
        "{r:?}"
    );
    assert_eq!(r[4]["status"], 422, "{r:?}");
    assert!(
        r[4]["body"]
            .as_str()
            .unwrap()
            .contains("is not the console's"),
        "{r:?}"
    );
    // A cross-site POST without the CSRF token, and one without the Origin
    // of the console.
    let r = console.browser(
        "alice",
        json!([
            {"goto": format!("/review/p/{b}")},
            {"post": {"path": format!("/review/p/{b}/withdraw"), "csrf": false}},
        ]),
    );
    assert_eq!(r[1]["status"], 403, "{r:?}");
    assert!(
        r[1]["body"].as_str().unwrap().contains("CSRF token"),
        "{r:?}"
    );
    let cookie = {
        let state: Value = serde_json::from_slice(
            &std::fs::read(console.state.path().join("alice.json")).unwrap(),
        )
        .unwrap();
        state["cookies"][0]["value"].as_str().unwrap().to_owned()
    };
    let forged = reqwest::Client::new()
        .post(format!("{}/review/p/{b}/withdraw", console.base))
        .header("cookie", format!("__Host-countersign-review={cookie}"))
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 403);
    assert!(forged
        .text()
        .await
        .unwrap()
        .contains("does not come from the console's own pages"));
    // The session after the reviewer left the file: over.
    console.reviewers("").await;
    let r = console.browser("alice", json!([{"goto": "/review/"}]));
    assert_eq!(r[0]["code"], 401, "{r:?}");
    assert!(
        r[0]["status"]
            .as_str()
            .unwrap()
            .contains("no longer in reviewers.toml"),
        "{r:?}"
    );
    assert_eq!(console.gw.executions("charge_card"), 0);
}

#[tokio::test]
async fn a_webhook_event_carries_the_review_url_that_opens_the_proposal() {
    use std::sync::{Arc, Mutex};
    let got: Arc<Mutex<Vec<Value>>> = Arc::default();
    let sink = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: String| {
            let sink = sink.clone();
            async move {
                sink.lock()
                    .unwrap()
                    .push(serde_json::from_str(&body).unwrap());
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let hook = format!(
        "\n[notify]\n[[notify.webhooks]]\nname = \"ops\"\nurl = \"http://127.0.0.1:{port}/hook\"\nsecret = \"s3cret-0123456789\"\n"
    );
    let console = Console::start_with("", "", &hook);
    let entry = console.enrol("alice", &console.invite("alice", "leads", "1h"));
    console.reviewers(&entry).await;
    let (_, _, id) = held(&console.gw, "hook-1", 30).await;
    eventually("the proposal_created event", || {
        !got.lock().unwrap().is_empty()
    })
    .await;
    let event = got.lock().unwrap()[0].clone();
    let url = event["facts"]["review_url"].as_str().unwrap().to_owned();
    assert_eq!(url, format!("{}/review/p/{id}", console.base));
    let path = &url[console.base.len()..];
    // Signed out it leads to the sign-in; signed in, to the proposal.
    let r = console.browser(
        "alice",
        json!([
            {"goto": path},
            {"click": "sign-in"},
            {"goto": path},
            {"text": "[data-role=proposal]"},
        ]),
    );
    assert!(
        r[0]["url"].as_str().unwrap().ends_with("/review/sign-in"),
        "{r:?}"
    );
    assert!(
        r[3]["text"]
            .as_str()
            .unwrap()
            .contains("payments/charge_card"),
        "{r:?}"
    );
}

/// A WebAuthn relying party is a domain name: a console whose origin would
/// be an IP address (here from `gateway.public_url`) is refused at start,
/// with what to set instead, and no console opens on a bad origin.
#[test]
fn serve_refuses_a_console_whose_origin_is_an_ip_address() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    let write = |public_url: &str| {
        std::fs::write(
            &config,
            format!(
                "[gateway]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\npolicies = \"{}\"\npublic_url = \"{public_url}\"\n\n[review]\nenabled = true\n",
                dir.path().join("data").display(),
                dir.path().display()
            ),
        )
        .unwrap();
    };
    write("http://127.0.0.1:7373/mcp");
    let (ok, out, err) = run_cli(&["serve", "--config", config.to_str().unwrap()]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("needs a domain name") && err.contains("http://127.0.0.1:7373"),
        "{err}"
    );
    assert!(!err.contains("listening on"), "{err}");
    // A name that is not localhost needs https: browsers offer passkeys to
    // secure origins only.
    write("http://review.example.com/mcp");
    let (ok, _, err) = run_cli(&["serve", "--config", config.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("must be https://"), "{err}");
}

/// What the browser was told to keep, and what every page says about
/// itself: the session cookie as Chromium stored it (`__Host-`, Secure,
/// HttpOnly, SameSite=Strict, at most 12 hours), a strict CSP with no inline
/// script, no framing and no caching; and a session id the server did not
/// mint is no session (no fixation).
#[tokio::test]
async fn the_session_cookie_and_the_pages_are_hardened() {
    let console = Console::start("", "");
    let entry = console.enrol("alice", &console.invite("alice", "leads", "1h"));
    console.reviewers(&entry).await;
    console.sign_in("alice");
    let state: Value =
        serde_json::from_slice(&std::fs::read(console.state.path().join("alice.json")).unwrap())
            .unwrap();
    let cookies = state["cookies"].as_array().unwrap();
    assert_eq!(cookies.len(), 1, "{cookies:?}");
    let c = &cookies[0];
    assert_eq!(c["name"], "__Host-countersign-review", "{c}");
    assert_eq!(c["path"], "/", "{c}");
    assert_eq!(c["httpOnly"], true, "{c}");
    assert_eq!(c["secure"], true, "{c}");
    assert_eq!(c["sameSite"], "Strict", "{c}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let expires = c["expires"].as_f64().unwrap();
    assert!(expires > now && expires <= now + 12.0 * 3600.0 + 5.0, "{c}");
    let (_, _, id) = held(&console.gw, "h-1", 10).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let page = http
        .get(format!("{}/review/p/{id}", console.base))
        .header(
            "cookie",
            format!("__Host-countersign-review={}", c["value"].as_str().unwrap()),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let h = page.headers().clone();
    let csp = h["content-security-policy"].to_str().unwrap().to_owned();
    assert!(csp.contains("script-src 'self'"), "{csp}");
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert!(
        !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"),
        "{csp}"
    );
    assert_eq!(h["cache-control"], "no-store");
    let body = page.text().await.unwrap();
    assert!(body.contains("payments/charge_card"), "{body}");
    // Every script is a file of the console's own; none is inline.
    assert!(body.contains("<script"), "the WebAuthn script: {body}");
    for tag in body.split("<script").skip(1) {
        let open = &tag[..tag.find('>').unwrap()];
        assert!(
            open.contains("src=\"/review/"),
            "inline script: <script{open}>"
        );
    }
    // The pending list reloads itself: never stale for long.
    let list = http
        .get(format!("{}/review/", console.base))
        .header(
            "cookie",
            format!("__Host-countersign-review={}", c["value"].as_str().unwrap()),
        )
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        list.contains(r#"<meta http-equiv="refresh" content="30">"#),
        "{list}"
    );
    // The icon, linked and at the address browsers ask for anyway.
    assert!(
        body.contains(r#"rel="icon" type="image/svg+xml" href="/review/assets/icon.svg""#),
        "{body}"
    );
    for path in ["/favicon.ico", "/review/assets/icon.svg"] {
        let icon = http
            .get(format!("{}{path}", console.base))
            .send()
            .await
            .unwrap();
        assert_eq!(icon.status(), 200, "{path}");
        assert_eq!(icon.headers()["content-type"], "image/svg+xml", "{path}");
        assert!(icon.text().await.unwrap().starts_with("<svg"), "{path}");
    }
    // A session id chosen by someone else opens nothing.
    let fixed = http
        .get(format!("{}/review/p/{id}", console.base))
        .header("cookie", "__Host-countersign-review=chosen-by-an-attacker")
        .send()
        .await
        .unwrap();
    assert_ne!(fixed.status(), 200);
    assert!(!fixed.text().await.unwrap().contains("payments/charge_card"));
}

/// Off unless switched on: without `[review] enabled`, every console path
/// answers 404 and says how to switch it on; nothing is served.
#[tokio::test]
async fn the_console_is_off_unless_enabled() {
    let gw = Gateway::start_with(Options::default());
    for path in ["/review/", "/review/sign-in", "/review/enrol/x"] {
        let r = reqwest::get(format!("http://{}{path}", gw.addr))
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{path}");
        assert!(
            r.text().await.unwrap().contains("[review] enabled"),
            "{path}"
        );
    }
}

/// F6 (second attack): credential ids are public, and failed sign-ins were
/// counted against whatever credential a request named before anything was
/// verified, so five junk requests locked a reviewer out. Now a failure
/// counts against a credential only once its own key signed; junk counts
/// against the address it came from.
#[tokio::test(flavor = "multi_thread")]
async fn f6_junk_sign_ins_naming_a_reviewers_passkey_do_not_lock_the_reviewer_out() {
    let console = Console::start("", "");
    let entry = console.enrol("alice", &console.invite("alice", "leads", "1h"));
    console.reviewers(&entry).await;
    let id = entry
        .split("id = \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the entry names the passkey's id")
        .to_owned();
    // The attacker, from another loopback address.
    let attacker = reqwest::Client::builder()
        .local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap();
    let port = console.base.rsplit(':').next().unwrap();
    let url = format!("http://127.0.0.1:{port}/review/sign-in");
    let mut statuses = Vec::new();
    for _ in 0..7 {
        let junk = json!({
            "credential_id": id,
            "authenticator_data": "AAAA",
            "client_data_json": "AAAA",
            "signature": "AAAA",
        });
        let status = attacker
            .post(&url)
            .header("origin", &console.base)
            .header("content-type", "application/json")
            .body(junk.to_string())
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        statuses.push(status);
    }
    assert_eq!(
        statuses,
        [401, 401, 401, 401, 401, 429, 429],
        "junk is refused, then its address is slowed"
    );
    // Alice, from her own address, signs in with her passkey all the same.
    console.sign_in("alice");
}

/// F7 (second attack): every GET of a made-up enrolment link wrote an audit
/// entry (1,000 requests, 1,000 entries in a log that can never be edited).
/// Made-up links now go to the sampled `refused` entry, and an address that
/// keeps being refused is slowed.
#[tokio::test(flavor = "multi_thread")]
async fn f7_made_up_enrolment_links_do_not_flood_the_audit_log() {
    let console = Console::start("", "");
    let http = reqwest::Client::new();
    let port = console.base.rsplit(':').next().unwrap();
    let mut statuses = std::collections::BTreeMap::new();
    for i in 0..1000 {
        let url = format!("http://127.0.0.1:{port}/review/enrol/made-up-{i}");
        let status = http.get(&url).send().await.unwrap().status().as_u16();
        *statuses.entry(status).or_insert(0) += 1;
    }
    assert_eq!(statuses.get(&410), Some(&5), "{statuses:?}");
    assert_eq!(statuses.get(&429), Some(&995), "{statuses:?}");
    wait_for_audit(&console.gw, "a sampled refusal", |log| {
        log.iter()
            .any(|e| e["kind"] == "refused" && e["what"] == "enrolment_link")
    })
    .await;
    let log = audit_entries(&console.gw.audit_dir());
    let refused = log
        .iter()
        .filter(|e| e["kind"] == "enrolment_refused")
        .count();
    let sampled = log
        .iter()
        .filter(|e| e["kind"] == "refused" && e["what"] == "enrolment_link")
        .count();
    assert_eq!(refused, 0, "made-up links are not audited one by one");
    assert!(sampled <= 2, "{sampled} sampled entries for 1,000 requests");
}

/// F10 (second attack): `/v1/audit` showed entries without a `tenant` to
/// reviewers of every tenant, so a `globex` reviewer read `acme` reviewers'
/// sign-ins, addresses and credential ids. Console and enrolment entries now
/// carry the reviewer's tenants, and the tail shows them to those tenants'
/// reviewers only.
#[tokio::test(flavor = "multi_thread")]
async fn f10_the_audit_tail_shows_no_other_tenants_reviewers() {
    let console = Console::start("", "");
    let alice = console.enrol("alice", &console.invite("alice", "leads", "1h"));
    let keys = tempfile::tempdir().unwrap();
    let (carol_key, carol) = keygen(keys.path(), "carol");
    let (bob_key, bob) = keygen(keys.path(), "bob");
    let bob = bob.replace("[\"acme\"]", "[\"globex\"]");
    console.reviewers(&format!("{alice}\n{carol}\n{bob}")).await;
    console.sign_in("alice");
    let tail = |key: PathBuf| {
        let base = console.gw.base();
        async move {
            let client = countersign::cli::client::Client::new(
                &base,
                &countersign::cli::client::load_key(&key).unwrap(),
            )
            .unwrap();
            client.audit_tail(500).await.unwrap()
        }
    };
    let kinds = |entries: &[Value]| -> Vec<String> {
        entries
            .iter()
            .map(|e| e["kind"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    wait_for_audit(&console.gw, "alice's sign-in", |log| {
        log.iter().any(|e| e["kind"] == "console_signed_in")
    })
    .await;
    let acme = kinds(&tail(carol_key).await);
    assert!(acme.contains(&"console_signed_in".to_owned()), "{acme:?}");
    assert!(acme.contains(&"reviewer_enrolled".to_owned()), "{acme:?}");
    let globex = kinds(&tail(bob_key).await);
    for kind in ["console_signed_in", "reviewer_invited", "reviewer_enrolled"] {
        assert!(
            !globex.contains(&kind.to_owned()),
            "a globex reviewer sees `{kind}` of acme's: {globex:?}"
        );
    }
    assert!(!globex.is_empty(), "the gateway's own entries stay visible");
}

/// F8 (second attack): an enrollee could register another reviewer's
/// credential id; the duplicate was accepted, and the victim lost console
/// access. A passkey id listed twice is refused when the reviewers file
/// loads (the previous file stays in force), and an enrolment of a listed
/// id is refused; counters are kept per (reviewer, credential).
#[tokio::test(flavor = "multi_thread")]
async fn f8_another_reviewers_passkey_id_is_refused_and_its_holder_keeps_access() {
    let console = Console::start("", "");
    let alice = console.enrol("alice", &console.invite("alice", "leads", "1h"));
    console.reviewers(&alice).await;
    console.sign_in("alice");
    // The same credential id under another name.
    let copy = alice.replace("name = \"alice\"", "name = \"mallory\"");
    assert_ne!(copy, alice);
    std::fs::write(
        console.policies.path().join("reviewers.toml"),
        format!("{alice}\n{copy}"),
    )
    .unwrap();
    console.gw.wait_for_log("again for `mallory`").await;
    // Alice still signs in, with the file that was in force.
    console.sign_in("alice");
}

/// F11 (second attack): keys that could pass for others were marked, values
/// were not: `pаypal.com` with a Cyrillic `а` read as PayPal's domain. On
/// the proposal's page a value that mixes scripts is marked, with its odd
/// character written out.
#[tokio::test]
async fn f11_a_value_that_mixes_scripts_is_marked_on_the_proposal_page() {
    let console = Console::start("", "");
    let link = console.invite("alice", "leads", "1h");
    let entry = console.enrol("alice", &link);
    console.reviewers(&entry).await;
    console.sign_in("alice");
    let c = listed(&console.gw, "payments").await;
    let a = c
        .post(
            &json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge_card",
            "arguments":{"account":"p\u{430}ypal.com","amount":5},
            "_meta":{"dev.countersign/idempotency-key":"f11-1"}}}),
        )
        .await;
    assert_eq!(code(&a), "approval_pending", "{a:?}");
    let id = proposal_id(&a);
    let r = console.browser(
        "alice",
        json!([
            {"goto": format!("/review/p/{id}")},
            {"text": "table.arguments"},
            {"text": "[data-role=headline]"},
        ]),
    );
    let table = r[1]["text"].as_str().unwrap_or_default();
    assert!(table.contains(r"mixed scripts: p\u{430}ypal.com"), "{r:?}");
    let sentence = r[2]["text"].as_str().unwrap_or_default();
    assert!(sentence.contains("mixed scripts"), "{r:?}");
}

/// A held charge under a budget: its page shows the budget's figures
/// (DESIGN.md section 25), as `show` and `pending` do.
#[tokio::test]
async fn a_held_charge_under_a_budget_shows_the_figures_on_its_page() {
    let console = Console::start_with(
        "",
        "",
        "\n[[budgets]]\nname = \"card-daily\"\ntools = [\"payments/charge_card\"]\namount = \"/amount\"\n\
         per = \"principal\"\nwindow = \"24h\"\nlimit = 1000\n",
    );
    let link = console.invite("alice", "leads", "1h");
    let entry = console.enrol("alice", &link);
    console.reviewers(&entry).await;
    console.sign_in("alice");
    let (_c, _a, id) = held(&console.gw, "budget-1", 400).await;
    let r = console.browser(
        "alice",
        json!([
            {"goto": format!("/review/p/{id}")},
            {"text": "[data-role=guard]"},
            {"text": "[data-role=headline]"},
        ]),
    );
    let figures = "budget card-daily (principal:agent-7): spent 0 of 1,000 in 1d; this call 400; after it 400";
    assert!(
        r[1]["text"].as_str().unwrap_or_default().contains(figures),
        "{r:?}"
    );
    assert!(
        r[2]["text"].as_str().unwrap_or_default().contains(figures),
        "{r:?}"
    );
}

/// Four invoices are four calls: two charges with keys of their own are
/// not "revisions" of each other (the second is shown beside the first,
/// with no change arrow), while the same key resent with another amount is.
#[tokio::test]
async fn separate_charges_are_not_revisions_and_a_changed_resend_is() {
    let console = Console::start("", "");
    let entry = console.enrol("alice", &console.invite("alice", "leads", "1h"));
    console.reviewers(&entry).await;
    console.sign_in("alice");
    let (_, _, first) = held(&console.gw, "invoice-240", 240).await;
    let (_, _, second) = held(&console.gw, "invoice-980", 980).await;
    let (_, _, resent) = held(&console.gw, "invoice-980", 990).await;
    // A key of its own, but the agent says it replaces the first invoice.
    let c = listed(&console.gw, "payments").await;
    let linked = c
        .post(&json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge_card",
            "arguments":{"account":"acct_1","amount":250},
            "_meta":{"dev.countersign/idempotency-key":"invoice-250","dev.countersign/revises":first}}}))
        .await;
    assert_eq!(code(&linked), "approval_pending", "{linked:?}");
    let linked = proposal_id(&linked);
    let r = console.browser(
        "alice",
        json!([
            {"goto": "/review/"},
            {"text": format!("[data-role=proposal][data-id='{second}']")},
            {"goto": format!("/review/p/{second}")},
            {"count": "h2:has-text('Changed since')"},
            {"text": "[data-role=beside]"},
            {"goto": format!("/review/p/{resent}")},
            {"text": "h2:has-text('Changed since')"},
            {"text": "table.changes"},
            {"goto": "/review/"},
            {"text": "[data-role=proposal]"},
            {"goto": format!("/review/p/{linked}")},
            {"text": "h2:has-text('Changed since')"},
        ]),
    );
    assert_eq!(
        r[11]["text"].as_str().unwrap(),
        format!("Changed since proposal {first}"),
        "{r:?}"
    );
    // The queue's order: the one that expires first (the first made) on top.
    assert!(r[9]["text"].as_str().unwrap().contains(&first), "{r:?}");
    let item = r[1]["text"].as_str().unwrap();
    assert!(
        item.contains("another call by the same requester") && !item.contains("revision"),
        "{r:?}"
    );
    assert_eq!(r[3]["count"], 0, "{r:?}");
    let beside = r[4]["text"].as_str().unwrap();
    assert!(
        beside.contains(&first) && beside.contains("240") && beside.contains("980"),
        "{r:?}"
    );
    assert_eq!(
        r[6]["text"].as_str().unwrap(),
        format!("Changed since proposal {second}"),
        "{r:?}"
    );
    let diff = r[7]["text"].as_str().unwrap();
    assert!(
        diff.contains("/amount") && diff.contains("980") && diff.contains("990"),
        "{r:?}"
    );
}

/// The page leads in plain words: the operator's summary for the tool,
/// filled with the arguments (a value carrying bidi or terminal controls
/// written out, not obeyed), why a person is asked (the policy's
/// `@reason`), digests folded under Details; and on a 390×844 phone the
/// summary with its amount and the approve button are within one and a
/// half screens.
#[tokio::test]
async fn the_page_leads_with_the_operators_summary_and_fits_a_phone() {
    let console = Console::start_with(
        "",
        "",
        "[servers.payments.tools.charge_card]\nsummary = \"Charge {amount} to {account}\"\n",
    );
    let entry = console.enrol("alice", &console.invite("alice", "leads", "1h"));
    console.reviewers(&entry).await;
    console.sign_in("alice");
    let (_, _, plain) = held(&console.gw, "plain-1", 480).await;
    // An account whose text would reverse itself on screen, with an escape.
    let c = listed(&console.gw, "payments").await;
    let bent = c
        .post(
            &json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"charge_card",
            "arguments":{"account":"acct_9\u{202e}1_tcca\u{1b}[2K","amount":7},
            "_meta":{"dev.countersign/idempotency-key":"bent-1"}}}),
        )
        .await;
    assert_eq!(code(&bent), "approval_pending", "{bent:?}");
    let bent = proposal_id(&bent);
    let r = console.browser(
        "alice",
        json!([
            {"viewport": [390, 844]},
            {"goto": format!("/review/p/{plain}")},
            {"text": "[data-role=headline]"},
            {"text": "[data-role=why]"},
            {"box": "[data-role=headline]"},
            {"layout": "approve"},
            {"count": "details[data-role=details][open]"},
            {"text": "details[data-role=details]"},
            {"goto": format!("/review/p/{bent}")},
            {"text": "[data-role=headline]"},
        ]),
    );
    assert_eq!(r[2]["text"], "Charge 480 to acct_1", "{r:?}");
    assert!(
        r[3]["text"]
            .as_str()
            .unwrap()
            .contains("every write waits for a person"),
        "the policy's @reason: {r:?}"
    );
    let screen = 844.0;
    assert!(r[4]["bottom"].as_f64().unwrap() <= screen, "{r:?}");
    assert_eq!(r[5]["visible"], true, "{r:?}");
    assert!(
        r[5]["bottom"].as_f64().unwrap() <= 1.5 * screen,
        "the approve button within one and a half screens: {r:?}"
    );
    // Digests are there, folded.
    assert_eq!(r[6]["count"], 0, "{r:?}");
    assert!(r[7]["text"].as_str().unwrap().contains("sha256:"), "{r:?}");
    let headline = r[9]["text"].as_str().unwrap();
    assert!(
        // Quoted and escaped as JSON writes it: seen, not obeyed.
        headline.starts_with("Charge 7 to \"acct_9")
            && headline.contains(r"\u202e")
            && headline.contains(r"\u001b")
            && !headline.contains('\u{202e}')
            && !headline.contains('\u{1b}'),
        "{headline:?}"
    );
}

/// A balancer in front of several gateways, as a load balancer would be: a
/// TCP relay on its own thread whose backend the test switches. Each new
/// connection goes to the backend chosen when it is made.
struct Balancer {
    port: u16,
    to: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Balancer {
    fn start() -> Balancer {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let to = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let backend = to.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                while let Ok((mut inbound, _)) = listener.accept().await {
                    let addr = backend.lock().unwrap().clone();
                    tokio::spawn(async move {
                        if let Ok(mut out) = tokio::net::TcpStream::connect(&addr).await {
                            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                        }
                    });
                }
            });
        });
        Balancer { port, to }
    }

    /// New connections go to `gw`.
    fn to(&self, gw: &Gateway) {
        *self.to.lock().unwrap() = gw.addr.clone();
    }
}

/// Two gateways on one PostgreSQL database behind one address: a reviewer
/// enrolled and signed in through A approves through B without signing in
/// again (sessions, CSRF tokens and challenges are in the shared store), an
/// invitation made with A's CLI enrols through B, the approved call runs
/// once across both, and a cloned authenticator's counter, already used
/// through B, is refused by A.
#[tokio::test(flavor = "multi_thread")]
async fn two_gateways_behind_one_address_serve_one_console() {
    let schema = common::pg::Schema::new();
    let lb = Balancer::start();
    let origin = format!("http://localhost:{}", lb.port);
    let policies = tempfile::tempdir().unwrap();
    let shipped = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policies");
    for f in ["schema.cedarschema", "default.cedar"] {
        std::fs::copy(shipped.join(f), policies.path().join(f)).unwrap();
    }
    std::fs::write(policies.path().join("reviewers.toml"), "").unwrap();
    let start = || {
        common::pg::on(
            &schema,
            Options {
                policies: Some(policies.path().to_owned()),
                extra: format!("\n[review]\nenabled = true\norigin = \"{origin}\"\n"),
                ..Default::default()
            },
        )
    };
    let a = start();
    let b = start();
    let console = Console {
        gw: a,
        policies,
        state: tempfile::tempdir().unwrap(),
        base: origin.clone(),
    };
    let state = |who: &str| console.state.path().join(format!("{who}.json"));

    // Enrol and sign in through A.
    lb.to(&console.gw);
    let link = console.invite("alice", "leads", "1h");
    let entry = console.enrol("alice", &link);
    let reloads = |gw: &Gateway| {
        gw.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains("policies reloaded"))
            .count()
    };
    let at_b = reloads(&b);
    console.reviewers(&entry).await;
    eventually("B reloaded the reviewers file", || reloads(&b) > at_b).await;
    console.sign_in("alice");
    // A copy of alice's authenticator as A last saw it: a clone.
    std::fs::copy(state("alice"), state("alice-clone")).unwrap();

    // Opened and approved through B, with the session A opened.
    let (c, call, id) = held(&console.gw, "lb-1", 300).await;
    lb.to(&b);
    let r = console.browser(
        "alice",
        json!([
            {"goto": format!("/review/p/{id}")},
            {"text": "[data-role=quorum]"},
            {"fill": {"reason": "checked through B"}},
            {"click": "approve"},
            {"goto": format!("/review/p/{id}")},
            {"text": "[data-role=state]"},
        ]),
    );
    assert!(
        r[0]["url"]
            .as_str()
            .unwrap()
            .ends_with(&format!("/review/p/{id}")),
        "B asked to sign in again: {r:?}"
    );
    assert_eq!(r[1]["text"], "needs one approval", "{r:?}");
    assert!(
        r[3]["status"]
            .as_str()
            .unwrap()
            .starts_with("approved, recorded"),
        "{r:?}"
    );
    assert_eq!(r[5]["text"], "approved", "{r:?}");

    // The agent's retry runs it through B, once; through A it is a replay.
    let mut c = c;
    c.http = reqwest::Client::new();
    let via_b = listed(&b, "payments").await;
    let ran = via_b.post(&call).await;
    assert_eq!(ran.last()["result"]["isError"], false, "{ran:?}");
    let again = c.post(&call).await;
    assert!(
        again.last()["result"]["_meta"]["dev.countersign/replayed"].is_object(),
        "{again:?}"
    );
    assert_eq!(
        console.gw.executions("charge_card") + b.executions("charge_card"),
        1
    );

    // An invitation made with A's CLI enrols through B.
    let link = console.invite("bob", "leads", "1h");
    let bob = console.enrol("bob", &link);
    assert!(bob.contains("name = \"bob\""), "{bob}");

    // The clone signs in through A with the counter alice's authenticator
    // already used through B (A alone saw a lower one): refused, and
    // nothing opened.
    lb.to(&console.gw);
    let r = console.browser(
        "alice-clone",
        json!([{"goto": "/review/sign-in"}, {"click": "sign-in"}]),
    );
    let said = r[1]["status"].as_str().unwrap_or_default();
    assert!(
        r[1]["url"].as_str().unwrap().ends_with("/review/sign-in")
            && said.contains("signature counter")
            && said.contains("cloned"),
        "{r:?}"
    );
}
