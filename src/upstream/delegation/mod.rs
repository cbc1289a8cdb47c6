//! Delegation (DESIGN.md section 23): the caller's access token traded at
//! its identity provider for a token meant for one upstream, by OAuth 2.0
//! Token Exchange (RFC 8693), so that the upstream sees the person, with the
//! gateway as the actor, instead of the gateway's one service credential.
//!
//! This module holds the exchange itself ([`exchange::Exchange`]) and the
//! cache of exchanged tokens ([`cache::TokenCache`]). A token is secret
//! material: it never appears in a `Debug` output, an error, a log line,
//! the audit log or a trace; what may be shown of it is
//! [`exchange::Exchanged::evidence`] (its `jti`, or a digest, and its
//! scopes).

pub mod assertion;
pub mod cache;
pub mod exchange;

use std::collections::HashMap;

pub use crate::core::config::{mode, Mode, Unavailable};
use crate::core::config::{Config, DelegationConfig, IssuerConfig};
use crate::core::identity::{Identity, SubjectToken};
use cache::{CacheKey, TokenCache, Whose};
use exchange::{ClientAuth, Exchange, ExchangeError, Exchanged};

/// Most exchanged tokens kept at once (expired ones go first).
const CACHE_MAX: usize = 10_000;

/// Why no token was obtained at dispatch. Nothing was sent upstream.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DelegationError {
    /// The caller's own token expired before its call was dispatched (a
    /// held call approved late): nothing is minted from it.
    #[error("the caller's access token expired before the call was dispatched")]
    CallerExpired,
    /// The provider refused, could not be reached, or answered oddly.
    #[error(transparent)]
    Exchange(#[from] ExchangeError),
    /// The token endpoint is unknown (metadata unreachable) or the client's
    /// credential cannot be read.
    #[error("{0}")]
    Setup(String),
}

impl DelegationError {
    /// The short reason (`invalid_grant`, `timeout`, `caller_token_expired`,
    /// ...), for the agent's answer and the audit log.
    pub fn reason(&self) -> String {
        match self {
            DelegationError::CallerExpired => "caller_token_expired".into(),
            DelegationError::Exchange(e) => e.reason(),
            DelegationError::Setup(_) => "provider_unavailable".into(),
        }
    }
}

/// One server's delegation: its settings and where to exchange.
struct Server {
    config: DelegationConfig,
    issuer: IssuerConfig,
    /// The provider's HTTP client (its TLS settings, no redirects).
    http: Result<reqwest::Client, String>,
    /// `private_key_jwt`: the key, loaded at start.
    signer: Option<assertion::Signer>,
    /// The token endpoint, once known.
    endpoint: tokio::sync::Mutex<Option<String>>,
}

/// Every delegating server, and the tokens exchanged for their callers.
pub struct Delegator {
    servers: HashMap<String, Server>,
    cache: TokenCache,
}

impl Delegator {
    /// The delegations of `config`'s servers (a key file that does not load
    /// leaves that server refusing every exchange; `serve` checks them
    /// before it starts).
    pub fn new(config: &Config) -> Delegator {
        let mut servers = HashMap::new();
        for (name, s) in &config.servers {
            let Some(d) = &s.delegation else { continue };
            let Some(issuer) = config.auth.issuers.iter().find(|i| i.name == d.issuer) else {
                continue;
            };
            let signer = d.client_key.as_ref().and_then(|k| {
                assertion::Signer::load(k, d.client_key_id.clone())
                    .inspect_err(|e| tracing::error!(server = %name, "delegation client_key: {e}"))
                    .ok()
            });
            servers.insert(
                name.clone(),
                Server {
                    config: d.clone(),
                    issuer: issuer.clone(),
                    // Kept as its words (what a refused call's message
                    // repeats); `serve` printed the chain at start.
                    http: super::provider::http_client(issuer).map_err(|e| e.to_string()),
                    signer,
                    endpoint: tokio::sync::Mutex::new(d.token_endpoint.clone()),
                },
            );
        }
        Delegator {
            servers,
            cache: TokenCache::new(CACHE_MAX),
        }
    }

    /// Whose tokens, at `s`'s issuer: `identity` in its tenant.
    fn whose<'a>(s: &'a Server, identity: &'a Identity) -> Whose<'a> {
        Whose {
            issuer: &s.config.issuer,
            subject: &identity.principal,
            tenant: &identity.tenant,
        }
    }

    /// The cache key of the token exchanged from `subject` (the caller's
    /// own token) for `identity` at `server`.
    fn key(
        &self,
        s: &Server,
        server: &str,
        identity: &Identity,
        subject: &SubjectToken,
    ) -> CacheKey {
        CacheKey::new(
            Self::whose(s, identity),
            &subject.token,
            identity.client.as_deref().unwrap_or(""),
            server,
            &s.config.scopes,
        )
    }

    /// The token `identity` reaches `server` with: the cached one while it
    /// is good, else one exchanged now for `subject` (the caller's own
    /// token). Called at dispatch only, under the permit.
    pub async fn token(
        &self,
        server: &str,
        identity: &Identity,
        subject: &SubjectToken,
        now_ms: i64,
    ) -> Result<Exchanged, DelegationError> {
        let Some(s) = self.servers.get(server) else {
            return Err(DelegationError::Setup(format!(
                "server `{server}` has no usable delegation"
            )));
        };
        // Nothing is minted from, or used for, a caller token past its
        // expiry (a held call approved after the person's session ended).
        if subject.expires_ms <= now_ms {
            self.cache.forget(Self::whose(s, identity));
            return Err(DelegationError::CallerExpired);
        }
        let key = self.key(s, server, identity, subject);
        if let Some(t) = self.cache.get(&key, now_ms) {
            return Ok(t);
        }
        let exchange = self.exchange(s).await?;
        let http = s
            .http
            .as_ref()
            .map_err(|e| DelegationError::Setup(e.clone()))?;
        let token = exchange.exchange(http, &subject.token, now_ms).await?;
        tracing::info!(server, principal = %identity.principal, token = %token.id, "exchanged the caller's token for the server");
        let margin = i64::try_from(s.config.refresh_before.as_millis()).unwrap_or(i64::MAX);
        self.cache
            .put(key, token.clone(), Some(subject.expires_ms), margin, now_ms);
        Ok(token)
    }

    /// The upstream refused a token exchanged for `identity` (401): it is
    /// not used again; the next call exchanges anew.
    pub fn refused(&self, server: &str, identity: &Identity) {
        if let Some(s) = self.servers.get(server) {
            self.cache.forget(Self::whose(s, identity));
        }
    }

    /// The exchange request of `s`: its endpoint (from the issuer's
    /// metadata the first time), its client and credential (read now, so a
    /// rotated secret is used at once).
    async fn exchange(&self, s: &Server) -> Result<Exchange, DelegationError> {
        let d = &s.config;
        let token_endpoint = {
            let mut endpoint = s.endpoint.lock().await;
            match endpoint.as_ref() {
                Some(e) => e.clone(),
                None => {
                    let http = s
                        .http
                        .as_ref()
                        .map_err(|e| DelegationError::Setup(e.clone()))?;
                    let (url, meta) =
                        super::provider::metadata(http, &s.issuer)
                            .await
                            .map_err(|e| {
                                DelegationError::Setup(format!(
                                    "the token endpoint of `{}` is unknown: {e}",
                                    d.issuer
                                ))
                            })?;
                    let Some(found) = meta.get("token_endpoint").and_then(|v| v.as_str()) else {
                        return Err(DelegationError::Setup(format!(
                            "{url} has no token_endpoint"
                        )));
                    };
                    // People's tokens go there: never in the clear from afar.
                    if !crate::core::config::https_or_loopback(found) {
                        return Err(DelegationError::Setup(format!(
                            "{url}: token_endpoint `{found}` is not https://"
                        )));
                    }
                    *endpoint = Some(found.to_owned());
                    found.to_owned()
                }
            }
        };
        let client_auth = match (&d.client_secret, &s.signer) {
            (Some(c), _) => ClientAuth::Secret(
                super::credentials::resolve(c, "delegation client_secret")
                    .map_err(DelegationError::Setup)?,
            ),
            (None, Some(signer)) => ClientAuth::Key(signer.clone()),
            (None, None) => {
                return Err(DelegationError::Setup(
                    "the delegation client_key could not be loaded".into(),
                ))
            }
        };
        let actor_token = d
            .actor_token
            .as_ref()
            .map(|c| super::credentials::resolve(c, "delegation actor_token"))
            .transpose()
            .map_err(DelegationError::Setup)?;
        Ok(Exchange {
            token_endpoint,
            client_id: d.client_id.clone(),
            client_auth,
            audience: d.audience.clone(),
            scopes: d.scopes.clone(),
            actor_token,
            timeout: d.timeout,
            grant: d.grant,
        })
    }
}
