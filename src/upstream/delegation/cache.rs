//! Exchanged tokens, kept in memory only, per (issuer, subject, client,
//! server, scopes): never shared across principals, never written anywhere.
//! A token is used until shortly before its own expiry, and never past the
//! expiry of the caller's token it was exchanged for: once the person's own
//! token is no longer valid, nothing minted from it is used.

use std::collections::HashMap;

use parking_lot::Mutex;

use super::exchange::Exchanged;

/// Whose token, for what: two principals never share an entry, nor one
/// principal two tenants, two of their own tokens, two servers or two scope
/// sets. A person with a token for tenant `acme` and another for `globex`
/// gets a token exchanged from each: a call decided for `globex` never goes
/// out with what was minted from the `acme` token.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    pub issuer: String,
    pub subject: String,
    /// The tenant the call was decided for.
    pub tenant: String,
    /// The caller's own token, by its SHA-256 (never the token).
    pub caller: String,
    pub client: String,
    pub server: String,
    /// Sorted.
    pub scopes: Vec<String>,
}

/// Whose tokens [`TokenCache::forget`] drops: one person in one tenant at
/// one issuer, whatever token, server or scopes.
#[derive(Debug, Clone, Copy)]
pub struct Whose<'a> {
    pub issuer: &'a str,
    pub subject: &'a str,
    pub tenant: &'a str,
}

impl CacheKey {
    /// The key of a token exchanged from `caller_token`, with `scopes` in a
    /// canonical order.
    pub fn new(
        who: Whose<'_>,
        caller_token: &str,
        client: &str,
        server: &str,
        scopes: &[String],
    ) -> CacheKey {
        use sha2::Digest;
        let mut scopes = scopes.to_vec();
        scopes.sort();
        scopes.dedup();
        CacheKey {
            issuer: who.issuer.into(),
            subject: who.subject.into(),
            tenant: who.tenant.into(),
            caller: hex::encode(sha2::Sha256::digest(caller_token.as_bytes())),
            client: client.into(),
            server: server.into(),
            scopes,
        }
    }

    fn is(&self, who: Whose<'_>) -> bool {
        self.issuer == who.issuer && self.subject == who.subject && self.tenant == who.tenant
    }
}

struct Entry {
    token: Exchanged,
    /// Usable until (unix ms): the token's expiry less the margin, and no
    /// later than the caller's token.
    until_ms: i64,
}

/// The cache.
pub struct TokenCache {
    entries: Mutex<HashMap<CacheKey, Entry>>,
    /// Most entries kept (expired ones go first, then the soonest to end).
    max: usize,
}

impl TokenCache {
    /// At most `max` tokens.
    pub fn new(max: usize) -> TokenCache {
        TokenCache {
            entries: Mutex::new(HashMap::new()),
            max: max.max(1),
        }
    }

    /// The token for `key`, if one is still usable at `now_ms`.
    pub fn get(&self, key: &CacheKey, now_ms: i64) -> Option<Exchanged> {
        let mut entries = self.entries.lock();
        match entries.get(key) {
            Some(e) if now_ms < e.until_ms => Some(e.token.clone()),
            Some(_) => {
                entries.remove(key);
                None
            }
            None => None,
        }
    }

    /// Keep `token` for `key`, exchanged for a caller token that expires at
    /// `caller_exp_ms`, until `margin_ms` before its own expiry. A token
    /// without a known expiry is not kept: it is exchanged again for the
    /// next call.
    pub fn put(
        &self,
        key: CacheKey,
        token: Exchanged,
        caller_exp_ms: Option<i64>,
        margin_ms: i64,
        now_ms: i64,
    ) {
        let Some(exp) = token.expires_at_ms else {
            return;
        };
        let until_ms = exp
            .saturating_sub(margin_ms)
            .min(caller_exp_ms.unwrap_or(i64::MAX));
        if until_ms <= now_ms {
            return;
        }
        let mut entries = self.entries.lock();
        if entries.len() >= self.max && !entries.contains_key(&key) {
            entries.retain(|_, e| e.until_ms > now_ms);
            if entries.len() >= self.max {
                if let Some(first) = entries
                    .iter()
                    .min_by_key(|(_, e)| e.until_ms)
                    .map(|(k, _)| k.clone())
                {
                    entries.remove(&first);
                }
            }
        }
        entries.insert(key, Entry { token, until_ms });
    }

    /// Forget every token of `who` (its caller token was refused, or
    /// expired): the same fields that key the tokens.
    pub fn forget(&self, who: Whose<'_>) {
        self.entries.lock().retain(|k, _| !k.is(who));
    }

    /// Entries kept.
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(id: &str, exp: Option<i64>) -> Exchanged {
        Exchanged {
            access_token: format!("tok-{id}"),
            expires_at_ms: exp,
            scope: None,
            id: id.into(),
        }
    }

    fn who(subject: &str) -> Whose<'_> {
        Whose {
            issuer: "okta",
            subject,
            tenant: "acme",
        }
    }

    fn key(subject: &str) -> CacheKey {
        CacheKey::new(
            who(subject),
            "caller-token",
            "countersign",
            "github",
            &["repo".into()],
        )
    }

    #[test]
    fn a_token_serves_its_own_subject_until_shortly_before_it_expires() {
        let c = TokenCache::new(100);
        let m = 30_000;
        c.put(key("alice"), token("a", Some(100_000)), None, m, 0);
        assert_eq!(c.get(&key("alice"), 69_999).unwrap().id, "a");
        assert!(
            c.get(&key("alice"), 70_000).is_none(),
            "within the margin: exchanged again"
        );
        assert!(c.get(&key("bob"), 0).is_none(), "never another principal's");
        // Another server or scope set is another entry.
        c.put(key("alice"), token("a2", Some(100_000)), None, m, 0);
        let other = CacheKey::new(
            who("alice"),
            "caller-token",
            "countersign",
            "jira",
            &["repo".into()],
        );
        assert!(c.get(&other, 0).is_none());
        // Scope order does not matter.
        let same = CacheKey::new(
            who("alice"),
            "caller-token",
            "countersign",
            "github",
            &["repo".into(), "repo".into()],
        );
        assert_eq!(c.get(&same, 0).unwrap().id, "a2");
    }

    /// F1 (second attack): a token exchanged for a person's `acme` token
    /// never serves their `globex` call, nor another of their tokens.
    #[test]
    fn f1_a_token_exchanged_for_one_tenant_never_serves_another() {
        let c = TokenCache::new(100);
        c.put(key("alice"), token("acme", Some(100_000)), None, 0, 0);
        let globex = Whose {
            tenant: "globex",
            ..who("alice")
        };
        let other_tenant = CacheKey::new(
            globex,
            "caller-token",
            "countersign",
            "github",
            &["repo".into()],
        );
        assert!(c.get(&other_tenant, 0).is_none(), "another tenant");
        let other_token = CacheKey::new(
            who("alice"),
            "another-token",
            "countersign",
            "github",
            &["repo".into()],
        );
        assert!(c.get(&other_token, 0).is_none(), "another caller token");
        c.put(
            other_tenant.clone(),
            token("globex", Some(100_000)),
            None,
            0,
            0,
        );
        // Forgetting one tenant's tokens leaves the other's.
        c.forget(globex);
        assert!(c.get(&other_tenant, 0).is_none());
        assert_eq!(c.get(&key("alice"), 0).unwrap().id, "acme");
    }

    #[test]
    fn never_past_the_callers_own_token_and_never_without_an_expiry() {
        let c = TokenCache::new(100);
        let m = 0;
        c.put(key("alice"), token("a", Some(100_000)), Some(50_000), m, 0);
        assert!(c.get(&key("alice"), 49_999).is_some());
        assert!(
            c.get(&key("alice"), 50_000).is_none(),
            "the caller's token expired"
        );
        c.put(key("bob"), token("b", None), None, m, 0);
        assert!(c.get(&key("bob"), 0).is_none(), "no known expiry: not kept");
        c.put(key("carol"), token("c", Some(100_000)), None, m, 0);
        c.forget(who("carol"));
        assert!(c.get(&key("carol"), 0).is_none());
    }

    #[test]
    fn the_cache_stays_bounded() {
        let c = TokenCache::new(3);
        let m = 0;
        for (i, who) in ["a", "b", "c", "d"].iter().enumerate() {
            c.put(key(who), token(who, Some(1_000 + i as i64)), None, m, 0);
        }
        assert_eq!(c.len(), 3);
        assert!(
            c.get(&key("a"), 0).is_none(),
            "the soonest to end went first"
        );
        assert!(c.get(&key("d"), 0).is_some());
    }
}
