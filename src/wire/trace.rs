//! W3C trace context in MCP messages (SEP-414): a client's `traceparent`
//! and `tracestate` in `params._meta`, and the gateway's own written into
//! the `params` it sends upstream.
//!
//! Writing one changes `_meta` alone: every other member of `params`, the
//! tool's `arguments` above all, goes out as the very bytes it came in
//! (the bytes that were hashed and approved). Nothing here decides whether
//! a context is valid; the propagator that reads it does (an invalid one
//! starts a new trace, as the W3C recommendation asks).

use serde::de::{MapAccess, Visitor};
use serde::Deserializer;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// The `_meta` key of the W3C `traceparent`.
pub const TRACEPARENT: &str = "traceparent";
/// The `_meta` key of the W3C `tracestate`.
pub const TRACESTATE: &str = "tracestate";

/// A W3C trace context as carried on the wire (unvalidated text).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceContext {
    /// `traceparent`.
    pub traceparent: String,
    /// `tracestate`, when there is one.
    pub tracestate: Option<String>,
}

/// The trace context a request carries in `params._meta`, if any.
pub fn from_meta(params: Option<&Value>) -> Option<TraceContext> {
    let meta = params?.get("_meta")?;
    let traceparent = meta.get(TRACEPARENT)?.as_str()?.to_owned();
    let tracestate = meta
        .get(TRACESTATE)
        .and_then(Value::as_str)
        .map(str::to_owned);
    Some(TraceContext {
        traceparent,
        tracestate,
    })
}

/// `params` with `ctx` as its `_meta.traceparent` (and `tracestate`,
/// removed when `ctx` has none), every other member kept byte for byte and
/// in its place. `None` when `params` is not an object (nothing to carry
/// it in; the message goes out unchanged).
pub fn with_context(params: Option<&RawValue>, ctx: &TraceContext) -> Option<Box<RawValue>> {
    let members = match params {
        None => Vec::new(),
        Some(raw) => {
            let mut de = serde_json::Deserializer::from_str(raw.get());
            de.deserialize_map(MembersVisitor).ok()?
        }
    };
    let mut out = String::with_capacity(params.map_or(0, |p| p.get().len()) + 96);
    out.push('{');
    let mut first = true;
    let mut sep = |out: &mut String| {
        if !first {
            out.push(',');
        }
        first = false;
    };
    let mut written = false;
    for (key, value) in &members {
        sep(&mut out);
        out.push_str(&Value::String(key.clone()).to_string());
        out.push(':');
        if key == "_meta" {
            // `_meta` is never hashed: re-serializing it is safe.
            let meta = serde_json::from_str::<Map<String, Value>>(value.get()).ok()?;
            out.push_str(&Value::Object(meta_with(meta, ctx)).to_string());
            written = true;
        } else {
            out.push_str(value.get());
        }
    }
    if !written {
        sep(&mut out);
        out.push_str("\"_meta\":");
        out.push_str(&Value::Object(meta_with(Map::new(), ctx)).to_string());
    }
    out.push('}');
    RawValue::from_string(out).ok()
}

fn meta_with(mut meta: Map<String, Value>, ctx: &TraceContext) -> Map<String, Value> {
    meta.insert(TRACEPARENT.into(), Value::from(ctx.traceparent.clone()));
    match &ctx.tracestate {
        Some(state) => {
            meta.insert(TRACESTATE.into(), Value::from(state.clone()));
        }
        // A client's `tracestate` belongs to its own `traceparent`, which
        // the gateway's replaces.
        None => {
            meta.remove(TRACESTATE);
        }
    }
    meta
}

/// An object's members in their order, each value as its raw text.
struct MembersVisitor;

impl<'de> Visitor<'de> for MembersVisitor {
    type Value = Vec<(String, Box<RawValue>)>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, Box<RawValue>>()? {
            members.push((k, v));
        }
        Ok(members)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(state: Option<&str>) -> TraceContext {
        TraceContext {
            traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
            tracestate: state.map(str::to_owned),
        }
    }

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap_or_else(|_| panic!("not JSON: {s}"))
    }

    #[test]
    fn the_arguments_keep_their_exact_bytes_and_place() {
        // Numbers and key order that a re-serialization would change.
        let params = raw(r#"{"arguments":{"z":1E30,"a":4.50,"€":"x"},"name":"t"}"#);
        let out = with_context(Some(&params), &ctx(None)).unwrap_or_else(|| panic!("object"));
        assert!(
            out.get()
                .starts_with(r#"{"arguments":{"z":1E30,"a":4.50,"€":"x"},"name":"t","_meta":{"#),
            "{}",
            out.get()
        );
        let v: Value = serde_json::from_str(out.get()).unwrap_or_default();
        assert_eq!(v["_meta"]["traceparent"], ctx(None).traceparent);
        assert!(v["_meta"].get("tracestate").is_none());
    }

    #[test]
    fn a_clients_context_is_replaced_and_other_meta_kept() {
        let params = raw(
            r#"{"name":"t","_meta":{"progressToken":7,"traceparent":"00-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-bbbbbbbbbbbbbbbb-01","tracestate":"x=1"},"arguments":{"b":1.0}}"#,
        );
        let out = with_context(Some(&params), &ctx(None)).unwrap_or_else(|| panic!("object"));
        assert!(
            out.get().ends_with(r#""arguments":{"b":1.0}}"#),
            "{}",
            out.get()
        );
        let v: Value = serde_json::from_str(out.get()).unwrap_or_default();
        assert_eq!(v["_meta"]["progressToken"], 7);
        assert_eq!(v["_meta"]["traceparent"], ctx(None).traceparent);
        assert!(v["_meta"].get("tracestate").is_none(), "{v}");
        let with_state =
            with_context(Some(&params), &ctx(Some("cs=1"))).unwrap_or_else(|| panic!("object"));
        let v: Value = serde_json::from_str(with_state.get()).unwrap_or_default();
        assert_eq!(v["_meta"]["tracestate"], "cs=1");
    }

    #[test]
    fn no_params_get_a_meta_and_a_non_object_is_left_alone() {
        let out = with_context(None, &ctx(None)).unwrap_or_else(|| panic!("object"));
        assert_eq!(
            out.get(),
            r#"{"_meta":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}"#
        );
        assert!(with_context(Some(&raw("[1,2]")), &ctx(None)).is_none());
        assert!(with_context(Some(&raw(r#"{"_meta":5}"#)), &ctx(None)).is_none());
    }

    #[test]
    fn a_context_is_read_from_meta() {
        let params =
            serde_json::json!({"_meta": {"traceparent": "00-x-y-01", "tracestate": "a=b"}});
        assert_eq!(
            from_meta(Some(&params)),
            Some(TraceContext {
                traceparent: "00-x-y-01".into(),
                tracestate: Some("a=b".into())
            })
        );
        assert_eq!(
            from_meta(Some(&serde_json::json!({"_meta": {"traceparent": 5}}))),
            None
        );
        assert_eq!(from_meta(None), None);
    }
}
