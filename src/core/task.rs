//! A held call as an MCP task (DESIGN.md section 24): the record the store
//! keeps, its lifecycle, who may see it, and how it is written in each wire
//! era (2025-11-25 core tasks, the 2026-07-28 `io.modelcontextprotocol/tasks`
//! extension with SEP-2848 tool approval). No I/O.
//!
//! Lifecycle (an invariant, kept by compare-and-set on `revision` in every
//! store):
//!
//! ```text
//! waiting ──claim──> claimed ──finish──> completed
//!    │  ▲               │
//!    │  └──(new proposal: the approval went to another key)
//!    ├──cancel──> cancelled        (only from waiting: cancel and claim
//!    └──decided no──> completed     are one compare-and-set apart)
//! ```

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::core::identity::Identity;

/// The 2026-07-28 tasks extension.
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";
/// SEP-2848, tool approval on top of tasks.
pub const TOOL_APPROVAL_EXTENSION: &str = "io.modelcontextprotocol/tool-approval";
/// `_meta` key of a completed task's result: whether the tool ran.
pub const DISPOSITION_META: &str = "io.modelcontextprotocol/tool-approval-disposition";
/// `_meta` key of the SEP-2643 envelope on a task still waiting.
pub const AUTHORIZATION_META: &str = "io.modelcontextprotocol/authorization";
/// `_meta` key that ties a 2025-11-25 message to its task.
pub const RELATED_TASK_META: &str = "io.modelcontextprotocol/related-task";

/// Where a task is. `Waiting` and `Claimed` are both `working` on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Waiting for the reviewers to decide its proposal.
    Waiting,
    /// A gateway claimed it to run the call (the execution claim).
    Claimed,
    /// Ended with a result (whether or not the tool ran: see the
    /// disposition).
    Completed,
    /// Cancelled by its requester before the execution claim.
    Cancelled,
    /// Failed before the execution claim (never after it).
    Failed,
}

impl TaskState {
    /// The state's name in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Waiting => "waiting",
            TaskState::Claimed => "claimed",
            TaskState::Completed => "completed",
            TaskState::Cancelled => "cancelled",
            TaskState::Failed => "failed",
        }
    }

    /// Whether nothing will change it any more.
    pub fn terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Cancelled | TaskState::Failed
        )
    }

    /// The task status the wire shows.
    pub fn wire(self) -> &'static str {
        match self {
            TaskState::Waiting | TaskState::Claimed => "working",
            TaskState::Completed => "completed",
            TaskState::Cancelled => "cancelled",
            TaskState::Failed => "failed",
        }
    }
}

/// SEP-2848: whether the tool ran, on a completed task's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Disposition {
    /// Approved, and the tool ran (its own result follows).
    ApprovedExecuted,
    /// Denied, expired, withdrawn or refused on re-evaluation: it did not run.
    DeniedNotExecuted,
    /// Approved, and the execution failed: the tool reported an error, or
    /// the call could not be sent (the text says which).
    ExecutionError,
    /// Sent, and the answer was lost: it may have run.
    OutcomeUnknown,
}

impl Disposition {
    /// The value on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Disposition::ApprovedExecuted => "approved-executed",
            Disposition::DeniedNotExecuted => "denied-not-executed",
            Disposition::ExecutionError => "execution-error",
            Disposition::OutcomeUnknown => "outcome-unknown",
        }
    }
}

/// One task, as every store keeps it (JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The task id: 128 random bits, the only handle a client has.
    pub id: String,
    /// Bumped on every write; writes compare and set on it.
    pub revision: u64,
    /// The requester's tenant (only it sees the task).
    pub tenant: String,
    /// The requester (only it sees the task).
    pub principal: String,
    /// The requester's groups when it asked (the call is decided again
    /// with them when it runs).
    #[serde(default)]
    pub groups: Vec<String>,
    /// The requester's token scopes when it asked.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// The requester's OAuth client, if its token named one.
    #[serde(default)]
    pub client: Option<String>,
    /// The requester's other names (their token's `sub` and `email`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aka: Vec<String>,
    /// The configured server.
    pub server: String,
    /// The tool.
    pub tool: String,
    /// The idempotency key as the client knows it (explicit or derived):
    /// the same held call with the same key joins this task.
    pub key: String,
    /// The caller's idempotency scope (its session), so that the call run
    /// on approval derives the very key the client's own retry would.
    #[serde(default)]
    pub scope: Option<String>,
    /// The `tools/call` params as the client sent them, less `task`.
    pub params: Value,
    /// The proposal it waits on (or waited on).
    #[serde(default)]
    pub proposal_id: Option<String>,
    /// Where it is.
    pub state: TaskState,
    /// The gateway that claimed it for execution.
    #[serde(default)]
    pub claimed_by: Option<String>,
    /// When it was claimed (unix ms).
    #[serde(default)]
    pub claimed_ms: Option<i64>,
    /// Created (unix ms).
    pub created_ms: i64,
    /// Last changed (unix ms).
    pub updated_ms: i64,
    /// What the client is told of where it is.
    #[serde(default)]
    pub status_message: Option<String>,
    /// The `CallToolResult` of a completed task, written without
    /// `resultType` (each era's answer adds its own).
    #[serde(default)]
    pub result: Option<Value>,
    /// Whether the tool ran (completed tasks).
    #[serde(default)]
    pub disposition: Option<Disposition>,
    /// The JSON-RPC error of a failed task.
    #[serde(default)]
    pub error: Option<Value>,
    /// The server's own task this one relays, when the server answered the
    /// call with a task of its own.
    #[serde(default)]
    pub upstream: Option<UpstreamTask>,
}

/// A server's own task that a gateway task relays (2025-11-25): its id
/// at the server, and the client session whose upstream connection holds it
/// (a stdio child's tasks live in that child).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpstreamTask {
    /// The server's task id (never shown to the client: the gateway's id is).
    pub task_id: String,
    /// The handshake-era session whose connection reaches it.
    pub session: Option<String>,
}

impl TaskRecord {
    /// A new task of `who`'s call of `server/tool`, made at `now_ms`:
    /// waiting, at revision 0, with nothing else known yet.
    pub fn new(id: String, who: &Identity, server: &str, tool: &str, now_ms: i64) -> TaskRecord {
        TaskRecord {
            id,
            revision: 0,
            tenant: who.tenant.clone(),
            principal: who.principal.clone(),
            groups: who.groups.clone(),
            scopes: who.scopes.clone(),
            client: who.client.clone(),
            aka: who.aka.clone(),
            server: server.to_owned(),
            tool: tool.to_owned(),
            key: String::new(),
            scope: None,
            params: Value::Null,
            proposal_id: None,
            state: TaskState::Waiting,
            claimed_by: None,
            claimed_ms: None,
            created_ms: now_ms,
            updated_ms: now_ms,
            status_message: None,
            result: None,
            disposition: None,
            error: None,
            upstream: None,
        }
    }

    /// Whether `who` asked for it: only its requester (principal and
    /// tenant) may see, list or cancel a task; for anyone else it does not
    /// exist.
    pub fn owned_by(&self, who: &Identity) -> bool {
        self.principal == who.principal && self.tenant == who.tenant
    }

    /// The identity it was asked under, to run it with.
    pub fn identity(&self) -> Identity {
        Identity {
            principal: self.principal.clone(),
            tenant: self.tenant.clone(),
            groups: self.groups.clone(),
            scopes: self.scopes.clone(),
            client: self.client.clone(),
            aka: self.aka.clone(),
        }
    }

    /// `self` as the next revision, changed by `edit`, at `now_ms`.
    pub fn next(&self, now_ms: i64, edit: impl FnOnce(&mut TaskRecord)) -> TaskRecord {
        let mut t = self.clone();
        t.revision = self.revision.wrapping_add(1);
        t.updated_ms = now_ms;
        edit(&mut t);
        t
    }

    /// When the store may forget it: `retention` after it ended.
    pub fn expired(&self, now_ms: i64, retention_ms: i64) -> bool {
        self.state.terminal() && self.updated_ms.saturating_add(retention_ms) <= now_ms
    }

    /// A 2025-11-25 `Task` (`tasks/get`, `tasks/cancel`, `tasks/list`, the
    /// `task` of a `CreateTaskResult`, `notifications/tasks/status`).
    pub fn v1(&self, retention_ms: i64, poll_ms: i64) -> Value {
        let mut t = json!({
            "taskId": self.id,
            "status": self.state.wire(),
            "createdAt": crate::core::time::rfc3339(self.created_ms),
            "lastUpdatedAt": crate::core::time::rfc3339(self.updated_ms),
            "ttl": retention_ms,
        });
        if !self.state.terminal() {
            t["pollInterval"] = json!(poll_ms);
        }
        if let Some(m) = &self.status_message {
            t["statusMessage"] = json!(m);
        }
        t
    }

    /// A 2026-07-28 detailed task (`tasks/get`, `notifications/tasks`): a
    /// completed one carries its result inline, a failed one its error, one
    /// still waiting the SEP-2643 envelope that says a person decides.
    pub fn v2(&self, retention_ms: i64, poll_ms: i64) -> Value {
        let mut t = json!({
            "taskId": self.id,
            "status": self.state.wire(),
            "createdAt": crate::core::time::rfc3339(self.created_ms),
            "lastUpdatedAt": crate::core::time::rfc3339(self.updated_ms),
            "ttlMs": retention_ms,
        });
        if !self.state.terminal() {
            t["pollIntervalMs"] = json!(poll_ms);
        }
        if let Some(m) = &self.status_message {
            t["statusMessage"] = json!(m);
        }
        match self.state {
            TaskState::Completed => {
                let mut result = self
                    .result
                    .clone()
                    .unwrap_or_else(|| json!({"content": []}));
                if let Some(o) = result.as_object_mut() {
                    o.insert("resultType".into(), json!("complete"));
                }
                t["result"] = result;
            }
            TaskState::Failed => {
                t["error"] = self
                    .error
                    .clone()
                    .unwrap_or_else(|| json!({"code": -32603, "message": "the task failed"}));
            }
            TaskState::Waiting | TaskState::Claimed => {
                if let Some(meta) = self.authorization_meta() {
                    t["_meta"] = meta;
                }
            }
            TaskState::Cancelled => {}
        }
        t
    }

    /// The SEP-2643 envelope of a task that waits for a person: the
    /// decision is pending, and the remedy is to wait on this task.
    pub fn authorization_meta(&self) -> Option<Value> {
        if self.state != TaskState::Waiting {
            return None;
        }
        let p = self.proposal_id.as_ref()?;
        Some(json!({ AUTHORIZATION_META: {
            "decision": "pending",
            "reason": "approval_required",
            "proposalId": p,
            "remediationHints": [{ "type": "task", "taskId": self.id }],
        }}))
    }

    /// The 2025-11-25 `tasks/result` payload: the stored result with the
    /// related-task tie in `_meta`.
    pub fn v1_result(&self) -> Option<Value> {
        let mut result = self.result.clone()?;
        if let Some(o) = result.as_object_mut() {
            o.remove("resultType");
            let meta = o.entry("_meta").or_insert_with(|| json!({}));
            if let Some(m) = meta.as_object_mut() {
                m.insert(RELATED_TASK_META.into(), json!({ "taskId": self.id }));
            }
        }
        Some(result)
    }
}

/// Whether a 2026-07-28 request declared the tasks extension in its
/// client capabilities.
pub fn declares_extension(params: Option<&Value>) -> bool {
    params
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(crate::wire::era::META_CLIENT_CAPABILITIES))
        .and_then(|c| c.get("extensions"))
        .and_then(|e| e.get(TASKS_EXTENSION))
        .is_some_and(Value::is_object)
}

/// The server capabilities of 2025-11-25 core tasks: tool calls as tasks,
/// list and cancel.
pub fn v1_capability() -> Value {
    json!({ "list": {}, "cancel": {}, "requests": { "tools": { "call": {} } } })
}

/// `tools/list` result `list`, with `execution.taskSupport = "optional"` on
/// every tool whose upstream says nothing of tasks (the gateway may hold
/// any of them, and a call it runs at once is answered as a completed
/// task). `None`: nothing to change.
pub fn offer_tasks(list: &Value) -> Option<Value> {
    let tools = list.get("tools")?.as_array()?;
    let mut changed = false;
    let mut out = list.clone();
    let out_tools = out.get_mut("tools")?.as_array_mut()?;
    for (tool, out_tool) in tools.iter().zip(out_tools.iter_mut()) {
        let declared = tool
            .get("execution")
            .and_then(|e| e.get("taskSupport"))
            .is_some();
        if declared || !tool.is_object() {
            continue;
        }
        let exec = out_tool
            .as_object_mut()
            .map(|o| o.entry("execution").or_insert_with(|| json!({})));
        if let Some(Value::Object(e)) = exec {
            e.insert("taskSupport".into(), json!("optional"));
            changed = true;
        }
    }
    changed.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(state: TaskState) -> TaskRecord {
        TaskRecord {
            id: "t1".into(),
            revision: 0,
            tenant: "acme".into(),
            principal: "agent".into(),
            groups: vec![],
            scopes: vec![],
            client: None,
            aka: Vec::new(),
            server: "pay".into(),
            tool: "charge".into(),
            key: "k".into(),
            scope: None,
            params: json!({"name": "charge"}),
            proposal_id: Some("p1".into()),
            state,
            claimed_by: None,
            claimed_ms: None,
            created_ms: 0,
            updated_ms: 0,
            status_message: Some("waiting".into()),
            result: Some(json!({"content": [], "resultType": "complete"})),
            disposition: Some(Disposition::ApprovedExecuted),
            error: None,
            upstream: None,
        }
    }

    #[test]
    fn only_the_requester_owns_a_task() {
        let t = task(TaskState::Waiting);
        let me = Identity {
            principal: "agent".into(),
            tenant: "acme".into(),
            ..Default::default()
        };
        assert!(t.owned_by(&me));
        let other_tenant = Identity {
            tenant: "globex".into(),
            ..me.clone()
        };
        let other_principal = Identity {
            principal: "mallory".into(),
            ..me
        };
        assert!(!t.owned_by(&other_tenant));
        assert!(!t.owned_by(&other_principal));
    }

    #[test]
    fn waiting_and_claimed_are_working_on_the_wire() {
        assert_eq!(task(TaskState::Waiting).v1(1, 2)["status"], "working");
        assert_eq!(task(TaskState::Claimed).v2(1, 2)["status"], "working");
        let w = task(TaskState::Waiting).v2(1, 2);
        assert_eq!(
            w["_meta"][AUTHORIZATION_META]["remediationHints"][0]["type"],
            "task"
        );
        assert!(w.get("result").is_none());
    }

    #[test]
    fn a_completed_v2_task_inlines_a_complete_result_and_v1_ties_it() {
        let t = task(TaskState::Completed);
        let v2 = t.v2(1, 2);
        assert_eq!(v2["result"]["resultType"], "complete");
        assert!(v2.get("pollIntervalMs").is_none());
        let v1 = t.v1_result().unwrap();
        assert!(v1.get("resultType").is_none());
        assert_eq!(v1["_meta"][RELATED_TASK_META]["taskId"], "t1");
    }

    #[test]
    fn tools_are_offered_as_optional_tasks_unless_the_upstream_says() {
        let list = json!({"tools": [
            {"name": "a", "inputSchema": {"type": "object"}},
            {"name": "b", "inputSchema": {"type": "object"}, "execution": {"taskSupport": "forbidden"}},
        ]});
        let out = offer_tasks(&list).unwrap();
        assert_eq!(out["tools"][0]["execution"]["taskSupport"], "optional");
        assert_eq!(out["tools"][1]["execution"]["taskSupport"], "forbidden");
        let none = json!({"tools": [{"name": "b", "execution": {"taskSupport": "required"}}]});
        assert!(offer_tasks(&none).is_none());
    }

    #[test]
    fn the_extension_is_read_from_the_client_capabilities() {
        let yes = json!({"_meta": {"io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS_EXTENSION: {}}}}});
        let no = json!({"_meta": {"io.modelcontextprotocol/clientCapabilities": {}}});
        assert!(declares_extension(Some(&yes)));
        assert!(!declares_extension(Some(&no)));
        assert!(!declares_extension(None));
    }

    #[test]
    fn states_are_terminal_exactly_when_they_end() {
        assert!(!TaskState::Waiting.terminal());
        assert!(!TaskState::Claimed.terminal());
        assert!(TaskState::Completed.terminal());
        assert!(TaskState::Cancelled.terminal());
        assert!(TaskState::Failed.terminal());
        let t = task(TaskState::Completed);
        assert!(t.expired(100, 100));
        assert!(!t.expired(99, 100));
        assert!(!task(TaskState::Waiting).expired(i64::MAX, 0));
    }
}
