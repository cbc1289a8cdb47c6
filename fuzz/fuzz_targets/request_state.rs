//! A client's `requestState` and its elicitation answer (attacker input in
//! 2026-07-28): never a panic; nothing verifies that the gateway's key did
//! not sign, and only an explicit `approve: true` reads as a yes.
#![no_main]

use countersign::core::confirm::{open, read_answer, Answer};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(opened) = open(text) {
        let key = ed25519_dalek::SigningKey::from_bytes(&[1; 32]).verifying_key();
        assert!(opened.verify([&key]).is_err());
    }
    if let Ok(value) = serde_json::from_str::<serde_json::Value>(text) {
        if let Ok(Answer::Approve { .. }) = read_answer(&value) {
            assert_eq!(value["action"], "accept");
            assert_eq!(value["content"]["approve"], true);
        }
    }
});
