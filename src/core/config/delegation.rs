//! `[servers.S.delegation]`: per-user upstream credentials by OAuth 2.0
//! Token Exchange (RFC 8693; DESIGN.md section 23).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::{duration, https_or_loopback, invalid, ConfigError, Credential, IssuerConfig};
use crate::core::identity::SubjectToken;

/// How a server's tool calls reach it as the person who asked.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelegationConfig {
    /// The `[[auth.issuers]]` entry (by name) whose tokens are traded; its
    /// token endpoint comes from its metadata unless `token_endpoint` says.
    pub issuer: String,
    /// The upstream the exchanged token is for (`audience`).
    pub audience: String,
    /// The scopes the upstream needs, and no more.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// The gateway's own OAuth client at the provider.
    pub client_id: String,
    /// Its secret: `client_secret_basic`.
    pub client_secret: Option<Credential>,
    /// Or its private key: `private_key_jwt` (RFC 7523), a PKCS#8 PEM file
    /// of a P-256 key (ES256).
    pub client_key: Option<PathBuf>,
    /// The `kid` of `client_key` as registered at the provider.
    pub client_key_id: Option<String>,
    /// The token endpoint, instead of the issuer's metadata.
    pub token_endpoint: Option<String>,
    /// The gateway's own token, sent as `actor_token` for providers that
    /// want the actor named in the request.
    pub actor_token: Option<Credential>,
    /// A caller that cannot be delegated (a static token, another issuer's
    /// token): `none` (default) refuses the call with
    /// `delegation_unavailable`; `service` sends it with the server's
    /// service credential (`headers`), as without delegation.
    #[serde(default)]
    pub fallback: Fallback,
    /// Which grant trades the token: RFC 8693 token exchange (default), or
    /// Microsoft Entra ID's on-behalf-of flow.
    #[serde(default)]
    pub grant: Grant,
    /// How long the provider may take to answer an exchange.
    #[serde(default = "default_timeout", deserialize_with = "duration")]
    pub timeout: Duration,
    /// An exchanged token is exchanged again this long before it expires.
    #[serde(default = "default_refresh_before", deserialize_with = "duration")]
    pub refresh_before: Duration,
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_refresh_before() -> Duration {
    Duration::from_secs(60)
}

/// The grant a token is traded with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Grant {
    /// RFC 8693 (`urn:ietf:params:oauth:grant-type:token-exchange`).
    #[default]
    TokenExchange,
    /// The JWT bearer grant with `requested_token_use=on_behalf_of`
    /// (Microsoft Entra ID); the resource is named by the scopes.
    OnBehalfOf,
}

/// What a caller that cannot be delegated gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fallback {
    /// `delegation_unavailable`: nothing runs.
    #[default]
    None,
    /// The server's service credential, as without delegation.
    Service,
}

impl DelegationConfig {
    /// A known issuer, an HTTP server, one way to authenticate the client,
    /// https endpoints (or loopback), scopes as OAuth writes them.
    pub(super) fn check(
        &self,
        server: &str,
        http: bool,
        issuers: &[IssuerConfig],
        path: &Path,
    ) -> Result<(), ConfigError> {
        let at = format!("[servers.{server}.delegation]");
        let fail = |m: String| Err(invalid(path, format!("{at} {m}")));
        if !http {
            return fail(
                "applies to HTTP servers (`url`) only: a stdio child has no per-request credential"
                    .into(),
            );
        }
        if !issuers.iter().any(|i| i.name == self.issuer) {
            let known: Vec<&str> = issuers.iter().map(|i| i.name.as_str()).collect();
            return fail(format!(
                "issuer `{}` is not an [[auth.issuers]] name (known: {})",
                self.issuer,
                if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                }
            ));
        }
        if self.audience.trim().is_empty() || self.client_id.trim().is_empty() {
            return fail("needs an `audience` and a `client_id`".into());
        }
        match (&self.client_secret, &self.client_key) {
            (Some(_), Some(_)) => {
                return fail(
                    "sets both `client_secret` and `client_key`; keep one (client_secret_basic or private_key_jwt)".into(),
                )
            }
            (None, None) => {
                return fail(
                    "needs `client_secret` (client_secret_basic) or `client_key` (private_key_jwt)"
                        .into(),
                )
            }
            _ => {}
        }
        if self.client_key_id.is_some() && self.client_key.is_none() {
            return fail("sets `client_key_id` without `client_key`".into());
        }
        // A token endpoint over plain HTTP from afar would carry people's
        // tokens in the clear.
        if let Some(url) = &self.token_endpoint {
            if !https_or_loopback(url) {
                return fail(format!(
                    "token_endpoint `{url}` must be https:// (or http:// on a loopback host)"
                ));
            }
        }
        if let Some(bad) = self.scopes.iter().find(|s| {
            s.is_empty()
                || s.chars()
                    .any(|c| c.is_whitespace() || c == '"' || c == '\\')
        }) {
            return fail(format!("scope `{bad}` is not an OAuth scope token"));
        }
        if self.timeout.is_zero() {
            return fail("timeout must be more than zero".into());
        }
        Ok(())
    }
}

/// How a call reaches a server, as far as delegation goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The server has no delegation: its service credential, as always.
    Service,
    /// As the caller, with an exchanged token.
    Delegated,
    /// The caller cannot be delegated and the server allows the service
    /// credential for such callers (`fallback = "service"`).
    Fallback,
}

/// Why a caller cannot be delegated (`delegation_unavailable`): nothing
/// runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    /// The issuer the server trades tokens at.
    pub issuer: String,
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "this server is called as the person who asks, with a token exchanged at identity provider `{}`; the caller's credential is not one of its access tokens (a static token, or another provider's)",
            self.issuer
        )
    }
}

/// Whether `subject` can be delegated to `server` under `config`: the
/// caller's verified token is kept only when it comes from the server's
/// delegation issuer (see `front::auth`), so its presence decides.
pub fn mode(
    config: Option<&DelegationConfig>,
    subject: Option<&SubjectToken>,
) -> Result<Mode, Unavailable> {
    let Some(d) = config else {
        return Ok(Mode::Service);
    };
    match (subject, d.fallback) {
        (Some(s), _) if s.issuer == d.issuer => Ok(Mode::Delegated),
        (_, Fallback::Service) => Ok(Mode::Fallback),
        (_, Fallback::None) => Err(Unavailable {
            issuer: d.issuer.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::config::Config;

    const BASE: &str = r#"
[gateway]
listen = "127.0.0.1:0"
data_dir = "/tmp/x"

[[auth.issuers]]
name = "okta"
issuer = "https://acme.okta.com"
tenant = "acme"

[servers.gh]
url = "https://mcp.github.example/mcp"
"#;

    fn with(delegation: &str) -> Result<Config, ConfigError> {
        Config::parse(
            &format!("{BASE}\n[servers.gh.delegation]\n{delegation}"),
            Path::new("t.toml"),
        )
    }

    fn error(delegation: &str) -> String {
        with(delegation).unwrap_err().to_string()
    }

    const OK: &str = "issuer = \"okta\"\naudience = \"https://mcp.github.example\"\nscopes = [\"repo\"]\nclient_id = \"cs\"\nclient_secret = { env = \"S\" }\n";

    #[test]
    fn a_delegation_names_a_known_issuer_and_one_client_credential() {
        let c = with(OK).unwrap();
        let d = c.servers["gh"].delegation.as_ref().unwrap();
        assert_eq!(d.fallback, Fallback::None, "refusing is the default");
        assert_eq!(d.refresh_before, Duration::from_secs(60));
        let e = error(&OK.replace("\"okta\"", "\"auth0\""));
        assert!(
            e.contains("issuer `auth0` is not an [[auth.issuers]] name (known: okta)"),
            "{e}"
        );
        let e = error(&format!("{OK}client_key = \"k.pem\"\n"));
        assert!(e.contains("keep one"), "{e}");
        let e = error(&OK.replace("client_secret = { env = \"S\" }\n", ""));
        assert!(e.contains("needs `client_secret`"), "{e}");
        let e = error(&format!(
            "{OK}token_endpoint = \"http://idp.example/token\"\n"
        ));
        assert!(e.contains("must be https://"), "{e}");
        let e = error(&OK.replace("[\"repo\"]", "[\"repo read\"]"));
        assert!(e.contains("not an OAuth scope token"), "{e}");
        let e = error(&format!("{OK}fallback = \"anyone\"\n"));
        assert!(e.contains("fallback"), "{e}");
    }

    #[test]
    fn a_stdio_server_cannot_delegate() {
        let text = format!(
            "{}\n[servers.local]\ncommand = \"x\"\n[servers.local.delegation]\n{OK}",
            BASE
        );
        let e = Config::parse(&text, Path::new("t.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("HTTP servers (`url`) only"), "{e}");
    }

    #[test]
    fn who_can_be_delegated() {
        let c = with(OK).unwrap();
        let d = c.servers["gh"].delegation.as_ref().unwrap();
        let okta = SubjectToken {
            issuer: "okta".into(),
            token: "t".into(),
            expires_ms: 0,
        };
        let other = SubjectToken {
            issuer: "entra".into(),
            ..okta.clone()
        };
        assert_eq!(mode(None, None), Ok(Mode::Service));
        assert_eq!(mode(Some(d), Some(&okta)), Ok(Mode::Delegated));
        assert_eq!(
            mode(Some(d), Some(&other)),
            Err(Unavailable {
                issuer: "okta".into()
            })
        );
        assert!(mode(Some(d), None).is_err(), "a static token");
        let service = DelegationConfig {
            fallback: Fallback::Service,
            ..d.clone()
        };
        assert_eq!(mode(Some(&service), None), Ok(Mode::Fallback));
    }
}
