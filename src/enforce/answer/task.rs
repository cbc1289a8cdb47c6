//! The words of tasks (DESIGN.md section 24): what a task's requester is
//! told while its held call waits, how the call's end becomes the task's
//! result (SEP-2848: a disposition, and a sentence that says plainly
//! whether the tool ran), and the refusals of `tasks/*` requests.

use serde_json::{json, Value};

use super::codes;
use crate::core::refusal::{ApprovalCode, ApprovalNote, Outcome};
use crate::core::task::{Disposition, DISPOSITION_META};
use crate::enforce::outcome::CallOutcome;
use crate::wire::era::Era;
use crate::wire::jsonrpc::{code, Message};

/// JSON-RPC code for a request that needs an extension the client did not
/// declare (2026-07-28).
pub const MISSING_EXTENSION: i64 = -32021;

/// How a task's call ended, as far as its task is concerned.
#[derive(Debug)]
pub enum TaskEnd {
    /// Still waiting for a yes: on this proposal (the same one, or a new
    /// one when the approval went to another key).
    Waiting(Option<String>),
    /// Ended: the `CallToolResult` to keep (no `resultType`) and whether
    /// the tool ran.
    Done {
        /// The result, with the disposition in `_meta` and a last text
        /// block that says whether the tool ran.
        result: Value,
        /// Whether the tool ran.
        disposition: Disposition,
    },
}

/// What becomes of a task whose call ended with `outcome`. `output_schema`:
/// the tool declares one (then the gateway's decision stays out of
/// `structuredContent`).
pub fn task_end(outcome: CallOutcome, output_schema: bool) -> TaskEnd {
    if let CallOutcome::Refused {
        why:
            Outcome::Approval(ApprovalNote {
                code: ApprovalCode::Pending,
                proposal_id,
                ..
            }),
        ..
    } = &outcome
    {
        return TaskEnd::Waiting(proposal_id.clone());
    }
    let code = super::code_of(&outcome);
    let msg = super::render(
        outcome,
        Value::Null,
        super::Shape {
            era: Era::Handshake,
            output_schema,
        },
    );
    let mut result = match (&msg.result, &msg.error) {
        (Some(r), _) => serde_json::from_str::<Value>(r.get()).unwrap_or_else(|_| json!({})),
        (None, Some(_)) => json!({
            "content": [{ "type": "text", "text": format!(
                "The server answered with an error: {}",
                msg.error_summary().unwrap_or_default()
            ) }],
            "isError": true,
        }),
        (None, None) => json!({ "content": [], "isError": true }),
    };
    let is_error = result.get("isError").and_then(Value::as_bool) == Some(true);
    let (disposition, sentence) = match code {
        None if is_error => (
            Disposition::ExecutionError,
            "countersign: the call was approved and sent once; the tool ran and reported an error.",
        ),
        None => (
            Disposition::ApprovedExecuted,
            "countersign: the call was approved and the tool ran once.",
        ),
        Some(codes::OUTCOME_UNKNOWN) => (
            Disposition::OutcomeUnknown,
            "countersign: the call was approved and sent, and its answer was lost: the tool may have run. \
             It will not be sent again; verify with a read before calling again.",
        ),
        Some(
            codes::APPROVAL_DENIED
            | codes::APPROVAL_EXPIRED
            | codes::POLICY_DENIED
            | codes::STALE_RESOURCE_VERSION
            | codes::DRIFT_REJECTED
            | codes::REMAP_REJECTED
            | codes::TOOL_UNAVAILABLE
            | codes::DELEGATION_UNAVAILABLE,
        ) => (
            Disposition::DeniedNotExecuted,
            "countersign: the tool did not run.",
        ),
        Some(_) => (
            Disposition::ExecutionError,
            "countersign: the call was approved but could not be sent: the tool did not run.",
        ),
    };
    if let Some(o) = result.as_object_mut() {
        o.remove("resultType");
        let content = o.entry("content").or_insert_with(|| json!([]));
        if let Some(c) = content.as_array_mut() {
            c.push(json!({ "type": "text", "text": sentence }));
        }
        let meta = o.entry("_meta").or_insert_with(|| json!({}));
        if let Some(m) = meta.as_object_mut() {
            m.insert(DISPOSITION_META.into(), json!(disposition.as_str()));
        }
    }
    TaskEnd::Done {
        result,
        disposition,
    }
}

/// The end of a task whose proposal was decided against it (denied,
/// expired, voided) before anything ran: worded as the call itself would
/// have been refused.
pub fn refused(
    code: ApprovalCode,
    proposal_id: &str,
    reason: Option<String>,
    key: &str,
    tool: &str,
    output_schema: bool,
) -> TaskEnd {
    task_end(
        CallOutcome::Refused {
            why: Outcome::Approval(ApprovalNote {
                code,
                proposal_id: Some(proposal_id.to_owned()),
                revises: None,
                reason,
                by_client: false,
            }),
            key: key.to_owned(),
            tool: tool.to_owned(),
        },
        output_schema,
    )
}

/// A relayed task whose server task was lost with the session that held
/// it: the call was sent, and what became of it is not known.
pub fn relay_lost(tool: &str) -> Value {
    let text = format!(
        "The call of `{}` was sent and its server made a task of it, but the session that held that task ended:          the tool may have run. It will not be sent again; verify with a read before calling again.",
        crate::core::legible::text(tool)
    );
    json!({
        "content": [{ "type": "text", "text": text }],
        "isError": true,
        "structuredContent": { "countersign": { "code": codes::OUTCOME_UNKNOWN, "message": text } },
        "_meta": {
            DISPOSITION_META: Disposition::OutcomeUnknown.as_str(),
            super::DECISION_META: { "code": codes::OUTCOME_UNKNOWN, "message": text },
        },
    })
}

/// What a waiting task says of itself (`statusMessage`).
pub fn waiting(proposal_id: &str, review_url: Option<&str>) -> String {
    match review_url {
        Some(url) => format!(
            "waiting for a reviewer to decide proposal {proposal_id} ({url}); the call runs once when it is approved"
        ),
        None => format!(
            "waiting for a reviewer to decide proposal {proposal_id} (countersign show {proposal_id}); \
             the call runs once when it is approved"
        ),
    }
}

/// What a task running its approved call says of itself.
pub fn running(proposal_id: Option<&str>) -> String {
    match proposal_id {
        Some(p) => format!("proposal {p} was decided; the call is being run"),
        None => "the call is being run".to_owned(),
    }
}

/// What an ended task says of itself.
pub fn ended(disposition: Option<Disposition>) -> String {
    match disposition {
        Some(Disposition::ApprovedExecuted) => "approved; the tool ran once".into(),
        Some(Disposition::DeniedNotExecuted) => "the tool did not run".into(),
        Some(Disposition::ExecutionError) => "the approved call failed; see the result".into(),
        Some(Disposition::OutcomeUnknown) => {
            "the call was sent and its answer lost: the tool may have run".into()
        }
        None => "the call ended; see the result".into(),
    }
}

/// What a cancelled task says of itself.
pub fn cancelled() -> String {
    "cancelled by its requester before it ran; the tool did not run".into()
}

/// `tasks/*` naming a task that does not exist, or not for this caller:
/// the same answer either way, so a task id tells nobody else anything.
pub fn not_found(id: Value, task_id: &str) -> Message {
    Message::error(
        id,
        code::INVALID_PARAMS,
        &format!("task `{}` not found", crate::core::legible::text(task_id)),
        None,
    )
}

/// `tasks/*` without a string `taskId`.
pub fn no_task_id(id: Value) -> Message {
    Message::error(
        id,
        code::INVALID_PARAMS,
        "params.taskId must be the task's id, a string",
        None,
    )
}

/// `tasks/cancel` or `tasks/result` of a task that ended, or was cancelled.
pub fn task_ended(id: Value, task_id: &str, status: &str) -> Message {
    Message::error(
        id,
        code::INVALID_PARAMS,
        &format!("task `{task_id}` is {status}: it can no longer be cancelled, and a cancelled task has no result"),
        None,
    )
}

/// `tasks/update` of one of the gateway's tasks: they never ask for input.
pub fn no_input(id: Value, task_id: &str) -> Message {
    Message::error(
        id,
        code::INVALID_PARAMS,
        &format!("task `{task_id}` asks for no input: it waits for a reviewer, not for the client"),
        None,
    )
}

/// A 2026-07-28 `tasks/*` request that does not declare the extension.
pub fn missing_extension(id: Value) -> Message {
    Message::error(
        id,
        MISSING_EXTENSION,
        &format!(
            "this request does not declare the `{}` extension in its client capabilities; declare it to use tasks",
            crate::core::task::TASKS_EXTENSION
        ),
        None,
    )
}

/// A `tasks/*` method this era or this gateway does not serve.
pub fn unknown_method(id: Value, method: &str) -> Message {
    Message::error(
        id,
        code::METHOD_NOT_FOUND,
        &format!(
            "method `{}` not found: tasks are served to 2025-11-25 sessions and to 2026-07-28 clients \
             that declare the tasks extension",
            crate::core::legible::text(method)
        ),
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::jsonrpc::raw;

    fn disposition_of(end: &TaskEnd) -> Option<&str> {
        match end {
            TaskEnd::Done { result, .. } => result["_meta"][DISPOSITION_META].as_str(),
            TaskEnd::Waiting(_) => None,
        }
    }

    #[test]
    fn a_tool_that_ran_is_approved_executed_and_says_so() {
        let answer = Message::response(
            json!(1),
            raw(&json!({"content": [{"type": "text", "text": "charged"}]})),
        );
        let end = task_end(CallOutcome::Answered(answer), false);
        assert_eq!(disposition_of(&end), Some("approved-executed"));
        let TaskEnd::Done { result, .. } = end else {
            panic!("done")
        };
        assert_eq!(result["content"][0]["text"], "charged");
        assert!(result["content"][1]["text"]
            .as_str()
            .unwrap()
            .contains("the tool ran once"));
    }

    #[test]
    fn a_tool_error_is_an_execution_error() {
        let answer = Message::response(
            json!(1),
            raw(&json!({"content": [{"type": "text", "text": "declined"}], "isError": true})),
        );
        let end = task_end(CallOutcome::Answered(answer), false);
        assert_eq!(disposition_of(&end), Some("execution-error"));
    }

    #[test]
    fn a_denial_did_not_run_and_a_pending_call_waits() {
        let end = refused(
            ApprovalCode::Denied,
            "p1",
            Some("no".into()),
            "k",
            "charge",
            false,
        );
        assert_eq!(disposition_of(&end), Some("denied-not-executed"));
        let TaskEnd::Done { result, .. } = &end else {
            panic!("done")
        };
        assert_eq!(result["isError"], true);
        assert!(result.get("resultType").is_none());
        let waiting = refused(ApprovalCode::Pending, "p2", None, "k", "charge", false);
        assert!(matches!(waiting, TaskEnd::Waiting(Some(p)) if p == "p2"));
    }

    #[test]
    fn a_lost_answer_is_outcome_unknown() {
        let end = task_end(
            CallOutcome::Refused {
                why: Outcome::Unknown,
                key: "k".into(),
                tool: "charge".into(),
            },
            false,
        );
        assert_eq!(disposition_of(&end), Some("outcome-unknown"));
    }
}
