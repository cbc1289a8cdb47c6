//! A server's own task, relayed as a task of the gateway (DESIGN.md section
//! 24, 2025-11-25 core tasks). A tool the server declares with
//! `execution.taskSupport` is called with `task` when the client asked for
//! one; the server's `CreateTaskResult` is the call's answer, recorded by
//! the ledger like any answer (a retry with the same key gets the same
//! server task, so the same gateway task). The gateway's task maps its own
//! unguessable id to the server's and routes `tasks/get`, `tasks/result`
//! and `tasks/cancel` to the connection that holds it: the requester's own
//! session. Polling writes nothing; the task is written once more when the
//! server's task ends (its result kept, so the answer outlives the session).

use serde_json::{json, Value};

use super::gateway::Gateway;
use super::request::RequestCtx;
use super::route::{Route, Target};
use crate::core::task::{TaskRecord, TaskState, UpstreamTask};
use crate::store::TaskFilter;
use crate::wire::era::Era;
use crate::wire::jsonrpc::{raw, Message};

/// Whether a task-asking call of `tool` goes to the server as a task: a
/// 2025-11-25 session with its own upstream connection, and a tool the
/// server offers as a task.
pub(crate) fn relays(gw: &Gateway, rc: &RequestCtx, tool: &str) -> bool {
    let own_connection = matches!(&rc.target, Target::Session(s) if s.envelope.is_none());
    rc.era == Era::Handshake
        && own_connection
        && matches!(
            gw.pipeline()
                .catalog()
                .task_support(&rc.server, tool)
                .as_deref(),
            Some("required" | "optional")
        )
}

/// The server's task in a call's answer (a `CreateTaskResult`), if it is
/// one.
pub(crate) fn created_by_server(reply: &Message) -> Option<Value> {
    let result: Value = serde_json::from_str(reply.result.as_ref()?.get()).ok()?;
    let task = result.get("task")?;
    task.get("taskId")?.as_str()?;
    Some(task.clone())
}

/// The gateway's task for the server's task `upstream`: the one already
/// relaying it (a retry whose answer the ledger replayed), or a new one.
pub(crate) async fn adopt(
    gw: &Gateway,
    rc: &RequestCtx,
    tool: &str,
    params: &Value,
    upstream: &Value,
    id: String,
) -> Result<TaskRecord, crate::store::StoreError> {
    let store = gw.pipeline().store();
    let who = &rc.caller.identity;
    let upstream_id = upstream["taskId"].as_str().unwrap_or_default().to_owned();
    let mine = store
        .tasks(TaskFilter::Owner {
            tenant: who.tenant.clone(),
            principal: who.principal.clone(),
        })
        .await?;
    if let Some(t) = mine.into_iter().find(|t| {
        t.server == rc.server
            && t.upstream
                .as_ref()
                .is_some_and(|u| u.task_id == upstream_id)
    }) {
        return Ok(t);
    }
    let now = gw.pipeline().clock().now_ms();
    let session = match &rc.target {
        Target::Session(s) => Some(s.id.clone()),
        Target::Shared { .. } => None,
    };
    let record = TaskRecord {
        scope: rc.caller.scope.clone(),
        params: params.clone(),
        // INVARIANT: a relayed task is the server's to run: the gateway's
        // runner never claims it (its call was dispatched once, through
        // the ledger, when the server made the task).
        state: TaskState::Claimed,
        claimed_by: Some("upstream".into()),
        claimed_ms: Some(now),
        status_message: upstream["statusMessage"].as_str().map(str::to_owned),
        upstream: Some(UpstreamTask {
            task_id: upstream_id,
            session,
        }),
        ..TaskRecord::new(id, who, &rc.server, tool, now)
    };
    store.task_create(record).await
}

/// The server's task of `task`, as it is now: read from the server through
/// the requester's session (no store write while it works), and kept once
/// it ended. A session that is gone took the server's task with it: the
/// task ends as an unknown outcome.
pub(crate) async fn refresh(gw: &Gateway, rc: &RequestCtx, task: TaskRecord) -> TaskRecord {
    let Some(up) = task.upstream.clone() else {
        return task;
    };
    if task.state.terminal() {
        return task;
    }
    let Some(route) = route_to(gw, rc, &task, &up) else {
        let lost = crate::enforce::answer::task::relay_lost(&task.tool);
        return keep(gw, &task, TaskState::Completed, Some(lost), None).await;
    };
    let Some(now) = ask(gw, &route, &task, "tasks/get", &up.task_id).await else {
        return task;
    };
    let status = now["status"].as_str().unwrap_or("working");
    match status {
        "completed" => match ask(gw, &route, &task, "tasks/result", &up.task_id).await {
            Some(result) => keep(gw, &task, TaskState::Completed, Some(result), None).await,
            None => task,
        },
        "failed" => {
            let error = json!({
                "code": -32603,
                "message": now["statusMessage"].as_str().unwrap_or("the server's task failed"),
            });
            keep(gw, &task, TaskState::Failed, None, Some(error)).await
        }
        "cancelled" => keep(gw, &task, TaskState::Cancelled, None, None).await,
        // Working (or waiting for input): shown as the server says it, and
        // not written.
        _ => {
            let mut shown = task;
            if let Some(m) = now["statusMessage"].as_str() {
                shown.status_message = Some(m.to_owned());
            }
            shown
        }
    }
}

/// `tasks/cancel` of a relayed task: sent to the server; the task is kept
/// as cancelled when the server says it is.
pub(crate) async fn cancel(gw: &Gateway, rc: &RequestCtx, task: TaskRecord) -> TaskRecord {
    let Some(up) = task.upstream.clone() else {
        return task;
    };
    let Some(route) = route_to(gw, rc, &task, &up) else {
        return task;
    };
    match ask(gw, &route, &task, "tasks/cancel", &up.task_id).await {
        Some(now) if now["status"] == "cancelled" => {
            keep(gw, &task, TaskState::Cancelled, None, None).await
        }
        _ => refresh(gw, rc, task).await,
    }
}

/// The requester's session that holds the server's task.
fn route_to<'a>(
    gw: &'a Gateway,
    rc: &'a RequestCtx,
    task: &TaskRecord,
    up: &UpstreamTask,
) -> Option<Route<'a>> {
    let sid = up.session.as_deref()?;
    let session = gw.session_of(&task.server, sid, &task.principal, &task.tenant)?;
    Some(Route {
        gw,
        caller: &rc.caller,
        target: Target::Session(session),
        extra: Vec::new(),
    })
}

/// One `tasks/*` request to the server; its result, or `None` when it did
/// not answer with one.
async fn ask(
    gw: &Gateway,
    route: &Route<'_>,
    task: &TaskRecord,
    method: &str,
    upstream_id: &str,
) -> Option<Value> {
    let id = json!(format!("countersign-{}", task.id));
    let msg = Message::request(id, method, Some(raw(&json!({ "taskId": upstream_id }))));
    let timeout = gw.pipeline().call_timeout(&task.server);
    match route.call(&task.server, msg, None, timeout).await {
        Ok(resp) => resp
            .result
            .as_ref()
            .and_then(|r| serde_json::from_str::<Value>(r.get()).ok()),
        Err(e) => {
            tracing::warn!(task = %task.id, server = %task.server, %method, "the server's task could not be asked: {e}");
            None
        }
    }
}

/// Keep how the server's task ended (one write); the stored task if another
/// request kept it first.
async fn keep(
    gw: &Gateway,
    task: &TaskRecord,
    state: TaskState,
    result: Option<Value>,
    error: Option<Value>,
) -> TaskRecord {
    let now = gw.pipeline().clock().now_ms();
    let next = task.next(now, |t| {
        t.state = state;
        t.result = result.map(|mut r| {
            if let Some(meta) = r.get_mut("_meta").and_then(Value::as_object_mut) {
                // The server's tie to its own task id stays with the server.
                meta.remove(crate::core::task::RELATED_TASK_META);
            }
            r
        });
        t.error = error;
        t.status_message = Some(match state {
            TaskState::Completed => "the server's task completed".into(),
            TaskState::Cancelled => "the server's task was cancelled".into(),
            _ => "the server's task failed".into(),
        });
    });
    let store = gw.pipeline().store();
    match store.task_put(next.clone()).await {
        Ok(true) => {
            gw.tasks().changed(&next.id);
            next
        }
        _ => store
            .task_get(&task.id)
            .await
            .ok()
            .flatten()
            .unwrap_or(next),
    }
}
