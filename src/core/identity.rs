//! Bearer-token identities (`[[identities]]`).
//!
//! Tokens are configured as SHA-256 digests, so a leaked config file does not
//! leak credentials. A presented token is hashed and looked up; the lookup key
//! is a digest the caller cannot steer, so map lookup timing reveals nothing
//! useful about valid tokens.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::core::config::IdentityConfig;

/// Who is calling: the requester of every decision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// The requester's name (`NAME:SUBJECT` for an issuer's token).
    pub principal: String,
    /// The requester's tenant.
    pub tenant: String,
    /// Groups, for policies.
    pub groups: Vec<String>,
    /// OAuth scopes the token grants (none for a static token).
    pub scopes: Vec<String>,
    /// The OAuth client the token was issued to (`azp`/`client_id`).
    pub client: Option<String>,
    /// Other names of the same person, from an issuer's token: its `sub`
    /// and `email` claims. A reviewer known by one of them never approves
    /// this requester's call.
    pub aka: Vec<String>,
}

impl Identity {
    /// How a person reads it: `alice@acme`, or `alice@acme via claude-code`.
    pub fn describe(&self) -> String {
        match &self.client {
            Some(c) => format!("{}@{} via {c}", self.principal, self.tenant),
            None => format!("{}@{}", self.principal, self.tenant),
        }
    }
}

/// The access token a caller presented, kept with its request (never with
/// its session, never on disk) for one use: delegation, where the gateway
/// trades it at the issuer for a token meant for one upstream (DESIGN.md
/// section 23). Only an issuer's verified token is kept; a static token
/// never is. Its `Debug` form never shows the token.
#[derive(Clone, PartialEq, Eq)]
pub struct SubjectToken {
    /// The `[[auth.issuers]]` name that issued and verified it.
    pub issuer: String,
    /// The token itself.
    pub token: String,
    /// Its `exp`, unix ms: nothing exchanged from it is used past this.
    pub expires_ms: i64,
}

impl std::fmt::Debug for SubjectToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubjectToken")
            .field("issuer", &self.issuer)
            .field("expires_ms", &self.expires_ms)
            .finish_non_exhaustive()
    }
}

/// Token digest → identity.
#[derive(Debug, Default)]
pub struct Identities {
    by_digest: crate::core::FastMap<[u8; 32], Arc<Identity>>,
}

impl Identities {
    /// Build the table from config (digests were checked by `Config::check`).
    pub fn from_config(entries: &[IdentityConfig]) -> Identities {
        let mut by_digest = crate::core::FastMap::default();
        for e in entries {
            let mut digest = [0u8; 32];
            if hex::decode_to_slice(&e.token_sha256, &mut digest).is_ok() {
                by_digest.insert(
                    digest,
                    Arc::new(Identity {
                        principal: e.principal.clone(),
                        tenant: e.tenant.clone(),
                        groups: e.groups.clone(),
                        ..Identity::default()
                    }),
                );
            }
        }
        Identities { by_digest }
    }

    /// The identity a raw bearer token stands for.
    pub fn lookup(&self, token: &str) -> Option<Arc<Identity>> {
        self.by_digest(&crate::core::sha256::digest(token.as_bytes()))
    }

    /// The identity whose token has this SHA-256.
    pub fn by_digest(&self, digest: &[u8; 32]) -> Option<Arc<Identity>> {
        self.by_digest.get(digest).cloned()
    }

    /// The identity behind an `Authorization` header value (`Bearer TOKEN`).
    pub fn from_authorization(&self, header: Option<&str>) -> Option<Arc<Identity>> {
        let value = header?;
        let (scheme, token) = value.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        self.lookup(token.trim())
    }
}

/// Hex SHA-256 of a token, as written in `token_sha256`.
pub fn token_digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_lookup() {
        let ids = Identities::from_config(&[IdentityConfig {
            token_sha256: token_digest("s3cret"),
            principal: "agent-7".into(),
            tenant: "acme".into(),
            groups: vec![],
        }]);
        assert_eq!(
            ids.from_authorization(Some("Bearer s3cret"))
                .unwrap()
                .principal,
            "agent-7"
        );
        assert!(ids.from_authorization(Some("bearer s3cret")).is_some());
        assert!(ids.from_authorization(Some("Bearer wrong")).is_none());
        assert!(ids.from_authorization(Some("Basic s3cret")).is_none());
        assert!(ids.from_authorization(None).is_none());
    }
}
