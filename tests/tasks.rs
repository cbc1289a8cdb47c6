//! Held calls as MCP tasks (DESIGN.md section 24), end to end: the real
//! gateway, the example server, the `countersign` CLI as the reviewer, and a
//! tasks client nobody here wrote (the MCP v2 TypeScript client with
//! `@modelcontextprotocol/ext-tasks`, `tests/peers/tasks_client.mjs`) in the
//! handshake era (2025-11-25 core tasks) and in 2026-07-28 (the tasks
//! extension). Every case asserts how many times the server ran the call.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

const ERAS: [&str; 2] = ["handshake", "modern"];
const DISPOSITION: &str = "io.modelcontextprotocol/tool-approval-disposition";

struct Setup {
    gw: common::Gateway,
    keys: PathBuf,
    _pdir: tempfile::TempDir,
}

fn keygen(dir: &Path, name: &str) -> String {
    let out = std::process::Command::new(common::countersign_bin())
        .args(["keygen", "--name", name, "--out"])
        .arg(dir.join(format!("{name}.key")))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .replace("groups = []", "groups = [\"leads\"]")
        .replace("tenants = [\"*\"]", "tenants = [\"acme\"]")
}

/// A policy folder with the shipped policies and reviewer alice's key.
fn policies() -> (tempfile::TempDir, PathBuf) {
    let pdir = tempfile::tempdir().unwrap();
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policies");
    for f in ["schema.cedarschema", "default.cedar"] {
        std::fs::copy(src.join(f), pdir.path().join(f)).unwrap();
    }
    let keys = pdir.path().join("keys");
    std::fs::create_dir(&keys).unwrap();
    std::fs::write(pdir.path().join("reviewers.toml"), keygen(&keys, "alice")).unwrap();
    (pdir, keys)
}

fn options(policies: &Path, extra: &str) -> common::Options {
    common::Options {
        policies: Some(policies.to_owned()),
        approvals: "hold = \"0s\"\n".into(),
        extra: format!("\n[tasks]\npoll_interval = \"200ms\"\n{extra}"),
        ..Default::default()
    }
}

impl Setup {
    /// The shipped policies (a charge needs a reviewer), reviewer alice.
    fn start() -> Setup {
        let (pdir, keys) = policies();
        let gw = common::Gateway::start_with(options(pdir.path(), ""));
        Setup {
            gw,
            keys,
            _pdir: pdir,
        }
    }

    async fn reviewer(&self, args: &[&str]) -> (bool, String, String) {
        let key = self.keys.join("alice.key").display().to_string();
        let base = self.gw.base();
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--key", &key, "--gateway", &base]);
        common::run_cli_async(&all).await
    }

    /// The one pending proposal, once there is one.
    async fn pending_proposal(&self) -> String {
        for _ in 0..100 {
            let (ok, out, err) = self.reviewer(&["pending", "--json"]).await;
            assert!(ok, "{err}");
            let v: Value = serde_json::from_str(&out).unwrap();
            if let Some(p) = v["proposals"].as_array().and_then(|a| a.first()) {
                return p["id"].as_str().unwrap().to_owned();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no proposal became pending");
    }

    fn client(
        &self,
        era: &str,
        token: &str,
        key: Option<&str>,
        extra: &[&str],
    ) -> tokio::process::Child {
        let charge = json!({"account": "acct-1", "amount": 10});
        self.client_calling(era, token, "charge_card", &charge, key, extra)
    }

    fn client_calling(
        &self,
        era: &str,
        token: &str,
        tool: &str,
        arguments: &Value,
        key: Option<&str>,
        extra: &[&str],
    ) -> tokio::process::Child {
        let mut args = vec![
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("tests/peers/tasks_client.mjs")
                .display()
                .to_string(),
            "--url".into(),
            self.gw.url("payments"),
            "--token".into(),
            token.into(),
            "--era".into(),
            era.into(),
            "--tool".into(),
            tool.into(),
            "--arguments".into(),
            arguments.to_string(),
        ];
        if let Some(k) = key {
            args.extend(["--key".into(), k.into()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        tokio::process::Command::new("node")
            .current_dir(common::peers_cache().join("tasks"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("node: `.ci/setup-peers` installs the tasks client under .ci/cache/tasks")
    }
}

/// The client's JSON lines, once it exits.
async fn events(child: tokio::process::Child) -> Vec<Value> {
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the tasks client ended")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        !lines.is_empty(),
        "no output; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    lines
}

fn event<'a>(lines: &'a [Value], name: &str) -> &'a Value {
    lines
        .iter()
        .find(|l| l["event"] == name)
        .unwrap_or_else(|| panic!("no `{name}` event in {lines:?}"))
}

/// `tasks/get` of `task` as the holder of `token`, in the era asked.
async fn get(s: &Setup, era: &str, token: &str, task: &str) -> Value {
    let url = s.gw.url("payments");
    match era {
        "modern" => {
            let body = json!({"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId": task,
                "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                          "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}}});
            let resp = common::modern_post_as(&url, &body, token)
                .header("mcp-name", task)
                .send()
                .await
                .unwrap();
            let text = resp.text().await.unwrap();
            common::parse_messages(&text, text.starts_with("event:") || text.starts_with("id:"))
                .pop()
                .unwrap_or_else(|| serde_json::from_str(&text).unwrap())
        }
        _ => {
            let mut c = common::Client::new(&url);
            c.token = token.into();
            c.protocol = "2025-11-25".into();
            c.initialize().await;
            c.post(&json!({"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId": task}}))
                .await
                .last()
                .clone()
        }
    }
}

async fn wait_done(s: &Setup, era: &str, task: &str) -> Value {
    for _ in 0..150 {
        let t = get(s, era, common::TOKEN, task).await;
        let status = t["result"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if status != "working" && !status.is_empty() {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("task {task} did not end");
}

fn disposition(result: &Value) -> &str {
    result["_meta"][DISPOSITION].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_held_charge_becomes_a_task_that_runs_once_when_approved_in_both_eras() {
    for era in ERAS {
        let s = Setup::start();
        let child = s.client(era, common::TOKEN, None, &[]);
        let proposal = s.pending_proposal().await;
        assert_eq!(
            s.gw.executions("charge_card"),
            0,
            "{era}: nothing ran while held"
        );
        let (ok, out, err) = s
            .reviewer(&["approve", &proposal, "--reason", "expected charge"])
            .await;
        assert!(ok, "{era}: approve failed: {out}{err}");
        let lines = events(child).await;
        let started = event(&lines, "started");
        assert_eq!(started["kind"], "task", "{era}: {lines:?}");
        let settled = event(&lines, "settled");
        assert_eq!(settled["status"], "completed", "{era}: {lines:?}");
        assert_eq!(
            disposition(&settled["result"]),
            "approved-executed",
            "{era}: {settled}"
        );
        assert_eq!(
            s.gw.executions("charge_card"),
            1,
            "{era}: the approved call ran once"
        );
        for kind in ["task_created", "task_claimed", "task_completed"] {
            common::wait_for_audit(&s.gw, &format!("{era}: {kind}"), |entries| {
                entries.iter().any(|e| e["kind"] == kind)
            })
            .await;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_denied_task_completes_denied_not_executed_and_nothing_runs() {
    for era in ERAS {
        let s = Setup::start();
        let child = s.client(era, common::TOKEN, None, &[]);
        let proposal = s.pending_proposal().await;
        let (ok, out, err) = s
            .reviewer(&["deny", &proposal, "--reason", "not this one"])
            .await;
        assert!(ok, "{era}: deny failed: {out}{err}");
        let lines = events(child).await;
        let settled = event(&lines, "settled");
        assert_eq!(settled["status"], "completed", "{era}: {lines:?}");
        assert_eq!(
            disposition(&settled["result"]),
            "denied-not-executed",
            "{era}"
        );
        assert_eq!(settled["result"]["isError"], true);
        let text = settled["result"]["content"].to_string();
        assert!(text.contains("did not run"), "{era}: {text}");
        assert_eq!(s.gw.executions("charge_card"), 0, "{era}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_cancelled_before_approval_runs_nothing() {
    for era in ERAS {
        let s = Setup::start();
        let lines = events(s.client(era, common::TOKEN, None, &["--cancel"])).await;
        let task = event(&lines, "cancelled")["taskId"]
            .as_str()
            .unwrap_or_else(|| panic!("{era}: {lines:?}"))
            .to_owned();
        let t = get(&s, era, common::TOKEN, &task).await;
        assert_eq!(t["result"]["status"], "cancelled", "{era}: {t}");
        // The proposal was withdrawn with the task: approving it now runs
        // nothing, and nothing is pending.
        let (ok, out, _) = s.reviewer(&["pending", "--json"]).await;
        assert!(ok);
        let pending: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            pending["proposals"].as_array().unwrap().len(),
            0,
            "{era}: {pending}"
        );
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(s.gw.executions("charge_card"), 0, "{era}");
        let again = get(&s, era, common::TOKEN, &task).await;
        assert_eq!(again["result"]["status"], "cancelled", "{era}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn another_principal_or_tenant_cannot_read_or_cancel_a_task() {
    for era in ERAS {
        let s = Setup::start();
        let lines = events(s.client(era, common::TOKEN, None, &["--no-wait"])).await;
        let task = event(&lines, "started")["taskId"]
            .as_str()
            .unwrap()
            .to_owned();
        let mine = get(&s, era, common::TOKEN, &task).await;
        assert_eq!(mine["result"]["status"], "working", "{era}: {mine}");
        assert!(
            mine["result"]["statusMessage"]
                .as_str()
                .unwrap()
                .contains("proposal"),
            "{era}: the status names the proposal: {mine}"
        );
        assert_eq!(
            mine["result"]["_meta"]["io.modelcontextprotocol/authorization"]["remediationHints"][0]
                ["type"],
            "task",
            "{era}: a waiting task carries the SEP-2643 envelope: {mine}"
        );
        for other in [common::OTHER_TOKEN, common::GLOBEX_TOKEN] {
            let theirs = get(&s, era, other, &task).await;
            assert_eq!(theirs["error"]["code"], -32602, "{era}: {theirs}");
            assert!(theirs["error"]["message"]
                .as_str()
                .unwrap()
                .contains("not found"));
        }
        // Cancel as another principal: not found, and the task waits on.
        let mut c = common::Client::new(&s.gw.url("payments"));
        c.token = common::OTHER_TOKEN.into();
        c.protocol = "2025-11-25".into();
        c.initialize().await;
        let refused = c
            .post(
                &json!({"jsonrpc":"2.0","id":2,"method":"tasks/cancel","params":{"taskId": task}}),
            )
            .await;
        assert_eq!(refused.last()["error"]["code"], -32602);
        let still = get(&s, era, common::TOKEN, &task).await;
        assert_eq!(still["result"]["status"], "working", "{era}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_outlives_its_client_and_a_gateway_restart() {
    for era in ERAS {
        let mut s = Setup::start();
        let lines = events(s.client(era, common::TOKEN, None, &["--no-wait"])).await;
        let task = event(&lines, "started")["taskId"]
            .as_str()
            .unwrap()
            .to_owned();
        let proposal = s.pending_proposal().await;
        s.gw.restart();
        let (ok, out, err) = s.reviewer(&["approve", &proposal, "--reason", "ok"]).await;
        assert!(ok, "{era}: approve failed: {out}{err}");
        let done = wait_done(&s, era, &task).await;
        assert_eq!(done["result"]["status"], "completed", "{era}: {done}");
        let result = match era {
            "modern" => done["result"]["result"].clone(),
            _ => {
                let mut c = common::Client::new(&s.gw.url("payments"));
                c.token = common::TOKEN.into();
                c.protocol = "2025-11-25".into();
                c.initialize().await;
                c.post(&json!({"jsonrpc":"2.0","id":3,"method":"tasks/result","params":{"taskId": task}}))
                    .await
                    .last()["result"]
                    .clone()
            }
        };
        assert_eq!(disposition(&result), "approved-executed", "{era}: {result}");
        assert_eq!(s.gw.executions("charge_card"), 1, "{era}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_task_calls_with_one_key_join_one_task_and_run_once() {
    for era in ERAS {
        let s = Setup::start();
        let a = events(s.client(era, common::TOKEN, Some("charge-42"), &["--no-wait"])).await;
        let b = events(s.client(era, common::TOKEN, Some("charge-42"), &["--no-wait"])).await;
        let ta = event(&a, "started")["taskId"].as_str().unwrap().to_owned();
        let tb = event(&b, "started")["taskId"].as_str().unwrap().to_owned();
        assert_eq!(ta, tb, "{era}: the same held call joins the same task");
        let proposal = s.pending_proposal().await;
        let (ok, _, err) = s.reviewer(&["approve", &proposal, "--reason", "ok"]).await;
        assert!(ok, "{err}");
        let done = wait_done(&s, era, &ta).await;
        assert_eq!(done["result"]["status"], "completed");
        assert_eq!(s.gw.executions("charge_card"), 1, "{era}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upstream_that_dies_after_executing_gives_outcome_unknown_and_no_second_run() {
    let s = Setup::start();
    let child = s.client("modern", common::TOKEN, Some("charge-crash"), &[]);
    let proposal = s.pending_proposal().await;
    s.gw.fault("charge_card", "exit_after_execute", 0);
    let (ok, _, err) = s.reviewer(&["approve", &proposal, "--reason", "ok"]).await;
    assert!(ok, "{err}");
    let lines = events(child).await;
    let settled = event(&lines, "settled");
    assert_eq!(settled["status"], "completed", "{lines:?}");
    assert_eq!(disposition(&settled["result"]), "outcome-unknown");
    assert_eq!(s.gw.executions("charge_card"), 1);
    // The same call with the same key again: outcome_unknown, never sent.
    let again = events(s.client("modern", common::TOKEN, Some("charge-crash"), &[])).await;
    assert_eq!(
        s.gw.executions("charge_card"),
        1,
        "never sent again: {again:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_without_tasks_still_gets_approval_pending() {
    let s = Setup::start();
    let mut c = common::Client::new(&s.gw.url("payments"));
    c.token = common::TOKEN.into();
    c.protocol = "2025-11-25".into();
    let init = c.initialize().await;
    assert!(
        init.last()["result"]["capabilities"]["tasks"]["requests"]["tools"]["call"].is_object(),
        "a 2025-11-25 session is offered tasks: {:?}",
        init.last()
    );
    let listed = c
        .post(&json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}))
        .await;
    let tools = listed.last()["result"]["tools"].as_array().unwrap().clone();
    assert!(tools
        .iter()
        .all(|t| t["execution"]["taskSupport"] == "optional"));
    let a = c
        .call(2, "charge_card", json!({"account": "acct-1", "amount": 10}))
        .await;
    assert_eq!(common::code(&a), "approval_pending");
    assert_eq!(s.gw.executions("charge_card"), 0);
    // A 2025-06-18 session is offered nothing of tasks.
    let mut old = common::Client::new(&s.gw.url("payments"));
    old.token = common::TOKEN.into();
    let init = old.initialize().await;
    assert!(init.last()["result"]["capabilities"].get("tasks").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn two_gateways_on_postgresql_run_a_task_approved_at_the_other_once() {
    let schema = common::pg::Schema::new();
    let (pdir, keys) = policies();
    let a = common::pg::on(&schema, options(pdir.path(), ""));
    let b = common::pg::on(&schema, options(pdir.path(), ""));
    let key = keys.join("alice.key").display().to_string();
    let s = Setup {
        gw: a,
        keys,
        _pdir: pdir,
    };
    for era in ERAS {
        let before = s.gw.executions("charge_card") + b.executions("charge_card");
        let child = s.client(era, common::TOKEN, None, &[]);
        let proposal = s.pending_proposal().await;
        // The reviewer decides through the gateway that does not hold the
        // task's client.
        let (ok, out, err) = common::run_cli_async(&[
            "approve",
            &proposal,
            "--reason",
            "ok",
            "--key",
            &key,
            "--gateway",
            &b.base(),
        ])
        .await;
        assert!(ok, "{era}: approve at the other gateway failed: {out}{err}");
        let lines = events(child).await;
        let settled = event(&lines, "settled");
        assert_eq!(settled["status"], "completed", "{era}: {lines:?}");
        assert_eq!(
            disposition(&settled["result"]),
            "approved-executed",
            "{era}"
        );
        // Both gateways' runners heard the decision; one claim won, and
        // the other found the task claimed (or ended) and ran nothing.
        let after = s.gw.executions("charge_card") + b.executions("charge_card");
        assert_eq!(after - before, 1, "{era}: one run across both gateways");
    }
}

/// A 2026-07-28 request that declares the tasks extension.
fn modern_task_body(id: u64, method: &str, params: Value) -> Value {
    let mut params = params;
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
    });
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

async fn modern_json(url: &str, body: &Value, name: &str) -> Value {
    let text = common::modern_post(url, body)
        .header("mcp-name", name)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(_) => common::parse_messages(&text, true).pop().unwrap(),
    }
}

/// The store's files, byte for byte.
fn store_bytes(gw: &common::Gateway) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(gw.dir.path().join("data"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn polling_a_thousand_waiting_tasks_writes_nothing_to_the_store() {
    const TASKS: u64 = 1000;
    let (pdir, _keys) = policies();
    let mut opts = options(pdir.path(), "");
    opts.approvals = "hold = \"0s\"\nmax_pending = 2000\n".into();
    let gw = common::Gateway::start_with(opts);
    let url = gw.url("payments");
    let url = &url;
    let mut tasks = Vec::new();
    for chunk in (0..TASKS).collect::<Vec<_>>().chunks(8) {
        let made = futures_util::future::join_all(chunk.iter().map(|i| async move {
            let body = modern_task_body(
                *i,
                "tools/call",
                json!({"name": "charge_card", "arguments": {"account": "acct-1", "amount": i + 1}}),
            );
            modern_json(url, &body, "charge_card").await
        }))
        .await;
        for created in made {
            assert_eq!(created["result"]["resultType"], "task", "{created}");
            tasks.push(created["result"]["taskId"].as_str().unwrap().to_owned());
        }
    }
    // The gateway's own housekeeping (the retention sweep, every 10 s)
    // commits too: a window of polls that met it is measured again. A poll
    // that wrote would change the files in every window.
    let mut windows = Vec::new();
    for _ in 0..5 {
        let before = store_bytes(&gw);
        assert!(!before.is_empty());
        for chunk in tasks.chunks(16) {
            let got = futures_util::future::join_all(chunk.iter().map(|task| async move {
                let body = modern_task_body(1, "tasks/get", json!({"taskId": task}));
                modern_json(url, &body, task).await
            }))
            .await;
            for g in got {
                assert_eq!(g["result"]["status"], "working", "{g}");
            }
        }
        let after = store_bytes(&gw);
        let changed: Vec<PathBuf> = before
            .iter()
            .zip(&after)
            .filter(|(b, a)| b != a)
            .map(|(b, _)| b.0.clone())
            .collect();
        if before.len() == after.len() && changed.is_empty() {
            windows.clear();
            break;
        }
        windows.push(changed);
    }
    assert!(
        windows.is_empty(),
        "every window of {TASKS} polls changed the store's files: {windows:?}"
    );
    assert_eq!(gw.executions("charge_card"), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_servers_own_task_is_relayed_as_a_task_of_the_gateway() {
    // server-everything (the TypeScript SDK's experimental tasks server):
    // `simulate-research-query` runs only as a task of its own, in four
    // one-second stages.
    let everything = common::peers_cache()
        .join("npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(everything.exists(), "run .ci/setup-peers");
    let gw = common::Gateway::start_with(common::Options {
        extra: format!(
            "\n[servers.everything]\ncommand = \"node\"\nargs = [\"{}\", \"stdio\"]\ncall_timeout = \"10s\"\n",
            everything.display()
        ),
        ..Default::default()
    });
    let mut c = common::Client::new(&gw.url("everything"));
    c.token = common::TOKEN.into();
    c.protocol = "2025-11-25".into();
    c.initialize().await;
    let listed = c
        .post(&json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}))
        .await;
    let tool = listed.last()["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "simulate-research-query")
        .cloned()
        .expect("server-everything lists its task tool");
    assert_eq!(
        tool["execution"]["taskSupport"], "required",
        "the server's own declaration is kept"
    );
    let call = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{
        "name": "simulate-research-query", "arguments": {"topic": "tides"}, "task": {},
        "_meta": {"dev.countersign/idempotency-key": "research-1"}}});
    let created = c.post(&call).await;
    let task = created.last()["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {:?}", created.last()))
        .to_owned();
    assert!(task.starts_with("task-"), "the gateway's own id: {task}");
    // The same call with the same key: the ledger replays the server's
    // task, and the client gets the same gateway task.
    let again = c.post(&call).await;
    assert_eq!(again.last()["result"]["task"]["taskId"], task.as_str());
    let mut status = String::new();
    for _ in 0..100 {
        let got = c
            .post(&json!({"jsonrpc":"2.0","id":3,"method":"tasks/get","params":{"taskId": task}}))
            .await;
        status = got.last()["result"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if status != "working" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(status, "completed");
    let result = c
        .post(&json!({"jsonrpc":"2.0","id":4,"method":"tasks/result","params":{"taskId": task}}))
        .await;
    let r = &result.last()["result"];
    assert!(
        r["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("Research Report: tides"),
        "{r}"
    );
    assert_eq!(
        r["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        task.as_str()
    );
    // Another principal: not found.
    let mut other = common::Client::new(&gw.url("everything"));
    other.token = common::OTHER_TOKEN.into();
    other.protocol = "2025-11-25".into();
    other.initialize().await;
    let theirs = other
        .post(&json!({"jsonrpc":"2.0","id":5,"method":"tasks/get","params":{"taskId": task}}))
        .await;
    assert_eq!(theirs.last()["error"]["code"], -32602);
    // One dispatch of the call in the ledger's audit, whatever the retries.
    common::wait_for_audit(&gw, "one dispatch", |entries| {
        entries
            .iter()
            .filter(|e| e["kind"] == "dispatched" && e["idempotency_key"] == "research-1")
            .count()
            == 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_that_runs_at_once_is_answered_as_each_era_requires() {
    let s = Setup::start();
    let read = json!({"account": "acct-1"});
    // 2025-11-25: a task-augmented request gets a task, here one already
    // completed; the library reads its result.
    let lines =
        events(s.client_calling("handshake", common::TOKEN, "get_balance", &read, None, &[])).await;
    assert_eq!(event(&lines, "started")["kind"], "task", "{lines:?}");
    let settled = event(&lines, "settled");
    assert_eq!(settled["status"], "completed", "{lines:?}");
    assert!(
        settled["result"]["content"].to_string().contains("acct-1"),
        "{settled}"
    );
    // 2026-07-28: the plain result.
    let lines =
        events(s.client_calling("modern", common::TOKEN, "get_balance", &read, None, &[])).await;
    assert_eq!(event(&lines, "started")["kind"], "immediate", "{lines:?}");
    let settled = event(&lines, "settled");
    assert_eq!(settled["status"], "completed", "{lines:?}");
    assert_eq!(s.gw.executions("get_balance"), 2);
}
