//! Tool annotations as the gateway trusts them (DESIGN.md section 5).
//!
//! `tools/list` results are read (never altered) to learn each tool's hints.
//! Hints from a server are untrusted: a missing or malformed hint takes the
//! MCP default, which for `readOnlyHint` is `false` (write-capable), and the
//! operator's `[servers.S.tools.T]` override wins over anything the server says.

use std::collections::{BTreeMap, HashMap};
use std::sync::RwLock;

use serde_json::Value;

use crate::core::config::ToolConfig;

/// What one `tools/list` result taught the catalog.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Captured {
    /// Tools listed.
    pub tools: usize,
    /// Tools new or with other hints than before (for the audit log).
    pub changed: Vec<String>,
}

/// Effective annotations of one tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Annotations {
    /// `readOnlyHint`: only an explicit `true` (or the operator) makes a tool read-only.
    pub read_only: bool,
    /// `destructiveHint` (default `true`).
    pub destructive: bool,
    /// `idempotentHint` (default `false`).
    pub idempotent: bool,
    /// `openWorldHint` (default `true`).
    pub open_world: bool,
}

impl Default for Annotations {
    /// The MCP defaults: the most cautious reading of a tool.
    fn default() -> Self {
        Annotations {
            read_only: false,
            destructive: true,
            idempotent: false,
            open_world: true,
        }
    }
}

impl Annotations {
    /// Read a tool's `annotations` object; anything that is not a boolean
    /// keeps the default.
    pub fn from_hints(hints: Option<&Value>) -> Annotations {
        let d = Annotations::default();
        let flag = |key: &str, default: bool| {
            hints
                .and_then(|h| h.get(key))
                .and_then(Value::as_bool)
                .unwrap_or(default)
        };
        Annotations {
            read_only: flag("readOnlyHint", d.read_only),
            destructive: flag("destructiveHint", d.destructive),
            idempotent: flag("idempotentHint", d.idempotent),
            open_world: flag("openWorldHint", d.open_world),
        }
    }

    /// Apply the operator's overrides.
    pub fn with_overrides(mut self, o: Option<&ToolConfig>) -> Annotations {
        if let Some(o) = o {
            self.read_only = o.read_only.unwrap_or(self.read_only);
            self.destructive = o.destructive.unwrap_or(self.destructive);
            self.idempotent = o.idempotent.unwrap_or(self.idempotent);
            self.open_world = o.open_world.unwrap_or(self.open_world);
        }
        self
    }
}

/// Per-server catalog of the tools last seen in a `tools/list` result.
#[derive(Debug, Default)]
pub struct Catalog {
    overrides: HashMap<String, BTreeMap<String, ToolConfig>>,
    seen: RwLock<HashMap<String, HashMap<String, Annotations>>>,
    /// When the gateway last fetched each server's whole list itself (unix
    /// ms); absent when never, or when the server said its list changed.
    fetched: RwLock<HashMap<String, i64>>,
}

impl Catalog {
    /// A catalog knowing the operator's overrides per server.
    pub fn new(overrides: HashMap<String, BTreeMap<String, ToolConfig>>) -> Catalog {
        Catalog {
            overrides,
            seen: RwLock::default(),
            fetched: RwLock::default(),
        }
    }

    /// Record the tools of a `tools/list` result (raw JSON text). Returns how
    /// many tools were read. A result that does not parse records nothing, so
    /// those tools keep the cautious defaults.
    pub fn capture(&self, server: &str, result: &str) -> Captured {
        let Ok(value) = serde_json::from_str::<Value>(result) else {
            return Captured::default();
        };
        let Some(tools) = value.get("tools").and_then(Value::as_array) else {
            return Captured::default();
        };
        let mut found = HashMap::new();
        for tool in tools {
            if let Some(name) = tool.get("name").and_then(Value::as_str) {
                found.insert(
                    name.to_owned(),
                    Annotations::from_hints(tool.get("annotations")),
                );
            }
        }
        let mut out = Captured {
            tools: found.len(),
            changed: Vec::new(),
        };
        if let Ok(mut seen) = self.seen.write() {
            let known = seen.entry(server.to_owned()).or_default();
            for (name, hints) in &found {
                if known.get(name) != Some(hints) {
                    out.changed.push(name.clone());
                }
            }
            // Pagination: later pages add to what earlier pages said.
            known.extend(found);
        }
        out.changed.sort();
        out
    }

    /// Whether `server` listed `tool`.
    pub fn knows(&self, server: &str, tool: &str) -> bool {
        self.seen
            .read()
            .is_ok_and(|s| s.get(server).is_some_and(|t| t.contains_key(tool)))
    }

    /// When the gateway last fetched `server`'s whole list (unix ms).
    pub fn fetched_at(&self, server: &str) -> Option<i64> {
        self.fetched.read().ok()?.get(server).copied()
    }

    /// The gateway fetched `server`'s whole list at `now_ms`.
    pub fn mark_fetched(&self, server: &str, now_ms: i64) {
        if let Ok(mut f) = self.fetched.write() {
            f.insert(server.to_owned(), now_ms);
        }
    }

    /// `server` said its list changed (`notifications/tools/list_changed`):
    /// the next call fetches it again.
    pub fn mark_stale(&self, server: &str) {
        if let Ok(mut f) = self.fetched.write() {
            f.remove(server);
        }
    }

    /// Effective annotations of `server/tool`: server hints (or MCP defaults
    /// when the tool was never listed), then operator overrides.
    pub fn effective(&self, server: &str, tool: &str) -> Annotations {
        let hinted = self
            .seen
            .read()
            .ok()
            .and_then(|s| s.get(server).and_then(|t| t.get(tool)).copied())
            .unwrap_or_default();
        hinted.with_overrides(self.overrides.get(server).and_then(|t| t.get(tool)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_hints_stay_cautious() {
        let a = Annotations::from_hints(Some(&serde_json::json!({"readOnlyHint": "yes"})));
        assert!(!a.read_only);
        assert!(a.destructive);
        let b = Annotations::from_hints(Some(
            &serde_json::json!({"readOnlyHint": true, "destructiveHint": false}),
        ));
        assert!(b.read_only && !b.destructive);
        assert_eq!(Annotations::from_hints(None), Annotations::default());
    }

    #[test]
    fn capture_and_override() {
        let mut o = HashMap::new();
        let mut tools = BTreeMap::new();
        tools.insert(
            "sneaky".to_owned(),
            ToolConfig {
                read_only: Some(false),
                ..Default::default()
            },
        );
        tools.insert(
            "plain".to_owned(),
            ToolConfig {
                read_only: Some(true),
                ..Default::default()
            },
        );
        o.insert("s".to_owned(), tools);
        let c = Catalog::new(o);
        let n = c.capture(
            "s",
            r#"{"tools":[{"name":"sneaky","annotations":{"readOnlyHint":true}},{"name":"get","annotations":{"readOnlyHint":true}},{"name":"plain"}]}"#,
        );
        assert_eq!(n.tools, 3);
        assert_eq!(n.changed, vec!["get", "plain", "sneaky"]);
        let again = c.capture(
            "s",
            r#"{"tools":[{"name":"get","annotations":{"readOnlyHint":false}},{"name":"plain"}]}"#,
        );
        assert_eq!(again.changed, vec!["get"], "only what changed");
        c.capture(
            "s",
            r#"{"tools":[{"name":"get","annotations":{"readOnlyHint":true}}]}"#,
        );
        assert!(
            !c.effective("s", "sneaky").read_only,
            "operator wins over the server"
        );
        assert!(c.effective("s", "get").read_only);
        assert!(c.effective("s", "plain").read_only);
        assert!(!c.effective("s", "never-listed").read_only);
        assert!(!c.effective("other", "get").read_only);
    }
}
