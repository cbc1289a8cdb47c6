//! Signed requests of the control API (`/v1`): a reviewer's CLI or TUI signs
//! the method, the path with its query, the time and the body's SHA-256 with
//! the reviewer's key, and the gateway checks it against `reviewers.toml`.
//! These are not approvals: a signed request only says who is asking; the
//! approval is the statement its body carries.

use base64::Engine;
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

use super::approval::{b64, verify_bytes, ApprovalError};

/// The first line of a signed control API request.
pub const REQUEST_CONTEXT: &str = "countersign.request.v1";

/// The `Authorization` scheme of the control API.
pub const AUTH_SCHEME: &str = "Countersign-Ed25519";

/// The bytes a control API request signs: context, method, path with query,
/// time and the body's SHA-256. Binding the body and path stops a captured
/// header from authorizing another request; the time bounds replay.
pub fn request_signing_bytes(
    method: &str,
    path_and_query: &str,
    time: &str,
    body: &[u8],
) -> Vec<u8> {
    format!(
        "{REQUEST_CONTEXT}\n{}\n{path_and_query}\n{time}\n{}",
        method.to_ascii_uppercase(),
        hex::encode(Sha256::digest(body))
    )
    .into_bytes()
}

/// The `Authorization` value for a control API request.
pub fn authorization(
    key: &SigningKey,
    reviewer: &str,
    method: &str,
    path_and_query: &str,
    time: &str,
    body: &[u8],
) -> String {
    let sig = key.sign(&request_signing_bytes(method, path_and_query, time, body));
    format!(
        "{AUTH_SCHEME} reviewer={reviewer},time={time},signature={}",
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
        let (mut reviewer, mut time, mut signature) = (None, None, None);
        for part in rest.split(',') {
            match part.trim().split_once('=') {
                Some(("reviewer", v)) => reviewer = Some(v.to_owned()),
                Some(("time", v)) => time = Some(v.to_owned()),
                Some(("signature", v)) => signature = Some(v.to_owned()),
                _ => {
                    return Err(ApprovalError::Authorization(format!(
                        "unexpected authorization field `{part}`"
                    )))
                }
            }
        }
        match (reviewer, time, signature) {
            (Some(reviewer), Some(time), Some(signature)) => Ok(RequestAuth {
                reviewer,
                time,
                signature,
            }),
            _ => Err(ApprovalError::Authorization(
                "the authorization needs `reviewer`, `time` and `signature`".into(),
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
            &request_signing_bytes(method, path_and_query, &self.time, body),
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
        let h = authorization(
            &k,
            "alice",
            "POST",
            "/v1/proposals/p-1/decision",
            "2026-11-30T10:00:00Z",
            b"{}",
        );
        let a = RequestAuth::parse(&h).unwrap();
        assert_eq!(a.reviewer, "alice");
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
    }
}
