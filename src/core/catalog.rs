//! Each upstream's tool catalog as the gateway keeps it, with definition
//! digests and pins (DESIGN.md section 12).
//!
//! - A tool's **definition** is the part of its `tools/list` entry that says
//!   what it does: `{name, title, description, inputSchema, outputSchema,
//!   annotations}` (absent members omitted). Its **digest** is `"sha256:" +
//!   hex(SHA-256(JCS(definition)))`.
//! - A **pin** is the definition the operator trusts: an entry of
//!   `policies/tools.lock` (a file in git), else the definition first seen
//!   (trust on first use, recorded in the store). The lock wins.
//! - A listed definition whose digest is not the pin's is **changed**: the
//!   tool entity's `definitionChanged` is true, and its hints are read no
//!   looser than the pin's, so a write that starts to call itself read-only
//!   is still a write until the operator accepts it.
//! - A pinned tool that a complete listing no longer holds is
//!   **unavailable**.
//!
//! The catalog is one per server, not per session: where a server's tools
//! differ per session (a stdio child per session), the latest listing is
//! what every session's calls are judged by, and a definition that differs
//! from the pin is a change whichever session listed it.

use parking_lot::RwLock;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::core::annotations::Annotations;
pub use crate::core::approval::{diff, Change, DefinitionChange};
use crate::core::canonical::jcs;
use crate::core::config::ToolConfig;
use crate::core::FastMap;

/// The lock file in the policy folder.
pub const LOCK_FILE: &str = "tools.lock";

/// The profile of a client, by the capabilities it declared (`null` when
/// none): the key under which [`Catalog::replace`] compares complete
/// listings. Two clients that declared the same capabilities are one profile.
pub fn client_profile(capabilities: Option<&Value>) -> String {
    let caps = capabilities
        .cloned()
        .unwrap_or_else(|| Value::Object(Default::default()));
    let digest = Sha256::digest(jcs(&caps).as_bytes());
    hex::encode(&digest[..8])
}

/// The members of a `tools/list` entry that define a tool.
pub const DEFINITION_FIELDS: [&str; 6] = [
    "name",
    "title",
    "description",
    "inputSchema",
    "outputSchema",
    "annotations",
];

/// One tool's definition and its digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Definition {
    /// `sha256:` + hex SHA-256 of the JCS of `definition`.
    pub digest: String,
    /// The defining members of the tool's `tools/list` entry.
    pub definition: Value,
}

impl Definition {
    /// The definition of one `tools/list` entry; `None` when it has no
    /// string `name`.
    pub fn of(tool: &Value) -> Option<Definition> {
        tool.get("name")?.as_str()?;
        let mut body = serde_json::Map::new();
        for field in DEFINITION_FIELDS {
            if let Some(v) = tool.get(field) {
                body.insert(field.to_owned(), v.clone());
            }
        }
        let body = Value::Object(body);
        Some(Definition {
            digest: digest_of(&body),
            definition: body,
        })
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        self.definition
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    /// The hints this definition declares (MCP defaults where absent).
    pub fn hints(&self) -> Annotations {
        Annotations::from_hints(self.definition.get("annotations"))
    }

    /// Whether `digest` is the digest of `definition` (a lock entry edited
    /// by hand would not be).
    pub fn is_consistent(&self) -> bool {
        digest_of(&self.definition) == self.digest
    }
}

/// `sha256:` + hex SHA-256 of the JCS of a definition.
pub fn digest_of(definition: &Value) -> String {
    format!(
        "sha256:{}",
        hex::encode(Sha256::digest(jcs(definition).as_bytes()))
    )
}

/// `policies/tools.lock`: the definitions an operator pinned, per server
/// and tool. JSON with sorted keys, so that a change reads well in review.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolLock {
    /// Format version (1).
    pub version: u32,
    /// Server → tool → pinned definition.
    pub servers: BTreeMap<String, BTreeMap<String, Definition>>,
}

/// Why a tools.lock file was refused.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Not the lock format.
    #[error("tools.lock does not parse: {0}")]
    Parse(String),
    /// A version this build does not know.
    #[error("tools.lock has version {0}; this countersign reads version 1")]
    Version(u32),
    /// An entry whose digest is not its definition's.
    #[error("tools.lock entry {server}/{tool}: {why} (edit it with `countersign tools pin` or `tools accept`, not by hand)")]
    Entry {
        /// Server.
        server: String,
        /// Tool (the key).
        tool: String,
        /// What is wrong.
        why: &'static str,
    },
}

impl ToolLock {
    /// Parse and check a lock file: each digest must be its definition's,
    /// and each definition must name the tool it is filed under, so that
    /// a hand edit cannot pin one thing while showing another.
    pub fn parse(text: &str) -> Result<ToolLock, LockError> {
        let lock: ToolLock =
            serde_json::from_str(text).map_err(|e| LockError::Parse(e.to_string()))?;
        if lock.version != 1 {
            return Err(LockError::Version(lock.version));
        }
        for (server, tools) in &lock.servers {
            for (tool, def) in tools {
                let bad = |why| LockError::Entry {
                    server: server.clone(),
                    tool: tool.clone(),
                    why,
                };
                if !def.is_consistent() {
                    return Err(bad("its digest is not the digest of its definition"));
                }
                if def.name() != tool {
                    return Err(bad("its definition names another tool"));
                }
            }
        }
        Ok(lock)
    }

    /// The file's text (pretty JSON, sorted keys, trailing newline).
    pub fn to_text(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s
    }

    /// The pinned definition of `server/tool`.
    pub fn get(&self, server: &str, tool: &str) -> Option<&Definition> {
        self.servers.get(server)?.get(tool)
    }

    /// Pin `def` for `server`.
    pub fn set(&mut self, server: &str, def: Definition) {
        self.version = 1;
        self.servers
            .entry(server.to_owned())
            .or_default()
            .insert(def.name().to_owned(), def);
    }
}

/// Where a pin comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PinSource {
    /// `policies/tools.lock`.
    Lock,
    /// The first definition the gateway saw, recorded in the store.
    FirstUse,
}

/// A definition change, for the audit log.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolChange {
    /// The tool.
    pub tool: String,
    /// The digest listed before (or pinned, when not listed before).
    pub before: String,
    /// The digest listed now.
    pub after: String,
    /// The pinned digest (what calls are judged against).
    pub pinned: String,
    /// Field-level difference from `before`.
    pub diff: Vec<Change>,
}

/// What one listing taught the catalog.
#[derive(Debug, Default)]
pub struct Captured {
    /// Tools listed.
    pub tools: usize,
    /// Tools seen for the first time, with no pin: now pinned on first use
    /// (to be recorded in the store).
    pub learned: Vec<Definition>,
    /// Tools whose definition is not the one listed (or pinned) before.
    pub changed: Vec<ToolChange>,
    /// Tools a complete listing no longer holds.
    pub vanished: Vec<String>,
}

impl Captured {
    /// The tools whose cached reads must go.
    pub fn touched(&self) -> Vec<String> {
        self.changed
            .iter()
            .map(|c| c.tool.clone())
            .chain(self.vanished.iter().cloned())
            .collect()
    }
}

/// One tool as calls are judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolView {
    /// Effective annotations (hints no looser than the pin's, then the
    /// operator's overrides).
    pub annotations: Annotations,
    /// The listed definition's digest, when listed.
    pub digest: Option<String>,
    /// Listed with another definition than the pinned one.
    pub changed: bool,
    /// Not in the server's complete listing (pinned and gone, or never
    /// listed at all): whatever answers to the name is not a tool anyone
    /// reviewed, and no proposal is made for it.
    pub unavailable: bool,
    /// Another listed tool whose name this one's looks like (the same UTS
    /// #39 skeleton: `ｃｈａｒｇｅ_card` and `charge_card`), for reviewers.
    pub lookalike: Option<String>,
}

#[derive(Debug, Default)]
struct Listed {
    tools: FastMap<String, Definition>,
    /// A complete listing (every page, fetched by the gateway) was read.
    complete: bool,
    /// The names in the last complete listing fetched for each client
    /// profile (see [`Catalog::replace`]).
    by_profile: HashMap<String, std::collections::BTreeSet<String>>,
    /// Listed names that look like another listed name, and that name
    /// (found when a listing is taken, not on a call's path).
    lookalikes: HashMap<String, String>,
    /// The `execution.taskSupport` each tool declares, when it declares one
    /// (MCP tasks; not part of the definition digest).
    task_support: HashMap<String, String>,
}

/// Per-server catalog of tool definitions and pins.
#[derive(Debug, Default)]
pub struct Catalog {
    /// Keyed by configured server names, and pins by names a server
    /// listed: no client chooses them, so foldhash serves (read per call).
    overrides: FastMap<String, BTreeMap<String, ToolConfig>>,
    listed: RwLock<FastMap<String, Listed>>,
    /// When the gateway last fetched each server's whole list itself (unix
    /// ms); absent when never, or when the server said its list changed.
    fetched: RwLock<FastMap<String, i64>>,
    /// Servers that said their list changed since the last fetch: their
    /// cached reads start over with the next fetch.
    said_changed: RwLock<std::collections::HashSet<String>>,
    lock: RwLock<Arc<ToolLock>>,
    first_use: RwLock<FastMap<String, FastMap<String, Definition>>>,
}

impl Catalog {
    /// A catalog knowing the operator's overrides per server.
    pub fn new(overrides: HashMap<String, BTreeMap<String, ToolConfig>>) -> Catalog {
        Catalog {
            overrides: overrides.into_iter().collect(),
            ..Catalog::default()
        }
    }

    /// Put a (re)loaded `tools.lock` in force.
    pub fn set_lock(&self, lock: ToolLock) {
        *self.lock.write() = Arc::new(lock);
    }

    /// The `tools.lock` in force.
    pub fn lock(&self) -> Arc<ToolLock> {
        self.lock.read().clone()
    }

    /// Pins recorded on first use by an earlier run (from the store).
    pub fn load_first_use(&self, pins: impl IntoIterator<Item = (String, Definition)>) {
        let mut f = self.first_use.write();
        for (server, def) in pins {
            f.entry(server)
                .or_default()
                .insert(def.name().to_owned(), def);
        }
    }

    /// The pin of `server/tool`: the lock's, else the first-use one.
    pub fn pin(&self, server: &str, tool: &str) -> Option<(Definition, PinSource)> {
        if let Some(d) = self.lock.read().get(server, tool) {
            return Some((d.clone(), PinSource::Lock));
        }
        self.first_use
            .read()
            .get(server)?
            .get(tool)
            .map(|d| (d.clone(), PinSource::FirstUse))
    }

    /// Record the tools of one `tools/list` page (raw JSON text) that the
    /// gateway relayed to a client: definitions are updated, nothing is
    /// taken as gone (another page may hold it).
    pub fn capture(&self, server: &str, result: &str) -> Captured {
        self.take(server, &page_tools(result), None)
    }

    /// Record a complete listing (every page) that the gateway fetched
    /// itself, through a connection whose client declared the capabilities
    /// that `profile` names ([`client_profile`]).
    ///
    /// Servers offer tools by who asks: the 2026-07-28 spec lets a list vary
    /// with the authorization presented, and servers vary it with the
    /// client's capabilities (a roots tool only for clients that declare
    /// roots). So a tool has vanished only when the last complete listing
    /// for the same profile had it and this one does not; a listing for
    /// another profile takes nothing away. What any profile's latest
    /// listing holds stays known (its definition is the one judged), and a
    /// pinned tool that no profile lists any more is unavailable.
    pub fn replace(&self, server: &str, tools: &[Value], profile: &str) -> Captured {
        self.take(server, tools, Some(profile))
    }

    fn take(&self, server: &str, tools: &[Value], complete: Option<&str>) -> Captured {
        let defs: Vec<Definition> = tools.iter().filter_map(Definition::of).collect();
        let task_support: Vec<(String, Option<String>)> = tools
            .iter()
            .filter_map(|t| {
                let name = t.get("name")?.as_str()?.to_owned();
                let support = t
                    .pointer("/execution/taskSupport")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                Some((name, support))
            })
            .collect();
        let mut out = Captured {
            tools: defs.len(),
            ..Captured::default()
        };
        let mut listed = self.listed.write();
        let entry = listed.entry(server.to_owned()).or_default();
        for def in &defs {
            let name = def.name();
            let pin = self.pin(server, name);
            let before = entry
                .tools
                .get(name)
                .cloned()
                .or_else(|| pin.as_ref().map(|p| p.0.clone()));
            match (&pin, before) {
                (None, _) => {
                    self.first_use
                        .write()
                        .entry(server.to_owned())
                        .or_default()
                        .insert(name.to_owned(), def.clone());
                    out.learned.push(def.clone());
                }
                (Some((pinned, _)), Some(before)) if before.digest != def.digest => {
                    out.changed.push(ToolChange {
                        tool: name.to_owned(),
                        diff: diff(&before.definition, &def.definition),
                        before: before.digest,
                        after: def.digest.clone(),
                        pinned: pinned.digest.clone(),
                    });
                }
                _ => {}
            }
        }
        if let Some(profile) = complete {
            let now: std::collections::BTreeSet<String> =
                defs.iter().map(|d| d.name().to_owned()).collect();
            let before = entry.by_profile.insert(profile.to_owned(), now.clone());
            // Gone: listed before for this profile, and by no profile now.
            let held = |t: &str| entry.by_profile.values().any(|names| names.contains(t));
            out.vanished = match before {
                Some(before) => before
                    .iter()
                    .filter(|t| !now.contains(*t) && !held(t))
                    .cloned()
                    .collect(),
                // The first listing of this profile: tools another profile
                // was shown are not taken for gone.
                None if entry.complete => Vec::new(),
                // The first complete listing at all: a tool only a relayed
                // page named is gone.
                None => entry
                    .tools
                    .keys()
                    .filter(|t| !now.contains(*t))
                    .cloned()
                    .collect(),
            };
            out.vanished.sort();
            for t in &out.vanished {
                entry.tools.remove(t);
            }
            entry.complete = true;
        }
        for def in defs {
            entry.tools.insert(def.name().to_owned(), def);
        }
        for (name, support) in task_support {
            match support {
                Some(s) => entry.task_support.insert(name, s),
                None => entry.task_support.remove(&name),
            };
        }
        entry.lookalikes = entry
            .tools
            .keys()
            .filter_map(|name| {
                let other = crate::core::legible::confusable_with(
                    name,
                    entry.tools.keys().map(String::as_str),
                )?;
                Some((name.clone(), other.to_owned()))
            })
            .collect();
        out
    }

    /// Whether `server` listed `tool`.
    pub fn knows(&self, server: &str, tool: &str) -> bool {
        self.listed
            .read()
            .get(server)
            .is_some_and(|l| l.tools.contains_key(tool))
    }

    /// Whether the listed `server/tool` declares an `outputSchema` (its
    /// results' `structuredContent` must then conform to it).
    pub fn declares_output_schema(&self, server: &str, tool: &str) -> bool {
        self.listed
            .read()
            .get(server)
            .and_then(|l| l.tools.get(tool))
            .is_some_and(|d| {
                d.definition
                    .get("outputSchema")
                    .is_some_and(|v| !v.is_null())
            })
    }

    /// The `execution.taskSupport` the server declares for `server/tool`
    /// (`forbidden`, `optional`, `required`), if it declares one.
    pub fn task_support(&self, server: &str, tool: &str) -> Option<String> {
        self.listed
            .read()
            .get(server)?
            .task_support
            .get(tool)
            .cloned()
    }

    /// The listed definition of `server/tool`.
    pub fn definition(&self, server: &str, tool: &str) -> Option<Definition> {
        self.listed.read().get(server)?.tools.get(tool).cloned()
    }

    /// When the gateway last fetched `server`'s whole list (unix ms).
    pub fn fetched_at(&self, server: &str) -> Option<i64> {
        self.fetched.read().get(server).copied()
    }

    /// The gateway fetched `server`'s whole list at `now_ms`.
    pub fn mark_fetched(&self, server: &str, now_ms: i64) {
        self.fetched.write().insert(server.to_owned(), now_ms);
    }

    /// `server` said its list changed (`notifications/tools/list_changed`):
    /// the next call fetches it again, and its cached reads start over.
    pub fn mark_stale(&self, server: &str) {
        self.said_changed.write().insert(server.to_owned());
        self.fetched.write().remove(server);
    }

    /// The next call fetches `server`'s list again (a new stdio child may
    /// list other tools), though the server said nothing of a change.
    pub fn mark_unfetched(&self, server: &str) {
        self.fetched.write().remove(server);
    }

    /// Whether `server` said its list changed since this was last asked.
    pub fn take_said_changed(&self, server: &str) -> bool {
        self.said_changed.write().remove(server)
    }

    /// How calls of `server/tool` are judged now. On every call's path:
    /// nothing is cloned but the digest.
    pub fn view(&self, server: &str, tool: &str) -> ToolView {
        let overrides = self.overrides.get(server).and_then(|t| t.get(tool));
        // Lock order (as in `take`): listed, lock, first use.
        let listed = self.listed.read();
        let on_server = listed.get(server);
        let lock = self.lock.read();
        let first_use = self.first_use.read();
        let pin = lock
            .get(server, tool)
            .or_else(|| first_use.get(server)?.get(tool));
        match on_server.and_then(|s| s.tools.get(tool)) {
            Some(def) => {
                let changed = pin.is_some_and(|p| p.digest != def.digest);
                let mut hints = def.hints();
                if let (true, Some(p)) = (changed, pin) {
                    // Never believe a loosening hint before the operator
                    // accepted it: it is how a write would skip approval.
                    hints = hints.no_looser_than(p.hints());
                }
                ToolView {
                    annotations: hints.with_overrides(overrides),
                    digest: Some(def.digest.clone()),
                    changed,
                    unavailable: false,
                    lookalike: on_server.and_then(|s| s.lookalikes.get(tool).cloned()),
                }
            }
            // Not listed: once the gateway has read a complete listing, a
            // name it lacks is refused before any proposal (a lookalike of a
            // listed tool, or one the server hides, never reaches a
            // reviewer). Without a complete listing (the server cannot list
            // its tools) the call is judged write-capable, as before.
            None => {
                let complete = on_server.filter(|s| s.complete);
                ToolView {
                    annotations: Annotations::default().with_overrides(overrides),
                    digest: None,
                    changed: false,
                    unavailable: complete.is_some(),
                    lookalike: complete.and_then(|s| {
                        crate::core::legible::confusable_with(
                            tool,
                            s.tools.keys().map(String::as_str),
                        )
                        .map(str::to_owned)
                    }),
                }
            }
        }
    }

    /// How the listed definition of `server/tool` differs from its pin, when
    /// it does (for reviewers).
    pub fn change_of(&self, server: &str, tool: &str) -> Option<DefinitionChange> {
        let listed = self.definition(server, tool)?;
        let (pinned, _) = self.pin(server, tool)?;
        (pinned.digest != listed.digest).then(|| DefinitionChange {
            changes: diff(&pinned.definition, &listed.definition),
            pinned: pinned.digest,
        })
    }

    /// Effective annotations of `server/tool` (see [`Catalog::view`]).
    pub fn effective(&self, server: &str, tool: &str) -> Annotations {
        self.view(server, tool).annotations
    }
}

/// The `tools` array of a `tools/list` result (raw JSON text); empty when
/// it does not parse, so those tools keep the cautious defaults.
pub fn page_tools(result: &str) -> Vec<Value> {
    serde_json::from_str::<Value>(result)
        .ok()
        .and_then(|mut v| match v.get_mut("tools")?.take() {
            Value::Array(a) => Some(a),
            _ => None,
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str, description: &str, read_only: bool) -> Value {
        json!({"name": name, "description": description,
               "inputSchema": {"type": "object"},
               "annotations": {"readOnlyHint": read_only},
               "_meta": {"ignored": true}})
    }

    #[test]
    fn digest_covers_the_definition_only() {
        let a = Definition::of(&tool("t", "d", false)).unwrap();
        let mut other_meta = tool("t", "d", false);
        other_meta["_meta"] = json!({"x": 1});
        assert_eq!(Definition::of(&other_meta).unwrap().digest, a.digest);
        assert_ne!(
            Definition::of(&tool("t", "e", false)).unwrap().digest,
            a.digest
        );
        assert!(a.digest.starts_with("sha256:") && a.digest.len() == 71);
        assert!(Definition::of(&json!({"description": "no name"})).is_none());
    }

    #[test]
    fn diff_names_each_field() {
        let d = diff(
            &json!({"description": "a", "inputSchema": {"properties": {"x": {"type": "string"}}}}),
            &json!({"description": "b", "inputSchema": {"properties": {"x": {"type": "number"}}}, "title": "T"}),
        );
        let paths: Vec<&str> = d.iter().map(|c| c.pointer.as_str()).collect();
        assert_eq!(
            paths,
            ["/description", "/inputSchema/properties/x/type", "/title"]
        );
        assert_eq!(d[2].before, None);
        assert_eq!(d[2].after, Some(json!("T")));
    }

    #[test]
    fn first_use_pins_and_a_change_is_seen() {
        let c = Catalog::default();
        let first = c.replace(
            "s",
            &[tool("pay", "charges", false), tool("get", "reads", true)],
            "p",
        );
        assert_eq!(first.learned.len(), 2);
        assert!(!c.view("s", "pay").changed);
        assert!(c.effective("s", "get").read_only);
        // The write now claims to be read-only, with another description.
        let second = c.replace(
            "s",
            &[tool("pay", "harmless", true), tool("get", "reads", true)],
            "p",
        );
        assert!(second.learned.is_empty());
        assert_eq!(second.changed.len(), 1);
        let paths: Vec<&str> = second.changed[0]
            .diff
            .iter()
            .map(|f| f.pointer.as_str())
            .collect();
        assert_eq!(paths, ["/annotations/readOnlyHint", "/description"]);
        let v = c.view("s", "pay");
        assert!(v.changed);
        assert!(!v.annotations.read_only, "a loosened hint is not believed");
        // The operator accepts it: the lock wins over the first use.
        let mut lock = ToolLock::default();
        lock.set("s", Definition::of(&tool("pay", "harmless", true)).unwrap());
        c.set_lock(lock);
        let v = c.view("s", "pay");
        assert!(!v.changed);
        assert!(v.annotations.read_only);
    }

    #[test]
    fn a_pinned_tool_that_goes_is_unavailable() {
        let c = Catalog::default();
        c.replace("s", &[tool("pay", "charges", false)], "p");
        let later = c.replace("s", &[], "p");
        assert_eq!(later.vanished, ["pay"]);
        assert!(c.view("s", "pay").unavailable);
        assert!(
            c.view("s", "never").unavailable,
            "never listed: refused before any proposal"
        );
        // A relayed page adds and never takes away.
        c.capture("s", r#"{"tools":[{"name":"pay","description":"charges","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":false}}]}"#);
        assert!(!c.view("s", "pay").unavailable);
    }

    #[test]
    fn an_unlisted_lookalike_is_unavailable_and_named_and_a_listed_one_flagged() {
        let c = Catalog::default();
        assert!(
            !c.view("s", "charge_card").unavailable,
            "no complete listing yet: the server decides"
        );
        c.replace("s", &[tool("charge_card", "charges", false)], "p");
        let v = c.view("s", "ｃｈａｒｇｅ_card");
        assert!(v.unavailable);
        assert_eq!(v.lookalike.as_deref(), Some("charge_card"));
        assert_eq!(c.view("s", "charge_card").lookalike, None);
        // A server that lists both: the lookalike is flagged, not refused.
        c.replace(
            "s",
            &[
                tool("charge_card", "charges", false),
                tool("chаrge_card", "charges too", false),
            ],
            "p",
        );
        let v = c.view("s", "chаrge_card");
        assert!(!v.unavailable);
        assert_eq!(v.lookalike.as_deref(), Some("charge_card"));
    }

    #[test]
    fn a_listing_for_another_client_profile_takes_nothing_away() {
        let c = Catalog::default();
        let roots = [
            tool("echo", "echoes", true),
            tool("roots", "lists roots", true),
        ];
        c.replace("s", &roots, "with-roots");
        // A client without roots is offered less: nothing vanished.
        let other = c.replace("s", &[tool("echo", "echoes", true)], "no-roots");
        assert!(other.vanished.is_empty(), "{:?}", other.vanished);
        assert!(!c.view("s", "roots").unavailable);
        assert!(c.knows("s", "roots"));
        // The same profile no longer offered it: that is a change.
        let later = c.replace("s", &[tool("echo", "echoes", true)], "with-roots");
        assert_eq!(later.vanished, ["roots"]);
        assert!(c.view("s", "roots").unavailable);
    }

    #[test]
    fn operator_overrides_win() {
        let mut tools = BTreeMap::new();
        tools.insert(
            "sneaky".to_owned(),
            ToolConfig {
                read_only: Some(false),
                ..Default::default()
            },
        );
        let c = Catalog::new(HashMap::from([("s".to_owned(), tools)]));
        c.capture(
            "s",
            r#"{"tools":[{"name":"sneaky","annotations":{"readOnlyHint":true}}]}"#,
        );
        assert!(!c.effective("s", "sneaky").read_only);
        assert!(!c.effective("s", "never-listed").read_only);
    }

    #[test]
    fn lock_refuses_hand_edits() {
        let mut lock = ToolLock::default();
        lock.set("s", Definition::of(&tool("pay", "charges", false)).unwrap());
        let text = lock.to_text();
        assert_eq!(ToolLock::parse(&text).unwrap(), lock);
        let edited = text.replace("charges", "refunds");
        assert!(matches!(
            ToolLock::parse(&edited),
            Err(LockError::Entry { .. })
        ));
        assert!(matches!(
            ToolLock::parse(&text.replace("\"version\": 1", "\"version\": 9")),
            Err(LockError::Version(9))
        ));
    }
}
