//! How a `tools/call` ended, as a value: what the pipeline returns and the
//! answer module words.

use super::flight::Settled;
use super::upstream::UpstreamError;
use crate::core::ledger::Answer;
use crate::core::refusal::Outcome;
use crate::store::StoreError;
use crate::wire::jsonrpc::Message;
use serde_json::{json, Value};

/// How a `tools/call` ended, before it is worded for the wire (that is
/// [`super::answer`]'s job, and nobody else's).
#[derive(Debug)]
pub enum CallOutcome {
    /// The server's answer to this call (the client's id restored).
    Answered(Message),
    /// The stored answer of an earlier call with the same key, given to a
    /// retry or a duplicate (marked as a replay).
    Replayed {
        /// The answer.
        answer: Answer,
        /// The idempotency key as the client knows it.
        key: String,
        /// When it first arrived.
        answered_at: String,
    },
    /// The answer of the identical read this call joined while in flight.
    Joined(Answer),
    /// An identical read's answer, from the read cache (`cache_ttl`).
    Cached {
        /// The answer.
        answer: Answer,
        /// When it first arrived (RFC 3339).
        answered_at: String,
    },
    /// Ended by the gateway without running (or, for `Unknown`, without
    /// knowing whether it ran).
    Refused {
        /// Why.
        why: Outcome,
        /// The idempotency key as the client knows it.
        key: String,
        /// The tool called.
        tool: String,
    },
    /// The server's complete listing lacks the tool (pinned and gone, or
    /// never listed): nothing sent, no proposal made.
    ToolUnavailable {
        /// The server.
        server: String,
        /// The tool.
        tool: String,
        /// A listed tool whose name this one's looks like.
        lookalike: Option<String>,
    },
    /// The server is called as the person who asks (delegation) and the
    /// caller's credential cannot be traded at its identity provider (a
    /// static token, another provider's token): nothing ran.
    DelegationUnavailable {
        /// The server.
        server: String,
        /// The provider the server trades tokens at.
        issuer: String,
    },
    /// The upstream is refused fast while its circuit is open: nothing sent.
    CircuitOpen {
        /// The server.
        server: String,
    },
    /// The ledger could not record the call: nothing sent.
    LedgerUnavailable(StoreError),
    /// The audit log could not record the dispatch: nothing sent.
    AuditUnavailable,
    /// The params failed the strict parse, or carry an unusable key (`-32602`).
    Invalid(String),
    /// The upstream failed; [`UpstreamError::dispatched`] says whether the
    /// call may have run.
    Failed(UpstreamError),
}

/// The part of a response the ledger keeps.
pub(crate) fn answer_of(resp: &Message) -> Option<Answer> {
    match (&resp.result, &resp.error) {
        (Some(r), _) => Some(Answer::Result(r.get().to_owned())),
        (None, Some(e)) => Some(Answer::Error(e.get().to_owned())),
        _ => None,
    }
}

impl CallOutcome {
    /// What a read's followers get.
    pub(crate) fn shared(&self) -> Settled {
        match self {
            CallOutcome::Answered(resp) => match answer_of(resp) {
                Some(answer) => Settled::Answered {
                    answer,
                    answered_at: String::new(),
                },
                None => Settled::Verdict(Outcome::NotDispatched),
            },
            _ => Settled::Verdict(Outcome::NotDispatched),
        }
    }
}

/// Whether an upstream answer is an error (a JSON-RPC error, or a result
/// with `isError`).
pub(crate) fn is_error(answer: &Message) -> bool {
    answer.error.is_some()
        || answer.result.as_ref().is_some_and(|r| {
            // Without an escape in the text, the member can only be spelled
            // `"isError"`, and its value `true` follows it after a colon: a
            // text where no such spelling is followed by `true` (most
            // results, `"isError":false` among them) is answered without
            // parsing it again. Anything else is parsed as before.
            let text = r.get();
            if !text.contains('\\') && !flag_may_be_true(text) {
                return false;
            }
            // Only `isError` is read: the rest is skipped, not built.
            #[derive(serde::Deserialize)]
            struct Flag<'a> {
                #[serde(rename = "isError", borrow, default)]
                is_error: Option<&'a serde_json::value::RawValue>,
            }
            serde_json::from_str::<Flag<'_>>(r.get())
                .ok()
                .and_then(|f| f.is_error)
                .is_some_and(|v| v.get() == "true")
        })
}

/// Whether some `"isError"` in `text` is followed by `: true` (white space
/// allowed around the colon).
fn flag_may_be_true(text: &str) -> bool {
    const WS: &[char] = &[' ', '\t', '\n', '\r'];
    text.match_indices("\"isError\"").any(|(at, name)| {
        text[at + name.len()..]
            .trim_start_matches(WS)
            .strip_prefix(':')
            .is_some_and(|rest| rest.trim_start_matches(WS).starts_with("true"))
    })
}

/// `completed` fields of an upstream answer: whether it is an error.
pub(crate) fn answered_fields(answer: &Message) -> Vec<(&'static str, Value)> {
    vec![("is_error", json!(is_error(answer)))]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(result: &str) -> Message {
        Message::response(
            Value::from(1),
            serde_json::value::RawValue::from_string(result.to_owned()).unwrap(),
        )
    }

    #[test]
    fn is_error_reads_the_top_level_flag_however_it_is_spelled() {
        assert!(is_error(&answer(r#"{"content":[],"isError":true}"#)));
        assert!(is_error(&answer("{\"content\":[],\"isError\" :\n\ttrue}")));
        // A nested flag is not the result's, however it is spelled.
        assert!(!is_error(&answer(
            r#"{"content":[{"type":"text","isError":true}],"isError":false}"#
        )));
        // The same name twice is no answer serde gives: not an error.
        assert!(!is_error(&answer(r#"{"isError":true,"isError":false}"#)));
        // The name spelled with an escape is the same member.
        assert!(is_error(&answer(r#"{"content":[],"is\u0045rror":true}"#)));
        assert!(!is_error(&answer(r#"{"content":[],"isError":false}"#)));
        assert!(!is_error(&answer(r#"{"content":[]}"#)));
        // The name inside the content is not the flag.
        assert!(!is_error(&answer(
            r#"{"content":[{"type":"text","text":"isError"}]}"#
        )));
        assert!(!is_error(&answer(
            r#"{"content":[{"type":"text","text":"a \"quoted\" word"}]}"#
        )));
        assert!(is_error(&Message::error(
            Value::from(1),
            -32000,
            "no",
            None
        )));
    }
}
