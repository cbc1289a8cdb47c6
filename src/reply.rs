//! The one place where gateway-side failures become wire answers
//! (DESIGN.md section 7): a `CallToolResult` with `isError: true` for
//! `tools/call`, so the model reads a plain explanation, and a JSON-RPC error
//! for everything else.

use serde_json::{json, Value};

use crate::jsonrpc::{code, raw, Message};
use crate::relay::upstream::UpstreamError;

/// Codes of `structuredContent.countersign.code` produced so far.
pub mod codes {
    /// The upstream could not be reached; the call did not run.
    pub const UPSTREAM_UNAVAILABLE: &str = "upstream_unavailable";
    /// The call was sent and the answer was lost; it may have run.
    pub const OUTCOME_UNKNOWN: &str = "outcome_unknown";
    /// The idempotency key was used with other arguments for the same tool.
    pub const DRIFT_REJECTED: &str = "drift_rejected";
    /// The idempotency key was used for another tool.
    pub const REMAP_REJECTED: &str = "remap_rejected";
    /// The policies deny the call.
    pub const POLICY_DENIED: &str = "policy_denied";
    /// The call waits for a human approval.
    pub const APPROVAL_PENDING: &str = "approval_pending";
    /// A reviewer denied the call.
    pub const APPROVAL_DENIED: &str = "approval_denied";
    /// The approval expired before the call came back.
    pub const APPROVAL_EXPIRED: &str = "approval_expired";
    /// The resource changed since the reviewer saw it.
    pub const STALE_RESOURCE_VERSION: &str = "stale_resource_version";
}

/// A `CallToolResult` that tells the agent what happened.
pub fn tool_error(id: Value, code: &str, text: &str, details: Value, modern: bool) -> Message {
    let mut countersign = json!({ "code": code, "message": text });
    if let (Some(obj), Value::Object(extra)) = (countersign.as_object_mut(), details) {
        obj.extend(extra);
    }
    let mut result = json!({
        "content": [{ "type": "text", "text": text }],
        "isError": true,
        "structuredContent": { "countersign": countersign },
    });
    if modern {
        result["resultType"] = json!("complete");
    }
    Message::response(id, raw(&result))
}

/// A gateway-side failure of a request: an `isError` result for
/// `tools/call` (the model reads it), a JSON-RPC `-32603` with the code in
/// `data` for any other method.
pub fn failure(id: Value, method: &str, code: &str, text: &str, modern: bool) -> Message {
    if method == "tools/call" {
        tool_error(id, code, text, json!({}), modern)
    } else {
        Message::error(
            id,
            code::INTERNAL_ERROR,
            text,
            Some(json!({ "countersign": { "code": code } })),
        )
    }
}

/// The answer to a request whose upstream call failed.
pub fn upstream_failure(id: Value, method: &str, err: &UpstreamError, modern: bool) -> Message {
    let (code, text) = if err.dispatched() {
        (
            codes::OUTCOME_UNKNOWN,
            format!(
                "The call may have run: countersign sent it to the server and the answer was lost ({err}). \
                 Verify with a read before calling again; do not retry blindly."
            ),
        )
    } else {
        (
            codes::UPSTREAM_UNAVAILABLE,
            format!("The call did not run: {err}. It is safe to try again later."),
        )
    };
    if method == "tools/call" {
        tool_error(id, code, &text, json!({}), modern)
    } else {
        Message::error(
            id,
            code::INTERNAL_ERROR,
            &text,
            Some(json!({ "countersign": { "code": code } })),
        )
    }
}
