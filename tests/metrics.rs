//! `/metrics`: behind its own token, parsed by a parser nobody here wrote
//! (`openmetrics-parser`), and its values move as calls run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use openmetrics_parser::{MetricsExposition, OpenMetricsType, OpenMetricsValue};
use serde_json::json;

const METRICS_TOKEN: &str = "scraper-token-1";

type Exposition = MetricsExposition<OpenMetricsType, OpenMetricsValue>;

async fn scrape(gw: &common::Gateway, token: Option<&str>) -> (u16, String) {
    let mut req = reqwest::Client::new().get(format!("{}/metrics", gw.base()));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

async fn parsed(gw: &common::Gateway) -> Exposition {
    let (status, text) = scrape(gw, Some(METRICS_TOKEN)).await;
    assert_eq!(status, 200, "{text}");
    openmetrics_parser::openmetrics::parse_openmetrics(&text)
        .unwrap_or_else(|e| panic!("not valid OpenMetrics ({e:?}):\n{text}"))
}

/// The value of `family`'s sample with these labels; 0 when the sample (or
/// a family with no sample yet) is not there.
fn value(m: &Exposition, family: &str, labels: &[(&str, &str)]) -> f64 {
    let Some(f) = m.families.get(family) else {
        return 0.0;
    };
    let sample = f.iter_samples().find(|s| {
        let set = s.get_labelset().unwrap();
        labels
            .iter()
            .all(|(k, v)| set.get_label_value(k) == Some(*v))
    });
    match sample.map(|s| &s.value) {
        None => 0.0,
        Some(OpenMetricsValue::Counter(c)) => c.value.as_f64(),
        Some(OpenMetricsValue::Gauge(g)) => g.as_f64(),
        Some(OpenMetricsValue::Histogram(h)) => h.count.unwrap_or(0) as f64,
        Some(other) => panic!("{family}: unexpected {other:?}"),
    }
}

fn calls(m: &Exposition, tool: &str, outcome: &str) -> f64 {
    value(
        m,
        "countersign_tool_calls",
        &[("server", "payments"), ("tool", tool), ("outcome", outcome)],
    )
}

#[tokio::test]
async fn metrics_need_their_token_parse_and_move_as_calls_run() {
    let (pdir, _alice) = common::default_policies_with_alice();
    let gw = common::Gateway::start_with(common::Options {
        policies: Some(pdir.path().to_owned()),
        extra: format!(
            "\n[metrics]\ntoken_sha256 = \"{}\"\n",
            common::sha(METRICS_TOKEN)
        ),
        ..Default::default()
    });
    // No token, or an agent's token: refused.
    assert_eq!(scrape(&gw, None).await.0, 401);
    assert_eq!(scrape(&gw, Some(common::TOKEN)).await.0, 401);

    let c = common::listed(&gw, "payments").await;
    let before = parsed(&gw).await;
    for i in 0..3 {
        c.call(10 + i, "get_balance", json!({"account": "acct-1"}))
            .await;
    }
    // A write under the shipped policies waits for a reviewer.
    let held = c
        .post(
            &json!({"jsonrpc":"2.0","id":20,"method":"tools/call","params":{
            "name":"charge_card","arguments":{"account":"acct-1","amount":5},
            "_meta":{"dev.countersign/idempotency-key":"m-1"}}}),
        )
        .await;
    assert_eq!(common::code(&held), "approval_pending", "{held:?}");
    // A tool nobody lists: counted, but never under the client's name.
    c.call(21, "made_up_tool_name_123", json!({})).await;
    let after = parsed(&gw).await;

    assert_eq!(
        calls(&after, "get_balance", "ok") - calls(&before, "get_balance", "ok"),
        3.0
    );
    assert_eq!(
        calls(&after, "charge_card", "approval_pending")
            - calls(&before, "charge_card", "approval_pending"),
        1.0
    );
    let text = scrape(&gw, Some(METRICS_TOKEN)).await.1;
    assert!(!text.contains("made_up_tool_name_123"), "{text}");
    assert_eq!(
        calls(&after, "(unlisted)", "tool_unavailable"),
        1.0,
        "{text}"
    );
    // The charge; the unlisted tool is refused before any proposal.
    assert_eq!(value(&after, "countersign_pending_proposals", &[]), 1.0);
    assert_eq!(value(&after, "countersign_unknown_outcomes", &[]), 0.0);
    assert_eq!(
        value(
            &after,
            "countersign_circuit_state",
            &[("server", "payments"), ("state", "closed")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &after,
            "countersign_circuit_state",
            &[("server", "payments"), ("state", "open")]
        ),
        0.0
    );
    assert!(
        value(&after, "countersign_decision_duration_seconds", &[])
            >= value(&before, "countersign_decision_duration_seconds", &[]) + 4.0
    );
    assert!(
        value(
            &after,
            "countersign_store_duration_seconds",
            &[("op", "lookup")]
        ) >= 1.0
    );
    assert!(after.families.contains_key("countersign_audit_lag_entries"));
    assert!(after.families.contains_key("countersign_ledger_unflushed"));
    for family in [
        "countersign_tool_calls",
        "countersign_store_duration_seconds",
        "countersign_pending_proposals",
    ] {
        assert!(after.families.contains_key(family), "{family}: {text}");
    }
}

#[tokio::test]
async fn without_a_metrics_token_there_is_no_metrics_endpoint() {
    let gw = common::Gateway::start();
    assert_eq!(scrape(&gw, Some(common::TOKEN)).await.0, 404);
}
