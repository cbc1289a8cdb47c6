//! Access tokens of identity providers, against the real gateway: RFC 9728
//! metadata and challenges, every refusal with its status and nothing sent
//! upstream, key rotation without a restart, and principals namespaced by
//! their issuer. The tokens are signed here with keys made for the test and
//! published to the gateway as JWKS files (`jwks_file`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};

use base64::Engine;
use common::*;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

const ISS_A: &str = "https://idp-a.example.com";
const ISS_B: &str = "https://idp-b.example.com";
const AUD: &str = "countersign-test";

/// A P-256 signing key and its public JWK.
struct Key {
    kid: String,
    encoding: EncodingKey,
    jwk: Value,
}

fn key(kid: &str) -> Key {
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let raw = pair.public_key_raw();
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    Key {
        kid: kid.into(),
        encoding: EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap(),
        jwk: json!({
            "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
            "x": b64.encode(&raw[1..33]), "y": b64.encode(&raw[33..65]),
        }),
    }
}

fn publish(path: &Path, keys: &[&Key]) {
    let set = json!({ "keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>() });
    // Written whole, then renamed: the gateway never reads half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, set.to_string()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn claims(iss: &str, sub: &str) -> Value {
    json!({
        "iss": iss, "aud": AUD, "sub": sub, "tid": "acme",
        "exp": now() + 600, "iat": now() - 5,
        "scope": "pay:use", "azp": "claude-code",
    })
}

fn sign(k: &Key, claims: &Value) -> String {
    let mut h = Header::new(Algorithm::ES256);
    h.kid = Some(k.kid.clone());
    h.typ = Some("at+jwt".into());
    jsonwebtoken::encode(&h, claims, &k.encoding).unwrap()
}

struct Setup {
    gw: Gateway,
    jwks_a: PathBuf,
    _dir: tempfile::TempDir,
}

/// A gateway with two issuers, `a` and `b`, whose keys are `a` and `b`.
fn start(a: &Key, b: &Key) -> Setup {
    start_with(a, b, None)
}

/// The same, with the policies of `policies` (default: permit everything).
fn start_with(a: &Key, b: &Key, policies: Option<&Path>) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let jwks_a = dir.path().join("a.jwks");
    let jwks_b = dir.path().join("b.jwks");
    publish(&jwks_a, &[a]);
    publish(&jwks_b, &[b]);
    let issuer = |name: &str, iss: &str, file: &Path| {
        format!(
            "\n[[auth.issuers]]\nname = \"{name}\"\nissuer = \"{iss}\"\njwks_file = \"{}\"\n\
             audience = [\"{AUD}\"]\ntenant_claim = \"tid\"\nscopes = {{ payments = [\"pay:use\"] }}\n",
            file.display()
        )
    };
    let gw = Gateway::start_with(Options {
        extra: format!(
            "\n[auth]\nrefetch_interval = \"1s\"\n{}{}",
            issuer("a", ISS_A, &jwks_a),
            issuer("b", ISS_B, &jwks_b)
        ),
        policies: policies.map(Path::to_owned),
        ..Default::default()
    });
    Setup {
        gw,
        jwks_a,
        _dir: dir,
    }
}

fn client(gw: &Gateway, token: &str) -> Client {
    let mut c = Client::new(&gw.url("payments"));
    c.token = token.to_owned();
    c
}

/// POST `initialize` with `token`: the status and the `WWW-Authenticate`.
async fn try_initialize(gw: &Gateway, token: Option<&str>) -> (u16, Option<String>, String) {
    let mut req = reqwest::Client::new()
        .post(gw.url("payments"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(
            json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
                "protocolVersion":"2025-06-18","capabilities":{},
                "clientInfo":{"name":"t","version":"0"}}})
            .to_string(),
        );
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.unwrap();
    let challenge = resp
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_owned());
    (
        resp.status().as_u16(),
        challenge,
        resp.text().await.unwrap(),
    )
}

/// Send `initialize` with `token` until the gateway takes it (it fetches an
/// issuer's keys again at most once per `refetch_interval`); panic after 10 s.
async fn accepted_within_10s(gw: &Gateway, token: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (status, _, body) = try_initialize(gw, Some(token)).await;
        if status == 200 {
            return;
        }
        assert_eq!(status, 401, "{body}");
        assert!(
            std::time::Instant::now() < deadline,
            "never accepted: {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn metadata_and_challenges_tell_a_client_where_to_sign_in() {
    let (a, b) = (key("a1"), key("b1"));
    let s = start(&a, &b);
    let text = reqwest::get(format!(
        "{}/.well-known/oauth-protected-resource/mcp/payments",
        s.gw.base()
    ))
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    let meta: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(meta["resource"], format!("{}/mcp/payments", s.gw.base()));
    assert_eq!(meta["authorization_servers"], json!([ISS_A, ISS_B]));
    assert_eq!(meta["scopes_supported"], json!(["pay:use"]));
    let (status, challenge, _) = try_initialize(&s.gw, None).await;
    assert_eq!(status, 401);
    assert_eq!(
        challenge.unwrap(),
        format!(
            "Bearer resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp/payments\"",
            s.gw.base()
        )
    );
}

#[tokio::test]
async fn a_valid_token_acts_as_its_user_and_client() {
    let (a, b) = (key("a1"), key("b1"));
    let s = start(&a, &b);
    let mut c = client(&s.gw, &sign(&a, &claims(ISS_A, "alice")));
    c.initialize().await;
    let answer = c.call(1, "get_balance", json!({"account": "a"})).await;
    assert!(answer.last()["result"].is_object(), "{answer:?}");
    wait_for_audit(
        &s.gw,
        "the call's entries name the user and client",
        |entries| {
            entries.iter().any(|e| {
                e["kind"] == "completed"
                    && e["principal"] == "a:alice"
                    && e["tenant"] == "acme"
                    && e["client"] == "claude-code"
            })
        },
    )
    .await;
    // The static token still works beside the issuers.
    let mut st = Client::new(&s.gw.url("payments"));
    st.initialize().await;
    let answer = st.call(2, "get_balance", json!({"account": "a"})).await;
    assert!(answer.last()["result"].is_object(), "{answer:?}");
}

#[tokio::test]
async fn refused_tokens_get_a_precise_401_or_403_and_nothing_runs() {
    let (a, b) = (key("a1"), key("b1"));
    let s = start(&a, &b);
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut cases: Vec<(&str, String, u16, &str)> = Vec::new();
    let mut c = claims(ISS_A, "alice");
    c["aud"] = json!("https://elsewhere.example.com");
    cases.push(("wrong audience", sign(&a, &c), 401, "another audience"));
    let mut c = claims(ISS_A, "alice");
    c["exp"] = json!(now() - 120);
    cases.push(("expired", sign(&a, &c), 401, "expired"));
    cases.push((
        "another issuer's key",
        sign(&b, &claims(ISS_A, "alice")),
        401,
        "no key `b1`",
    ));
    cases.push((
        "unknown issuer",
        sign(&a, &claims("https://evil.example.com", "alice")),
        401,
        "not one this gateway accepts",
    ));
    let none = format!(
        "{}.{}.",
        b64.encode(json!({"alg":"none","typ":"at+jwt","kid":"a1"}).to_string()),
        b64.encode(claims(ISS_A, "alice").to_string())
    );
    cases.push(("alg none", none, 401, "algorithm `none`"));
    let mut h = Header::new(Algorithm::HS256);
    h.kid = Some("a1".into());
    h.typ = Some("at+jwt".into());
    let hs = jsonwebtoken::encode(
        &h,
        &claims(ISS_A, "alice"),
        &EncodingKey::from_secret(a.jwk.to_string().as_bytes()),
    )
    .unwrap();
    cases.push(("HS256 with the public key", hs, 401, "algorithm `HS256`"));
    let mut c = claims(ISS_A, "alice");
    c.as_object_mut().unwrap().remove("tid");
    cases.push(("no tenant claim", sign(&a, &c), 403, "`tid` claim"));
    let mut c = claims(ISS_A, "alice");
    c["scope"] = json!("other");
    cases.push(("missing scope", sign(&a, &c), 403, "scope `pay:use`"));
    for (what, token, want, says) in cases {
        let (status, challenge, body) = try_initialize(&s.gw, Some(&token)).await;
        assert_eq!(status, want, "{what}: {body}");
        assert!(body.contains(says), "{what}: {body}");
        let challenge = challenge.unwrap_or_default();
        assert!(
            challenge.contains("resource_metadata="),
            "{what}: {challenge}"
        );
        if want == 403 && what == "missing scope" {
            assert!(
                challenge.contains("error=\"insufficient_scope\"")
                    && challenge.contains("scope=\"pay:use\""),
                "{challenge}"
            );
        } else {
            assert!(
                challenge.contains("error=\"invalid_token\""),
                "{what}: {challenge}"
            );
        }
    }
    // A refused token's write never reaches the server.
    let mut c = claims(ISS_A, "alice");
    c["exp"] = json!(now() - 120);
    let mut stale = client(&s.gw, &sign(&a, &c));
    stale.session = None;
    let answer = stale
        .post(
            &json!({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{
            "name":"charge_card","arguments":{"account":"a","amount":5},
            "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}),
        )
        .await;
    assert_eq!(answer.status, 401, "{answer:?}");
    assert_eq!(s.gw.executions("charge_card"), 0);
}

#[tokio::test]
async fn a_rotated_key_is_taken_without_a_restart() {
    let (a, b) = (key("a1"), key("b1"));
    let s = start(&a, &b);
    let next = key("a2");
    let (status, _, body) =
        try_initialize(&s.gw, Some(&sign(&next, &claims(ISS_A, "alice")))).await;
    assert_eq!(status, 401, "not published yet: {body}");
    publish(&s.jwks_a, &[&a, &next]);
    // Fetched again on the next token naming the new kid, once the
    // refetch interval (1 s) since the last fetch has passed.
    let token = sign(&next, &claims(ISS_A, "alice"));
    accepted_within_10s(&s.gw, &token).await;
    s.gw.wait_for_log("issuer keys loaded").await;
}

#[tokio::test]
async fn the_same_subject_of_two_issuers_is_two_principals() {
    let (a, b) = (key("a1"), key("b1"));
    let s = start(&a, &b);
    let call = |id| {
        json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
            "name":"charge_card","arguments":{"account":"a","amount":7},
            "_meta":{"dev.countersign/idempotency-key":"same-key"}}})
    };
    let mut from_a = client(&s.gw, &sign(&a, &claims(ISS_A, "alice")));
    from_a.initialize().await;
    let first = from_a.post(&call(1)).await;
    assert!(first.last()["result"].is_object(), "{first:?}");
    let mut from_b = client(&s.gw, &sign(&b, &claims(ISS_B, "alice")));
    from_b.initialize().await;
    let second = from_b.post(&call(2)).await;
    // Not a replay of a:alice's answer: b:alice's own call ran.
    assert!(
        second.last()["result"]["_meta"]["dev.countersign/replayed"].is_null(),
        "{second:?}"
    );
    assert_eq!(s.gw.executions("charge_card"), 2);
    // And a:alice's retry is a replay of her own.
    let again = from_a.post(&call(3)).await;
    assert_eq!(
        again.last()["result"]["_meta"]["dev.countersign/replayed"]["key"],
        "same-key",
        "{again:?}"
    );
    assert_eq!(s.gw.executions("charge_card"), 2);
}

/// An approval binds the principal, and `a:sam` and `b:sam` are two: the
/// write a reviewer approved for one stays held for the other, with a
/// proposal of its own, while the one it was approved for runs, once.
#[tokio::test]
async fn the_same_subject_of_two_issuers_cannot_use_each_others_approval() {
    let (a, b) = (key("a1"), key("b1"));
    let (pdir, reviewer) = default_policies_with_alice();
    let s = start_with(&a, &b, Some(pdir.path()));
    let call = |id| {
        json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
            "name":"charge_card","arguments":{"account":"a","amount":7},
            "_meta":{"dev.countersign/idempotency-key":"approved-once"}}})
    };
    let mut from_a = client(&s.gw, &sign(&a, &claims(ISS_A, "sam")));
    from_a.initialize().await;
    let held = from_a.post(&call(1)).await;
    assert_eq!(code(&held), "approval_pending", "{held:?}");
    let approved = proposal_id(&held);
    let (ok, out, err) = review_cli(&s.gw, &reviewer, &["approve", &approved]);
    assert!(ok, "{out}{err}");
    // b:sam sends the very same call, with the same key: not approved.
    let mut from_b = client(&s.gw, &sign(&b, &claims(ISS_B, "sam")));
    from_b.initialize().await;
    let other = from_b.post(&call(2)).await;
    assert_eq!(code(&other), "approval_pending", "{other:?}");
    let own = proposal_id(&other);
    assert_ne!(own, approved, "b:sam got a:sam's proposal");
    assert_eq!(s.gw.executions("charge_card"), 0);
    // a:sam's approved call runs; b:sam's is still held after that.
    let ran = from_a.post(&call(3)).await;
    assert_eq!(ran.last()["result"]["isError"], false, "{ran:?}");
    let still = from_b.post(&call(4)).await;
    assert_eq!(code(&still), "approval_pending", "{still:?}");
    assert_eq!(s.gw.executions("charge_card"), 1);
    let (ok, shown, err) = review_cli(&s.gw, &reviewer, &["show", &own]);
    assert!(ok, "{err}");
    assert!(
        shown.contains("requester  b:sam via claude-code (tenant acme)"),
        "{shown}"
    );
}

#[tokio::test]
async fn keys_of_a_provider_that_is_down_keep_working_and_a_new_kid_waits_for_it() {
    let (a, b) = (key("a1"), key("b1"));
    let s = start(&a, &b);
    let (status, _, body) = try_initialize(&s.gw, Some(&sign(&a, &claims(ISS_A, "alice")))).await;
    assert_eq!(status, 200, "{body}");
    // The provider goes away: its keys can no longer be fetched.
    std::fs::remove_file(&s.jwks_a).unwrap();
    // A token the gateway has never seen, signed with a cached key, is
    // checked against the cached keys and accepted.
    let fresh = sign(&a, &claims(ISS_A, "bob"));
    let (status, _, body) = try_initialize(&s.gw, Some(&fresh)).await;
    assert_eq!(status, 200, "cached keys stay in use: {body}");
    // A new kid cannot be fetched while it is down: refused, every time,
    // with the reason, and the log says the fetch failed.
    let next = key("a2");
    let rotated = sign(&next, &claims(ISS_A, "alice"));
    let fetch_failed = || {
        s.gw.log
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("could not be fetched"))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (status, _, body) = try_initialize(&s.gw, Some(&rotated)).await;
        assert_eq!(status, 401, "{body}");
        assert!(body.contains("no key `a2`"), "{body}");
        // Refused before and after the gateway tried the provider again.
        if fetch_failed() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the gateway never asked again"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // Back, with the new key: taken (after the refetch interval).
    publish(&s.jwks_a, &[&a, &next]);
    accepted_within_10s(&s.gw, &rotated).await;
}

/// POST `initialize` to `path` (a path the client chose) without a token:
/// the status and every `WWW-Authenticate` value.
async fn challenges_at(gw: &Gateway, path: &str) -> (u16, Vec<String>) {
    let resp = reqwest::Client::new()
        .post(format!("{}{path}", gw.base()))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    let all = resp
        .headers()
        .get_all("www-authenticate")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    (resp.status().as_u16(), all)
}

#[tokio::test]
async fn a_crafted_server_name_cannot_add_a_resource_metadata_to_the_challenge() {
    let (a, b) = (key("a1"), key("b1"));
    let s = start(&a, &b);
    let (status, all) = challenges_at(
        &s.gw,
        "/mcp/x%22,%20resource_metadata=%22http:%2f%2fevil.example",
    )
    .await;
    assert_eq!(status, 401);
    assert_eq!(all.len(), 1, "{all:?}");
    let challenge = &all[0];
    assert_eq!(
        challenge.matches("resource_metadata=").count(),
        1,
        "{challenge}"
    );
    assert!(!challenge.contains("evil.example"), "{challenge}");
    // An unknown server gets the gateway's own metadata.
    assert_eq!(
        challenge,
        &format!(
            "Bearer resource_metadata=\"{}/.well-known/oauth-protected-resource\"",
            s.gw.base()
        )
    );
}

#[tokio::test]
async fn a_token_with_a_crit_header_is_refused_with_401_and_nothing_runs() {
    let (a, b) = (key("a1"), key("b1"));
    let s = start(&a, &b);
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = json!({"alg":"ES256","typ":"at+jwt","kid":"a1","crit":["b64"],"b64":false});
    let input = format!(
        "{}.{}",
        b64.encode(header.to_string()),
        b64.encode(claims(ISS_A, "alice").to_string())
    );
    let sig = jsonwebtoken::crypto::sign(input.as_bytes(), &a.encoding, Algorithm::ES256).unwrap();
    let token = format!("{input}.{sig}");
    let (status, challenge, body) = try_initialize(&s.gw, Some(&token)).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("`crit`"), "{body}");
    assert!(challenge.unwrap().contains("error=\"invalid_token\""));
    let mut c = client(&s.gw, &token);
    c.session = None;
    let call = c
        .post(
            &json!({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{
            "name":"charge_card","arguments":{"account":"a","amount":5},
            "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}),
        )
        .await;
    assert_eq!(call.status, 401, "{call:?}");
    assert_eq!(s.gw.executions("charge_card"), 0);
}

#[tokio::test]
async fn an_issuer_speaks_only_for_its_tenants_and_a_shared_kid_locks_nobody_out() {
    // Both providers publish a key named `k1`: each token is checked with
    // the keys of the issuer its `iss` names.
    let (a, b) = (key("k1"), key("k1"));
    let dir = tempfile::tempdir().unwrap();
    let (jwks_a, jwks_b) = (dir.path().join("a.jwks"), dir.path().join("b.jwks"));
    publish(&jwks_a, &[&a]);
    publish(&jwks_b, &[&b]);
    let issuer = |name: &str, iss: &str, file: &Path, tenants: &str| {
        format!(
            "\n[[auth.issuers]]\nname = \"{name}\"\nissuer = \"{iss}\"\njwks_file = \"{}\"\n\
             audience = [\"{AUD}\"]\ntenant_claim = \"tid\"\ntenants = {tenants}\n",
            file.display()
        )
    };
    let gw = Gateway::start_with(Options {
        extra: format!(
            "{}{}",
            issuer("a", ISS_A, &jwks_a, "[\"acme\"]"),
            issuer("b", ISS_B, &jwks_b, "[\"globex\"]")
        ),
        ..Default::default()
    });
    let (status, _, body) = try_initialize(&gw, Some(&sign(&a, &claims(ISS_A, "alice")))).await;
    assert_eq!(status, 200, "issuer a, tenant acme: {body}");
    let mut globex = claims(ISS_B, "bob");
    globex["tid"] = json!("globex");
    let (status, _, body) = try_initialize(&gw, Some(&sign(&b, &globex))).await;
    assert_eq!(status, 200, "issuer b, same kid, tenant globex: {body}");
    // Issuer b may not mint a token for acme, though its key signed it.
    let (status, challenge, body) =
        try_initialize(&gw, Some(&sign(&b, &claims(ISS_B, "mallory")))).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body.contains("issuer `b` may not issue tokens for tenant `acme`"),
        "{body}"
    );
    assert!(challenge.unwrap().contains("invalid_token"));
    // The overlap is logged, once the second issuer's keys are loaded.
    gw.wait_for_log("is published by issuers").await;
}

#[tokio::test]
async fn pending_shows_an_oauth_clients_name_as_text_not_terminal_codes() {
    let (a, b) = (key("a1"), key("b1"));
    let (pdir, alice_key) = default_policies_with_alice();
    let s = start_with(&a, &b, Some(pdir.path()));
    let mut c = claims(ISS_A, "sam");
    c["azp"] = json!("claude\u{1b}[2J\u{1b}[H\u{202e}edoc");
    let mut agent = client(&s.gw, &sign(&a, &c));
    agent.initialize().await;
    let held = agent
        .call(1, "charge_card", json!({"account":"a","amount":7}))
        .await;
    assert_eq!(code(&held), "approval_pending", "{held:?}");
    let (ok, list, err) = review_cli(&s.gw, &alice_key, &["pending"]);
    assert!(ok, "{err}");
    assert!(
        !list
            .chars()
            .any(|ch| (ch != '\n' && ch.is_control()) || ch == '\u{202e}'),
        "{list}"
    );
    assert!(
        list.contains(r"a:sam via claude\u{1b}[2J\u{1b}[H\u{202e}edoc"),
        "{list}"
    );
}

/// A JWKS endpoint on 127.0.0.1 that counts the fetches it answers; its
/// keys can be changed while it runs.
struct JwksServer {
    port: u16,
    keys: std::sync::Arc<std::sync::Mutex<String>>,
    fetches: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl JwksServer {
    async fn start(keys: &[&Key]) -> JwksServer {
        use std::sync::atomic::Ordering;
        let set = |keys: &[&Key]| {
            json!({ "keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>() }).to_string()
        };
        let held = std::sync::Arc::new(std::sync::Mutex::new(set(keys)));
        let fetches = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (h, f) = (held.clone(), fetches.clone());
        let app = axum::Router::new().route(
            "/jwks",
            axum::routing::get(move || {
                let (h, f) = (h.clone(), f.clone());
                async move {
                    f.fetch_add(1, Ordering::SeqCst);
                    h.lock().unwrap().clone()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        JwksServer {
            port,
            keys: held,
            fetches,
            task,
        }
    }

    fn publish(&self, keys: &[&Key]) {
        *self.keys.lock().unwrap() =
            json!({ "keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>() }).to_string();
    }

    fn fetches(&self) -> usize {
        self.fetches.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A gateway whose issuer `a` publishes its keys at `jwks`, with the
/// default `refetch_interval` (30 s).
fn with_jwks_uri(jwks: &JwksServer) -> Gateway {
    Gateway::start_with(Options {
        extra: format!(
            "\n[[auth.issuers]]\nname = \"a\"\nissuer = \"{ISS_A}\"\njwks_uri = \"http://127.0.0.1:{}/jwks\"\n\
             audience = [\"{AUD}\"]\ntenant_claim = \"tid\"\n",
            jwks.port
        ),
        ..Default::default()
    })
}

// The JWKS server runs on the test's runtime while the gateway starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_rotated_right_after_start_is_taken_on_its_first_use() {
    let old = key("old");
    let jwks = JwksServer::start(&[&old]).await;
    let gw = with_jwks_uri(&jwks);
    gw.wait_for_log("issuer keys loaded").await;
    assert_eq!(jwks.fetches(), 1, "the start-up fetch");
    // The provider rotates and signs with the new key at once.
    let new = key("new");
    jwks.publish(&[&old, &new]);
    let (status, _, body) = try_initialize(&gw, Some(&sign(&new, &claims(ISS_A, "alice")))).await;
    assert_eq!(status, 200, "the first token under the new key: {body}");
    assert_eq!(jwks.fetches(), 2);
}

// The JWKS server runs on the test's runtime while the gateway starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_made_up_kids_makes_at_most_one_fetch_per_interval() {
    let real = key("real");
    let jwks = JwksServer::start(&[&real]).await;
    let gw = with_jwks_uri(&jwks);
    gw.wait_for_log("issuer keys loaded").await;
    let forged = key("forged");
    let client = reqwest::Client::new();
    let sends = (0..1000).map(|i| {
        let k = Key {
            kid: format!("random-{i}-{:x}", rand::random::<u64>()),
            encoding: forged.encoding.clone(),
            jwk: json!({}),
        };
        let token = sign(&k, &claims(ISS_A, "mallory"));
        let url = gw.url("payments");
        let client = client.clone();
        async move {
            client
                .post(url)
                .bearer_auth(token)
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    });
    let statuses = futures_util::future::join_all(sends).await;
    assert!(statuses.iter().all(|s| *s == 401), "{statuses:?}");
    // The start-up fetch, and one for the first unknown kid: the other 999
    // find it made within the interval.
    assert_eq!(jwks.fetches(), 2);
    // The real key still works, from the cache.
    let (status, _, body) = try_initialize(&gw, Some(&sign(&real, &claims(ISS_A, "alice")))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(jwks.fetches(), 2);
}

/// A request refused before its body is read to its end is answered with
/// `Connection: close`: hyper closes such a connection after the answer, and
/// a client that reused it (the OAuth discovery right after a 401) would
/// meet a closing socket.
#[tokio::test]
async fn a_refusal_before_the_body_is_read_closes_the_connection() {
    let gw = common::Gateway::start();
    let resp = reqwest::Client::new()
        .post(gw.url("payments"))
        .header("Accept", "application/json, text/event-stream")
        .header("Content-Type", "application/json")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(
        resp.headers()
            .get("connection")
            .map(|v| v.to_str().unwrap()),
        Some("close")
    );
    // A body cut off at `limits.max_body_bytes` (64 KiB here) is not read
    // to its end either; just over it, so the rest fits the socket's
    // buffers and the client reads the answer.
    let resp = reqwest::Client::new()
        .post(gw.url("payments"))
        .bearer_auth(common::TOKEN)
        .header("Accept", "application/json, text/event-stream")
        .header("Content-Type", "application/json")
        .body(format!(r#"{{"pad":"{}"}}"#, "x".repeat(70_000)))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    assert_eq!(
        resp.headers()
            .get("connection")
            .map(|v| v.to_str().unwrap()),
        Some("close")
    );
}
