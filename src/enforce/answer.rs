//! The one place where outcomes and gateway-side failures become wire
//! answers (DESIGN.md section 7). A `tools/call` gets a `CallToolResult`
//! with `isError: true`, a plain paragraph for the model and
//! `structuredContent.countersign = { code, message, ...details }`; any other
//! method gets a JSON-RPC error with the code in `data`. Nothing else in
//! countersign words a refusal.

use serde_json::{json, Value};

pub mod task;

use super::outcome::CallOutcome;
use super::upstream::UpstreamError;
use crate::core::ledger::Answer;
use crate::core::refusal::{ApprovalCode, ApprovalNote, ConfirmCode, Outcome, Question};
use crate::wire::era::{Era, HeaderProblem, HANDSHAKE_VERSIONS, MODERN_VERSIONS};
use crate::wire::jsonrpc::{code, raw, Message, ParseError};
use crate::wire::members;

/// Codes of `structuredContent.countersign.code`.
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
    /// A budget refuses the call: it would pass its limit.
    pub const BUDGET_EXCEEDED: &str = "budget_exceeded";
    /// An effect key refuses the call: it repeats one made within its window.
    pub const EFFECT_REPEATED: &str = "effect_repeated";
    /// The call waits for a human approval.
    pub const APPROVAL_PENDING: &str = "approval_pending";
    /// A reviewer denied the call.
    pub const APPROVAL_DENIED: &str = "approval_denied";
    /// The approval expired before the call came back.
    pub const APPROVAL_EXPIRED: &str = "approval_expired";
    /// The resource changed since the reviewer saw it.
    pub const STALE_RESOURCE_VERSION: &str = "stale_resource_version";
    /// A pinned tool the server no longer lists.
    pub const TOOL_UNAVAILABLE: &str = "tool_unavailable";
    /// The server is called as the person who asks, and the caller's
    /// credential cannot be delegated: nothing ran.
    pub const DELEGATION_UNAVAILABLE: &str = "delegation_unavailable";
    /// The gateway asks the person at the client (2026-07-28
    /// `input_required`; audit and metrics only, never a tool error).
    pub const INPUT_REQUIRED: &str = "input_required";
    /// A `requestState` the gateway did not issue, or one altered.
    pub const CONFIRMATION_INVALID: &str = "confirmation_invalid";
    /// A `requestState` issued for another call, principal or key.
    pub const CONFIRMATION_MISMATCH: &str = "confirmation_mismatch";
    /// A `requestState` past its expiry.
    pub const CONFIRMATION_EXPIRED: &str = "confirmation_expired";
    /// A `requestState` whose answer was already used.
    pub const CONFIRMATION_USED: &str = "confirmation_used";
}

/// The `_meta` key that always carries countersign's decision object.
pub const DECISION_META: &str = "dev.countersign/decision";

/// How a `tools/call` answer must be shaped for the client that asks: its
/// wire era, and whether the tool declares an `outputSchema` (then
/// `structuredContent` must conform to it, and SDK clients throw on one that
/// does not, so countersign's decision travels in `_meta` and the text only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// The asking client's era.
    pub era: Era,
    /// The tool declares an `outputSchema`.
    pub output_schema: bool,
}

impl From<Era> for Shape {
    fn from(era: Era) -> Shape {
        Shape {
            era,
            output_schema: false,
        }
    }
}

/// The answer to a `tools/call` request with JSON-RPC id `id`.
pub fn render(outcome: CallOutcome, id: Value, shape: impl Into<Shape>) -> Message {
    let shape = shape.into();
    let era = shape.era;
    match outcome {
        CallOutcome::Answered(m) => m,
        CallOutcome::Replayed {
            answer,
            key,
            answered_at,
        } => replay(id, &answer, &key, &answered_at, era),
        CallOutcome::Cached {
            answer,
            answered_at,
        } => marked(
            id,
            &answer,
            Some((
                "dev.countersign/cached",
                json!({ "first_answered_at": answered_at }),
            )),
            era,
        ),
        CallOutcome::Joined(answer) => marked(id, &answer, None, era),
        CallOutcome::Refused { why, key, tool } => refusal(id, why, &key, &tool, shape),
        CallOutcome::ToolUnavailable {
            server,
            tool,
            lookalike,
        } => {
            let shown = crate::core::legible::text(&tool);
            let alike = lookalike
                .as_deref()
                .map(|l| format!(" (the name only looks like `{}`, which it is not)", legible_owned(l)))
                .unwrap_or_default();
            let mut details = json!({ "server": server, "tool": tool });
            if let Some(l) = lookalike {
                details["looks_like"] = json!(l);
            }
            tool_error(
                id,
                codes::TOOL_UNAVAILABLE,
                &format!(
                    "The call did not run: server `{server}` does not list tool `{shown}`{alike}. \
                     List tools again and use one the server offers; if a pinned tool went away, \
                     an operator can accept the change with `countersign tools pin`."
                ),
                details,
                shape,
            )
        }
        CallOutcome::DelegationUnavailable { server, issuer } => tool_error(
            id,
            codes::DELEGATION_UNAVAILABLE,
            &format!(
                "The call did not run: server `{server}` is called as the person who asks, with a token \
                 exchanged at identity provider `{issuer}`, and this request's credential is not one of that \
                 provider's access tokens. Sign in through `{issuer}` and call again."
            ),
            json!({ "server": server, "issuer": issuer }),
            shape,
        ),
        CallOutcome::CircuitOpen { server } => tool_error(
            id,
            codes::UPSTREAM_UNAVAILABLE,
            &format!(
                "The call did not run: upstream `{server}` is failing and countersign stopped sending to it for a while \
                 (circuit open). It is safe to try again later."
            ),
            json!({ "circuit": "open" }),
            shape,
        ),
        CallOutcome::LedgerUnavailable(_) => tool_error(
            id,
            codes::UPSTREAM_UNAVAILABLE,
            "The call did not run: countersign could not record it in its ledger. It is safe to try again later.",
            json!({}),
            shape,
        ),
        CallOutcome::AuditUnavailable => tool_error(
            id,
            codes::UPSTREAM_UNAVAILABLE,
            "The call did not run: countersign could not record it in its audit log. It is safe to try again later.",
            json!({}),
            shape,
        ),
        CallOutcome::Invalid(text) => Message::error(id, code::INVALID_PARAMS, &text, None),
        CallOutcome::Failed(e) => upstream_failure(id, "tools/call", &e, shape),
    }
}

/// The `countersign` code an outcome is answered with, if countersign
/// answers it itself (for the audit trail).
pub fn code_of(outcome: &CallOutcome) -> Option<&'static str> {
    Some(match outcome {
        CallOutcome::Answered(_)
        | CallOutcome::Replayed { .. }
        | CallOutcome::Cached { .. }
        | CallOutcome::Joined(_)
        | CallOutcome::Invalid(_) => return None,
        CallOutcome::Refused { why, .. } => match why {
            Outcome::Denied => codes::POLICY_DENIED,
            Outcome::Approval(note) => approval_code(note.code),
            Outcome::Unknown => codes::OUTCOME_UNKNOWN,
            Outcome::Drift => codes::DRIFT_REJECTED,
            Outcome::Remap => codes::REMAP_REJECTED,
            Outcome::NotDispatched => codes::UPSTREAM_UNAVAILABLE,
            Outcome::Ask(_) => codes::INPUT_REQUIRED,
            Outcome::Confirmation(r) => confirm_code(r.code),
            Outcome::Guarded(r) => guard_code(r.code),
        },
        CallOutcome::ToolUnavailable { .. } => codes::TOOL_UNAVAILABLE,
        CallOutcome::DelegationUnavailable { .. } => codes::DELEGATION_UNAVAILABLE,
        CallOutcome::CircuitOpen { .. }
        | CallOutcome::LedgerUnavailable(_)
        | CallOutcome::AuditUnavailable => codes::UPSTREAM_UNAVAILABLE,
        CallOutcome::Failed(e) if e.dispatched() => codes::OUTCOME_UNKNOWN,
        CallOutcome::Failed(_) => codes::UPSTREAM_UNAVAILABLE,
    })
}

fn guard_code(code: &str) -> &'static str {
    match code {
        codes::BUDGET_EXCEEDED => codes::BUDGET_EXCEEDED,
        _ => codes::EFFECT_REPEATED,
    }
}

fn confirm_code(code: ConfirmCode) -> &'static str {
    match code {
        ConfirmCode::Invalid => codes::CONFIRMATION_INVALID,
        ConfirmCode::Mismatch => codes::CONFIRMATION_MISMATCH,
        ConfirmCode::Expired => codes::CONFIRMATION_EXPIRED,
        ConfirmCode::Used => codes::CONFIRMATION_USED,
    }
}

/// 2026-07-28: the question to the person at the client, as an
/// `input_required` result (SEP-2322): one `elicitation/create` under the
/// gateway's key, and the signed state to send back with the answer.
fn input_required(id: Value, q: &Question) -> Message {
    let mut requests = serde_json::Map::new();
    requests.insert(
        crate::core::confirm::INPUT_KEY.to_owned(),
        json!({ "method": "elicitation/create", "params": q.params }),
    );
    Message::response(
        id,
        raw(&json!({
            "resultType": "input_required",
            "inputRequests": requests,
            "requestState": q.state,
        })),
    )
}

fn approval_code(code: ApprovalCode) -> &'static str {
    match code {
        ApprovalCode::Pending => codes::APPROVAL_PENDING,
        ApprovalCode::Denied => codes::APPROVAL_DENIED,
        ApprovalCode::Expired => codes::APPROVAL_EXPIRED,
        ApprovalCode::Stale => codes::STALE_RESOURCE_VERSION,
    }
}

/// A `CallToolResult` that tells the agent what happened. The decision is
/// always in `_meta["dev.countersign/decision"]`, and in
/// `structuredContent.countersign` only for a tool without an
/// `outputSchema` (DESIGN.md section 7).
fn tool_error(id: Value, code: &str, text: &str, details: Value, shape: Shape) -> Message {
    let mut countersign = json!({ "code": code, "message": text });
    if let (Some(obj), Value::Object(extra)) = (countersign.as_object_mut(), details) {
        obj.extend(extra);
    }
    let mut result = json!({
        "content": [{ "type": "text", "text": text }],
        "isError": true,
    });
    if !shape.output_schema {
        result["structuredContent"] = json!({ "countersign": countersign.clone() });
    }
    result["_meta"] = json!({ DECISION_META: countersign });
    in_era(&mut result, shape.era);
    Message::response(id, raw(&result))
}

/// Methods whose 2026-07-28 results are cacheable: they carry `cacheScope`
/// and `ttlMs`, and clients refuse them without.
const CACHEABLE: [&str; 6] = [
    "prompts/list",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "server/discover",
    "tools/list",
];

/// The answer to `method` written in `era`, for a bridged session (the
/// upstream speaks the other era). 2026-07-28 results get `resultType`,
/// and cacheable ones `cacheScope: "private"` (the session is one
/// principal's) and `ttlMs: 0` (the server said nothing of freshness);
/// handshake-era results lose all three. Errors are the same in both eras.
pub fn into_era(msg: &mut Message, era: Era, method: &str) {
    let Some(result) = msg.result.as_ref() else {
        return;
    };
    // Spliced as `marked` is: the server's own bytes, with the era's members.
    let mut text = in_era_raw(result.get(), era);
    let edited = match era {
        Era::Modern if CACHEABLE.contains(&method) => {
            members::with_default(&text, "cacheScope", r#""private""#)
                .and_then(|t| members::with_default(&t, "ttlMs", "0"))
        }
        Era::Modern => None,
        Era::Handshake => members::without_member(&text, "cacheScope")
            .and_then(|t| members::without_member(&t, "ttlMs")),
    };
    if let Some(t) = edited {
        text = t;
    }
    if let Ok(r) = serde_json::value::RawValue::from_string(text) {
        msg.result = Some(r);
    }
}

/// The gateway's answer to a 2026-07-28 `server/discover` for a server it
/// bridges: what the upstream's `initialize` said of itself, offered in
/// 2026-07-28. Private to the caller's authorization context (the session
/// is per principal), never cached.
pub fn bridged_discover(id: Value, init: &Value) -> Message {
    let mut result = json!({
        "resultType": "complete",
        "supportedVersions": MODERN_VERSIONS,
        "capabilities": init.get("capabilities").cloned().unwrap_or_else(|| json!({})),
        "cacheScope": "private",
        "ttlMs": 0,
    });
    for field in ["serverInfo", "instructions"] {
        if let Some(v) = init.get(field) {
            result[field] = v.clone();
        }
    }
    Message::response(id, raw(&result))
}

/// A `tools/call` result written in `era`: 2026-07-28 results carry
/// `resultType` (`complete` unless it says otherwise), handshake-era
/// results carry none. A kept answer (replay, cached read, joined call) is
/// stored once and goes through here for whichever client asks.
fn in_era(result: &mut Value, era: Era) {
    let Some(obj) = result.as_object_mut() else {
        return;
    };
    match era {
        Era::Modern => {
            obj.entry("resultType").or_insert_with(|| json!("complete"));
        }
        Era::Handshake => {
            obj.remove("resultType");
        }
    }
}

/// What to do about a refused token exchange, by the provider's error
/// (RFC 6749 section 5.2). The provider's word says whose side is at fault:
/// `invalid_client` is the gateway's own credentials at the provider, not
/// the person's sign-in, and telling the person to sign in again would
/// send them after the wrong fix.
fn exchange_advice(reason: &str) -> &'static str {
    match reason {
        "invalid_client" | "unauthorized_client" => {
            "the identity provider does not accept the gateway's own client credentials for token exchange \
             (the `client_id` and `client_secret` or `client_key` of the server's `[servers.S.delegation]`, and the \
             client's registration at the provider, which must allow the token-exchange grant): an operator must \
             fix them; a retry fails the same way until then."
        }
        "invalid_target" | "invalid_scope" => {
            "the identity provider does not issue tokens for the audience or scope the gateway asks for this \
             server (`audience` and `scopes` of `[servers.S.delegation]`): an operator must fix them or the \
             provider's policy; a retry fails the same way until then."
        }
        "timeout" | "unreachable" | "invalid_response" => {
            "the identity provider did not give a usable answer: a retry may run it once the provider answers."
        }
        // `invalid_grant` and what a provider adds: the person's token.
        _ => "a retry may run it once the person's sign-in is valid again.",
    }
}

/// The answer to a request whose upstream call failed: an `isError` result
/// for `tools/call` (the model reads it), a JSON-RPC `-32603` with the code
/// in `data` for any other method.
pub fn upstream_failure(
    id: Value,
    method: &str,
    err: &UpstreamError,
    shape: impl Into<Shape>,
) -> Message {
    let (code, text) = if err.dispatched() {
        (
            codes::OUTCOME_UNKNOWN,
            format!(
                "The call may have run: countersign sent it to the server and the answer was lost ({err}). \
                 Verify with a read before calling again; do not retry blindly."
            ),
        )
    } else if let UpstreamError::Delegation { reason, .. } = err {
        // The provider's word (`invalid_grant`, a timeout): the agent and
        // the person see why no token could be had on their behalf.
        let text = format!(
            "The call did not run: {err}. Nothing was sent to the server; {}",
            exchange_advice(reason)
        );
        if method == "tools/call" {
            return tool_error(
                id,
                codes::UPSTREAM_UNAVAILABLE,
                &text,
                json!({ "reason": reason, "state": "not_dispatched" }),
                shape.into(),
            );
        }
        return failure(id, method, codes::UPSTREAM_UNAVAILABLE, &text, shape.into());
    } else {
        (
            codes::UPSTREAM_UNAVAILABLE,
            format!("The call did not run: {err}. It is safe to try again later."),
        )
    };
    failure(id, method, code, &text, shape.into())
}

/// The stdio bridge could not reach the gateway: nothing was sent.
pub fn gateway_unreachable(id: Value, method: &str, reason: &str, era: Era) -> Message {
    failure(
        id,
        method,
        codes::UPSTREAM_UNAVAILABLE,
        &format!("The call did not run: the countersign gateway is unreachable ({reason}). It is safe to try again later."),
        era.into(),
    )
}

/// The stdio bridge's connection to the gateway broke during a request: it
/// may have run.
pub fn gateway_lost(id: Value, method: &str, reason: &str, era: Era) -> Message {
    failure(
        id,
        method,
        codes::OUTCOME_UNKNOWN,
        &format!(
            "The call may have run: the connection to the countersign gateway broke during the call ({reason}). \
             Verify with a read before calling again; do not retry blindly."
        ),
        era.into(),
    )
}

/// A gateway-side failure of a request: an `isError` result for
/// `tools/call` (the model reads it), a JSON-RPC `-32603` with the code in
/// `data` for any other method.
fn failure(id: Value, method: &str, code: &str, text: &str, shape: Shape) -> Message {
    if method == "tools/call" {
        tool_error(id, code, text, json!({}), shape)
    } else {
        Message::error(
            id,
            code::INTERNAL_ERROR,
            text,
            Some(json!({ "countersign": { "code": code } })),
        )
    }
}

/// Why a front end refuses a request before it reaches the pipeline or an
/// upstream. The front decides its transport status; the words are here.
#[derive(Debug)]
pub enum Rejection {
    /// A browser page from a foreign origin (DNS rebinding).
    Origin,
    /// No bearer token, or one no identity has.
    Token,
    /// An access token that is not accepted here (401), and why: forged,
    /// expired, for another audience, of an unknown issuer or key.
    BadToken(String),
    /// A genuine token that may not do this (403): a missing scope or a
    /// missing tenant claim.
    Forbidden(String),
    /// The path names no configured server.
    UnknownServer {
        /// The name asked for.
        server: String,
        /// The configured names.
        known: Vec<String>,
    },
    /// The body is over `limits.max_body_bytes`.
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// The body could not be read (malformed chunking, shorter than its
    /// `Content-Length`, the connection broke).
    BodyUnreadable(String),
    /// The body did not arrive within `gateway.body_read_timeout`.
    BodyTimeout(std::time::Duration),
    /// Not a JSON-RPC message.
    Parse(ParseError),
    /// `Mcp-Session-Id` names no session of this caller.
    NoSuchSession,
    /// A handshake-era session asked with a version it cannot speak.
    SessionVersion(String),
    /// A batch in a session that did not negotiate 2025-03-26.
    BatchVersion(Option<String>),
    /// Neither a session, nor `initialize`, nor a 2026-07-28 request.
    NoSession,
    /// `initialize` inside a session.
    AlreadyInitialized,
    /// `initialize` inside a batch.
    InitializeInBatch,
    /// A batch of more members than `limits.max_batch_members`.
    BatchTooLarge {
        /// Its members.
        members: usize,
        /// The limit.
        limit: usize,
    },
    /// A second standalone stream for one session.
    StreamTaken,
    /// A GET's `Last-Event-ID` names no stream this session keeps.
    LastEventId(String),
    /// The relay task ended without an answer (it panicked or was aborted).
    NoAnswer,
    /// A 2026-07-28 request whose headers disagree with its body.
    Header(HeaderProblem),
    /// A stdin line over the bridge's `--max-line-bytes`.
    LineTooLong {
        /// The limit.
        limit: usize,
    },
    /// The bridge could not relay a batch to the gateway.
    BatchNotRelayed(String),
    /// The gateway answered the bridge with no JSON-RPC message.
    NoMessage {
        /// The HTTP status it answered with.
        status: u16,
    },
    /// The identity sent more than `limits.requests_per_second`.
    RateLimited {
        /// The limit.
        per_second: u32,
        /// When a request would be let through again.
        retry_after: std::time::Duration,
    },
    /// The identity already holds `limits.max_sessions_per_identity`
    /// sessions.
    TooManySessions {
        /// The limit.
        limit: usize,
    },
    /// A client message that could be taken for a `tools/call` outside the
    /// pipeline (a notification, a lookalike method), or a notification
    /// outside `notifications/`: never relayed.
    Unrelayable(crate::wire::toolcall::Unrelayable),
    /// A 2026-07-28 request to an upstream that speaks only the handshake
    /// era.
    LegacyUpstream {
        /// The server.
        server: String,
        /// The version the client declared.
        requested: String,
    },
}

impl Rejection {
    /// The JSON-RPC error that tells the client, under request id `id`.
    pub fn message(&self, id: Value) -> Message {
        let invalid = |text: &str| Message::error(id.clone(), code::INVALID_REQUEST, text, None);
        match self {
            Rejection::Origin => invalid(
                "origin not allowed: add it to gateway.allowed_origins if this browser origin is trusted",
            ),
            Rejection::RateLimited {
                per_second,
                retry_after,
            } => invalid(&format!(
                "too many requests: this identity may send {per_second} per second (limits.requests_per_second); \
                 nothing was sent; retry after {} ms",
                retry_after.as_millis().max(1)
            )),
            Rejection::TooManySessions { limit } => invalid(&format!(
                "too many sessions: this identity already holds {limit} (limits.max_sessions_per_identity); \
                 close one (DELETE with its Mcp-Session-Id) or reuse it"
            )),
            Rejection::Token => invalid(
                "missing or unknown bearer token: send `Authorization: Bearer TOKEN` with a token listed in [[identities]], or an access token of a configured issuer",
            ),
            Rejection::BadToken(why) => invalid(&format!("access token refused: {why}")),
            Rejection::Forbidden(why) => invalid(&format!("forbidden: {why}")),
            Rejection::UnknownServer { server, known } => invalid(&format!(
                "unknown server `{server}`: configured servers are {}",
                known.join(", ")
            )),
            Rejection::TooLarge { limit } => invalid(&format!(
                "request body larger than limits.max_body_bytes ({limit} bytes): send less, or raise the limit"
            )),
            Rejection::BodyUnreadable(reason) => invalid(&format!(
                "the request body could not be read ({reason}): send a complete body"
            )),
            Rejection::BodyTimeout(limit) => invalid(&format!(
                "the request body did not arrive within gateway.body_read_timeout ({}): nothing was run",
                humantime::format_duration(*limit)
            )),
            Rejection::Parse(e) => Message::error(id.clone(), e.code(), &e.to_string(), None),
            Rejection::NoSuchSession => invalid(
                "session not found (expired, closed, or the gateway restarted): send initialize again",
            ),
            Rejection::SessionVersion(v) => invalid(&format!(
                "unsupported MCP-Protocol-Version `{v}` for a session; supported: {}",
                HANDSHAKE_VERSIONS.join(", ")
            )),
            Rejection::BatchVersion(v) => invalid(&format!(
                "JSON-RPC batches are only part of protocol version 2025-03-26; this session negotiated `{}`: send one message per request",
                v.as_deref().unwrap_or_default()
            )),
            Rejection::NoSession => invalid(
                "missing Mcp-Session-Id header: send initialize first (2025 protocol versions), \
                 or carry `_meta[\"io.modelcontextprotocol/protocolVersion\"]` (2026-07-28)",
            ),
            Rejection::AlreadyInitialized => invalid(
                "this session is already initialized: open a new session without Mcp-Session-Id",
            ),
            Rejection::InitializeInBatch => invalid("initialize cannot be part of a batch"),
            Rejection::BatchTooLarge { members, limit } => invalid(&format!(
                "a batch of {members} messages is over limits.max_batch_members ({limit}); nothing of it was sent: \
                 send at most {limit} per batch"
            )),
            Rejection::StreamTaken => invalid("this session already has a standalone stream open"),
            Rejection::LastEventId(id) => invalid(&format!(
                "Last-Event-ID `{id}` names no stream this session keeps (ids are STREAM-SEQ, as the gateway sent them)"
            )),
            Rejection::NoAnswer => Message::error(
                id,
                code::INTERNAL_ERROR,
                "the relay task ended without an answer",
                None,
            ),
            Rejection::Header(HeaderProblem::Unsupported { requested }) => {
                let all: Vec<&str> = MODERN_VERSIONS
                    .iter()
                    .chain(HANDSHAKE_VERSIONS)
                    .copied()
                    .collect();
                Message::error(
                    id,
                    code::UNSUPPORTED_PROTOCOL_VERSION,
                    "Unsupported protocol version",
                    Some(json!({ "supported": all, "requested": requested })),
                )
            }
            Rejection::Header(problem) => {
                Message::error(id, code::HEADER_MISMATCH, &header_text(problem), None)
            }
            Rejection::LineTooLong { limit } => invalid(&format!(
                "line longer than {limit} bytes refused; nothing was sent"
            )),
            Rejection::BatchNotRelayed(e) => Message::error(
                id,
                code::INTERNAL_ERROR,
                &format!("countersign gateway: {e}"),
                None,
            ),
            Rejection::NoMessage { status } => Message::error(
                id,
                code::INTERNAL_ERROR,
                &format!("countersign gateway answered HTTP {status} without a JSON-RPC message"),
                None,
            ),
            Rejection::Unrelayable(why) => invalid(&format!("refused, nothing was sent: {why}")),
            Rejection::LegacyUpstream { server, requested } => Message::error(
                id,
                code::UNSUPPORTED_PROTOCOL_VERSION,
                &format!("upstream `{server}` speaks only the handshake era: send initialize"),
                Some(json!({ "supported": HANDSHAKE_VERSIONS, "requested": requested })),
            ),
        }
    }
}

fn legible_owned(s: &str) -> String {
    crate::core::legible::text(s).into_owned()
}

fn header_text(problem: &HeaderProblem) -> String {
    match problem {
        HeaderProblem::Missing(h) => format!("header mismatch: {h} header is missing"),
        HeaderProblem::Mismatch {
            header,
            value,
            body,
        } => format!("header mismatch: {header} `{value}` does not match {body}"),
        HeaderProblem::BadEncoding => {
            "header mismatch: Mcp-Name is not valid base64 sentinel encoding".to_owned()
        }
        HeaderProblem::Unsupported { requested } => {
            format!("unsupported protocol version `{requested}`")
        }
    }
}

fn raw_or_null(text: &str) -> Box<serde_json::value::RawValue> {
    serde_json::value::RawValue::from_string(text.to_owned()).unwrap_or_else(|_| raw(&Value::Null))
}

fn error_message(id: Value, raw_error: &str) -> Message {
    let mut m = Message::error(id, code::INTERNAL_ERROR, "", None);
    m.error = Some(raw_or_null(raw_error));
    m
}

/// A stored answer, given to a retry under its own JSON-RPC id and marked
/// `_meta["dev.countersign/replayed"]` so the client can tell it from a
/// fresh execution.
fn replay(id: Value, answer: &Answer, key: &str, answered_at: &str, era: Era) -> Message {
    marked(
        id,
        answer,
        Some((
            "dev.countersign/replayed",
            json!({ "key": key, "first_answered_at": answered_at }),
        )),
        era,
    )
}

/// A stored answer under a new id, written in the asking client's era,
/// with `mark` (when given) in its result's `_meta`.
fn marked(id: Value, answer: &Answer, mark: Option<(&str, Value)>, era: Era) -> Message {
    match answer {
        Answer::Result(text) => {
            // Spliced, never re-serialized: a replay carries the server's
            // own bytes (its numbers, escapes and spellings), plus the mark
            // and the era's `resultType`.
            let mut result = text.clone();
            if let Some((mark, value)) = mark {
                if let Some(m) = members::with_meta(&result, mark, &value.to_string()) {
                    result = m;
                }
            }
            let result = in_era_raw(&result, era);
            match serde_json::value::RawValue::from_string(result) {
                Ok(r) => Message::response(id, r),
                // The stored text is the server's own valid JSON; were it
                // not, `null` says so rather than a guess.
                Err(_) => Message::response(id, raw(&Value::Null)),
            }
        }
        Answer::Error(e) => error_message(id, e),
    }
}

/// A result's text in `era`: with `resultType` for 2026-07-28 (unless the
/// server wrote one), without it for the handshake era. Every other byte
/// is the server's; text that is not an object is left as it is.
fn in_era_raw(text: &str, era: Era) -> String {
    let edited = match era {
        Era::Modern => members::with_default(text, "resultType", r#""complete""#),
        Era::Handshake => members::without_member(text, "resultType"),
    };
    edited.unwrap_or_else(|| text.to_owned())
}

/// Verdicts that end a call without running it.
fn refusal(id: Value, outcome: Outcome, key: &str, tool: &str, shape: Shape) -> Message {
    let details = json!({ "idempotency_key": key });
    match outcome {
        // Which policy decided stays in the gateway's log and the audit log:
        // the agent learns the outcome, not how to word around it.
        Outcome::Denied => tool_error(
            id,
            codes::POLICY_DENIED,
            "Refused, nothing was run: countersign's policies do not allow this call. Do not retry it; \
             ask a person if it is needed.",
            json!({}),
            shape,
        ),
        Outcome::Approval(note) => approval_answer(id, &note, key, tool, shape),
        Outcome::Unknown => tool_error(
            id,
            codes::OUTCOME_UNKNOWN,
            &format!(
                "The call may have run: a call with idempotency key `{key}` was sent and its answer was lost. \
                 Verify with a read before calling again; do not retry blindly. An operator can reconcile it."
            ),
            details,
            shape,
        ),
        Outcome::Drift => tool_error(
            id,
            codes::DRIFT_REJECTED,
            &format!(
                "Refused, nothing was run: idempotency key `{key}` was already used for this tool with different \
                 arguments. A new call needs a new key."
            ),
            details,
            shape,
        ),
        Outcome::Remap => tool_error(
            id,
            codes::REMAP_REJECTED,
            &format!(
                "Refused, nothing was run: idempotency key `{key}` was already used for a different tool or server{}. \
                 A new call needs a new key.",
                if tool.is_empty() { String::new() } else { format!(" (this call is for `{tool}`)") }
            ),
            details,
            shape,
        ),
        Outcome::NotDispatched => tool_error(
            id,
            codes::UPSTREAM_UNAVAILABLE,
            "The call did not run: the identical call it joined could not be sent. It is safe to try again.",
            details,
            shape,
        ),
        Outcome::Ask(q) => input_required(id, &q),
        Outcome::Guarded(r) => {
            let advice = match r.code {
                codes::BUDGET_EXCEEDED => {
                    "Do not retry it: it would pass the budget again. A person can run it, or wait until earlier spending leaves the window."
                }
                _ => {
                    "Do not retry it under another key or session: countersign recognises the same effect. Check whether the earlier call did what was needed."
                }
            };
            let mut details = details;
            if let Some(o) = details.as_object_mut() {
                o.insert("guards".into(), json!(r.sentences));
            }
            tool_error(
                id,
                guard_code(r.code),
                &format!(
                    "Refused, nothing was run: {}. {advice}",
                    r.sentences.join("; ")
                ),
                details,
                shape,
            )
        }
        Outcome::Confirmation(r) => {
            let advice = match r.code {
                ConfirmCode::Used => {
                    "Send the call again without `requestState` to get its recorded answer; \
                     a new call needs a new approval."
                }
                ConfirmCode::Expired => {
                    "Send the call again without `requestState` to be asked again."
                }
                ConfirmCode::Invalid | ConfirmCode::Mismatch => {
                    "Send the `requestState` back exactly as countersign gave it, with the call it was given for."
                }
            };
            tool_error(
                id,
                confirm_code(r.code),
                &format!(
                    "Refused, nothing was run: the approval answer sent with this call to `{tool}` is not accepted: {}. {advice}",
                    r.reason
                ),
                details,
                shape,
            )
        }
    }
}

/// What an agent is told when a call waits on, or was refused by, the
/// approval workflow. The proposal id lets it (and a person) follow up; the
/// exact same call later finds the approval.
fn approval_answer(id: Value, note: &ApprovalNote, key: &str, tool: &str, shape: Shape) -> Message {
    let proposal = note.proposal_id.as_deref().unwrap_or("none");
    let mut details = json!({ "idempotency_key": key, "proposal_id": note.proposal_id });
    if let Some(r) = &note.revises {
        details["revises"] = json!(r);
    }
    if let Some(r) = &note.reason {
        details["reason"] = json!(r);
    }
    if note.by_client {
        details["channel"] = json!("client");
    }
    let tool = if tool.is_empty() {
        "this tool".to_owned()
    } else {
        format!("`{tool}`")
    };
    let text = match note.code {
        ApprovalCode::Pending if note.proposal_id.is_none() => format!(
            "Not run: this call to {tool} needs a human approval, and no proposal was made: {}. \
             Wait for reviewers to decide your earlier proposals before asking for more.",
            note.reason.as_deref().unwrap_or("too many proposals are waiting")
        ),
        ApprovalCode::Pending => format!(
            "Not run yet: this call to {tool} needs a human approval, and proposal {proposal} is waiting for a reviewer{}. \
             Nothing was run. Call again with exactly the same arguments later; once approved, it runs once. \
             Changing the arguments needs a new approval.",
            note.revises.as_deref().map(|r| format!(" (it revises proposal {r})")).unwrap_or_default()
        ),
        ApprovalCode::Denied if note.by_client => format!(
            "Refused, nothing was run: the person at the client declined this call to {tool} (proposal {proposal}){}. \
             Do not retry it.",
            note.reason.as_deref().map(|r| format!(", saying: {r}")).unwrap_or_default()
        ),
        ApprovalCode::Denied => format!(
            "Refused, nothing was run: a reviewer denied this call to {tool} (proposal {proposal}){}. Do not retry it.",
            note.reason.as_deref().map(|r| format!(", saying: {r}")).unwrap_or_default()
        ),
        ApprovalCode::Expired => format!(
            "Not run: the approval for this call to {tool} expired before it was used. Nothing was run; \
             proposal {proposal} asks a reviewer again. Call again with the same arguments once it is approved."
        ),
        ApprovalCode::Stale => format!(
            "Not run: what this call to {tool} acts on changed since a reviewer saw it{}. Nothing was run; \
             re-read the resource, then call again{}.",
            note.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default(),
            note.proposal_id.as_deref().map(|p| format!(" (proposal {p} asks a reviewer about the new version)")).unwrap_or_default()
        ),
    };
    tool_error(id, approval_code(note.code), &text, details, shape)
}

/// What the audit log's `completed` entry says of an outcome (worded here,
/// where every code is).
impl CallOutcome {
    /// `completed` fields of any outcome: whether it is an error, and the
    /// code when countersign itself answered.
    pub(crate) fn completed_fields(&self) -> Vec<(&'static str, Value)> {
        match self {
            CallOutcome::Answered(m) => super::outcome::answered_fields(m),
            other => {
                let mut f = vec![("is_error", json!(true))];
                if let Some(code) = code_of(other) {
                    f.push(("code", json!(code)));
                }
                f
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_exchange_names_whose_side_must_act() {
        let said = |reason: &str| exchange_advice(reason);
        // The gateway's own credentials, not the person's sign-in.
        assert!(said("invalid_client").contains("gateway's own client credentials"));
        assert!(!said("invalid_client").contains("sign-in"));
        assert!(said("unauthorized_client").contains("token-exchange grant"));
        assert!(said("invalid_target").contains("audience or scope"));
        assert!(said("timeout").contains("once the provider answers"));
        assert!(said("invalid_grant").contains("the person's sign-in"));
    }
}
