//! The TOML configuration: never a panic; every refusal is an error value.
#![no_main]

use countersign::core::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Config::parse(text, std::path::Path::new("fuzz.toml"));
    }
});
