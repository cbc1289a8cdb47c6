//! The real `countersign-review` in a real terminal (tmux) against a real
//! gateway and example server: a held write appears, keys approve it and
//! the held call completes; a second write is denied with a typed reason
//! and the client sees `approval_denied`.
//!
//! Needs `tmux` (`.ci/setup-peers` installs it) and the workspace's
//! `countersign` binary and `payments_server` example (built by
//! `cargo test --workspace`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const TOKEN: &str = "tok-e2e-agent";

fn bin_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_countersign-review"))
        .parent()
        .unwrap()
        .to_owned()
}

fn need(path: PathBuf) -> PathBuf {
    assert!(
        path.exists(),
        "{} is not built: run `cargo test --workspace` (or `cargo build --workspace --examples`)",
        path.display()
    );
    path
}

struct Gateway {
    child: Child,
    base: String,
    dir: tempfile::TempDir,
}

impl Gateway {
    /// Kill the gateway (SIGKILL), leaving it down.
    fn restart_killed_first(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Start a killed gateway again on the same address.
    fn start_again(&mut self) {
        let addr = self.base.trim_start_matches("http://").to_owned();
        let path = self.dir.path().join("countersign.toml");
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("listen = \"127.0.0.1:0\"", &format!("listen = \"{addr}\""));
        std::fs::write(&path, text).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpListener::bind(&addr).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let (child, _) = spawn_gateway(&path);
        self.child = child;
    }
}

fn spawn_gateway(config_path: &Path) -> (Child, String) {
    let mut child = Command::new(need(bin_dir().join("countersign")))
        .args(["serve", "--config"])
        .arg(config_path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(addr) = line.split("listening on ").nth(1) {
                let _ = tx.send(addr.trim().to_owned());
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("gateway did not start");
    (child, addr)
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_gateway() -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let pdir = dir.path().join("policies");
    std::fs::create_dir(&pdir).unwrap();
    for f in ["schema.cedarschema", "default.cedar"] {
        std::fs::copy(repo.join("policies").join(f), pdir.join(f)).unwrap();
    }
    let countersign = need(bin_dir().join("countersign"));
    let out = Command::new(&countersign)
        .args(["keygen", "--name", "alice", "--out"])
        .arg(dir.path().join("alice.key"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let entry = String::from_utf8(out.stdout)
        .unwrap()
        .replace("groups = []", "groups = [\"leads\"]");
    std::fs::write(pdir.join("reviewers.toml"), entry).unwrap();
    let server = need(bin_dir().join("examples").join("payments_server"));
    let config = format!(
        r#"
[gateway]
listen = "127.0.0.1:0"
data_dir = "{data}"
policies = "{policies}"

[[identities]]
token_sha256 = "{token}"
principal = "agent-7"
tenant = "acme"

[approvals]
hold = "60s"
progress_interval = "1s"

[servers.payments]
command = "{server}"
args = ["--record", "{record}"]
"#,
        data = dir.path().join("data").display(),
        policies = pdir.display(),
        token = countersign::core::identity::token_digest(TOKEN),
        server = server.display(),
        record = dir.path().join("executions.jsonl").display(),
    );
    let config_path = dir.path().join("countersign.toml");
    std::fs::write(&config_path, config).unwrap();
    let (child, addr) = spawn_gateway(&config_path);
    Gateway {
        child,
        base: format!("http://{addr}"),
        dir,
    }
}

/// A tmux server of its own, so tests never touch a user's sessions.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("tmux is not installed: run `.ci/setup-peers`");
        assert!(out.status.success(), "tmux {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "review"])
    }

    /// Wait until the screen shows `text`.
    fn wait_for(&self, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let s = self.screen();
            if s.contains(text) {
                return s;
            }
            assert!(Instant::now() < deadline, "never showed `{text}`:\n{s}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn keys(&self, keys: &[&str]) {
        for k in keys {
            self.run(&["send-keys", "-t", "review", k]);
            std::thread::sleep(Duration::from_millis(150));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}

async fn mcp(
    http: &reqwest::Client,
    url: &str,
    session: Option<&str>,
    body: Value,
) -> (Option<String>, String) {
    let mut req = http
        .post(url)
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if let Some(s) = session {
        req = req
            .header("mcp-session-id", s)
            .header("mcp-protocol-version", "2025-06-18");
    }
    let resp = req.body(body.to_string()).send().await.unwrap();
    let sid = resp
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_owned());
    (sid, resp.text().await.unwrap())
}

/// initialize + notifications/initialized; the session id.
async fn open_session(http: &reqwest::Client, url: &str) -> String {
    let (sid, _) = mcp(
        http,
        url,
        None,
        json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"e2e","version":"1"}}}),
    )
    .await;
    let sid = sid.expect("initialize gave no session");
    mcp(
        http,
        url,
        Some(&sid),
        json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
    )
    .await;
    sid
}

fn executions(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("executions.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("\"executed\"") && l.contains("charge_card"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_in_a_real_terminal_approve_one_write_and_deny_another() {
    // The keys this test drives are the ones docs/approvals.md's TUI section names.
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/approvals.md"))
            .unwrap();
    let section = readme
        .split("## Reviewer TUI")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .unwrap();
    for key in [
        "**a**",
        "**Tab**",
        "**Enter**",
        "**Esc**",
        "**d**",
        "**q**",
        "**1 Pending**",
        "**3 History**",
    ] {
        assert!(
            section.contains(key),
            "docs/approvals.md's TUI section names {key}"
        );
    }
    let gw = start_gateway();
    let url = format!("{}/mcp/payments", gw.base);
    let http = reqwest::Client::new();
    let sid = open_session(&http, &url).await;
    mcp(
        &http,
        &url,
        Some(&sid),
        json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}),
    )
    .await;

    let tmux = open_review(&gw);
    tmux.wait_for("● live");

    // A write arrives and is held.
    let held = {
        let (http, url, sid) = (http.clone(), url.clone(), sid.clone());
        tokio::spawn(async move {
            mcp(&http, &url, Some(&sid), json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{
                "name":"charge_card","arguments":{"account":"acct_42","amount":120,"currency":"EUR"},
                "_meta":{"progressToken":"t"}}})).await.1
        })
    };
    tmux.wait_for("payments/charge_card");
    tmux.keys(&["Enter"]);
    let detail = tmux.wait_for("wants payments/charge_card");
    assert!(detail.contains("amount 120"), "{detail}");
    assert_eq!(executions(gw.dir.path()), 0, "nothing runs before the yes");
    tmux.keys(&["a"]);
    tmux.wait_for("Reason (optional");
    tmux.run(&["send-keys", "-t", "review", "-l", "ticket 42"]);
    tmux.keys(&["Tab"]);
    tmux.run(&["send-keys", "-t", "review", "-l", "10m"]);
    tmux.keys(&["Enter"]);
    // The TTL typed is the one signed.
    tmux.wait_for("within 10m");
    let answer = tokio::time::timeout(Duration::from_secs(20), held)
        .await
        .expect("the held call never completed")
        .unwrap();
    assert!(answer.contains("charged 120 to acct_42"), "{answer}");
    assert_eq!(executions(gw.dir.path()), 1);
    // The reason typed is recorded with the approval (buffered entries
    // reach the file within milliseconds: wait for it).
    let audit_text = || {
        std::fs::read_dir(gw.dir.path().join("data/audit"))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.path().extension().is_some_and(|x| x == "jsonl"))
                    .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
                    .collect::<String>()
            })
            .unwrap_or_default()
    };
    let granted = |audit: &str| {
        audit
            .lines()
            .any(|l| l.contains("approval_granted") && l.contains("ticket 42"))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut audit = audit_text();
    while !granted(&audit) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        audit = audit_text();
    }
    assert!(
        granted(&audit),
        "no approval_granted entry with the reason: {audit}"
    );

    // A second write: denied with a reason typed in the terminal.
    tmux.keys(&["Escape", "1"]);
    let held = {
        let (http, url, sid) = (http.clone(), url.clone(), sid.clone());
        tokio::spawn(async move {
            mcp(
                &http,
                &url,
                Some(&sid),
                json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{
                "name":"charge_card","arguments":{"account":"acct_42","amount":7}}}),
            )
            .await
            .1
        })
    };
    tmux.wait_for("Pending (1)");
    tmux.keys(&["d"]);
    tmux.wait_for("Reason");
    tmux.run(&["send-keys", "-t", "review", "-l", "not today"]);
    tmux.keys(&["Enter"]);
    tmux.wait_for("denied p-");
    let answer = tokio::time::timeout(Duration::from_secs(20), held)
        .await
        .expect("the denied call never answered")
        .unwrap();
    assert!(answer.contains("approval_denied"), "{answer}");
    assert!(answer.contains("not today"), "{answer}");
    assert_eq!(executions(gw.dir.path()), 1);

    // History shows both decisions; q leaves and restores the terminal.
    tmux.keys(&["3"]);
    // The history may first show what the TUI held (the approval before its
    // consumption), then what it fetched: wait for the consumed state.
    let history = tmux.wait_for("consumed");
    assert!(history.contains("denied"), "{history}");
    tmux.keys(&["q"]);
}

fn open_review(gw: &Gateway) -> Tmux {
    let tmux = Tmux {
        socket: format!(
            "countersign-e2e-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        )
        .replace(['(', ')'], ""),
    };
    let review = PathBuf::from(env!("CARGO_BIN_EXE_countersign-review"));
    let command = format!(
        "{} --gateway {} --key {}",
        review.display(),
        gw.base,
        gw.dir.path().join("alice.key").display()
    );
    tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "review",
        "-x",
        "100",
        "-y",
        "30",
        &command,
    ]);
    tmux
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_gateway_is_shown_and_the_view_reconnects() {
    let mut gw = start_gateway();
    let tmux = open_review(&gw);
    tmux.wait_for("● live");
    gw.restart_killed_first();
    tmux.wait_for("gateway lost");
    gw.start_again();
    tmux.wait_for("● live");
    // Events flow again: a new proposal appears without any key press.
    let url = format!("{}/mcp/payments", gw.base);
    let http = reqwest::Client::new();
    let sid = open_session(&http, &url).await;
    let call = tokio::spawn(async move {
        mcp(
            &http,
            &url,
            Some(&sid),
            json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
            "name":"refund","arguments":{"charge":"ch_9"}}}),
        )
        .await
        .1
    });
    tmux.wait_for("payments/refund");
    call.abort();
    tmux.keys(&["q"]);
}
