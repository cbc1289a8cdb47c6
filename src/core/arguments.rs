//! Tool arguments as Cedar values (DESIGN.md sections 4 and 12).
//!
//! # Typed by the policy schema
//!
//! When the policy folder has a schema, the `arguments` record of the
//! `call` (and `approve`) context is built with the types it declares:
//! a field declared `Long` is a Long, `decimal` a decimal, `String` a
//! string, `Bool` a boolean, `Set<T>` a set of T, a record a record. A value
//! that does not fit its declared type is not guessed at: the decision is a
//! deny whose reason names the field (`/amount is declared Long; the call
//! has 12.5`). Fields the schema does not declare, and any value where no
//! schema is given, follow the untyped mapping below.
//!
//! # Untyped mapping
//!
//! Cedar has no floats and no nulls, and its integers are i64. The mapping is
//! deterministic per value:
//! - `null` → omitted (an object field is absent: test it with `has`; a null
//!   array member is dropped);
//! - booleans and strings → `Bool`, `String`;
//! - numbers → `decimal` when exactly representable (at most 4 fractional
//!   digits, magnitude below 922337203685477.5808), otherwise a `String` of
//!   the number's JCS text (`"100000000000000000000"`, `"1e-7"`). Integers
//!   are decimals too, so one field has one type whatever the value:
//!   policies compare amounts with `decimal` methods
//!   (`context.arguments.amount.greaterThan(decimal("1000.0"))`); an
//!   out-of-range number becomes a string, which such a comparison rejects
//!   (an evaluation error, so the call is denied);
//! - arrays → `Set` (order and duplicates are not kept; mixed types allowed);
//! - objects → records; keys need not be identifiers (`arguments["a-b"]`).

use std::collections::BTreeMap;

use cedar_policy::{RestrictedExpression, SchemaFragment};
use serde_json::Value;

/// A declared argument type, as far as the mapping needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgType {
    /// `Long`.
    Long,
    /// `decimal`.
    Decimal,
    /// `String`.
    String,
    /// `Bool`.
    Bool,
    /// `Set<T>`.
    Set(Box<ArgType>),
    /// A record; undeclared fields are mapped untyped.
    Record(BTreeMap<String, ArgType>),
    /// Anything else (entities, other extension types): mapped untyped.
    Untyped,
}

/// The declared type of `context.arguments` of `action` in a Cedar schema
/// (text), when the schema declares one.
pub fn declared(schema: &str, action: &str) -> Result<Option<ArgType>, String> {
    let (fragment, _) = SchemaFragment::from_cedarschema_str(schema).map_err(|e| e.to_string())?;
    let json = fragment.to_json_value().map_err(|e| e.to_string())?;
    let Some(namespaces) = json.as_object() else {
        return Ok(None);
    };
    for ns in namespaces.values() {
        let common = ns.get("commonTypes").cloned().unwrap_or(Value::Null);
        let Some(context) = ns
            .get("actions")
            .and_then(|a| a.get(action))
            .and_then(|a| a.get("appliesTo"))
            .and_then(|a| a.get("context"))
        else {
            continue;
        };
        let context = resolve(context, &common, 0);
        let Some(arguments) = context.get("attributes").and_then(|a| a.get("arguments")) else {
            return Ok(None);
        };
        return Ok(Some(to_type(arguments, &common, 0)));
    }
    Ok(None)
}

/// Common-type references resolved (a bounded number of hops: the schema
/// parser refuses cycles, this bound only guards the walk).
fn resolve<'a>(t: &'a Value, common: &'a Value, depth: usize) -> &'a Value {
    if depth > 32 {
        return t;
    }
    let name = match t.get("type").and_then(Value::as_str) {
        Some("EntityOrCommon") => t.get("name").and_then(Value::as_str),
        Some(
            "String" | "Long" | "Boolean" | "Bool" | "Set" | "Record" | "Entity" | "Extension",
        ) => None,
        other => other,
    };
    match name.and_then(|n| common.get(n.rsplit("::").next().unwrap_or(n))) {
        Some(found) => resolve(found, common, depth + 1),
        None => t,
    }
}

fn to_type(t: &Value, common: &Value, depth: usize) -> ArgType {
    let t = resolve(t, common, depth);
    // The Cedar-syntax parser leaves a bare name (`Long`, `decimal`) as
    // "entity or common type"; one that is no common type is a built-in.
    let name = t.get("name").and_then(Value::as_str).unwrap_or_default();
    let named = match t.get("type").and_then(Value::as_str) {
        Some("EntityOrCommon") => Some(name.trim_start_matches("__cedar::")),
        _ => None,
    };
    match named {
        Some("Long") => return ArgType::Long,
        Some("String") => return ArgType::String,
        Some("Bool" | "Boolean") => return ArgType::Bool,
        Some("decimal") => return ArgType::Decimal,
        Some(_) => return ArgType::Untyped,
        None => {}
    }
    match t.get("type").and_then(Value::as_str) {
        Some("Long") => ArgType::Long,
        Some("String") => ArgType::String,
        Some("Boolean" | "Bool") => ArgType::Bool,
        Some("Extension") if t.get("name").and_then(Value::as_str) == Some("decimal") => {
            ArgType::Decimal
        }
        Some("Set") if depth < 32 => match t.get("element") {
            Some(e) => ArgType::Set(Box::new(to_type(e, common, depth + 1))),
            None => ArgType::Untyped,
        },
        Some("Record") if depth < 32 => ArgType::Record(
            t.get("attributes")
                .and_then(Value::as_object)
                .map(|attrs| {
                    attrs
                        .iter()
                        .map(|(k, v)| (k.clone(), to_type(v, common, depth + 1)))
                        .collect()
                })
                .unwrap_or_default(),
        ),
        _ => ArgType::Untyped,
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Where a value sits in the arguments: a JSON Pointer, rendered only when
/// an error names it (building it for every member cost more than the
/// mapping itself).
#[derive(Clone, Copy)]
pub enum At<'a> {
    /// The arguments themselves.
    Root,
    /// A member of an object.
    Key(&'a At<'a>, &'a str),
    /// An element of an array.
    Index(&'a At<'a>, usize),
}

impl At<'_> {
    /// The pointer (RFC 6901: `~` as `~0`, `/` as `~1`); `/` for the root.
    fn pointer(&self) -> String {
        fn push(at: &At<'_>, out: &mut String) {
            match at {
                At::Root => {}
                At::Key(parent, k) => {
                    push(parent, out);
                    out.push('/');
                    out.push_str(&crate::core::canonical::pointer_token(k));
                }
                At::Index(parent, i) => {
                    push(parent, out);
                    out.push('/');
                    out.push_str(&i.to_string());
                }
            }
        }
        let mut out = String::new();
        push(self, &mut out);
        if out.is_empty() {
            out.push('/');
        }
        out
    }
}

/// Map `v` as its declared type `ty` (see the module docs). `None` means
/// "omit" (a null). An error names the field and what did not fit.
pub fn typed_value(
    v: &Value,
    ty: &ArgType,
    path: &At<'_>,
) -> Result<Option<RestrictedExpression>, String> {
    walk_typed(&Build, v, ty, path)
}

/// Whether `v` fits its declared type `ty`: the error [`typed_value`]
/// would give, without building the Cedar values (every call is checked;
/// the values are needed only when Cedar is asked).
pub fn check_typed(v: &Value, ty: &ArgType) -> Result<(), String> {
    walk_typed(&Check, v, ty, &At::Root).map(drop)
}

/// What a walk over the arguments makes of them: Cedar values ([`Build`])
/// or nothing but the verdict ([`Check`]). One walk, so the two cannot
/// disagree on what fits.
trait Make {
    type Out;
    /// The members of a record being made.
    type Fields;
    fn bool(&self, b: bool) -> Self::Out;
    fn string(&self, s: &str) -> Self::Out;
    fn long(&self, n: i64) -> Self::Out;
    /// A declared decimal, exactly `text` (see [`as_decimal`]).
    fn decimal(&self, text: String) -> Self::Out;
    /// An undeclared number (see the module docs).
    fn number(&self, v: &Value) -> Self::Out;
    fn set(&self, items: Vec<Self::Out>) -> Self::Out;
    fn fields(&self, n: usize) -> Self::Fields;
    fn field(&self, fields: &mut Self::Fields, key: &str, value: Self::Out);
    fn record(&self, fields: Self::Fields, path: &At<'_>) -> Result<Self::Out, String>;
}

/// Cedar values.
struct Build;

impl Make for Build {
    type Out = RestrictedExpression;
    type Fields = Vec<(String, RestrictedExpression)>;
    fn bool(&self, b: bool) -> Self::Out {
        RestrictedExpression::new_bool(b)
    }
    fn string(&self, s: &str) -> Self::Out {
        RestrictedExpression::new_string(s.to_owned())
    }
    fn long(&self, n: i64) -> Self::Out {
        RestrictedExpression::new_long(n)
    }
    fn decimal(&self, text: String) -> Self::Out {
        decimal(text)
    }
    fn number(&self, v: &Value) -> Self::Out {
        // The JCS text: the spelling the server receives.
        let text = crate::core::canonical::jcs(v);
        match as_decimal(&text) {
            Some(d) => decimal(d),
            None => RestrictedExpression::new_string(text),
        }
    }
    fn set(&self, items: Vec<Self::Out>) -> Self::Out {
        RestrictedExpression::new_set(items)
    }
    fn fields(&self, n: usize) -> Self::Fields {
        Vec::with_capacity(n)
    }
    fn field(&self, fields: &mut Self::Fields, key: &str, value: Self::Out) {
        fields.push((key.to_owned(), value));
    }
    fn record(&self, fields: Self::Fields, path: &At<'_>) -> Result<Self::Out, String> {
        RestrictedExpression::new_record(fields).map_err(|e| {
            format!(
                "arguments at `{}` cannot be given to policies: {e}",
                path.pointer()
            )
        })
    }
}

/// Only the verdict. A record of a JSON object cannot repeat a key, so
/// Cedar accepts every record [`Build`] makes of one.
struct Check;

impl Make for Check {
    type Out = ();
    type Fields = ();
    fn bool(&self, _: bool) {}
    fn string(&self, _: &str) {}
    fn long(&self, _: i64) {}
    fn decimal(&self, _: String) {}
    fn number(&self, _: &Value) {}
    fn set(&self, _: Vec<()>) {}
    fn fields(&self, _: usize) {}
    fn field(&self, _: &mut (), _: &str, _: ()) {}
    fn record(&self, _: (), _: &At<'_>) -> Result<(), String> {
        Ok(())
    }
}

fn walk_typed<M: Make>(
    m: &M,
    v: &Value,
    ty: &ArgType,
    path: &At<'_>,
) -> Result<Option<M::Out>, String> {
    let mismatch = |declared: &str| {
        format!(
            "argument `{}` is declared {declared} in the policy schema; the call has {}",
            path.pointer(),
            match v {
                Value::Number(_) | Value::Bool(_) => crate::core::canonical::jcs(v),
                other => kind(other).to_owned(),
            }
        )
    };
    Ok(Some(match (ty, v) {
        (_, Value::Null) => return Ok(None),
        (ArgType::Untyped, _) => return walk_untyped(m, v, path),
        (ArgType::Long, Value::Number(n)) => m.long(n.as_i64().ok_or_else(|| mismatch("Long"))?),
        (ArgType::Long, _) => return Err(mismatch("Long")),
        (ArgType::Decimal, Value::Number(_)) => {
            m.decimal(as_decimal(&crate::core::canonical::jcs(v)).ok_or_else(|| {
                mismatch("decimal (at most 4 fractional digits, magnitude below 922337203685477)")
            })?)
        }
        (ArgType::Decimal, _) => return Err(mismatch("decimal")),
        (ArgType::String, Value::String(s)) => m.string(s),
        (ArgType::String, _) => return Err(mismatch("String")),
        (ArgType::Bool, Value::Bool(b)) => m.bool(*b),
        (ArgType::Bool, _) => return Err(mismatch("Bool")),
        (ArgType::Set(element), Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                if let Some(x) = walk_typed(m, item, element, &At::Index(path, i))? {
                    out.push(x);
                }
            }
            m.set(out)
        }
        (ArgType::Set(_), _) => return Err(mismatch("a Set")),
        (ArgType::Record(fields), Value::Object(map)) => {
            let mut out = m.fields(map.len());
            for (k, item) in map {
                let at = At::Key(path, k);
                let x = match fields.get(k) {
                    Some(t) => walk_typed(m, item, t, &at)?,
                    None => walk_untyped(m, item, &at)?,
                };
                if let Some(x) = x {
                    m.field(&mut out, k, x);
                }
            }
            m.record(out, path)?
        }
        (ArgType::Record(_), _) => return Err(mismatch("a record")),
    }))
}

/// The Cedar decimal of `text` (see [`as_decimal`]). Cedar's
/// `RestrictedExpression::new_decimal` parses the extension's name with its
/// whole grammar on every call, about 48,000 instructions under callgrind,
/// more than the rest of a decision; so each thread builds a decimal once per
/// distinct text and clones it after. The text is the caller's: the map keeps
/// std's keyed hasher, and is emptied at 1,024 texts, so it stays bounded.
fn decimal(text: String) -> RestrictedExpression {
    use std::cell::RefCell;
    use std::collections::HashMap;
    thread_local! {
        static MADE: RefCell<HashMap<String, RestrictedExpression>> = RefCell::new(HashMap::new());
    }
    MADE.with(|made| {
        let mut made = made.borrow_mut();
        if let Some(e) = made.get(&text) {
            return e.clone();
        }
        if made.len() >= 1024 {
            made.clear();
        }
        let e = RestrictedExpression::new_decimal(&text);
        made.insert(text, e.clone());
        e
    })
}

/// The Cedar decimal of a plain decimal's text, when it is one exactly
/// (at most four fractional digits, within range).
pub fn cedar_decimal(text: &str) -> Option<RestrictedExpression> {
    as_decimal(text).map(decimal)
}

/// Largest magnitude of a Cedar decimal (i64 / 10^4).
const DECIMAL_LIMIT: f64 = 922_337_203_685_477.0;

/// The Cedar text of a decimal, when `literal` is one exactly.
fn as_decimal(literal: &str) -> Option<String> {
    if literal.contains(['e', 'E']) {
        return None;
    }
    let (int, frac) = literal.split_once('.').unwrap_or((literal, ""));
    let frac = frac.trim_end_matches('0');
    if frac.len() > 4 {
        return None;
    }
    let magnitude: f64 = int.trim_start_matches('-').parse().ok()?;
    if magnitude >= DECIMAL_LIMIT {
        return None;
    }
    Some(format!(
        "{int}.{}",
        if frac.is_empty() { "0" } else { frac }
    ))
}

/// Map a JSON value to a Cedar value (see the module docs). `None` means
/// "omit" (a null).
pub fn map_value(v: &Value, path: &At<'_>) -> Result<Option<RestrictedExpression>, String> {
    walk_untyped(&Build, v, path)
}

fn walk_untyped<M: Make>(m: &M, v: &Value, path: &At<'_>) -> Result<Option<M::Out>, String> {
    Ok(Some(match v {
        Value::Null => return Ok(None),
        Value::Bool(b) => m.bool(*b),
        Value::String(s) => m.string(s),
        Value::Number(_) => m.number(v),
        Value::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                if let Some(x) = walk_untyped(m, item, &At::Index(path, i))? {
                    out.push(x);
                }
            }
            m.set(out)
        }
        Value::Object(map) => {
            let mut fields = m.fields(map.len());
            for (k, item) in map {
                if let Some(x) = walk_untyped(m, item, &At::Key(path, k))? {
                    m.field(&mut fields, k, x);
                }
            }
            m.record(fields, path)?
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SCHEMA: &str = r#"
entity Principal;
entity Tool;
type Amounts = { amount?: Long, price?: decimal, tags?: Set<String>, nested?: { flag?: Bool } };
action call appliesTo {
  principal: [Principal],
  resource: [Tool],
  context: { arguments: Amounts, approved: Bool },
};
"#;

    fn ty() -> ArgType {
        declared(SCHEMA, "call").unwrap().expect("declared")
    }

    fn text(v: Value) -> Result<String, String> {
        typed_value(&v, &ty(), &At::Root).map(|e| format!("{:?}", e.unwrap()))
    }

    #[test]
    fn the_schema_types_each_declared_field() {
        let ArgType::Record(fields) = ty() else {
            panic!("not a record")
        };
        assert_eq!(fields["amount"], ArgType::Long);
        assert_eq!(fields["price"], ArgType::Decimal);
        assert_eq!(fields["tags"], ArgType::Set(Box::new(ArgType::String)));
        assert!(matches!(fields["nested"], ArgType::Record(_)));
        assert_eq!(declared(SCHEMA, "approve").unwrap(), None);
    }

    #[test]
    fn values_that_fit_map_and_others_are_named() {
        assert!(text(json!({"amount": 4200, "price": 12.5, "tags": ["a"], "other": 1.5})).is_ok());
        let e = text(json!({"amount": "4200"})).unwrap_err();
        assert!(
            e.contains("`/amount` is declared Long") && e.contains("a string"),
            "{e}"
        );
        let e = text(json!({"amount": 12.5})).unwrap_err();
        assert!(e.contains("`/amount`") && e.contains("12.5"), "{e}");
        let e = text(json!({"price": 0.00001})).unwrap_err();
        assert!(e.contains("`/price` is declared decimal"), "{e}");
        let e = text(json!({"tags": ["a", 1]})).unwrap_err();
        assert!(e.contains("`/tags/1` is declared String"), "{e}");
        let e = text(json!({"nested": {"flag": "yes"}})).unwrap_err();
        assert!(e.contains("`/nested/flag` is declared Bool"), "{e}");
        // A null is absent, whatever the type.
        assert!(text(json!({"amount": null})).is_ok());
    }

    #[test]
    fn the_check_says_what_the_mapping_says() {
        for v in [
            json!({"amount": 4200, "price": 12.5, "tags": ["a"], "other": 1.5}),
            json!({"amount": "4200"}),
            json!({"amount": 12.5}),
            json!({"price": 0.00001}),
            json!({"tags": ["a", 1]}),
            json!({"nested": {"flag": "yes"}}),
            json!({"nested": {"flag": true, "x": [1, null, {"y": 1e300}]}}),
            json!({"amount": null, "tags": "no"}),
            json!([1, 2]),
        ] {
            let built = typed_value(&v, &ty(), &At::Root).map(drop);
            assert_eq!(check_typed(&v, &ty()), built, "{v}");
        }
    }

    #[test]
    fn pointers_escape_keys_and_name_the_root() {
        let root = At::Root;
        assert_eq!(root.pointer(), "/");
        let key = At::Key(&root, "a/b~c");
        let index = At::Index(&key, 3);
        assert_eq!(index.pointer(), "/a~1b~0c/3");
    }

    #[test]
    fn decimals_are_exact_or_not_decimals() {
        assert_eq!(as_decimal("-12.5000"), Some("-12.5".into()));
        assert_eq!(as_decimal("1.23456"), None);
        assert_eq!(as_decimal("922337203685478"), None);
    }
}
