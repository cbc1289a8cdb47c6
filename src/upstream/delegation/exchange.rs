//! One RFC 8693 token exchange at a provider's token endpoint: the caller's
//! access token as the subject token, the upstream as the audience, the
//! gateway authenticated as its own OAuth client (`client_secret_basic`, or
//! `private_key_jwt`).

use std::time::Duration;

use base64::Engine;
use serde::Deserialize;
use sha2::Digest;

/// RFC 8693 section 2.1.
const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
/// RFC 8693 section 3.
const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";
/// RFC 7523 section 2.1: the grant of Microsoft Entra ID's on-behalf-of.
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

pub use crate::core::config::Grant;

/// How to exchange tokens for one upstream.
#[derive(Clone)]
pub struct Exchange {
    /// The provider's token endpoint (from its metadata).
    pub token_endpoint: String,
    /// The gateway's OAuth client at the provider.
    pub client_id: String,
    /// How it authenticates.
    pub client_auth: ClientAuth,
    /// The upstream the token is for (`audience`).
    pub audience: String,
    /// The scopes the upstream needs, and no more.
    pub scopes: Vec<String>,
    /// The gateway's own token, sent as `actor_token` when the provider
    /// wants the actor named.
    pub actor_token: Option<String>,
    /// How long the provider may take.
    pub timeout: Duration,
    /// RFC 8693, or Entra ID's on-behalf-of.
    pub grant: Grant,
}

impl std::fmt::Debug for Exchange {
    // The secret and the actor token stay out of every Debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exchange")
            .field("token_endpoint", &self.token_endpoint)
            .field("client_id", &self.client_id)
            .field("audience", &self.audience)
            .field("scopes", &self.scopes)
            .finish_non_exhaustive()
    }
}

/// How the gateway's client authenticates at the token endpoint.
#[derive(Clone)]
pub enum ClientAuth {
    /// `client_secret_basic` (RFC 6749 section 2.3.1).
    Secret(String),
    /// `private_key_jwt` (RFC 7523).
    Key(super::assertion::Signer),
}

/// An exchanged token.
#[derive(Clone)]
pub struct Exchanged {
    /// The token to send upstream as `Authorization: Bearer`.
    pub access_token: String,
    /// When it expires (unix ms): from `expires_in`, else from its `exp`
    /// claim when it is a JWT; `None` when neither says.
    pub expires_at_ms: Option<i64>,
    /// The scopes granted (`scope`), when the provider said.
    pub scope: Option<String>,
    /// What may be recorded of it: its `jti`, or its SHA-256.
    pub id: String,
}

impl std::fmt::Debug for Exchanged {
    // Never the token itself.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exchanged")
            .field("id", &self.id)
            .field("expires_at_ms", &self.expires_at_ms)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl Exchanged {
    /// What the audit log may record of this token: its id (`jti` or a
    /// digest) and its scopes.
    pub fn evidence(&self) -> serde_json::Value {
        serde_json::json!({"token": self.id, "scope": self.scope})
    }
}

/// Why an exchange gave no token. None of them carries a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExchangeError {
    /// The provider refused (RFC 6749 section 5.2: `invalid_grant`,
    /// `unauthorized_client`, `invalid_target`, ...).
    #[error("the identity provider refused the token exchange: {error}{}", description.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Refused {
        error: String,
        description: Option<String>,
    },
    /// The provider could not be reached, or did not answer in time.
    #[error("the identity provider's token endpoint is unreachable: {0}")]
    Unreachable(String),
    /// The provider answered something that is not a token response.
    #[error("the identity provider's answer is not a token: {0}")]
    Invalid(String),
}

impl ExchangeError {
    /// A short reason for the agent's answer (`invalid_grant`, `timeout`,
    /// `unreachable`, `invalid_response`).
    pub fn reason(&self) -> String {
        match self {
            ExchangeError::Refused { error, .. } => error.clone(),
            ExchangeError::Unreachable(e) if e.contains("timed out") => "timeout".into(),
            ExchangeError::Unreachable(_) => "unreachable".into(),
            ExchangeError::Invalid(_) => "invalid_response".into(),
        }
    }
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: Option<String>,
    token_type: Option<String>,
    issued_token_type: Option<String>,
    expires_in: Option<i64>,
    scope: Option<String>,
}

#[derive(Deserialize)]
struct ErrorResponse {
    error: String,
    error_description: Option<String>,
}

impl Exchange {
    /// The form body of the exchange of `subject_token` (RFC 8693 section
    /// 2.1): the token to trade, for whom (`audience`), for what (`scope`).
    fn form(&self, subject_token: &str, now_ms: i64) -> Result<String, ExchangeError> {
        let mut f = form_urlencoded::Serializer::new(String::new());
        if let ClientAuth::Key(signer) = &self.client_auth {
            let assertion = signer
                .assertion(&self.client_id, &self.token_endpoint, now_ms / 1000)
                .map_err(ExchangeError::Invalid)?;
            f.append_pair("client_id", &self.client_id);
            f.append_pair("client_assertion_type", super::assertion::ASSERTION_TYPE);
            f.append_pair("client_assertion", &assertion);
        }
        match self.grant {
            Grant::TokenExchange => {
                f.append_pair("grant_type", GRANT_TYPE);
                f.append_pair("subject_token", subject_token);
                f.append_pair("subject_token_type", ACCESS_TOKEN_TYPE);
                f.append_pair("requested_token_type", ACCESS_TOKEN_TYPE);
                f.append_pair("audience", &self.audience);
            }
            // Entra ID: the caller's token as the assertion; the scopes
            // name the downstream API.
            Grant::OnBehalfOf => {
                f.append_pair("grant_type", JWT_BEARER);
                f.append_pair("assertion", subject_token);
                f.append_pair("requested_token_use", "on_behalf_of");
            }
        }
        if !self.scopes.is_empty() {
            f.append_pair("scope", &self.scopes.join(" "));
        }
        if let (Some(actor), Grant::TokenExchange) = (&self.actor_token, self.grant) {
            f.append_pair("actor_token", actor);
            f.append_pair("actor_token_type", ACCESS_TOKEN_TYPE);
        }
        Ok(f.finish())
    }

    /// `client_secret_basic` (RFC 6749 section 2.3.1): id and secret, each
    /// form-encoded, in HTTP Basic.
    fn basic(&self) -> Option<String> {
        let ClientAuth::Secret(secret) = &self.client_auth else {
            return None;
        };
        let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
        let pair = format!("{}:{}", enc(&self.client_id), enc(secret));
        Some(format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        ))
    }

    /// Trade `subject_token` for a token for the upstream, at `now_ms`.
    pub async fn exchange(
        &self,
        http: &reqwest::Client,
        subject_token: &str,
        now_ms: i64,
    ) -> Result<Exchanged, ExchangeError> {
        let mut req = http.post(&self.token_endpoint);
        if let Some(basic) = self.basic() {
            req = req.header("authorization", basic);
        }
        let resp = req
            .header("content-type", "application/x-www-form-urlencoded")
            .header("accept", "application/json")
            .timeout(self.timeout)
            .body(self.form(subject_token, now_ms)?)
            .send()
            .await
            .map_err(|e| {
                ExchangeError::Unreachable(if e.is_timeout() {
                    format!("timed out after {:?}", self.timeout)
                } else {
                    crate::upstream::error_chain(&e)
                })
            })?;
        let status = resp.status().as_u16();
        let body = resp
            .bytes()
            .await
            .map_err(|e| ExchangeError::Unreachable(crate::upstream::error_chain(&e)))?;
        read_answer(status, &body, now_ms, &self.scopes)
    }
}

/// The token endpoint's answer (`status`, `body`) to an exchange made at
/// `now_ms` for the scopes `requested`: the token, or the provider's
/// refusal, or why the answer is not a token. The provider's text is
/// attacker-reachable input (a provider that is not what it claims, a proxy
/// on the path): nothing in it panics, and nothing but a Bearer access
/// token is accepted.
pub fn read_answer(
    status: u16,
    body: &[u8],
    now_ms: i64,
    requested: &[String],
) -> Result<Exchanged, ExchangeError> {
    if !(200..300).contains(&status) {
        return Err(match serde_json::from_slice::<ErrorResponse>(body) {
            Ok(e) => ExchangeError::Refused {
                error: e.error,
                description: e.error_description,
            },
            Err(_) => ExchangeError::Invalid(format!("HTTP {status} without an OAuth error")),
        });
    }
    let t: TokenResponse = serde_json::from_slice(body)
        .map_err(|e| ExchangeError::Invalid(format!("not a token response: {e}")))?;
    let Some(access_token) = t.access_token.filter(|t| !t.is_empty()) else {
        return Err(ExchangeError::Invalid("no access_token".into()));
    };
    // The token must be usable as a bearer access token: another
    // issued type (an ID token, a SAML assertion) is not sent upstream.
    if t.token_type
        .as_deref()
        .is_some_and(|k| !k.eq_ignore_ascii_case("bearer"))
    {
        return Err(ExchangeError::Invalid(format!(
            "token_type `{}`, not Bearer",
            t.token_type.unwrap_or_default()
        )));
    }
    if t.issued_token_type
        .as_deref()
        .is_some_and(|k| k != ACCESS_TOKEN_TYPE)
    {
        return Err(ExchangeError::Invalid(format!(
            "issued_token_type `{}`, not an access token",
            t.issued_token_type.unwrap_or_default()
        )));
    }
    let claims = jwt_claims(&access_token);
    let expires_at_ms = t
        .expires_in
        .map(|s| now_ms.saturating_add(s.saturating_mul(1000)))
        .or_else(|| {
            claims
                .as_ref()
                .and_then(|c| c.get("exp")?.as_i64())
                .map(|s| s.saturating_mul(1000))
        });
    let id = claims
        .as_ref()
        .and_then(|c| c.get("jti")?.as_str().map(|j| format!("jti:{j}")))
        .unwrap_or_else(|| {
            format!(
                "sha256:{}",
                hex::encode(sha2::Sha256::digest(access_token.as_bytes()))
            )
        });
    Ok(Exchanged {
        access_token,
        expires_at_ms,
        // Of the granted scopes, only those the gateway asked for are kept
        // (and so recorded): the provider's own text never reaches the
        // audit log, where it could carry anything, the token included
        // (found by the `token_response` fuzz target).
        scope: t.scope.map(|granted| {
            let granted: Vec<&str> = granted.split_whitespace().collect();
            requested
                .iter()
                .filter(|r| granted.contains(&r.as_str()))
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(" ")
        }),
        id,
    })
}

/// The claims of a JWT, read without checking it (the upstream checks it;
/// the gateway only wants its `exp` and `jti`). `None` for an opaque token.
fn jwt_claims(token: &str) -> Option<serde_json::Map<String, serde_json::Value>> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exchange(endpoint: &str) -> Exchange {
        Exchange {
            token_endpoint: endpoint.into(),
            client_id: "countersign".into(),
            client_auth: ClientAuth::Secret("s3cret:with/chars".into()),
            audience: "https://mcp.github.example".into(),
            scopes: vec!["repo".into(), "read:org".into()],
            actor_token: None,
            timeout: Duration::from_secs(2),
            grant: Grant::TokenExchange,
        }
    }

    #[test]
    fn entra_on_behalf_of_sends_the_callers_token_as_the_assertion() {
        let e = Exchange {
            grant: Grant::OnBehalfOf,
            scopes: vec!["api://mcp-graph/Files.Read".into()],
            ..exchange("http://x/token")
        };
        let form: std::collections::HashMap<String, String> =
            form_urlencoded::parse(e.form("caller-token", 0).unwrap().as_bytes())
                .into_owned()
                .collect();
        assert_eq!(form["grant_type"], JWT_BEARER);
        assert_eq!(form["assertion"], "caller-token");
        assert_eq!(form["requested_token_use"], "on_behalf_of");
        assert_eq!(form["scope"], "api://mcp-graph/Files.Read");
        assert!(!form.contains_key("subject_token"));
        assert!(!form.contains_key("audience"));
    }

    #[test]
    fn the_request_names_the_subject_the_audience_and_only_the_scopes_needed() {
        let e = exchange("http://x/token");
        let form: std::collections::HashMap<String, String> =
            form_urlencoded::parse(e.form("caller-token", 0).unwrap().as_bytes())
                .into_owned()
                .collect();
        assert_eq!(form["grant_type"], GRANT_TYPE);
        assert_eq!(form["subject_token"], "caller-token");
        assert_eq!(form["subject_token_type"], ACCESS_TOKEN_TYPE);
        assert_eq!(form["requested_token_type"], ACCESS_TOKEN_TYPE);
        assert_eq!(form["audience"], "https://mcp.github.example");
        assert_eq!(form["scope"], "repo read:org");
        assert!(!form.contains_key("actor_token"));
        // client_secret_basic encodes id and secret before Base64.
        let basic = e.basic().unwrap();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(basic.trim_start_matches("Basic "))
            .unwrap();
        assert_eq!(
            String::from_utf8(decoded).unwrap(),
            "countersign:s3cret%3Awith%2Fchars"
        );
        // No secret in Debug.
        assert!(!format!("{e:?}").contains("s3cret"));
    }

    /// A token endpoint answering `status` with `body`, on a free port.
    async fn endpoint(status: u16, body: &'static str) -> String {
        use axum::routing::post;
        let app = axum::Router::new().route(
            "/token",
            post(move || async move {
                (
                    axum::http::StatusCode::from_u16(status).unwrap(),
                    [("content-type", "application/json")],
                    body,
                )
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}/token")
    }

    #[tokio::test]
    async fn a_token_response_gives_the_token_its_expiry_and_its_evidence() {
        // A JWT whose payload has exp and jti (the signature is not read).
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(br#"{"exp":2000000000,"jti":"j-1","sub":"alice"}"#);
        let jwt: &'static str =
            Box::leak(format!("eyJhbGciOiJub25lIn0.{payload}.c2ln").into_boxed_str());
        let body: &'static str = Box::leak(
            format!(r#"{{"access_token":"{jwt}","token_type":"Bearer","issued_token_type":"{ACCESS_TOKEN_TYPE}","expires_in":300,"scope":"repo"}}"#)
                .into_boxed_str(),
        );
        let url = endpoint(200, body).await;
        let got = exchange(&url)
            .exchange(&reqwest::Client::new(), "t", 1_000_000)
            .await
            .unwrap();
        assert_eq!(got.access_token, jwt);
        assert_eq!(got.expires_at_ms, Some(1_300_000), "expires_in wins");
        assert_eq!(got.id, "jti:j-1");
        assert_eq!(
            got.evidence(),
            serde_json::json!({"token": "jti:j-1", "scope": "repo"})
        );
        assert!(!format!("{got:?}").contains(jwt), "no token in Debug");
    }

    #[test]
    fn a_granted_scope_records_only_what_was_asked_never_the_providers_text() {
        // The fuzz target's finding: a provider's `scope` that carries the
        // token itself reached `Debug` and the audit evidence.
        let body = br#"{"access_token": "LLLLLLLL", "expires_in": 300, "scope": "repo LLLLLLLL read:org admin"}"#;
        let got = read_answer(200, body, 0, &["repo".into(), "read:org".into()]).unwrap();
        assert_eq!(got.scope.as_deref(), Some("repo read:org"));
        assert!(!format!("{got:?}").contains("LLLLLLLL"));
        assert!(!got.evidence().to_string().contains("LLLLLLLL"));
    }

    #[tokio::test]
    async fn refusals_unreachable_providers_and_odd_answers_are_precise_errors() {
        let url = endpoint(
            400,
            r#"{"error":"invalid_grant","error_description":"subject token expired"}"#,
        )
        .await;
        let e = exchange(&url)
            .exchange(&reqwest::Client::new(), "t", 0)
            .await
            .unwrap_err();
        assert_eq!(e.reason(), "invalid_grant");
        assert!(e.to_string().contains("subject token expired"), "{e}");
        let url = endpoint(200, r#"{"access_token":"x","token_type":"N_A","issued_token_type":"urn:ietf:params:oauth:token-type:id_token"}"#).await;
        let e = exchange(&url)
            .exchange(&reqwest::Client::new(), "t", 0)
            .await
            .unwrap_err();
        assert_eq!(e.reason(), "invalid_response", "{e}");
        let url = endpoint(500, "oops").await;
        let e = exchange(&url)
            .exchange(&reqwest::Client::new(), "t", 0)
            .await
            .unwrap_err();
        assert_eq!(e.reason(), "invalid_response");
        // Nothing listens there.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let e = exchange(&format!("http://{closed}/token"))
            .exchange(&reqwest::Client::new(), "t", 0)
            .await
            .unwrap_err();
        assert_eq!(e.reason(), "unreachable", "{e}");
    }
}
