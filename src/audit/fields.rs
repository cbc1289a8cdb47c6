//! An audit entry's fields as they are built: a short vector kept in the
//! entry's canonical (RFC 8785) key order.
//!
//! Every call's entries used to be built as `serde_json::Map`s. With
//! `preserve_order` on (Cedar turns it on for the whole build), such a map is
//! an `IndexMap` that hashes each key with SipHash on every insert and
//! lookup, and the writer then sorted the members again to canonicalize the
//! entry. An entry has about fifteen members: a sorted vector finds a key in
//! four comparisons, needs no hash and no sort, and its members are written
//! in order as they stand. Keys are mostly `'static` names, so they are
//! never copied.

use std::borrow::Cow;
use std::cmp::Ordering;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::core::canonical::{jcs_into, jcs_string};

/// A member's name.
pub type Key = Cow<'static, str>;

/// An audit entry's fields, in JCS key order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fields(Vec<(Key, Value)>);

/// RFC 8785's key order: UTF-16 code units. UTF-8's byte order is code
/// point order, which differs from UTF-16's only past U+FFFF; so where the
/// first differing bytes are both ASCII (every name an entry uses), they
/// decide, and only other keys are compared as UTF-16.
#[inline]
fn order(a: &str, b: &str) -> Ordering {
    let (x, y) = (a.as_bytes(), b.as_bytes());
    match x.iter().zip(y).position(|(p, q)| p != q) {
        None => x.len().cmp(&y.len()),
        Some(i) if x[i].is_ascii() && y[i].is_ascii() => x[i].cmp(&y[i]),
        Some(_) => a.encode_utf16().cmp(b.encode_utf16()),
    }
}

impl Fields {
    /// No fields.
    pub fn new() -> Fields {
        Fields(Vec::new())
    }

    /// No fields, room for `n`.
    pub fn with_capacity(n: usize) -> Fields {
        Fields(Vec::with_capacity(n))
    }

    fn find(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| order(k, key))
    }

    /// Set `key` to `value`; the value it had, if any.
    pub fn insert(&mut self, key: impl Into<Key>, value: Value) -> Option<Value> {
        let key = key.into();
        // Past the last key (fields are often set in order): no search.
        if self
            .0
            .last()
            .is_none_or(|(k, _)| order(k, &key) == Ordering::Less)
        {
            self.0.push((key, value));
            return None;
        }
        match self.find(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, value)),
            Err(i) => {
                self.0.insert(i, (key, value));
                None
            }
        }
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.find(key).ok().map(|i| &self.0[i].1)
    }

    /// Unset `key`; the value it had.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        self.find(key).ok().map(|i| self.0.remove(i).1)
    }

    /// The fields in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.0.iter().map(|(k, v)| (k.as_ref(), v))
    }

    /// Set every field of `base` that is not set here (the values here
    /// win): the fields every entry of a call carries, under the entry's
    /// own. One pass in key order; each member of `base` is moved once,
    /// into its place (no second vector).
    pub fn fill_from(&mut self, base: Fields) {
        self.0.reserve(base.0.len());
        let mut i = 0;
        for (k, v) in base.0 {
            while i < self.0.len() && order(&self.0[i].0, &k) == Ordering::Less {
                i += 1;
            }
            if i < self.0.len() && order(&self.0[i].0, &k) == Ordering::Equal {
                i += 1;
                continue;
            }
            self.0.insert(i, (k, v));
            i += 1;
        }
    }

    /// The entry's JCS appended to `out`, and the [`Slot`] where a member
    /// named `key` (absent here) goes: the writer hashes the text, then
    /// writes it with `hash` spliced in. The members are in order already:
    /// nothing is sorted here.
    pub fn jcs_into_at(&self, out: &mut Vec<u8>, key: &str) -> Slot {
        members_into_at(self.iter().map(|(k, v)| (k, Member::Value(v))), out, key)
    }

    /// [`Fields::jcs_into_at`] of these fields with `over` (in key order)
    /// set over them, and without a member named `key`: the audit writer's
    /// chain fields go in as the entry is written, not inserted first (nor
    /// made into values: they are written from the text and the number the
    /// writer holds).
    pub fn jcs_over_into_at<'a>(
        &'a self,
        over: impl Iterator<Item = (&'a str, Member<'a>)>,
        out: &mut Vec<u8>,
        key: &str,
    ) -> Slot {
        let mine = self.iter().map(|(k, v)| (k, Member::Value(v)));
        let merged = merge(mine, over);
        members_into_at(merged.filter(|(k, _)| *k != key), out, key)
    }
}

/// A member's value as the writer has it: a value, or a string or a count
/// it holds without making a value of it.
#[derive(Debug, Clone, Copy)]
pub enum Member<'a> {
    /// Any JSON value.
    Value(&'a Value),
    /// A string.
    Text(&'a str),
    /// A non-negative integer below 2^53 (a sequence number).
    Count(u64),
}

impl Member<'_> {
    fn jcs_into(self, out: &mut Vec<u8>) {
        match self {
            Member::Value(v) => jcs_into(v, out),
            Member::Text(t) => jcs_string(t, out),
            Member::Count(n) => jcs_into(&Value::from(n), out),
        }
    }
}

/// Where a member goes in an entry's JCS text (see [`Fields::jcs_into_at`]).
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
    /// Splice a member (`"key":value`, given in `parts` written one after
    /// the other) into `jcs` at the slot.
    pub fn splice(self, jcs: &[u8], parts: &[&[u8]], out: &mut Vec<u8>) {
        out.extend_from_slice(&jcs[..self.at]);
        if self.after_some {
            out.push(b',');
        }
        for part in parts {
            out.extend_from_slice(part);
        }
        if !self.after_some && self.before_some {
            out.push(b',');
        }
        out.extend_from_slice(&jcs[self.at..]);
    }
}

/// Two sequences of members in key order, merged into one in key order;
/// where both hold a key, `b`'s member is taken.
fn merge<K: AsRef<str>, V>(
    a: impl Iterator<Item = (K, V)>,
    b: impl Iterator<Item = (K, V)>,
) -> impl Iterator<Item = (K, V)> {
    let mut a = a.peekable();
    let mut b = b.peekable();
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) => match order(x.0.as_ref(), y.0.as_ref()) {
            Ordering::Less => a.next(),
            Ordering::Greater => b.next(),
            Ordering::Equal => {
                a.next();
                b.next()
            }
        },
        (Some(_), None) => a.next(),
        (None, _) => b.next(),
    })
}

/// A JCS object of `members` (in key order) appended to `out`, and the
/// [`Slot`] for a member named `key`, which they do not hold.
fn members_into_at<'a>(
    members: impl Iterator<Item = (&'a str, Member<'a>)>,
    out: &mut Vec<u8>,
    key: &str,
) -> Slot {
    let start = out.len();
    let mut at = None;
    let mut any = false;
    out.push(b'{');
    for (k, v) in members {
        if at.is_none() && order(k, key) != Ordering::Less {
            at = Some((out.len() - start, any));
        }
        if any {
            out.push(b',');
        }
        any = true;
        jcs_string(k, out);
        out.push(b':');
        v.jcs_into(out);
    }
    out.push(b'}');
    match at {
        // Just after the brace (first member), or at the comma before the
        // member it precedes.
        Some((pos, after_some)) => Slot {
            at: pos,
            after_some,
            before_some: true,
        },
        None => Slot {
            at: out.len() - 1 - start,
            after_some: any,
            before_some: false,
        },
    }
}

impl IntoIterator for Fields {
    type Item = (Key, Value);
    type IntoIter = std::vec::IntoIter<(Key, Value)>;

    /// The fields in key order.
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl From<Map<String, Value>> for Fields {
    fn from(map: Map<String, Value>) -> Fields {
        let mut v: Vec<(Key, Value)> = map.into_iter().map(|(k, v)| (Key::Owned(k), v)).collect();
        v.sort_by(|a, b| order(&a.0, &b.0));
        Fields(v)
    }
}

impl<const N: usize> From<[(&'static str, Value); N]> for Fields {
    fn from(members: [(&'static str, Value); N]) -> Fields {
        let mut f = Fields::with_capacity(N);
        for (k, v) in members {
            f.insert(k, v);
        }
        f
    }
}

impl std::ops::Index<&str> for Fields {
    type Output = Value;

    /// The value of `key`, `null` when it is unset (as a JSON map indexes).
    fn index(&self, key: &str) -> &Value {
        static NULL: Value = Value::Null;
        self.get(key).unwrap_or(&NULL)
    }
}

impl Serialize for Fields {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k.as_ref(), v)))
    }
}

impl<'de> Deserialize<'de> for Fields {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Fields, D::Error> {
        Map::<String, Value>::deserialize(d).map(Fields::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!("an object"),
        }
    }

    /// `text` (an object's JCS without `key`) with `"key":"x"` spliced in
    /// at `slot`.
    fn spliced(text: &[u8], slot: Slot, key: &str) -> String {
        let mut line = Vec::new();
        slot.splice(text, &[format!(r#""{key}":"x""#).as_bytes()], &mut line);
        String::from_utf8(line).unwrap()
    }

    /// The JCS of `m` with `key` set to "x".
    fn with_key(m: &Map<String, Value>, key: &str) -> String {
        let mut whole = m.clone();
        whole.insert(key.into(), json!("x"));
        crate::core::canonical::jcs(&Value::Object(whole))
    }

    #[test]
    fn fields_write_the_same_jcs_as_the_map_they_hold() {
        let m = map(json!({
            "seq": 7, "kind": "completed", "arguments": {"b": 1, "a": [true, null]},
            "\u{e000}x": "private use", "\u{1f600}": "astral", "time": "2026-12-07T00:00:00Z",
            "a\"b": "quote",
        }));
        let f = Fields::from(m.clone());
        for key in ["hash", "a", "zzz", "\u{1f601}", "\u{ffff}"] {
            let mut got = Vec::new();
            let slot = f.jcs_into_at(&mut got, key);
            assert_eq!(
                String::from_utf8(got.clone()).unwrap(),
                crate::core::canonical::jcs(&Value::Object(m.clone()))
            );
            assert_eq!(
                spliced(&got, slot, key),
                with_key(&m, key),
                "slot for {key:?}"
            );
        }
    }

    #[test]
    fn a_member_spliced_at_its_slot_is_the_jcs_of_the_whole_object() {
        for keys in [
            vec![],
            vec!["a"],
            vec!["z"],
            vec!["a", "z"],
            vec!["gateway", "idempotency_key", "kind", "prev"],
            vec!["arguments", "call_digest"],
        ] {
            let mut m = Map::new();
            for (i, k) in keys.iter().enumerate() {
                m.insert((*k).to_owned(), json!({"n": i, "hash": "inner"}));
            }
            let mut text = Vec::new();
            let slot = Fields::from(m.clone()).jcs_into_at(&mut text, "hash");
            assert_eq!(
                spliced(&text, slot, "hash"),
                with_key(&m, "hash"),
                "{keys:?}"
            );
            assert_eq!(
                text,
                crate::core::canonical::jcs(&Value::Object(m)).into_bytes()
            );
        }
    }

    #[test]
    fn members_set_over_the_fields_replace_theirs_and_the_slot_key_is_left_out() {
        let f = Fields::from(map(
            json!({"seq": "forged", "hash": "forged", "a": 1, "time": "t"}),
        ));
        let a = json!(2);
        let over = [
            ("a", Member::Value(&a)),
            ("prev", Member::Text("p")),
            ("seq", Member::Count(9)),
        ];
        let mut out = Vec::new();
        let slot = f.jcs_over_into_at(over.into_iter(), &mut out, "hash");
        let want = map(json!({"seq": 9, "a": 2, "time": "t", "prev": "p"}));
        assert_eq!(
            String::from_utf8(out.clone()).unwrap(),
            crate::core::canonical::jcs(&Value::Object(want.clone()))
        );
        assert_eq!(spliced(&out, slot, "hash"), with_key(&want, "hash"));
    }

    #[test]
    fn the_order_is_utf16s_where_it_differs_from_the_bytes() {
        // U+FF61 is one UTF-16 unit (0xFF61), U+1F600 two (0xD83D...): in
        // UTF-16 the astral one comes first, in UTF-8 bytes last.
        assert_eq!(order("\u{1f600}", "\u{ff61}"), Ordering::Less);
        assert_eq!(order("ab", "abc"), Ordering::Less);
        assert_eq!(order("b", "a\u{ff61}"), Ordering::Greater);
        assert_eq!(order("same", "same"), Ordering::Equal);
    }

    #[test]
    fn an_empty_entry_takes_its_one_member_between_the_braces() {
        let mut out = Vec::new();
        let slot = Fields::new().jcs_into_at(&mut out, "hash");
        let mut line = Vec::new();
        slot.splice(&out, &[br#""hash":"#, br#""x""#], &mut line);
        assert_eq!(line, br#"{"hash":"x"}"#);
    }

    #[test]
    fn inserts_keep_the_order_and_replace_a_value() {
        let mut f = Fields::new();
        assert_eq!(f.insert("time", json!(1)), None);
        f.insert("kind", json!("a"));
        f.insert(String::from("seq"), json!(2));
        assert_eq!(f.insert("time", json!(3)), Some(json!(1)));
        let keys: Vec<&str> = f.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["kind", "seq", "time"]);
        assert_eq!(f["time"], json!(3));
        assert_eq!(f["nothing"], Value::Null);
        assert_eq!(f.remove("kind"), Some(json!("a")));
        assert!(f.get("kind").is_none() && f.iter().count() == 2);
        let mut g = f;
        g.fill_from(Fields::from([("a", json!(0)), ("time", json!(4))]));
        assert_eq!(
            serde_json::to_value(&g).unwrap(),
            json!({"a": 0, "seq": 2, "time": 3})
        );
    }

    #[test]
    fn filling_from_a_base_keeps_the_order_and_the_own_values() {
        let own = json!({"a": 2, "d": 2, "g": 2, "i": 2, "j": 2, "\u{ff61}": 2});
        let base = json!({"b": 1, "d": 1, "f": 1, "h": 1, "k": 1, "\u{1f600}": 1});
        let mut f = Fields::from(map(own.clone()));
        f.fill_from(Fields::from(map(base.clone())));
        let mut want = map(base);
        for (k, v) in map(own) {
            want.insert(k, v);
        }
        assert_eq!(f, Fields::from(want));
        let keys: Vec<&str> = f.iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "a",
                "b",
                "d",
                "f",
                "g",
                "h",
                "i",
                "j",
                "k",
                "\u{1f600}",
                "\u{ff61}"
            ]
        );
        assert_eq!(f["d"], json!(2));
        let mut empty = Fields::new();
        empty.fill_from(Fields::from([("x", json!(1))]));
        assert_eq!(empty["x"], json!(1));
        let mut unchanged = Fields::from([("x", json!(1))]);
        unchanged.fill_from(Fields::new());
        assert_eq!(unchanged, Fields::from([("x", json!(1))]));
    }

    #[test]
    fn fields_round_trip_through_json_in_order() {
        let f = Fields::from(map(json!({"z": 1, "a": {"y": 2, "x": 3}})));
        let text = serde_json::to_string(&f).unwrap();
        assert_eq!(text, r#"{"a":{"y":2,"x":3},"z":1}"#);
        let back: Fields = serde_json::from_str(&text).unwrap();
        assert_eq!(back, f);
    }
}
