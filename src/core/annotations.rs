//! Tool annotations as the gateway trusts them (DESIGN.md section 5).
//!
//! `tools/list` results are read (never altered) to learn each tool's hints.
//! Hints from a server are untrusted: a missing or malformed hint takes the
//! MCP default, which for `readOnlyHint` is `false` (write-capable), and the
//! operator's `[servers.S.tools.T]` override wins over anything the server says.

use serde_json::Value;

use crate::core::config::ToolConfig;

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
        let mut a = Annotations::default();
        // One pass over the few members (read on every call): four keyed
        // lookups hashed each name.
        let Some(members) = hints.and_then(Value::as_object) else {
            return a;
        };
        for (key, value) in members {
            let Some(on) = value.as_bool() else {
                continue;
            };
            match key.as_str() {
                "readOnlyHint" => a.read_only = on,
                "destructiveHint" => a.destructive = on,
                "idempotentHint" => a.idempotent = on,
                "openWorldHint" => a.open_world = on,
                _ => {}
            }
        }
        a
    }

    /// The more cautious reading of two: a hint that loosens (becoming
    /// read-only, idempotent or closed-world, or ceasing to be destructive)
    /// is not taken from `self` over `pinned`.
    pub fn no_looser_than(self, pinned: Annotations) -> Annotations {
        Annotations {
            read_only: self.read_only && pinned.read_only,
            destructive: self.destructive || pinned.destructive,
            idempotent: self.idempotent && pinned.idempotent,
            open_world: self.open_world || pinned.open_world,
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
        let all = Annotations::from_hints(Some(&serde_json::json!({
            "title": "x", "readOnlyHint": true, "destructiveHint": false,
            "idempotentHint": true, "openWorldHint": false
        })));
        assert!(all.read_only && !all.destructive && all.idempotent && !all.open_world);
        let not_an_object = Annotations::from_hints(Some(&serde_json::json!(["readOnlyHint"])));
        assert_eq!(not_an_object, Annotations::default());
    }

    #[test]
    fn loosening_is_not_taken_tightening_is() {
        let write = Annotations::default();
        let read = Annotations {
            read_only: true,
            destructive: false,
            idempotent: true,
            open_world: false,
        };
        assert_eq!(
            read.no_looser_than(write),
            write,
            "a write turned read-only stays a write"
        );
        assert_eq!(
            write.no_looser_than(read),
            write,
            "a read turned write is a write at once"
        );
    }
}
