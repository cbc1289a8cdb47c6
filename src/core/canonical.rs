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

use std::collections::HashSet;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

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
    /// The params to forward: the client's params with `arguments` replaced
    /// by the canonical form and reserved `_meta` keys removed.
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
        let mut out = String::with_capacity(self.arguments_jcs.len() + 64);
        out.push_str("{\"arguments\":");
        out.push_str(&self.arguments_jcs);
        if let Value::Object(rest) = &self.forward_params {
            for (k, v) in rest.iter().filter(|(k, _)| k.as_str() != "arguments") {
                out.push(',');
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                out.push_str(&v.to_string());
            }
        }
        out.push('}');
        out
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
    forward.insert("arguments".into(), arguments.clone());
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

/// RFC 8785 canonical text of a value.
pub fn jcs(value: &Value) -> String {
    let mut out = Vec::with_capacity(128);
    jcs_into(value, &mut out);
    // Only valid UTF-8 is ever written (strings come from `&str`).
    String::from_utf8(out).unwrap_or_default()
}

/// RFC 8785 JCS of `value`, appended to `out`.
///
/// Written here rather than taken from `serde_jcs` for speed: serde_jcs
/// builds the text through a generic serializer with per-object buffering
/// and took 9.6 µs for a 500-byte audit entry against 1.3 µs for plain
/// `serde_json`; every `tools/call` and every audit entry is hashed this
/// way. It must equal serde_jcs byte for byte: the proptest
/// `jcs_matches_serde_jcs` checks that on arbitrary values, and the RFC 8785
/// vectors below run against it.
pub fn jcs_into(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        // Without serde_json's `arbitrary_precision` every number is an f64,
        // an i64 or a u64, and `as_f64` answers for each.
        Value::Number(n) => jcs_number(n.as_f64().unwrap_or(0.0), out),
        Value::String(s) => jcs_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                jcs_into(v, out);
            }
            out.push(b']');
        }
        Value::Object(map) => jcs_object_into(map, out),
    }
}

/// A JCS number: an IEEE-754 double in ECMAScript's shortest form.
fn jcs_number(f: f64, out: &mut Vec<u8>) {
    if f == 0.0 || !f.is_finite() {
        // -0 is 0; JSON has no infinities or NaN (never parsed into a Value).
        out.push(b'0');
    } else {
        let mut buf = ryu_js::Buffer::new();
        out.extend_from_slice(buf.format_finite(f).as_bytes());
    }
}

/// RFC 8785 JCS of an object, appended to `out`.
pub fn jcs_object_into(map: &serde_json::Map<String, Value>, out: &mut Vec<u8>) {
    jcs_object_visit(map, out, |_, _| {});
}

/// Where a member goes in a JCS object text (see [`jcs_object_into_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// The byte offset to insert at.
    pub at: usize,
    /// Members come before it (insert `,` then the member).
    pub after_some: bool,
    /// Members come after it (with none before: insert the member then `,`).
    pub before_some: bool,
}

impl Slot {
    /// Splice `member` (`"key":value`) into `jcs` at the slot.
    pub fn splice(self, jcs: &[u8], member: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(&jcs[..self.at]);
        if self.after_some {
            out.push(b',');
        }
        out.extend_from_slice(member);
        if !self.after_some && self.before_some {
            out.push(b',');
        }
        out.extend_from_slice(&jcs[self.at..]);
    }
}

/// [`jcs_object_into`], and the [`Slot`] where a member with key `key`
/// (absent from `map`) goes. The audit writer hashes an entry's JCS, then
/// writes the same bytes with `hash` spliced in: one serialization for both.
pub fn jcs_object_into_at(
    map: &serde_json::Map<String, Value>,
    out: &mut Vec<u8>,
    key: &str,
) -> Slot {
    let start = out.len();
    let mut next = None;
    let sorts_before =
        |k: &str| k.encode_utf16().cmp(key.encode_utf16()) == std::cmp::Ordering::Less;
    jcs_object_visit(map, out, |k, out| {
        if next.is_none() && !sorts_before(k) {
            next = Some(out.len());
        }
    });
    match next {
        // Just after the brace (first member) or the comma before the next.
        Some(pos) if pos == start + 1 => Slot {
            at: pos - start,
            after_some: false,
            before_some: true,
        },
        Some(pos) => Slot {
            at: pos - 1 - start,
            after_some: true,
            before_some: true,
        },
        None => Slot {
            at: out.len() - 1 - start,
            after_some: !map.is_empty(),
            before_some: false,
        },
    }
}

/// JCS of an object; `visit` sees each key just before its member is
/// written (with `out` as it is then).
fn jcs_object_visit(
    map: &serde_json::Map<String, Value>,
    out: &mut Vec<u8>,
    mut visit: impl FnMut(&str, &mut Vec<u8>),
) {
    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
    // Keys in UTF-16 code unit order (RFC 8785 section 3.2.3); for the
    // common all-ASCII keys that is plain byte order.
    if entries.iter().all(|(k, _)| k.is_ascii()) {
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    } else {
        entries.sort_unstable_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
    }
    out.push(b'{');
    for (i, (k, v)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        visit(k, out);
        jcs_string(k, out);
        out.push(b':');
        jcs_into(v, out);
    }
    out.push(b'}');
}

/// A JSON string as ECMAScript's `JSON.stringify` writes it: `"` and `\\`
/// escaped, control characters as `\b \t \n \f \r` or `\u00xx`, the rest
/// as is.
pub(crate) fn jcs_string(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    let bytes = s.as_bytes();
    // Most strings (names, digests, times) need no escape: one branch-free
    // pass over the bytes (which the compiler vectorizes) says so, and they
    // are copied whole.
    let plain = !bytes.iter().fold(false, |any, &b| {
        any | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if plain {
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[(b >> 4) as usize]);
            out.push(HEX[(b & 0xf) as usize]);
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// `sha256:` + hex SHA-256 of JCS({"server", "tool", "arguments"}).
pub fn call_digest(server: &str, tool: &str, arguments: &Value) -> String {
    digest_of(server, tool, &jcs(arguments))
}

/// The digest from arguments already in JCS form: the object's JCS is
/// assembled around them (its keys sort `arguments` < `server` < `tool`)
/// instead of serializing the arguments a second time on every call.
fn digest_of(server: &str, tool: &str, arguments_jcs: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"{\"arguments\":");
    h.update(arguments_jcs.as_bytes());
    let mut names = Vec::with_capacity(server.len() + tool.len() + 24);
    names.extend_from_slice(b",\"server\":");
    jcs_string(server, &mut names);
    names.extend_from_slice(b",\"tool\":");
    jcs_string(tool, &mut names);
    names.push(b'}');
    h.update(&names);
    sha256_text(&h.finalize().into())
}

/// `sha256:` and the lower-case hex of a SHA-256 digest, without the
/// per-character iterator of `hex::encode`.
pub fn sha256_text(digest: &[u8; 32]) -> String {
    let mut text = [0u8; 71];
    text[..7].copy_from_slice(b"sha256:");
    // 64 hex digits fit the 64 bytes after the prefix exactly.
    let _ = hex::encode_to_slice(digest, &mut text[7..]);
    std::str::from_utf8(&text)
        .map(str::to_owned)
        .unwrap_or_default()
}

/// Walk the JSON text and enforce what `serde_json` lets through:
/// duplicate keys, lone surrogates, inexact numbers and depth. Returns the
/// size in bytes of `arguments` as sent (0 when absent).
fn check_strict(text: &str, max_depth: usize) -> Result<usize, CanonicalError> {
    strict_pass(text, max_depth, true)
}

/// Check that `text` is JSON that every parser reads the same way: no key
/// twice in one object (parsers disagree on which one wins), no lone
/// surrogate, nesting at most `max_depth`. For JSON other than a call's
/// `params` that the gateway must read exactly as it was written, such as
/// an audit line whose bytes no longer match its hash: a line with a
/// second `"tool"` in front of the real one is refused, not read as
/// whichever copy this parser keeps. Numbers are not held to a double
/// here.
pub fn check_unambiguous(text: &str, max_depth: usize) -> Result<(), CanonicalError> {
    strict_pass(text, max_depth, false).map(drop)
}

fn strict_pass(text: &str, max_depth: usize, exact_numbers: bool) -> Result<usize, CanonicalError> {
    let mut s = Strict {
        b: text.as_bytes(),
        i: 0,
        max_depth,
        path: Vec::new(),
        arguments_len: 0,
        exact_numbers,
    };
    s.value(0)?;
    s.ws();
    if s.i != s.b.len() {
        return Err(s.invalid("trailing characters after `params`"));
    }
    Ok(s.arguments_len)
}

struct Strict<'a> {
    b: &'a [u8],
    i: usize,
    max_depth: usize,
    path: Vec<String>,
    arguments_len: usize,
    /// Numbers must name a double exactly (a call's arguments).
    exact_numbers: bool,
}

impl Strict<'_> {
    fn pointer(&self) -> String {
        if self.path.is_empty() {
            return "/".into();
        }
        self.path
            .iter()
            .map(|p| format!("/{}", p.replace('~', "~0").replace('/', "~1")))
            .collect()
    }

    fn invalid(&self, what: &str) -> CanonicalError {
        CanonicalError::Invalid(format!("{what} at byte {}", self.i))
    }

    fn ws(&mut self) {
        while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    /// `depth` counts the containers around this value.
    fn value(&mut self, depth: usize) -> Result<(), CanonicalError> {
        self.ws();
        match self.peek() {
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => self.string().map(drop),
            Some(b't') => self.literal("true"),
            Some(b'f') => self.literal("false"),
            Some(b'n') => self.literal("null"),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => Err(self.invalid("expected a JSON value")),
        }
    }

    fn enter(&self, depth: usize) -> Result<(), CanonicalError> {
        // `params` is depth 0 and the `arguments` object depth 1, so depth is
        // the nesting level counted from the arguments object.
        if depth > self.max_depth {
            return Err(CanonicalError::TooDeep {
                path: self.pointer(),
                max: self.max_depth,
            });
        }
        Ok(())
    }

    fn object(&mut self, depth: usize) -> Result<(), CanonicalError> {
        self.enter(depth)?;
        self.i += 1;
        let mut keys = HashSet::new();
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(());
        }
        loop {
            self.ws();
            if self.peek() != Some(b'"') {
                return Err(self.invalid("expected an object key"));
            }
            let key = self.string()?;
            if !keys.insert(key.clone()) {
                return Err(CanonicalError::DuplicateKey {
                    path: self.pointer(),
                    key,
                });
            }
            self.ws();
            if self.peek() != Some(b':') {
                return Err(self.invalid("expected `:`"));
            }
            self.i += 1;
            let top_arguments = depth == 0 && key == "arguments";
            self.path.push(key);
            let value_start = self.i;
            self.value(depth + 1)?;
            if top_arguments {
                self.arguments_len = self.i - value_start;
            }
            self.path.pop();
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(self.invalid("expected `,` or `}`")),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<(), CanonicalError> {
        self.enter(depth)?;
        self.i += 1;
        self.ws();
        if self.peek() == Some(b']') {
            self.i += 1;
            return Ok(());
        }
        let mut index = 0usize;
        loop {
            self.path.push(index.to_string());
            self.value(depth + 1)?;
            self.path.pop();
            index += 1;
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(self.invalid("expected `,` or `]`")),
            }
        }
    }

    fn literal(&mut self, word: &str) -> Result<(), CanonicalError> {
        if self.b[self.i..].starts_with(word.as_bytes()) {
            self.i += word.len();
            Ok(())
        } else {
            Err(self.invalid("invalid literal"))
        }
    }

    /// Decode a string, refusing unpaired surrogate escapes.
    fn string(&mut self) -> Result<String, CanonicalError> {
        self.i += 1; // opening quote
        let mut out = String::new();
        let start = self.i;
        let mut plain_from = start;
        while let Some(c) = self.peek() {
            match c {
                b'"' => {
                    out.push_str(self.slice(plain_from, self.i)?);
                    self.i += 1;
                    return Ok(out);
                }
                b'\\' => {
                    out.push_str(self.slice(plain_from, self.i)?);
                    self.i += 1;
                    let esc = self
                        .peek()
                        .ok_or_else(|| self.invalid("unterminated escape"))?;
                    self.i += 1;
                    match esc {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let ch = if (0xD800..0xDC00).contains(&hi) {
                                // A high surrogate must be followed by `\u` + low surrogate.
                                if !self.b[self.i..].starts_with(b"\\u") {
                                    return Err(CanonicalError::LoneSurrogate {
                                        path: self.pointer(),
                                    });
                                }
                                self.i += 2;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return Err(CanonicalError::LoneSurrogate {
                                        path: self.pointer(),
                                    });
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else if (0xDC00..0xE000).contains(&hi) {
                                return Err(CanonicalError::LoneSurrogate {
                                    path: self.pointer(),
                                });
                            } else {
                                hi
                            };
                            out.push(
                                char::from_u32(ch).ok_or_else(|| self.invalid("invalid escape"))?,
                            );
                        }
                        _ => return Err(self.invalid("invalid escape")),
                    }
                    plain_from = self.i;
                }
                _ => self.i += 1,
            }
        }
        Err(self.invalid("unterminated string"))
    }

    fn slice(&self, from: usize, to: usize) -> Result<&str, CanonicalError> {
        std::str::from_utf8(&self.b[from..to]).map_err(|_| self.invalid("invalid UTF-8"))
    }

    fn hex4(&mut self) -> Result<u32, CanonicalError> {
        let digits = self
            .b
            .get(self.i..self.i + 4)
            .ok_or_else(|| self.invalid("short \\u escape"))?;
        let text = std::str::from_utf8(digits).map_err(|_| self.invalid("invalid \\u escape"))?;
        let v = u32::from_str_radix(text, 16).map_err(|_| self.invalid("invalid \\u escape"))?;
        self.i += 4;
        Ok(v)
    }

    fn number(&mut self) -> Result<(), CanonicalError> {
        let start = self.i;
        while let Some(c) = self.peek() {
            if c.is_ascii_digit() || matches!(c, b'-' | b'+' | b'.' | b'e' | b'E') {
                self.i += 1;
            } else {
                break;
            }
        }
        if !self.exact_numbers {
            return Ok(());
        }
        let literal = self.slice(start, self.i)?.to_owned();
        check_number(&literal).map_err(|becomes| CanonicalError::InexactNumber {
            path: self.pointer(),
            literal,
            becomes,
        })
    }
}

/// `Ok` when the literal's decimal value survives a trip through an IEEE-754
/// double written back in shortest form; otherwise what the double says.
fn check_number(literal: &str) -> Result<(), String> {
    let parsed: f64 = literal.parse().map_err(|_| "not a number".to_owned())?;
    if !parsed.is_finite() {
        return Err(format!("{parsed}"));
    }
    // "Shortest form" is the JCS form, which is what will be forwarded.
    // (Rust's own shortest printing may pick another of several equally
    // short digit strings than ECMAScript does: proptest found one.)
    let mut written = Vec::with_capacity(24);
    jcs_number(parsed, &mut written);
    let written = String::from_utf8_lossy(&written).into_owned();
    match (decimal(literal), decimal(&written)) {
        (Some(a), Some(b)) if a == b => Ok(()),
        _ => Err(written),
    }
}

/// A decimal literal as (negative, significant digits, exponent of the last
/// digit); zero is `(false, "", 0)` whatever its sign or spelling.
fn decimal(text: &str) -> Option<(bool, String, i64)> {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text),
    };
    let (mantissa, exp) = match rest.find(['e', 'E']) {
        Some(i) => (&rest[..i], rest[i + 1..].parse::<i64>().ok()?),
        None => (rest, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let mut digits: String = format!("{int}{frac}");
    let mut exp = exp - frac.len() as i64;
    let trimmed = digits.trim_start_matches('0').to_owned();
    digits = trimmed;
    while digits.ends_with('0') {
        digits.pop();
        exp += 1;
    }
    if digits.is_empty() {
        return Some((false, String::new(), 0));
    }
    Some((negative, digits, exp))
}

#[cfg(test)]
mod tests;
