//! Identity providers as the gateway calls them: their HTTP client (with
//! the issuer's own TLS settings) and their metadata (OpenID Connect
//! discovery, then RFC 8414), for the keys that verify callers' tokens and
//! for the token endpoint where delegation trades them.

use std::time::Duration;

use serde_json::Value;

use super::tls::TlsError;
use crate::core::config::IssuerConfig;

/// The HTTP client for one provider: its TLS settings, a time limit, and no
/// redirects (a redirect could lead a key fetch off the provider's host).
pub(crate) fn http_client(c: &IssuerConfig) -> Result<reqwest::Client, TlsError> {
    let tls = super::tls::issuer_config(&c.name, c.tls.as_ref())?;
    super::tls::http_client(
        tls,
        Duration::from_secs(10),
        &format!("identity provider `{}`", c.name),
    )
}

/// The issuer's metadata document and where it was found: OpenID Connect
/// discovery, then RFC 8414. It must name the same issuer (a provider may
/// not speak for another).
pub(crate) async fn metadata(
    http: &reqwest::Client,
    cfg: &IssuerConfig,
) -> Result<(String, Value), String> {
    let issuer = cfg.issuer.as_str();
    let base = issuer.trim_end_matches('/');
    let (scheme_host, path) = match base.find("://").map(|i| i + 3) {
        Some(i) => match base[i..].find('/') {
            Some(j) => (&base[..i + j], &base[i + j..]),
            None => (base, ""),
        },
        None => return Err(format!("issuer `{issuer}` is not a URL")),
    };
    let candidates = [
        format!("{base}/.well-known/openid-configuration"),
        format!("{scheme_host}/.well-known/oauth-authorization-server{path}"),
    ];
    let mut last = String::new();
    for url in candidates {
        let text = match get(http, &cfg.name, &url).await {
            Ok(t) => t,
            Err(e) => {
                last = e;
                continue;
            }
        };
        let meta: Value =
            serde_json::from_str(&text).map_err(|e| format!("{url} is not JSON metadata: {e}"))?;
        if meta.get("issuer").and_then(Value::as_str) != Some(issuer) {
            return Err(format!("{url} names another issuer than `{issuer}`"));
        }
        return Ok((url, meta));
    }
    Err(format!("no metadata for issuer `{issuer}` ({last})"))
}

/// GET `url` from the provider `name`. A failure is worded with its causes
/// (reqwest's own message stops at "error sending request"), and a
/// certificate no trusted CA signed says which setting to use.
pub(crate) async fn get(http: &reqwest::Client, name: &str, url: &str) -> Result<String, String> {
    let resp = http
        .get(url)
        .header("accept", "application/json")
        .send()
        .await
        .map_err(|e| {
            let mut text = super::error_chain(&e);
            if text.contains("UnknownIssuer") {
                text.push_str(&format!(
                    " (the provider's certificate is not signed by a trusted CA: set tls.ca_file of issuer `{name}` to the CA that signed it)"
                ));
            }
            format!("GET {url}: {text}")
        })?;
    if !resp.status().is_success() {
        return Err(format!("GET {url}: {}", resp.status()));
    }
    resp.text().await.map_err(|e| format!("GET {url}: {e}"))
}
