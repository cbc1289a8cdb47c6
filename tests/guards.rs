//! Guards on the business effect (DESIGN.md section 25) end to end: the
//! real gateway, the example server (which records each execution), the
//! `countersign` CLI and, for two gateways, PostgreSQL. Every case counts
//! executions at the server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{code, countersign};
use serde_json::{json, Value};

/// Calls run unattended; a reviewer (alice, tenant acme) may approve.
const POLICIES: &str = r#"
@id("calls-run")
permit (principal, action == Action::"call", resource);

@id("reviewers-approve")
permit (principal, action == Action::"approve", resource);
"#;

const CARD_BUDGET: &str = r#"
[[budgets]]
name = "card-daily"
tools = ["payments/charge_card"]
amount = "/amount"
per = "principal"
window = "24h"
limit = 1000
"#;

struct Guarded {
    gw: common::Gateway,
    _pdir: tempfile::TempDir,
    key: PathBuf,
}

fn policy_dir() -> (tempfile::TempDir, PathBuf) {
    policy_dir_with("")
}

/// The policy folder, with `more` policies besides [`POLICIES`].
fn policy_dir_with(more: &str) -> (tempfile::TempDir, PathBuf) {
    let pdir = tempfile::tempdir().unwrap();
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policies");
    std::fs::copy(
        src.join("schema.cedarschema"),
        pdir.path().join("schema.cedarschema"),
    )
    .unwrap();
    std::fs::write(
        pdir.path().join("default.cedar"),
        format!("{POLICIES}{more}"),
    )
    .unwrap();
    let key = pdir.path().join("alice.key");
    let out = std::process::Command::new(common::countersign_bin())
        .args(["keygen", "--name", "alice", "--out"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let entry = String::from_utf8(out.stdout)
        .unwrap()
        .replace("tenants = [\"*\"]", "tenants = [\"acme\"]");
    std::fs::write(pdir.path().join("reviewers.toml"), entry).unwrap();
    (pdir, key)
}

impl Guarded {
    fn start(extra: &str) -> Guarded {
        Guarded::start_with(extra, "")
    }

    fn start_with(extra: &str, policies: &str) -> Guarded {
        let (pdir, key) = policy_dir_with(policies);
        let gw = common::Gateway::start_with(common::Options {
            policies: Some(pdir.path().to_owned()),
            extra: extra.into(),
            ..Default::default()
        });
        Guarded {
            gw,
            _pdir: pdir,
            key,
        }
    }

    async fn client(&self, token: &str) -> common::Client {
        client_of(&self.gw, token).await
    }

    async fn cli(&self, args: &[&str]) -> (bool, String, String) {
        cli_of(&self.gw, &self.key, args).await
    }

    async fn budgets(&self) -> Value {
        let (ok, out, err) = self.cli(&["budgets", "--json"]).await;
        assert!(ok, "{out}{err}");
        serde_json::from_str(&out).unwrap()
    }
}

async fn client_of(gw: &common::Gateway, token: &str) -> common::Client {
    let mut c = common::Client::new(&gw.url("payments"));
    c.token = token.into();
    c.initialize().await;
    c.post(&json!({"jsonrpc":"2.0","id":0,"method":"tools/list"}))
        .await;
    c
}

async fn cli_of(gw: &common::Gateway, key: &Path, args: &[&str]) -> (bool, String, String) {
    let key = key.display().to_string();
    let base = gw.base();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--key", &key, "--gateway", &base]);
    common::run_cli_async(&all).await
}

/// A `tools/call` of `charge_card` for `amount`, under `key` when given.
async fn charge(c: &common::Client, id: i64, amount: i64, key: Option<&str>) -> common::Answer {
    let mut params = json!({
        "name": "charge_card",
        "arguments": {"account": "acct_42", "amount": amount, "currency": "EUR"},
    });
    if let Some(k) = key {
        params["_meta"] = json!({"dev.countersign/idempotency-key": k});
    }
    c.post(&json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params": params}))
        .await
}

/// A charge of 200 through each client at once (keys `PREFIX0`...): what
/// each got, `ran` or its code.
async fn charges_at_once(clients: Vec<Arc<common::Client>>, prefix: &str) -> Vec<String> {
    let calls: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let key = format!("{prefix}{i}");
            tokio::spawn(async move { charge(&c, i as i64, 200, Some(&key)).await })
        })
        .collect();
    let mut codes = Vec::new();
    for t in calls {
        let a = t.await.unwrap();
        codes.push(if ran(&a) { "ran".to_owned() } else { code(&a) });
    }
    codes
}

fn ran(a: &common::Answer) -> bool {
    a.last()["result"]["isError"] == false
}

fn proposal_id(a: &common::Answer) -> String {
    countersign(a)["proposal_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no proposal id in {a:?}"))
        .to_owned()
}

/// The spending `countersign budgets --json` shows for `scope`.
fn spent(budgets: &Value, name: &str, scope: &str) -> String {
    budgets["budgets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == name)
        .and_then(|b| {
            b["spending"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["scope"] == scope)
                .map(|s| s["spent"].as_str().unwrap().to_owned())
        })
        .unwrap_or_else(|| "0".into())
}

#[tokio::test]
async fn within_the_budget_calls_run_the_one_past_it_is_held_with_the_figures_and_runs_once_approved(
) {
    let g = Guarded::start(&format!(
        "{CARD_BUDGET}\n[metrics]\ntoken_sha256 = \"{}\"\n",
        common::sha("scraper-token-1")
    ));
    let c = g.client(common::TOKEN).await;
    assert!(ran(&charge(&c, 1, 400, Some("k1")).await));
    assert!(ran(&charge(&c, 2, 400, Some("k2")).await));
    assert_eq!(g.gw.executions("charge_card"), 2);

    // 800 + 400 passes 1,000: held, with the figures for the reviewer.
    let held = charge(&c, 3, 400, Some("k3")).await;
    assert_eq!(code(&held), "approval_pending", "{held:?}");
    let id = proposal_id(&held);
    assert_eq!(
        g.gw.executions("charge_card"),
        2,
        "the held call did not run"
    );
    // The operator's metrics count the stop once, as held.
    let metrics = common::scrape_metrics(&g.gw, "scraper-token-1").await;
    assert!(
        metrics.contains(
            "countersign_guard_stops_total{guard=\"budget/card-daily\",result=\"held\"} 1\n"
        ),
        "{metrics}"
    );
    let figures = "spent 800 of 1,000 in 1d; this call 400; after it 1,200 (over the limit)";
    let (ok, shown, _) = g.cli(&["show", &id]).await;
    assert!(ok && shown.contains(figures), "{shown}");
    let (ok, pending, _) = g.cli(&["pending"]).await;
    assert!(ok && pending.contains(figures), "{pending}");

    // Another principal has a budget of its own.
    let other = g.client(common::OTHER_TOKEN).await;
    assert!(ran(&charge(&other, 4, 1000, Some("o1")).await));

    // Approved, that one call goes over.
    let (ok, out, err) = g.cli(&["approve", &id, "--reason", "month end"]).await;
    assert!(ok, "{out}{err}");
    let again = charge(&c, 5, 400, Some("k3")).await;
    assert!(ran(&again), "{again:?}");
    assert_eq!(g.gw.executions("charge_card"), 4);

    let b = g.budgets().await;
    assert_eq!(spent(&b, "card-daily", "principal:agent-7"), "1200");
    assert_eq!(spent(&b, "card-daily", "principal:agent-9"), "1000");
    let (ok, text, _) = g.cli(&["budgets"]).await;
    assert!(
        ok && text.contains("acme principal:agent-7: spent 1,200 in 3 calls, 0 left"),
        "{text}"
    );
    // The audit log carries the figures each call ran with (its writer
    // appends within moments of the answer).
    let guarded =
        |e: &serde_json::Map<String, Value>| e["kind"] == "dispatched" && e.get("guards").is_some();
    common::wait_for_audit(&g.gw, "four guarded dispatches", |all| {
        all.iter().filter(|e| guarded(e)).count() == 4
    })
    .await;
    let entries = common::audit_entries(&g.gw.audit_dir());
    let taken: Vec<_> = entries.iter().filter(|e| guarded(e)).collect();
    assert_eq!(taken.len(), 4, "{taken:?}");
    let last = &taken.last().unwrap()["guards"];
    assert_eq!(last["approved_over"], true);
    // Within the budget, nobody let it over: the field is left out.
    assert!(
        taken[0]["guards"].get("approved_over").is_none(),
        "{:?}",
        taken[0]
    );
    assert_eq!(last["budgets"][0]["spent"], "800", "{last}");
    assert_eq!(last["budgets"][0]["amount"], "400", "{last}");
    assert_eq!(last["budgets"][0]["limit"], "1000", "{last}");
}

#[tokio::test]
async fn ten_concurrent_calls_of_200_under_1000_run_exactly_five_and_refused_ones_do_not_count() {
    let g = Guarded::start(
        r#"
[[budgets]]
name = "team"
tools = ["payments/charge_card"]
amount = "/amount"
per = "tenant"
window = "24h"
limit = "1000.00"
over = "deny"
"#,
    );
    // Two principals of one tenant, five sessions each.
    let mut clients = Vec::new();
    for i in 0..10 {
        let token = if i % 2 == 0 {
            common::TOKEN
        } else {
            common::OTHER_TOKEN
        };
        clients.push(Arc::new(g.client(token).await));
    }
    let codes = charges_at_once(clients, "c").await;
    assert_eq!(codes.iter().filter(|c| *c == "ran").count(), 5, "{codes:?}");
    assert_eq!(
        codes.iter().filter(|c| *c == "budget_exceeded").count(),
        5,
        "{codes:?}"
    );
    assert_eq!(g.gw.executions("charge_card"), 5);
    // The refused calls counted nothing.
    assert_eq!(spent(&g.budgets().await, "team", "tenant:acme"), "1000");
    // The agent is told the figures.
    let c = g.client(common::TOKEN).await;
    let refused = charge(&c, 20, 1, Some("late")).await;
    assert_eq!(code(&refused), "budget_exceeded");
    assert!(
        refused
            .response_text()
            .contains("spent 1,000 of 1,000 in 1d; this call 1; after it 1,001"),
        "{refused:?}"
    );
    // Another tenant's budget is its own.
    let globex = g.client(common::GLOBEX_TOKEN).await;
    assert!(ran(&charge(&globex, 21, 1000, Some("g1")).await));
}

#[tokio::test]
async fn three_sends_of_one_key_count_once_a_restart_keeps_the_count_and_the_window_rolls() {
    let mut g = Guarded::start(
        r#"
[[budgets]]
name = "short"
tools = ["payments/charge_card"]
amount = "/amount"
per = "principal"
window = "4s"
limit = 500
"#,
    );
    let c = g.client(common::TOKEN).await;
    for id in 0..3 {
        assert!(ran(&charge(&c, id, 300, Some("same")).await));
    }
    assert_eq!(g.gw.executions("charge_card"), 1);
    assert_eq!(
        spent(&g.budgets().await, "short", "principal:agent-7"),
        "300"
    );

    g.gw.restart();
    assert_eq!(
        spent(&g.budgets().await, "short", "principal:agent-7"),
        "300",
        "the count survives a restart"
    );
    let c = g.client(common::TOKEN).await;
    let held = charge(&c, 5, 300, Some("next")).await;
    assert_eq!(code(&held), "approval_pending", "{held:?}");

    // Once the first spending leaves the window, the next call fits.
    let started = std::time::Instant::now();
    loop {
        let b = g.budgets().await;
        if spent(&b, "short", "principal:agent-7") == "0" {
            break;
        }
        assert!(
            started.elapsed().as_secs() < 30,
            "the window never rolled: {b}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let fits = charge(&c, 6, 300, Some("after-window")).await;
    assert!(ran(&fits), "{fits:?}");
    assert_eq!(g.gw.executions("charge_card"), 2);
}

/// Cedar sees `context.budgets`: a policy refuses a call that would take
/// the budget past twice its limit, where the budget alone would hold it.
#[tokio::test]
async fn policies_see_the_budget_and_can_refuse_past_twice_its_limit() {
    let g = Guarded::start_with(
        CARD_BUDGET,
        r#"
@id("twice-the-budget")
forbid (principal, action == Action::"call", resource)
when {
  context has budgets && context.budgets has "card-daily" &&
  context.budgets["card-daily"].after.greaterThan(decimal("2000.0"))
};
"#,
    );
    let c = g.client(common::TOKEN).await;
    assert!(ran(&charge(&c, 1, 500, Some("a")).await));
    let held = charge(&c, 2, 1400, Some("b")).await;
    assert_eq!(code(&held), "approval_pending", "{held:?}");
    let denied = charge(&c, 3, 1600, Some("c")).await;
    assert_eq!(code(&denied), "policy_denied", "{denied:?}");
    assert_eq!(g.gw.executions("charge_card"), 1);
}

const ONCE: &str = r#"
[[effect_keys]]
name = "charge-once"
tools = ["payments/charge_card"]
fields = ["/account", "/amount", "/currency"]
window = "1h"
"#;

#[tokio::test]
async fn the_same_charge_from_a_new_session_without_a_key_is_held_and_the_reviewer_is_told_it_repeats_one(
) {
    let g = Guarded::start(ONCE);
    let first = g.client(common::TOKEN).await;
    assert!(ran(&charge(&first, 1, 60, None).await));
    // The agent crashed; a new session, no key, the same charge.
    let second = g.client(common::TOKEN).await;
    let held = charge(&second, 1, 60, None).await;
    assert_eq!(code(&held), "approval_pending", "{held:?}");
    assert_eq!(g.gw.executions("charge_card"), 1);
    let id = proposal_id(&held);
    let (ok, shown, _) = g.cli(&["show", &id]).await;
    assert!(
        ok && shown.contains("repeats an earlier call (effect key charge-once)")
            && shown.contains("it ran (answered at"),
        "{shown}"
    );
    // Another amount is another effect, and another principal of the
    // tenant making the same charge repeats it too.
    assert!(ran(&charge(&second, 2, 61, None).await));
    let other = g.client(common::OTHER_TOKEN).await;
    assert_eq!(code(&charge(&other, 3, 61, None).await), "approval_pending");
    assert_eq!(g.gw.executions("charge_card"), 2);
    // Approved, the repeat runs once.
    let (ok, out, err) = g.cli(&["approve", &id, "--reason", "two invoices"]).await;
    assert!(ok, "{out}{err}");
    assert!(ran(&charge(&second, 4, 60, None).await));
    assert_eq!(g.gw.executions("charge_card"), 3);
}

#[tokio::test]
async fn a_keyless_retry_after_an_outcome_unknown_never_runs_unattended() {
    let g = Guarded::start(ONCE);
    let c = g.client(common::TOKEN).await;
    g.gw.fault("charge_card", "exit_after_execute", 0);
    let lost = charge(&c, 1, 75, None).await;
    assert_eq!(code(&lost), "outcome_unknown", "{lost:?}");
    assert_eq!(g.gw.executions("charge_card"), 1);
    // A new session, no key: the same effect, whose outcome is unknown.
    let retry = g.client(common::TOKEN).await;
    let held = charge(&retry, 2, 75, None).await;
    assert_eq!(code(&held), "approval_pending", "{held:?}");
    let (ok, shown, _) = g.cli(&["show", &proposal_id(&held)]).await;
    assert!(ok && shown.contains("its outcome is unknown"), "{shown}");
    assert_eq!(
        g.gw.executions("charge_card"),
        1,
        "never ran again unattended"
    );
}

#[tokio::test]
async fn a_repeat_is_refused_when_the_effect_key_says_deny_and_a_budget_without_an_amount_is_refused_precisely(
) {
    let g = Guarded::start(
        r#"
[[effect_keys]]
tools = ["payments/charge_card"]
fields = ["/account", "/amount"]
window = "1h"
repeat = "deny"

[[budgets]]
name = "charges"
tools = ["payments/charge_card"]
amount = "/amount"
per = "principal"
window = "1h"
limit = 10000
"#,
    );
    let c = g.client(common::TOKEN).await;
    assert!(ran(&charge(&c, 1, 10, Some("a")).await));
    let again = charge(&c, 2, 10, Some("b")).await;
    assert_eq!(code(&again), "effect_repeated", "{again:?}");
    assert!(
        again.response_text().contains("effect key effect-1"),
        "{again:?}"
    );
    // No amount: refused as invalid, nothing ran.
    let bad = c
        .post(
            &json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{
            "name":"charge_card","arguments":{"account":"acct_1","amount":"ten"}}}),
        )
        .await;
    assert!(
        bad.response_text()
            .contains("budget `charges` counts the amount at `/amount`"),
        "{bad:?}"
    );
    assert_eq!(g.gw.executions("charge_card"), 1);
}

/// Two gateways on one PostgreSQL database share one budget exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_postgresql_share_one_budget_exactly() {
    let schema = common::pg::Schema::new();
    let (pdir, key) = policy_dir();
    let budget = r#"
[[budgets]]
name = "shared"
tools = ["payments/charge_card"]
amount = "/amount"
per = "tenant"
window = "24h"
limit = 1000
over = "deny"
"#;
    let start = || {
        common::pg::on(
            &schema,
            common::Options {
                policies: Some(pdir.path().to_owned()),
                extra: budget.into(),
                ..Default::default()
            },
        )
    };
    let (a, b) = (start(), start());
    let mut clients = Vec::new();
    for i in 0..10 {
        let gw = if i % 2 == 0 { &a } else { &b };
        clients.push(Arc::new(client_of(gw, common::TOKEN).await));
    }
    let codes = charges_at_once(clients, "s").await;
    assert_eq!(codes.iter().filter(|c| *c == "ran").count(), 5, "{codes:?}");
    assert_eq!(a.executions("charge_card") + b.executions("charge_card"), 5);
    let (ok, out, err) = cli_of(&b, &key, &["budgets", "--json"]).await;
    assert!(ok, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(spent(&v, "shared", "tenant:acme"), "1000");
}
