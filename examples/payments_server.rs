//! A payments-like MCP server for tests, demos and benchmarks.
//!
//! ```text
//! payments_server [--http 127.0.0.1:9000] [--record FILE] [--faults FILE]
//! ```
//!
//! Speaks stdio (default) or Streamable HTTP (`--http`), in the handshake era
//! (`initialize`, sessions) and in 2026-07-28 (per-request `_meta`,
//! `server/discover`).
//!
//! Tools: `get_balance` (readOnlyHint), `get_account` (readOnlyHint, returns a
//! resource version), `charge_card` and `refund` (writes), `close_account`
//! (destructiveHint), `transfer` (no annotations at all), `slow_report`
//! (read-only, sends progress notifications), `ask_model` (asks the client for
//! a sampling completion: a server-to-client request).
//!
//! `--record FILE` appends one JSON line per execution
//! (`{"event":"executed","tool":…,"arguments":…,"raw_arguments":…,"pid":…}`,
//! `raw_arguments` being the arguments text byte for byte) and per received
//! cancellation (`{"event":"cancelled",…}`) and each relayed
//! `notifications/roots/list_changed` (`{"event":"notification",…}`), so
//! tests can count executions and relayed notifications.
//!
//! `--faults FILE` is read before each call: a JSON object from tool name to
//! `{"fault": F, "times": N, "delay_ms": D}`, where F is one of
//! - `delay`: execute, then wait `delay_ms` before answering;
//! - `exit_after_execute`: execute, then exit before answering;
//! - `exit_before_execute`: exit without executing;
//! - `error_before_execute`: answer JSON-RPC -32603 without executing;
//! - `drop_session` (HTTP): execute, forget the session (later requests get
//!   404), and break the connection mid-response;
//! - `cancelled_after_execute`: execute, then answer JSON-RPC -32800
//!   "Request cancelled" (a server that ran the call and then saw the
//!   client's cancellation).
//!
//! `times` (default 1) counts down; the entry is removed when it reaches 0.
//!
//! `notify_later` answers, then sends `notifications/message` on the
//! standalone stream (stdout, or the session's GET stream over HTTP); with
//! `{"list_changed": true}` it sends `notifications/tools/list_changed`
//! instead. The faults file's `{"_hints": {"TOOL": {...}}}` replaces a tool's
//! annotations in `tools/list`, and `{"_define": {"TOOL": {...}}}` changes its
//! definition: each member given replaces the tool's (`description`,
//! `inputSchema`, ...; `null` removes it), and `"TOOL": null` drops the tool
//! from the list. `--definitions-at-start` reads `_define` once, when the
//! process starts: children started at different times then list different
//! definitions (a server whose tools differ per session).
//! Over HTTP, 2026-07-28 requests are checked like a real modern server does
//! (`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name` against the body), and
//! each execution record carries the `Authorization`, `X-Api-Key` and
//! `traceparent` headers the request came with. `--stubborn` ignores stdin EOF and SIGTERM (to test SIGKILL escalation).
//! `--modern-only` speaks only 2026-07-28: `initialize` gets the version error.
//! `--page-size N` pages `tools/list`, N tools a page (`nextCursor`).
//! `get_account` reports the version in the faults file's
//! `{"_versions": {"ACCOUNT": "VERSION"}}` (default `v1`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

const HANDSHAKE: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26"];
const MODERN: &str = "2026-07-28";

const TOOLS: &str = r#"[{"name":"get_balance","description":"Read the balance of an account.","inputSchema":{"type":"object","properties":{"account":{"type":"string"}},"required":["account"]},"annotations":{"readOnlyHint":true,"openWorldHint":false}},{"name":"get_account","description":"Read an account with its version.","inputSchema":{"type":"object","properties":{"account":{"type":"string"}},"required":["account"]},"annotations":{"readOnlyHint":true,"openWorldHint":false}},{"name":"charge_card","description":"Charge a card.","inputSchema":{"type":"object","properties":{"account":{"type":"string"},"amount":{"type":"number"},"currency":{"type":"string"}},"required":["account","amount"]},"annotations":{"readOnlyHint":false,"destructiveHint":false,"idempotentHint":false,"openWorldHint":true}},{"name":"refund","description":"Refund a charge.","inputSchema":{"type":"object","properties":{"charge":{"type":"string"},"amount":{"type":"number"}},"required":["charge"]},"annotations":{"readOnlyHint":false,"destructiveHint":false}},{"name":"close_account","description":"Close an account for good.","inputSchema":{"type":"object","properties":{"account":{"type":"string"}},"required":["account"]},"annotations":{"destructiveHint":true}},{"name":"transfer","description":"Move money between accounts.","inputSchema":{"type":"object","properties":{"from":{"type":"string"},"to":{"type":"string"},"amount":{"type":"number"}}}},{"name":"slow_report","description":"A report that takes a while and reports progress.","inputSchema":{"type":"object","properties":{"steps":{"type":"integer"}}},"annotations":{"readOnlyHint":true}},{"name":"ask_model","description":"Ask the client's model a question (sampling).","inputSchema":{"type":"object","properties":{"question":{"type":"string"}}},"annotations":{"readOnlyHint":true}},{"name":"notify_later","description":"Answer, then send a log message on the standalone stream.","inputSchema":{"type":"object","properties":{"text":{"type":"string"}}},"annotations":{"readOnlyHint":true}},{"name":"test_reconnection","description":"The conformance suite's SSE polling tool: over HTTP in a session its stream closes before the answer, which a GET with Last-Event-ID resumes.","inputSchema":{"type":"object","properties":{}},"annotations":{"readOnlyHint":true,"openWorldHint":false}}]"#;

/// Change the listed tools as `changes` says (`{"TOOL": {member: value}}`;
/// a `null` member is removed, a `null` tool dropped).
fn redefine(tools: &mut Vec<Value>, changes: &Value) {
    tools.retain(|t| {
        let name = t["name"].as_str().unwrap_or_default();
        changes.get(name) != Some(&Value::Null)
    });
    for tool in tools.iter_mut() {
        let name = tool["name"].as_str().unwrap_or_default().to_owned();
        let Some(Value::Object(members)) = changes.get(&name) else {
            continue;
        };
        for (k, v) in members {
            match (v, tool.as_object_mut()) {
                (Value::Null, Some(t)) => {
                    t.remove(k);
                }
                (v, Some(t)) => {
                    t.insert(k.clone(), v.clone());
                }
                _ => {}
            }
        }
    }
}

struct Server {
    record: Option<PathBuf>,
    faults: Option<PathBuf>,
    record_lock: Mutex<()>,
    charges: AtomicU64,
    /// This process's own prefix of charge ids: the gateway starts a
    /// process per session, and `ch_1` of two sessions would look like one
    /// charge run twice.
    charge_prefix: String,
    stubborn: bool,
    /// `--modern-only`: speak only 2026-07-28 (`initialize` is refused).
    modern_only: bool,
    /// `--page-size N`: `tools/list` answers N tools a page, with cursors.
    page_size: Option<usize>,
    /// `--definitions-at-start`: the `_define` read at start.
    defined_at_start: Option<Value>,
}

/// How a tool talks back to the client while it runs.
#[derive(Clone)]
struct Out {
    /// Messages on the request's own stream (stdio: stdout).
    tx: mpsc::Sender<Value>,
    /// Server-to-client requests awaiting an answer.
    pending: Arc<Mutex<HashMap<String, oneshot::Sender<Value>>>>,
    next: Arc<AtomicU64>,
    /// Messages that belong to no request (stdio: stdout; HTTP: the GET stream).
    standalone: mpsc::Sender<Value>,
    /// The `Authorization` header the request arrived with (HTTP), recorded
    /// so tests can prove a client's token never reaches the upstream.
    auth: Option<String>,
    /// The `X-Api-Key` header the request came with (HTTP).
    api_key: Option<String>,
    /// The `traceparent` header the request came with (HTTP).
    traceparent: Option<String>,
}

impl Out {
    async fn ask(&self, method: &str, params: Value) -> Option<Value> {
        let id = format!("srv-{}", self.next.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = oneshot::channel();
        self.pending.lock().ok()?.insert(id.clone(), tx);
        let _ = self
            .tx
            .send(json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}))
            .await;
        tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .ok()?
            .ok()
    }

    fn answer(&self, msg: &Value) {
        let Some(id) = msg.get("id").and_then(Value::as_str) else {
            return;
        };
        let waiter = self.pending.lock().ok().and_then(|mut p| p.remove(id));
        if let Some(w) = waiter {
            let _ = w.send(msg.clone());
        }
    }
}

enum Fault {
    None,
    Delay(u64),
    ExitAfter,
    ExitBefore,
    ErrorBefore,
    DropSession,
    CancelledAfter,
}

/// What handling one request produced.
enum Outcome {
    Reply(Value),
    /// Answer nothing and break the connection (HTTP `drop_session`).
    DropSession,
}

impl Server {
    /// The tools as listed now: the fixed set, changed by the faults file's
    /// `_hints` and `_define` (or the `_define` read at start).
    fn tools(&self) -> Vec<Value> {
        let mut tools: Vec<Value> = serde_json::from_str(TOOLS).unwrap_or_default();
        let faults = self
            .faults
            .as_ref()
            .and_then(|f| std::fs::read_to_string(f).ok())
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .unwrap_or(Value::Null);
        if let Some(Value::Object(hints)) = faults.get("_hints") {
            let as_define: serde_json::Map<String, Value> = hints
                .iter()
                .map(|(k, h)| (k.clone(), json!({ "annotations": h })))
                .collect();
            redefine(&mut tools, &Value::Object(as_define));
        }
        match &self.defined_at_start {
            Some(at_start) => redefine(&mut tools, at_start),
            None => redefine(&mut tools, faults.get("_define").unwrap_or(&Value::Null)),
        }
        tools
    }

    fn note(&self, entry: Value) {
        let Some(path) = &self.record else { return };
        let _guard = self.record_lock.lock();
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            // One write per line: children of several sessions append to one
            // record, and `writeln!` writes a value in pieces, which
            // interleave across processes (found by the chaos run). An
            // O_APPEND write of a whole line lands whole.
            let _ = f.write_all(format!("{entry}\n").as_bytes());
            let _ = f.sync_data();
        }
    }

    fn take_fault(&self, tool: &str) -> Fault {
        let Some(path) = &self.faults else {
            return Fault::None;
        };
        let _guard = self.record_lock.lock();
        let Ok(text) = std::fs::read_to_string(path) else {
            return Fault::None;
        };
        let Ok(mut all) = serde_json::from_str::<serde_json::Map<String, Value>>(&text) else {
            return Fault::None;
        };
        let Some(spec) = all.get_mut(tool) else {
            return Fault::None;
        };
        let kind = spec
            .get("fault")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let delay = spec.get("delay_ms").and_then(Value::as_u64).unwrap_or(1000);
        let times = spec.get("times").and_then(Value::as_u64).unwrap_or(1);
        if times <= 1 {
            all.remove(tool);
        } else {
            spec["times"] = json!(times - 1);
        }
        let _ = std::fs::write(path, Value::Object(all).to_string());
        match kind.as_str() {
            "delay" => Fault::Delay(delay),
            "exit_after_execute" => Fault::ExitAfter,
            "exit_before_execute" => Fault::ExitBefore,
            "error_before_execute" => Fault::ErrorBefore,
            "drop_session" => Fault::DropSession,
            "cancelled_after_execute" => Fault::CancelledAfter,
            _ => Fault::None,
        }
    }

    /// Handle one request (`id` present) or notification.
    async fn handle(&self, msg: &Value, out: &Out) -> Option<Outcome> {
        let method = msg.get("method").and_then(Value::as_str)?;
        let id = msg.get("id").cloned();
        let params = msg.get("params").cloned().unwrap_or(json!({}));
        let modern = params
            .get("_meta")
            .and_then(|m| m.get("io.modelcontextprotocol/protocolVersion"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        if method == "notifications/cancelled" {
            self.note(json!({"event":"cancelled","requestId":params.get("requestId"),"reason":params.get("reason"),"pid":std::process::id()}));
            return None;
        }
        // A client notification the gateway relayed (tests count them).
        if id.is_none() && method == "notifications/roots/list_changed" {
            self.note(json!({"event":"notification","method":method,"pid":std::process::id()}));
            return None;
        }
        let id = id?;
        if let Some(v) = &modern {
            if v != MODERN {
                return Some(Outcome::Reply(error(
                    id,
                    -32022,
                    "Unsupported protocol version",
                    Some(json!({"supported":[MODERN],"requested":v})),
                )));
            }
        }
        let result = match method {
            "initialize" if self.modern_only => {
                return Some(Outcome::Reply(error(
                    id,
                    -32022,
                    "Unsupported protocol version: this server speaks only 2026-07-28",
                    Some(json!({"supported":[MODERN],"requested":params.get("protocolVersion")})),
                )));
            }
            "initialize" => {
                let asked = params
                    .get("protocolVersion")
                    .and_then(Value::as_str)
                    .unwrap_or(HANDSHAKE[0]);
                let version = if HANDSHAKE.contains(&asked) {
                    asked
                } else {
                    HANDSHAKE[0]
                };
                json!({"protocolVersion":version,"capabilities":{"tools":{"listChanged":false}},"serverInfo":{"name":"payments-example","version":"1.0.0"}})
            }
            "server/discover" => {
                json!({"supportedVersions":[MODERN, HANDSHAKE[0], HANDSHAKE[1], HANDSHAKE[2]],"capabilities":{"tools":{}},"serverInfo":{"name":"payments-example","version":"1.0.0"}})
            }
            "ping" => json!({}),
            "tools/list" => {
                let tools = self.tools();
                let mut r = match self.page_size {
                    // The cursor is the index of the page's first tool.
                    Some(n) => {
                        let from: usize = params
                            .get("cursor")
                            .and_then(Value::as_str)
                            .and_then(|c| c.parse().ok())
                            .unwrap_or(0);
                        let page: Vec<Value> = tools.iter().skip(from).take(n).cloned().collect();
                        let mut r = json!({"tools": page});
                        if from + n < tools.len() {
                            r["nextCursor"] = json!((from + n).to_string());
                        }
                        r
                    }
                    None => json!({"tools": tools}),
                };
                if modern.is_some() {
                    r["ttlMs"] = json!(0);
                    r["cacheScope"] = json!("private");
                }
                r
            }
            "tools/call" => {
                let raw = msg
                    .get("__raw")
                    .and_then(Value::as_str)
                    .and_then(raw_arguments);
                return self
                    .call_tool(id, &params, raw, out, modern.is_some())
                    .await;
            }
            _ => {
                return Some(Outcome::Reply(error(
                    id,
                    -32601,
                    &format!("method `{method}` not found"),
                    None,
                )))
            }
        };
        Some(Outcome::Reply(ok(id, result, modern.is_some())))
    }

    async fn call_tool(
        &self,
        id: Value,
        params: &Value,
        raw: Option<(String, Option<String>)>,
        out: &Out,
        modern: bool,
    ) -> Option<Outcome> {
        let name = params.get("name").and_then(Value::as_str).unwrap_or("");
        let args = params.get("arguments").cloned().unwrap_or(json!({}));
        if name == RECONNECTION_TOOL {
            // The conformance suite's tool (listed, as a gateway refuses a
            // tool the listing lacks): a related message
            // first, so the answer is a stream; over HTTP in a session the
            // stream closes before the answer instead (see `http_post`).
            // Over stdio the answer comes a while after the note: long
            // enough for a gateway that polls (`gateway.sse_poll_after`) to
            // close its client's stream in between, as the suite checks.
            let note = json!({"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"working on it"}});
            let _ = out.tx.send(note).await;
            tokio::time::sleep(std::time::Duration::from_millis(RECONNECTION_DELAY_MS)).await;
            return Some(Outcome::Reply(ok(id, reconnected(), modern)));
        }
        if !TOOLS.contains(&format!("\"name\":\"{name}\"")) || name.is_empty() {
            return Some(Outcome::Reply(error(
                id,
                -32602,
                &format!("unknown tool `{name}`"),
                None,
            )));
        }
        let fault = self.take_fault(name);
        match fault {
            Fault::ExitBefore => std::process::exit(3),
            Fault::ErrorBefore => {
                return Some(Outcome::Reply(error(
                    id,
                    -32603,
                    "injected failure before execution",
                    None,
                )))
            }
            _ => {}
        }
        self.note(
            json!({"event":"executed","tool":name,"arguments":args,"raw_arguments":raw.as_ref().map(|r| &r.0),"raw_meta":raw.as_ref().and_then(|r| r.1.as_ref()),"pid":std::process::id(),"authorization":out.auth,"x_api_key":out.api_key,"traceparent_header":out.traceparent}),
        );
        let text = match name {
            "get_balance" => format!(
                "balance of {}: 1200.00 EUR",
                args["account"].as_str().unwrap_or("?")
            ),
            "get_account" => {
                let account = args["account"].as_str().unwrap_or("?");
                // The version comes from the faults file's `_versions` map
                // (default "v1"), so tests can change the resource under a
                // pending approval.
                let version = self
                    .faults
                    .as_ref()
                    .and_then(|f| std::fs::read_to_string(f).ok())
                    .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                    .and_then(|v| v["_versions"][account].as_str().map(str::to_owned))
                    .unwrap_or_else(|| "v1".to_owned());
                let result = json!({
                    "content":[{"type":"text","text":format!("account {account}")}],
                    "structuredContent":{"account":account,"version":version},
                    "isError":false
                });
                return self.finish(id, result, fault, modern).await;
            }
            "charge_card" => {
                let n = self.charges.fetch_add(1, Ordering::Relaxed) + 1;
                format!(
                    "charged {} to {} (charge ch_{}_{n})",
                    args["amount"],
                    args["account"].as_str().unwrap_or("?"),
                    self.charge_prefix
                )
            }
            "refund" => format!("refunded {}", args["charge"].as_str().unwrap_or("?")),
            "notify_later" => {
                // After answering, say something that belongs to no request:
                // it must travel on the standalone stream.
                let standalone = out.standalone.clone();
                let text = args["text"].as_str().unwrap_or("later").to_owned();
                // `list_changed: true` announces a changed tool list instead.
                let list_changed = args["list_changed"].as_bool() == Some(true);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let n = if list_changed {
                        json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"})
                    } else {
                        json!({"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":text}})
                    };
                    let _ = standalone.send(n).await;
                });
                "will notify".to_owned()
            }
            "close_account" => format!("closed {}", args["account"].as_str().unwrap_or("?")),
            "transfer" => format!(
                "moved {} from {} to {}",
                args["amount"], args["from"], args["to"]
            ),
            "slow_report" => {
                let steps = args["steps"].as_u64().unwrap_or(3).min(20);
                let token = params
                    .get("_meta")
                    .and_then(|m| m.get("progressToken"))
                    .cloned();
                for i in 1..=steps {
                    if let Some(t) = &token {
                        let p = json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":t,"progress":i,"total":steps}});
                        let _ = out.tx.send(p).await;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                format!("report done in {steps} steps")
            }
            "ask_model" => {
                let q = args["question"].as_str().unwrap_or("?").to_owned();
                let answer = out
                    .ask("sampling/createMessage", json!({"messages":[{"role":"user","content":{"type":"text","text":q}}],"maxTokens":50}))
                    .await;
                match answer.and_then(|a| {
                    a.get("result")?
                        .get("content")?
                        .get("text")?
                        .as_str()
                        .map(str::to_owned)
                }) {
                    Some(t) => format!("the model said: {t}"),
                    None => "the model did not answer".to_owned(),
                }
            }
            _ => String::new(),
        };
        let mut result = json!({"content":[{"type":"text","text":text}],"isError":false});
        if name == "charge_card" {
            // The charge as data, its amount the number the server read:
            // what a client stores, and what a replay must give back as it
            // was (the chaos driver compares it byte for byte).
            result["structuredContent"] =
                json!({"amount": args["amount"], "account": args["account"]});
        }
        self.finish(id, result, fault, modern).await
    }

    async fn finish(
        &self,
        id: Value,
        result: Value,
        fault: Fault,
        modern: bool,
    ) -> Option<Outcome> {
        match fault {
            Fault::Delay(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            Fault::ExitAfter => std::process::exit(4),
            Fault::DropSession => return Some(Outcome::DropSession),
            Fault::CancelledAfter => {
                return Some(Outcome::Reply(error(id, -32800, "Request cancelled", None)))
            }
            _ => {}
        }
        Some(Outcome::Reply(ok(id, result, modern)))
    }
}

/// The `params.arguments` and `params._meta` texts exactly as they arrived
/// (for the record).
fn raw_arguments(message: &str) -> Option<(String, Option<String>)> {
    #[derive(serde::Deserialize)]
    struct Msg<'a> {
        #[serde(borrow)]
        params: Params<'a>,
    }
    #[derive(serde::Deserialize)]
    struct Params<'a> {
        #[serde(borrow)]
        arguments: Option<&'a serde_json::value::RawValue>,
        #[serde(borrow, rename = "_meta")]
        meta: Option<&'a serde_json::value::RawValue>,
    }
    let m: Msg = serde_json::from_str(message).ok()?;
    let args = m.params.arguments.map(|a| a.get().to_owned())?;
    Some((args, m.params.meta.map(|a| a.get().to_owned())))
}

fn ok(id: Value, mut result: Value, modern: bool) -> Value {
    if modern {
        result["resultType"] = json!("complete");
    }
    json!({"jsonrpc":"2.0","id":id,"result":result})
}

fn error(id: Value, code: i64, message: &str, data: Option<Value>) -> Value {
    let mut e = json!({"code":code,"message":message});
    if let Some(d) = data {
        e["data"] = d;
    }
    json!({"jsonrpc":"2.0","id":id,"error":e})
}

fn new_out(tx: mpsc::Sender<Value>, standalone: mpsc::Sender<Value>) -> Out {
    Out {
        tx,
        pending: Arc::new(Mutex::new(HashMap::new())),
        next: Arc::new(AtomicU64::new(1)),
        standalone,
        auth: None,
        api_key: None,
        traceparent: None,
    }
}

async fn run_stdio(server: Arc<Server>) {
    let (tx, mut rx) = mpsc::channel::<Value>(256);
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(v) = rx.recv().await {
            let mut line = v.to_string().into_bytes();
            line.push(b'\n');
            if stdout.write_all(&line).await.is_err() || stdout.flush().await.is_err() {
                break;
            }
        }
    });
    let out = new_out(tx.clone(), tx);
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(mut msg) = serde_json::from_str::<Value>(&line) else {
            let _ = out
                .tx
                .send(error(Value::Null, -32700, "parse error", None))
                .await;
            continue;
        };
        if msg.get("method").is_none() {
            out.answer(&msg);
            continue;
        }
        msg["__raw"] = Value::String(line);
        let (server, out) = (server.clone(), out.clone());
        tokio::spawn(async move {
            if let Some(Outcome::Reply(r)) = server.handle(&msg, &out).await {
                let _ = out.tx.send(r).await;
            }
        });
    }
    if server.stubborn {
        // Test mode: ignore stdin EOF (and SIGTERM, see main) so that the
        // gateway's shutdown has to escalate to SIGKILL.
        eprintln!("payments_server: stdin closed, staying up (stubborn)");
        std::future::pending::<()>().await;
    }
    eprintln!("payments_server: stdin closed, exiting");
    drop(out);
    let _ = tokio::time::timeout(Duration::from_secs(1), writer).await;
}

struct HttpSession {
    out: Out,
    /// Taken by the session's GET stream.
    standalone: Mutex<Option<mpsc::Receiver<Value>>>,
}

struct Http {
    server: Arc<Server>,
    sessions: Mutex<HashMap<String, Arc<HttpSession>>>,
    /// Answers of `test_reconnection` calls whose stream was closed before
    /// them, by the last event id the client saw (SEP-1699).
    resumes: Mutex<HashMap<String, Value>>,
}

/// The conformance suite's SSE polling tool (SEP-1699).
const RECONNECTION_TOOL: &str = "test_reconnection";

/// How long `test_reconnection` works between its note and its answer.
const RECONNECTION_DELAY_MS: u64 = 600;

fn reconnected() -> Value {
    json!({"content":[{"type":"text","text":"reconnected: the answer came after the stream was resumed"}],"isError":false})
}

fn reply(status: StatusCode, v: &Value) -> Response {
    (
        status,
        [("content-type", "application/json")],
        v.to_string(),
    )
        .into_response()
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// A 2026-07-28 server must check the metadata headers against the body.
fn modern_headers_match(headers: &HeaderMap, msg: &Value, version: &str) -> Result<(), String> {
    if header(headers, "mcp-protocol-version") != Some(version) {
        return Err("MCP-Protocol-Version header does not match _meta".into());
    }
    let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
    if header(headers, "mcp-method") != Some(method) {
        return Err("Mcp-Method header does not match the body".into());
    }
    let field = match method {
        "tools/call" | "prompts/get" => "name",
        "resources/read" => "uri",
        _ => return Ok(()),
    };
    let body = msg
        .pointer(&format!("/params/{field}"))
        .and_then(Value::as_str)
        .unwrap_or("");
    if header(headers, "mcp-name") != Some(body) {
        return Err(format!(
            "Mcp-Name header does not match the body value `{body}`"
        ));
    }
    Ok(())
}

async fn http_post(State(st): State<Arc<Http>>, headers: HeaderMap, body: Bytes) -> Response {
    let Ok(mut msg) = serde_json::from_slice::<Value>(&body) else {
        return reply(
            StatusCode::BAD_REQUEST,
            &error(Value::Null, -32700, "parse error", None),
        );
    };
    msg["__raw"] = Value::String(String::from_utf8_lossy(&body).into_owned());
    let method = msg
        .get("method")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let sid = header(&headers, "mcp-session-id").map(str::to_owned);
    let version = msg
        .pointer("/params/_meta/io.modelcontextprotocol~1protocolVersion")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let mut new_session = None;
    let mut out = if method == "initialize" {
        let id = format!("up-{:032x}", rand::random::<u128>());
        let (tx, _) = mpsc::channel(1);
        let (stx, srx) = mpsc::channel(64);
        let session = Arc::new(HttpSession {
            out: new_out(tx, stx),
            standalone: Mutex::new(Some(srx)),
        });
        new_session = Some((id, session.clone()));
        session.out.clone()
    } else if let Some(v) = &version {
        if let Err(why) = modern_headers_match(&headers, &msg, v) {
            let id = msg.get("id").cloned().unwrap_or(Value::Null);
            return reply(
                StatusCode::BAD_REQUEST,
                &error(id, -32020, &format!("Header mismatch: {why}"), None),
            );
        }
        let (tx, _) = mpsc::channel(1);
        new_out(tx.clone(), tx)
    } else {
        let Some(session) = sid
            .as_ref()
            .and_then(|s| st.sessions.lock().ok()?.get(s).cloned())
        else {
            return reply(
                StatusCode::NOT_FOUND,
                &error(Value::Null, -32600, "session not found", None),
            );
        };
        session.out.clone()
    };
    out.auth = header(&headers, "authorization").map(str::to_owned);
    out.api_key = header(&headers, "x-api-key").map(str::to_owned);
    out.traceparent = header(&headers, "traceparent").map(str::to_owned);
    if msg.get("method").is_none() {
        out.answer(&msg);
        return StatusCode::ACCEPTED.into_response();
    }
    if msg.get("id").is_none() {
        let _ = st.server.handle(&msg, &out).await;
        return StatusCode::ACCEPTED.into_response();
    }
    // SEP-1699: in a session, `test_reconnection` answers with a priming
    // event and closes the stream; the answer waits for a GET that names
    // that event in `Last-Event-ID`.
    let reconnection = method == "tools/call"
        && msg.pointer("/params/name").and_then(Value::as_str) == Some(RECONNECTION_TOOL)
        && sid.is_some();
    if reconnection {
        let event = format!("rc-{:016x}", rand::random::<u64>());
        let id = msg.get("id").cloned().unwrap_or(Value::Null);
        let answer = json!({"jsonrpc":"2.0","id":id,"result":reconnected()});
        if let Ok(mut r) = st.resumes.lock() {
            r.insert(event.clone(), answer);
        }
        let mut r = Response::new(Body::from(format!("id: {event}\nretry: 100\ndata: \n\n")));
        r.headers_mut().insert(
            "content-type",
            HeaderValue::from_static("text/event-stream"),
        );
        return r;
    }
    // Per-request stream: related messages first, then the answer.
    let (tx, mut rx) = mpsc::channel::<Value>(64);
    out.tx = tx;
    if let (Some((id, session)), Ok(mut map)) = (&new_session, st.sessions.lock()) {
        map.insert(id.clone(), session.clone());
    }
    let server = st.server.clone();
    tokio::spawn(async move {
        let last = match server.handle(&msg, &out).await {
            Some(Outcome::Reply(r)) => r,
            // Marker: answer nothing and break the connection.
            Some(Outcome::DropSession) => json!({"__drop_session__": true}),
            None => return,
        };
        let _ = out.tx.send(last).await;
    });
    let first = rx
        .recv()
        .await
        .filter(|v| v.get("__drop_session__").is_none());
    let mut resp = match first {
        Some(v) if v.get("method").is_none() => reply(StatusCode::OK, &v),
        None => {
            // drop_session: forget the session and break the connection mid-response.
            if let (Some(s), Ok(mut map)) = (&sid, st.sessions.lock()) {
                map.remove(s);
            }
            let broken = futures_util::stream::once(async {
                Err::<Bytes, std::io::Error>(std::io::Error::other("session dropped"))
            });
            let mut r = Response::new(Body::from_stream(broken));
            r.headers_mut().insert(
                "content-type",
                HeaderValue::from_static("text/event-stream"),
            );
            r
        }
        Some(first) => {
            let frames = futures_util::stream::unfold(
                (Some(first), rx, false),
                |(next, mut rx, done)| async move {
                    if done {
                        return None;
                    }
                    let v = match next {
                        Some(v) => v,
                        None => rx.recv().await?,
                    };
                    let last = v.get("method").is_none();
                    Some((
                        Ok::<Bytes, Infallible>(Bytes::from(format!(
                            "event: message\ndata: {v}\n\n"
                        ))),
                        (None, rx, last),
                    ))
                },
            );
            let mut r = Response::new(Body::from_stream(frames));
            r.headers_mut().insert(
                "content-type",
                HeaderValue::from_static("text/event-stream"),
            );
            r
        }
    };
    if let Some((id, _)) = new_session {
        if let Ok(v) = HeaderValue::try_from(id) {
            resp.headers_mut().insert("mcp-session-id", v);
        }
    }
    resp
}

async fn http_get(State(st): State<Arc<Http>>, headers: HeaderMap) -> Response {
    let session =
        header(&headers, "mcp-session-id").and_then(|s| st.sessions.lock().ok()?.get(s).cloned());
    let Some(session) = session else {
        return StatusCode::METHOD_NOT_ALLOWED.into_response();
    };
    if let Some(event) = header(&headers, "last-event-id") {
        let kept = st.resumes.lock().ok().and_then(|mut r| r.remove(event));
        let Some(answer) = kept else {
            return StatusCode::NOT_FOUND.into_response();
        };
        let mut r = Response::new(Body::from(format!(
            "id: {event}-1\nevent: message\ndata: {answer}\n\n"
        )));
        r.headers_mut().insert(
            "content-type",
            HeaderValue::from_static("text/event-stream"),
        );
        return r;
    }
    let Some(rx) = session.standalone.lock().ok().and_then(|mut r| r.take()) else {
        return StatusCode::CONFLICT.into_response();
    };
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        let frame = tokio::select! {
            v = rx.recv() => format!("event: message\ndata: {}\n\n", v?),
            _ = tokio::time::sleep(Duration::from_secs(15)) => ": keepalive\n\n".to_owned(),
        };
        Some((Ok::<Bytes, Infallible>(Bytes::from(frame)), rx))
    });
    let mut r = Response::new(Body::from_stream(frames));
    r.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    r
}

async fn http_delete(State(st): State<Arc<Http>>, headers: HeaderMap) -> StatusCode {
    if let (Some(s), Ok(mut m)) = (header(&headers, "mcp-session-id"), st.sessions.lock()) {
        m.remove(s);
    }
    StatusCode::OK
}

#[tokio::main]
async fn main() {
    let mut http = None;
    let mut record = None;
    let mut faults = None;
    let mut stubborn = false;
    let mut modern_only = false;
    let mut page_size = None;
    let mut definitions_at_start = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--http" => http = args.next(),
            "--record" => record = args.next().map(PathBuf::from),
            "--faults" => faults = args.next().map(PathBuf::from),
            "--stubborn" => stubborn = true,
            "--modern-only" => modern_only = true,
            "--page-size" => page_size = args.next().and_then(|n| n.parse().ok()),
            "--definitions-at-start" => definitions_at_start = true,
            other => {
                eprintln!("payments_server: unknown argument `{other}`; usage: payments_server [--http ADDR] [--record FILE] [--faults FILE] [--stubborn] [--modern-only] [--page-size N] [--definitions-at-start]");
                std::process::exit(2);
            }
        }
    }
    let defined_at_start = definitions_at_start.then(|| {
        faults
            .as_ref()
            .and_then(|f| std::fs::read_to_string(f).ok())
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|v| v.get("_define").cloned())
            .unwrap_or(Value::Null)
    });
    let server = Arc::new(Server {
        defined_at_start,
        record,
        faults,
        record_lock: Mutex::new(()),
        charges: AtomicU64::new(0),
        charge_prefix: format!("{:08x}", rand::random::<u32>()),
        stubborn,
        modern_only,
        page_size,
    });
    if stubborn {
        // Ignore SIGTERM: registering a handler replaces the default action.
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            tokio::spawn(async move {
                while term.recv().await.is_some() {
                    eprintln!("payments_server: SIGTERM ignored (stubborn)");
                }
            });
        }
    }
    match http {
        None => run_stdio(server).await,
        Some(addr) => {
            let listener = match tokio::net::TcpListener::bind(&addr).await {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("payments_server: cannot listen on {addr}: {e}");
                    std::process::exit(2);
                }
            };
            let local = listener.local_addr().map(|a| a.to_string()).unwrap_or(addr);
            eprintln!("payments_server: listening on {local}");
            let st = Arc::new(Http {
                server,
                sessions: Mutex::new(HashMap::new()),
                resumes: Mutex::new(HashMap::new()),
            });
            let app = Router::new()
                .route("/mcp", post(http_post).get(http_get).delete(http_delete))
                .with_state(st);
            let _ = axum::serve(listener, app).await;
        }
    }
}
