//! A passkey's `clientDataJSON`, `authenticatorData` and attestation
//! object, as a browser (or an attacker posing as one) sends them to the
//! review console: never a panic. The client data is taken as sent, and
//! also made right (type, challenge, origin) so that the authenticator data
//! and the CBOR/COSE parsing behind it are reached. No assertion verifies
//! without the key's signature.
#![no_main]

use base64::Engine;
use countersign::core::passkey::{
    claimed_challenge, read_registration, verify_assertion, Assertion, Expect, Registration,
};
use libfuzzer_sys::fuzz_target;

const CHALLENGE: [u8; 32] = [9; 32];

/// A length-prefixed part of `data`, and what follows it.
fn take(data: &[u8]) -> (&[u8], &[u8]) {
    let Some((len, rest)) = data.split_first_chunk::<2>() else {
        return (&[], &[]);
    };
    let n = usize::from(u16::from_be_bytes(*len)).min(rest.len());
    rest.split_at(n)
}
const ORIGIN: &str = "https://gw.example.com";

fuzz_target!(|data: &[u8]| {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    // Three parts: client data, authenticator data, attestation object,
    // the first two after a 2-byte big-endian length each.
    let (client, rest) = take(data);
    let (auth, attestation) = take(rest);
    let expect = Expect {
        challenge: &CHALLENGE,
        origin: ORIGIN,
        rp_id: "gw.example.com",
    };
    let _ = claimed_challenge(&b64.encode(client));
    let good_client = |kind: &str| {
        serde_json::json!({
            "type": kind, "challenge": b64.encode(CHALLENGE), "origin": ORIGIN,
            "extra": String::from_utf8_lossy(client),
        })
        .to_string()
    };
    for client_data in [b64.encode(client), b64.encode(good_client("webauthn.create"))] {
        let r = Registration {
            credential_id: b64.encode(b"cred"),
            client_data_json: client_data,
            attestation_object: b64.encode(attestation),
            resident_key: None,
        };
        if let Ok(key) = read_registration(&r, &expect) {
            // A key read from a registration parses as what it says.
            assert!(key.check().is_ok(), "{key:?}");
            for client_data in [b64.encode(client), b64.encode(good_client("webauthn.get"))] {
                let a = Assertion {
                    credential_id: key.id.clone(),
                    authenticator_data: b64.encode(auth),
                    client_data_json: client_data,
                    signature: b64.encode(attestation),
                };
                assert!(verify_assertion(&key, &a, &expect).is_err());
            }
        }
    }
});
