//! The task runner (DESIGN.md section 24): any live gateway runs the call
//! of a task whose proposal the reviewers approved, whether or not its
//! client is connected, and ends the tasks whose proposals were decided
//! against them. Driven by the approval book's events (decisions made
//! through another gateway arrive through the store's notifications), and
//! by a sweep for what no event announced.
//!
//! The run is the requester's own retry made by the gateway: the stored
//! params, identity and idempotency scope, through the pipeline (decision
//! in force now, approval consumed with the key at execution start, the
//! ledger). The execution claim is a compare-and-set in the store, the one
//! a cancel races.

use std::sync::Arc;

use serde_json::{json, Value};

use super::gateway::{Gateway, ModernUpstream};
use super::route::{Route, Target};
use super::tasks::{audit, retention_ms, told};
use crate::core::approval::ProposalState;
use crate::core::refusal::ApprovalCode;
use crate::core::task::{TaskRecord, TaskState};
use crate::core::time::ms;
use crate::enforce::answer;
use crate::enforce::answer::task::{self as words, TaskEnd};
use crate::enforce::pipeline::{CallCtx, Caller};
use crate::store::TaskFilter;
use crate::wire::era::{modern_headers, own_envelope, Era, MODERN_VERSIONS};
use crate::wire::jsonrpc::{raw, Message};

/// The runner: drives the tasks whose proposals were decided (told by the
/// approval book, which also hears decisions made through other gateways),
/// and sweeps now and then for what no event announced (a decision made
/// while this gateway was down, a proposal left to expire, a claim left by
/// a gateway that stopped mid-run). Ended tasks are collected after
/// `tasks.retention`.
pub(crate) async fn run(gw: Arc<Gateway>) {
    use tokio::sync::broadcast::error::RecvError;
    let mut changes = gw.pipeline().book().subscribe();
    let mut tick = tokio::time::interval(gw.config().tasks.poll_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sweeps: u64 = 0;
    loop {
        tokio::select! {
            change = changes.recv() => match change {
                Ok(e) if e.proposal.state != ProposalState::Pending => {
                    match gw.pipeline().store().tasks(TaskFilter::Proposal(e.proposal.id.clone())).await {
                        Ok(tasks) => for t in tasks {
                            spawn_drive(&gw, t.id);
                        },
                        Err(e) => tracing::warn!("task store unavailable; the sweep will look again: {e}"),
                    }
                }
                Ok(_) => {}
                Err(RecvError::Lagged(_)) => sweep(&gw, true).await,
                Err(RecvError::Closed) => return,
            },
            _ = tick.tick() => {
                // The first sweep reads every open task's proposal (what was
                // decided while this gateway was down); later ones only
                // those old enough to have expired.
                sweep(&gw, sweeps == 0).await;
                sweeps += 1;
                if sweeps.is_multiple_of(30) {
                    collect(&gw).await;
                }
            }
        }
    }
}

fn spawn_drive(gw: &Arc<Gateway>, id: String) {
    let gw = gw.clone();
    tokio::spawn(async move { drive(&gw, &id).await });
}

/// Look at every open task: a waiting one whose proposal may have ended, a
/// claim left stale by a gateway that stopped.
async fn sweep(gw: &Arc<Gateway>, everything: bool) {
    let store = gw.pipeline().store();
    let open = match store.tasks(TaskFilter::Open).await {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!("task store unavailable: {e}");
            return;
        }
    };
    let now = gw.pipeline().clock().now_ms();
    let pending_ttl = ms(gw.config().approvals.pending_ttl);
    let claim_timeout = ms(gw.config().tasks.claim_timeout);
    // One process per store (redb, memory): a claim not made by this very
    // process was left by one that stopped.
    let alone = store.subscribe().is_none();
    for t in open {
        // A relayed task is the server's to run.
        if gw.tasks().is_running(&t.id) || t.upstream.is_some() {
            continue;
        }
        let due = match t.state {
            TaskState::Waiting => everything || now >= t.created_ms.saturating_add(pending_ttl),
            TaskState::Claimed => {
                t.claimed_by.as_deref() != Some(gw.tasks().me())
                    && (alone || now >= t.claimed_ms.unwrap_or(0).saturating_add(claim_timeout))
            }
            _ => false,
        };
        if due {
            spawn_drive(gw, t.id);
        }
    }
}

async fn collect(gw: &Gateway) {
    let before = gw
        .pipeline()
        .clock()
        .now_ms()
        .saturating_sub(retention_ms(gw));
    match gw.pipeline().store().tasks_gc(before).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(collected = n, "ended tasks past tasks.retention removed"),
        Err(e) => tracing::warn!("task collection failed: {e}"),
    }
}

/// Drive task `id` one step: end it if its proposal was decided against
/// it, or claim it and run its call if the reviewers said yes (or if a
/// claim of another gateway went stale).
async fn drive(gw: &Arc<Gateway>, id: &str) {
    let Some(_driving) = gw.tasks().start(id) else {
        return;
    };
    let store = gw.pipeline().store();
    let task = match store.task_get(id).await {
        Ok(Some(t)) if !t.state.terminal() && t.upstream.is_none() => t,
        Ok(_) => return,
        Err(e) => {
            tracing::warn!(task = id, "task store unavailable: {e}");
            return;
        }
    };
    let now = gw.pipeline().clock().now_ms();
    let me = gw.tasks().me().to_owned();
    if task.state == TaskState::Claimed {
        let stale = task.claimed_by.as_deref() != Some(me.as_str());
        if !stale {
            return;
        }
        tracing::info!(task = id, claimed_by = ?task.claimed_by, "taking over a task whose claim went stale; the ledger keeps its call at most once");
        return claim_and_run(gw, task, &me, now).await;
    }
    let proposal = match &task.proposal_id {
        Some(p) => match gw.pipeline().book().get(p).await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(task = id, "approval book unavailable: {e}");
                return;
            }
        },
        None => None,
    };
    let output_schema = gw
        .pipeline()
        .catalog()
        .declares_output_schema(&task.server, &task.tool);
    let proposal_id = task.proposal_id.clone().unwrap_or_default();
    let pending_ttl = ms(gw.config().approvals.pending_ttl);
    let end = match &proposal {
        Some(p) if p.state == ProposalState::Pending => {
            if now < p.created_ms.saturating_add(pending_ttl) {
                return; // still for the reviewers
            }
            words::refused(
                ApprovalCode::Expired,
                &proposal_id,
                Some("nobody decided it in time".into()),
                &task.key,
                &task.tool,
                output_schema,
            )
        }
        Some(p) if p.state == ProposalState::Expired => words::refused(
            ApprovalCode::Expired,
            &proposal_id,
            p.reason.clone(),
            &task.key,
            &task.tool,
            output_schema,
        ),
        Some(p) if p.state == ProposalState::Denied => words::refused(
            ApprovalCode::Denied,
            &proposal_id,
            p.decision
                .as_ref()
                .map(|d| d.statement.reason.clone())
                .or_else(|| p.reason.clone()),
            &task.key,
            &task.tool,
            output_schema,
        ),
        Some(p) if p.state == ProposalState::Invalidated => words::refused(
            ApprovalCode::Denied,
            &proposal_id,
            Some(format!(
                "the approval was voided: {}",
                p.reason.clone().unwrap_or_default()
            )),
            &task.key,
            &task.tool,
            output_schema,
        ),
        // Approved, consumed (a direct retry of the call used it: the
        // ledger replays its answer to the task's key), or no longer kept:
        // the call is run, and the pipeline decides.
        _ => return claim_and_run(gw, task, &me, now).await,
    };
    finish(gw, task, end, "task_completed").await;
}

/// The execution claim, then the call.
async fn claim_and_run(gw: &Arc<Gateway>, task: TaskRecord, me: &str, now: i64) {
    let store = gw.pipeline().store();
    let claimed = task.next(now, |t| {
        t.state = TaskState::Claimed;
        t.claimed_by = Some(me.to_owned());
        t.claimed_ms = Some(now);
        t.status_message = Some(words::running(task.proposal_id.as_deref()));
    });
    // INVARIANT: the claim is a compare-and-set from the revision read: a
    // cancel (or another gateway's claim) read at the same revision loses
    // or wins as a whole, and a cancelled task is never run.
    match store.task_put(claimed.clone()).await {
        Ok(true) => {}
        Ok(false) => return,
        Err(e) => {
            tracing::warn!(task = %task.id, "task store unavailable, not claimed: {e}");
            return;
        }
    }
    gw.pipeline().metrics().task("claimed");
    audit(gw, "task_claimed", &claimed, &[("gateway", json!(me))]);
    told(gw, &claimed);
    let end = run_call(gw, &claimed).await;
    finish(gw, claimed, end, "task_completed").await;
}

/// Record how a task's call ended: completed with its result, or back to
/// waiting on the proposal the pipeline asked for.
async fn finish(gw: &Gateway, task: TaskRecord, end: TaskEnd, kind: &'static str) {
    let now = gw.pipeline().clock().now_ms();
    let next = match end {
        TaskEnd::Waiting(proposal) => {
            let proposal = proposal.or_else(|| task.proposal_id.clone());
            let message = proposal
                .as_deref()
                .map(|p| words::waiting(p, gw.pipeline().book().review_url(p).as_deref()));
            task.next(now, |t| {
                t.state = TaskState::Waiting;
                t.claimed_by = None;
                t.claimed_ms = None;
                t.proposal_id = proposal;
                t.status_message = message;
            })
        }
        TaskEnd::Done {
            result,
            disposition,
        } => task.next(now, |t| {
            t.state = TaskState::Completed;
            t.result = Some(result);
            t.disposition = Some(disposition);
            t.status_message = Some(words::ended(Some(disposition)));
        }),
    };
    match gw.pipeline().store().task_put(next.clone()).await {
        Ok(true) => {
            if next.state.terminal() {
                gw.tasks().forget_subject(&next.id);
                if let Some(d) = next.disposition {
                    gw.pipeline().metrics().task(d.as_str());
                }
                audit(gw, kind, &next, &[]);
                tracing::info!(task = %next.id, disposition = ?next.disposition, "task completed");
            } else {
                tracing::info!(task = %next.id, proposal = ?next.proposal_id, "task waits for a new approval");
            }
            told(gw, &next);
        }
        // Changed meanwhile (cancelled before a claim; taken over): the
        // store's version stands.
        Ok(false) => {
            tracing::info!(task = %next.id, "task changed meanwhile; its stored state stands")
        }
        // The answer is in the ledger under the task's key: the next
        // sweep's takeover replays it into the task.
        Err(e) => {
            tracing::error!(task = %next.id, "task store unavailable, result not kept yet: {e}")
        }
    }
}

/// The task's call, run as its requester's own retry: the same params,
/// identity and idempotency scope, through the pipeline, without a hold.
async fn run_call(gw: &Gateway, task: &TaskRecord) -> TaskEnd {
    let identity = Arc::new(task.identity());
    let caller = Caller {
        identity: identity.clone(),
        scope: task.scope.clone(),
        // The caller's token, kept in memory by the gateway that made the
        // task (never in the store): minted into a delegated token at
        // dispatch, under the permit; an expired one runs nothing
        // (`caller_token_expired`). Elsewhere there is none, and a server
        // that delegates refuses the call (`delegation_unavailable`).
        subject: gw.tasks().subject(&task.id),
    };
    let version = MODERN_VERSIONS[0];
    let mut params = task.params.clone();
    let (target, extra) = match gw.modern_upstream(&task.server).await {
        Ok(ModernUpstream::Legacy) => {
            match gw
                .bridged(
                    &task.server,
                    &identity,
                    &Value::Null,
                    json!("countersign-task"),
                )
                .await
            {
                Ok(b) => (Target::Session(b.session), Vec::new()),
                Err(_) => shared(&task.server, &task.tool, version),
            }
        }
        // Speaks 2026-07-28, or not reachable now (the pipeline classifies
        // the failure: nothing of the call was sent).
        _ => {
            if let Some(o) = params.as_object_mut() {
                let meta = o.entry("_meta").or_insert_with(|| json!({}));
                if let Some(m) = meta.as_object_mut() {
                    for (k, v) in own_envelope(version) {
                        m.entry(k).or_insert(v);
                    }
                }
            }
            shared(&task.server, &task.tool, version)
        }
    };
    let route = Route {
        gw,
        caller: &caller,
        target,
        extra,
    };
    let ctx = CallCtx {
        caller: &caller,
        server: &task.server,
        era: Era::Modern,
        events: None,
        upstream: &route,
        asks: None,
        task: true,
    };
    let id = json!(format!("countersign-{}", task.id));
    let request = Message::request(id, "tools/call", Some(raw(&params)));
    let outcome = gw.pipeline().tool_call(&ctx, request).await;
    let output_schema = answer::code_of(&outcome).is_some()
        && gw
            .pipeline()
            .catalog()
            .declares_output_schema(&task.server, &task.tool);
    words::task_end(outcome, output_schema)
}

fn shared(server: &str, tool: &str, version: &str) -> (Target, crate::upstream::ExtraHeaders) {
    (
        Target::Shared {
            server: server.to_owned(),
        },
        modern_headers("tools/call", Some(tool), version),
    )
}
