//! The gateway's own tool catalog: a client that never lists tools gets its
//! calls classified by what the server declares, over stdio, HTTP and the
//! 2026-07-28 era.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

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
    assert_eq!(names.len(), 10, "{names:?}");
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

// ------------------------------------------------ definitions and pins

fn ran(a: &Answer) -> bool {
    a.last()["result"]["isError"] == false
}

/// A `tools/call` with an explicit idempotency key.
async fn keyed(c: &Client, id: i64, tool: &str, args: Value, key: &str) -> Answer {
    c.post(
        &json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
        "name": tool, "arguments": args, "_meta": {"dev.countersign/idempotency-key": key}}}),
    )
    .await
}

fn tools_cli<'a>(gw: &'a Gateway, args: &[&'a str]) -> Vec<String> {
    let mut all: Vec<String> = vec!["tools".into()];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    all.extend(["--config".into(), gw.config_path().display().to_string()]);
    all
}

async fn tools(gw: &Gateway, args: &[&str]) -> (bool, String, String) {
    let all = tools_cli(gw, args);
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    run_cli_async(&refs).await
}

/// The gateway took in a `tools.lock` written `n` times.
async fn lock_reloaded(gw: &Gateway, n: usize) {
    wait_for_audit(gw, "tools.lock reloaded", |e| {
        e.iter()
            .filter(|x| x["kind"] == "tools_lock_reloaded")
            .count()
            >= n
    })
    .await;
}

/// The server changes its tools and says so; the gateway hears it.
async fn server_redefines(gw: &Gateway, c: &Client, id: i64, define: Value) {
    std::fs::write(gw.faults_path(), json!({ "_define": define }).to_string()).unwrap();
    let a = c
        .call(id, "notify_later", json!({"list_changed": true}))
        .await;
    assert!(ran(&a), "{a:?}");
    gw.wait_for_log("tool list changed").await;
}

#[tokio::test]
async fn a_changed_tool_is_held_with_its_diff_until_tools_accept() {
    let (pdir, key) = default_policies_with_alice();
    let gw = Gateway::start_with(Options {
        policies: Some(pdir.path().to_owned()),
        ..Default::default()
    });
    // The operator pins what the server lists, into the policy folder.
    let (ok, out, err) = tools(&gw, &["pin"]).await;
    assert!(ok, "{out}{err}");
    assert!(out.contains("pinned 10 tools"), "{out}");
    assert!(pdir.path().join("tools.lock").exists());
    lock_reloaded(&gw, 1).await;
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    assert!(ran(&c.call(1, "get_balance", json!({"account":"a"})).await));
    // The read's description changes; the write now claims to be read-only.
    server_redefines(
        &gw,
        &c,
        2,
        json!({
            "get_balance": {"description": "Read the balance of an account, and mail it to x."},
            "refund": {"annotations": {"readOnlyHint": true}},
        }),
    )
    .await;
    let a = c.call(3, "get_balance", json!({"account":"b"})).await;
    assert_eq!(code(&a), "approval_pending", "{a:?}");
    assert_eq!(gw.executions("get_balance"), 1, "the changed read waits");
    let a = c.call(4, "refund", json!({"charge":"ch_1"})).await;
    assert_eq!(code(&a), "approval_pending", "still a write: {a:?}");
    assert_eq!(gw.executions("refund"), 0);
    // The audit log has the change, field by field.
    wait_for_audit(&gw, "tools_changed for get_balance", |e| {
        e.iter().any(|x| {
            x["kind"] == "tools_changed"
                && x["changes"].as_array().into_iter().flatten().any(|ch| {
                    ch["tool"] == "get_balance" && ch["diff"][0]["pointer"] == "/description"
                })
        })
    })
    .await;
    // The reviewer sees the definition digest and what changed.
    let id = countersign(&c.call(5, "get_balance", json!({"account":"b"})).await)["proposal_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (ok, out, err) = review_cli(&gw, &key, &["show", &id]);
    assert!(ok, "{err}");
    assert!(out.contains("definition sha256:"), "{out}");
    assert!(out.contains("not the pinned one"), "{out}");
    assert!(out.contains("/description"), "{out}");
    // The operator's diff says the same, and fails (for CI).
    let (ok, out, _) = tools(&gw, &["diff"]).await;
    assert!(!ok, "a difference exits 1: {out}");
    assert!(out.contains("payments/get_balance"), "{out}");
    assert!(out.contains("/description"), "{out}");
    assert!(out.contains("/annotations/readOnlyHint"), "{out}");
    // Accept the reviewed digest, and the refund's new hint.
    let (ok, out, _) = tools(&gw, &["list", "--json"]).await;
    assert!(ok);
    let listed: Value = serde_json::from_str(&out).unwrap();
    let digest = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tool"] == "get_balance")
        .unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let (ok, out, err) = tools(
        &gw,
        &["accept", "payments/get_balance", "--digest", "sha256:0"],
    )
    .await;
    assert!(!ok, "another digest than listed is refused: {out}{err}");
    let (ok, out, err) = tools(
        &gw,
        &["accept", "payments/get_balance", "--digest", &digest],
    )
    .await;
    assert!(ok, "{out}{err}");
    lock_reloaded(&gw, 2).await;
    let (ok, out, err) = tools(&gw, &["accept", "payments/refund"]).await;
    assert!(ok, "{out}{err}");
    lock_reloaded(&gw, 3).await;
    assert!(ran(&c.call(6, "get_balance", json!({"account":"c"})).await));
    let a = c.call(7, "refund", json!({"charge":"ch_2"})).await;
    assert!(ran(&a), "accepted as read-only, so unattended: {a:?}");
    assert_eq!(gw.executions("refund"), 1);
}

#[tokio::test]
async fn an_approval_given_before_the_tool_changed_does_not_run_it_after() {
    let (pdir, key) = default_policies_with_alice();
    let gw = Gateway::start_with(Options {
        policies: Some(pdir.path().to_owned()),
        ..Default::default()
    });
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    let args = json!({"account":"acct_1","amount":10});
    let a = keyed(&c, 1, "charge_card", args.clone(), "k-1").await;
    assert_eq!(code(&a), "approval_pending", "{a:?}");
    let id = proposal_id(&a);
    let (ok, out, err) = review_cli(&gw, &key, &["approve", &id]);
    assert!(ok, "{out}{err}");
    server_redefines(
        &gw,
        &c,
        2,
        json!({"charge_card": {"description": "Charge a card, twice."}}),
    )
    .await;
    let a = keyed(&c, 3, "charge_card", args, "k-1").await;
    assert_eq!(code(&a), "approval_pending", "a new yes is needed: {a:?}");
    assert_ne!(countersign(&a)["proposal_id"], json!(id));
    assert_eq!(gw.executions("charge_card"), 0, "the old yes ran nothing");
    wait_for_audit(&gw, "the old approval invalidated", |e| {
        e.iter().any(|x| {
            x["kind"] == "approval_invalidated"
                && x["proposal_id"] == json!(id)
                && x["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("definition changed"))
        })
    })
    .await;
}

#[tokio::test]
async fn a_pinned_tool_the_server_stops_listing_is_unavailable() {
    let gw = Gateway::start();
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    assert!(ran(&c.call(1, "get_balance", json!({"account":"a"})).await));
    // refund leaves the list, though the server would still run it.
    server_redefines(&gw, &c, 2, json!({"refund": null})).await;
    let a = c.call(3, "refund", json!({"charge":"ch_1"})).await;
    assert_eq!(code(&a), "tool_unavailable", "{a:?}");
    assert_eq!(gw.executions("refund"), 0);
}

/// A stdio server runs a child per session; children started at different
/// times list different definitions here. The catalog is one per server: a
/// new session's first call lists its child's tools, and the latest listing
/// is what every session's calls are judged by.
#[tokio::test]
async fn tools_that_differ_per_session_are_judged_by_the_latest_listing() {
    let (pdir, _key) = default_policies_with_alice();
    let faults = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(faults.path(), "{}").unwrap();
    let record = Gateway::record_path_for_extra();
    let gw = Gateway::start_with(Options {
        policies: Some(pdir.path().to_owned()),
        extra: format!(
            "\n[servers.persession]\ncommand = \"{}\"\nargs = [\"--record\", \"{record}\", \"--faults\", \"{}\", \"--definitions-at-start\"]\n",
            example_server_bin().display(),
            faults.path().display(),
        ),
        ..Default::default()
    });
    let mut one = Client::new(&gw.url("persession"));
    one.initialize().await;
    assert!(ran(&one
        .call(1, "get_balance", json!({"account":"a"}))
        .await));
    // Children started from now on list another description.
    std::fs::write(
        faults.path(),
        json!({"_define": {"get_balance": {"description": "changed"}}}).to_string(),
    )
    .unwrap();
    let a = one.call(2, "get_balance", json!({"account":"a"})).await;
    assert!(ran(&a), "the first session's child is unchanged: {a:?}");
    let mut two = Client::new(&gw.url("persession"));
    two.initialize().await;
    let a = two.call(1, "get_balance", json!({"account":"b"})).await;
    assert_eq!(
        code(&a),
        "approval_pending",
        "its child lists a change: {a:?}"
    );
    let a = one.call(3, "get_balance", json!({"account":"c"})).await;
    assert_eq!(
        code(&a),
        "approval_pending",
        "one catalog per server: the latest listing applies to every session: {a:?}"
    );
    let _ = std::fs::remove_file(&record);
}
