//! Audit line verification: never a panic; a forged or broken line is a
//! `Break`, whatever its bytes.
#![no_main]

use countersign::audit::Verifier;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut v = Verifier::new(None, None);
    for (n, line) in data.split(|b| *b == b'\n').enumerate() {
        if v.feed(line, &n).is_err() {
            return;
        }
    }
});
