//! Delegation (per-user upstream credentials): the caller's access token
//! traded at a real OpenID provider (npm's `oidc-provider`, with RFC 8693
//! token exchange registered through its `registerGrantType`) for a token
//! meant for one upstream, and that upstream a Python MCP SDK server that
//! accepts only exchanged tokens (signature, issuer, audience, expiry,
//! scope, the gateway as actor), recording who each call came from.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::PathBuf;
use std::process::{Command, Stdio};

use common::idp::*;
use common::*;
use serde_json::{json, Value};

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
        grant: Default::default(),
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

/// The service credential the gateway holds for the delegated server (for
/// its own listing): a test looks for it on every call the server records.
const SERVICE_TOKEN: &str = "service-token-s3cret";
const SERVICE_KEY: &str = "svc-key-s3cret";

/// A provider, the SDK server that accepts only exchanged tokens (and the
/// service token, for the gateway's own requests), and a gateway with
/// server `github` delegated to the provider.
struct World {
    dir: tempfile::TempDir,
    /// `None` once a test stopped it.
    idp: Option<Provider>,
    port: u16,
    _server: Killed,
    gw: Gateway,
    /// The reviewer's key.
    alice: PathBuf,
    /// Reviewer policies (kept alive).
    _policies: tempfile::TempDir,
    audience: String,
}

/// How a world is set up.
#[derive(Default)]
struct Setup<'a> {
    /// Environment of the provider's script.
    provider: Vec<(&'a str, &'a str)>,
    /// Lines for `[servers.github.delegation]`.
    delegation: &'a str,
    /// The body of `[approvals]`.
    approvals: Option<&'a str>,
    /// More config; `{url}` stands for the SDK server's URL.
    extra: String,
    /// The gateway's client at the provider, with `private_key_jwt`: the
    /// provider makes the key and writes it there (`client_id`
    /// `countersign-jwt`). Default: `countersign` with its secret.
    key_file: Option<&'a std::path::Path>,
}

impl World {
    async fn start(setup: Setup<'_>) -> World {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys.json");
        let log = dir.path().join("exchanges.log");
        let mut env = vec![("EXCHANGE_LOG", log.to_str().unwrap().to_owned())];
        if let Some(k) = setup.key_file {
            env.push(("CLIENT_KEY_FILE", k.display().to_string()));
        }
        let (client, actor) = match setup.key_file {
            Some(k) => (
                format!(
                    "client_id = \"countersign-jwt\"\nclient_key = \"{}\"\nclient_key_id = \"gw-1\"",
                    k.display()
                ),
                "countersign-jwt",
            ),
            None => (
                "client_id = \"countersign\"\nclient_secret = { env = \"CS_EXCHANGE_SECRET\" }".to_owned(),
                "countersign",
            ),
        };
        env.extend(setup.provider.iter().map(|(k, v)| (*k, v.to_string())));
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let port = free_port();
        let idp = provider_env(port, &keys, "k1", None, &env);
        let up = free_port();
        let audience = format!("http://127.0.0.1:{up}/mcp");
        let record = dir.path().join("record.jsonl");
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/peers/delegated_server.py");
        let server = Killed(
            Command::new(peer_python())
                .arg(script)
                .arg(up.to_string())
                .arg(&keys)
                .arg(issuer(port))
                .arg(&audience)
                .arg(actor)
                .arg(&record)
                .env("SERVICE_TOKEN", SERVICE_TOKEN)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        eventually("the SDK server listens", || {
            std::net::TcpStream::connect(("127.0.0.1", up)).is_ok()
        })
        .await;
        let (policies, alice) = default_policies_with_alice();
        let gw = Gateway::start_with(Options {
            policies: Some(policies.path().to_owned()),
            approvals: setup
                .approvals
                .map(str::to_owned)
                .unwrap_or_else(|| Options::default().approvals),
            gateway_env: vec![("CS_EXCHANGE_SECRET".into(), "exchange-secret".into())],
            extra: format!(
                r#"
[metrics]
token_sha256 = "{metrics}"

[auth]
refetch_interval = "1s"

[[auth.issuers]]
name = "corp"
issuer = "{issuer}"
tenant_claim = "tid"

[servers.github]
url = "{audience}"
call_timeout = "5s"
headers = {{ Authorization = "Bearer {SERVICE_TOKEN}", X-Service-Key = "{SERVICE_KEY}" }}

[servers.github.delegation]
issuer = "corp"
audience = "{audience}"
scopes = ["repo"]
{client}
{delegation}
{extra}"#,
                metrics = sha(METRICS),
                issuer = issuer(port),
                delegation = setup.delegation,
                extra = setup.extra.replace("{url}", &audience),
            ),
            ..Default::default()
        });
        World {
            dir,
            idp: Some(idp),
            port,
            _server: server,
            gw,
            alice,
            _policies: policies,
            audience,
        }
    }

    /// A person's access token for the gateway's `github` endpoint.
    async fn token(&self, who: &str) -> String {
        let resource = self.gw.url("github");
        match who {
            "bob" => token_as(self.port, "agent-bob", "bob-secret", &resource).await,
            _ => token_as(self.port, "agent-svc", "agent-secret", &resource).await,
        }
    }

    /// An initialized handshake-era client with `token`.
    async fn client(&self, token: &str) -> Client {
        let mut c = Client::new(&self.gw.url("github"));
        c.token = token.to_owned();
        c.initialize().await;
        c
    }

    /// The exchanges the provider made (`sub audience scope`).
    fn exchanges(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("exchanges.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The calls the server ran: tool, sub, act, jti, the service header.
    fn record(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("record.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// The scraper's static token.
const METRICS: &str = "tok-metrics-delegation";

/// `tools/call` of `tool` with `args` and idempotency key `key` (if any).
fn call(id: i64, tool: &str, args: Value, key: Option<&str>) -> Value {
    let mut params = json!({ "name": tool, "arguments": args });
    if let Some(k) = key {
        params["_meta"] = json!({ "dev.countersign/idempotency-key": k });
    }
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":params})
}

/// countersign's decision on an answer: in `_meta` (these tools declare
/// an output schema, so it is not in `structuredContent`).
fn decision(a: &Answer) -> Value {
    a.last()["result"]["_meta"]["dev.countersign/decision"].clone()
}

/// Its code.
fn code_of(a: &Answer) -> String {
    decision(a)["code"].as_str().unwrap_or("").to_owned()
}

/// An audit entry as a value (indexing a missing field gives null).
fn v(e: &serde_json::Map<String, Value>) -> Value {
    Value::Object(e.clone())
}

/// The text of a tool result.
fn text(a: &Answer) -> String {
    a.last()["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

#[tokio::test]
async fn two_people_reach_the_server_as_themselves_and_never_with_the_service_credential() {
    let w = World::start(Setup::default()).await;
    let (alice_tok, bob_tok) = (w.token("alice").await, w.token("bob").await);
    let (a, b) = (w.client(&alice_tok).await, w.client(&bob_tok).await);
    let first = a.post(&call(1, "whoami", json!({}), None)).await;
    assert_eq!(first.last()["result"]["isError"], false, "{first:?}");
    assert_eq!(text(&first), "agent-svc", "{first:?}");
    let theirs = b.post(&call(1, "whoami", json!({}), None)).await;
    assert_eq!(text(&theirs), "agent-bob", "{theirs:?}");
    // A second call each reuses the token exchanged for the first.
    let again = a.post(&call(2, "whoami", json!({}), None)).await;
    assert_eq!(text(&again), "agent-svc", "{again:?}");
    b.post(&call(2, "whoami", json!({}), None)).await;
    let exchanges = w.exchanges();
    assert_eq!(
        exchanges,
        vec![
            format!("agent-svc {} repo", w.audience),
            format!("agent-bob {} repo", w.audience)
        ],
        "one exchange per person"
    );
    let record = w.record();
    assert_eq!(record.len(), 4, "{record:#?}");
    for r in &record {
        // The person, with the gateway as the actor; the service
        // credential neither instead of the token nor beside it.
        assert_ne!(r["sub"], "countersign-service", "{r}");
        assert_eq!(r["act"]["sub"], "countersign", "{r}");
        assert!(
            r["x_service_key"].is_null(),
            "the service header went along: {r}"
        );
    }
    let subs: Vec<&str> = record.iter().map(|r| r["sub"].as_str().unwrap()).collect();
    assert_eq!(subs, ["agent-svc", "agent-bob", "agent-svc", "agent-bob"]);
    assert_eq!(record[0]["jti"], record[2]["jti"], "the cached token");
    assert_ne!(record[0]["jti"], record[1]["jti"], "never another person's");
    // The audit log says each read ran delegated, with the token's id and
    // never the token.
    wait_for_audit(&w.gw, "delegated reads", |entries| {
        entries
            .iter()
            .filter(|e| v(e)["tool"] == "whoami" && v(e)["kind"] == "completed")
            .filter(|e| {
                v(e)["delegated"]["issuer"] == "corp"
                    && v(e)["delegated"]["scope"] == "repo"
                    && v(e)["delegated"]["token"]
                        .as_str()
                        .is_some_and(|t| t.starts_with("jti:"))
            })
            .count()
            == 4
    })
    .await;
    let entries = audit_entries(&w.gw.audit_dir());
    let alice_entry = entries
        .iter()
        .find(|e| v(e)["kind"] == "completed" && v(e)["principal"] == "corp:agent-svc")
        .unwrap();
    assert_eq!(v(alice_entry)["delegated"]["subject"], "corp:agent-svc");
    assert_eq!(
        v(alice_entry)["delegated"]["token"],
        format!("jti:{}", record[0]["jti"].as_str().unwrap())
    );
    // A 2026-07-28 client (no session) reaches it as the person too.
    let body = json!({"jsonrpc":"2.0","id":9,"method":"tools/call","params":{
        "name": "whoami", "arguments": {},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {}}}});
    let modern = answer(
        modern_post_as(&w.gw.url("github"), &body, &bob_tok)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(text(&modern), "agent-bob", "{modern:?}");
    let last = w.record().pop().unwrap();
    assert_eq!(last["sub"], "agent-bob");
    assert!(last["x_service_key"].is_null(), "{last}");
    assert_eq!(
        w.exchanges().len(),
        2,
        "bob's cached token, whatever the era"
    );
}

#[tokio::test]
async fn a_held_write_mints_nothing_until_approved_then_once_and_a_denied_one_never() {
    let w = World::start(Setup::default()).await;
    let tok = w.token("alice").await;
    let c = w.client(&tok).await;
    let open = call(
        1,
        "create_issue",
        json!({"title": "flaky test"}),
        Some("issue-1"),
    );
    let held = c.post(&open).await;
    assert_eq!(code_of(&held), "approval_pending", "{held:?}");
    assert!(w.exchanges().is_empty(), "a held call minted a token");
    let id = decision(&held)["proposal_id"].as_str().unwrap().to_owned();
    let (ok, _, err) = review_cli(&w.gw, &w.alice, &["approve", &id, "--reason", "ok"]);
    assert!(ok, "{err}");
    assert!(w.exchanges().is_empty(), "approving alone minted a token");
    let ran = c.post(&open).await;
    assert_eq!(ran.last()["result"]["isError"], false, "{ran:?}");
    assert!(text(&ran).contains("opened by agent-svc"), "{ran:?}");
    assert_eq!(w.exchanges().len(), 1, "exactly one exchange, at dispatch");
    // The replay runs nothing and mints nothing.
    let again = c.post(&open).await;
    assert!(
        again.last()["result"]["_meta"]["dev.countersign/replayed"].is_object(),
        "{again:?}"
    );
    assert_eq!(w.exchanges().len(), 1);
    // A denied write never mints one.
    let other = call(
        2,
        "create_issue",
        json!({"title": "rm -rf"}),
        Some("issue-2"),
    );
    let held = c.post(&other).await;
    let id = decision(&held)["proposal_id"].as_str().unwrap().to_owned();
    let (ok, _, err) = review_cli(&w.gw, &w.alice, &["deny", &id, "--reason", "no"]);
    assert!(ok, "{err}");
    let denied = c.post(&other).await;
    assert_eq!(code_of(&denied), "approval_denied", "{denied:?}");
    assert_eq!(w.exchanges().len(), 1, "a denied call minted a token");
    let issues: Vec<Value> = w
        .record()
        .into_iter()
        .filter(|r| r["tool"] == "create_issue")
        .collect();
    assert_eq!(issues.len(), 1, "{issues:#?}");
    assert_eq!(issues[0]["sub"], "agent-svc");
}

#[tokio::test]
async fn a_cached_token_is_used_until_shortly_before_it_expires_then_exchanged_again() {
    // Exchanged tokens live 3 s, and are exchanged again 2 s before.
    let w = World::start(Setup {
        provider: vec![("EXCHANGE_TTL", "3")],
        delegation: "refresh_before = \"2s\"",
        ..Default::default()
    })
    .await;
    let c = w.client(&w.token("alice").await).await;
    c.post(&call(1, "whoami", json!({}), None)).await;
    c.post(&call(2, "whoami", json!({}), None)).await;
    assert_eq!(w.exchanges().len(), 1, "reused while fresh");
    let record = w.record();
    assert_eq!(record[0]["jti"], record[1]["jti"]);
    // Past its use-by time (1 s after the exchange) the next call
    // exchanges again.
    let mut id = 3;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while w.exchanges().len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "never exchanged again"
        );
        let a = c.post(&call(id, "whoami", json!({}), None)).await;
        assert_eq!(text(&a), "agent-svc", "{a:?}");
        id += 1;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let record = w.record();
    let jtis: std::collections::BTreeSet<&str> =
        record.iter().map(|r| r["jti"].as_str().unwrap()).collect();
    assert_eq!(jtis.len(), 2, "one token per exchange: {record:#?}");
}

#[tokio::test]
async fn a_revoked_or_expired_caller_token_and_a_refused_or_absent_provider_send_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let revoked = dir.path().join("revoked");
    std::fs::write(&revoked, "agent-bob\n").unwrap();
    // Access tokens live 4 s; a held call waits up to 30 s for its review.
    let mut w = World::start(Setup {
        provider: vec![
            ("EXCHANGE_REVOKED", revoked.to_str().unwrap()),
            ("ACCESS_TTL", "4"),
        ],
        approvals: Some("hold = \"30s\"\n"),
        ..Default::default()
    })
    .await;
    // Bob's grant was revoked at the provider: his call is refused there,
    // precisely, and nothing reaches the server.
    let bob = w.client(&w.token("bob").await).await;
    let refused = bob.post(&call(1, "whoami", json!({}), None)).await;
    assert_eq!(code_of(&refused), "upstream_unavailable", "{refused:?}");
    let cs = decision(&refused);
    assert_eq!(cs["reason"], "invalid_grant", "{refused:?}");
    assert_eq!(cs["state"], "not_dispatched", "{refused:?}");
    assert!(text(&refused).contains("did not run"), "{refused:?}");
    assert!(w.record().is_empty(), "{:#?}", w.record());
    // A held write whose caller's token expires before the approval: the
    // call is dispatched after it, and no token is minted from an expired
    // one.
    let tok = w.token("alice").await;
    let exp = claims(&tok)["exp"].as_i64().unwrap() * 1000;
    let c = w.client(&tok).await;
    let held = tokio::spawn({
        let body = call(2, "create_issue", json!({"title": "late"}), Some("late-1"));
        async move { c.post(&body).await }
    });
    wait_for_audit(&w.gw, "the held write's proposal", |entries| {
        entries.iter().any(|e| v(e)["kind"] == "proposal_created")
    })
    .await;
    let id = audit_entries(&w.gw.audit_dir())
        .iter()
        .find(|e| v(e)["kind"] == "proposal_created")
        .and_then(|e| v(e)["proposal_id"].as_str().map(str::to_owned))
        .unwrap();
    eventually("the caller's token expired", || {
        countersign::core::time::now_ms() > exp
    })
    .await;
    let (ok, _, err) = review_cli(&w.gw, &w.alice, &["approve", &id, "--reason", "ok"]);
    assert!(ok, "{err}");
    let late = held.await.unwrap();
    assert_eq!(
        decision(&late)["reason"],
        "caller_token_expired",
        "{late:?}"
    );
    assert_eq!(w.exchanges().len(), 0, "minted from an expired token");
    assert!(w.record().is_empty());
    wait_for_audit(&w.gw, "not_dispatched, delegated", |entries| {
        entries.iter().any(|e| {
            v(e)["kind"] == "not_dispatched"
                && v(e)["delegated"]["refused"] == "caller_token_expired"
        })
    })
    .await;
    // The provider goes away: a fresh caller's exchange cannot be made.
    let fresh = w.token("alice").await;
    let c = w.client(&fresh).await;
    drop(w.idp.take());
    let down = c.post(&call(3, "whoami", json!({}), None)).await;
    assert_eq!(decision(&down)["reason"], "unreachable", "{down:?}");
    assert!(w.record().is_empty());
}

#[tokio::test]
async fn callers_that_cannot_be_delegated_and_tokens_the_server_refuses_never_fall_back_silently() {
    // `fallback_ok` lets callers that cannot be delegated through with the
    // service credential; `elsewhere` trades tokens for another audience,
    // which the server refuses (401).
    let w = World::start(Setup {
        extra: r#"
[servers.fallback_ok]
url = "{url}"
headers = { Authorization = "Bearer service-token-s3cret" }

[servers.fallback_ok.delegation]
issuer = "corp"
audience = "{url}"
scopes = ["repo"]
client_id = "countersign"
client_secret = { env = "CS_EXCHANGE_SECRET" }
fallback = "service"

[servers.elsewhere]
url = "{url}"
headers = { Authorization = "Bearer service-token-s3cret" }

[servers.elsewhere.delegation]
issuer = "corp"
audience = "https://another.example/mcp"
scopes = ["repo"]
client_id = "countersign"
client_secret = { env = "CS_EXCHANGE_SECRET" }
"#
        .into(),
        ..Default::default()
    })
    .await;
    // A static token cannot be traded at the provider: refused before
    // anything is decided, held or sent.
    let mut c = Client::new(&w.gw.url("github"));
    c.initialize().await;
    let refused = c.post(&call(1, "whoami", json!({}), None)).await;
    assert_eq!(code_of(&refused), "delegation_unavailable", "{refused:?}");
    assert_eq!(decision(&refused)["issuer"], "corp", "{refused:?}");
    let write = c
        .post(&call(
            2,
            "create_issue",
            json!({"title": "x"}),
            Some("static-1"),
        ))
        .await;
    assert_eq!(
        code_of(&write),
        "delegation_unavailable",
        "no proposal: {write:?}"
    );
    assert!(w.record().is_empty(), "{:#?}", w.record());
    assert!(w.exchanges().is_empty());
    wait_for_audit(&w.gw, "the refusal", |entries| {
        entries
            .iter()
            .any(|e| v(e)["kind"] == "rejected" && v(e)["reason"] == "delegation_unavailable")
    })
    .await;
    assert!(
        !audit_entries(&w.gw.audit_dir())
            .iter()
            .any(|e| v(e)["kind"] == "proposal_created"),
        "a reviewer was asked about a call that could not run"
    );
    // Where the operator allows it, the same caller goes out with the
    // service credential, as without delegation.
    let mut c = Client::new(&w.gw.url("fallback_ok"));
    c.initialize().await;
    let served = c.post(&call(1, "whoami", json!({}), None)).await;
    assert_eq!(text(&served), "countersign-service", "{served:?}");
    // A token the server refuses (exchanged for another audience) is a
    // precise refusal: the call is not sent again with the service
    // credential.
    let mut c = Client::new(&w.gw.url("elsewhere"));
    c.token = token_as(w.port, "agent-svc", "agent-secret", &w.gw.url("elsewhere")).await;
    c.initialize().await;
    let bounced = c.post(&call(1, "whoami", json!({}), None)).await;
    assert_eq!(code_of(&bounced), "upstream_unavailable", "{bounced:?}");
    assert!(text(&bounced).contains("HTTP 401"), "{bounced:?}");
    let record = w.record();
    assert_eq!(record.len(), 1, "only the fallback call ran: {record:#?}");
    assert_eq!(record[0]["sub"], "countersign-service");
}

#[tokio::test]
async fn no_token_of_any_kind_reaches_the_log_the_audit_log_metrics_or_traces() {
    let rx = common::otlp::Receiver::start("ok");
    let w = World::start(Setup {
        extra: format!(
            "\n[telemetry]\nendpoint = \"{}\"\nexport_interval = \"50ms\"\n",
            rx.endpoint()
        ),
        ..Default::default()
    })
    .await;
    let tok = w.token("alice").await;
    let c = w.client(&tok).await;
    let read = c.post(&call(1, "whoami", json!({}), None)).await;
    assert_eq!(text(&read), "agent-svc", "{read:?}");
    let open = call(2, "create_issue", json!({"title": "t"}), Some("grep-1"));
    let held = c.post(&open).await;
    let id = decision(&held)["proposal_id"].as_str().unwrap().to_owned();
    let (ok, _, err) = review_cli(&w.gw, &w.alice, &["approve", &id, "--reason", "ok"]);
    assert!(ok, "{err}");
    let ran = c.post(&open).await;
    assert_eq!(ran.last()["result"]["isError"], false, "{ran:?}");
    // The trace of the delegated call says so, and only so.
    let spans = rx.wait("a delegated upstream span", |spans| {
        spans
            .iter()
            .filter(|s| s["attributes"]["countersign.delegated"] == true)
            .count()
            >= 2
    });
    let exchanged: Vec<String> = w
        .record()
        .iter()
        .map(|r| r["token"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(exchanged.len(), 2);
    wait_for_audit(&w.gw, "the write's outcome", |entries| {
        entries
            .iter()
            .any(|e| v(e)["kind"] == "completed" && v(e)["tool"] == "create_issue")
    })
    .await;
    let metrics = scrape_metrics(&w.gw, METRICS).await;
    let mut audit = String::new();
    for f in std::fs::read_dir(w.gw.audit_dir()).unwrap() {
        audit.push_str(&String::from_utf8_lossy(
            &std::fs::read(f.unwrap().path()).unwrap(),
        ));
    }
    let traces = serde_json::to_string(&spans).unwrap()
        + &std::fs::read_to_string(rx.out()).unwrap_or_default();
    let log = w.gw.log_text();
    assert!(
        log.contains("exchanged the caller's token"),
        "the log says what happened"
    );
    let secrets = [
        ("the caller's token", tok.as_str()),
        ("the exchange secret", "exchange-secret"),
        ("the service token", SERVICE_TOKEN),
        ("the service key", SERVICE_KEY),
    ];
    let exchanged = exchanged.iter().map(|t| ("an exchanged token", t.as_str()));
    for (what, secret) in secrets.into_iter().chain(exchanged) {
        // Also a token's signature alone (the part no claim repeats).
        let signature = secret.rsplit('.').next().unwrap();
        for (place, text) in [
            ("the log", &log),
            ("the audit log", &audit),
            ("/metrics", &metrics),
            ("the traces", &traces),
        ] {
            assert!(!text.contains(secret), "{what} is in {place}");
            assert!(
                signature.len() < 16 || !text.contains(signature),
                "{what}'s signature is in {place}"
            );
        }
    }
}

#[tokio::test]
async fn the_gateway_can_authenticate_its_exchanges_with_a_private_key_instead_of_a_secret() {
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("client.pem");
    let w = World::start(Setup {
        key_file: Some(&key),
        ..Default::default()
    })
    .await;
    let c = w.client(&w.token("alice").await).await;
    let read = c.post(&call(1, "whoami", json!({}), None)).await;
    assert_eq!(text(&read), "agent-svc", "{read:?}");
    let record = w.record();
    assert_eq!(record[0]["act"]["sub"], "countersign-jwt", "{record:#?}");
    assert_eq!(w.exchanges().len(), 1);
}

/// F1 (second attack): the exchanged-token cache had no tenant in its key.
/// A person who called as acme, then as globex, reached the upstream with
/// the token exchanged from their acme token: the globex call acted in
/// acme. Now each (tenant, caller token) has its own exchange: the upstream
/// sees the globex call with a token of tenant globex, and acme's own
/// token is still reused for acme.
#[tokio::test]
async fn f1_a_token_exchanged_for_one_tenant_is_never_used_in_another() {
    let w = World::start(Setup::default()).await;
    let resource = w.gw.url("github");
    let acme = w.client(&w.token("alice").await).await;
    let globex = w.client(&globex_token(w.port, &resource).await).await;
    for (c, id) in [(&acme, 1), (&globex, 1), (&acme, 2)] {
        let a = c.post(&call(id, "whoami", json!({}), None)).await;
        assert_eq!(text(&a), "agent-svc", "{a:?}");
    }
    assert_eq!(
        w.exchanges(),
        vec![format!("agent-svc {} repo", w.audience); 2],
        "one exchange per tenant"
    );
    let record = w.record();
    let tids: Vec<&str> = record.iter().map(|r| r["tid"].as_str().unwrap()).collect();
    assert_eq!(tids, ["acme", "globex", "acme"], "{record:#?}");
    assert_ne!(record[0]["jti"], record[1]["jti"], "{record:#?}");
    assert_eq!(record[0]["jti"], record[2]["jti"], "acme's cached token");
}
