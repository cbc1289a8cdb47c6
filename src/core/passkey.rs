//! Passkeys (WebAuthn) as reviewer keys: a second kind of signature beside
//! ed25519, pure (no I/O), used by the review console and by `audit verify`
//! alike.
//!
//! A decision signed with a passkey is the same statement an ed25519
//! reviewer signs (section 6 of the design); its WebAuthn challenge *is* the
//! statement's digest (SHA-256 of its JCS). So the authenticator's
//! signature over `authenticatorData || SHA-256(clientDataJSON)` binds this
//! person's device, with user verification, to exactly that call. Anyone
//! can check it later from four stored fields and the public key in
//! `reviewers.toml`: [`verify_assertion`] is the W3C WebAuthn Level 3
//! relying-party procedure for an assertion (section 7.2), reduced to what
//! those fields hold.
//!
//! Why not webauthn-rs: its ceremonies draw their own random challenge and
//! keep it in an opaque state, so a challenge that must equal an approval
//! statement's digest can only be put there through its
//! `danger-allow-state-serialisation` escape hatch; and webauthn-rs-core
//! verifies with OpenSSL, a second crypto stack (and a C library to build)
//! beside ring, which the gateway already uses for TLS and HMAC. The parts
//! here are the relying party's checks over parsed fields; CBOR and COSE are
//! read with ciborium and coset, and signatures checked with ring.

use base64::Engine;
use coset::{iana, CborSerializable, CoseKey, KeyType, Label};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// base64url without padding, as WebAuthn writes binary fields.
pub fn b64url() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
}

/// The signature algorithms accepted: ES256 and EdDSA, and RS256 for
/// platforms that offer nothing else (Windows Hello).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Alg {
    /// ECDSA with P-256 and SHA-256 (COSE -7).
    #[serde(rename = "ES256")]
    Es256,
    /// Ed25519 (COSE -8).
    #[serde(rename = "EdDSA")]
    EdDsa,
    /// RSASSA-PKCS1-v1_5 with SHA-256 (COSE -257).
    #[serde(rename = "RS256")]
    Rs256,
}

impl Alg {
    /// The COSE algorithm numbers a browser is offered, in preference.
    pub const OFFERED: [i64; 3] = [-7, -8, -257];

    fn of(alg: i64) -> Option<Alg> {
        match alg {
            -7 => Some(Alg::Es256),
            -8 => Some(Alg::EdDsa),
            -257 => Some(Alg::Rs256),
            _ => None,
        }
    }

    /// The name `reviewers.toml` uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Alg::Es256 => "ES256",
            Alg::EdDsa => "EdDSA",
            Alg::Rs256 => "RS256",
        }
    }
}

/// Why a passkey, a registration or an assertion is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PasskeyError {
    /// A field is not what WebAuthn makes.
    #[error("{0}")]
    Malformed(String),
    /// `clientDataJSON` says another ceremony, challenge or origin.
    #[error("clientDataJSON: {0}")]
    ClientData(String),
    /// `authenticatorData` is for another relying party, or lacks a flag.
    #[error("authenticatorData: {0}")]
    AuthenticatorData(String),
    /// The signature does not verify with the registered key.
    #[error("the passkey's signature does not verify with the public key of credential `{0}` in reviewers.toml")]
    Signature(String),
    /// The key is not one this gateway accepts.
    #[error("{0}")]
    Key(String),
}

/// A reviewer's passkey, as `reviewers.toml` lists it:
/// `passkeys = [{ id, public_key, alg }]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PasskeyKey {
    /// The credential id, base64url.
    pub id: String,
    /// The credential's public key as a COSE_Key, base64url (what a
    /// WebAuthn library takes as the credential public key).
    pub public_key: String,
    /// `ES256`, `EdDSA` or `RS256`.
    pub alg: Alg,
}

impl PasskeyKey {
    /// Check that the key parses as its `alg` says (at load: a file that
    /// names a key the gateway cannot use is refused whole).
    pub fn check(&self) -> Result<(), PasskeyError> {
        b64url().decode(&self.id).map_err(|e| {
            PasskeyError::Key(format!("passkey id `{}` is not base64url: {e}", self.id))
        })?;
        self.verifier().map(drop)
    }

    fn verifier(&self) -> Result<Verifier, PasskeyError> {
        let bytes = b64url().decode(&self.public_key).map_err(|e| {
            PasskeyError::Key(format!(
                "passkey `{}`: public_key is not base64url: {e}",
                self.id
            ))
        })?;
        let (alg, v) = verifier_of(&bytes)
            .map_err(|e| PasskeyError::Key(format!("passkey `{}`: {e}", self.id)))?;
        if alg != self.alg {
            return Err(PasskeyError::Key(format!(
                "passkey `{}`: its key is {}, the entry says {}",
                self.id,
                alg.as_str(),
                self.alg.as_str()
            )));
        }
        Ok(v)
    }
}

/// A public key ring can verify with.
enum Verifier {
    Es256(Vec<u8>),
    EdDsa(Vec<u8>),
    Rs256 { n: Vec<u8>, e: Vec<u8> },
}

impl Verifier {
    fn verify(&self, message: &[u8], signature: &[u8]) -> bool {
        use ring::signature::{self as sig, UnparsedPublicKey};
        match self {
            // WebAuthn's ES256 signatures are ASN.1 DER.
            Verifier::Es256(point) => UnparsedPublicKey::new(&sig::ECDSA_P256_SHA256_ASN1, point)
                .verify(message, signature)
                .is_ok(),
            Verifier::EdDsa(key) => UnparsedPublicKey::new(&sig::ED25519, key)
                .verify(message, signature)
                .is_ok(),
            Verifier::Rs256 { n, e } => sig::RsaPublicKeyComponents { n, e }
                .verify(&sig::RSA_PKCS1_2048_8192_SHA256, message, signature)
                .is_ok(),
        }
    }
}

/// The algorithm and verifier of a COSE_Key.
fn verifier_of(cose: &[u8]) -> Result<(Alg, Verifier), String> {
    let key = CoseKey::from_slice(cose).map_err(|e| format!("not a COSE_Key: {e}"))?;
    let alg = match &key.alg {
        Some(coset::RegisteredLabelWithPrivate::Assigned(a)) => Alg::of(*a as i64),
        _ => None,
    }
    .ok_or_else(|| {
        "the key names no algorithm this gateway accepts (ES256, EdDSA, RS256)".to_owned()
    })?;
    let param = |label: i64| {
        key.params.iter().find_map(|(l, v)| match l {
            Label::Int(n) if *n == label => v.as_bytes().cloned(),
            _ => None,
        })
    };
    let crv = key.params.iter().find_map(|(l, v)| match l {
        Label::Int(-1) => v.as_integer().and_then(|i| i64::try_from(i).ok()),
        _ => None,
    });
    let verifier = match (alg, &key.kty) {
        (Alg::Es256, KeyType::Assigned(iana::KeyType::EC2)) => {
            if crv != Some(iana::EllipticCurve::P_256 as i64) {
                return Err("an ES256 key must be on P-256".into());
            }
            let (Some(x), Some(y)) = (param(-2), param(-3)) else {
                return Err("an EC2 key needs x and y".into());
            };
            if x.len() != 32 || y.len() != 32 {
                return Err("a P-256 key's x and y are 32 bytes".into());
            }
            let mut point = vec![4u8];
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            Verifier::Es256(point)
        }
        (Alg::EdDsa, KeyType::Assigned(iana::KeyType::OKP)) => {
            if crv != Some(iana::EllipticCurve::Ed25519 as i64) {
                return Err("an EdDSA key must be Ed25519".into());
            }
            let x = param(-2).ok_or("an OKP key needs x")?;
            if x.len() != 32 {
                return Err("an Ed25519 key is 32 bytes".into());
            }
            Verifier::EdDsa(x)
        }
        (Alg::Rs256, KeyType::Assigned(iana::KeyType::RSA)) => {
            let (Some(n), Some(e)) = (param(-1), param(-2)) else {
                return Err("an RSA key needs n and e".into());
            };
            if n.len() < 256 {
                return Err("an RSA key has at least 2048 bits".into());
            }
            Verifier::Rs256 { n, e }
        }
        _ => return Err("the key's type does not match its algorithm".into()),
    };
    Ok((alg, verifier))
}

/// An assertion as the browser returns it, each field base64url: what is
/// stored with a decision and checked again offline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Assertion {
    /// The credential id.
    pub credential_id: String,
    /// `authenticatorData`.
    pub authenticator_data: String,
    /// `clientDataJSON`.
    pub client_data_json: String,
    /// The signature over `authenticatorData || SHA-256(clientDataJSON)`.
    pub signature: String,
}

/// What an assertion must show.
#[derive(Debug, Clone, Copy)]
pub struct Expect<'a> {
    /// The challenge the relying party issued (for a decision: the
    /// statement's digest, 32 bytes).
    pub challenge: &'a [u8],
    /// The console's origin (`https://gw.example.com`, `http://localhost:7373`).
    pub origin: &'a str,
    /// The relying party id (the origin's host).
    pub rp_id: &'a str,
}

/// What a verified assertion's authenticator reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    /// The signature counter (0: the authenticator keeps none).
    pub counter: u32,
    /// User verification was performed (always true once verified).
    pub user_verified: bool,
}

/// The flags of `authenticatorData`.
const UP: u8 = 0x01;
const UV: u8 = 0x04;
const AT: u8 = 0x40;

fn decode(what: &str, text: &str) -> Result<Vec<u8>, PasskeyError> {
    b64url()
        .decode(text.trim_end_matches('='))
        .map_err(|e| PasskeyError::Malformed(format!("{what} is not base64url: {e}")))
}

/// `clientDataJSON`, read strictly: its type, challenge and origin must be
/// those expected (W3C WebAuthn L3, 7.1 steps 7 to 9, 7.2 steps 11 to 13).
fn check_client_data(raw: &[u8], kind: &str, e: &Expect<'_>) -> Result<(), PasskeyError> {
    let text =
        std::str::from_utf8(raw).map_err(|_| PasskeyError::ClientData("not UTF-8".into()))?;
    // One reading only: a key twice could say two things to two parsers.
    crate::core::canonical::check_unambiguous(text, 16)
        .map_err(|err| PasskeyError::ClientData(err.to_string()))?;
    let c: serde_json::Value = serde_json::from_str(text)
        .map_err(|err| PasskeyError::ClientData(format!("not JSON: {err}")))?;
    if c["type"] != kind {
        return Err(PasskeyError::ClientData(format!(
            "type is {}, not `{kind}`",
            c["type"]
        )));
    }
    let challenge = c["challenge"].as_str().unwrap_or_default();
    if challenge != b64url().encode(e.challenge) {
        return Err(PasskeyError::ClientData(
            "the challenge is not the one issued (for a decision: not this statement's digest)"
                .into(),
        ));
    }
    // Phishing: a passkey signs for the origin the browser is on. A
    // look-alike site gets a signature that names itself.
    if c["origin"] != e.origin {
        return Err(PasskeyError::ClientData(format!(
            "origin {} is not the console's `{}`",
            c["origin"], e.origin
        )));
    }
    if c["crossOrigin"] == true || c.get("topOrigin").is_some_and(|t| !t.is_null()) {
        return Err(PasskeyError::ClientData(
            "made inside a frame of another origin".into(),
        ));
    }
    Ok(())
}

/// `authenticatorData`'s fixed part: the rpIdHash, UP and UV set, the
/// counter; and the rest (attested credential data and extensions).
fn check_authenticator_data<'a>(
    data: &'a [u8],
    rp_id: &str,
) -> Result<(u8, u32, &'a [u8]), PasskeyError> {
    if data.len() < 37 {
        return Err(PasskeyError::AuthenticatorData(
            "shorter than 37 bytes".into(),
        ));
    }
    if data[..32] != Sha256::digest(rp_id.as_bytes())[..] {
        return Err(PasskeyError::AuthenticatorData(format!(
            "the rpIdHash is not that of `{rp_id}`: the passkey was used for another site"
        )));
    }
    let flags = data[32];
    if flags & UP == 0 {
        return Err(PasskeyError::AuthenticatorData(
            "user presence (UP) is not set".into(),
        ));
    }
    // A stolen, unlocked laptop session still cannot decide: every use of
    // the passkey asks for the person's fingerprint, face or PIN.
    if flags & UV == 0 {
        return Err(PasskeyError::AuthenticatorData(
            "user verification (UV) is not set: a decision needs the person's fingerprint, face or PIN".into(),
        ));
    }
    let counter = u32::from_be_bytes([data[33], data[34], data[35], data[36]]);
    Ok((flags, counter, &data[37..]))
}

/// The challenge `clientDataJSON` (base64url) claims, unchecked: it names
/// which issued challenge a response answers. The ceremony's check
/// ([`verify_assertion`], [`read_registration`]) compares it again, with
/// the type and the origin, before anything is trusted.
pub fn claimed_challenge(client_data_json: &str) -> Result<String, &'static str> {
    let client = b64url()
        .decode(client_data_json)
        .map_err(|_| "clientDataJSON is not base64url")?;
    serde_json::from_slice::<serde_json::Value>(&client)
        .ok()
        .and_then(|v| v["challenge"].as_str().map(str::to_owned))
        .ok_or("clientDataJSON holds no challenge")
}

/// Verify an assertion made with `key` (W3C WebAuthn Level 3, 7.2): the
/// credential, `clientDataJSON` (type `webauthn.get`, the challenge, the
/// origin), `authenticatorData` (the rpIdHash, UP, UV), and the signature
/// over `authenticatorData || SHA-256(clientDataJSON)`. The caller checks
/// the counter against the last one it saw.
pub fn verify_assertion(
    key: &PasskeyKey,
    a: &Assertion,
    e: &Expect<'_>,
) -> Result<Verified, PasskeyError> {
    if a.credential_id != key.id {
        return Err(PasskeyError::Malformed(format!(
            "credential `{}` is not `{}`",
            a.credential_id, key.id
        )));
    }
    let client = decode("clientDataJSON", &a.client_data_json)?;
    let data = decode("authenticatorData", &a.authenticator_data)?;
    let signature = decode("the signature", &a.signature)?;
    check_client_data(&client, "webauthn.get", e)?;
    // The signature first, then the flags: a failure past this point (no
    // UV, another relying party) is known to come from the credential's
    // own key, which is what the console's per-credential limit counts.
    let mut signed = data.clone();
    signed.extend_from_slice(&Sha256::digest(&client));
    if !key.verifier()?.verify(&signed, &signature) {
        return Err(PasskeyError::Signature(key.id.clone()));
    }
    let (flags, counter, _) = check_authenticator_data(&data, e.rp_id)?;
    Ok(Verified {
        counter,
        user_verified: flags & UV != 0,
    })
}

/// A registration (an enrolment's `navigator.credentials.create`), each
/// binary field base64url.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registration {
    /// The credential id.
    pub credential_id: String,
    /// `clientDataJSON`.
    pub client_data_json: String,
    /// `attestationObject` (CBOR).
    pub attestation_object: String,
    /// Whether the browser reported the credential resident
    /// (`credProps.rk`), when it did.
    #[serde(default)]
    pub resident_key: Option<bool>,
}

/// Read a registration (W3C WebAuthn Level 3, 7.1, attestation `none`: the
/// gateway trusts the key because an operator puts it in `reviewers.toml`,
/// not because of a vendor's certificate): `clientDataJSON`, the rpIdHash,
/// UP, UV and AT, the credential id, and its public key. Returns the key
/// as `reviewers.toml` lists it.
pub fn read_registration(r: &Registration, e: &Expect<'_>) -> Result<PasskeyKey, PasskeyError> {
    let client = decode("clientDataJSON", &r.client_data_json)?;
    check_client_data(&client, "webauthn.create", e)?;
    if r.resident_key == Some(false) {
        return Err(PasskeyError::Malformed(
            "the authenticator made a credential that is not discoverable (a resident key is required)".into(),
        ));
    }
    let attestation = decode("attestationObject", &r.attestation_object)?;
    let object: ciborium::Value = ciborium::from_reader(attestation.as_slice())
        .map_err(|err| PasskeyError::Malformed(format!("attestationObject is not CBOR: {err}")))?;
    let auth_data = object
        .as_map()
        .and_then(|m| {
            m.iter()
                .find_map(|(k, v)| match (k.as_text(), v.as_bytes()) {
                    (Some("authData"), Some(b)) => Some(b.clone()),
                    _ => None,
                })
        })
        .ok_or_else(|| PasskeyError::Malformed("attestationObject has no authData".into()))?;
    let (flags, _, rest) = check_authenticator_data(&auth_data, e.rp_id)?;
    if flags & AT == 0 || rest.len() < 18 {
        return Err(PasskeyError::AuthenticatorData(
            "no attested credential data".into(),
        ));
    }
    let id_len = usize::from(u16::from_be_bytes([rest[16], rest[17]]));
    let id = rest
        .get(18..18 + id_len)
        .ok_or_else(|| PasskeyError::AuthenticatorData("the credential id is cut short".into()))?;
    if b64url().encode(id) != r.credential_id.trim_end_matches('=') {
        return Err(PasskeyError::Malformed(
            "the credential id is not the one in authenticatorData".into(),
        ));
    }
    // The COSE key is the next CBOR item; extensions may follow it.
    let mut cursor = std::io::Cursor::new(&rest[18 + id_len..]);
    let item: ciborium::Value = ciborium::from_reader(&mut cursor).map_err(|err| {
        PasskeyError::Malformed(format!("the credential public key is not CBOR: {err}"))
    })?;
    let mut cose = Vec::new();
    ciborium::into_writer(&item, &mut cose)
        .map_err(|err| PasskeyError::Malformed(format!("the credential public key: {err}")))?;
    let (alg, _) = verifier_of(&cose).map_err(PasskeyError::Key)?;
    Ok(PasskeyKey {
        id: b64url().encode(id),
        public_key: b64url().encode(&cose),
        alg,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ring::rand::SystemRandom;
    use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};

    /// A software authenticator for tests: a key, and assertions made the
    /// way an authenticator makes them.
    pub(crate) struct Soft {
        pub(crate) key: PasskeyKey,
        sign: Signer,
    }

    type Signer = Box<dyn Fn(&[u8]) -> Vec<u8>>;

    pub(crate) const ORIGIN: &str = "https://gw.example.com";
    pub(crate) const RP: &str = "gw.example.com";

    fn cose_ec2(point: &[u8]) -> Vec<u8> {
        coset::CoseKeyBuilder::new_ec2_pub_key(
            iana::EllipticCurve::P_256,
            point[1..33].to_vec(),
            point[33..65].to_vec(),
        )
        .algorithm(iana::Algorithm::ES256)
        .build()
        .to_vec()
        .unwrap()
    }

    impl Soft {
        pub(crate) fn es256() -> Soft {
            let rng = SystemRandom::new();
            let pkcs8 =
                EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
            let pair =
                EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
                    .unwrap();
            let cose = cose_ec2(pair.public_key().as_ref());
            Soft {
                key: PasskeyKey {
                    id: b64url().encode(rand::random::<[u8; 16]>()),
                    public_key: b64url().encode(cose),
                    alg: Alg::Es256,
                },
                sign: Box::new(move |m| {
                    pair.sign(&SystemRandom::new(), m)
                        .unwrap()
                        .as_ref()
                        .to_vec()
                }),
            }
        }

        pub(crate) fn ed25519() -> Soft {
            let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
            let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
            let cose = coset::CoseKeyBuilder::new_okp_key()
                .param(
                    -1,
                    ciborium::Value::from(iana::EllipticCurve::Ed25519 as i64),
                )
                .param(
                    -2,
                    ciborium::Value::Bytes(pair.public_key().as_ref().to_vec()),
                )
                .algorithm(iana::Algorithm::EdDSA)
                .build()
                .to_vec()
                .unwrap();
            Soft {
                key: PasskeyKey {
                    id: b64url().encode(rand::random::<[u8; 16]>()),
                    public_key: b64url().encode(cose),
                    alg: Alg::EdDsa,
                },
                sign: Box::new(move |m| pair.sign(m).as_ref().to_vec()),
            }
        }

        /// An assertion over `challenge` for `origin` and `rp`, with
        /// `flags` and `counter`.
        pub(crate) fn assert(
            &self,
            challenge: &[u8],
            origin: &str,
            rp: &str,
            flags: u8,
            counter: u32,
        ) -> Assertion {
            let client = serde_json::json!({
                "type": "webauthn.get",
                "challenge": b64url().encode(challenge),
                "origin": origin,
                "crossOrigin": false,
            })
            .to_string();
            let mut data = Sha256::digest(rp.as_bytes()).to_vec();
            data.push(flags);
            data.extend_from_slice(&counter.to_be_bytes());
            let mut signed = data.clone();
            signed.extend_from_slice(&Sha256::digest(client.as_bytes()));
            Assertion {
                credential_id: self.key.id.clone(),
                authenticator_data: b64url().encode(&data),
                client_data_json: b64url().encode(client.as_bytes()),
                signature: b64url().encode((self.sign)(&signed)),
            }
        }
    }

    fn expect(challenge: &[u8]) -> Expect<'_> {
        Expect {
            challenge,
            origin: ORIGIN,
            rp_id: RP,
        }
    }

    #[test]
    fn an_assertion_verifies_for_its_challenge_origin_and_rp_only() {
        for soft in [Soft::es256(), Soft::ed25519()] {
            soft.key.check().unwrap();
            let digest = [7u8; 32];
            let ok = soft.assert(&digest, ORIGIN, RP, UP | UV, 5);
            let v = verify_assertion(&soft.key, &ok, &expect(&digest)).unwrap();
            assert_eq!(v.counter, 5);
            let fails =
                |a: &Assertion, e: &Expect<'_>| verify_assertion(&soft.key, a, e).unwrap_err();
            // Another statement's digest.
            assert!(matches!(
                fails(&ok, &expect(&[8u8; 32])),
                PasskeyError::ClientData(_)
            ));
            // Another origin (a phishing site), another rp id.
            let phished = soft.assert(&digest, "https://gw.example.com.evil", RP, UP | UV, 6);
            assert!(
                matches!(fails(&phished, &expect(&digest)), PasskeyError::ClientData(ref m) if m.contains("origin"))
            );
            let other_rp = soft.assert(&digest, ORIGIN, "evil.example", UP | UV, 6);
            assert!(
                matches!(fails(&other_rp, &expect(&digest)), PasskeyError::AuthenticatorData(ref m) if m.contains("rpIdHash"))
            );
            // No user verification.
            let no_uv = soft.assert(&digest, ORIGIN, RP, UP, 6);
            assert!(
                matches!(fails(&no_uv, &expect(&digest)), PasskeyError::AuthenticatorData(ref m) if m.contains("UV"))
            );
            // One byte flipped in each stored field.
            for field in 0..3 {
                let mut bad = ok.clone();
                let target = match field {
                    0 => &mut bad.authenticator_data,
                    1 => &mut bad.client_data_json,
                    _ => &mut bad.signature,
                };
                let mut bytes = b64url().decode(&*target).unwrap();
                let at = bytes.len() - 1;
                bytes[at] ^= 1;
                *target = b64url().encode(bytes);
                assert!(
                    verify_assertion(&soft.key, &bad, &expect(&digest)).is_err(),
                    "field {field}"
                );
            }
            // Another credential's key.
            let other = Soft::es256();
            assert!(verify_assertion(&other.key, &ok, &expect(&digest)).is_err());
        }
    }

    #[test]
    fn a_key_that_is_not_what_its_entry_says_is_refused() {
        let mut k = Soft::es256().key;
        k.alg = Alg::EdDsa;
        assert!(k
            .check()
            .unwrap_err()
            .to_string()
            .contains("the entry says EdDSA"));
        k.public_key = "AAAA".into();
        assert!(k.check().is_err());
    }
}
