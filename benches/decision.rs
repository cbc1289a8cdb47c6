//! Per-call policy decision time, with the shipped policies and with 1,000
//! policies, decided against the whole set and against the slice of policies
//! that can apply to the tool; and a read whose slice reads nothing of the
//! call's own context, decided by Cedar once and then from the decision
//! cache.
//!
//! ```text
//! taskset -c 0 cargo bench --bench decision
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::time_per_call;
use std::path::PathBuf;

use countersign::core::annotations::Annotations;
use countersign::core::decision::Call;
use countersign::core::identity::Identity;

fn main() {
    let shipped = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policies");
    let defaults = std::fs::read_to_string(shipped.join("default.cedar")).unwrap();
    let big = tempfile::tempdir().unwrap();
    let mut text = defaults.clone();
    let extra = 1000 - defaults.matches("@id(").count();
    for i in 0..extra {
        text.push_str(&format!(
            "@id(\"limit-{i}\")\nforbid (principal, action == Action::\"call\", resource == Tool::\"payments/tool_{i}\")\nwhen {{ context.arguments has amount && context.arguments.amount.greaterThan(decimal(\"{i}.0\")) }};\n"
        ));
    }
    std::fs::write(big.path().join("many.cedar"), text).unwrap();
    std::fs::copy(
        shipped.join("schema.cedarschema"),
        big.path().join("schema.cedarschema"),
    )
    .unwrap();

    let small = countersign::cli::files::load_policies(&shipped, None).unwrap();
    let large = countersign::cli::files::load_policies(big.path(), None).unwrap();
    println!(
        "shipped: {} policies; large: {} policies",
        small.len(),
        large.len()
    );

    let identity = Identity {
        principal: "agent-7".into(),
        tenant: "acme".into(),
        groups: vec!["agents".into()],
        ..Default::default()
    };
    let args = serde_json::json!({"account": "acct_42", "amount": 120.5, "currency": "EUR"});
    let call = Call {
        identity: &identity,
        server: "payments",
        tool: "charge_card",
        annotations: Annotations {
            read_only: false,
            destructive: false,
            idempotent: false,
            open_world: true,
        },
        definition_changed: false,
        budgets: None,
        arguments: &args,
        digest: "sha256:00",
        resource_version: None,
    };
    assert_eq!(small.decide(&call), small.decide_unsliced(&call));
    assert_eq!(large.decide(&call), large.decide_unsliced(&call));
    let n: usize = std::env::var("BENCH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    time_per_call("shipped policies, whole set", n, || {
        drop(small.decide_unsliced(&call))
    });
    time_per_call("shipped policies, sliced by tool", n, || {
        drop(small.decide(&call))
    });
    time_per_call("1,000 policies, whole set", n / 10, || {
        drop(large.decide_unsliced(&call))
    });
    time_per_call("1,000 policies, sliced by tool", n, || {
        drop(large.decide(&call))
    });
    let read_args = serde_json::json!({"account": "acct_42"});
    let read = Call {
        tool: "get_balance",
        annotations: Annotations {
            read_only: true,
            destructive: false,
            idempotent: true,
            open_world: false,
        },
        arguments: &read_args,
        ..call
    };
    let before = small.evaluations();
    time_per_call("a read, shipped policies, whole set (Cedar)", n, || {
        drop(small.decide_unsliced(&read))
    });
    time_per_call("a read, shipped policies, decision cache", n * 10, || {
        drop(small.decide(&read))
    });
    // The cached decisions asked Cedar once (twice at most: unattended,
    // then approved), not once per call.
    let asked = small.evaluations() - before;
    assert!(
        asked <= u64::try_from(n + n / 10).unwrap() + 2,
        "the read was served from the cache ({asked} evaluations)"
    );
}
