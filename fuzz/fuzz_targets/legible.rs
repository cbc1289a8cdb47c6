//! Agent text shown to people: whatever the string, nothing a terminal,
//! chat or browser would obey instead of showing comes out, and the JSON
//! rendering still names the same value.
#![no_main]

use countersign::core::legible::{json, key, text, visible};
use libfuzzer_sys::fuzz_target;

/// What must never reach a reader raw: controls (C0, C1, DEL), bidi
/// embeddings, overrides and isolates, zero-width and word joiners, the
/// byte order mark, line and paragraph separators, tags.
fn obeyed(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{2069}'
            | '\u{feff}'
            | '\u{e0000}'..='\u{e007f}')
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    for out in [text(s), visible(s), key(s)] {
        assert!(!out.chars().any(obeyed), "{s:?} came out as {out:?}");
    }
    let v = serde_json::Value::from(s);
    let shown = json(&v);
    assert!(!shown.chars().any(obeyed), "{s:?} came out as {shown:?}");
    let back: serde_json::Value = serde_json::from_str(&shown).expect("still JSON");
    assert_eq!(back, v);
});
