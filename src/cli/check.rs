//! `countersign check`: initialize each configured upstream and report
//! whether it is up, with the time `initialize` took, and list its tools with
//! their effective annotations. Also the tool listing behind
//! `countersign policy schema`.

use crate::cli::out::outln;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};

use crate::front::gateway::Gateway;
use crate::upstream::Passthrough;
use crate::wire::era::HANDSHAKE_VERSIONS;
use crate::wire::jsonrpc::{raw, Message};

/// The health of one upstream.
#[derive(Debug, Serialize)]
pub(crate) struct Health {
    /// Server name.
    pub server: String,
    /// Whether `initialize` succeeded.
    pub up: bool,
    /// How long `initialize` took, in milliseconds.
    pub latency_ms: f64,
    /// The server's `serverInfo`, when up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_info: Option<Value>,
    /// The failure, when down.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Each listed tool with its effective annotations (server hints, MCP
    /// defaults, operator overrides), as later stages will see them.
    pub tools: Vec<ToolHealth>,
    /// The running gateway's circuit breaker for this server (`closed`,
    /// `open`, `half-open`), when a gateway answers on `gateway.listen`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub circuit: Option<String>,
}

/// One tool as `check` reports it.
#[derive(Debug, Serialize)]
pub(crate) struct ToolHealth {
    /// Tool name.
    pub name: String,
    /// Effective `readOnly`.
    pub read_only: bool,
    /// Effective `destructive`.
    pub destructive: bool,
    /// Effective `idempotent`.
    pub idempotent: bool,
    /// Effective `openWorld`.
    pub open_world: bool,
    /// The configured `cache_ttl`, and whether it is used (only while the
    /// tool is read-only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<String>,
}

/// One tool of `check`'s text output: its name, what the gateway treats it
/// as (read-only, or a write and whether destructive) and the other
/// effective hints.
pub(crate) fn tool_line(t: &ToolHealth) -> String {
    let kind = match (t.read_only, t.destructive) {
        (true, _) => "read-only",
        (false, true) => "write, destructive",
        (false, false) => "write",
    };
    let mut line = format!(
        "{:<24} {kind}; idempotent {}, open world {}",
        t.name, t.idempotent, t.open_world
    );
    if let Some(cache) = &t.cache {
        line.push_str(&format!("; cache {cache}"));
    }
    line
}

/// What a fresh connection to an upstream says about itself.
struct Listing {
    /// `initialize` time.
    init_ms: f64,
    server_info: Option<Value>,
    /// The `tools` array of `tools/list`, when it answered.
    tools: Option<Value>,
}

fn result_of(resp: &Message) -> Value {
    resp.result
        .as_ref()
        .and_then(|r| serde_json::from_str(r.get()).ok())
        .unwrap_or(Value::Null)
}

/// Open a connection of its own to `server`, initialize, list the tools,
/// close it.
async fn initialize_and_list(gw: &Gateway, server: &str) -> Result<Listing, String> {
    let timeout = gw.config().call_timeout(server);
    let started = Instant::now();
    let (conn, _unsolicited) = gw.connect(server).await.map_err(|e| e.to_string())?;
    let init = Message::request(
        json!(1),
        "initialize",
        Some(raw(&json!({
            "protocolVersion": HANDSHAKE_VERSIONS[0],
            "capabilities": {},
            "clientInfo": { "name": "countersign", "version": env!("CARGO_PKG_VERSION") }
        }))),
    );
    let pass = |m| {
        Passthrough::new(m).map_err(|_| "internal: a tools/call is not a health check".to_owned())
    };
    let result = async {
        let resp = conn
            .call(pass(init)?, None, timeout, &Vec::new())
            .await
            .map_err(|e| e.to_string())?;
        if let Some(err) = &resp.error {
            return Err(format!("initialize was refused: {}", err.get()));
        }
        let init_ms = started.elapsed().as_secs_f64() * 1000.0;
        let server_info = result_of(&resp).get("serverInfo").cloned();
        let _ = conn
            .send(
                pass(Message::notification("notifications/initialized", None))?,
                &Vec::new(),
            )
            .await;
        // Every page: a tool on a later page is as real as one on the first.
        let mut tools: Option<Vec<Value>> = None;
        let mut cursor: Option<String> = None;
        for page in 0..100 {
            let params = cursor.take().map(|c| raw(&json!({ "cursor": c })));
            let request = Message::request(json!(2 + page), "tools/list", params);
            let Ok(answer) = conn.call(pass(request)?, None, timeout, &Vec::new()).await else {
                break;
            };
            let result = result_of(&answer);
            let Some(listed) = result.get("tools").and_then(Value::as_array) else {
                break;
            };
            tools
                .get_or_insert_with(Vec::new)
                .extend(listed.iter().cloned());
            cursor = result
                .get("nextCursor")
                .and_then(Value::as_str)
                .map(str::to_owned);
            if cursor.is_none() {
                break;
            }
        }
        let tools = tools.map(Value::Array);
        Ok(Listing {
            init_ms,
            server_info,
            tools,
        })
    }
    .await;
    conn.shutdown(gw.config().gateway.shutdown_grace).await;
    result
}

/// The `tools` array of `server`'s `tools/list`.
pub(crate) async fn list_tools(gw: &Gateway, server: &str) -> Result<Value, String> {
    initialize_and_list(gw, server)
        .await?
        .tools
        .ok_or_else(|| "tools/list returned no tools".to_owned())
}

/// Check every configured upstream, one after another, and add what the
/// running gateway (if one answers on `gateway.listen`) says of its
/// circuit breakers.
pub(crate) async fn check_all(gw: &Gateway) -> Vec<Health> {
    let health = running_health(gw).await;
    let circuits = health
        .as_ref()
        .and_then(|h| h.get("circuits")?.as_object().cloned());
    let mut out = Vec::new();
    for name in gw.config().servers.keys() {
        let mut h = check_one(gw, name).await;
        h.circuit = circuits
            .as_ref()
            .and_then(|c| c.get(name)?.as_str().map(str::to_owned));
        out.push(h);
    }
    out
}

/// The running gateway's `/healthz`, if one answers on `gateway.listen`
/// (503 included: it still says why).
pub(crate) async fn running_health(gw: &Gateway) -> Option<Value> {
    let url = format!("http://{}/healthz", gw.config().gateway.listen);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .ok()?;
    let bytes = client.get(url).send().await.ok()?.bytes().await.ok()?;
    serde_json::from_slice(&bytes).ok()
}

async fn check_one(gw: &Gateway, server: &str) -> Health {
    let started = Instant::now();
    match initialize_and_list(gw, server).await {
        Ok(listing) => {
            let mut tools = Vec::new();
            if let Some(list) = &listing.tools {
                gw.pipeline()
                    .catalog()
                    .capture(server, &json!({ "tools": list }).to_string());
                for name in list
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|t| t.get("name")?.as_str())
                {
                    let a = gw.pipeline().catalog().effective(server, name);
                    let cache = gw
                        .config()
                        .servers
                        .get(server)
                        .and_then(|s| s.tools.get(name)?.cache_ttl)
                        .map(|ttl| {
                            let ttl = humantime::format_duration(ttl);
                            if a.read_only {
                                format!("{ttl}")
                            } else {
                                tracing::warn!(server, tool = name, "cache_ttl ignored: the tool may write, and writes are never cached");
                                format!("{ttl}, ignored: the tool may write")
                            }
                        });
                    tools.push(ToolHealth {
                        cache,
                        name: name.to_owned(),
                        read_only: a.read_only,
                        destructive: a.destructive,
                        idempotent: a.idempotent,
                        open_world: a.open_world,
                    });
                }
            }
            Health {
                server: server.into(),
                up: true,
                latency_ms: listing.init_ms,
                server_info: listing.server_info,
                error: None,
                tools,
                circuit: None,
            }
        }
        Err(e) => Health {
            server: server.into(),
            up: false,
            latency_ms: started.elapsed().as_secs_f64() * 1000.0,
            server_info: None,
            error: Some(e),
            tools: Vec::new(),
            circuit: None,
        },
    }
}

/// `countersign check`: every server's health, tools and circuit.
pub(crate) async fn command(config: &std::path::Path, json: bool) -> anyhow::Result<ExitCode> {
    let gw = offline(crate::cli::files::load_config(config)?);
    let report = check_all(&gw).await;
    // The data dir holds arguments and keys: files or folders others on
    // this host can read are named (on stderr, so `--json` stays a report
    // of the servers).
    let data_dir = &gw.config().gateway.data_dir;
    let exposed = crate::store::private::exposed(data_dir);
    for path in exposed.iter().take(20) {
        eprintln!(
            "countersign: warning: {} is readable by other users of this host: chmod {} it",
            path.display(),
            if path.is_dir() { "700" } else { "600" }
        );
    }
    if exposed.len() > 20 {
        eprintln!(
            "countersign: warning: and {} more under {}",
            exposed.len() - 20,
            data_dir.display()
        );
    }
    if json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        // The running gateway's own store and webhooks, when one answers.
        let health = running_health(&gw).await;
        if let Some(store) = health
            .as_ref()
            .and_then(|h| h.get("store")?.as_str().map(str::to_owned))
        {
            outln!("{:<20} store {store}", "(gateway)");
        }
        for w in health
            .as_ref()
            .and_then(|h| h.get("webhooks")?.as_array().cloned())
            .unwrap_or_default()
        {
            let at = |k: &str| w[k].as_str().unwrap_or("never").to_owned();
            outln!(
                "{:<20} webhook  last success {}  last failure {}{}  (delivered {}, retried {}, gave up {})",
                w["webhook"].as_str().unwrap_or(""),
                at("last_success"),
                at("last_failure"),
                w["last_error"]
                    .as_str()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default(),
                w["delivered"],
                w["retried"],
                w["gave_up"],
            );
        }
        for h in &report {
            let state = if h.up { "up" } else { "down" };
            let detail = h.error.clone().unwrap_or_else(|| {
                h.server_info
                    .as_ref()
                    .map(|i| i.to_string())
                    .unwrap_or_default()
            });
            let circuit = h
                .circuit
                .as_deref()
                .map(|c| format!("circuit {c}  "))
                .unwrap_or_default();
            outln!(
                "{:<20} {:<5} {:>9.1} ms  {circuit}{}",
                h.server,
                state,
                h.latency_ms,
                detail
            );
            for t in &h.tools {
                outln!("  {}", tool_line(t));
            }
        }
    }
    let all_up = !report.is_empty() && report.iter().all(|h| h.up);
    Ok(if all_up {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// A gateway for commands that send no `tools/call` (`check`, `tools`,
/// `policy schema`): no ledger file, no policies, no audit log.
pub(crate) fn offline(config: crate::core::config::Config) -> std::sync::Arc<Gateway> {
    Gateway::new(
        config,
        std::sync::Arc::new(crate::store::MemoryStore::default()),
        crate::core::decision::Policies::empty(),
        None,
    )
}
