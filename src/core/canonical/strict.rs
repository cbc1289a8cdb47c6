//! The strict parse a `tools/call`'s arguments pass before anything else
//! reads them: duplicate keys, lone surrogates, numbers a double cannot
//! hold and nesting past the limit are refused (the module documentation
//! of [`super`] says what each rule protects against), in one pass over the
//! text that also counts the depth.

use std::borrow::Cow;
use std::collections::HashSet;

use super::jcs::jcs_number;
use super::CanonicalError;

/// Walk the JSON text and enforce what `serde_json` lets through:
/// duplicate keys, lone surrogates, inexact numbers and depth. Returns the
/// size in bytes of `arguments` as sent (0 when absent).
pub(super) fn check_strict(text: &str, max_depth: usize) -> Result<usize, CanonicalError> {
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

/// One step of the path to where the walk is.
enum Seg<'a> {
    Key(Cow<'a, str>),
    Index(usize),
}

struct Strict<'a> {
    b: &'a [u8],
    i: usize,
    max_depth: usize,
    /// Where the walk is, for an error's pointer.
    path: Vec<Seg<'a>>,
    arguments_len: usize,
    /// Numbers must name a double exactly (a call's arguments).
    exact_numbers: bool,
}

impl<'a> Strict<'a> {
    fn pointer(&self) -> String {
        if self.path.is_empty() {
            return "/".into();
        }
        self.path
            .iter()
            .map(|p| match p {
                Seg::Key(k) => format!("/{}", super::pointer_token(k)),
                Seg::Index(i) => format!("/{i}"),
            })
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
            Some(b'"') => self.scan_string(None),
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
        let mut keys = Keys::Few(Vec::new());
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
            let key = self.key()?;
            if !keys.insert(key.clone()) {
                return Err(CanonicalError::DuplicateKey {
                    path: self.pointer(),
                    key: key.into_owned(),
                });
            }
            self.ws();
            if self.peek() != Some(b':') {
                return Err(self.invalid("expected `:`"));
            }
            self.i += 1;
            let top_arguments = depth == 0 && key == "arguments";
            self.path.push(Seg::Key(key));
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
            self.path.push(Seg::Index(index));
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

    /// Decode a key, refusing unpaired surrogate escapes: the text itself
    /// when it has no escape (most keys: nothing is copied), else decoded.
    fn key(&mut self) -> Result<Cow<'a, str>, CanonicalError> {
        let open = self.i;
        self.scan_string(None)?;
        let b: &'a [u8] = self.b;
        let raw = &b[open + 1..self.i - 1];
        if !raw.contains(&b'\\') {
            // Cut at quotes (ASCII) out of a `&str`: UTF-8 still.
            return std::str::from_utf8(raw)
                .map(Cow::Borrowed)
                .map_err(|_| self.invalid("invalid UTF-8"));
        }
        let end = self.i;
        self.i = open;
        let mut out = String::new();
        self.scan_string(Some(&mut out))?;
        debug_assert_eq!(self.i, end);
        Ok(Cow::Owned(out))
    }

    /// Check a string, refusing unpaired surrogate escapes, and decode it
    /// into `out` when one is given (a key; a value is only checked).
    fn scan_string(&mut self, mut out: Option<&mut String>) -> Result<(), CanonicalError> {
        self.i += 1; // opening quote
        let start = self.i;
        let mut plain_from = start;
        while let Some(c) = self.peek() {
            match c {
                b'"' => {
                    if let Some(out) = out.as_deref_mut() {
                        out.push_str(self.slice(plain_from, self.i)?);
                    }
                    self.i += 1;
                    return Ok(());
                }
                b'\\' => {
                    if let Some(out) = out.as_deref_mut() {
                        out.push_str(self.slice(plain_from, self.i)?);
                    }
                    self.i += 1;
                    let esc = self
                        .peek()
                        .ok_or_else(|| self.invalid("unterminated escape"))?;
                    self.i += 1;
                    let ch = match esc {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode_escape()?,
                        _ => return Err(self.invalid("invalid escape")),
                    };
                    if let Some(out) = out.as_deref_mut() {
                        out.push(ch);
                    }
                    plain_from = self.i;
                }
                _ => self.i += 1,
            }
        }
        Err(self.invalid("unterminated string"))
    }

    /// The character of a `\u` escape (the `\u` read), a surrogate pair
    /// as one; a lone surrogate is refused.
    fn unicode_escape(&mut self) -> Result<char, CanonicalError> {
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
        char::from_u32(ch).ok_or_else(|| self.invalid("invalid escape"))
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
        // An integer of at most 15 digits is a double exactly (below 2^53):
        // the common amount or count needs no trip through a double.
        let digits = &self.b[start..self.i];
        let digits = digits.strip_prefix(b"-").unwrap_or(digits);
        if !digits.is_empty() && digits.len() <= 15 && digits.iter().all(u8::is_ascii_digit) {
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
pub(super) fn check_number(literal: &str) -> Result<(), String> {
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
pub(super) fn decimal(text: &str) -> Option<(bool, String, i64)> {
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

/// An object's keys so far, to find a duplicate: a short list compared in
/// turn (a call's objects have a handful of members, and hashing each key
/// cost more than comparing it), a hash set once the object is long (so a
/// long object is not compared pairwise).
enum Keys<'a> {
    Few(Vec<Cow<'a, str>>),
    Many(HashSet<Cow<'a, str>>),
}

impl<'a> Keys<'a> {
    /// The list's length past which the keys go into a hash set.
    const FEW: usize = 16;

    /// Add `key`; false when the object had it already.
    fn insert(&mut self, key: Cow<'a, str>) -> bool {
        match self {
            Keys::Few(list) if list.contains(&key) => false,
            Keys::Few(list) if list.len() < Keys::FEW => {
                list.push(key);
                true
            }
            Keys::Few(list) => {
                let mut set: HashSet<Cow<'a, str>> = list.drain(..).collect();
                set.insert(key);
                *self = Keys::Many(set);
                true
            }
            Keys::Many(set) => set.insert(key),
        }
    }
}
