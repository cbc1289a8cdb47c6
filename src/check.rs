//! `countersign check`: initialize each configured upstream and report
//! whether it is up, with the time `initialize` took, and list its tools with
//! their effective annotations.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};

use crate::jsonrpc::{raw, Message};
use crate::relay::session::Gateway;
use crate::relay::HANDSHAKE_VERSIONS;

/// The health of one upstream.
#[derive(Debug, Serialize)]
pub struct Health {
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
}

/// One tool as `check` reports it.
#[derive(Debug, Serialize)]
pub struct ToolHealth {
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
}

/// The `tools` array of `server`'s `tools/list` (initializing a connection
/// of its own, then closing it).
pub async fn list_tools(gw: &Gateway, server: &str) -> Result<Value, String> {
    let timeout = gw
        .config
        .servers
        .get(server)
        .map_or(Duration::from_secs(30), |c| c.call_timeout);
    let (conn, _unsolicited) = gw.connect(server).await.map_err(|e| e.to_string())?;
    let init = Message::request(
        json!(1),
        "initialize",
        Some(raw(&json!({
            "protocolVersion": HANDSHAKE_VERSIONS[0],
            "capabilities": {},
            "clientInfo": { "name": "countersign-policy-schema", "version": env!("CARGO_PKG_VERSION") }
        }))),
    );
    let result = async {
        let resp = conn
            .call(init, None, timeout, &Vec::new())
            .await
            .map_err(|e| e.to_string())?;
        if resp.error.is_some() {
            return Err("initialize was refused".to_owned());
        }
        let _ = conn
            .send(
                Message::notification("notifications/initialized", None),
                &Vec::new(),
            )
            .await;
        let list = conn
            .call(
                Message::request(json!(2), "tools/list", None),
                None,
                timeout,
                &Vec::new(),
            )
            .await
            .map_err(|e| e.to_string())?;
        let result: Value = list
            .result
            .as_ref()
            .and_then(|r| serde_json::from_str(r.get()).ok())
            .unwrap_or(Value::Null);
        result
            .get("tools")
            .cloned()
            .ok_or_else(|| "tools/list returned no tools".to_owned())
    }
    .await;
    conn.shutdown(gw.config.gateway.shutdown_grace).await;
    result
}

/// Check every configured upstream, one after another.
pub async fn check_all(gw: &Gateway) -> Vec<Health> {
    let mut out = Vec::new();
    for name in gw.config.servers.keys() {
        out.push(check_one(gw, name).await);
    }
    out
}

async fn check_one(gw: &Gateway, server: &str) -> Health {
    let started = Instant::now();
    let timeout = gw
        .config
        .servers
        .get(server)
        .map_or(Duration::from_secs(30), |c| c.call_timeout);
    let result = async {
        let (conn, _unsolicited) = gw.connect(server).await.map_err(|e| e.to_string())?;
        let init = Message::request(
            json!(1),
            "initialize",
            Some(raw(&json!({
                "protocolVersion": HANDSHAKE_VERSIONS[0],
                "capabilities": {},
                "clientInfo": { "name": "countersign-check", "version": env!("CARGO_PKG_VERSION") }
            }))),
        );
        let answer = conn.call(init, None, timeout, &Vec::new()).await;
        let listed = match &answer {
            Ok(r) if r.error.is_none() => {
                let _ = conn
                    .send(
                        Message::notification("notifications/initialized", None),
                        &Vec::new(),
                    )
                    .await;
                let list = Message::request(json!(2), "tools/list", None);
                conn.call(list, None, timeout, &Vec::new()).await.ok()
            }
            _ => None,
        };
        conn.shutdown(gw.config.gateway.shutdown_grace).await;
        let resp = answer.map_err(|e| e.to_string())?;
        if let Some(err) = &resp.error {
            return Err(format!("initialize was refused: {}", err.get()));
        }
        let result: Value = resp
            .result
            .as_ref()
            .and_then(|r| serde_json::from_str(r.get()).ok())
            .unwrap_or(Value::Null);
        let mut tools = Vec::new();
        if let Some(list) = listed.and_then(|l| l.result) {
            gw.catalog.capture(server, list.get());
            let names: Vec<String> = serde_json::from_str::<Value>(list.get())
                .ok()
                .and_then(|v| v.get("tools")?.as_array().cloned())
                .unwrap_or_default()
                .iter()
                .filter_map(|t| t.get("name")?.as_str().map(str::to_owned))
                .collect();
            for name in names {
                let a = gw.catalog.effective(server, &name);
                tools.push(ToolHealth {
                    name,
                    read_only: a.read_only,
                    destructive: a.destructive,
                    idempotent: a.idempotent,
                    open_world: a.open_world,
                });
            }
        }
        Ok((result.get("serverInfo").cloned(), tools))
    }
    .await;
    let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
    match result {
        Ok((info, tools)) => Health {
            server: server.into(),
            up: true,
            latency_ms,
            server_info: info,
            error: None,
            tools,
        },
        Err(e) => Health {
            server: server.into(),
            up: false,
            latency_ms,
            server_info: None,
            error: Some(e),
            tools: Vec::new(),
        },
    }
}
