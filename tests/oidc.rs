//! The gateway behind a real OpenID provider: npm's `oidc-provider` (a
//! certified implementation, installed by `.ci/setup-peers`) issues JWT
//! access tokens for the gateway's resource URL with the client credentials
//! grant. The gateway discovers its keys itself (OIDC discovery), a write
//! goes through a reviewer's approval and runs once, the audit log and the
//! proposal name the agent and its client, and the provider's key rotation
//! and downtime are lived through without a restart. A person signs in with
//! the Python MCP SDK's own OAuth client (authorization code with PKCE,
//! the provider found through the gateway's RFC 9728 metadata).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;

use common::idp::*;
use common::*;
use serde_json::{json, Value};

fn gateway(port: u16, policies: &Path) -> Gateway {
    gateway_with(port, policies, Options::default().approvals)
}

/// The gateway with `approvals` as the body of its `[approvals]`.
fn gateway_with(port: u16, policies: &Path, approvals: String) -> Gateway {
    Gateway::start_with(Options {
        policies: Some(policies.to_owned()),
        approvals,
        extra: format!(
            "\n[auth]\nrefetch_interval = \"1s\"\n\n[[auth.issuers]]\nname = \"corp\"\n\
             issuer = \"{}\"\ntenant_claim = \"tid\"\nscopes = {{ payments = [\"pay:use\"] }}\n",
            issuer(port)
        ),
        ..Default::default()
    })
}

/// An `initialize` with `token`, whatever the answer.
async fn try_initialize(gw: &Gateway, token: &str) -> Answer {
    let mut c = Client::new(&gw.url("payments"));
    c.token = token.to_owned();
    c.post(
        &json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion":"2025-06-18","capabilities":{},
        "clientInfo":{"name":"oidc-test","version":"0"}}}),
    )
    .await
}

async fn initialized(gw: &Gateway, token: &str) -> Client {
    let mut c = Client::new(&gw.url("payments"));
    c.token = token.to_owned();
    let a = c.initialize().await;
    assert_eq!(a.status, 200, "{a:?}");
    c
}

#[tokio::test]
async fn an_agent_service_signs_in_and_its_approved_write_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let idp = provider(free_port(), &dir.path().join("keys.json"), "k1");
    let (pdir, alice) = default_policies_with_alice();
    let gw = gateway(idp.port, pdir.path());
    let resource = format!("{}/mcp/payments", gw.base());
    let c = initialized(&gw, &token(idp.port, &resource).await).await;
    let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
        "name":"charge_card","arguments":{"account":"a","amount":12},
        "_meta":{"dev.countersign/idempotency-key":"oidc-1"}}});
    let held = c.post(&call).await;
    assert_eq!(code(&held), "approval_pending", "{held:?}");
    let id = proposal_id(&held);
    // The reviewer sees who asked, and through which client.
    let (ok, shown, err) = review_cli(&gw, &alice, &["show", &id]);
    assert!(ok, "{err}");
    assert!(
        shown.contains("requester  corp:agent-svc via agent-svc (tenant acme)"),
        "{shown}"
    );
    let (ok, _, err) = review_cli(&gw, &alice, &["approve", &id, "--reason", "ok"]);
    assert!(ok, "{err}");
    let ran = c.post(&call).await;
    assert_eq!(ran.last()["result"]["isError"], false, "{ran:?}");
    let again = c.post(&call).await;
    assert_eq!(
        again.last()["result"]["_meta"]["dev.countersign/replayed"]["key"],
        "oidc-1",
        "{again:?}"
    );
    assert_eq!(gw.executions("charge_card"), 1);
    wait_for_audit(
        &gw,
        "the dispatch names the agent and its client",
        |entries| {
            entries.iter().any(|e| {
                e["kind"] == "dispatched"
                    && e["principal"] == "corp:agent-svc"
                    && e["client"] == "agent-svc"
                    && e["tenant"] == "acme"
            })
        },
    )
    .await;
    // A token the provider issued for another resource is refused here.
    let elsewhere = token(idp.port, "https://other.example.com/mcp").await;
    let refused = try_initialize(&gw, &elsewhere).await;
    assert_eq!(refused.status, 401, "{refused:?}");
    assert!(refused.text.contains("another audience"), "{refused:?}");
}

#[tokio::test]
async fn a_provider_that_rotates_its_key_or_goes_down_is_lived_through() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let idp = provider(port, &dir.path().join("k1.json"), "k1");
    let (pdir, _alice) = default_policies_with_alice();
    let gw = gateway(port, pdir.path());
    let resource = format!("{}/mcp/payments", gw.base());
    let first = token(port, &resource).await;
    let c = initialized(&gw, &first).await;
    let read = |id| {
        json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
        "name":"get_balance","arguments":{"account":"a"}}})
    };
    assert!(c.post(&read(1)).await.last()["result"].is_object());
    // The provider goes down: the keys the gateway holds keep working.
    drop(idp);
    let during = initialized(&gw, &first).await;
    assert!(during.post(&read(2)).await.last()["result"].is_object());
    // It comes back with a new key: a token signed with it is taken once the
    // gateway fetches the keys again (an unknown kid, past the refetch
    // interval), with no restart.
    let idp = provider(port, &dir.path().join("k2.json"), "k2");
    let rotated = token(port, &resource).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let a = try_initialize(&gw, &rotated).await;
        if a.status == 200 {
            break;
        }
        assert_eq!(a.status, 401, "{a:?}");
        assert!(
            std::time::Instant::now() < deadline,
            "the new key was never taken: {a:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    drop(idp);
}

/// A person signs in the way MCP clients do: the Python SDK's own OAuth
/// client meets the gateway's 401, finds the provider in the gateway's
/// RFC 9728 metadata, registers itself (RFC 7591) and runs the
/// authorization code grant with PKCE for the server's resource URL; the
/// provider's development login and consent pages are played by the
/// script. Its write is held until a reviewer approves it, runs once and
/// replays; the proposal, the reviewer's view and the audit log name the
/// person and the client the SDK registered. In both wire eras.
#[tokio::test]
async fn a_person_signs_in_with_the_python_sdk_and_their_approved_write_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let idp = provider(free_port(), &dir.path().join("keys.json"), "k1");
    let (pdir, alice) = default_policies_with_alice();
    let gw = gateway_with(
        idp.port,
        pdir.path(),
        "hold = \"60s\"\nprogress_interval = \"300ms\"\n".into(),
    );
    for (mode, version, login) in [
        ("legacy", "2025-11-25", "bob"),
        ("auto", "2026-07-28", "carol"),
    ] {
        let url = gw.url("payments");
        let key = format!("pkce-{mode}");
        let who = format!("corp:{login}");
        let script = tokio::task::spawn_blocking(move || {
            run_peer_script("oauth_client.py", &[&url, mode, login, &key])
        });
        // The held call's proposal, once the SDK has signed in and called.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let proposal = loop {
            let (ok, out, err) = review_cli(&gw, &alice, &["pending", "--json"]);
            assert!(ok, "{err}");
            let listed: Value = serde_json::from_str(&out).unwrap();
            if let Some(p) = listed["proposals"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["requester"] == who.as_str())
            {
                break p.clone();
            }
            assert!(
                !script.is_finished() && std::time::Instant::now() < deadline,
                "{mode}: no proposal of {who}; the SDK: {:?}",
                if script.is_finished() {
                    Some(script.await.unwrap())
                } else {
                    None
                }
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        };
        let id = proposal["id"].as_str().unwrap().to_owned();
        let client_id = proposal["client"]
            .as_str()
            .unwrap_or_else(|| panic!("{mode}: the proposal names no client: {proposal}"))
            .to_owned();
        assert_eq!(proposal["tenant"], "acme", "{mode}: {proposal}");
        let (ok, shown, err) = review_cli(&gw, &alice, &["show", &id]);
        assert!(ok, "{err}");
        assert!(
            shown.contains(&format!("requester  {who} via {client_id} (tenant acme)")),
            "{mode}: {shown}"
        );
        let (ok, out, err) = review_cli(&gw, &alice, &["approve", &id]);
        assert!(ok, "{out}{err}");
        let (ok, out, err) = script.await.unwrap();
        assert!(ok, "{mode}: the SDK failed:\n{out}\n{err}");
        let seen: Value = serde_json::from_str(out.lines().last().unwrap_or("")).unwrap();
        assert_eq!(seen["protocol_version"], version, "{mode}: {seen}");
        // The client the SDK registered is the one the gateway recorded,
        // and the person went through the provider's login and consent.
        assert_eq!(seen["client_id"], client_id.as_str(), "{mode}: {seen}");
        assert_eq!(seen["pages"], json!(["login", "consent"]), "{mode}: {seen}");
        assert_eq!(seen["scope"], "pay:use", "{mode}: {seen}");
        assert_eq!(seen["is_error"], false, "{mode}: {seen}");
        assert!(
            seen["text"]
                .as_str()
                .unwrap()
                .starts_with("charged 9 to acct_7"),
            "{mode}: {seen}"
        );
        assert_eq!(
            seen["again_meta"]["dev.countersign/replayed"]["key"],
            format!("pkce-{mode}"),
            "{mode}: the second call is a replay: {seen}"
        );
        wait_for_audit(
            &gw,
            "the dispatch names the person and the client",
            |entries| {
                entries.iter().any(|e| {
                    e["kind"] == "dispatched"
                        && e["principal"] == who.as_str()
                        && e["client"] == client_id.as_str()
                        && e["tenant"] == "acme"
                })
            },
        )
        .await;
    }
    assert_eq!(gw.executions("charge_card"), 2);
}

/// A provider behind a private CA: the gateway fetches its metadata and
/// keys over HTTPS once the issuer's `tls.ca_file` names the CA that signed
/// its certificate. Without it the fetch fails, the log says which setting
/// to use, and the provider's tokens are refused (fail closed).
#[tokio::test]
async fn a_provider_behind_a_private_ca_is_trusted_through_its_ca_file() {
    let pki = common::pki::Pki::new();
    let (cert, key) = pki.issue("idp", &["localhost"]);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _idp = provider_with(
        port,
        &dir.path().join("keys.json"),
        "k1",
        Some((&cert, &key)),
    );
    let iss = format!("https://localhost:{port}");
    let (pdir, _alice) = default_policies_with_alice();
    let start = |tls: String| {
        Gateway::start_with(Options {
            policies: Some(pdir.path().to_owned()),
            extra: format!(
                "\n[[auth.issuers]]\nname = \"corp\"\nissuer = \"{iss}\"\ntenant_claim = \"tid\"\n{tls}"
            ),
            ..Default::default()
        })
    };
    let http = reqwest::Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(pki.ca_file()).unwrap()).unwrap(),
        )
        .build()
        .unwrap();
    let trusted = start(format!(
        "tls = {{ ca_file = \"{}\" }}\n",
        pki.ca_file().display()
    ));
    let t = token_from(&http, &iss, &format!("{}/mcp/payments", trusted.base())).await;
    let c = initialized(&trusted, &t).await;
    let read = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
        "name":"get_balance","arguments":{"account":"a"}}});
    assert!(c.post(&read).await.last()["result"].is_object());
    let untrusted = start(String::new());
    untrusted
        .wait_for_log("set tls.ca_file of issuer `corp` to the CA that signed it")
        .await;
    let t = token_from(&http, &iss, &format!("{}/mcp/payments", untrusted.base())).await;
    let refused = try_initialize(&untrusted, &t).await;
    assert_eq!(refused.status, 401, "{refused:?}");
    assert!(
        refused.text.contains("no usable key of issuer"),
        "{refused:?}"
    );
}
