//! The two MCP wire eras and what tells them apart (no I/O).
//!
//! - The handshake era (2025-03-26, 2025-06-18, 2025-11-25): `initialize`,
//!   `Mcp-Session-Id`, SSE streams.
//! - 2026-07-28: no handshake; every request declares its version in
//!   `params._meta["io.modelcontextprotocol/protocolVersion"]` and repeats its
//!   method and name in `Mcp-Method` / `Mcp-Name` headers.

use serde_json::value::RawValue;
use serde_json::Value;

use crate::wire::jsonrpc::Message;

/// Protocol versions of the handshake era (`initialize`, `Mcp-Session-Id`).
pub const HANDSHAKE_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26"];
/// Protocol versions of the stateless era (per-request `_meta`).
pub const MODERN_VERSIONS: &[&str] = &["2026-07-28"];
/// `_meta` key carrying a 2026-07-28 request's protocol version.
pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";

/// `_meta` key carrying a 2026-07-28 request's client capabilities (required).
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// `_meta` key carrying a 2026-07-28 request's client name and version.
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";

/// Extra HTTP headers for one upstream request (2026-07-28 metadata headers).
pub type ExtraHeaders = Vec<(http::HeaderName, http::HeaderValue)>;

/// The `_meta` envelope of a request the gateway makes on its own account
/// in 2026-07-28 (its catalog, its `server/discover` probe): every key the
/// spec requires of a request (protocol version and client capabilities,
/// which real servers refuse without) and the client info it asks for. The
/// gateway declares no capabilities: it answers no server request of its own.
pub fn own_envelope(version: &str) -> serde_json::Map<String, Value> {
    let mut meta = serde_json::Map::new();
    meta.insert(META_PROTOCOL_VERSION.into(), Value::from(version));
    meta.insert(
        META_CLIENT_CAPABILITIES.into(),
        Value::Object(Default::default()),
    );
    meta.insert(
        META_CLIENT_INFO.into(),
        serde_json::json!({ "name": "countersign", "version": env!("CARGO_PKG_VERSION") }),
    );
    meta
}

/// The metadata headers to send with `msg`. In 2026-07-28 (`extra` carries
/// `MCP-Protocol-Version`) `Mcp-Method` and `Mcp-Name` must name what the
/// body says, and servers refuse a mismatch: a request the gateway makes
/// while serving a client's (a version probe of another tool) gets headers
/// of its own, and the client's `Mcp-Param-*` travel only with the request
/// they came with. Handshake-era `extra` (empty) is returned as it is.
pub fn headers_for<'a>(
    msg: &Message,
    extra: &'a ExtraHeaders,
) -> std::borrow::Cow<'a, ExtraHeaders> {
    use std::borrow::Cow;
    let get = |name: &str| {
        extra
            .iter()
            .find(|(k, _)| k.as_str() == name)
            .and_then(|(_, v)| v.to_str().ok())
    };
    let Some(version) = get("mcp-protocol-version") else {
        return Cow::Borrowed(extra);
    };
    let name = named_param(msg);
    let same_method = get("mcp-method") == Some(msg.method());
    let same_name = get("mcp-name").and_then(decode_header_value) == name;
    if same_method && same_name {
        return Cow::Borrowed(extra);
    }
    Cow::Owned(modern_headers(msg.method(), name.as_deref(), version))
}

/// The parameter a request repeats in `Mcp-Name` (a tool's, a prompt's
/// name, a resource's uri), read without building the rest of the params.
pub fn named_param(msg: &Message) -> Option<String> {
    param_text(msg.params.as_ref()?, name_field(msg.method())?)
}

/// The string member `field` (`name`, `uri` or `taskId`) of `params`, read
/// without building the rest of them.
pub fn param_text(params: &RawValue, field: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Named {
        name: Option<String>,
        uri: Option<String>,
        #[serde(rename = "taskId")]
        task_id: Option<String>,
    }
    let named: Named = serde_json::from_str(params.get()).ok()?;
    match field {
        "uri" => named.uri,
        "taskId" => named.task_id,
        _ => named.name,
    }
}

/// Which param of `method` its `Mcp-Name` header repeats.
fn name_field(method: &str) -> Option<&'static str> {
    match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        // The tasks extension routes on the task: a load balancer in front
        // of several gateways sends `tasks/*` by `Mcp-Name: <taskId>`.
        "tasks/get" | "tasks/update" | "tasks/cancel" | "tasks/result" => Some("taskId"),
        _ => None,
    }
}

/// Which wire era a request speaks. It decides the shape of some answers
/// (2026-07-28 results carry `resultType`) and whether closing the response
/// stream cancels the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// 2025-03-26 .. 2025-11-25: `initialize` and sessions.
    Handshake,
    /// 2026-07-28: stateless, per-request `_meta`.
    Modern,
}

/// 2026-07-28 request metadata headers for an upstream POST.
pub fn modern_headers(method: &str, name: Option<&str>, version: &str) -> ExtraHeaders {
    let mut h = Vec::new();
    if let Ok(v) = http::HeaderValue::try_from(version) {
        h.push((http::HeaderName::from_static("mcp-protocol-version"), v));
    }
    if let Ok(v) = http::HeaderValue::try_from(method) {
        h.push((http::HeaderName::from_static("mcp-method"), v));
    }
    if let Some(name) = name {
        if let Ok(v) = http::HeaderValue::try_from(encode_header_value(name)) {
            h.push((http::HeaderName::from_static("mcp-name"), v));
        }
    }
    h
}

/// Encode a value for `Mcp-Name` / `Mcp-Param-*`: plain when it is visible
/// ASCII without edge spaces, else the `=?base64?…?=` sentinel form.
pub fn encode_header_value(value: &str) -> String {
    use base64::Engine;
    let plain = !value.is_empty()
        && value.bytes().all(|b| (0x20..0x7f).contains(&b))
        && !value.starts_with(' ')
        && !value.ends_with(' ')
        && (!value.starts_with("=?base64?") || !value.ends_with("?="));
    if plain {
        value.to_owned()
    } else {
        format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode(value)
        )
    }
}

/// Decode an `Mcp-Name` / `Mcp-Param-*` header value.
pub fn decode_header_value(value: &str) -> Option<String> {
    use base64::Engine;
    match value
        .strip_prefix("=?base64?")
        .and_then(|v| v.strip_suffix("?="))
    {
        Some(b64) => {
            let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
            String::from_utf8(bytes).ok()
        }
        None => Some(value.to_owned()),
    }
}

/// The protocol version a 2026-07-28 request declares in `params._meta`.
pub fn declared_version(params: Option<&Value>) -> Option<String> {
    params?
        .get("_meta")?
        .get(META_PROTOCOL_VERSION)?
        .as_str()
        .map(str::to_owned)
}

/// What a 2026-07-28 request's headers say, once they agree with its body.
#[derive(Debug)]
pub struct ModernRequest {
    /// The declared protocol version.
    pub version: String,
    /// The request's `_meta` (`null` when absent).
    pub meta: Value,
    /// Metadata headers for the upstream request: `MCP-Protocol-Version`,
    /// `Mcp-Method`, `Mcp-Name`, and the client's `Mcp-Param-*` as they came.
    pub extra: ExtraHeaders,
}

/// How a 2026-07-28 request's headers disagree with its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderProblem {
    /// A required header is absent.
    Missing(&'static str),
    /// A header names something other than the body does.
    Mismatch {
        /// The header.
        header: &'static str,
        /// Its value.
        value: String,
        /// What the body says.
        body: String,
    },
    /// `Mcp-Name` is not valid base64 sentinel encoding.
    BadEncoding,
    /// The declared version is not one this gateway speaks.
    Unsupported {
        /// The declared version.
        requested: String,
    },
}

/// Check a 2026-07-28 request's metadata headers against its body. The
/// headers are what intermediaries route on; a body that says otherwise is
/// refused so that no component acts on a different call than the one the
/// gateway checked.
pub fn check_modern(
    headers: &http::HeaderMap,
    msg: &Message,
) -> Result<ModernRequest, HeaderProblem> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let params = msg.params_value();
    let declared = declared_version(params.as_ref()).unwrap_or_default();
    match header("mcp-protocol-version") {
        Some(v) if v == declared => {}
        Some(v) => {
            return Err(HeaderProblem::Mismatch {
                header: "MCP-Protocol-Version",
                value: v.to_owned(),
                body: format!("_meta `{declared}`"),
            })
        }
        None => return Err(HeaderProblem::Missing("MCP-Protocol-Version")),
    }
    if !MODERN_VERSIONS.contains(&declared.as_str()) {
        return Err(HeaderProblem::Unsupported {
            requested: declared,
        });
    }
    match header("mcp-method") {
        Some(m) if m == msg.method() => {}
        Some(m) => {
            return Err(HeaderProblem::Mismatch {
                header: "Mcp-Method",
                value: m.to_owned(),
                body: format!("body `{}`", msg.method()),
            })
        }
        None => return Err(HeaderProblem::Missing("Mcp-Method")),
    }
    let name_field = name_field(msg.method());
    let mut name = None;
    if let Some(field) = name_field {
        let body_name = params
            .as_ref()
            .and_then(|p| p.get(field))
            .and_then(Value::as_str)
            .unwrap_or_default();
        match header("mcp-name").map(decode_header_value) {
            Some(Some(h)) if h == body_name => name = Some(body_name.to_owned()),
            Some(Some(h)) => {
                return Err(HeaderProblem::Mismatch {
                    header: "Mcp-Name",
                    value: h,
                    body: format!("body `{body_name}`"),
                })
            }
            Some(None) => return Err(HeaderProblem::BadEncoding),
            None => return Err(HeaderProblem::Missing("Mcp-Name")),
        }
    }
    let meta = params
        .as_ref()
        .and_then(|p| p.get("_meta"))
        .cloned()
        .unwrap_or(Value::Null);
    let mut extra = modern_headers(msg.method(), name.as_deref(), &declared);
    // Intermediaries forward `Mcp-Param-*` headers they do not interpret.
    for (k, v) in headers {
        if k.as_str().starts_with("mcp-param-") {
            extra.push((k.clone(), v.clone()));
        }
    }
    Ok(ModernRequest {
        version: declared,
        meta,
        extra,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_value_encoding() {
        assert_eq!(encode_header_value("get_weather"), "get_weather");
        assert_eq!(
            encode_header_value("Hello, 世界"),
            "=?base64?SGVsbG8sIOS4lueVjA==?="
        );
        assert_eq!(encode_header_value(" padded "), "=?base64?IHBhZGRlZCA=?=");
        assert_eq!(
            encode_header_value("=?base64?literal?="),
            "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?="
        );
        for v in [
            "get_weather",
            "Hello, 世界",
            " padded ",
            "line1\nline2",
            "=?base64?literal?=",
        ] {
            assert_eq!(
                decode_header_value(&encode_header_value(v)).as_deref(),
                Some(v)
            );
        }
        assert_eq!(decode_header_value("=?base64?!!?="), None);
    }
}
