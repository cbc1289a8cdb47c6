//! An access token's header and claims as countersign reads them: the
//! fuzzer's header and claims are signed with the issuer's own key, so the
//! claim mapping behind the signature is reached too. Never a panic; a
//! token that passes names a principal of the issuer (`NAME:SUBJECT`) and a
//! tenant; a token whose signature is changed never passes.
#![no_main]

use std::sync::OnceLock;

use base64::Engine;
use countersign::core::config::IssuerConfig;
use countersign::core::token::{peek, verify, Check, Keys};
use libfuzzer_sys::fuzz_target;
use ring::signature::KeyPair;

struct Issuer {
    pkcs8: Vec<u8>,
    keys: Keys,
    config: IssuerConfig,
}

fn issuer() -> &'static Issuer {
    static ISSUER: OnceLock<Issuer> = OnceLock::new();
    ISSUER.get_or_init(|| {
        let alg = &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = ring::signature::EcdsaKeyPair::generate_pkcs8(alg, &rng)
            .unwrap()
            .as_ref()
            .to_vec();
        let pair = ring::signature::EcdsaKeyPair::from_pkcs8(alg, &pkcs8, &rng).unwrap();
        let point = pair.public_key().as_ref();
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let jwks = serde_json::json!({"keys": [{
            "kty": "EC", "crv": "P-256", "kid": "k1", "alg": "ES256", "use": "sig",
            "x": b64.encode(&point[1..33]), "y": b64.encode(&point[33..65]),
        }]});
        let (keys, _) = Keys::from_jwks(&jwks.to_string()).unwrap();
        let config: IssuerConfig = serde_json::from_value(serde_json::json!({
            "name": "corp", "issuer": "https://idp.example", "tenant_claim": "tid",
            "groups_claim": "groups", "scopes": {"payments": ["pay:use"]},
        }))
        .unwrap();
        Issuer { pkcs8, keys, config }
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // `HEADER\nCLAIMS`: two JSON texts, or anything.
    let (header, claims) = text.split_once('\n').unwrap_or((text, "{}"));
    let i = issuer();
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let signing = format!("{}.{}", b64.encode(header), b64.encode(claims));
    let pair = ring::signature::EcdsaKeyPair::from_pkcs8(
        &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
        &i.pkcs8,
        &ring::rand::SystemRandom::new(),
    )
    .unwrap();
    let sig = pair
        .sign(&ring::rand::SystemRandom::new(), signing.as_bytes())
        .unwrap();
    let token = format!("{signing}.{}", b64.encode(sig.as_ref()));
    let audiences = vec!["https://gw.example/mcp/payments".to_owned()];
    let check = Check {
        issuer: &i.config,
        keys: &i.keys,
        audiences: &audiences,
        server: "payments",
        leeway_secs: 60,
    };
    // The raw text as a token too: never a panic.
    if let Ok(seen) = peek(text) {
        let _ = verify(text, &seen, &check);
    }
    let Ok(seen) = peek(&token) else {
        return;
    };
    if let Ok(v) = verify(&token, &seen, &check) {
        assert!(v.identity.principal.starts_with("corp:"), "{v:?}");
        assert!(!v.identity.tenant.is_empty());
        // The same token with another signature never passes.
        let forged = format!("{signing}.{}", b64.encode([7u8; 64]));
        if let Ok(seen) = peek(&forged) {
            assert!(verify(&forged, &seen, &check).is_err());
        }
    }
});
