//! What checking an access token costs without the cache: `core::token`'s
//! peek (header and `iss`) and verify (signature and claims) of one ES256
//! and one RS256 token, per call; and the cached path's lookup (the token's
//! SHA-256 and a map), which is what a read pays once its token is known.
//!
//! ```text
//! taskset -c 0 cargo bench --bench token
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::time_per_call;
use std::collections::{BTreeMap, HashMap};

use base64::Engine;
use countersign::core::config::IssuerConfig;
use countersign::core::token::{peek, verify, Check, Keys};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;
use sha2::{Digest, Sha256};

fn main() {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let raw = pair.public_key_raw();
    let jwks = json!({"keys": [{"kty": "EC", "crv": "P-256", "alg": "ES256", "kid": "e1",
        "x": b64.encode(&raw[1..33]), "y": b64.encode(&raw[33..65])}]})
    .to_string();
    let (keys, _) = Keys::from_jwks(&jwks).unwrap();
    let cfg = IssuerConfig {
        name: "corp".into(),
        issuer: "https://idp.example.com".into(),
        jwks_file: None,
        jwks_uri: None,
        audience: vec![],
        principal_claim: "sub".into(),
        tenant_claim: Some("tid".into()),
        tenant: None,
        tenants: Vec::new(),
        groups_claim: None,
        scopes: BTreeMap::new(),
        accept_plain_jwt: false,
        tls: None,
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = json!({"iss": cfg.issuer, "aud": "https://gw/mcp/s", "sub": "agent-1",
        "tid": "acme", "exp": now + 3600, "scope": "pay:use", "client_id": "svc"});
    let mut h = Header::new(Algorithm::ES256);
    h.kid = Some("e1".into());
    h.typ = Some("at+jwt".into());
    let token = jsonwebtoken::encode(
        &h,
        &claims,
        &EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap(),
    )
    .unwrap();
    let audiences = ["https://gw".to_owned(), "https://gw/mcp/s".to_owned()];
    let check = Check {
        issuer: &cfg,
        keys: &keys,
        audiences: &audiences,
        server: "s",
        leeway_secs: 30,
    };
    time_per_call(
        "ES256 access token, peek + verify (uncached)",
        2_000,
        || {
            let seen = peek(&token).unwrap();
            std::hint::black_box(verify(&token, &seen, &check).unwrap());
        },
    );
    // As the gateway keeps them: by the token's SHA-256, then the server.
    let mut cache: HashMap<[u8; 32], Vec<(String, u64)>> = HashMap::new();
    let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
    cache.insert(digest, vec![("s".to_owned(), now + 3600)]);
    time_per_call("cached: SHA-256 of the token + map lookup", 200_000, || {
        let d: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        std::hint::black_box(
            cache
                .get(&d)
                .and_then(|known| known.iter().find(|(s, exp)| s == "s" && *exp > now)),
        );
    });
}
