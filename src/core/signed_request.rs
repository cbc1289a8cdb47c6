//! Signed requests of the control API (`/v1`): a reviewer's CLI or TUI signs
//! the method, the path with its query, the time, a nonce and the body's
//! SHA-256 with the reviewer's key, and the gateway checks it against
//! `reviewers.toml`. These are not approvals: a signed request only says
//! who is asking; the approval is the statement its body carries.
//!
//! The time bounds how long a captured request could be replayed; the
//! nonce closes that window. The gateway records the nonce of every request
//! that changes something (a decision, a withdrawal, a reconciliation) in
//! its store until the time window has passed, and refuses it a second
//! time, across restarts and on every gateway sharing the store.

use base64::Engine;
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

use super::approval::{b64, verify_bytes, ApprovalError};

/// The first line of a signed control API request (version 2 signs a
/// nonce; version 1 did not, and is refused).
pub const REQUEST_CONTEXT: &str = "countersign.request.v2";

/// The `Authorization` scheme of the control API.
pub const AUTH_SCHEME: &str = "Countersign-Ed25519";

/// The bytes a control API request signs: context, method, path with query,
/// time, nonce and the body's SHA-256. Binding the body and path stops a
/// captured header from authorizing another request; the time bounds
/// replay, and the nonce (used once) ends it.
pub fn request_signing_bytes(
    method: &str,
    path_and_query: &str,
    time: &str,
    nonce: &str,
    body: &[u8],
) -> Vec<u8> {
    format!(
        "{REQUEST_CONTEXT}\n{}\n{path_and_query}\n{time}\n{nonce}\n{}",
        method.to_ascii_uppercase(),
        hex::encode(Sha256::digest(body))
    )
    .into_bytes()
}

/// A fresh nonce: 128 random bits, in hex.
pub fn new_nonce() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

/// Whether `nonce` has the shape of one: 16 to 64 hex digits.
pub fn valid_nonce(nonce: &str) -> bool {
    (16..=64).contains(&nonce.len()) && nonce.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The `Authorization` value for a control API request, with a fresh nonce.
pub fn authorization(
    key: &SigningKey,
    reviewer: &str,
    method: &str,
    path_and_query: &str,
    time: &str,
    body: &[u8],
) -> String {
    authorization_with(
        key,
        reviewer,
        method,
        path_and_query,
        time,
        &new_nonce(),
        body,
    )
}

/// The `Authorization` value for a control API request with this `nonce`.
pub fn authorization_with(
    key: &SigningKey,
    reviewer: &str,
    method: &str,
    path_and_query: &str,
    time: &str,
    nonce: &str,
    body: &[u8],
) -> String {
    let sig = key.sign(&request_signing_bytes(
        method,
        path_and_query,
        time,
        nonce,
        body,
    ));
    format!(
        "{AUTH_SCHEME} reviewer={reviewer},time={time},nonce={nonce},signature={}",
        b64().encode(sig.to_bytes())
    )
}

/// A parsed `Authorization: Countersign-Ed25519 ...` header.
#[derive(Debug, PartialEq, Eq)]
pub struct RequestAuth {
    /// Who claims to sign.
    pub reviewer: String,
    /// RFC 3339 time signed.
    pub time: String,
    /// The nonce signed (see [`valid_nonce`]).
    pub nonce: String,
    /// Base64 signature.
    pub signature: String,
}

impl RequestAuth {
    /// Parse the header value.
    pub fn parse(value: &str) -> Result<RequestAuth, ApprovalError> {
        let Some(rest) = value
            .strip_prefix(AUTH_SCHEME)
            .and_then(|r| r.strip_prefix(' '))
        else {
            return Err(ApprovalError::Authorization(format!(
                "the control API wants `Authorization: {AUTH_SCHEME} reviewer=..,time=..,signature=..` (use the countersign CLI or TUI)"
            )));
        };
        let (mut reviewer, mut time, mut nonce, mut signature) = (None, None, None, None);
        for part in rest.split(',') {
            match part.trim().split_once('=') {
                Some(("reviewer", v)) => reviewer = Some(v.to_owned()),
                Some(("time", v)) => time = Some(v.to_owned()),
                Some(("nonce", v)) => nonce = Some(v.to_owned()),
                Some(("signature", v)) => signature = Some(v.to_owned()),
                _ => {
                    return Err(ApprovalError::Authorization(format!(
                        "unexpected authorization field `{part}`"
                    )))
                }
            }
        }
        match (reviewer, time, nonce, signature) {
            (Some(reviewer), Some(time), Some(nonce), Some(signature)) if valid_nonce(&nonce) => {
                Ok(RequestAuth {
                    reviewer,
                    time,
                    nonce,
                    signature,
                })
            }
            (_, _, Some(nonce), _) if !valid_nonce(&nonce) => Err(ApprovalError::Authorization(
                format!("`nonce` `{nonce}` is not 16 to 64 hex digits"),
            )),
            (_, _, None, _) => Err(ApprovalError::Authorization(
                "the authorization has no `nonce`: this client signs requests the old way (countersign.request.v1), which could be replayed; update the CLI or TUI".into(),
            )),
            _ => Err(ApprovalError::Authorization(
                "the authorization needs `reviewer`, `time`, `nonce` and `signature`".into(),
            )),
        }
    }

    /// Verify against the reviewer's key.
    pub fn verify(
        &self,
        key: &VerifyingKey,
        method: &str,
        path_and_query: &str,
        body: &[u8],
    ) -> Result<(), ApprovalError> {
        verify_bytes(
            key,
            &request_signing_bytes(method, path_and_query, &self.time, &self.nonce, body),
            &self.signature,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> SigningKey {
        SigningKey::from_bytes(&[n; 32])
    }

    #[test]
    fn request_auth_binds_method_path_time_and_body() {
        let k = key(3);
        let nonce = new_nonce();
        let h = authorization_with(
            &k,
            "alice",
            "POST",
            "/v1/proposals/p-1/decision",
            "2026-11-30T10:00:00Z",
            &nonce,
            b"{}",
        );
        let a = RequestAuth::parse(&h).unwrap();
        assert_eq!(a.reviewer, "alice");
        assert_eq!(a.nonce, nonce);
        // The nonce is signed: another one does not verify.
        let mut other = RequestAuth::parse(&h).unwrap();
        other.nonce = new_nonce();
        assert!(other
            .verify(
                &k.verifying_key(),
                "POST",
                "/v1/proposals/p-1/decision",
                b"{}"
            )
            .is_err());
        let vk = k.verifying_key();
        a.verify(&vk, "POST", "/v1/proposals/p-1/decision", b"{}")
            .unwrap();
        assert!(a
            .verify(&vk, "GET", "/v1/proposals/p-1/decision", b"{}")
            .is_err());
        assert!(a
            .verify(&vk, "POST", "/v1/proposals/p-2/decision", b"{}")
            .is_err());
        assert!(a
            .verify(&vk, "POST", "/v1/proposals/p-1/decision", b"{ }")
            .is_err());
        assert!(RequestAuth::parse("Bearer x").is_err());
        assert!(RequestAuth::parse("Countersign-Ed25519 reviewer=a").is_err());
        let old = "Countersign-Ed25519 reviewer=a,time=2026-11-30T10:00:00Z,signature=AAAA";
        let e = RequestAuth::parse(old).unwrap_err().to_string();
        assert!(e.contains("no `nonce`"), "{e}");
        let short = "Countersign-Ed25519 reviewer=a,time=t,nonce=abc,signature=AAAA";
        assert!(RequestAuth::parse(short).is_err());
    }
}
