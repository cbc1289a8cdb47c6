//! The identity providers' keys over time: each `[[auth.issuers]]` entry's
//! JWKS, from a file or fetched (OIDC discovery, then RFC 8414 metadata, or
//! a `jwks_uri`), cached, and fetched again when a token names a `kid` the
//! cache lacks or when the keys are older than `auth.keys_max_age`.
//!
//! A rotation is an ordinary event: a token under a new key fetches the
//! keys at once, unless another fetch *for an unknown `kid`* ran within
//! `auth.refetch_interval` (so a flood of made-up `kid`s makes at most one
//! fetch per interval). The start-up fetch and the `keys_max_age` refresh
//! do not count against that limit, so a key rotated right after a restart
//! is taken on its first use.
//!
//! A provider that cannot be reached leaves the cached keys in use; with no
//! usable key at all, tokens are refused and the log says why (fail
//! closed).

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::Value;

use crate::core::config::{https_or_loopback, AuthConfig, IssuerConfig};
use crate::core::token::Keys;
use crate::upstream::provider;

/// One issuer: its configuration and its cached keys.
pub(crate) struct Issuer {
    pub(crate) config: IssuerConfig,
    /// The HTTP client for its metadata and keys, with its own TLS settings
    /// (a private CA); or why there is none, which refuses every fetch.
    http: Result<reqwest::Client, String>,
    keys: Mutex<Arc<Keys>>,
    /// When the keys were last fetched (or tried) for any reason: a
    /// refresh for age waits this long after it, so a provider that is down
    /// is not asked on every token.
    fetched: Mutex<Option<Instant>>,
    /// When the keys were last fetched (or tried) because a token named a
    /// `kid` the cache lacked: the limit on fetches a stranger can cause.
    fetched_for_kid: Mutex<Option<Instant>>,
    /// When keys were last loaded successfully, for `keys_max_age`.
    loaded: Mutex<Option<Instant>>,
    /// One fetch at a time.
    fetching: tokio::sync::Mutex<()>,
}

/// Every configured issuer, and how keys are fetched.
pub(crate) struct Issuers {
    issuers: Vec<Issuer>,
    refetch_interval: Duration,
    keys_max_age: Duration,
}

impl Issuers {
    /// The issuers of `[auth]` (keys not loaded yet: see [`Issuers::load`]).
    /// An issuer whose TLS settings cannot be used is kept, with the reason:
    /// its keys are never fetched, so its tokens are refused (`serve`
    /// checks the settings before it starts).
    pub(crate) fn new(auth: &AuthConfig) -> Issuers {
        Issuers {
            issuers: auth
                .issuers
                .iter()
                .map(|c| Issuer {
                    // Kept as its words (what a refused token's log line
                    // repeats); `serve` printed the chain at start.
                    http: provider::http_client(c)
                        .inspect_err(|e| tracing::error!("{e}"))
                        .map_err(|e| e.to_string()),
                    config: c.clone(),
                    keys: Mutex::new(Arc::new(Keys::default())),
                    fetched: Mutex::new(None),
                    fetched_for_kid: Mutex::new(None),
                    loaded: Mutex::new(None),
                    fetching: tokio::sync::Mutex::new(()),
                })
                .collect(),
            refetch_interval: auth.refetch_interval,
            keys_max_age: auth.keys_max_age,
        }
    }

    /// No issuer is configured.
    pub(crate) fn is_empty(&self) -> bool {
        self.issuers.is_empty()
    }

    /// The issuer identifiers, for RFC 9728 metadata.
    pub(crate) fn identifiers(&self) -> Vec<String> {
        self.issuers
            .iter()
            .map(|i| i.config.issuer.clone())
            .collect()
    }

    /// Every scope an issuer requires for `server`, for RFC 9728 metadata.
    pub(crate) fn scopes_for(&self, server: Option<&str>) -> Vec<String> {
        let mut all = std::collections::BTreeSet::new();
        for i in &self.issuers {
            let scopes = match server {
                Some(s) => i.config.scopes.get(s).or_else(|| i.config.scopes.get("*")),
                None => None,
            };
            match scopes {
                Some(list) => all.extend(list.iter().cloned()),
                None if server.is_none() => all.extend(i.config.scopes.values().flatten().cloned()),
                None => {}
            }
        }
        all.into_iter().collect()
    }

    /// The issuer whose identifier is exactly `iss`.
    pub(crate) fn by_issuer(&self, iss: &str) -> Option<&Issuer> {
        self.issuers.iter().find(|i| i.config.issuer == iss)
    }

    /// The other issuers that publish a `kid` that `of` publishes too. Keys
    /// are looked up per issuer (the token's `iss` chooses), so an overlap
    /// refuses nothing; it is logged, because two providers that share key
    /// ids may share keys.
    fn kids_elsewhere(&self, of: &Issuer, keys: &Keys) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for other in self.issuers.iter().filter(|i| !std::ptr::eq(*i, of)) {
            let theirs = other.keys.lock().clone();
            for kid in keys.kids() {
                if theirs.has(kid) {
                    out.push((other.config.name.clone(), kid.to_owned()));
                }
            }
        }
        out
    }

    /// Load every issuer's keys (at start): a failure is logged, and the
    /// issuer's tokens are refused until its keys can be fetched.
    pub(crate) async fn load(&self) {
        for i in &self.issuers {
            self.refresh(i, Why::Start).await;
        }
    }

    /// The keys of `issuer` to verify a token naming `kid` with: the cached
    /// ones, fetched again first when they lack `kid` or are old, within the
    /// rate limit.
    pub(crate) async fn keys(&self, issuer: &Issuer, kid: Option<&str>) -> Arc<Keys> {
        let current = issuer.keys.lock().clone();
        let stale = issuer
            .loaded
            .lock()
            .is_none_or(|at| at.elapsed() >= self.keys_max_age);
        let unknown = kid.is_some_and(|k| !current.has(k));
        if unknown || current.is_empty() {
            self.refresh(issuer, Why::UnknownKid).await;
            return issuer.keys.lock().clone();
        }
        if stale {
            self.refresh(issuer, Why::Age).await;
            return issuer.keys.lock().clone();
        }
        current
    }

    /// Fetch `issuer`'s keys, unless the limit for `why` holds it back.
    /// Keys that load replace the cache; a failure leaves it as it is.
    async fn refresh(&self, issuer: &Issuer, why: Why) {
        let _one = issuer.fetching.lock().await;
        let within = |at: &Mutex<Option<Instant>>| {
            at.lock()
                .is_some_and(|at| at.elapsed() < self.refetch_interval)
        };
        // A stranger can name any `kid`: those fetches are limited on their
        // own clock. Another waiting on this lock finds the fetch just made.
        let held_back = match why {
            Why::Start => false,
            Why::UnknownKid => within(&issuer.fetched_for_kid),
            Why::Age => within(&issuer.fetched),
        };
        if held_back {
            return;
        }
        let now = Instant::now();
        *issuer.fetched.lock() = Some(now);
        if why == Why::UnknownKid {
            *issuer.fetched_for_kid.lock() = Some(now);
        }
        let name = &issuer.config.name;
        match Self::fetch(issuer).await {
            Ok(text) => match Keys::from_jwks(&text) {
                Ok((keys, notes)) => {
                    for n in notes {
                        tracing::warn!(issuer = %name, "{n}");
                    }
                    if keys.is_empty() {
                        tracing::error!(issuer = %name, "the issuer's JWKS holds no usable key: its tokens are refused");
                        // An empty set is an answer: keep what we had.
                        return;
                    }
                    tracing::info!(issuer = %name, keys = keys.len(), "issuer keys loaded");
                    for (other, kid) in self.kids_elsewhere(issuer, &keys) {
                        tracing::warn!(issuer = %name, other = %other, kid = %kid, "key id `{kid}` is published by issuers `{name}` and `{other}`: each token is checked with the keys of the issuer its `iss` names, so this refuses nothing, but check that the two providers do not share a key");
                    }
                    *issuer.keys.lock() = Arc::new(keys);
                    *issuer.loaded.lock() = Some(Instant::now());
                }
                Err(e) => {
                    tracing::error!(issuer = %name, "the issuer's JWKS is unreadable ({e}): the cached keys stay in use")
                }
            },
            Err(e) => {
                let cached = issuer.keys.lock().len();
                tracing::error!(issuer = %name, cached, "the issuer's keys could not be fetched ({e}): the cached keys stay in use");
            }
        }
    }

    /// The JWKS document of `issuer`.
    async fn fetch(issuer: &Issuer) -> Result<String, String> {
        let cfg = &issuer.config;
        if let Some(file) = &cfg.jwks_file {
            return std::fs::read_to_string(file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()));
        }
        let http = issuer.http.as_ref().map_err(Clone::clone)?;
        let uri = match &cfg.jwks_uri {
            Some(u) => u.clone(),
            None => discover(http, cfg).await?,
        };
        provider::get(http, &cfg.name, &uri).await
    }
}

/// Why an issuer's keys are fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// At start: always.
    Start,
    /// A token named a `kid` the cache lacks (or there are no keys): at most
    /// once per `auth.refetch_interval`, counted only against itself.
    UnknownKid,
    /// The keys are older than `auth.keys_max_age`.
    Age,
}

/// `jwks_uri` from the issuer's metadata ([`provider::metadata`]); it
/// must be https (or loopback).
async fn discover(http: &reqwest::Client, cfg: &IssuerConfig) -> Result<String, String> {
    let (url, meta) = provider::metadata(http, cfg).await?;
    let Some(jwks) = meta.get("jwks_uri").and_then(Value::as_str) else {
        return Err(format!("{url} has no jwks_uri"));
    };
    if !https_or_loopback(jwks) {
        return Err(format!("{url}: jwks_uri `{jwks}` is not https://"));
    }
    Ok(jwks.to_owned())
}
