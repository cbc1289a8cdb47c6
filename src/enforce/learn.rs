//! Catalog learning as a service: the gateway keeps each server's tool list
//! itself, so that a call is classified by what the server declares whether
//! or not the client ever listed tools, and pins a tool's definition on
//! first use (DESIGN.md section 12).
//!
//! [`Learner::learn`] fetches the list when a call needs it;
//! [`Learner::observe`] learns from a page relayed to a client. Both say
//! which cached reads the listing made stale ([`Stale`]); the read path
//! forgets them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};

use super::permit::Upstream;
use crate::audit::AuditSink;
use crate::core::catalog::{self, Captured, Catalog, Definition};
use crate::core::config::Config;
use crate::core::time::{ms, Clock};
use crate::store::{Store, StoreError};

/// The most `tools/list` pages one catalog fetch reads.
const MAX_CATALOG_PAGES: usize = 100;

/// Which cached reads of a server a listing made stale.
pub(crate) enum Stale {
    /// Those of these tools (their definition changed, or they vanished).
    Tools(Vec<String>),
    /// All of them: the server said its list changed.
    Server,
}

/// The catalog, how it is fetched, and where first-use pins go.
pub(crate) struct Learner {
    config: Arc<Config>,
    catalog: Arc<Catalog>,
    /// Where first-use pins are recorded.
    store: Arc<dyn Store>,
    audit: Option<Arc<dyn AuditSink>>,
    clock: Arc<dyn Clock>,
    /// One catalog fetch at a time per server. A tokio mutex: held across
    /// the `tools/list` requests.
    fetching: HashMap<String, tokio::sync::Mutex<()>>,
    /// Tells the webhooks of changed definitions.
    announcer: Option<Arc<super::announce::Announcer>>,
}

impl Learner {
    /// A catalog of `config`'s servers, with their configured overrides.
    pub(crate) fn new(
        config: Arc<Config>,
        store: Arc<dyn Store>,
        audit: Option<Arc<dyn AuditSink>>,
        clock: Arc<dyn Clock>,
    ) -> Learner {
        let catalog = Arc::new(Catalog::new(
            config
                .servers
                .iter()
                .map(|(k, v)| (k.clone(), v.tools.clone()))
                .collect(),
        ));
        let fetching = config
            .servers
            .keys()
            .map(|k| (k.clone(), tokio::sync::Mutex::new(())))
            .collect();
        Learner {
            config,
            catalog,
            store,
            audit,
            clock,
            fetching,
            announcer: None,
        }
    }

    /// The same learner, telling `announcer` of changed definitions.
    pub(crate) fn announcing(mut self, announcer: Arc<super::announce::Announcer>) -> Learner {
        self.announcer = Some(announcer);
        self
    }

    /// The catalog (shared with the upstream connections, which mark a
    /// server's list stale when it says it changed).
    pub(crate) fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// Pins recorded on first use by earlier runs, from the store (at
    /// start, before serving). Returns how many.
    pub(crate) async fn load_pins(&self) -> Result<usize, StoreError> {
        let mut pins = Vec::new();
        for text in self.store.first_use_pins().await? {
            let pin: FirstUse = serde_json::from_str(&text).map_err(|e| StoreError::Corrupt {
                what: "tool pin",
                reason: e.to_string(),
                cause: Some(crate::store::Cause::new(e)),
            })?;
            pins.push((pin.server, pin.pin));
        }
        let n = pins.len();
        self.catalog.load_first_use(pins);
        Ok(n)
    }

    /// A `tools/list` page relayed to a client: learn from it (never
    /// altering it). Returns how many tools it listed, and which cached
    /// reads it made stale.
    pub(crate) fn observe(&self, server: &str, result: &str) -> (usize, Stale) {
        let captured = self.catalog.capture(server, result);
        let stale = self.noted(server, &captured);
        if !captured.learned.is_empty() {
            // Relayed pages are not awaited on: the pin is in force in
            // memory already, and recorded in the store shortly.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let store = self.store.clone();
                let server = server.to_owned();
                rt.spawn(async move { record_first_use(&*store, &server, captured.learned).await });
            }
        }
        (captured.tools, stale)
    }

    /// Know the tool before a call of it is judged. The list is fetched
    /// (every page) when the call names a tool it lacks (at most once per
    /// `catalog.unknown_tool_interval`), when it is older than
    /// `catalog.max_age`, and after the server said it changed. One fetch at
    /// a time per server; the others wait for it. A fetch that fails leaves
    /// the cautious defaults (write-capable).
    pub(crate) async fn learn<U: Upstream>(&self, server: &str, tool: &str, upstream: &U) -> Stale {
        if !self.due(server, tool, self.clock.now_ms()) {
            return Stale::Tools(Vec::new());
        }
        // The fetch in a box of its own: every call awaits `learn`, and
        // its future stays small when there is nothing to fetch (the fetch's
        // state, the upstream exchange's, is kilobytes, and a future is
        // copied whole wherever it is moved).
        Box::pin(self.fetch(server, tool, upstream)).await
    }

    /// Whether the list of `server` is to be fetched for a call of `tool`
    /// at `now` (see [`Learner::learn`]).
    fn due(&self, server: &str, tool: &str, now: i64) -> bool {
        let cfg = &self.config.catalog;
        match self.catalog.fetched_at(server) {
            None => true,
            Some(at) if now.saturating_sub(at) >= ms(cfg.max_age) => true,
            Some(at) => {
                !self.catalog.knows(server, tool)
                    && now.saturating_sub(at) >= ms(cfg.unknown_tool_interval)
            }
        }
    }

    /// Fetch the list of `server` (every page), one fetch at a time.
    async fn fetch<U: Upstream>(&self, server: &str, tool: &str, upstream: &U) -> Stale {
        let nothing = Stale::Tools(Vec::new());
        let Some(one) = self.fetching.get(server) else {
            return nothing;
        };
        let _one = one.lock().await;
        // Another call may have fetched it while this one waited.
        if !self.due(server, tool, self.clock.now_ms()) {
            return nothing;
        }
        let started = Instant::now();
        let mut cursor = None;
        let mut tools = Vec::new();
        // A bound on pages: a server whose cursors never end cannot hold
        // the call forever.
        for _ in 0..MAX_CATALOG_PAGES {
            let page = match upstream.list_tools(cursor.take()).await {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(server, "tool list not fetched: {e}");
                    return nothing;
                }
            };
            let Some(result) = page.result.as_ref() else {
                let error = page.error_summary().unwrap_or_else(|| "no result".into());
                tracing::warn!(server, %error, "tool list refused by the server");
                // A refusal is an answer: the next fetch waits its interval
                // (`catalog.unknown_tool_interval`) like any other, rather
                // than one per call. What was known stays; the cautious
                // defaults cover the rest.
                self.catalog.mark_fetched(server, self.clock.now_ms());
                return nothing;
            };
            tools.extend(catalog::page_tools(result.get()));
            cursor = serde_json::from_str::<Value>(result.get())
                .ok()
                .and_then(|v| v.get("nextCursor")?.as_str().map(str::to_owned));
            if cursor.is_none() {
                break;
            }
        }
        let stale = if cursor.is_some() {
            // Not every page was read: nothing may be taken as gone.
            tracing::warn!(
                server,
                pages = MAX_CATALOG_PAGES,
                "tool list has more pages than countersign reads"
            );
            let captured = self
                .catalog
                .capture(server, &json!({ "tools": tools }).to_string());
            let stale = self.noted(server, &captured);
            record_first_use(&*self.store, server, captured.learned).await;
            stale
        } else {
            let profile = upstream.client_profile();
            let captured = self.catalog.replace(server, &tools, &profile);
            let stale = self.noted(server, &captured);
            // Awaited: a pin must be on disk before calls are judged by it.
            record_first_use(&*self.store, server, captured.learned).await;
            stale
        };
        let tools = tools.len();
        self.catalog.mark_fetched(server, self.clock.now_ms());
        tracing::debug!(server, tools, elapsed = ?started.elapsed(), "tool list fetched");
        // Cached reads of tools whose definition changed or that vanished
        // are stale. A server that said its list changed has changed under
        // all of them: they all start over. A fetch made only because a new
        // stdio session (a new child) began keeps the others within their
        // `cache_ttl`.
        if self.catalog.take_said_changed(server) {
            Stale::Server
        } else {
            stale
        }
    }

    /// Say what a listing changed (the audit log and the log record it),
    /// and which cached reads it made stale.
    fn noted(&self, server: &str, captured: &Captured) -> Stale {
        if !captured.learned.is_empty() {
            let tools: Vec<Value> = captured
                .learned
                .iter()
                .map(|d| json!({"tool": d.name(), "digest": d.digest}))
                .collect();
            let mut f = serde_json::Map::new();
            f.insert("server".into(), json!(server));
            f.insert("tools".into(), Value::Array(tools));
            self.audit("tools_learned", f);
        }
        if !captured.changed.is_empty() || !captured.vanished.is_empty() {
            for ch in &captured.changed {
                let fields: Vec<&str> = ch.diff.iter().map(|d| d.pointer.as_str()).collect();
                tracing::warn!(server, tool = %ch.tool, before = %ch.before, after = %ch.after, changed = %fields.join(" "), "tool definition changed: calls need approval until `countersign tools accept {server}/{}`", ch.tool);
            }
            for t in &captured.vanished {
                tracing::warn!(server, tool = %t, "tool no longer listed by the server");
            }
            let mut f = serde_json::Map::new();
            f.insert("server".into(), json!(server));
            f.insert("changes".into(), json!(captured.changed));
            f.insert("vanished".into(), json!(captured.vanished));
            self.audit("tools_changed", f);
            if let Some(a) = &self.announcer {
                for ch in &captured.changed {
                    let mut f = serde_json::Map::new();
                    f.insert("server".into(), json!(server));
                    f.insert("tool".into(), json!(ch.tool));
                    f.insert("before".into(), json!(ch.before));
                    f.insert("after".into(), json!(ch.after));
                    f.insert(
                        "command".into(),
                        json!(format!("countersign tools accept {server}/{}", ch.tool)),
                    );
                    a.incident(crate::core::config::EventKind::ToolsChanged, None, f);
                }
            }
        }
        Stale::Tools(captured.touched())
    }

    fn audit(&self, kind: &'static str, fields: serde_json::Map<String, Value>) {
        if let Some(a) = &self.audit {
            a.record(kind, fields);
        }
    }
}

/// A first-use pin as stored.
#[derive(serde::Serialize, serde::Deserialize)]
struct FirstUse {
    server: String,
    pin: Definition,
}

/// Record first-use pins in the store, in one durable commit. A failure is
/// logged: the pins hold in memory for this run, and the next run pins on
/// first use again.
async fn record_first_use(store: &dyn Store, server: &str, learned: Vec<Definition>) {
    if learned.is_empty() {
        return;
    }
    let pins: Vec<(String, String)> = learned
        .into_iter()
        .filter_map(|pin| {
            let key = json!([server, pin.name()]).to_string();
            let value = FirstUse {
                server: server.to_owned(),
                pin,
            };
            Some((key, serde_json::to_string(&value).ok()?))
        })
        .collect();
    let n = pins.len();
    if let Err(e) = store.pin_first_use(pins).await {
        tracing::error!(server, tools = n, "first-use pins not recorded: {e}");
    }
}
