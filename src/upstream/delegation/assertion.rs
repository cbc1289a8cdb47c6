//! `private_key_jwt` (RFC 7523 section 2.2, OpenID Connect Core section 9):
//! the gateway authenticates to the token endpoint with a short-lived JWT
//! signed by its own key, so no shared secret sits in its configuration.

use std::path::Path;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::PrivatePkcs8KeyDer;

/// RFC 7523 section 2.2.
pub const ASSERTION_TYPE: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

/// How long an assertion is valid: long enough for one request, short
/// enough that a copy seen in transit is soon useless.
const LIFETIME_SECS: i64 = 60;

/// The gateway's signing key for client assertions (ES256, P-256).
#[derive(Clone)]
pub struct Signer {
    key: EncodingKey,
    kid: Option<String>,
}

impl std::fmt::Debug for Signer {
    // The key stays out of every Debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl Signer {
    /// The P-256 key in the PKCS#8 PEM file `path`, checked by signing once.
    pub fn load(path: &Path, kid: Option<String>) -> Result<Signer, String> {
        let der = PrivatePkcs8KeyDer::from_pem_file(path).map_err(|e| {
            format!(
                "`{}` is not a PKCS#8 PEM private key ({e}); `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256` makes one",
                path.display()
            )
        })?;
        // ring refuses a key of another curve or kind here, at start, not
        // at the first call.
        ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            der.secret_pkcs8_der(),
            &ring::rand::SystemRandom::new(),
        )
        .map_err(|e| format!("`{}` is not a P-256 (ES256) key: {e}", path.display()))?;
        Ok(Signer {
            key: EncodingKey::from_ec_der(der.secret_pkcs8_der()),
            kid,
        })
    }

    /// A client assertion of `client_id` for `token_endpoint` at `now_secs`:
    /// issuer and subject the client, audience the endpoint, a fresh `jti`
    /// (a provider refuses one it saw), valid a minute.
    pub fn assertion(
        &self,
        client_id: &str,
        token_endpoint: &str,
        now_secs: i64,
    ) -> Result<String, String> {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = self.kid.clone();
        let claims = serde_json::json!({
            "iss": client_id,
            "sub": client_id,
            "aud": token_endpoint,
            "jti": hex::encode(rand::random::<[u8; 16]>()),
            "iat": now_secs,
            "exp": now_secs + LIFETIME_SECS,
        });
        jsonwebtoken::encode(&header, &claims, &self.key)
            .map_err(|e| format!("cannot sign the client assertion: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    /// A P-256 key made by ring, as PKCS#8 PEM.
    fn pem() -> String {
        let doc = ring::signature::EcdsaKeyPair::generate_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &ring::rand::SystemRandom::new(),
        )
        .unwrap();
        let b64 = base64::engine::general_purpose::STANDARD.encode(doc.as_ref());
        format!("-----BEGIN PRIVATE KEY-----\n{b64}\n-----END PRIVATE KEY-----\n")
    }

    #[test]
    fn an_assertion_names_the_client_the_endpoint_and_is_signed_with_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("client.pem");
        std::fs::write(&file, pem()).unwrap();
        let signer = Signer::load(&file, Some("gw-1".into())).unwrap();
        let jwt = signer
            .assertion("countersign", "https://idp.example/token", 1_000)
            .unwrap();
        let parts: Vec<&str> = jwt.split('.').collect();
        let decode = |p: &str| -> serde_json::Value {
            serde_json::from_slice(
                &base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(p)
                    .unwrap(),
            )
            .unwrap()
        };
        let (header, claims) = (decode(parts[0]), decode(parts[1]));
        assert_eq!(header["alg"], "ES256");
        assert_eq!(header["kid"], "gw-1");
        assert_eq!(claims["iss"], "countersign");
        assert_eq!(claims["sub"], "countersign");
        assert_eq!(claims["aud"], "https://idp.example/token");
        assert_eq!(claims["exp"], 1_060);
        // Two assertions never share a jti.
        let again = signer
            .assertion("countersign", "https://idp.example/token", 1_000)
            .unwrap();
        assert_ne!(
            decode(again.split('.').nth(1).unwrap())["jti"],
            claims["jti"]
        );
        assert!(!format!("{signer:?}").contains("PRIVATE"));
    }

    #[test]
    fn a_file_that_is_not_a_p256_key_is_refused_at_load() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("client.pem");
        std::fs::write(&file, "not a key").unwrap();
        let e = Signer::load(&file, None).unwrap_err();
        assert!(e.contains("PKCS#8"), "{e}");
        // An Ed25519 key: PKCS#8, and not P-256.
        let doc = ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new())
            .unwrap();
        let b64 = base64::engine::general_purpose::STANDARD.encode(doc.as_ref());
        std::fs::write(
            &file,
            format!("-----BEGIN PRIVATE KEY-----\n{b64}\n-----END PRIVATE KEY-----\n"),
        )
        .unwrap();
        let e = Signer::load(&file, None).unwrap_err();
        assert!(e.contains("P-256"), "{e}");
    }
}
