//! A JSON object edited member by member, every other byte kept.
//!
//! The gateway adds a few members to answers it keeps and gives again (the
//! replay mark in `_meta`, `resultType` for 2026-07-28 clients) and takes a
//! few away. Parsing the answer into a `Value` and writing it back would
//! also rewrite everything else the server sent: `1e2` would become
//! `100.0`, `"\u00e9"` would become `"é"`, and a parser that is not
//! correctly rounded would move a number to a neighbouring double. A
//! replay must be what the server sent, so these edits splice raw text:
//! the members not touched are copied as their bytes, keys included.

use serde_json::value::RawValue;

/// One member of an object: its key as written (with its quotes and
/// escapes), the key decoded, and the value as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member<'a> {
    /// The key exactly as the text has it, quotes included.
    pub raw_key: &'a str,
    /// The key decoded.
    pub key: String,
    /// The value exactly as the text has it.
    pub value: &'a str,
}

/// The members of the JSON object `text`, in order, or `None` when `text`
/// is not one object.
pub fn members(text: &str) -> Option<Vec<Member<'_>>> {
    let b = text.as_bytes();
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(b, i + 1);
    let mut out = Vec::new();
    if b.get(i) == Some(&b'}') {
        return (skip_ws(b, i + 1) == b.len()).then_some(out);
    }
    loop {
        // The key: a string, measured by the JSON parser itself.
        let key_start = i;
        let key_end = key_start + value_len(&text[key_start..])?;
        let raw_key = &text[key_start..key_end];
        let key: String = serde_json::from_str(raw_key).ok()?;
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(b, i + 1);
        let value_end = i + value_len(&text[i..])?;
        out.push(Member {
            raw_key,
            key,
            value: &text[i..value_end],
        });
        i = skip_ws(b, value_end);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => return (skip_ws(b, i + 1) == b.len()).then_some(out),
            _ => return None,
        }
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// The length of the one JSON value at the start of `text`.
fn value_len(text: &str) -> Option<usize> {
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<&RawValue>();
    stream.next()?.ok()?;
    Some(stream.byte_offset())
}

/// `members` written back as an object: each member's own bytes, joined by
/// commas.
fn write(members: &[Member<'_>], added: &[(String, String)]) -> String {
    let mut out = String::with_capacity(
        members
            .iter()
            .map(|m| m.raw_key.len() + m.value.len() + 2)
            .sum::<usize>()
            + 2,
    );
    out.push('{');
    let pairs = members
        .iter()
        .map(|m| (m.raw_key, m.value))
        .chain(added.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    for (n, (k, v)) in pairs.enumerate() {
        if n > 0 {
            out.push(',');
        }
        out.push_str(k);
        out.push(':');
        out.push_str(v);
    }
    out.push('}');
    out
}

/// The object `text` with member `key` set to the JSON `value` (replacing
/// it where it is, or added at the end), every other byte kept. `None`
/// when `text` is not an object.
pub fn with_member(text: &str, key: &str, value: &str) -> Option<String> {
    let mut ms = members(text)?;
    let raw_key = serde_json::Value::from(key).to_string();
    match ms.iter_mut().find(|m| m.key == key) {
        Some(m) => {
            m.value = value;
            Some(write(&ms, &[]))
        }
        None => Some(write(&ms, &[(raw_key, value.to_owned())])),
    }
}

/// The object `text` without member `key` (unchanged when it has none).
/// `None` when `text` is not an object.
pub fn without_member(text: &str, key: &str) -> Option<String> {
    let mut ms = members(text)?;
    let before = ms.len();
    ms.retain(|m| m.key != key);
    if ms.len() == before {
        return Some(text.to_owned());
    }
    Some(write(&ms, &[]))
}

/// The object `text` with member `key` added when it lacks one (its value
/// kept when it has one).
pub fn with_default(text: &str, key: &str, value: &str) -> Option<String> {
    let ms = members(text)?;
    if ms.iter().any(|m| m.key == key) {
        return Some(text.to_owned());
    }
    with_member(text, key, value)
}

/// The object `text` with `name` set to the JSON `value` inside its
/// `_meta` object (made when absent), every other byte kept. A `_meta` that
/// is not an object is replaced.
pub fn with_meta(text: &str, name: &str, value: &str) -> Option<String> {
    let ms = members(text)?;
    let meta = match ms.iter().find(|m| m.key == "_meta") {
        Some(m) => with_member(m.value, name, value).unwrap_or_else(|| {
            write(
                &[],
                &[(serde_json::Value::from(name).to_string(), value.to_owned())],
            )
        }),
        None => write(
            &[],
            &[(serde_json::Value::from(name).to_string(), value.to_owned())],
        ),
    };
    with_member(text, "_meta", &meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SENT: &str = r#"{ "content" : [{"type":"text","text":"caf\u00e9 \"q\" \\ \n"}],
        "structuredContent":{"balance":1944.4099999999999,"big":1e2,"neg":-0.0,"x":1E+2},
        "_meta":{"vendor/x":[1,2]} }"#;

    #[test]
    fn members_keep_their_bytes_and_order() {
        let ms = members(SENT).unwrap();
        let keys: Vec<&str> = ms.iter().map(|m| m.key.as_str()).collect();
        assert_eq!(keys, ["content", "structuredContent", "_meta"]);
        assert_eq!(ms[0].raw_key, r#""content""#);
        assert!(ms[1].value.contains("1944.4099999999999") && ms[1].value.contains("1e2"));
        assert!(members("[1]").is_none() && members("{").is_none());
        assert!(members(r#"{"a":1} x"#).is_none());
        assert_eq!(members(" {} ").unwrap(), Vec::new());
    }

    #[test]
    fn an_edit_changes_what_it_names_and_nothing_else() {
        let marked = with_meta(SENT, "dev.countersign/replayed", r#"{"key":"k"}"#).unwrap();
        assert!(
            marked.contains(r#""_meta":{"vendor/x":[1,2],"dev.countersign/replayed":{"key":"k"}}"#),
            "{marked}"
        );
        // Everything the server wrote is there as it wrote it.
        for part in [
            r#"caf\u00e9 \"q\" \\ \n"#,
            "1944.4099999999999",
            "1e2",
            "-0.0",
            "1E+2",
        ] {
            assert!(marked.contains(part), "{part} in {marked}");
        }
        let modern = with_default(&marked, "resultType", r#""complete""#).unwrap();
        assert!(modern.ends_with(r#","resultType":"complete"}"#), "{modern}");
        assert_eq!(
            with_default(&modern, "resultType", r#""other""#).unwrap(),
            modern
        );
        let back = without_member(&modern, "resultType").unwrap();
        assert_eq!(back, marked);
        let bare = with_meta(r#"{"content":[]}"#, "m", "1").unwrap();
        assert_eq!(bare, r#"{"content":[],"_meta":{"m":1}}"#);
        assert!(with_meta("[]", "m", "1").is_none());
    }
}
