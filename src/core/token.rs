//! OAuth 2.1 access tokens (JWT, RFC 9068) as the gateway checks them: the
//! pure part, with no I/O. The keys come from the issuer's JWKS, fetched by
//! the front end (`front::issuers`); this module turns a token and those keys
//! into an [`Identity`], or says precisely why not (DESIGN.md section 17).
//!
//! What is checked, and against what:
//! - the header: an asymmetric algorithm only (RS*, PS*, ES256/384, EdDSA);
//!   `none` and HMAC are refused before any key is looked at, so a token
//!   "signed" with a public key as an HMAC secret never verifies;
//! - `typ`: `at+jwt` (RFC 9068), plain `JWT` only where the issuer allows it;
//! - the signature, with the issuer's key named by `kid` (a key that another
//!   configured issuer also publishes is refused: no issuer speaks for another);
//! - `iss` exactly, `aud` one of the audiences of this gateway for this
//!   server (RFC 8707), `exp` and `nbf` with the configured leeway;
//! - the principal claim, the tenant (a claim, or the issuer's fixed tenant;
//!   never guessed) and the scopes the server requires.

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine;
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;

use super::config::IssuerConfig;
use super::identity::Identity;

/// Why a token is not accepted. The front end answers 401 for all but
/// [`TokenError::Scope`] and [`TokenError::Tenant`] (403).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not three base64url parts with a JSON header and payload.
    #[error("the bearer token is not a JWT ({0})")]
    Malformed(String),
    /// `alg: none`, HMAC, or an algorithm the gateway does not accept.
    #[error("the token's algorithm `{0}` is not accepted: only RS*, PS*, ES256, ES384 and EdDSA")]
    Algorithm(String),
    /// `typ` is not `at+jwt` (or `JWT` where allowed).
    #[error("the token's typ `{0}` is not an access token (`at+jwt`, RFC 9068)")]
    Type(String),
    /// No configured issuer has this `iss`.
    #[error("the token's issuer `{0}` is not one this gateway accepts")]
    Issuer(String),
    /// The token names no `kid`, or one the issuer does not publish.
    #[error("the issuer `{issuer}` has no key `{kid}` (after fetching its keys again)")]
    UnknownKey {
        /// The issuer.
        issuer: String,
        /// The key id the token names (`(none)` when absent).
        kid: String,
    },
    /// The token names a tenant its issuer may not speak for
    /// (`[[auth.issuers]] tenants`).
    #[error("issuer `{issuer}` may not issue tokens for tenant `{tenant}` (its `tenants` list)")]
    TenantNotAllowed {
        /// The issuer's name.
        issuer: String,
        /// The tenant the token named.
        tenant: String,
    },
    /// No key of the issuer could be loaded at all.
    #[error("no usable key of issuer `{0}` (its JWKS could not be fetched or read)")]
    NoKeys(String),
    /// The signature does not verify, or `exp`/`nbf`/`aud`/`iss` fail.
    #[error("the token is not valid here: {0}")]
    Invalid(String),
    /// The principal claim is missing or not a string.
    #[error("the token has no `{0}` claim naming the principal")]
    Principal(String),
    /// The tenant claim is missing (403: the token is genuine, but whose
    /// tenant it acts for is unknown, and a tenant is never guessed).
    #[error("the token has no `{0}` claim naming the tenant")]
    Tenant(String),
    /// A scope the server requires is missing (403 `insufficient_scope`).
    #[error("the token lacks the scope `{missing}` that server `{server}` requires")]
    Scope {
        /// The server asked for.
        server: String,
        /// The first scope missing.
        missing: String,
        /// Every scope the server requires (for the challenge).
        required: Vec<String>,
    },
}

/// One issuer's verification keys, by `kid`.
#[derive(Default, Clone)]
pub struct Keys {
    by_kid: HashMap<String, (DecodingKey, Algorithm)>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut kids: Vec<&String> = self.by_kid.keys().collect();
        kids.sort();
        f.debug_struct("Keys").field("kids", &kids).finish()
    }
}

impl Keys {
    /// The asymmetric keys of a JWKS document. Symmetric (`oct`) keys, keys
    /// without a `kid`, keys meant for encryption (`use: enc`) and keys that
    /// do not load are skipped, each said in the returned list of notes.
    pub fn from_jwks(text: &str) -> Result<(Keys, Vec<String>), String> {
        let set: JwkSet =
            serde_json::from_str(text).map_err(|e| format!("not a JWKS document: {e}"))?;
        let mut by_kid = HashMap::new();
        let mut notes = Vec::new();
        for jwk in &set.keys {
            let Some(kid) = jwk.common.key_id.clone() else {
                notes.push("a key without `kid` was skipped".to_owned());
                continue;
            };
            if matches!(
                jwk.common.public_key_use,
                Some(jsonwebtoken::jwk::PublicKeyUse::Encryption)
            ) {
                notes.push(format!("key `{kid}` is for encryption: skipped"));
                continue;
            }
            // A symmetric key in a JWKS could only ever verify HMAC tokens,
            // which are refused: never load one.
            let alg = match (&jwk.algorithm, jwk.common.key_algorithm) {
                (AlgorithmParameters::OctetKey(_), _) => {
                    notes.push(format!("key `{kid}` is symmetric (oct): skipped"));
                    continue;
                }
                (_, Some(a)) => match asymmetric(a) {
                    Some(a) => a,
                    None => {
                        notes.push(format!("key `{kid}` has algorithm {a:?}: skipped"));
                        continue;
                    }
                },
                (AlgorithmParameters::RSA(_), None) => Algorithm::RS256,
                (AlgorithmParameters::EllipticCurve(p), None) => match p.curve {
                    jsonwebtoken::jwk::EllipticCurve::P256 => Algorithm::ES256,
                    jsonwebtoken::jwk::EllipticCurve::P384 => Algorithm::ES384,
                    _ => {
                        notes.push(format!("key `{kid}` is on a curve not accepted: skipped"));
                        continue;
                    }
                },
                (AlgorithmParameters::OctetKeyPair(_), None) => Algorithm::EdDSA,
            };
            match DecodingKey::from_jwk(jwk) {
                Ok(key) => {
                    by_kid.insert(kid, (key, alg));
                }
                Err(e) => notes.push(format!("key `{kid}` does not load: {e}")),
            }
        }
        Ok((Keys { by_kid }, notes))
    }

    /// Whether a key of this id is here.
    pub fn has(&self, kid: &str) -> bool {
        self.by_kid.contains_key(kid)
    }

    /// Every key id.
    pub fn kids(&self) -> impl Iterator<Item = &str> {
        self.by_kid.keys().map(String::as_str)
    }

    /// How many keys.
    pub fn len(&self) -> usize {
        self.by_kid.len()
    }

    /// No keys at all.
    pub fn is_empty(&self) -> bool {
        self.by_kid.is_empty()
    }
}

/// The asymmetric algorithm of a JWK's `alg`, or `None` for anything else.
fn asymmetric(a: KeyAlgorithm) -> Option<Algorithm> {
    Some(match a {
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        _ => return None,
    })
}

/// What the unverified header and payload say, to choose the issuer and the
/// key. Nothing in it is trusted until [`verify`] passed.
#[derive(Debug)]
pub struct Unverified {
    /// `iss`.
    pub issuer: String,
    /// `kid` of the header, if any.
    pub kid: Option<String>,
    alg: Algorithm,
    typ: Option<String>,
}

/// Read the header and `iss` of a token, refusing what can never be
/// accepted (`none`, HMAC, another shape) before any key is looked at.
pub fn peek(token: &str) -> Result<Unverified, TokenError> {
    let mut parts = token.split('.');
    let (Some(header), Some(payload), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed(
            "not three dot-separated parts".into(),
        ));
    };
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header: Value = b64
        .decode(header)
        .ok()
        .and_then(|h| serde_json::from_slice(&h).ok())
        .ok_or_else(|| TokenError::Malformed("the header is not base64url JSON".into()))?;
    let alg_text = header.get("alg").and_then(Value::as_str).unwrap_or("");
    // Algorithm confusion: an HMAC "signature" made with a public key as
    // the secret, or `none`, is refused by name, whatever keys exist.
    let alg = match alg_text {
        "RS256" => Algorithm::RS256,
        "RS384" => Algorithm::RS384,
        "RS512" => Algorithm::RS512,
        "PS256" => Algorithm::PS256,
        "PS384" => Algorithm::PS384,
        "PS512" => Algorithm::PS512,
        "ES256" => Algorithm::ES256,
        "ES384" => Algorithm::ES384,
        "EdDSA" => Algorithm::EdDSA,
        other => return Err(TokenError::Algorithm(other.to_owned())),
    };
    // RFC 7515 section 4.1.11: `crit` lists header extensions the
    // recipient must understand, or reject the token. This gateway
    // understands none, so any `crit` is refused (a `b64: false` token, say,
    // would otherwise be checked over other bytes than its issuer meant).
    if let Some(crit) = header.get("crit") {
        return Err(TokenError::Malformed(format!(
            "the header's `crit` ({crit}) names extensions this gateway does not understand (RFC 7515 section 4.1.11)"
        )));
    }
    let typ = header.get("typ").and_then(Value::as_str).map(str::to_owned);
    let kid = header.get("kid").and_then(Value::as_str).map(str::to_owned);
    let payload: Value = b64
        .decode(payload)
        .ok()
        .and_then(|p| serde_json::from_slice(&p).ok())
        .ok_or_else(|| TokenError::Malformed("the payload is not base64url JSON".into()))?;
    let issuer = payload
        .get("iss")
        .and_then(Value::as_str)
        .ok_or_else(|| TokenError::Invalid("no `iss` claim".into()))?
        .to_owned();
    Ok(Unverified {
        issuer,
        kid,
        alg,
        typ,
    })
}

/// What a verified token grants: the identity, and until when (unix ms).
#[derive(Debug, Clone)]
pub struct Verified {
    /// The identity, namespaced by the issuer.
    pub identity: Arc<Identity>,
    /// `exp`, in unix milliseconds.
    pub expires_ms: i64,
}

/// What one check is made against.
pub struct Check<'a> {
    /// The issuer's configuration.
    pub issuer: &'a IssuerConfig,
    /// The issuer's keys.
    pub keys: &'a Keys,
    /// The audiences this gateway is for this server (RFC 8707).
    pub audiences: &'a [String],
    /// The server asked for.
    pub server: &'a str,
    /// `exp`/`nbf` leeway, in seconds.
    pub leeway_secs: u64,
}

/// Verify `token` (already [`peek`]ed as `seen`) and map its claims.
pub fn verify(token: &str, seen: &Unverified, check: &Check<'_>) -> Result<Verified, TokenError> {
    let cfg = check.issuer;
    match seen.typ.as_deref().map(str::to_ascii_lowercase).as_deref() {
        Some("at+jwt" | "application/at+jwt") => {}
        Some("jwt") | None if cfg.accept_plain_jwt => {}
        other => return Err(TokenError::Type(other.unwrap_or("(none)").to_owned())),
    }
    let kid = seen.kid.as_deref().ok_or_else(|| TokenError::UnknownKey {
        issuer: cfg.issuer.clone(),
        kid: "(none)".into(),
    })?;
    if check.keys.is_empty() {
        return Err(TokenError::NoKeys(cfg.issuer.clone()));
    }
    let Some((key, key_alg)) = check.keys.by_kid.get(kid) else {
        return Err(TokenError::UnknownKey {
            issuer: cfg.issuer.clone(),
            kid: kid.to_owned(),
        });
    };
    // The key is this issuer's own (the keys are those of the issuer `iss`
    // names): a `kid` another provider publishes too changes nothing here.
    // The key says which algorithm it is for: a token may not pick another.
    if *key_alg != seen.alg {
        return Err(TokenError::Algorithm(format!(
            "{:?} (key `{kid}` is for {key_alg:?})",
            seen.alg
        )));
    }
    let mut v = Validation::new(seen.alg);
    v.algorithms = vec![seen.alg];
    v.set_issuer(&[cfg.issuer.as_str()]);
    v.set_audience(check.audiences);
    v.leeway = check.leeway_secs;
    v.validate_exp = true;
    v.validate_nbf = true;
    v.set_required_spec_claims(&["exp", "iss", "aud"]);
    let data = jsonwebtoken::decode::<serde_json::Map<String, Value>>(token, key, &v).map_err(
        |e| match e.kind() {
            jsonwebtoken::errors::ErrorKind::InvalidAudience => TokenError::Invalid(format!(
                "it was issued for another audience (`aud`); here it must be one of {}",
                check.audiences.join(", ")
            )),
            _ => TokenError::Invalid(explain(&e)),
        },
    )?;
    let claims = data.claims;
    let subject = claims
        .get(&cfg.principal_claim)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| TokenError::Principal(cfg.principal_claim.clone()))?;
    let tenant = match (&cfg.tenant_claim, &cfg.tenant) {
        (Some(claim), _) => claims
            .get(claim)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| TokenError::Tenant(claim.clone()))?
            .to_owned(),
        (None, Some(fixed)) => fixed.clone(),
        // Config::check requires one of the two.
        (None, None) => return Err(TokenError::Tenant("tenant".into())),
    };
    // A provider speaks only for its own tenants: without the list, any
    // provider configured here could mint a token for any tenant.
    if !cfg.tenants.is_empty() && !cfg.tenants.contains(&tenant) {
        return Err(TokenError::TenantNotAllowed {
            issuer: cfg.name.clone(),
            tenant,
        });
    }
    let groups = cfg
        .groups_claim
        .as_ref()
        .map(|c| strings(claims.get(c)))
        .unwrap_or_default();
    let mut scopes = strings(claims.get("scope"));
    scopes.extend(strings(claims.get("scp")));
    if let Some(required) = cfg.scopes.get(check.server).or_else(|| cfg.scopes.get("*")) {
        if let Some(missing) = required.iter().find(|s| !scopes.contains(s)) {
            return Err(TokenError::Scope {
                server: check.server.to_owned(),
                missing: missing.clone(),
                required: required.clone(),
            });
        }
    }
    let client = claims
        .get("azp")
        .or_else(|| claims.get("client_id"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let exp = claims.get("exp").and_then(Value::as_i64).unwrap_or(0);
    // The person's other names, whatever claim names the principal: the
    // self-approval guard compares reviewers with each of them.
    let aka = ["sub", "email"]
        .iter()
        .filter_map(|c| claims.get(*c).and_then(Value::as_str))
        .filter(|n| !n.is_empty() && *n != subject)
        .map(str::to_owned)
        .collect();
    Ok(Verified {
        identity: Arc::new(Identity {
            // Namespaced: the same `sub` from two issuers is two principals,
            // and no static principal (which may not contain `:`) is one.
            principal: format!("{}:{subject}", cfg.name),
            tenant,
            groups,
            scopes,
            client,
            aka,
        }),
        expires_ms: exp.saturating_mul(1000),
    })
}

/// A claim that is a list of strings: a JSON array, or one space-separated
/// string (`scope`).
fn strings(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::String(s)) => s.split_whitespace().map(str::to_owned).collect(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

/// The reason a decode failed, in words an operator can act on.
fn explain(e: &jsonwebtoken::errors::Error) -> String {
    use jsonwebtoken::errors::ErrorKind as K;
    match e.kind() {
        K::InvalidSignature => "the signature does not verify".into(),
        K::ExpiredSignature => "it has expired (`exp`)".into(),
        K::ImmatureSignature => "it is not valid yet (`nbf`)".into(),
        K::InvalidAudience => "it was issued for another audience (`aud`)".into(),
        K::InvalidIssuer => "its issuer (`iss`) is not the one whose key signed it".into(),
        K::MissingRequiredClaim(c) => format!("it has no `{c}` claim"),
        K::InvalidAlgorithm => "its algorithm does not match its key".into(),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::json;
    use std::collections::BTreeMap;

    const ISS: &str = "https://idp.example.com";
    const AUD: &str = "https://gw.example.com/mcp/pay";

    struct Signer {
        key: EncodingKey,
        jwks: String,
    }

    /// A P-256 key made for the test, and its JWKS (kid `k1`).
    fn signer(kid: &str) -> Signer {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let raw = pair.public_key_raw();
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let jwks = json!({"keys": [{
            "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
            "x": b64.encode(&raw[1..33]), "y": b64.encode(&raw[33..65]),
        }]})
        .to_string();
        Signer {
            key: EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap(),
            jwks,
        }
    }

    fn issuer() -> IssuerConfig {
        IssuerConfig {
            name: "idp".into(),
            issuer: ISS.into(),
            jwks_file: None,
            jwks_uri: None,
            audience: vec![],
            principal_claim: "sub".into(),
            tenant_claim: Some("tid".into()),
            tenant: None,
            tenants: Vec::new(),
            groups_claim: Some("groups".into()),
            scopes: BTreeMap::from([("pay".to_owned(), vec!["pay:write".to_owned()])]),
            accept_plain_jwt: false,
            tls: None,
        }
    }

    fn now() -> i64 {
        crate::core::time::now_ms() / 1000
    }

    fn claims() -> Value {
        json!({
            "iss": ISS, "aud": AUD, "sub": "alice", "tid": "acme",
            "exp": now() + 300, "nbf": now() - 10, "iat": now() - 10,
            "scope": "pay:write pay:read", "groups": ["leads"], "azp": "claude-code",
        })
    }

    fn sign(s: &Signer, kid: &str, typ: &str, claims: &Value) -> String {
        let mut h = Header::new(Algorithm::ES256);
        h.kid = Some(kid.into());
        h.typ = Some(typ.into());
        jsonwebtoken::encode(&h, claims, &s.key).unwrap()
    }

    fn check(token: &str, keys: &Keys, cfg: &IssuerConfig) -> Result<Verified, TokenError> {
        let seen = peek(token)?;
        verify(
            token,
            &seen,
            &Check {
                issuer: cfg,
                keys,
                audiences: &[AUD.to_owned()],
                server: "pay",
                leeway_secs: 5,
            },
        )
    }

    fn unsigned(header: Value, claims: &Value) -> String {
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!(
            "{}.{}.{}",
            b64.encode(header.to_string()),
            b64.encode(claims.to_string()),
            b64.encode(b"sig")
        )
    }

    #[test]
    fn a_valid_access_token_is_an_identity_namespaced_by_its_issuer() {
        let s = signer("k1");
        let (keys, notes) = Keys::from_jwks(&s.jwks).unwrap();
        assert!(notes.is_empty(), "{notes:?}");
        let v = check(&sign(&s, "k1", "at+jwt", &claims()), &keys, &issuer()).unwrap();
        let id = &v.identity;
        assert_eq!(id.principal, "idp:alice");
        assert_eq!(id.tenant, "acme");
        assert_eq!(id.groups, vec!["leads"]);
        assert_eq!(id.scopes, vec!["pay:write", "pay:read"]);
        assert_eq!(id.client.as_deref(), Some("claude-code"));
        assert_eq!(id.describe(), "idp:alice@acme via claude-code");
        assert!(v.expires_ms > crate::core::time::now_ms());
    }

    #[test]
    fn forged_misdirected_expired_and_foreign_tokens_are_refused_precisely() {
        let s = signer("k1");
        let (keys, _) = Keys::from_jwks(&s.jwks).unwrap();
        let cfg = issuer();
        let mut c = claims();
        c["aud"] = json!("https://gw.example.com/mcp/other");
        let e = check(&sign(&s, "k1", "at+jwt", &c), &keys, &cfg).unwrap_err();
        assert_eq!(
            e,
            TokenError::Invalid(format!(
                "it was issued for another audience (`aud`); here it must be one of {AUD}"
            ))
        );
        let mut c = claims();
        c["exp"] = json!(now() - 60);
        let e = check(&sign(&s, "k1", "at+jwt", &c), &keys, &cfg).unwrap_err();
        assert_eq!(e, TokenError::Invalid("it has expired (`exp`)".into()));
        // Signed by another key under the same kid: a forgery.
        let other = signer("k1");
        let e = check(&sign(&other, "k1", "at+jwt", &claims()), &keys, &cfg).unwrap_err();
        assert_eq!(
            e,
            TokenError::Invalid("the signature does not verify".into())
        );
        // A kid the issuer does not publish.
        let e = check(&sign(&s, "k9", "at+jwt", &claims()), &keys, &cfg).unwrap_err();
        assert!(
            matches!(e, TokenError::UnknownKey { ref kid, .. } if kid == "k9"),
            "{e:?}"
        );
        // `iss` of the token is not the issuer whose keys verify it.
        let mut c = claims();
        c["iss"] = json!("https://evil.example.com");
        let e = check(&sign(&s, "k1", "at+jwt", &c), &keys, &cfg).unwrap_err();
        assert!(matches!(e, TokenError::Invalid(_)), "{e:?}");
    }

    #[test]
    fn none_and_hmac_are_refused_before_any_key() {
        let s = signer("k1");
        let (keys, _) = Keys::from_jwks(&s.jwks).unwrap();
        let none = unsigned(
            json!({"alg": "none", "typ": "at+jwt", "kid": "k1"}),
            &claims(),
        );
        assert_eq!(
            check(&none, &keys, &issuer()).unwrap_err(),
            TokenError::Algorithm("none".into())
        );
        // HS256 "signed" with the public JWKS as the secret: algorithm
        // confusion, refused by name.
        let mut h = Header::new(Algorithm::HS256);
        h.kid = Some("k1".into());
        h.typ = Some("at+jwt".into());
        let hs = jsonwebtoken::encode(&h, &claims(), &EncodingKey::from_secret(s.jwks.as_bytes()))
            .unwrap();
        assert_eq!(
            check(&hs, &keys, &issuer()).unwrap_err(),
            TokenError::Algorithm("HS256".into())
        );
        // A symmetric key in the JWKS is never loaded.
        let (keys, notes) =
            Keys::from_jwks(r#"{"keys":[{"kty":"oct","k":"c2VjcmV0","kid":"h1"}]}"#).unwrap();
        assert!(
            keys.is_empty() && notes[0].contains("symmetric"),
            "{notes:?}"
        );
    }

    #[test]
    fn typ_tenant_scope_and_the_issuers_tenants_are_checked() {
        let s = signer("k1");
        let (keys, _) = Keys::from_jwks(&s.jwks).unwrap();
        let mut cfg = issuer();
        let plain = sign(&s, "k1", "JWT", &claims());
        assert_eq!(
            check(&plain, &keys, &cfg).unwrap_err(),
            TokenError::Type("jwt".into())
        );
        cfg.accept_plain_jwt = true;
        assert!(check(&plain, &keys, &cfg).is_ok());
        let mut c = claims();
        c.as_object_mut().unwrap().remove("tid");
        assert_eq!(
            check(&sign(&s, "k1", "at+jwt", &c), &keys, &cfg).unwrap_err(),
            TokenError::Tenant("tid".into())
        );
        let mut c = claims();
        c["scope"] = json!("pay:read");
        assert!(matches!(
            check(&sign(&s, "k1", "at+jwt", &c), &keys, &cfg).unwrap_err(),
            TokenError::Scope { ref missing, .. } if missing == "pay:write"
        ));
        // An issuer limited to other tenants may not speak for `acme`.
        let token = sign(&s, "k1", "at+jwt", &claims());
        cfg.tenants = vec!["globex".into()];
        assert_eq!(
            check(&token, &keys, &cfg).unwrap_err(),
            TokenError::TenantNotAllowed {
                issuer: "idp".into(),
                tenant: "acme".into()
            }
        );
        cfg.tenants.push("acme".into());
        assert!(check(&token, &keys, &cfg).is_ok());
    }

    #[test]
    fn a_crit_header_is_refused_whatever_it_names() {
        let s = signer("k1");
        let (keys, _) = Keys::from_jwks(&s.jwks).unwrap();
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let header =
            json!({"alg": "ES256", "typ": "at+jwt", "kid": "k1", "crit": ["exp"], "exp": 1});
        let input = format!(
            "{}.{}",
            b64.encode(header.to_string()),
            b64.encode(claims().to_string())
        );
        let sig = jsonwebtoken::crypto::sign(input.as_bytes(), &s.key, Algorithm::ES256).unwrap();
        let token = format!("{input}.{sig}");
        let e = peek(&token).unwrap_err();
        assert!(
            matches!(e, TokenError::Malformed(ref m) if m.contains("`crit`")),
            "{e:?}"
        );
        // The same token without `crit` is fine: nothing else refused it.
        let plain = sign(&s, "k1", "at+jwt", &claims());
        assert!(check(&plain, &keys, &issuer()).is_ok());
    }
}
