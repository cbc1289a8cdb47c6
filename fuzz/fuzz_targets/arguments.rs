//! The Cedar argument mapping: never a panic, typed by the shipped schema
//! and untyped.
#![no_main]

use countersign::core::arguments::{declared, map_value, typed_value};
use libfuzzer_sys::fuzz_target;

const SCHEMA: &str = include_str!("../../policies/schema.cedarschema");

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let _ = map_value(&v, "");
    if let Ok(Some(ty)) = declared(SCHEMA, "call") {
        let _ = typed_value(&v, &ty, "");
    }
});
