//! Every `tools/call` goes through the strict parse and is forwarded as its
//! canonical (RFC 8785) form: what the gateway hashes is byte-for-byte what
//! the server receives, and malformed arguments never reach the server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use serde_json::{json, Value};

#[tokio::test]
async fn arguments_reach_the_server_as_jcs_bytes_without_reserved_inputs() {
    let gw = Gateway::with_http_upstream();
    for server in ["payments", "phttp"] {
        let mut c = Client::new(&gw.url(server));
        c.initialize().await;
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"charge_card",
            "arguments":{{"z":1E30,"amount":4.50,"account":"acct_1","_idempotency_key":"key-1"}},
            "_meta":{{"dev.countersign/idempotency-key":"key-{server}","progressToken":"p-1"}}}}}}"#
        );
        let a = c.post_raw(body).await;
        assert_eq!(a.last()["result"]["isError"], false, "{server}: {a:?}");
    }
    let records: Vec<Value> = gw
        .records()
        .into_iter()
        .filter(|r| r["event"] == "executed")
        .collect();
    assert_eq!(records.len(), 2);
    for r in records {
        assert_eq!(
            r["raw_arguments"], r#"{"account":"acct_1","amount":4.5,"z":1e+30}"#,
            "{r}"
        );
        assert_eq!(
            r["raw_meta"], r#"{"progressToken":"p-1"}"#,
            "reserved _meta keys are stripped: {r}"
        );
    }
}

#[tokio::test]
async fn malformed_arguments_are_refused_before_dispatch() {
    let gw = Gateway::start();
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    let deep = format!("{}1{}", "[".repeat(70), "]".repeat(70));
    let big = format!("\"{}\"", "x".repeat(40_000));
    let cases: Vec<(String, &str)> = vec![
        (
            r#"{"account":"a","amount":1,"amount":1000}"#.into(),
            "duplicate key `amount`",
        ),
        (
            r#"{"account":"a","amount":9007199254740993}"#.into(),
            "cannot be represented exactly",
        ),
        (
            r#"{"account":"\ud800","amount":1}"#.into(),
            "lone surrogate",
        ),
        (
            format!(r#"{{"account":"a","amount":1,"n":{deep}}}"#),
            "deeper than limits.max_depth (64)",
        ),
        (
            format!(r#"{{"account":{big},"amount":1}}"#),
            "more than limits.max_arguments_bytes (32768)",
        ),
        (r#"[1,2]"#.into(), "params.arguments"),
    ];
    for (i, (args, expect)) in cases.iter().enumerate() {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"charge_card","arguments":{args}}}}}"#
        );
        let a = c.post_raw(body).await;
        assert_eq!(a.status, 200, "{expect}: {a:?}");
        assert_eq!(a.last()["id"], i, "{expect}");
        assert_eq!(a.last()["error"]["code"], -32602, "{expect}: {a:?}");
        let message = a.last()["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(expect),
            "expected `{expect}` in `{message}`"
        );
    }
    assert_eq!(
        gw.executions("charge_card"),
        0,
        "nothing malformed may reach the server"
    );
    // The session is still good.
    let ok = c
        .call(99, "charge_card", json!({"account":"a","amount":1}))
        .await;
    assert_eq!(ok.last()["result"]["isError"], false);
}

#[tokio::test]
async fn modern_calls_are_canonicalized_too() {
    let gw = Gateway::start();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"refund","arguments":{"charge":"ch_1","amount":1.0},
        "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
    let body: Value = serde_json::from_str(body).unwrap();
    let resp = modern_post(&gw.url("payments"), &body)
        .send()
        .await
        .unwrap();
    let a = answer(resp).await;
    assert_eq!(a.last()["result"]["isError"], false, "{a:?}");
    let r = gw
        .records()
        .into_iter()
        .find(|r| r["event"] == "executed")
        .unwrap();
    assert_eq!(r["raw_arguments"], r#"{"amount":1,"charge":"ch_1"}"#);
}

/// At least 100,000 numbers that trouble a number parser or printer: random
/// doubles printed with 17 significant digits, the same in shortest form,
/// subnormals, powers of ten and their neighbours near the edges of the
/// exponent range and near ECMAScript's switches to exponent form, integers
/// around 2^53, and negative zero.
fn troublesome_numbers() -> Vec<String> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(8785);
    let mut out = Vec::new();
    let finite = |rng: &mut rand::rngs::StdRng| loop {
        let d = f64::from_bits(rng.random::<u64>());
        if d.is_finite() {
            return d;
        }
    };
    for _ in 0..40_000 {
        out.push(format!("{:.16e}", finite(&mut rng)));
    }
    for _ in 0..30_000 {
        out.push(format!("{}", finite(&mut rng)));
    }
    // Everyday magnitudes: sums and products an agent's arithmetic makes.
    for _ in 0..15_000 {
        let d = rng.random_range(-1e7..1e7) * rng.random_range(0.01..1.0);
        out.push(format!("{d}"));
        out.push(format!("{d:.16e}"));
    }
    for _ in 0..5_000 {
        let sub = f64::from_bits(rng.random_range(1..(1u64 << 52)));
        out.push(format!("{sub:.16e}"));
        out.push(format!("{sub:e}"));
    }
    for s in [
        "5e-324",
        "2.2250738585072009e-308",
        "2.2250738585072014e-308",
        "1.7976931348623157e308",
    ] {
        out.push(s.to_owned());
    }
    for k in -323..=308 {
        let p: f64 = format!("1e{k}").parse().unwrap();
        for d in [p, p.next_up(), p.next_down()] {
            if d.is_finite() && d > 0.0 {
                out.push(format!("{d:.16e}"));
                out.push(format!("{d:e}"));
            }
        }
    }
    // ECMAScript writes 1e21 and up, and below 1e-6, with an exponent.
    for base in [1e21, 1e-6, 1e-7, 1e20] {
        for i in 0..200u64 {
            let up = f64::from_bits(f64::to_bits(base) + i);
            let down = f64::from_bits(f64::to_bits(base) - i);
            out.push(format!("{up:.16e}"));
            out.push(format!("{down:.16e}"));
        }
    }
    let two53 = 1u64 << 53;
    for i in 0..2_000u64 {
        out.push((two53 - 1000 + i).to_string());
    }
    for s in [
        "-0",
        "-0.0",
        "0",
        "0.0",
        "-0e10",
        "1944.4099999999999",
        "1825.4299999999998",
    ] {
        out.push(s.to_owned());
    }
    let negatives: Vec<String> = out
        .iter()
        .step_by(7)
        .filter(|s| !s.starts_with('-'))
        .map(|s| format!("-{s}"))
        .collect();
    out.extend(negatives);
    out
}

#[test]
fn the_canonical_form_of_every_number_matches_an_independent_rfc_8785_implementation() {
    let numbers = troublesome_numbers();
    assert!(numbers.len() >= 100_000, "{}", numbers.len());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("numbers.json");
    std::fs::write(&file, format!("[{}]", numbers.join(","))).unwrap();
    let jcs_dir = peers_cache().join("jcs");
    let out = std::process::Command::new("node")
        .current_dir(&jcs_dir)
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/peers/jcs_numbers.mjs"))
        .arg(&file)
        .output()
        .expect("node: `.ci/setup-peers` installs npm's canonicalize under .ci/cache/jcs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(theirs.len(), numbers.len());
    let parsed: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let mut differ = Vec::new();
    for ((sent, value), their) in numbers.iter().zip(&parsed).zip(&theirs) {
        let ours = countersign::core::canonical::jcs(value);
        if &ours != their {
            differ.push(format!("{sent}: ours {ours}, theirs {their}"));
            continue;
        }
        // The number the text names is the double parsed (correctly
        // rounded); its canonical text names that double again, and is its
        // own canonical text.
        let named: f64 = sent.parse().unwrap();
        let again: f64 = ours.parse().unwrap();
        assert!(
            again == named && (named != 0.0 || ours == "0"),
            "{sent} -> {ours} names another double"
        );
        let reparsed: Value = serde_json::from_str(&ours).unwrap();
        assert_eq!(countersign::core::canonical::jcs(&reparsed), ours, "{sent}");
    }
    assert!(
        differ.is_empty(),
        "{} of {} differ, first: {:?}",
        differ.len(),
        numbers.len(),
        &differ[..differ.len().min(10)]
    );
}

#[test]
fn a_canonical_number_passes_the_strict_parse_unchanged() {
    // What an agent sends in shortest form reaches the server as it is.
    for sent in [
        "1944.4099999999999",
        "1825.4299999999998",
        "5e-324",
        "1e+21",
        "9007199254740992",
    ] {
        let params = format!(r#"{{"name":"t","arguments":{{"n":{sent}}}}}"#);
        let c = countersign::core::canonical::canonicalize("s", &params, Default::default())
            .unwrap_or_else(|e| panic!("{sent}: {e}"));
        assert_eq!(c.arguments_jcs, format!(r#"{{"n":{sent}}}"#), "{sent}");
    }
}
