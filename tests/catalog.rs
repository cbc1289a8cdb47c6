//! The gateway's own tool catalog: a client that never lists tools gets its
//! calls classified by what the server declares, over stdio, HTTP and the
//! 2026-07-28 era.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::{json, Value};

/// Default policies (reads unattended, writes need approval) and a version
/// probe for `charge_card` on both upstreams.
fn gateway() -> (Gateway, tempfile::TempDir) {
    let (pdir, _key) = default_policies_with_alice();
    let probe = r#"version_probe = { tool = "get_account", arguments = { id = "/account" }, pointer = "/structuredContent/version" }"#;
    let gw = Gateway::start_with(Options {
        http_upstream: true,
        policies: Some(pdir.path().to_owned()),
        extra: format!(
            "\n[servers.payments.tools.charge_card]\n{probe}\n\n[servers.phttp.tools.charge_card]\n{probe}\n"
        ),
        ..Default::default()
    });
    (gw, pdir)
}

/// How a test talks to one server without ever listing its tools.
enum Route {
    Session(Client),
    Modern(String),
}

impl Route {
    async fn session(gw: &Gateway, server: &str) -> Route {
        let mut c = Client::new(&gw.url(server));
        c.initialize().await;
        Route::Session(c)
    }

    async fn call(&self, id: i64, tool: &str, args: Value) -> Answer {
        match self {
            Route::Session(c) => c.call(id, tool, args).await,
            Route::Modern(url) => {
                let body = json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
                    "name":tool,"arguments":args,
                    "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}});
                answer(modern_post(url, &body).send().await.unwrap()).await
            }
        }
    }
}

/// The four things a never-listing client must get right on one route.
async fn reads_are_known_without_listing(gw: &Gateway, route: Route, lost_answer_fault: &str) {
    let ran = |a: &Answer| a.last()["result"]["isError"] == false;
    // A read runs unattended under the default policies (a write would be
    // sent for approval).
    let a = route.call(1, "get_balance", json!({"account":"a"})).await;
    assert!(ran(&a), "{a:?}");
    // A read whose answer is lost is retried, and the server ran it twice.
    let before = gw.executions("get_balance");
    gw.fault("get_balance", lost_answer_fault, 0);
    let a = route.call(2, "get_balance", json!({"account":"a"})).await;
    assert!(ran(&a), "{a:?}");
    assert_eq!(gw.executions("get_balance"), before + 2);
    // A transient error (-32603) on a read is retried.
    gw.fault("get_balance", "error_before_execute", 0);
    let a = route.call(3, "get_balance", json!({"account":"a"})).await;
    assert!(ran(&a), "{a:?}");
    // The version probe reads `get_account`, a read-only tool the client
    // never listed: the write is held for approval, not refused as stale.
    let a = route
        .call(4, "charge_card", json!({"account":"acct_1","amount":5}))
        .await;
    assert_eq!(code(&a), "approval_pending", "{a:?}");
    assert_eq!(gw.executions("charge_card"), 0);
}

#[tokio::test]
async fn a_client_that_never_lists_tools_over_stdio() {
    let (gw, _p) = gateway();
    let route = Route::session(&gw, "payments").await;
    reads_are_known_without_listing(&gw, route, "exit_after_execute").await;
}

#[tokio::test]
async fn a_client_that_never_lists_tools_over_http() {
    let (gw, _p) = gateway();
    let route = Route::session(&gw, "phttp").await;
    reads_are_known_without_listing(&gw, route, "drop_session").await;
}

#[tokio::test]
async fn a_client_that_never_lists_tools_in_2026_07_28() {
    let (gw, _p) = gateway();
    let route = Route::Modern(gw.url("payments"));
    reads_are_known_without_listing(&gw, route, "exit_after_execute").await;
}

#[tokio::test]
async fn a_paged_tool_list_is_learned_whole() {
    let (pdir, _key) = default_policies_with_alice();
    let gw = Gateway::start_with(Options {
        policies: Some(pdir.path().to_owned()),
        extra: format!(
            "\n[servers.paged]\ncommand = \"{}\"\nargs = [\"--page-size\", \"2\"]\n",
            example_server_bin().display()
        ),
        ..Default::default()
    });
    let mut c = Client::new(&gw.url("paged"));
    c.initialize().await;
    // `notify_later` is a read-only tool on the last page: known only if
    // every page was read, and then it runs unattended.
    let a = c.call(1, "notify_later", json!({"text":"hi"})).await;
    assert_eq!(a.last()["result"]["isError"], false, "{a:?}");
    // Without the later pages it would be a write, held for approval.
    let listed = c
        .post(&json!({"jsonrpc":"2.0","id":2,"method":"tools/list"}))
        .await;
    assert!(
        listed.last()["result"]["nextCursor"].is_string(),
        "the server pages its list: {listed:?}"
    );
    // `check` reads every page too.
    let out = gw.cli(&["check", "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let paged = report_server(&report, "paged");
    let names: Vec<&str> = paged["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names.len(), 9, "{names:?}");
    assert!(names.contains(&"notify_later"), "{names:?}");
}

#[tokio::test]
async fn a_read_cache_answers_an_identical_read_and_is_refused_for_a_write() {
    let gw = Gateway::start_with(Options {
        extra: "\n[servers.payments.tools.get_balance]\ncache_ttl = \"1h\"\n\n[servers.payments.tools.refund]\ncache_ttl = \"1h\"\n".into(),
        ..Default::default()
    });
    let c = listed(&gw, "payments").await;
    let a = c.call(1, "get_balance", json!({"account":"a"})).await;
    let b = c.call(2, "get_balance", json!({"account":"a"})).await;
    assert_eq!(gw.executions("get_balance"), 1);
    assert_eq!(b.last()["id"], 2);
    assert_eq!(b.last()["result"]["content"], a.last()["result"]["content"]);
    assert!(
        b.last()["result"]["_meta"]["dev.countersign/cached"]["first_answered_at"].is_string(),
        "{b:?}"
    );
    // refund may write: its cache_ttl is never used, and the log says so.
    c.call(3, "refund", json!({"charge":"ch_1"})).await;
    c.call(4, "refund", json!({"charge":"ch_2"})).await;
    assert_eq!(gw.executions("refund"), 2);
    gw.wait_for_log("cache_ttl ignored").await;
    let out = gw.cli(&["check", "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let tool = |name: &str| report_tool(&report, "payments", name);
    assert_eq!(tool("get_balance")["cache"], "1h", "{report}");
    assert!(
        tool("refund")["cache"]
            .as_str()
            .unwrap()
            .contains("ignored"),
        "{report}"
    );
}

#[tokio::test]
async fn a_server_announcing_a_changed_list_is_listed_again_before_the_next_call() {
    let (pdir, _key) = default_policies_with_alice();
    let gw = Gateway::start_with(Options {
        policies: Some(pdir.path().to_owned()),
        ..Default::default()
    });
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    let ran = |a: &Answer| a.last()["result"]["isError"] == false;
    let a = c.call(1, "get_balance", json!({"account":"a"})).await;
    assert!(ran(&a), "a read runs unattended: {a:?}");
    // The server's get_balance now says it may write.
    std::fs::write(
        gw.faults_path(),
        json!({"_hints": {"get_balance": {"readOnlyHint": false}}}).to_string(),
    )
    .unwrap();
    let a = c.call(2, "get_balance", json!({"account":"b"})).await;
    assert!(
        ran(&a),
        "the gateway's list is fresh, so still a read: {a:?}"
    );
    // The server says so.
    let a = c
        .call(3, "notify_later", json!({"list_changed": true}))
        .await;
    assert!(ran(&a), "{a:?}");
    gw.wait_for_log("tool list changed").await;
    let a = c.call(4, "get_balance", json!({"account":"c"})).await;
    assert_eq!(
        code(&a),
        "approval_pending",
        "listed again: now a write, held for approval: {a:?}"
    );
}
