//! The interop matrix: real MCP servers nobody here wrote, behind the real
//! gateway, driven by real MCP clients nobody here wrote, in both wire eras.
//!
//! Servers: the Python SDK's `MCPServer` and low-level `Server` (stdio and
//! Streamable HTTP, `tests/peers/py_server.py`), `mcp-server-time` and
//! `mcp-server-git` (PyPI), `server-memory`, `server-filesystem` and
//! `server-everything` (npm, the TypeScript SDK; handshake era only, so
//! 2026-07-28 clients reach them through the gateway's era bridge).
//! Clients: the Python SDK in the handshake era and pinned to 2026-07-28,
//! each once listing tools first and once never listing them, and the
//! TypeScript SDK client. `.ci/setup-peers` installs them all, pinned.
//!
//! Each cell shows, under the shipped policies:
//! - a read-only tool runs unattended;
//! - a write is held (`approval_pending`, read from `_meta`, and no
//!   `structuredContent` that breaks the tool's `outputSchema`), and after a
//!   reviewer's approval runs once, counted from the server's own state;
//! - the same write replayed to a client of the other era, and a cached read
//!   made for one era served to the other, parse in the asking client's SDK;
//! - the gateway never failed to fetch the server's tool list.
//!
//! A failing cell names itself: `cell <server> × <client>`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// One client kind of the matrix.
#[derive(Clone, Copy, Debug, PartialEq)]
enum ClientKind {
    /// The Python SDK, `mode = "legacy"`.
    PyHandshake { lists: bool },
    /// The Python SDK, `mode = "2026-07-28"` (pinned, no fall-back).
    PyModern { lists: bool },
    /// The TypeScript SDK client (handshake era), listing tools first so
    /// that it checks every result against the tool's `outputSchema`.
    Ts,
}

impl ClientKind {
    const ALL: [ClientKind; 5] = [
        ClientKind::PyHandshake { lists: true },
        ClientKind::PyHandshake { lists: false },
        ClientKind::PyModern { lists: true },
        ClientKind::PyModern { lists: false },
        ClientKind::Ts,
    ];

    fn name(self) -> String {
        match self {
            ClientKind::PyHandshake { lists } => {
                format!(
                    "python 2025-11-25{}",
                    if lists { "" } else { " (never lists)" }
                )
            }
            ClientKind::PyModern { lists } => {
                format!(
                    "python 2026-07-28{}",
                    if lists { "" } else { " (never lists)" }
                )
            }
            ClientKind::Ts => "typescript 2025-11-25".into(),
        }
    }

    /// A client of the other era, to be served what this one left.
    fn other_era(self) -> ClientKind {
        match self {
            ClientKind::PyHandshake { lists } => ClientKind::PyModern { lists },
            ClientKind::PyModern { lists } => ClientKind::PyHandshake { lists },
            ClientKind::Ts => ClientKind::PyModern { lists: false },
        }
    }

    fn era(self) -> &'static str {
        match self {
            ClientKind::PyModern { .. } => "2026-07-28",
            _ => "2025-11-25",
        }
    }

    fn lists(self) -> bool {
        match self {
            ClientKind::PyHandshake { lists } | ClientKind::PyModern { lists } => lists,
            ClientKind::Ts => true,
        }
    }

    /// Run `calls`; the client's JSON report (it must succeed: a result its
    /// SDK cannot parse fails it).
    fn run(self, cell: &str, url: &str, calls: &[Value]) -> Value {
        let plan = json!({ "list": self.lists(), "calls": calls }).to_string();
        let out = match self {
            ClientKind::Ts => Command::new("node")
                .arg(peers_dir().join("ts_client.mjs"))
                .args([url, TOKEN, &plan])
                .env(
                    "SDK_DIR",
                    peers_cache().join("npm/node_modules/@modelcontextprotocol/sdk"),
                )
                .output()
                .unwrap(),
            ClientKind::PyHandshake { .. } | ClientKind::PyModern { .. } => {
                let mode = match self {
                    ClientKind::PyModern { .. } => "2026-07-28",
                    _ => "legacy",
                };
                Command::new(peer_python())
                    .arg(peers_dir().join("matrix_client.py"))
                    .args(["http", url, TOKEN, mode, &plan])
                    .output()
                    .unwrap()
            }
        };
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "cell {cell}: {} failed:\nstdout: {stdout}\nstderr: {}",
            self.name(),
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
            .unwrap_or_else(|e| panic!("cell {cell}: no report ({e}): {stdout}"));
        if let Some(v) = report["protocol_version"].as_str() {
            assert_eq!(v, self.era(), "cell {cell}: negotiated version");
        }
        report
    }
}

fn peers_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/peers")
}

fn npm_server(package: &str) -> PathBuf {
    let p = peers_cache()
        .join("npm/node_modules/@modelcontextprotocol")
        .join(package)
        .join("dist/index.js");
    assert!(
        p.exists(),
        "{package} is not installed: run `.ci/setup-peers`"
    );
    p
}

fn venv_bin(name: &str) -> PathBuf {
    let p = peers_cache().join("venv/bin").join(name);
    assert!(p.exists(), "{name} is not installed: run `.ci/setup-peers`");
    p
}

/// A child process killed and reaped when the test ends, however it ends.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The Python SDK server `kind` over Streamable HTTP on a free port; its URL.
fn py_http_server(kind: &str, state: &Path) -> (Reaped, String) {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(peer_python())
        .arg(peers_dir().join("py_server.py"))
        .args([kind, "http"])
        .arg(state)
        .arg(port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let child = Reaped(child);
    // Wait for its listener (the event), up to 20 s.
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{kind} server did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, format!("http://127.0.0.1:{port}/mcp"))
}

/// The write a cell makes: its tool and arguments, fresh for cell `n`.
type Write = Box<dyn Fn(usize) -> (&'static str, Value)>;

/// One server of the matrix: how the gateway runs it, which read and write
/// a cell makes, and how its own state counts executions of the write.
struct Upstream {
    /// Its name in the gateway's config.
    name: &'static str,
    /// `[servers.NAME]` body.
    config: String,
    /// A read-only tool and its arguments.
    read: (&'static str, Value),
    /// The write for cell number `n` (fresh arguments each cell), if the
    /// server has one.
    write: Option<Write>,
    /// Whether a read cached for one client is still cached for the next:
    /// not for a server that announces `tools/list_changed` whenever a
    /// session starts (server-everything registers tools by the client's
    /// capabilities), since the gateway drops a server's cached reads when
    /// it says its list changed.
    cache_survives_sessions: bool,
    /// The server's own record of what the writes did (compared before and
    /// after): what must change once, and never again.
    state: Box<dyn Fn() -> String>,
    /// Keeps processes and folders alive as long as the server is used.
    _keep: Vec<Box<dyn std::any::Any>>,
}

/// The decision object countersign put in `_meta` (always there).
fn decision(result: &Value) -> &Value {
    &result["_meta"]["dev.countersign/decision"]
}

fn is_error(result: &Value) -> bool {
    result["isError"].as_bool().unwrap_or(false)
}

fn run_matrix(up: Upstream) {
    let (pdir, key) = default_policies_with_alice();
    let gw = Gateway::start_with(Options {
        policies: Some(pdir.path().to_owned()),
        extra: format!(
            "\n[servers.{name}]\n{config}\ncall_timeout = \"20s\"\n[servers.{name}.tools.{read}]\ncache_ttl = \"5m\"\n",
            name = up.name,
            config = up.config,
            read = up.read.0,
        ),
        ..Default::default()
    });
    let url = gw.url(up.name);
    for (n, client) in ClientKind::ALL.into_iter().enumerate() {
        let cell = format!("{} × {}", up.name, client.name());
        let read = json!({ "tool": up.read.0, "arguments": up.read.1 });
        // A read-only tool runs unattended, whether or not the client listed.
        let first = client.run(&cell, &url, std::slice::from_ref(&read));
        let r = &first["results"][0];
        assert!(!is_error(r), "cell {cell}: the read was not run: {r}");
        if let Some(listed) = first["listed"].as_array() {
            assert!(
                listed.iter().any(|t| t == up.read.0),
                "cell {cell}: {listed:?}"
            );
        }
        // A cached read made for this client's era, served to the other.
        let other = client.other_era();
        let again = other.run(&cell, &url, std::slice::from_ref(&read));
        let r = &again["results"][0];
        assert!(!is_error(r), "cell {cell}: cached read: {r}");
        assert!(
            !up.cache_survives_sessions || r["_meta"]["dev.countersign/cached"].is_object(),
            "cell {cell}: the second read was not from the cache: {r}"
        );

        let Some(write) = &up.write else { continue };
        let (tool, arguments) = write(n);
        let key_id = format!("matrix-{}-{n}", up.name);
        let call = json!({ "tool": tool, "arguments": arguments, "key": key_id });
        let before = (up.state)();
        // Held: approval_pending, in _meta (the TypeScript SDK would have
        // thrown on a structuredContent that breaks the outputSchema).
        let held = client.run(&cell, &url, std::slice::from_ref(&call));
        let r = &held["results"][0];
        assert!(is_error(r), "cell {cell}: the write was not held: {r}");
        assert_eq!(decision(r)["code"], "approval_pending", "cell {cell}: {r}");
        assert_eq!((up.state)(), before, "cell {cell}: ran before approval");
        let proposal = decision(r)["proposal_id"].as_str().unwrap().to_owned();
        let (ok, out, err) = review_cli(&gw, &key, &["approve", &proposal]);
        assert!(ok, "cell {cell}: approve failed: {out}{err}");
        // Approved: the same call runs once.
        let ran = client.run(&cell, &url, std::slice::from_ref(&call));
        let r = &ran["results"][0];
        assert!(!is_error(r), "cell {cell}: the approved write failed: {r}");
        let after = (up.state)();
        assert_ne!(after, before, "cell {cell}: the approved write did not run");
        // Replayed to a client of the other era, and to this one again:
        // answered from the ledger, never run again.
        for replayer in [other, client] {
            let replay = replayer.run(&cell, &url, std::slice::from_ref(&call));
            let r = &replay["results"][0];
            assert!(
                r["_meta"]["dev.countersign/replayed"]["key"] == key_id.as_str(),
                "cell {cell}: not a replay for {}: {r}",
                replayer.name()
            );
            assert_eq!(
                (up.state)(),
                after,
                "cell {cell}: the write ran again for {}",
                replayer.name()
            );
        }
    }
    let log = gw.log.lock().unwrap().join("\n");
    for bad in ["tool list refused", "tool list not fetched"] {
        assert!(
            !log.contains(bad),
            "{}: the log says `{bad}`:\n{log}",
            up.name
        );
    }
    drop(pdir);
}

fn py_notes(kind: &'static str, http: bool) -> Upstream {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("notes.json");
    let mut keep: Vec<Box<dyn std::any::Any>> = Vec::new();
    let config = if http {
        let (child, url) = py_http_server(kind, &state);
        keep.push(Box::new(child));
        format!("url = \"{url}\"")
    } else {
        format!(
            "command = \"{}\"\nargs = [\"{}\", \"{kind}\", \"stdio\", \"{}\"]",
            peer_python().display(),
            peers_dir().join("py_server.py").display(),
            state.display()
        )
    };
    let name = match (kind, http) {
        ("mcpserver", false) => "py_mcpserver_stdio",
        ("mcpserver", true) => "py_mcpserver_http",
        (_, false) => "py_lowlevel_stdio",
        (_, true) => "py_lowlevel_http",
    };
    let read_state = state.clone();
    keep.push(Box::new(dir));
    Upstream {
        name,
        config,
        read: ("read_notes", json!({})),
        write: Some(Box::new(|n| {
            ("add_note", json!({ "text": format!("note {n}") }))
        })),
        cache_survives_sessions: true,
        state: Box::new(move || std::fs::read_to_string(&read_state).unwrap_or_default()),
        _keep: keep,
    }
}

/// The modification time and content of `path`: a second execution of a
/// write that leaves the same content still moves the time.
fn stamp(path: &Path) -> String {
    let meta = std::fs::metadata(path).ok();
    let modified = meta
        .and_then(|m| m.modified().ok())
        .map(|t| format!("{t:?}"))
        .unwrap_or_default();
    format!(
        "{modified} {}",
        std::fs::read_to_string(path).unwrap_or_default()
    )
}

#[test]
fn python_sdk_mcpserver_over_stdio() {
    run_matrix(py_notes("mcpserver", false));
}

#[test]
fn python_sdk_mcpserver_over_http() {
    run_matrix(py_notes("mcpserver", true));
}

#[test]
fn python_sdk_lowlevel_server_over_stdio() {
    run_matrix(py_notes("lowlevel", false));
}

#[test]
fn python_sdk_lowlevel_server_over_http() {
    run_matrix(py_notes("lowlevel", true));
}

#[test]
fn mcp_server_time() {
    run_matrix(Upstream {
        name: "time",
        config: format!("command = \"{}\"", venv_bin("mcp-server-time").display()),
        read: ("get_current_time", json!({ "timezone": "UTC" })),
        write: None,
        cache_survives_sessions: true,
        state: Box::new(String::new),
        _keep: Vec::new(),
    });
}

#[test]
fn mcp_server_git() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().to_owned();
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    git(&["init", "-q"]);
    git(&["config", "user.email", "matrix@example.test"]);
    git(&["config", "user.name", "matrix"]);
    std::fs::write(repo.join("README"), "start\n").unwrap();
    git(&["add", "README"]);
    git(&["commit", "-qm", "start"]);
    let state_repo = repo.clone();
    run_matrix(Upstream {
        name: "git",
        config: format!(
            "command = \"{}\"\nargs = [\"--repository\", \"{}\"]",
            venv_bin("mcp-server-git").display(),
            repo.display()
        ),
        read: (
            "git_status",
            json!({ "repo_path": repo.display().to_string() }),
        ),
        write: Some(Box::new(move |n| {
            // Each cell stages a change of its own; the write commits it.
            std::fs::write(repo.join(format!("file-{n}")), format!("{n}\n")).unwrap();
            let out = Command::new("git")
                .arg("-C")
                .arg(&repo)
                .args(["add", &format!("file-{n}")])
                .output()
                .unwrap();
            assert!(out.status.success());
            (
                "git_commit",
                json!({ "repo_path": repo.display().to_string(), "message": format!("cell {n}") }),
            )
        })),
        // The commit count: a second commit of a cell would add one.
        cache_survives_sessions: true,
        state: Box::new(move || {
            let out = Command::new("git")
                .arg("-C")
                .arg(&state_repo)
                .args(["rev-list", "--count", "HEAD"])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        }),
        _keep: vec![Box::new(dir)],
    });
}

#[test]
fn server_memory() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("memory.jsonl");
    let state_file = file.clone();
    run_matrix(Upstream {
        name: "memory",
        config: format!(
            "command = \"node\"\nargs = [\"{}\"]\n[servers.memory.env]\nMEMORY_FILE_PATH = \"{}\"",
            npm_server("server-memory").display(),
            file.display()
        ),
        read: ("read_graph", json!({})),
        write: Some(Box::new(|n| {
            (
                "create_entities",
                json!({ "entities": [{ "name": format!("entity-{n}"), "entityType": "test", "observations": ["made by a cell"] }] }),
            )
        })),
        cache_survives_sessions: true,
        state: Box::new(move || stamp(&state_file)),
        _keep: vec![Box::new(dir)],
    });
}

#[test]
fn server_filesystem() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let target = root.join("written.txt");
    let state_file = target.clone();
    let read_root = root.display().to_string();
    run_matrix(Upstream {
        name: "filesystem",
        config: format!(
            "command = \"node\"\nargs = [\"{}\", \"{}\"]",
            npm_server("server-filesystem").display(),
            root.display()
        ),
        read: ("list_directory", json!({ "path": read_root })),
        write: Some(Box::new(move |n| {
            (
                "write_file",
                json!({ "path": target.display().to_string(), "content": format!("cell {n}\n") }),
            )
        })),
        cache_survives_sessions: true,
        state: Box::new(move || stamp(&state_file)),
        _keep: vec![Box::new(dir)],
    });
}

#[test]
fn server_everything() {
    run_matrix(Upstream {
        name: "everything",
        config: format!(
            "command = \"node\"\nargs = [\"{}\", \"stdio\"]",
            npm_server("server-everything").display()
        ),
        read: ("get-sum", json!({ "a": 2, "b": 40 })),
        // Its writes keep no state outside the process to count them by.
        write: None,
        cache_survives_sessions: false,
        state: Box::new(String::new),
        _keep: Vec::new(),
    });
}

/// server-everything offers `get-roots-list` only to clients that declare
/// roots. Two sessions of clients with other capabilities list two
/// different catalogs, and neither is a change of the other.
#[tokio::test]
async fn per_client_tool_lists_are_not_taken_for_changes() {
    let gw = Gateway::start_with(Options {
        extra: format!(
            "\n[servers.everything]\ncommand = \"node\"\nargs = [\"{}\", \"stdio\"]\n",
            npm_server("server-everything").display()
        ),
        ..Default::default()
    });
    let session = |capabilities: Value| {
        let url = gw.url("everything");
        async move {
            let mut c = Client::new(&url);
            c.initialize_with(capabilities).await;
            c
        }
    };
    // A client with roots: the server registers its roots tool once the
    // session is initialized, and says its list changed.
    let with_roots = session(json!({"roots": {"listChanged": true}})).await;
    gw.wait_for_log("the server's tool list changed").await;
    let a = with_roots.call(1, "echo", json!({"message": "a"})).await;
    assert_eq!(a.last()["result"]["content"][0]["text"], "Echo: a", "{a:?}");
    // A client without: its session's list lacks the roots tool.
    let without = session(json!({})).await;
    let b = without.call(2, "echo", json!({"message": "b"})).await;
    assert_eq!(b.last()["result"]["content"][0]["text"], "Echo: b", "{b:?}");
    let entries = audit_entries(&gw.audit_dir());
    let learned: Vec<&Value> = entries
        .iter()
        .filter(|e| e["kind"] == "tools_learned")
        .flat_map(|e| e["tools"].as_array().unwrap())
        .collect();
    assert!(
        learned.iter().any(|t| t["tool"] == "get-roots-list"),
        "the roots client's list was fetched: {learned:?}"
    );
    let changed: Vec<_> = entries
        .iter()
        .filter(|e| e["kind"] == "tools_changed")
        .collect();
    assert!(
        changed.is_empty(),
        "a listing for another client is not a change: {changed:?}"
    );
    let log = gw.log.lock().unwrap().join("\n");
    assert!(!log.contains("no longer listed"), "{log}");
}
