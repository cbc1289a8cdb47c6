//! JSON-RPC 2.0 envelopes as the relay sees them.
//!
//! The relay never re-serializes what it does not need to touch: `params`,
//! `result` and `error` stay as the raw bytes the peer sent ([`RawValue`]), so a
//! `tools/list` result reaches the client byte-for-byte as the server wrote it.
//! Only the envelope (`jsonrpc`, `id`, `method`) is rebuilt, because the relay
//! rewrites request ids so that ids from several parties never collide.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

/// JSON-RPC error codes used by the gateway.
pub mod code {
    /// Invalid JSON was received.
    pub const PARSE_ERROR: i64 = -32700;
    /// The JSON sent is not a valid request object.
    pub const INVALID_REQUEST: i64 = -32600;
    /// The method does not exist or is not available.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// Invalid method parameters.
    pub const INVALID_PARAMS: i64 = -32602;
    /// Internal error (used for relay failures outside `tools/call`).
    pub const INTERNAL_ERROR: i64 = -32603;
    /// 2026-07-28: HTTP headers do not match the body.
    pub const HEADER_MISMATCH: i64 = -32020;
    /// 2026-07-28: the requested protocol version is not supported.
    pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
}

/// What kind of JSON-RPC message an envelope is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Has `method` and `id`.
    Request,
    /// Has `method`, no `id`.
    Notification,
    /// Has `id` and `result` or `error`, no `method`.
    Response,
}

/// One JSON-RPC message with its payload kept raw.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    /// Always `"2.0"`; checked by [`Message::parse`].
    pub jsonrpc: String,
    /// Request or response id (a string or a number; `null` only on errors
    /// answering unparseable requests).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "some_value"
    )]
    pub id: Option<Value>,
    /// Method name of a request or notification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Parameters, as the sender wrote them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Box<RawValue>>,
    /// Result of a successful response, as the sender wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Box<RawValue>>,
    /// Error object of a failed response, as the sender wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Box<RawValue>>,
}

/// The same envelope without `deny_unknown_fields`, for messages from
/// upstream servers (see [`Message::parse_from_upstream`]).
#[derive(Deserialize)]
struct LenientMessage {
    jsonrpc: String,
    #[serde(default, deserialize_with = "some_value")]
    id: Option<Value>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    params: Option<Box<RawValue>>,
    #[serde(default)]
    result: Option<Box<RawValue>>,
    #[serde(default)]
    error: Option<Box<RawValue>>,
}

/// Keep an explicit `"id": null` distinct from a missing id.
fn some_value<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// Why bytes are not a JSON-RPC message.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// Not JSON at all.
    #[error("invalid JSON: {0}")]
    Json(serde_json::Error),
    /// JSON, but not a JSON-RPC 2.0 message.
    #[error("not a JSON-RPC 2.0 message: {0}")]
    Invalid(String),
}

impl ParseError {
    /// The JSON-RPC code to answer this error with.
    pub fn code(&self) -> i64 {
        match self {
            ParseError::Json(_) => code::PARSE_ERROR,
            ParseError::Invalid(_) => code::INVALID_REQUEST,
        }
    }
}

impl Message {
    /// Parse one message and check the envelope rules of JSON-RPC 2.0.
    pub fn parse(bytes: &[u8]) -> Result<Message, ParseError> {
        let msg: Message = serde_json::from_slice(bytes).map_err(|e| {
            if e.is_data() {
                ParseError::Invalid(e.to_string())
            } else {
                ParseError::Json(e)
            }
        })?;
        msg.check()?;
        Ok(msg)
    }

    /// Parse a message from an upstream server. Unknown top-level members are
    /// ignored rather than refused: a server that adds one must not turn every
    /// answer into a lost one (and a timeout). Clients get the strict
    /// [`Message::parse`].
    pub fn parse_from_upstream(bytes: &[u8]) -> Result<Message, ParseError> {
        let m: LenientMessage = serde_json::from_slice(bytes).map_err(|e| {
            if e.is_data() {
                ParseError::Invalid(e.to_string())
            } else {
                ParseError::Json(e)
            }
        })?;
        let msg = Message {
            jsonrpc: m.jsonrpc,
            id: m.id,
            method: m.method,
            params: m.params,
            result: m.result,
            error: m.error,
        };
        msg.check()?;
        Ok(msg)
    }

    fn check(&self) -> Result<(), ParseError> {
        if self.jsonrpc != "2.0" {
            return Err(ParseError::Invalid(format!(
                "`jsonrpc` must be \"2.0\", found `{}`",
                self.jsonrpc
            )));
        }
        if let Some(id) = &self.id {
            if !(id.is_string() || id.is_number() || id.is_null()) {
                return Err(ParseError::Invalid(
                    "`id` must be a string or a number".into(),
                ));
            }
        }
        let has_outcome = self.result.is_some() || self.error.is_some();
        match (&self.method, has_outcome) {
            (Some(_), true) => Err(ParseError::Invalid(
                "a message cannot carry both `method` and `result`/`error`".into(),
            )),
            (None, false) => Err(ParseError::Invalid(
                "a message needs `method` (request) or `result`/`error` (response)".into(),
            )),
            (None, true) if self.id.is_none() => {
                Err(ParseError::Invalid("a response needs an `id`".into()))
            }
            (None, true) if self.result.is_some() && self.error.is_some() => Err(
                ParseError::Invalid("a response carries `result` or `error`, not both".into()),
            ),
            _ => Ok(()),
        }
    }

    /// Request, notification or response.
    pub fn kind(&self) -> Kind {
        match (&self.method, &self.id) {
            (Some(_), Some(_)) => Kind::Request,
            (Some(_), None) => Kind::Notification,
            (None, _) => Kind::Response,
        }
    }

    /// The method name, or `""` for responses.
    pub fn method(&self) -> &str {
        self.method.as_deref().unwrap_or("")
    }

    /// Serialize to compact JSON bytes.
    ///
    /// The members are written in the order and form `Serialize` gives them
    /// (the test `to_bytes_is_what_serde_writes` holds the two together),
    /// straight into one buffer: every call and every answer is written
    /// this way, and serde's map serializer took twice as long.
    pub fn to_bytes(&self) -> Vec<u8> {
        let raw = [&self.params, &self.result, &self.error]
            .iter()
            .map(|r| r.as_ref().map_or(0, |r| r.get().len()))
            .sum::<usize>();
        let mut out = Vec::with_capacity(raw + 64);
        out.extend_from_slice(b"{\"jsonrpc\":");
        // Writing a string or a JSON value into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut out, &self.jsonrpc);
        if let Some(id) = &self.id {
            out.extend_from_slice(b",\"id\":");
            let _ = serde_json::to_writer(&mut out, id);
        }
        if let Some(method) = &self.method {
            out.extend_from_slice(b",\"method\":");
            let _ = serde_json::to_writer(&mut out, method);
        }
        for (name, raw) in [
            (&b",\"params\":"[..], &self.params),
            (b",\"result\":", &self.result),
            (b",\"error\":", &self.error),
        ] {
            if let Some(raw) = raw {
                out.extend_from_slice(name);
                out.extend_from_slice(raw.get().as_bytes());
            }
        }
        out.push(b'}');
        out
    }

    /// A new request.
    pub fn request(id: Value, method: &str, params: Option<Box<RawValue>>) -> Message {
        Message {
            jsonrpc: "2.0".into(),
            id: Some(id),
            method: Some(method.into()),
            params,
            result: None,
            error: None,
        }
    }

    /// A new notification.
    pub fn notification(method: &str, params: Option<Box<RawValue>>) -> Message {
        Message {
            jsonrpc: "2.0".into(),
            id: None,
            method: Some(method.into()),
            params,
            result: None,
            error: None,
        }
    }

    /// A successful response carrying `result`.
    pub fn response(id: Value, result: Box<RawValue>) -> Message {
        Message {
            jsonrpc: "2.0".into(),
            id: Some(id),
            method: None,
            params: None,
            result: Some(result),
            error: None,
        }
    }

    /// An error response.
    pub fn error(id: Value, code: i64, message: &str, data: Option<Value>) -> Message {
        let mut err = serde_json::json!({ "code": code, "message": message });
        if let Some(data) = data {
            err["data"] = data;
        }
        Message {
            jsonrpc: "2.0".into(),
            id: Some(id),
            method: None,
            params: None,
            result: None,
            error: Some(raw(&err)),
        }
    }

    /// Parse `params` into a JSON value (for the few methods the relay reads).
    pub fn params_value(&self) -> Option<Value> {
        self.params
            .as_ref()
            .and_then(|p| serde_json::from_str(p.get()).ok())
    }

    /// An error response's code and message in words, for a log line
    /// (`-32602 params._meta is missing …`); `None` for anything else.
    pub fn error_summary(&self) -> Option<String> {
        let err: Value = serde_json::from_str(self.error.as_ref()?.get()).ok()?;
        let code = err
            .get("code")
            .map_or_else(|| "(no code)".to_owned(), Value::to_string);
        let message = err
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("(no message)");
        Some(format!("{code} {message}"))
    }

    /// The error code of an error response.
    pub fn error_code(&self) -> Option<i64> {
        let err: Value = serde_json::from_str(self.error.as_ref()?.get()).ok()?;
        err.get("code")?.as_i64()
    }
}

/// Turn a JSON value into a raw value.
pub fn raw(value: &Value) -> Box<RawValue> {
    // A `Value` always serializes to valid JSON.
    RawValue::from_string(value.to_string()).unwrap_or_else(|_| null_raw())
}

fn null_raw() -> Box<RawValue> {
    RawValue::from_string("null".to_owned()).unwrap_or_else(|_| unreachable_raw())
}

#[expect(clippy::unwrap_used, reason = "`{}` is valid JSON")]
fn unreachable_raw() -> Box<RawValue> {
    RawValue::from_string("{}".to_owned()).unwrap()
}

/// A request body: one message, or a JSON-RPC batch (2025-03-26 only).
#[derive(Debug)]
pub enum Body {
    /// A single message.
    Single(Message),
    /// A batch: each member parsed on its own, so one bad member does not
    /// spoil the others.
    Batch(Vec<Result<Message, ParseError>>),
}

/// Parse an HTTP or stdio body into one message or a batch.
pub fn parse_body(bytes: &[u8]) -> Result<Body, ParseError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'[') {
        let members: Vec<Box<RawValue>> =
            serde_json::from_slice(bytes).map_err(ParseError::Json)?;
        if members.is_empty() {
            return Err(ParseError::Invalid(
                "an empty batch is not a request".into(),
            ));
        }
        Ok(Body::Batch(
            members
                .iter()
                .map(|m| Message::parse(m.get().as_bytes()))
                .collect(),
        ))
    } else {
        Message::parse(bytes).map(Body::Single)
    }
}

/// [`parse_body`] for what a client sends: besides the JSON-RPC envelope,
/// every id must be a string or an integer, as MCP requires. A `null` or
/// fractional id is refused (`-32600`) before anything runs: an answer
/// under `"id": null` could not be matched to its request, and `1.5` has no
/// exact place among the gateway's ids.
pub fn parse_client_body(bytes: &[u8]) -> Result<Body, ParseError> {
    match parse_body(bytes)? {
        Body::Single(m) => check_client_id(m).map(Body::Single),
        Body::Batch(members) => Ok(Body::Batch(
            members
                .into_iter()
                .map(|m| m.and_then(check_client_id))
                .collect(),
        )),
    }
}

fn check_client_id(m: Message) -> Result<Message, ParseError> {
    match &m.id {
        Some(id) if !(id.is_string() || id.is_i64() || id.is_u64()) => Err(ParseError::Invalid(
            format!("`id` must be a string or an integer, not `{id}`"),
        )),
        _ => Ok(m),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn to_bytes_is_what_serde_writes() {
        for text in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"b":1,"a":"\u00e9"}}}"#,
            r#"{"jsonrpc":"2.0","id":"x\"y","result":{"content":[]}}"#,
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32600,"message":"no"}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error"}}"#,
        ] {
            let m: Message = serde_json::from_str(text).unwrap();
            assert_eq!(
                String::from_utf8(m.to_bytes()).unwrap(),
                serde_json::to_string(&m).unwrap(),
                "{text}"
            );
        }
    }

    #[test]
    fn client_ids_are_strings_or_integers() {
        for bad in [r#"null"#, r#"1.5"#, r#"1e3"#] {
            let body = format!(r#"{{"jsonrpc":"2.0","id":{bad},"method":"tools/call"}}"#);
            let Err(e) = parse_client_body(body.as_bytes()) else {
                panic!("{bad} was accepted")
            };
            assert_eq!(e.code(), code::INVALID_REQUEST, "{bad}");
        }
        for good in [r#"7"#, r#""a""#, r#"-3"#, r#"18446744073709551615"#] {
            let body = format!(r#"{{"jsonrpc":"2.0","id":{good},"method":"tools/call"}}"#);
            assert!(parse_client_body(body.as_bytes()).is_ok(), "{good}");
        }
        let batch = br#"[{"jsonrpc":"2.0","id":null,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"ping"}]"#;
        let Body::Batch(members) = parse_client_body(batch).unwrap() else {
            panic!("a batch")
        };
        assert!(members[0].is_err() && members[1].is_ok());
    }

    #[test]
    fn keeps_result_bytes_exactly() {
        let text = br#"{"jsonrpc":"2.0","id":7,"result":{"tools":[{"name":"a",  "x":1.50}]}}"#;
        let m = Message::parse(text).unwrap();
        assert_eq!(m.kind(), Kind::Response);
        assert_eq!(
            m.result.unwrap().get(),
            r#"{"tools":[{"name":"a",  "x":1.50}]}"#
        );
    }

    #[test]
    fn classifies_and_rejects() {
        let n = Message::parse(br#"{"jsonrpc":"2.0","method":"notifications/x"}"#).unwrap();
        assert_eq!(n.kind(), Kind::Notification);
        let r = Message::parse(br#"{"jsonrpc":"2.0","id":"a","method":"ping"}"#).unwrap();
        assert_eq!(r.kind(), Kind::Request);
        assert!(matches!(Message::parse(b"{nope"), Err(ParseError::Json(_))));
        assert!(matches!(
            Message::parse(br#"{"jsonrpc":"1.0","id":1,"method":"x"}"#),
            Err(ParseError::Invalid(_))
        ));
        assert!(matches!(
            Message::parse(br#"{"jsonrpc":"2.0","id":{},"method":"x"}"#),
            Err(ParseError::Invalid(_))
        ));
        assert!(matches!(
            Message::parse(br#"{"jsonrpc":"2.0","id":1}"#),
            Err(ParseError::Invalid(_))
        ));
        assert!(matches!(
            Message::parse(br#"{"jsonrpc":"2.0","id":1,"method":"x","extra":1}"#),
            Err(ParseError::Invalid(_))
        ));
    }

    #[test]
    fn batch_members_parse_alone() {
        let body = br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}, 5]"#;
        let Body::Batch(members) = parse_body(body).unwrap() else {
            panic!("expected a batch")
        };
        assert!(members[0].is_ok());
        assert!(members[1].is_err());
        assert!(parse_body(b"[]").is_err());
    }

    #[test]
    fn upstream_extra_members_are_ignored() {
        let text = br#"{"jsonrpc":"2.0","id":3,"result":{},"x-trace":"abc"}"#;
        assert!(
            Message::parse(text).is_err(),
            "clients are held to the envelope"
        );
        let m = Message::parse_from_upstream(text).unwrap();
        assert_eq!(m.kind(), Kind::Response);
        assert!(Message::parse_from_upstream(br#"{"jsonrpc":"2.0","id":3}"#).is_err());
    }

    #[test]
    fn null_id_is_kept() {
        let m = Message::error(Value::Null, code::PARSE_ERROR, "bad", None);
        let text = String::from_utf8(m.to_bytes()).unwrap();
        assert!(text.contains(r#""id":null"#), "{text}");
    }
}
