//! A JWKS document as an identity provider (or whoever answers for it)
//! serves it: never a panic, and a set that loads has only keys with an id.
#![no_main]

use countersign::core::token::Keys;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok((keys, _notes)) = Keys::from_jwks(text) {
        assert_eq!(keys.kids().count(), keys.len());
        for kid in keys.kids() {
            assert!(keys.has(kid));
        }
    }
});
