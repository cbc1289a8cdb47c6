//! A reviewer's passkey as the book checks it: the assertion over the
//! statement, and the signature counter kept in the store.

use super::{Book, DecideError};
use crate::core::approval::Statement;
use crate::core::reviewers::Reviewer;

impl Book {
    /// A passkey's assertion over `statement` (W3C WebAuthn 7.2): its
    /// challenge is the statement's digest, its credential one of the
    /// reviewer's in `reviewers.toml`, and its counter above the last one
    /// seen for that credential (when the authenticator keeps one: a cloned
    /// authenticator falls behind).
    pub(super) async fn check_passkey(
        &self,
        statement: &Statement,
        reviewer: &Reviewer,
        assertion: &crate::core::passkey::Assertion,
        origin: &str,
        rp_id: &str,
    ) -> Result<crate::core::approval::PasskeyProof, DecideError> {
        let refused = DecideError::Refused;
        let key = reviewer.passkey(&assertion.credential_id).ok_or_else(|| {
            refused(format!(
                "passkey `{}` is not one of reviewer `{}`'s in reviewers.toml",
                assertion.credential_id, reviewer.name
            ))
        })?;
        let digest = statement
            .digest_bytes()
            .map_err(|e| refused(e.to_string()))?;
        let verified = crate::core::passkey::verify_assertion(
            key,
            assertion,
            &crate::core::passkey::Expect {
                challenge: &digest,
                origin,
                rp_id,
            },
        )
        .map_err(|e| refused(format!("the passkey's assertion is refused: {e}")))?;
        self.passkey_counter(&reviewer.name, &key.id, verified.counter)
            .await
            .map_err(refused)?;
        Ok(crate::core::approval::PasskeyProof {
            assertion: assertion.clone(),
            credential_public_key: key.public_key.clone(),
            alg: key.alg,
            origin: origin.to_owned(),
            rp_id: rp_id.to_owned(),
        })
    }
}
