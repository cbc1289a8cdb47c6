//! Held calls as MCP tasks (DESIGN.md section 24): a client that asks for a
//! task (2025-11-25: `task` in a `tools/call`; 2026-07-28: the
//! `io.modelcontextprotocol/tasks` extension in its capabilities) gets a
//! task handle instead of `approval_pending`, and its own client library
//! waits for the reviewers. When they decide, any live gateway runs the
//! call and keeps the answer in the task.
//!
//! The runner that runs approved calls is [`super::task_runner`].
//!
//! The run is the client's own retry made by the gateway: the same params,
//! identity and idempotency scope, through the same pipeline (the decision
//! in force now, the approval consumed with the key at execution start, the
//! ledger). So every guarantee of a retried call holds for a task: at most
//! once per key across retries, crashes and gateways, `outcome_unknown`
//! when the answer was lost. What the task adds is one compare-and-set in
//! the store between the execution claim and a cancel.

use std::time::Duration;

use serde_json::{json, Value};

use super::gateway::Gateway;
use super::request::RequestCtx;
use super::route::Target;
use crate::core::approval::ProposalState;
use crate::core::refusal::{ApprovalCode, ApprovalNote, Outcome};
use crate::core::task::{declares_extension, TaskRecord, TaskState, TASKS_EXTENSION};
use crate::core::time::ms;
use crate::enforce::answer::task as words;
use crate::enforce::answer::{self, Shape};
use crate::enforce::outcome::CallOutcome;
use crate::enforce::pipeline::CallCtx;
use crate::store::TaskFilter;
use crate::wire::era::Era;
use crate::wire::jsonrpc::{code, raw, Message};
use crate::wire::sse::UpstreamEvent;

/// The first handshake-era version with core tasks.
const V1_FROM: &str = "2025-11-25";

/// Whether this handshake-era request's session negotiated a version with
/// core tasks.
fn speaks_v1(rc: &RequestCtx) -> bool {
    match &rc.target {
        Target::Session(s) => s
            .protocol_version
            .lock()
            .as_deref()
            .is_some_and(|v| v >= V1_FROM),
        Target::Shared { .. } => false,
    }
}

/// Whether `msg`, a `tools/call`, asks for a task. A cheap look at the raw
/// params first: the calls of clients that never ask pay for no parse.
pub(crate) fn wants_task(gw: &Gateway, rc: &RequestCtx, msg: &Message) -> bool {
    if !gw.config().tasks.enabled {
        return false;
    }
    let Some(params) = msg.params.as_ref().map(|p| p.get()) else {
        return false;
    };
    match rc.era {
        Era::Handshake => {
            params.contains("\"task\"")
                && speaks_v1(rc)
                && msg
                    .params_value()
                    .is_some_and(|p| p.get("task").is_some_and(Value::is_object))
        }
        Era::Modern => {
            params.contains(TASKS_EXTENSION) && declares_extension(msg.params_value().as_ref())
        }
    }
}

/// A 2025-11-25 session's `initialize` answer, with core tasks declared
/// (tool calls as tasks, list, cancel) when the session speaks them.
pub(crate) fn offer_in_initialize(
    gw: &Gateway,
    session: &super::gateway::Session,
    resp: Message,
) -> Message {
    let speaks = session
        .protocol_version
        .lock()
        .as_deref()
        .is_some_and(|v| v >= V1_FROM);
    if !gw.config().tasks.enabled || !speaks {
        return resp;
    }
    let Some(mut result) = resp
        .result
        .as_ref()
        .and_then(|r| serde_json::from_str::<Value>(r.get()).ok())
    else {
        return resp;
    };
    if let Some(caps) = result
        .get_mut("capabilities")
        .and_then(Value::as_object_mut)
    {
        caps.insert("tasks".into(), crate::core::task::v1_capability());
    }
    Message::response(resp.id.clone().unwrap_or(Value::Null), raw(&result))
}

/// A 2026-07-28 `server/discover` answer with the tasks and tool-approval
/// extensions declared.
pub(crate) fn offer_in_discover(gw: &Gateway, resp: &mut Message) {
    if !gw.config().tasks.enabled {
        return;
    }
    let Some(mut result) = resp
        .result
        .as_ref()
        .and_then(|r| serde_json::from_str::<Value>(r.get()).ok())
    else {
        return;
    };
    let Some(caps) = result.as_object_mut().map(|o| {
        o.entry("capabilities")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .map(|c| c.entry("extensions").or_insert_with(|| json!({})))
    }) else {
        return;
    };
    if let Some(Value::Object(ext)) = caps {
        ext.insert(TASKS_EXTENSION.into(), json!({}));
        ext.insert(crate::core::task::TOOL_APPROVAL_EXTENSION.into(), json!({}));
    }
    resp.result = Some(raw(&result));
}

/// A handshake-era `tools/list` answer with tools offered as optional
/// tasks, when the session speaks them.
pub(crate) fn offer_in_list(gw: &Gateway, rc: &RequestCtx, resp: &mut Message) {
    if !gw.config().tasks.enabled || rc.era != Era::Handshake || !speaks_v1(rc) {
        return;
    }
    let Some(list) = resp
        .result
        .as_ref()
        .and_then(|r| serde_json::from_str::<Value>(r.get()).ok())
    else {
        return;
    };
    if let Some(offered) = crate::core::task::offer_tasks(&list) {
        resp.result = Some(raw(&offered));
    }
}

/// The params a task's call goes out with: without `task` (the gateway runs
/// the call itself) and without the tasks extension in the client's
/// capabilities (the upstream answers the call, not a task of its own).
fn without_task(mut params: Value) -> Value {
    if let Some(o) = params.as_object_mut() {
        o.remove("task");
        if let Some(ext) = o
            .get_mut("_meta")
            .and_then(|m| m.get_mut(crate::wire::era::META_CLIENT_CAPABILITIES))
            .and_then(|c| c.get_mut("extensions"))
            .and_then(Value::as_object_mut)
        {
            ext.remove(TASKS_EXTENSION);
        }
    }
    params
}

pub(crate) fn retention_ms(gw: &Gateway) -> i64 {
    ms(gw.config().tasks.retention)
}

pub(crate) fn poll_ms(gw: &Gateway) -> i64 {
    ms(gw.config().tasks.poll_interval)
}

/// A task id: 128 random bits. It is the task's only handle, and it is
/// shown to its requester alone; guessing one finds nothing (another
/// requester's task answers "not found").
fn mint_id() -> String {
    let bytes: [u8; 16] = rand::random();
    format!("task-{}", hex::encode(bytes))
}

/// A `tools/call` that asked for a task: run through the pipeline without
/// a hold; a call that needs a yes becomes (or joins) a task, and any other
/// outcome is answered as the era requires (2025-11-25: a completed task;
/// 2026-07-28: the plain result).
pub(crate) async fn tools_call(
    gw: &Gateway,
    rc: &RequestCtx,
    msg: Message,
    events: Option<tokio::sync::mpsc::Sender<UpstreamEvent>>,
) -> Message {
    let id = msg.id.clone().unwrap_or(Value::Null);
    let asked = msg.params_value().unwrap_or_else(|| json!({}));
    let tool = asked
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    // A tool its server runs as a task of its own goes with `task`: the
    // server's task is relayed (see `upstream_tasks`).
    let relay = super::upstream_tasks::relays(gw, rc, &tool);
    let params = match relay {
        true => asked,
        false => without_task(asked),
    };
    let request = Message::request(id.clone(), "tools/call", Some(raw(&params)));
    let route = rc.route(gw);
    let ctx = CallCtx {
        caller: &rc.caller,
        server: &rc.server,
        era: rc.era,
        events,
        upstream: &route,
        asks: None,
        task: true,
    };
    let outcome = gw.pipeline().tool_call(&ctx, request).await;
    let output_schema = answer::code_of(&outcome).is_some()
        && gw
            .pipeline()
            .catalog()
            .declares_output_schema(&rc.server, &tool);
    let shape = Shape {
        era: rc.era,
        output_schema,
    };
    if let CallOutcome::Refused {
        why:
            Outcome::Approval(ApprovalNote {
                code: ApprovalCode::Pending,
                proposal_id: Some(proposal),
                ..
            }),
        key,
        ..
    } = &outcome
    {
        let now = gw.pipeline().clock().now_ms();
        let who = &rc.caller.identity;
        let record = TaskRecord {
            key: key.clone(),
            scope: rc.caller.scope.clone(),
            params: params.clone(),
            proposal_id: Some(proposal.clone()),
            status_message: Some(words::waiting(
                proposal,
                gw.pipeline().book().review_url(proposal).as_deref(),
            )),
            ..TaskRecord::new(mint_id(), who, &rc.server, &tool, now)
        };
        match gw.pipeline().store().task_create(record.clone()).await {
            Ok(task) => {
                // The caller's token, for a server that delegates: in
                // memory, for the run this gateway may make.
                if let Some(subject) = &rc.caller.subject {
                    gw.tasks().keep_subject(&task.id, subject.clone(), now);
                }
                if task.id == record.id {
                    gw.pipeline().metrics().task("created");
                    audit(gw, "task_created", &task, &[]);
                    tracing::info!(task = %task.id, proposal = %proposal, tool = %tool, "held call became a task");
                } else {
                    gw.pipeline().metrics().task("joined");
                }
                tracing::Span::current().record("countersign.task", task.id.as_str());
                return created(gw, id, rc.era, &task);
            }
            // The task could not be kept: the client gets what a client
            // without tasks gets, and loses nothing (the proposal stands,
            // the same call later finds it).
            Err(e) => tracing::error!("task store unavailable, answering approval_pending: {e}"),
        }
        return answer::render(outcome, id, shape);
    }
    let mut reply = answer::render(outcome, id.clone(), shape);
    if rc.bridged {
        answer::into_era(&mut reply, rc.era, "tools/call");
    }
    if rc.era == Era::Modern {
        return reply;
    }
    if let Some(theirs) = super::upstream_tasks::created_by_server(&reply).filter(|_| relay) {
        return match super::upstream_tasks::adopt(gw, rc, &tool, &params, &theirs, mint_id()).await
        {
            Ok(task) => {
                gw.pipeline().metrics().task("relayed");
                audit(gw, "task_created", &task, &[("relayed", json!(true))]);
                tracing::Span::current().record("countersign.task", task.id.as_str());
                created(gw, id, rc.era, &task)
            }
            // The server's task is not lost: its id goes to the client as
            // the server gave it.
            Err(e) => {
                tracing::error!(
                    "task store unavailable, the server's task is handed over as it is: {e}"
                );
                reply
            }
        };
    }
    // 2025-11-25: a task-augmented request is answered with a task, here
    // one that is already complete.
    let now = gw.pipeline().clock().now_ms();
    let who = &rc.caller.identity;
    let result = match (&reply.result, reply.error_summary()) {
        (Some(r), _) => serde_json::from_str::<Value>(r.get()).unwrap_or_else(|_| json!({})),
        (None, _) => return reply,
    };
    // Nothing of the requester's but who it is: the task only keeps the
    // answer (no call to run again, no groups to decide it again with).
    let record = TaskRecord {
        groups: Vec::new(),
        scopes: Vec::new(),
        state: TaskState::Completed,
        status_message: Some(words::ended(None)),
        result: Some(result),
        ..TaskRecord::new(mint_id(), who, &rc.server, &tool, now)
    };
    match gw.pipeline().store().task_create(record).await {
        Ok(task) => created(gw, id, rc.era, &task),
        Err(e) => {
            tracing::error!("task store unavailable, answering the result itself: {e}");
            reply
        }
    }
}

/// The answer that hands a client its task.
fn created(gw: &Gateway, id: Value, era: Era, task: &TaskRecord) -> Message {
    let result = match era {
        Era::Handshake => json!({ "task": task.v1(retention_ms(gw), poll_ms(gw)) }),
        Era::Modern => {
            let mut t = task.v2(retention_ms(gw), poll_ms(gw));
            if let Some(o) = t.as_object_mut() {
                o.remove("result");
                o.remove("error");
                o.insert("resultType".into(), json!("task"));
            }
            t
        }
    };
    Message::response(id, raw(&result))
}

/// A `tasks/*` request: answered by the gateway, never relayed.
pub(crate) async fn request(gw: &Gateway, rc: &RequestCtx, msg: &Message) -> Message {
    let id = msg.id.clone().unwrap_or(Value::Null);
    let method = msg.method();
    let params = msg.params_value();
    match rc.era {
        Era::Handshake if !gw.config().tasks.enabled || !speaks_v1(rc) => {
            return words::unknown_method(id, method)
        }
        Era::Modern if !gw.config().tasks.enabled => return words::unknown_method(id, method),
        Era::Modern if !declares_extension(params.as_ref()) => return words::missing_extension(id),
        _ => {}
    }
    let who = &rc.caller.identity;
    if rc.era == Era::Handshake && method == "tasks/list" {
        return list(gw, id, who, params.as_ref()).await;
    }
    let Some(task_id) = params
        .as_ref()
        .and_then(|p| p.get("taskId"))
        .and_then(Value::as_str)
    else {
        return words::no_task_id(id);
    };
    tracing::Span::current().record("countersign.task", task_id);
    let task = match load(gw, who, task_id).await {
        Ok(t) => t,
        Err(()) => return words::not_found(id, task_id),
    };
    let task = match task {
        Some(t) if t.upstream.is_some() && method == "tasks/cancel" => {
            let t = super::upstream_tasks::cancel(gw, rc, t).await;
            return cancel_answer(gw, id, rc.era, &t);
        }
        Some(t) if t.upstream.is_some() => super::upstream_tasks::refresh(gw, rc, t).await,
        Some(t) => t,
        None => return words::not_found(id, task_id),
    };
    match (rc.era, method) {
        (Era::Handshake, "tasks/get") => {
            let mut t = task.v1(retention_ms(gw), poll_ms(gw));
            if let Some(meta) = task.authorization_meta() {
                t["_meta"] = meta;
            }
            Message::response(id, raw(&t))
        }
        (Era::Modern, "tasks/get") => {
            let mut t = task.v2(retention_ms(gw), poll_ms(gw));
            t["resultType"] = json!("complete");
            Message::response(id, raw(&t))
        }
        (Era::Handshake, "tasks/result") => result(gw, rc, id, task).await,
        (_, "tasks/cancel") => cancel(gw, id, rc.era, task).await,
        (Era::Modern, "tasks/update") => words::no_input(id, task_id),
        _ => words::unknown_method(id, method),
    }
}

/// Task `id` if it exists and `who` asked for it (`Ok(None)` either way
/// otherwise); `Err`: the store did not answer.
async fn load(
    gw: &Gateway,
    who: &crate::core::identity::Identity,
    id: &str,
) -> Result<Option<TaskRecord>, ()> {
    match gw.pipeline().store().task_get(id).await {
        // Another requester's task does not exist for this caller.
        Ok(t) => Ok(t.filter(|t| t.owned_by(who))),
        Err(e) => {
            tracing::error!(task = id, "task store unavailable: {e}");
            Err(())
        }
    }
}

/// How many tasks one `tasks/list` page holds.
const LIST_PAGE: usize = 100;

async fn list(
    gw: &Gateway,
    id: Value,
    who: &crate::core::identity::Identity,
    params: Option<&Value>,
) -> Message {
    let from = params
        .and_then(|p| p.get("cursor"))
        .and_then(Value::as_str)
        .map(|c| c.parse::<usize>());
    let from = match from {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            return Message::error(
                id,
                code::INVALID_PARAMS,
                "params.cursor is not one this gateway gave",
                None,
            )
        }
    };
    let filter = TaskFilter::Owner {
        tenant: who.tenant.clone(),
        principal: who.principal.clone(),
    };
    let all = match gw.pipeline().store().tasks(filter).await {
        Ok(all) => all,
        Err(e) => {
            tracing::error!("task store unavailable: {e}");
            return answer::gateway_unreachable(
                id,
                "tasks/list",
                "the task store did not answer",
                Era::Handshake,
            );
        }
    };
    let page: Vec<Value> = all
        .iter()
        .skip(from)
        .take(LIST_PAGE)
        .map(|t| t.v1(retention_ms(gw), poll_ms(gw)))
        .collect();
    let mut result = json!({ "tasks": page });
    if all.len() > from + LIST_PAGE {
        result["nextCursor"] = json!((from + LIST_PAGE).to_string());
    }
    Message::response(id, raw(&result))
}

/// 2025-11-25 `tasks/result`: the result once the task ended, waiting for
/// it (no store write, however long it waits).
async fn result(gw: &Gateway, rc: &RequestCtx, id: Value, task: TaskRecord) -> Message {
    let who = &rc.caller.identity;
    let mut changes = gw.tasks().subscribe();
    let mut task = task;
    loop {
        if task.state.terminal() {
            return match task.v1_result() {
                Some(r) if task.state == TaskState::Completed => Message::response(id, raw(&r)),
                _ => words::task_ended(id, &task.id, task.state.wire()),
            };
        }
        // Woken by a change here or in the shared store, and looking again
        // now and then in any case (a gateway that missed a notification).
        let wait = gw.config().tasks.poll_interval.max(Duration::from_secs(1));
        let _ = tokio::time::timeout(wait, async {
            loop {
                match changes.recv().await {
                    Ok(changed) if changed == task.id => return,
                    Ok(_) => {}
                    Err(_) => return,
                }
            }
        })
        .await;
        task = match load(gw, who, &task.id).await {
            Ok(Some(t)) if t.upstream.is_some() => super::upstream_tasks::refresh(gw, rc, t).await,
            Ok(Some(t)) => t,
            _ => return words::not_found(id, &task.id),
        };
    }
}

/// `tasks/cancel`: before the execution claim the task is cancelled and its
/// proposal withdrawn; one compare-and-set decides between the cancel and
/// the claim. After the claim, cancel changes nothing.
async fn cancel(gw: &Gateway, id: Value, era: Era, task: TaskRecord) -> Message {
    let store = gw.pipeline().store();
    let mut task = task;
    for _ in 0..8 {
        match task.state {
            TaskState::Waiting => {}
            TaskState::Claimed => {
                // INVARIANT: the call may be on its way upstream: a cancel
                // after the execution claim changes nothing.
                tracing::info!(task = %task.id, "cancel after the execution claim: the call runs on");
                return cancel_answer(gw, id, era, &task);
            }
            _ => return words::task_ended(id, &task.id, task.state.wire()),
        }
        let now = gw.pipeline().clock().now_ms();
        let next = task.next(now, |t| {
            t.state = TaskState::Cancelled;
            t.status_message = Some(words::cancelled());
        });
        match store.task_put(next.clone()).await {
            Ok(true) => {
                gw.tasks().forget_subject(&next.id);
                gw.pipeline().metrics().task("cancelled");
                audit(gw, "task_cancelled", &next, &[]);
                withdraw(gw, &next).await;
                told(gw, &next);
                return cancel_answer(gw, id, era, &next);
            }
            Ok(false) => {}
            Err(e) => {
                tracing::error!(task = %task.id, "task store unavailable: {e}");
                return answer::gateway_unreachable(
                    id,
                    "tasks/cancel",
                    "the task store did not answer",
                    era,
                );
            }
        }
        // Lost to a claim or another cancel: look again.
        task = match store.task_get(&task.id).await {
            Ok(Some(t)) => t,
            _ => return words::not_found(id, &task.id),
        };
    }
    answer::gateway_unreachable(id, "tasks/cancel", "the task kept changing; ask again", era)
}

fn cancel_answer(gw: &Gateway, id: Value, era: Era, task: &TaskRecord) -> Message {
    match era {
        Era::Handshake => Message::response(id, raw(&task.v1(retention_ms(gw), poll_ms(gw)))),
        Era::Modern => Message::response(id, raw(&json!({ "resultType": "complete" }))),
    }
}

/// A cancelled task's proposal is withdrawn when no other task waits on it:
/// a later approval has nothing to run, and a direct retry of the call
/// finds no approval to consume.
async fn withdraw(gw: &Gateway, task: &TaskRecord) {
    let Some(p) = &task.proposal_id else { return };
    let book = gw.pipeline().book();
    let others = gw
        .pipeline()
        .store()
        .tasks(TaskFilter::Proposal(p.clone()))
        .await
        .map(|t| t.len())
        .unwrap_or(1);
    if others > 0 {
        return;
    }
    if let Ok(Some(proposal)) = book.get(p).await {
        if matches!(
            proposal.state,
            ProposalState::Pending | ProposalState::Approved
        ) {
            if let Err(e) = book
                .invalidate(&proposal, "its requester cancelled the task waiting on it")
                .await
            {
                tracing::warn!(proposal = %p, "could not withdraw the proposal of a cancelled task: {e}");
            }
        }
    }
}

/// A task changed: wake its waiters here, and tell its requester's
/// 2025-11-25 sessions on this gateway (`notifications/tasks/status`).
pub(crate) fn told(gw: &Gateway, task: &TaskRecord) {
    gw.tasks().changed(&task.id);
    let note = Message::notification(
        "notifications/tasks/status",
        Some(raw(&task.v1(retention_ms(gw), poll_ms(gw)))),
    );
    for s in gw.sessions_of_owner(&task.server, &task.principal, &task.tenant) {
        let speaks = s
            .protocol_version
            .lock()
            .as_deref()
            .is_some_and(|v| v >= V1_FROM);
        if speaks {
            s.notify(note.clone());
        }
    }
}

/// How many tasks wait on each proposal (one store read): reviewer
/// surfaces show which held calls have a client waiting as a task.
pub(crate) async fn waiting_by_proposal(gw: &Gateway) -> std::collections::HashMap<String, usize> {
    let mut by = std::collections::HashMap::new();
    match gw.pipeline().store().tasks(TaskFilter::Open).await {
        Ok(open) => {
            for p in open.into_iter().filter_map(|t| t.proposal_id) {
                *by.entry(p).or_insert(0) += 1;
            }
        }
        Err(e) => tracing::warn!("task store unavailable: {e}"),
    }
    by
}

/// A task's audit entry.
pub(crate) fn audit(gw: &Gateway, kind: &'static str, t: &TaskRecord, extra: &[(&str, Value)]) {
    let mut f = serde_json::Map::new();
    f.insert("task_id".into(), json!(t.id));
    f.insert("proposal_id".into(), json!(t.proposal_id));
    f.insert("principal".into(), json!(t.principal));
    f.insert("tenant".into(), json!(t.tenant));
    f.insert("server".into(), json!(t.server));
    f.insert("tool".into(), json!(t.tool));
    f.insert("state".into(), json!(t.state.as_str()));
    if let Some(d) = t.disposition {
        f.insert("disposition".into(), json!(d.as_str()));
    }
    for (k, v) in extra {
        f.insert((*k).to_owned(), v.clone());
    }
    gw.pipeline().audit(kind, f);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_call_goes_out_without_task_and_without_the_extension() {
        let params = json!({
            "name": "charge",
            "arguments": {"a": 1},
            "task": {"ttl": 5},
            "_meta": {"io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS_EXTENSION: {}, "other": {}}}},
        });
        let out = without_task(params);
        assert!(out.get("task").is_none());
        let ext = &out["_meta"]["io.modelcontextprotocol/clientCapabilities"]["extensions"];
        assert!(ext.get(TASKS_EXTENSION).is_none());
        assert!(ext.get("other").is_some());
        assert_eq!(out["arguments"]["a"], 1);
    }

    #[test]
    fn task_ids_are_unguessable() {
        let a = mint_id();
        assert_eq!(a.len(), "task-".len() + 32);
        assert_ne!(a, mint_id());
    }
}
