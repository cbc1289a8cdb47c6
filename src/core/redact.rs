//! Redaction: the one place where argument values named by `audit.redact`
//! are taken out of what leaves the gateway's store. The audit log's
//! `arguments`, a revision's `changes` (its `before` and `after`), the
//! webhooks' events, the traces' `gen_ai.tool.call.arguments` and the
//! exported decision inputs all go through [`redact`]: a value the
//! operator named never reaches a record that cannot be edited again
//! (the hash-chained log) or a system of someone else's.
//!
//! A redacted value is replaced by its digest (`sha256:` and the hex of
//! its JCS): equal values stay recognisably equal, and the log's
//! `arguments_digest` still covers the whole call.

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::approval::Change;

/// `sha256:` + hex of the JCS of `value`.
pub fn digest(value: &Value) -> String {
    // The JCS bytes themselves: writing them cannot fail, so nothing else
    // is ever hashed in their place.
    let mut text = Vec::with_capacity(128);
    super::canonical::jcs_into(value, &mut text);
    format!("sha256:{}", hex::encode(Sha256::digest(&text)))
}

/// Replace, in `arguments`, each value at one of `pointers` (RFC 6901 JSON
/// pointers into the arguments) by its digest. A pointer that names
/// nothing in these arguments changes nothing.
pub fn redact(arguments: &mut Value, pointers: &[String]) {
    for pointer in pointers {
        if let Some(v) = arguments.pointer_mut(pointer) {
            *v = Value::from(digest(v));
        }
    }
}

/// `arguments` with the values at `pointers` redacted (a copy only when
/// there is something to redact).
pub fn redacted<'a>(arguments: &'a Value, pointers: &[String]) -> std::borrow::Cow<'a, Value> {
    if pointers.iter().any(|p| arguments.pointer(p).is_some()) {
        let mut copy = arguments.clone();
        redact(&mut copy, pointers);
        std::borrow::Cow::Owned(copy)
    } else {
        std::borrow::Cow::Borrowed(arguments)
    }
}

/// Redact the `before` and `after` of argument changes (a revision's diff):
/// a change at a redacted pointer, or below one, has both values replaced
/// by their digests; a change above one (a whole object replaced) has the
/// redacted values inside it replaced.
pub fn redact_changes(changes: &mut [Change], pointers: &[String]) {
    for c in changes.iter_mut() {
        let values = [c.before.as_mut(), c.after.as_mut()];
        if pointers.iter().any(|p| within(&c.pointer, p)) {
            for v in values.into_iter().flatten() {
                *v = Value::from(digest(v));
            }
            continue;
        }
        // Pointers below this change, made relative to its value.
        let inner: Vec<String> = pointers
            .iter()
            .filter_map(|p| below(p, &c.pointer).map(str::to_owned))
            .collect();
        if !inner.is_empty() {
            for v in values.into_iter().flatten() {
                redact(v, &inner);
            }
        }
    }
}

/// Whether `pointer` is `redacted` or lies below it.
fn within(pointer: &str, redacted: &str) -> bool {
    pointer == redacted
        || pointer
            .strip_prefix(redacted)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// `pointer` relative to `above`, when it lies strictly below it.
fn below<'a>(pointer: &'a str, above: &str) -> Option<&'a str> {
    pointer
        .strip_prefix(above)
        .filter(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pointers(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn values_at_pointers_become_digests_and_the_rest_stays() {
        let mut a = json!({"card": "4111111111111111", "amount": 5, "to": {"iban": "DE89"}});
        redact(&mut a, &pointers(&["/card", "/to/iban", "/absent"]));
        assert_eq!(a["card"], json!(digest(&json!("4111111111111111"))));
        assert_eq!(a["to"]["iban"], json!(digest(&json!("DE89"))));
        assert_eq!(a["amount"], 5);
    }

    #[test]
    fn changes_at_above_and_below_a_pointer_are_redacted() {
        let mut changes = vec![
            Change {
                pointer: "/card".into(),
                before: Some(json!("4111111111111111")),
                after: Some(json!("5500000000000004")),
            },
            Change {
                pointer: "/to".into(),
                before: None,
                after: Some(json!({"iban": "DE89", "name": "Ann"})),
            },
            Change {
                pointer: "/card2/number".into(),
                before: Some(json!("1")),
                after: None,
            },
            Change {
                pointer: "/cardholder".into(),
                before: Some(json!("A")),
                after: Some(json!("B")),
            },
        ];
        redact_changes(&mut changes, &pointers(&["/card", "/to/iban", "/card2"]));
        let text = serde_json::to_string(&changes).unwrap();
        for secret in ["4111111111111111", "5500000000000004", "DE89", "\"1\""] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        // Not below `/card`: a sibling whose name merely starts the same.
        assert_eq!(changes[3].after, Some(json!("B")));
        assert_eq!(changes[1].after.as_ref().unwrap()["name"], "Ann");
    }
}
