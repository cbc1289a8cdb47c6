//! What a correctly rounded number parse costs on the read path: the strict
//! parse and canonical form of a `tools/call`'s params (`canonicalize`,
//! every call pays it) with the arguments of an ordinary read, with six
//! prices printed to 17 significant digits, and with 200 of them; and a
//! stored answer of 200 such numbers parsed as a `Value`.
//!
//! serde_json's default float parser is fast and not correctly rounded:
//! `1944.4099999999999` becomes the double of `1944.41`. Its
//! `float_roundtrip` feature is correctly rounded. Run this once with the
//! feature and once without (comment it out in Cargo.toml) to see what it
//! costs:
//!
//! ```text
//! taskset -c 0 cargo bench --bench float_parse
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::time_per_call;
use countersign::core::canonical::{canonicalize, Limits};

fn main() {
    let limits = Limits {
        max_depth: 64,
        max_arguments_bytes: 1 << 20,
    };
    let read = r#"{"name":"get_balance","arguments":{"account":"acct_42","currency":"EUR"}}"#;
    // Sums in binary floating point: most need 16 or 17 digits to name
    // their double (`1944.7800000000002`), as an agent's arithmetic does.
    let prices: Vec<String> = (0..200)
        .map(|i| format!("{}", 1944.41 + f64::from(i) * 0.37))
        .collect();
    let six = format!(
        r#"{{"name":"quote","arguments":{{"account":"acct_42","prices":[{}]}}}}"#,
        prices[..6].join(",")
    );
    let many = format!(
        r#"{{"name":"quote","arguments":{{"account":"acct_42","prices":[{}]}}}}"#,
        prices.join(",")
    );
    let answer = format!(
        r#"{{"content":[],"structuredContent":{{"prices":[{}]}}}}"#,
        prices.join(",")
    );
    // The numbers must survive, or the figures measure the wrong parser.
    let c = canonicalize("payments", &many, limits).unwrap();
    let changed = prices
        .iter()
        .zip(c.arguments["prices"].as_array().unwrap())
        .filter(|(sent, kept)| sent.parse::<f64>().ok() != kept.as_f64())
        .count();
    println!(
        "prices that changed on the way: {changed} of {}",
        prices.len()
    );
    time_per_call("canonicalize, a read without numbers", 200_000, || {
        canonicalize("payments", read, limits).unwrap();
    });
    time_per_call("canonicalize, 6 prices of 17 digits", 100_000, || {
        canonicalize("payments", &six, limits).unwrap();
    });
    time_per_call("canonicalize, 200 prices of 17 digits", 5_000, || {
        canonicalize("payments", &many, limits).unwrap();
    });
    time_per_call("an answer of 200 prices as a Value", 5_000, || {
        let _: serde_json::Value = serde_json::from_str(&answer).unwrap();
    });
}
