//! Agent text made legible for people: the one place that decides how text
//! an agent chose (argument keys and values, tool names, OAuth client
//! names, reasons) is shown to a reviewer, in a terminal, a chat message,
//! a log line or a web page.
//!
//! An agent controls these strings, and a reviewer decides on what they
//! show. A terminal obeys escape sequences, a carriage return moves the
//! cursor back over what was printed, a bidi override reverses what
//! follows, and a zero-width character makes two different names look
//! alike. So every character that could change what is displayed, rather
//! than display itself, is written out in a visible form (`\u{1b}`), and a
//! backslash is doubled so that no agent text can pass for an escape:
//! - C0 and C1 controls and DEL (general category Cc);
//! - format characters (Cf): bidi embeddings, overrides and isolates,
//!   zero-width space, joiners, word joiner, byte order mark, soft hyphen,
//!   interlinear annotations, tags;
//! - line and paragraph separators (Zl, Zp), private use (Co) and
//!   unassigned code points (Cn), which render as anything or nothing;
//! - the other default-ignorable code points that are not Cf (combining
//!   grapheme joiner, Hangul fillers, Mongolian and other variation
//!   selectors) and the blank braille pattern, which show as nothing.
//!
//! Keys that are not printable identifiers are marked, and a tool name
//! that looks like another listed one (the same UTS #39 skeleton, another
//! string) can be told apart with [`confusable_with`].

use std::borrow::Cow;
use std::fmt::Write as _;

use serde_json::Value;
use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};
use unicode_security::{GeneralSecurityProfile, MixedScript};

/// The mark put after a key that is not a printable identifier.
pub const UNUSUAL_KEY: &str = "(unusual key)";

/// Whether `c` is shown as itself (else it is escaped).
fn displays_itself(c: char) -> bool {
    if c == ' ' || c.is_ascii_graphic() {
        return true;
    }
    if c.is_ascii() {
        // The other ASCII characters are controls (C0 and DEL).
        return false;
    }
    match c.general_category() {
        GeneralCategory::Control
        | GeneralCategory::Format
        | GeneralCategory::LineSeparator
        | GeneralCategory::ParagraphSeparator
        | GeneralCategory::PrivateUse
        | GeneralCategory::Surrogate
        | GeneralCategory::Unassigned => return false,
        _ => {}
    }
    // Default-ignorable code points outside Cf, and the blank braille
    // pattern: each shows as nothing.
    !matches!(
        c,
        '\u{034F}'
            | '\u{115F}'..='\u{1160}'
            | '\u{17B4}'..='\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{2800}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FFA0}'
            | '\u{E0100}'..='\u{E01EF}'
    )
}

/// `s` as people may see it: every character that does not display itself
/// written as `\u{hex}`, and `\` as `\\`. Borrowed when nothing changes.
///
/// ```
/// use countersign::core::legible::text;
/// assert_eq!(text("amount"), "amount");
/// assert_eq!(text("zz\r\u{1b}[2K"), r"zz\u{d}\u{1b}[2K");
/// assert_eq!(text("a\u{202e}b"), r"a\u{202e}b");
/// assert_eq!(text(r"\u{1b}"), r"\\u{1b}");
/// ```
pub fn text(s: &str) -> Cow<'_, str> {
    escaped(s, true)
}

/// The one rule: characters that do not display themselves as `\u{hex}`,
/// and backslashes doubled when `backslashes`.
fn escaped(s: &str, backslashes: bool) -> Cow<'_, str> {
    let keeps = |c: char| displays_itself(c) && !(backslashes && c == '\\');
    if s.chars().all(keeps) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            c if keeps(c) => out.push(c),
            '\\' => out.push_str("\\\\"),
            c => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
        }
    }
    Cow::Owned(out)
}

/// `s` with every character that does not display itself written as
/// `\u{hex}`, backslashes left as they are: for text that is already
/// legible (a summary the gateway made) or whose escapes a reader expects
/// as they are (a log line), and that must still never carry a raw control
/// character. Applying it twice changes nothing more.
///
/// ```
/// use countersign::core::legible::visible;
/// assert_eq!(visible("a\u{1b}\r"), r"a\u{1b}\u{d}");
/// assert_eq!(visible(r"a\u{1b}"), r"a\u{1b}");
/// ```
pub fn visible(s: &str) -> Cow<'_, str> {
    escaped(s, false)
}

/// Whether `k` is a printable identifier: letters, digits, `_`, `-` and
/// `.` that UTS #39 allows in identifiers, all of one script, at most 64 of
/// them. Such a key is shown as it is; any other one is marked.
pub fn is_plain_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars().count() <= 64
        && k.chars().all(|c| {
            matches!(c, '_' | '-' | '.') || (c.is_alphanumeric() && c.identifier_allowed())
        })
        && k.is_single_script()
}

/// An argument key as people may see it: itself when it is a printable
/// identifier ([`is_plain_key`]), else quoted, escaped and marked, so that
/// a key built to look like another line (`"zz\r  amount   "`) reads as
/// what it is.
///
/// ```
/// use countersign::core::legible::key;
/// assert_eq!(key("amount"), "amount");
/// assert_eq!(key("zz\r  amount"), r#""zz\u{d}  amount" (unusual key)"#);
/// ```
pub fn key(k: &str) -> Cow<'_, str> {
    if is_plain_key(k) {
        return Cow::Borrowed(k);
    }
    Cow::Owned(format!("\"{}\" {UNUSUAL_KEY}", text(k)))
}

/// A JSON value on one line, as people may see it: the JSON text with
/// every character that does not display itself written as a JSON escape
/// (`\u001b`), so it is still the same JSON.
///
/// ```
/// use countersign::core::legible::json;
/// let v = serde_json::json!({"memo": ["a\u{202e}b", 900]});
/// assert_eq!(json(&v), r#"{"memo":["a\u202eb",900]}"#);
/// ```
pub fn json(v: &Value) -> String {
    // serde_json escapes `"`, `\` and C0 controls itself; anything else
    // that does not display itself can only stand inside a string here.
    let raw = v.to_string();
    if raw.chars().all(displays_itself) {
        return raw;
    }
    let mut out = String::with_capacity(raw.len() + 8);
    for c in raw.chars() {
        if displays_itself(c) {
            out.push(c);
            continue;
        }
        let mut units = [0u16; 2];
        for u in c.encode_utf16(&mut units) {
            let _ = write!(out, "\\u{u:04x}");
        }
    }
    out
}

/// The listed name that `name` could be mistaken for: one with the same
/// UTS #39 confusable skeleton that is not `name` itself (`ｃｈａｒｇｅ_card`
/// and `charge_card`, `paypal` and `pаypal` with a Cyrillic `а`).
pub fn confusable_with<'a>(
    name: &str,
    listed: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let skeleton: String = unicode_security::skeleton(name).collect();
    listed
        .into_iter()
        .find(|other| *other != name && unicode_security::skeleton(other).eq(skeleton.chars()))
}

/// What a string value could pass for, said beside it: `mixed scripts`
/// when it mixes scripts (UTS #39: `pаypal.com` with a Cyrillic `а`), and
/// `looks like ASCII` when its UTS #39 confusable skeleton is plain ASCII
/// (`ｐaypal.com`, fullwidth digits in an amount); then the string with each
/// non-ASCII character written as `\u{hex}`, so the odd ones stand out. A
/// reviewer reads values as they look; an agent may have chosen one to
/// look like another. `None` for text shown as ASCII (controls and format
/// characters are written out by [`text`]), and for text of one script
/// that looks like no ASCII text.
pub fn lookalike(s: &str) -> Option<String> {
    // Shown as ASCII (what does not display itself is written out): the
    // odd characters already show.
    if text(s).is_ascii() {
        return None;
    }
    let what = if !s.is_single_script() {
        "mixed scripts"
    } else if unicode_security::skeleton(s).all(|c| c.is_ascii()) {
        "looks like ASCII"
    } else {
        return None;
    };
    let mut revealed = String::with_capacity(s.len() + 8);
    for c in text(s).chars() {
        if c.is_ascii() {
            revealed.push(c);
        } else {
            let _ = write!(revealed, "\\u{{{:x}}}", u32::from(c));
        }
    }
    Some(format!("{what}: {revealed}"))
}

/// Each string in `v` that could pass for another ([`lookalike`]), with
/// the JSON pointer to it (`""` for `v` itself).
pub fn lookalikes(v: &Value) -> Vec<(String, String)> {
    fn walk(v: &Value, at: &mut String, out: &mut Vec<(String, String)>) {
        match v {
            Value::String(s) => {
                if let Some(mark) = lookalike(s) {
                    out.push((at.clone(), mark));
                }
            }
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    let len = at.len();
                    let _ = write!(at, "/{i}");
                    walk(x, at, out);
                    at.truncate(len);
                }
            }
            Value::Object(m) => {
                for (k, x) in m {
                    let len = at.len();
                    at.push('/');
                    at.push_str(&crate::core::canonical::pointer_token(k));
                    walk(x, at, out);
                    at.truncate(len);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(v, &mut String::new(), &mut out);
    out
}

/// A value as people may see it: [`json`], then, in parentheses, what any
/// string in it could pass for: `"pаypal.com" (mixed scripts, looks like
/// "paypal.com")`.
pub fn value(v: &Value) -> String {
    marked(json(v), v)
}

/// `shown` (how a surface writes the value `v`) followed by the marks of
/// the strings in `v` that could pass for others, if any.
pub fn marked(shown: String, v: &Value) -> String {
    let marks = lookalikes(v);
    if marks.is_empty() {
        return shown;
    }
    let said: Vec<String> = marks
        .into_iter()
        .map(|(at, mark)| {
            if at.is_empty() {
                mark
            } else {
                format!("{}: {mark}", text(&at))
            }
        })
        .collect();
    format!("{shown} ({})", said.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_that_could_pass_for_others_are_marked() {
        // A Cyrillic `а` in a Latin domain.
        assert_eq!(
            lookalike("p\u{430}ypal.com").as_deref(),
            Some(r"mixed scripts: p\u{430}ypal.com")
        );
        // Fullwidth digits in an amount: one script, an ASCII lookalike.
        assert_eq!(
            lookalike("\u{ff11}00").as_deref(),
            Some(r"looks like ASCII: \u{ff11}00")
        );
        assert_eq!(lookalike("paypal.com"), None);
        assert_eq!(lookalike("Müller"), None);
        assert_eq!(lookalike("東京タワー"), None, "Japanese is one script set");
        assert_eq!(lookalike("Москва"), None);
        let v = serde_json::json!({"to": "p\u{430}ypal.com", "n": [1, "\u{ff11}"], "ok": "a"});
        assert_eq!(
            value(&v),
            "{\"to\":\"p\u{430}ypal.com\",\"n\":[1,\"\u{ff11}\"],\"ok\":\"a\"} (/to: mixed scripts: p\\u{430}ypal.com; /n/1: looks like ASCII: \\u{ff11})"
        );
        assert_eq!(value(&serde_json::json!("plain")), "\"plain\"");
    }

    /// Every character that must never reach a reader raw.
    fn hostile() -> Vec<char> {
        let mut v: Vec<char> = (0u32..0x20)
            .chain(0x7f..0xa0)
            .filter_map(char::from_u32)
            .collect();
        v.extend([
            '\u{ad}',
            '\u{34f}',
            '\u{61c}',
            '\u{115f}',
            '\u{180e}',
            '\u{200b}',
            '\u{200c}',
            '\u{200d}',
            '\u{200e}',
            '\u{200f}',
            '\u{2028}',
            '\u{2029}',
            '\u{202a}',
            '\u{202b}',
            '\u{202c}',
            '\u{202d}',
            '\u{202e}',
            '\u{2060}',
            '\u{2066}',
            '\u{2067}',
            '\u{2068}',
            '\u{2069}',
            '\u{2800}',
            '\u{3164}',
            '\u{fe0f}',
            '\u{feff}',
            '\u{fff9}',
            '\u{e000}',
            '\u{e0001}',
            '\u{e0041}',
            '\u{e0100}',
            '\u{10ffff}',
        ]);
        v
    }

    #[test]
    fn no_hostile_character_comes_out_of_any_rendering() {
        for c in hostile() {
            let s = format!("a{c}b");
            let t = text(&s);
            assert!(!t.contains(c), "{c:?} came out of text: {t:?}");
            assert_eq!(t, format!("a\\u{{{:x}}}b", c as u32));
            let k = key(&s);
            assert!(!k.contains(c) && k.ends_with(UNUSUAL_KEY), "{c:?}: {k:?}");
            let j = json(&Value::from(s.clone()));
            assert!(!j.contains(c), "{c:?} came out of json: {j:?}");
            let back: String = serde_json::from_str(&j).expect("still JSON");
            assert_eq!(back, s, "the JSON names the same string");
        }
    }

    #[test]
    fn ordinary_text_is_shown_as_it_is() {
        for s in [
            "charge_card",
            "Zürich 8001",
            "日本語",
            "€ 1,944.41",
            "a\"b",
            "emoji 👍",
        ] {
            assert_eq!(text(s), s);
        }
        for k in [
            "amount",
            "account_id",
            "Betrag",
            "ключ",
            "x-request.id",
            "名前",
        ] {
            assert!(is_plain_key(k), "{k}");
        }
        for k in [
            "",
            "a b",
            "amount\u{200b}",
            "pаypal_id",
            "a:b",
            &"k".repeat(65),
        ] {
            assert!(!is_plain_key(k), "{k:?}");
        }
    }

    #[test]
    fn the_deceiving_key_of_the_attack_reads_as_what_it_is() {
        let k = "zz\r\u{1b}[2K\u{1b}[1A\u{1b}[2K\r  amount              ";
        let shown = key(k);
        assert!(!shown.chars().any(|c| c.is_control()), "{shown}");
        assert!(shown.starts_with(r#""zz\u{d}\u{1b}[2K"#), "{shown}");
        assert!(shown.ends_with(UNUSUAL_KEY), "{shown}");
    }

    #[test]
    fn a_lookalike_tool_name_is_found_and_an_exact_one_is_not() {
        let listed = ["charge_card", "refund", "get_balance"];
        assert_eq!(
            confusable_with("ｃｈａｒｇｅ_card", listed),
            Some("charge_card")
        );
        assert_eq!(confusable_with("chаrge_card", listed), Some("charge_card"));
        assert_eq!(confusable_with("charge_card", listed), None);
        assert_eq!(confusable_with("wire_money", listed), None);
    }
}
