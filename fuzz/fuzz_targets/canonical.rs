//! The strict `params` parser and the canonical form: never a panic; an
//! accepted call's JCS equals serde_jcs's (a differential against an
//! implementation nobody here wrote), and canonicalizing the canonical
//! form again gives the same digest.
#![no_main]

use countersign::core::canonical::{canonicalize, jcs, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let limits = Limits {
        max_depth: 64,
        max_arguments_bytes: 1 << 16,
    };
    let Ok(call) = canonicalize("fuzz", text, limits) else {
        return;
    };
    let ours = jcs(&call.arguments);
    let theirs = serde_jcs::to_string(&call.arguments).expect("serde_jcs serializes what we accepted");
    assert_eq!(ours, theirs, "JCS differs from serde_jcs");
    assert_eq!(ours, call.arguments_jcs, "the call's JCS text is not the JCS of its arguments");
    let again = format!(r#"{{"name":{},"arguments":{}}}"#, serde_json::Value::String(call.tool.clone()), call.arguments_jcs);
    let second = canonicalize("fuzz", &again, limits).expect("the canonical form is accepted again");
    assert_eq!(call.digest, second.digest, "canonicalization is not idempotent");
});
