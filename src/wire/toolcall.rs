//! What counts as a `tools/call` on the wire, whatever its shape.
//!
//! A tool call must reach an upstream only through the enforcement
//! pipeline. A JSON-RPC message with method `tools/call` and no `id` is a
//! notification, which the gateway would otherwise relay as it relays
//! `notifications/cancelled`; many generic dispatchers run it all the same,
//! with no answer to carry a decision. Some also normalise a method's case
//! or punctuation. [`unrelayable`] is the rule every relayed client message
//! passes (`upstream::Passthrough` is built only through it): fail closed
//! on the wire.

use super::jsonrpc::{Kind, Message};

/// Why a client message may not pass through as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unrelayable {
    /// A `tools/call` request: it goes through the enforcement pipeline.
    ToolCall,
    /// `tools/call` without an id (a notification): it has no answer to
    /// carry a decision, so it never runs.
    ToolCallNotification,
    /// A method that a forgiving dispatcher could take for `tools/call`
    /// (another case, whitespace, punctuation, lookalike characters).
    LooksLikeToolCall,
    /// A notification whose method is not a `notifications/…` one: MCP
    /// clients notify only under that prefix, and a server that dispatches
    /// a notification like a request would run it unanswered.
    NotANotification,
}

impl Unrelayable {
    /// The label of this refusal in `/metrics` and the audit log.
    pub fn label(self) -> &'static str {
        match self {
            Unrelayable::ToolCall => "tool_call_outside_pipeline",
            Unrelayable::ToolCallNotification => "tool_call_without_id",
            Unrelayable::LooksLikeToolCall => "tool_call_lookalike",
            Unrelayable::NotANotification => "notification_method",
        }
    }
}

impl std::fmt::Display for Unrelayable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Unrelayable::ToolCall => "a `tools/call` goes through the enforcement pipeline only",
            Unrelayable::ToolCallNotification => {
                "a `tools/call` without an `id` is a notification: it is never relayed (send it as a request with an id)"
            }
            Unrelayable::LooksLikeToolCall => {
                "this method could be taken for `tools/call`: it is refused (the method is exactly `tools/call`)"
            }
            Unrelayable::NotANotification => {
                "a notification's method must start with `notifications/`: anything else without an `id` is refused"
            }
        })
    }
}

/// Whether a forgiving dispatcher could take `method` for `tools/call`: the
/// same letters once case, whitespace, punctuation and lookalike characters
/// (UTS #39 skeletons: `ｔｏｏｌｓ/ｃａｌｌ`, `tооls/call` with Cyrillic `о`)
/// are folded away. `tools/call` itself is one too.
pub fn names_tool_call(method: &str) -> bool {
    fn folded(s: &str) -> String {
        let lower = s.to_lowercase();
        unicode_security::skeleton(&lower)
            .filter(|c| c.is_alphanumeric())
            .flat_map(char::to_lowercase)
            .collect()
    }
    folded(method) == "toolscall"
}

/// Why `msg`, a client message, may not be relayed to an upstream as it
/// is; `None` when it may.
pub fn unrelayable(msg: &Message) -> Option<Unrelayable> {
    // A lenient server runs a `tools/call` notification, or a method it
    // normalises to `tools/call`, exactly as it runs the request: none of
    // them may reach it outside the pipeline.
    let method = msg.method();
    match msg.kind() {
        Kind::Response => None,
        Kind::Request if method == "tools/call" => Some(Unrelayable::ToolCall),
        Kind::Notification if method == "tools/call" => Some(Unrelayable::ToolCallNotification),
        _ if names_tool_call(method) => Some(Unrelayable::LooksLikeToolCall),
        Kind::Notification if !method.starts_with("notifications/") => {
            Some(Unrelayable::NotANotification)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::jsonrpc::raw;

    #[test]
    fn every_shape_of_a_tool_call_is_unrelayable() {
        let note = |m: &str| Message::notification(m, Some(raw(&serde_json::json!({}))));
        let req = |m: &str| Message::request(1.into(), m, None);
        assert_eq!(unrelayable(&req("tools/call")), Some(Unrelayable::ToolCall));
        assert_eq!(
            unrelayable(&note("tools/call")),
            Some(Unrelayable::ToolCallNotification)
        );
        for alike in [
            "Tools/Call",
            "TOOLS/CALL",
            "tools/call ",
            " tools/call",
            "tools.call",
            "tools_call",
            "tools/call/",
            "toolscall",
            "ｔｏｏｌｓ/ｃａｌｌ",
            "t\u{043e}\u{043e}ls/call",
            "tools/\u{200b}call",
            "tools/call\u{0}",
        ] {
            assert_eq!(
                unrelayable(&req(alike)),
                Some(Unrelayable::LooksLikeToolCall),
                "{alike:?}"
            );
            assert_eq!(
                unrelayable(&note(alike)),
                Some(Unrelayable::LooksLikeToolCall),
                "{alike:?}"
            );
        }
        assert_eq!(
            unrelayable(&note("tools/list")),
            Some(Unrelayable::NotANotification)
        );
        for ok in [
            "tools/list",
            "resources/read",
            "ping",
            "prompts/get",
            "tools/callback",
        ] {
            assert_eq!(unrelayable(&req(ok)), None, "{ok}");
        }
        for ok in [
            "notifications/initialized",
            "notifications/cancelled",
            "notifications/progress",
            "notifications/roots/list_changed",
        ] {
            assert_eq!(unrelayable(&note(ok)), None, "{ok}");
        }
    }
}
