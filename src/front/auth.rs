//! Who is asking: the bearer token of a request becomes an [`Identity`],
//! or a precise refusal (DESIGN.md section 17).
//!
//! Two kinds of token are accepted, and their principals cannot collide:
//! - static tokens of `[[identities]]` (development, CI, the demo), looked up
//!   by their SHA-256;
//! - JWT access tokens of `[[auth.issuers]]`, verified by `core::token`
//!   with the keys of `front::issuers`; their principals are `NAME:SUBJECT`.
//!
//! A verified token's identity is cached until its `exp`, keyed by the
//! token's SHA-256 and the server (the audience differs per server), so
//! the read path does not verify a signature on every call.
//!
//! Refusals follow the MCP authorization spec and RFC 6750: 401 with
//! `WWW-Authenticate: Bearer resource_metadata="…"` (and `error="invalid_token"`
//! when a token was presented), 403 `insufficient_scope` with the scope
//! needed, 403 for a token without its tenant claim. A client's token is
//! never passed upstream: the upstream connections carry only the headers
//! the operator configured for them. For a server with delegation, the
//! verified token of that server's issuer is kept with the request
//! ([`SubjectToken`]), to be traded at the issuer, never sent on.

use std::collections::HashMap;
use std::sync::Arc;

use axum::http::{header, HeaderValue};
use axum::response::Response;
use parking_lot::Mutex;
use serde_json::{json, Value};

use super::issuers::Issuers;
use super::respond::reject;
use crate::core::config::Config;
use crate::core::identity::{Identities, Identity, SubjectToken};
use crate::core::token::{self, Check, TokenError};
use crate::enforce::answer::Rejection;

/// How many verified tokens are remembered at most.
const CACHE_MAX: usize = 10_000;

/// A token verified for one server (the audience differs per server).
struct Verified {
    server: String,
    identity: Arc<Identity>,
    /// `exp`, unix ms.
    expires_ms: i64,
    /// The token, kept only when `server` delegates to its issuer.
    subject: Option<Arc<SubjectToken>>,
}

/// Who a request's token names, and the token itself when the server
/// delegates to its issuer.
#[derive(Debug, Clone)]
pub(crate) struct Authenticated {
    /// The identity.
    pub identity: Arc<Identity>,
    /// The token to exchange at dispatch (`None`: a static token, another
    /// issuer's, or a server without delegation).
    pub subject: Option<Arc<SubjectToken>>,
}

/// Why a request's token is not accepted.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// No token, or a static-looking token no identity has.
    Missing,
    /// An access token that was checked and refused (401).
    Token(TokenError),
}

/// One connection's last bearer token and its SHA-256. A client sends the
/// same token on every request of a connection, and hashing it again cost
/// a relayed read about 2,300 instructions; only the digest is remembered, never
/// what it identifies, so a token revoked or reloaded is looked up afresh
/// as before. The token is compared in constant time, and a connection
/// that carries several callers' tokens (a proxy's pool) only hashes again.
#[derive(Default)]
pub(crate) struct TokenMemo(Mutex<Option<(Box<[u8]>, crate::core::sha256::Digest)>>);

impl TokenMemo {
    /// The SHA-256 of `token`.
    pub(crate) fn digest(&self, token: &str) -> crate::core::sha256::Digest {
        use subtle::ConstantTimeEq;
        let mut last = self.0.lock();
        if let Some((seen, digest)) = &*last {
            // A forger must not learn the remembered token byte by byte:
            // `ct_eq` compares equal lengths in constant time (a length
            // alone is no secret and is answered at once).
            if bool::from(seen.as_ref().ct_eq(token.as_bytes())) {
                return *digest;
            }
        }
        let digest = crate::core::sha256::digest(token.as_bytes());
        *last = Some((token.as_bytes().into(), digest));
        digest
    }
}

/// The gateway's authentication.
pub(crate) struct Auth {
    statics: Identities,
    issuers: Issuers,
    /// SHA-256 of the token → the servers it was verified for. Looked up
    /// without allocating: a read with a known token pays one hash.
    cache: Mutex<HashMap<[u8; 32], Vec<Verified>>>,
    /// `gateway.public_url`, or the listener's own address once bound.
    public_url: parking_lot::RwLock<String>,
    /// Whether `public_url` was configured (else it follows the listener).
    configured_url: bool,
    leeway_secs: u64,
    /// Server → the issuer (name) its delegation trades tokens at.
    delegates_to: HashMap<String, String>,
}

impl Auth {
    /// Authentication for `config` (issuer keys not loaded yet: see
    /// [`Auth::load`]).
    pub(crate) fn new(config: &Config) -> Auth {
        Auth {
            statics: Identities::from_config(&config.identities),
            issuers: Issuers::new(&config.auth),
            cache: Mutex::new(HashMap::new()),
            public_url: parking_lot::RwLock::new(config.gateway.public_url()),
            configured_url: config.gateway.public_url.is_some(),
            leeway_secs: config.auth.leeway.as_secs(),
            delegates_to: config
                .servers
                .iter()
                .filter_map(|(name, s)| Some((name.clone(), s.delegation.as_ref()?.issuer.clone())))
                .collect(),
        }
    }

    /// The listener is bound at `local`: without `gateway.public_url`, that
    /// is the URL clients reach (a `listen` port of 0 is chosen at bind).
    pub(crate) fn listening_on(&self, local: std::net::SocketAddr, tls: bool) {
        if !self.configured_url {
            let scheme = if tls { "https" } else { "http" };
            *self.public_url.write() = format!("{scheme}://{local}");
        }
    }

    /// The URL clients reach the gateway at.
    fn public_url(&self) -> String {
        self.public_url.read().clone()
    }

    /// Fetch every issuer's keys (at start).
    pub(crate) async fn load(&self) {
        self.issuers.load().await;
    }

    /// Whether any issuer is configured (then 401s name the metadata).
    pub(crate) fn has_issuers(&self) -> bool {
        !self.issuers.is_empty()
    }

    /// The identity behind an `Authorization` header value, for `server`;
    /// `memo` is the connection's, when it has one.
    pub(crate) async fn identify(
        &self,
        header: Option<&str>,
        server: &str,
        now_ms: i64,
        memo: Option<&TokenMemo>,
    ) -> Result<Authenticated, Refusal> {
        let Some((scheme, token)) = header.and_then(|h| h.split_once(' ')) else {
            return Err(Refusal::Missing);
        };
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(Refusal::Missing);
        }
        let token = token.trim();
        // One hash for both kinds: the static table and the cache of
        // verified access tokens are keyed by the token's SHA-256.
        let digest = match memo {
            Some(memo) => memo.digest(token),
            None => crate::core::sha256::digest(token.as_bytes()),
        };
        if let Some(identity) = self.statics.by_digest(&digest) {
            return Ok(Authenticated {
                identity,
                subject: None,
            });
        }
        if self.issuers.is_empty() || token.matches('.').count() != 2 {
            return Err(Refusal::Missing);
        }
        if let Some(known) = self.cache.lock().get(&digest) {
            // Cached only after a full check, and only until `exp`: what
            // the cache answers is what the check would answer now.
            if let Some(v) = known
                .iter()
                .find(|v| v.server == server && v.expires_ms > now_ms)
            {
                return Ok(Authenticated {
                    identity: v.identity.clone(),
                    subject: v.subject.clone(),
                });
            }
        }
        let (verified, issuer) = self.verify(token, server).await.map_err(Refusal::Token)?;
        // Kept in memory only for a server that trades it at this very
        // issuer: any other token is never held beyond its request.
        let subject = (self.delegates_to.get(server) == Some(&issuer)).then(|| {
            Arc::new(SubjectToken {
                issuer,
                token: token.to_owned(),
                expires_ms: verified.expires_ms,
            })
        });
        let mut cache = self.cache.lock();
        if cache.len() >= CACHE_MAX {
            cache.retain(|_, known| known.iter().any(|v| v.expires_ms > now_ms));
            if cache.len() >= CACHE_MAX {
                cache.clear();
            }
        }
        let known = cache.entry(digest).or_default();
        known.retain(|v| v.server != server && v.expires_ms > now_ms);
        known.push(Verified {
            server: server.to_owned(),
            identity: verified.identity.clone(),
            expires_ms: verified.expires_ms,
            subject: subject.clone(),
        });
        Ok(Authenticated {
            identity: verified.identity,
            subject,
        })
    }

    /// The token's check, and the name of the issuer that verified it.
    async fn verify(
        &self,
        token: &str,
        server: &str,
    ) -> Result<(token::Verified, String), TokenError> {
        let seen = token::peek(token)?;
        let Some(issuer) = self.issuers.by_issuer(&seen.issuer) else {
            return Err(TokenError::Issuer(seen.issuer.clone()));
        };
        let keys = self.issuers.keys(issuer, seen.kid.as_deref()).await;
        let audiences = if issuer.config.audience.is_empty() {
            vec![self.public_url(), self.resource(Some(server))]
        } else {
            issuer.config.audience.clone()
        };
        token::verify(
            token,
            &seen,
            &Check {
                issuer: &issuer.config,
                keys: &keys,
                audiences: &audiences,
                server,
                leeway_secs: self.leeway_secs,
            },
        )
        .map(|v| (v, issuer.config.name.clone()))
    }

    /// The resource URL of `server` (RFC 8707), or of the gateway.
    pub(crate) fn resource(&self, server: Option<&str>) -> String {
        match server {
            Some(s) => format!("{}/mcp/{s}", self.public_url()),
            None => self.public_url(),
        }
    }

    /// Where the RFC 9728 metadata of `server` (or the gateway) is.
    pub(crate) fn metadata_url(&self, server: Option<&str>) -> String {
        match server {
            Some(s) => format!(
                "{}/.well-known/oauth-protected-resource/mcp/{s}",
                self.public_url()
            ),
            None => format!("{}/.well-known/oauth-protected-resource", self.public_url()),
        }
    }

    /// The RFC 9728 Protected Resource Metadata of `server` (or the gateway).
    pub(crate) fn metadata(&self, server: Option<&str>) -> Value {
        json!({
            "resource": self.resource(server),
            "authorization_servers": self.issuers.identifiers(),
            "scopes_supported": self.issuers.scopes_for(server),
            "bearer_methods_supported": ["header"],
            "resource_name": match server {
                Some(s) => format!("countersign: {s}"),
                None => "countersign".to_owned(),
            },
        })
    }

    /// A refusal in words that hold no secret (never the token), for the
    /// log and the audit log.
    pub(crate) fn describe(&self, refusal: &Refusal) -> String {
        match refusal {
            Refusal::Missing => "no bearer token, or one no identity has".into(),
            Refusal::Token(e) => crate::core::legible::text(&e.to_string()).into_owned(),
        }
    }

    /// The answer to a refused request for `server` (`None`: the path named
    /// no configured server): the status and words of the rejection, and
    /// the challenge that tells the client where to sign in.
    pub(crate) fn refuse(&self, server: Option<&str>, refusal: &Refusal) -> Response {
        let (rejection, error, scope) = match refusal {
            Refusal::Missing => (Rejection::Token, None, None),
            Refusal::Token(TokenError::Scope {
                required, missing, ..
            }) => (
                Rejection::Forbidden(format!("the token lacks the scope `{missing}`")),
                Some("insufficient_scope"),
                Some(required.join(" ")),
            ),
            Refusal::Token(e @ TokenError::Tenant(_)) => (
                Rejection::Forbidden(e.to_string()),
                Some("invalid_token"),
                None,
            ),
            Refusal::Token(e) => (
                Rejection::BadToken(e.to_string()),
                Some("invalid_token"),
                None,
            ),
        };
        if let Refusal::Token(e) = refusal {
            tracing::warn!(
                server = server.unwrap_or("(not configured)"),
                "access token refused: {e}"
            );
        }
        let mut r = reject(rejection, Value::Null);
        if !self.has_issuers() {
            return r;
        }
        // The path segment is the client's text: only a configured server's
        // name goes into the challenge (a crafted one could close the quoted
        // string and add a `resource_metadata` of its own); any other path
        // is sent to the gateway's own metadata.
        let mut challenge = format!(
            "Bearer resource_metadata=\"{}\"",
            quoted(&self.metadata_url(server))
        );
        if let Some(e) = error {
            challenge.push_str(&format!(", error=\"{e}\""));
        }
        if let Some(s) = scope {
            challenge.push_str(&format!(", scope=\"{}\"", quoted(&s)));
        }
        if let Ok(v) = HeaderValue::from_str(&challenge) {
            r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
        }
        r
    }
}

/// `s` as the inside of an RFC 9110 quoted-string: `"` and `\` escaped, and
/// anything a header may not hold dropped.
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if c == '\t' || (' '..='~').contains(&c) => out.push(c),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_quoted_value_cannot_close_its_quotes() {
        assert_eq!(super::quoted("a\"b\\c\r\nd"), "a\\\"b\\\\cd");
    }

    #[test]
    fn a_connection_memo_gives_each_token_its_own_digest() {
        let sha = |t: &str| crate::core::sha256::digest(t.as_bytes());
        let memo = super::TokenMemo::default();
        // The same token again, another one (longer, shorter, one byte
        // apart), and back: each time the digest of the token given.
        for token in ["alpha", "alpha", "alphabet", "alpha", "alphb", "", "alpha"] {
            assert_eq!(memo.digest(token), sha(token), "{token:?}");
        }
    }
}
