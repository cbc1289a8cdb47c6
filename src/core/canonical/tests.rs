use super::*;
use sha2::{Digest, Sha256};

#[test]
fn sha256_text_is_the_prefixed_lower_hex() {
    let d: [u8; 32] = Sha256::digest(b"abc").into();
    assert_eq!(sha256_text(&d), format!("sha256:{}", hex::encode(d)));
}

#[test]
fn pointer_tokens_escape_tilde_before_slash() {
    assert_eq!(pointer_token("plain"), "plain");
    assert!(matches!(
        pointer_token("plain"),
        std::borrow::Cow::Borrowed(_)
    ));
    // `~` first, or the `~1` made of a `/` would read back as `~` + `1`.
    assert_eq!(pointer_token("a/b~c~1"), "a~1b~0c~01");
    assert_eq!(pointer_token(""), "");
}

#[test]
fn strings_with_and_without_escapes_write_as_json_stringify() {
    for (s, want) in [
        ("plain", r#""plain""#),
        ("a\"b", r#""a\"b""#),
        ("back\\slash", r#""back\\slash""#),
        ("tab\tend", r#""tab\tend""#),
        ("\u{1}", r#""\u0001""#),
        ("é ✓", "\"é ✓\""),
    ] {
        let mut out = Vec::new();
        jcs_string(s, &mut out);
        assert_eq!(String::from_utf8(out).unwrap(), want, "{s:?}");
    }
}
use serde_json::json;

fn any_json() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        // Integers about 2^53, where the exact ones stop.
        (-(1i64 << 54)..(1i64 << 54)).prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        // Any string: control characters, quotes, astral planes.
        any::<String>().prop_map(Value::String),
        "[\\u{0}-\\u{7f}]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec((any::<String>(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

proptest::proptest! {
    /// The fast JCS writer is byte-for-byte serde_jcs on any value.
    #[test]
    fn jcs_matches_serde_jcs(v in any_json()) {
        proptest::prop_assert_eq!(jcs(&v), serde_jcs::to_string(&v).unwrap());
    }
}

#[test]
fn integers_at_the_edge_of_exact_write_as_their_double() {
    let edge = 1i64 << 53;
    for n in [
        0,
        1,
        -1,
        edge - 1,
        edge,
        edge + 1,
        -edge,
        -edge - 1,
        i64::MIN,
    ] {
        let v = json!(n);
        assert_eq!(jcs(&v), serde_jcs::to_string(&v).unwrap(), "{n}");
    }
    for n in [edge as u64 + 1, u64::MAX] {
        let v = json!(n);
        assert_eq!(jcs(&v), serde_jcs::to_string(&v).unwrap(), "{n}");
    }
    // Past 2^53 the double's digits, not the integer's.
    assert_eq!(jcs(&json!(edge + 1)), "9007199254740992");
}

fn canon(params: &str) -> Result<CanonicalCall, CanonicalError> {
    canonicalize("payments", params, Limits::default())
}

/// RFC 8785 appendix B: IEEE-754 values and their canonical text.
#[test]
fn rfc8785_number_vectors() {
    let vectors: &[(u64, &str)] = &[
        (0x0000000000000000, "0"),
        (0x8000000000000000, "0"),
        (0x0000000000000001, "5e-324"),
        (0x8000000000000001, "-5e-324"),
        (0x7fefffffffffffff, "1.7976931348623157e+308"),
        (0xffefffffffffffff, "-1.7976931348623157e+308"),
        (0x4340000000000000, "9007199254740992"),
        (0xc340000000000000, "-9007199254740992"),
        (0x4430000000000000, "295147905179352830000"),
        (0x44b52d02c7e14af5, "9.999999999999997e+22"),
        (0x44b52d02c7e14af6, "1e+23"),
        (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
        (0x444b1ae4d6e2ef4e, "999999999999999700000"),
        (0x444b1ae4d6e2ef4f, "999999999999999900000"),
        (0x444b1ae4d6e2ef50, "1e+21"),
        (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
        (0x3eb0c6f7a0b5ed8d, "0.000001"),
        (0x41b3de4355555553, "333333333.3333332"),
        (0x41b3de4355555554, "333333333.33333325"),
        (0x41b3de4355555555, "333333333.3333333"),
        (0x41b3de4355555556, "333333333.3333334"),
        (0x41b3de4355555557, "333333333.33333343"),
        (0xbecbf647612f3696, "-0.0000033333333333333333"),
        (0x43143ff3c1cb0959, "1424953923781206.2"),
    ];
    for (bits, expected) in vectors {
        let v = json!(f64::from_bits(*bits));
        assert_eq!(jcs(&v), *expected, "bits {bits:#018x}");
    }
}

/// RFC 8785 section 3.2.2: the worked example (values, escapes, literals).
#[test]
fn rfc8785_example_object() {
    let input = r#"{
            "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
            "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
            "literals": [null, true, false]
        }"#;
    let v: Value = serde_json::from_str(input).unwrap();
    assert_eq!(
        jcs(&v),
        r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
    );
}

/// RFC 8785 section 3.2.3: keys sorted by UTF-16 code units (the emoji,
/// a surrogate pair starting 0xD83D, sorts before U+FB33).
#[test]
fn rfc8785_utf16_key_order() {
    let input = r#"{
            "\u20ac": "Euro Sign",
            "\r": "Carriage Return",
            "\ufb33": "Hebrew Letter Dalet With Dagesh",
            "1": "One",
            "\ud83d\ude00": "Emoji: Grinning Face",
            "\u0080": "Control\u007f",
            "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
    let v: Value = serde_json::from_str(input).unwrap();
    assert_eq!(
            jcs(&v),
            "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\u{7f}\",\"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\"😀\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}"
        );
}

#[test]
fn string_escapes_follow_ecmascript() {
    let v = json!({"s": "\u{0}\u{8}\u{9}\u{a}\u{c}\u{d}\u{1f}\"\\/\u{7f}é"});
    assert_eq!(
        jcs(&v),
        "{\"s\":\"\\u0000\\b\\t\\n\\f\\r\\u001f\\\"\\\\/\u{7f}é\"}"
    );
}

#[test]
fn digest_is_over_server_tool_and_jcs_arguments() {
    let a = canon(r#"{"name":"charge_card","arguments":{"b":1,"a":4.50}}"#).unwrap();
    let b = canon(r#"{"arguments":{"a":4.5,"b":1e0},"name":"charge_card"}"#).unwrap();
    assert_eq!(
        a.digest, b.digest,
        "spelling and order do not change the digest"
    );
    assert_eq!(a.arguments_jcs, r#"{"a":4.5,"b":1}"#);
    let expected = format!(
        "sha256:{}",
        hex::encode(Sha256::digest(
            br#"{"arguments":{"a":4.5,"b":1},"server":"payments","tool":"charge_card"}"#
        ))
    );
    assert_eq!(a.digest, expected);
    let other_server = canonicalize(
        "other",
        r#"{"name":"charge_card","arguments":{"a":4.5,"b":1}}"#,
        Limits::default(),
    )
    .unwrap();
    assert_ne!(a.digest, other_server.digest);
    let no_args = canon(r#"{"name":"ping_tool"}"#).unwrap();
    // JSON escapes: NUL, a newline that would forge a log line, ESC, a
    // right-to-left override.
    for bad in [
        r"x\u0000y",
        r"x\n2026-01-01T00:00:00Z WARN forged",
        r"x\u001b[31m",
        r"a\u202eb",
    ] {
        let e = canon(&format!(r#"{{"name":"{bad}"}}"#)).unwrap_err();
        assert!(matches!(e, CanonicalError::ToolName { .. }), "{bad}: {e}");
        assert!(
            !e.to_string().contains('\n'),
            "the message escapes the name: {e}"
        );
    }
    let long = "t".repeat(129);
    assert!(canon(&format!(r#"{{"name":"{long}"}}"#)).is_err());
    for good in [
        "t",
        "billing/charge",
        "get-balance.v2",
        "wetter_für_berlin",
        &"t".repeat(128),
    ] {
        assert!(canon(&format!(r#"{{"name":"{good}"}}"#)).is_ok(), "{good}");
    }
    assert_eq!(no_args.arguments_jcs, "{}");
}

proptest::proptest! {
    /// The assembled digest equals the digest of the whole object's JCS.
    #[test]
    fn assembled_digest_matches_full_jcs(v in arb_json(), server in "\\PC{0,8}", tool in "\\PC{1,8}") {
        let args = serde_json::json!({"v": v});
        let full = serde_json::json!({"server": server, "tool": tool, "arguments": args});
        let expected = format!("sha256:{}", hex::encode(Sha256::digest(jcs(&full).as_bytes())));
        proptest::prop_assert_eq!(call_digest(&server, &tool, &args), expected);
    }
}

#[test]
fn reserved_inputs_are_read_and_stripped() {
    let c = canon(
            r#"{"name":"charge_card","arguments":{"amount":5,"_idempotency_key":"k-1"},
                "_meta":{"dev.countersign/idempotency-key":"k-2","progressToken":"p","idempotencyKey":"k-3"}}"#,
        )
        .unwrap();
    assert_eq!(c.reserved.argument_key, Some(json!("k-1")));
    assert_eq!(
        c.reserved.meta["dev.countersign/idempotency-key"],
        json!("k-2")
    );
    assert_eq!(c.arguments, json!({"amount": 5}));
    assert_eq!(
        c.forward_params,
        json!({"name":"charge_card","_meta":{"progressToken":"p","idempotencyKey":"k-3"}})
    );
    let plain = canon(r#"{"name":"t","arguments":{"x":1},"_idempotency_key":"not-reserved-here"}"#)
        .unwrap();
    assert_eq!(
        plain.digest,
        canon(r#"{"name":"t","arguments":{"x":1}}"#).unwrap().digest
    );
}

#[test]
fn duplicate_keys_are_refused_anywhere() {
    let e = canon(r#"{"name":"t","arguments":{"to":"a","amount":1,"to":"b"}}"#).unwrap_err();
    assert_eq!(
        e,
        CanonicalError::DuplicateKey {
            path: "/arguments".into(),
            key: "to".into()
        }
    );
    let e = canon(r#"{"name":"t","arguments":{"x":{"y":1,"y":2}}}"#).unwrap_err();
    assert!(
        matches!(e, CanonicalError::DuplicateKey { ref path, .. } if path == "/arguments/x"),
        "{e}"
    );
    // The same key spelled with an escape is still the same key.
    let e = canon(r#"{"name":"t","arguments":{"a":1,"\u0061":2}}"#).unwrap_err();
    assert!(matches!(e, CanonicalError::DuplicateKey { .. }), "{e}");
    assert!(canon(r#"{"name":"t","name":"u"}"#).is_err());
    // In a long object too, on either side of the point where the keys
    // seen move from a list to a hash set.
    let long = |dup: usize, n: usize| {
        let mut members: Vec<String> = (0..n).map(|i| format!(r#""k{i}":{i}"#)).collect();
        members.push(format!(r#""k{dup}":0"#));
        format!(r#"{{"name":"t","arguments":{{{}}}}}"#, members.join(","))
    };
    for (dup, n) in [(3, 16), (15, 16), (3, 17), (16, 40), (39, 40)] {
        let e = canon(&long(dup, n)).unwrap_err();
        assert_eq!(
            e,
            CanonicalError::DuplicateKey {
                path: "/arguments".into(),
                key: format!("k{dup}")
            },
            "{dup} of {n}"
        );
    }
    assert!(canon(&long(0, 40).replace(r#","k0":0}"#, "}")).is_ok());
}

#[test]
fn lone_surrogates_are_refused() {
    for bad in [
        r#""\ud800""#,
        r#""\udc00""#,
        r#""\ud800x""#,
        r#""\ud800\u0041""#,
    ] {
        let params = format!(r#"{{"name":"t","arguments":{{"s":{bad}}}}}"#);
        let e = canon(&params).unwrap_err();
        assert_eq!(
            e,
            CanonicalError::LoneSurrogate {
                path: "/arguments/s".into()
            },
            "{bad}"
        );
    }
    let ok = canon(r#"{"name":"t","arguments":{"s":"\ud83d\ude00"}}"#).unwrap();
    assert_eq!(ok.arguments["s"], "😀");
}

#[test]
fn numbers_that_a_double_changes_are_refused() {
    for (bad, becomes) in [
        ("9007199254740993", "9007199254740992"),
        // Sixteen digits: past the integers every double holds.
        ("9999999999999999", "10000000000000000"),
        ("1.00000000000000001", "1"),
        ("1e400", "inf"),
        ("123456789012345678901234567890", "1.2345678901234568e+29"),
    ] {
        let e = canon(&format!(r#"{{"name":"t","arguments":{{"n":[0,{bad}]}}}}"#)).unwrap_err();
        assert_eq!(
            e,
            CanonicalError::InexactNumber {
                path: "/arguments/n/1".into(),
                literal: bad.into(),
                becomes: becomes.into()
            },
            "{bad}"
        );
    }
    for good in [
        "4.50",
        "1e2",
        "0.1",
        "-0",
        "9007199254740992",
        "-1.5E-3",
        "0.000001",
        "100",
        "1E+2",
        // Fifteen digits: exact without a trip through a double.
        "999999999999999",
        "-999999999999999",
    ] {
        assert!(
            canon(&format!(r#"{{"name":"t","arguments":{{"n":{good}}}}}"#)).is_ok(),
            "{good}"
        );
    }
    assert_eq!(
        canon(r#"{"name":"t","arguments":{"n":-0}}"#)
            .unwrap()
            .arguments_jcs,
        r#"{"n":0}"#
    );
}

/// Regression: a JCS-written double whose shortest digits differ between
/// Rust's and ECMAScript's printers was refused as inexact.
#[test]
fn regression_ecmascript_shortest_digits_are_exact() {
    let params = r#"{"name":"t","arguments":{"n":-1984012952780920.2}}"#;
    assert!(canon(params).is_ok());
    assert_eq!(
        canon(params).unwrap().arguments_jcs,
        r#"{"n":-1984012952780920.2}"#
    );
}

#[test]
fn depth_and_size_limits() {
    let limits = Limits {
        max_depth: 3,
        max_arguments_bytes: 64,
    };
    let ok = r#"{"name":"t","arguments":{"a":{"b":{"c":1}}}}"#;
    assert!(canonicalize("s", ok, limits).is_ok());
    let deep = r#"{"name":"t","arguments":{"a":{"b":{"c":{"d":1}}}}}"#;
    assert_eq!(
        canonicalize("s", deep, limits).unwrap_err(),
        CanonicalError::TooDeep {
            path: "/arguments/a/b/c".into(),
            max: 3
        }
    );
    let big = format!(
        r#"{{"name":"t","arguments":{{"a":"{}"}}}}"#,
        "x".repeat(100)
    );
    assert!(matches!(
        canonicalize("s", &big, limits),
        Err(CanonicalError::TooLarge { max: 64, .. })
    ));
    // Depth is bounded even for pathological input, without recursion blowing the stack.
    let very_deep = format!(
        r#"{{"name":"t","arguments":{{"a":{}1{}}}}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    assert!(matches!(
        canon(&very_deep),
        Err(CanonicalError::TooDeep { .. })
    ));
}

#[test]
fn forwarded_params_carry_the_jcs_bytes() {
    let c = canon(
        r#"{"name":"t","arguments":{"z":1E30,"a":4.50,"\u20ac":"x"},"_meta":{"progressToken":7}}"#,
    )
    .unwrap();
    let text = c.forward_params_text();
    assert!(
        text.starts_with(r#"{"arguments":{"a":4.5,"z":1e+30,"€":"x"}"#),
        "{text}"
    );
    let back: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(back["name"], "t");
    assert_eq!(back["_meta"]["progressToken"], 7);
    // Forwarding is a fixed point: canonicalizing what is forwarded changes nothing.
    let again = canon(&text).unwrap();
    assert_eq!(again.digest, c.digest);
    assert_eq!(again.forward_params_text(), text);
}

proptest::proptest! {
    /// JCS output always passes the strict parse, and canonicalization
    /// is idempotent.
    #[test]
    fn jcs_output_is_strict_and_stable(v in arb_json()) {
        let params = serde_json::json!({"name": "t", "arguments": {"v": v}});
        let first = canon(&jcs(&params)).unwrap();
        let second = canon(&first.forward_params_text()).unwrap();
        proptest::prop_assert_eq!(&first.digest, &second.digest);
        proptest::prop_assert_eq!(first.arguments_jcs, second.arguments_jcs);
    }
}

fn arb_json() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "\\PC{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map("\\PC{0,6}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

#[test]
fn shape_errors_name_the_field() {
    assert!(canon(r#"[1]"#)
        .unwrap_err()
        .to_string()
        .contains("must be an object"));
    assert!(canon(r#"{"arguments":{}}"#)
        .unwrap_err()
        .to_string()
        .contains("params.name"));
    assert!(canon(r#"{"name":"t","arguments":[1]}"#)
        .unwrap_err()
        .to_string()
        .contains("params.arguments"));
    assert!(canon(r#"{"name":"t","_meta":5}"#)
        .unwrap_err()
        .to_string()
        .contains("params._meta"));
}
