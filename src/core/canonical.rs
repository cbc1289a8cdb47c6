//! The canonical call: strict parse, proxy-reserved inputs, RFC 8785 JCS and
//! the call digest (DESIGN.md section 2).
//!
//! What a reviewer approves and what the server receives must be the same
//! bytes, so a `tools/call` is parsed strictly, reduced to its canonical form
//! and forwarded as exactly that form. Everything here is pure: no I/O, no
//! runtime.
//!
//! Strictness, and what each rule protects against:
//! - duplicate object keys: parsers disagree on which duplicate wins, so the
//!   gateway could check one value while the server acts on another;
//! - lone surrogates (`"\ud800"`): not text, and JCS cannot represent them;
//! - numbers a double cannot hold: JCS writes numbers as IEEE-754 doubles, so
//!   `9007199254740993` would silently become `9007199254740992` (and collide
//!   with it in the digest). `4.50` and `1e2` are fine, only their spelling
//!   changes;
//! - nesting deeper than `limits.max_depth`, arguments larger than
//!   `limits.max_arguments_bytes`: bounded work per call.
//!
//! Invalid UTF-8 never gets this far: the envelope parser refuses the whole
//! body with `-32700` before any `params` exist.
//!
//! Numbers. Every JSON parse in the gateway maps a number's text to the
//! nearest double (correctly rounded), and [`jcs`] prints the shortest text
//! that names that double again (ECMAScript's form, as RFC 8785 asks), so
//! the server receives the double the agent named: `1944.4099999999999`
//! stays `1944.4099999999999`. The parser is serde_json's with its
//! `float_roundtrip` feature, on in every crate of the workspace. Its
//! default parser is faster and not correctly rounded: it read
//! `1944.4099999999999` as `1944.41`, another double, and so did the
//! canonical form, the digest, the approval and the forwarded bytes (in a
//! build without dev-dependencies; the tests' `serde_jcs` turned the
//! feature on for them, which is why they passed). Chosen by measurement
//! (`benches/float_parse.rs`, docs/performance.md): a read without numbers
//! costs the same, a document of 200 prices of 17 digits parses within a
//! few per cent, and the default parser changed 71 of those 200 prices. A
//! differential test holds the canonical form against npm's `canonicalize`
//! on more than 100,000 numbers (`tests/canonical.rs`).

mod jcs;
mod strict;

pub(crate) use jcs::jcs_string;
pub use jcs::{jcs, jcs_into, jcs_object_into};
use strict::check_strict;
pub use strict::check_unambiguous;

/// A key as one token of a JSON Pointer (RFC 6901: `~` as `~0`, `/` as
/// `~1`); the key itself when it has neither.
pub fn pointer_token(key: &str) -> std::borrow::Cow<'_, str> {
    if key.contains(['~', '/']) {
        key.replace('~', "~0").replace('/', "~1").into()
    } else {
        key.into()
    }
}

use serde_json::{Map, Value};

/// Prefix of a `requestState` the gateway issued. A state without it is
/// the upstream server's own, and is forwarded untouched.
pub const STATE_PREFIX: &str = "countersign.1.";
/// The gateway's key in `inputRequests` and `inputResponses`.
pub const INPUT_KEY: &str = "dev.countersign/confirm";
/// `_meta` keys under this prefix are the gateway's own inputs: read, then
/// removed before hashing and forwarding.
pub const RESERVED_META_PREFIX: &str = "dev.countersign/";
/// The argument through which a client without `_meta` support passes an
/// idempotency key; removed before hashing and forwarding.
pub const RESERVED_ARGUMENT: &str = "_idempotency_key";

/// Why `params` of a `tools/call` were refused (JSON-RPC `-32602`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CanonicalError {
    /// Not JSON, or not an object.
    #[error("invalid params: {0}")]
    Invalid(String),
    /// The same key twice in one object.
    #[error("duplicate key `{key}` in the object at `{path}`: send each key once")]
    DuplicateKey {
        /// JSON pointer of the object.
        path: String,
        /// The repeated key.
        key: String,
    },
    /// A `\uD800`–`\uDFFF` escape without its pair.
    #[error("lone surrogate escape in a string at `{path}`: strings must be valid Unicode")]
    LoneSurrogate {
        /// JSON pointer of the string (or of the object whose key it is).
        path: String,
    },
    /// A number that changes when read as a double.
    #[error(
        "number `{literal}` at `{path}` cannot be represented exactly as an IEEE-754 double \
         (it would become `{becomes}`): send it as a string"
    )]
    InexactNumber {
        /// JSON pointer of the number.
        path: String,
        /// The number as sent.
        literal: String,
        /// What a double makes of it.
        becomes: String,
    },
    /// Nesting deeper than the limit.
    #[error("arguments nest deeper than limits.max_depth ({max}) at `{path}`")]
    TooDeep {
        /// Where the limit was crossed.
        path: String,
        /// The limit.
        max: usize,
    },
    /// A tool name the gateway does not accept.
    #[error("tool name {shown} is refused: {rule}")]
    ToolName {
        /// The name, escaped (it may hold control characters).
        shown: String,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// Arguments larger than the limit.
    #[error("arguments are {size} bytes, more than limits.max_arguments_bytes ({max})")]
    TooLarge {
        /// Size of the arguments as sent.
        size: usize,
        /// The limit.
        max: usize,
    },
}

/// The longest tool name accepted, in characters (the MCP specification
/// recommends 1 to 128).
pub const MAX_TOOL_NAME: usize = 128;

/// A tool name the gateway accepts: 1 to [`MAX_TOOL_NAME`] characters, none
/// of them a control character (C0, DEL, C1) or an invisible formatting
/// character (zero-width, bidirectional controls, BOM). The specification's
/// recommended set (`A-Z a-z 0-9 _ - .`) is narrower; servers in the wild
/// use more (`/`, `:`, letters beyond ASCII), so only what can break a log
/// line, a policy entity or a reviewer's display is refused.
pub fn check_tool_name(name: &str) -> Result<(), CanonicalError> {
    let shown = || format!("{name:?}");
    if name.chars().count() > MAX_TOOL_NAME {
        return Err(CanonicalError::ToolName {
            shown: format!("of {} characters", name.chars().count()),
            rule: "a tool name has at most 128 characters",
        });
    }
    let invisible = |c: char| matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{2069}' | '\u{FEFF}');
    if name.chars().any(char::is_control) {
        // A newline or ESC in a name could forge or recolour a log line,
        // and a NUL breaks the policy entity built from it.
        return Err(CanonicalError::ToolName {
            shown: shown(),
            rule: "a tool name has no control characters",
        });
    }
    if name.chars().any(invisible) {
        // What a reviewer reads must be what runs.
        return Err(CanonicalError::ToolName {
            shown: shown(),
            rule: "a tool name has no invisible formatting characters (zero-width, bidirectional)",
        });
    }
    Ok(())
}

/// Limits applied by [`canonicalize`].
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Deepest nesting of objects and arrays inside `arguments`.
    pub max_depth: usize,
    /// Largest `arguments`, in bytes as sent.
    pub max_arguments_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_depth: 64,
            max_arguments_bytes: 1 << 20,
        }
    }
}

/// A `tools/call` reduced to what is hashed, approved and forwarded.
#[derive(Debug, Clone, PartialEq)]
pub struct CanonicalCall {
    /// Server name (from the endpoint, not from the client's body).
    pub server: String,
    /// Tool name.
    pub tool: String,
    /// Arguments with `_idempotency_key` removed (`{}` when absent).
    pub arguments: Value,
    /// JCS text of `arguments`: the exact bytes forwarded upstream.
    pub arguments_jcs: String,
    /// `sha256:` + hex SHA-256 of JCS({server, tool, arguments}).
    pub digest: String,
    /// The params to forward but `arguments` (whose canonical text,
    /// `arguments_jcs`, [`CanonicalCall::forward_params_text`] puts first):
    /// the client's other params, reserved `_meta` keys removed.
    pub forward_params: Value,
    /// Reserved inputs the client sent (for the ledger and approvals).
    pub reserved: Reserved,
}

impl CanonicalCall {
    /// The `params` text to forward: `arguments` is spliced in as the exact
    /// JCS bytes that were hashed (re-serializing would reorder keys by UTF-8
    /// and respell numbers), the other members follow as the client sent
    /// them, minus reserved `_meta` keys.
    pub fn forward_params_text(&self) -> String {
        let mut out = Vec::with_capacity(self.arguments_jcs.len() + 64);
        out.extend_from_slice(b"{\"arguments\":");
        out.extend_from_slice(self.arguments_jcs.as_bytes());
        if let Value::Object(rest) = &self.forward_params {
            for (k, v) in rest {
                out.push(b',');
                // Writing JSON into a Vec cannot fail.
                let _ = serde_json::to_writer(&mut out, k);
                out.push(b':');
                let _ = serde_json::to_writer(&mut out, v);
            }
        }
        out.push(b'}');
        // serde_json and JCS write UTF-8 only.
        String::from_utf8(out).unwrap_or_default()
    }
}

/// Proxy-reserved inputs, read before they are stripped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reserved {
    /// `_meta` entries under `dev.countersign/`, keyed by the full key.
    pub meta: Map<String, Value>,
    /// `arguments._idempotency_key`, if sent.
    pub argument_key: Option<Value>,
    /// The rest of `_meta` (other vendors' keys), forwarded unchanged.
    pub other_meta: Map<String, Value>,
    /// The answer to a question the gateway put to the client (2026-07-28
    /// `requestState` and `inputResponses`), taken out of the params: the
    /// upstream never saw the question.
    pub reply: Option<Reply>,
}

/// A client's retry carrying the answer to the gateway's `input_required`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reply {
    /// `params.requestState`, as sent.
    pub state: Option<String>,
    /// The gateway's entry of `params.inputResponses`, as sent.
    pub response: Option<Value>,
}

/// Strictly parse `params` of a `tools/call` sent to `server` and build its
/// canonical form.
pub fn canonicalize(
    server: &str,
    params: &str,
    limits: Limits,
) -> Result<CanonicalCall, CanonicalError> {
    let arguments_len = check_strict(params, limits.max_depth)?;
    if arguments_len > limits.max_arguments_bytes {
        return Err(CanonicalError::TooLarge {
            size: arguments_len,
            max: limits.max_arguments_bytes,
        });
    }
    let value: Value =
        serde_json::from_str(params).map_err(|e| CanonicalError::Invalid(e.to_string()))?;
    let Value::Object(mut params) = value else {
        return Err(CanonicalError::Invalid("`params` must be an object".into()));
    };
    let tool = match params.get("name") {
        Some(Value::String(name)) if !name.is_empty() => name.clone(),
        _ => {
            return Err(CanonicalError::Invalid(
                "`params.name` must be a non-empty string".into(),
            ))
        }
    };
    check_tool_name(&tool)?;
    let mut arguments = match params.remove("arguments") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map,
        Some(_) => {
            return Err(CanonicalError::Invalid(
                "`params.arguments` must be an object".into(),
            ))
        }
    };
    let mut reserved = Reserved {
        argument_key: arguments.remove(RESERVED_ARGUMENT),
        ..Reserved::default()
    };
    match params.remove("_meta") {
        None | Some(Value::Null) => {}
        Some(Value::Object(meta)) => {
            for (k, v) in meta {
                if k.starts_with(RESERVED_META_PREFIX) {
                    reserved.meta.insert(k, v);
                } else {
                    reserved.other_meta.insert(k, v);
                }
            }
        }
        Some(_) => {
            return Err(CanonicalError::Invalid(
                "`params._meta` must be an object".into(),
            ))
        }
    }
    reserved.reply = take_reply(&mut params)?;
    let arguments = Value::Object(arguments);
    let arguments_jcs = jcs(&arguments);
    let digest = digest_of(server, &tool, &arguments_jcs);
    let mut forward = params;
    if !reserved.other_meta.is_empty() {
        forward.insert("_meta".into(), Value::Object(reserved.other_meta.clone()));
    }
    Ok(CanonicalCall {
        server: server.into(),
        tool,
        arguments,
        arguments_jcs,
        digest,
        forward_params: Value::Object(forward),
        reserved,
    })
}

/// The gateway's own `requestState` / `inputResponses` entry, removed from
/// `params`. Those of the upstream (its own multi-round-trip questions) stay
/// and are forwarded.
fn take_reply(params: &mut Map<String, Value>) -> Result<Option<Reply>, CanonicalError> {
    let ours_state = match params.get("requestState") {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) => s.starts_with(STATE_PREFIX),
        Some(_) => {
            return Err(CanonicalError::Invalid(
                "`params.requestState` must be a string".into(),
            ))
        }
    };
    let ours_response = match params.get("inputResponses") {
        None | Some(Value::Null) => false,
        Some(Value::Object(m)) => m.contains_key(INPUT_KEY),
        Some(_) => {
            return Err(CanonicalError::Invalid(
                "`params.inputResponses` must be an object".into(),
            ))
        }
    };
    if !ours_state && !ours_response {
        return Ok(None);
    }
    let state = params
        .remove("requestState")
        .and_then(|v| v.as_str().map(str::to_owned));
    let mut response = None;
    if let Some(Value::Object(mut m)) = params.remove("inputResponses") {
        response = m.remove(INPUT_KEY);
        if !m.is_empty() {
            // Answers to the upstream's own questions cannot share a retry
            // with the gateway's: the upstream never asked in this round.
            return Err(CanonicalError::Invalid(
                "`params.inputResponses` answers countersign's question together with others; \
                 send only the answer countersign asked for"
                    .into(),
            ));
        }
    }
    Ok(Some(Reply { state, response }))
}

/// `sha256:` + hex SHA-256 of JCS({"server", "tool", "arguments"}).
pub fn call_digest(server: &str, tool: &str, arguments: &Value) -> String {
    digest_of(server, tool, &jcs(arguments))
}

/// The digest from arguments already in JCS form: the object's JCS is
/// assembled around them (its keys sort `arguments` < `server` < `tool`)
/// instead of serializing the arguments a second time on every call.
fn digest_of(server: &str, tool: &str, arguments_jcs: &str) -> String {
    let mut h = crate::core::sha256::Hasher::new();
    h.update(b"{\"arguments\":");
    h.update(arguments_jcs.as_bytes());
    let mut names = Vec::with_capacity(server.len() + tool.len() + 24);
    names.extend_from_slice(b",\"server\":");
    jcs_string(server, &mut names);
    names.extend_from_slice(b",\"tool\":");
    jcs_string(tool, &mut names);
    names.push(b'}');
    h.update(&names);
    sha256_text(&h.finish())
}

/// `sha256:` and the lower-case hex of a SHA-256 digest, without the
/// per-character iterator of `hex::encode`.
pub fn sha256_text(digest: &[u8; 32]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut text = [0u8; 71];
    text[..7].copy_from_slice(b"sha256:");
    // 64 hex digits fit the 64 bytes after the prefix exactly.
    for (pair, b) in text[7..].chunks_exact_mut(2).zip(digest) {
        pair[0] = HEX[usize::from(b >> 4)];
        pair[1] = HEX[usize::from(b & 0xf)];
    }
    String::from_utf8(text.to_vec()).unwrap_or_default()
}

#[cfg(test)]
mod tests;
