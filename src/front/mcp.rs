//! One MCP request in, one answer out, whatever the transport: a
//! `tools/call` goes through the enforcement pipeline, anything else is
//! relayed unchanged (a `tools/list` result is read, never altered, to
//! capture the tools' annotations). No HTTP here, and no wording: answers
//! are worded by [`crate::enforce::answer`].

use serde_json::Value;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::enforce::answer;
use crate::enforce::pipeline::CallCtx;
use crate::front::gateway::Gateway;
pub(crate) use crate::front::request::{Origin, RequestCtx};
use crate::front::route::Target;
use crate::wire::era::Era;
use crate::wire::jsonrpc::Message;
use crate::wire::sse::UpstreamEvent;

/// The answer the client gets to request `msg`: the upstream's response, or
/// the gateway's account of what happened. Server messages related to the
/// request (progress, server requests) go to `events`. With traces on, all
/// of it happens in the request's SERVER span.
pub(crate) async fn answer(
    gw: &Gateway,
    rc: &RequestCtx,
    msg: Message,
    events: Option<mpsc::Sender<UpstreamEvent>>,
) -> Message {
    // Off, nothing of the request is read for a span (the hot path).
    let span = match crate::telemetry::on() {
        true => crate::telemetry::server_span(&msg, &rc.span_request(&msg)),
        false => tracing::Span::none(),
    };
    if span.is_none() {
        return answer_in(gw, rc, msg, events, &span).await;
    }
    let reply = answer_in(gw, rc, msg, events, &span)
        .instrument(span.clone())
        .await;
    crate::telemetry::record_answer(&span, &reply);
    reply
}

impl RequestCtx {
    /// What the request's span says of where it came from.
    fn span_request(&self, msg: &Message) -> crate::telemetry::Request<'_> {
        let (session_id, protocol_version) = match (&self.target, self.era) {
            (Target::Session(s), Era::Handshake) => {
                (Some(s.id.as_str()), s.protocol_version.lock().clone())
            }
            _ => (
                None,
                crate::wire::era::declared_version(msg.params_value().as_ref()),
            ),
        };
        crate::telemetry::Request {
            server: &self.server,
            client: self.origin.client,
            header: self.origin.header.clone(),
            session_id,
            protocol_version,
        }
    }
}

async fn answer_in(
    gw: &Gateway,
    rc: &RequestCtx,
    msg: Message,
    events: Option<mpsc::Sender<UpstreamEvent>>,
    span: &tracing::Span,
) -> Message {
    let id = msg.id.clone().unwrap_or(Value::Null);
    // A session carried over a 2026-07-28 upstream: each request gets the
    // envelope that era requires (the client's capabilities and info).
    let msg = match &rc.target {
        Target::Session(s) => s.enveloped(msg),
        Target::Shared { .. } => msg,
    };
    let route = rc.route(gw);
    if msg.method() == "tools/call" {
        if super::tasks::wants_task(gw, rc, &msg) {
            // The rarer paths are boxed where they are awaited: the answer's
            // future, made for every request, stays the size of a call's.
            return Box::pin(super::tasks::tools_call(gw, rc, msg, events)).await;
        }
        // The tool's name is read only for an answer countersign words
        // itself (rare): its params are kept aside, not parsed now.
        let params = msg.params.clone();
        let ctx = CallCtx {
            caller: &rc.caller,
            server: &rc.server,
            era: rc.era,
            events,
            upstream: &route,
            asks: rc.asks.clone(),
            task: false,
        };
        let outcome = gw.pipeline().tool_call(&ctx, msg).await;
        if !span.is_none() {
            record_outcome(span, &outcome);
        }
        // Only an answer countersign words itself is shaped by the schema.
        let output_schema = answer::code_of(&outcome).is_some()
            && params
                .as_deref()
                .and_then(|p| crate::wire::era::param_text(p, "name"))
                .is_some_and(|t| {
                    gw.pipeline()
                        .catalog()
                        .declares_output_schema(&rc.server, &t)
                });
        let shape = answer::Shape {
            era: rc.era,
            output_schema,
        };
        let mut reply = answer::render(outcome, id, shape);
        if rc.bridged {
            answer::into_era(&mut reply, rc.era, "tools/call");
        }
        return reply;
    }
    // A request that could be taken for a `tools/call` (`Tools/Call`,
    // `tools.call`, lookalike letters) is answered here and never sent.
    if let Some(why) = crate::upstream::Passthrough::refusal(&msg) {
        gw.refuse_unrelayable(&rc.server, &msg, why);
        return answer::Rejection::Unrelayable(why).message(id);
    }
    // The gateway's own tasks: answered here, never relayed.
    if msg.method().starts_with("tasks/") {
        return Box::pin(super::tasks::request(gw, rc, &msg)).await;
    }
    let method = msg.method().to_owned();
    let timeout = gw.pipeline().call_timeout(&rc.server);
    match Box::pin(route.call(&rc.server, msg, events, timeout)).await {
        Ok(resp) => {
            if method == "tools/list" {
                if let Some(result) = &resp.result {
                    gw.pipeline().observe_tools_list(&rc.server, result.get());
                }
            }
            let mut resp = resp;
            if rc.bridged {
                answer::into_era(&mut resp, rc.era, &method);
            }
            // Read as the server sent it (above); offered with tasks.
            match method.as_str() {
                "tools/list" => super::tasks::offer_in_list(gw, rc, &mut resp),
                "server/discover" => super::tasks::offer_in_discover(gw, &mut resp),
                _ => {}
            }
            resp
        }
        Err(e) => {
            tracing::warn!(server = %rc.server, %method, dispatched = e.dispatched(), "upstream call failed: {e}");
            answer::upstream_failure(id, &method, &e, rc.era)
        }
    }
}

/// countersign's attributes of a `tools/call` on its SERVER span: how it
/// ended, whether it was a replay, and the proposal it waits on.
fn record_outcome(span: &tracing::Span, outcome: &crate::enforce::outcome::CallOutcome) {
    use crate::core::refusal::Outcome;
    use crate::enforce::outcome::CallOutcome;
    span.record(
        "countersign.outcome",
        crate::enforce::metrics::outcome_label(outcome),
    );
    span.record(
        "countersign.replayed",
        matches!(outcome, CallOutcome::Replayed { .. }),
    );
    if let CallOutcome::Refused {
        why: Outcome::Approval(note),
        ..
    } = outcome
    {
        if let Some(p) = &note.proposal_id {
            span.record("countersign.proposal", p.as_str());
        }
    }
}
