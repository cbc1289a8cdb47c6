//! Reviewers and their keys: Ed25519 public keys as `reviewers.toml` holds
//! them, a reviewer's key file (`countersign keygen`), and the reviewers
//! file itself, strict and line-numbered. Who may decide what is the
//! policies' word; this module says who a signature belongs to.

use std::collections::BTreeMap;

use base64::Engine;
use ed25519_dalek::{SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use super::approval::{b64, ApprovalError};

/// Prefix of a public key in `reviewers.toml`.
pub const PUBLIC_PREFIX: &str = "ed25519:";

/// Prefix of a secret key in a key file.
pub const SECRET_PREFIX: &str = "ed25519-secret:";

/// The reviewers file in the policy folder.
pub const REVIEWERS_FILE: &str = "reviewers.toml";

/// Parse `ed25519:BASE64` (32 bytes).
pub fn parse_public_key(text: &str) -> Result<VerifyingKey, ApprovalError> {
    let bad = |problem: String| ApprovalError::PublicKey {
        text: text.to_owned(),
        problem,
    };
    let Some(body) = text.trim().strip_prefix(PUBLIC_PREFIX) else {
        return Err(bad(format!(
            "must start with `{PUBLIC_PREFIX}` (as `countersign keygen` prints it)"
        )));
    };
    let raw = b64()
        .decode(body)
        .map_err(|e| bad(format!("is not base64: {e}")))?;
    let bytes: [u8; 32] = raw.try_into().map_err(|_| bad("is not 32 bytes".into()))?;
    VerifyingKey::from_bytes(&bytes).map_err(|e| bad(format!("is not an ed25519 point: {e}")))
}

/// `ed25519:BASE64` of a public key.
pub fn format_public_key(key: &VerifyingKey) -> String {
    format!("{PUBLIC_PREFIX}{}", b64().encode(key.to_bytes()))
}

/// A reviewer's key file (`countersign keygen --out FILE`).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyFile {
    /// The reviewer's name, as in `reviewers.toml`.
    pub name: String,
    /// `ed25519-secret:BASE64` of the 32-byte seed.
    pub secret_key: String,
}

impl KeyFile {
    /// A key file for `name` with a fresh key from 32 random bytes.
    pub fn generate(name: &str, seed: [u8; 32]) -> KeyFile {
        KeyFile {
            name: name.into(),
            secret_key: format!("{SECRET_PREFIX}{}", b64().encode(seed)),
        }
    }

    /// The signing key.
    pub fn signing_key(&self) -> Result<SigningKey, ApprovalError> {
        let Some(body) = self.secret_key.trim().strip_prefix(SECRET_PREFIX) else {
            return Err(ApprovalError::SecretKey(format!(
                "must start with `{SECRET_PREFIX}`: is this a file from `countersign keygen`?"
            )));
        };
        let raw = b64()
            .decode(body)
            .map_err(|e| ApprovalError::SecretKey(format!("is not base64: {e}")))?;
        let seed: [u8; 32] = raw
            .try_into()
            .map_err(|_| ApprovalError::SecretKey("is not 32 bytes".into()))?;
        Ok(SigningKey::from_bytes(&seed))
    }

    /// Parse a key file's text.
    pub fn parse(text: &str) -> Result<KeyFile, ApprovalError> {
        let kf: KeyFile =
            toml::from_str(text).map_err(|e| ApprovalError::KeyFile(e.message().to_owned()))?;
        check_reviewer_name(&kf.name)?;
        kf.signing_key()?;
        Ok(kf)
    }
}

/// Reviewer names go into HTTP headers and Cedar ids: a plain alphabet.
pub fn check_reviewer_name(name: &str) -> Result<(), ApprovalError> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'))
    {
        return Err(ApprovalError::ReviewerName(name.to_owned()));
    }
    Ok(())
}

/// A registered reviewer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reviewer {
    /// Name: one person, however many keys they sign with. A quorum counts
    /// names, never keys.
    pub name: String,
    /// Their verifying keys (a laptop's and a phone's, say): at least one.
    pub keys: Vec<VerifyingKey>,
    /// Groups (for `Action::"approve"` policies).
    pub groups: Vec<String>,
    /// Tenants whose proposals this reviewer sees; `*` is every tenant.
    pub tenants: Vec<String>,
    /// Their passkeys (the review console): a key each, by credential id.
    pub passkeys: Vec<crate::core::passkey::PasskeyKey>,
    /// The principals this person also calls as (`idp:henry`, an email):
    /// a call by any of them is their own, which they never approve.
    pub principals: Vec<String>,
}

impl Reviewer {
    /// Whether the reviewer asked for a call of `requester` (its principal)
    /// who is also known as `aka` (the `sub` and `email` claims of its
    /// token): their name or one of their `principals` is the principal,
    /// the subject of an issuer's principal (`NAME:SUBJECT`), or one of
    /// `aka`. Without this, reviewer `henry` approved the call of his own
    /// agent `idp:henry`, as names and principals never compared equal.
    /// ASCII case is ignored: a near miss refuses an approval (another
    /// reviewer gives it), it never lets one through.
    pub fn is_requester(&self, requester: &str, aka: &[String]) -> bool {
        let mine: Vec<&str> = std::iter::once(self.name.as_str())
            .chain(self.principals.iter().map(String::as_str))
            .collect();
        std::iter::once(requester)
            .chain(requester.split_once(':').map(|(_, subject)| subject))
            .chain(aka.iter().map(String::as_str))
            .any(|theirs| mine.iter().any(|m| m.eq_ignore_ascii_case(theirs)))
    }

    /// The passkey with this credential id, when it is one of theirs.
    pub fn passkey(&self, credential_id: &str) -> Option<&crate::core::passkey::PasskeyKey> {
        self.passkeys.iter().find(|k| k.id == credential_id)
    }

    /// Whether the reviewer may see and decide the tenant's proposals.
    pub fn covers(&self, tenant: &str) -> bool {
        self.tenants.iter().any(|t| t == "*" || t == tenant)
    }

    /// Whether `public_key` (`ed25519:...`, or `passkey:CREDENTIAL_ID`) is
    /// one of the reviewer's keys: an approval counts only while the key
    /// that made it is in the file.
    pub fn has_key(&self, public_key: &str) -> bool {
        match public_key.strip_prefix("passkey:") {
            Some(id) => self.passkey(id).is_some(),
            None => self.keys.iter().any(|k| format_public_key(k) == public_key),
        }
    }

    /// The first of the reviewer's keys for which `check` succeeds, or the
    /// last key's error (every key is tried: any of them may have signed);
    /// `Err(None)` only for a reviewer without keys, which the reviewers
    /// file never makes.
    pub fn verify_with<E>(
        &self,
        check: impl Fn(&VerifyingKey) -> Result<(), E>,
    ) -> Result<&VerifyingKey, Option<E>> {
        let mut last = None;
        for k in &self.keys {
            match check(k) {
                Ok(()) => return Ok(k),
                Err(e) => last = Some(e),
            }
        }
        Err(last)
    }
}

/// The reviewers of `policies/reviewers.toml`.
#[derive(Debug, Clone, Default)]
pub struct Reviewers {
    by_name: BTreeMap<String, Reviewer>,
}

impl Reviewers {
    /// Parse the file's text. Errors carry `toml`'s line and column.
    pub fn parse(text: &str) -> Result<Reviewers, (Option<std::ops::Range<usize>>, String)> {
        let file: ReviewersFile =
            toml::from_str(text).map_err(|e| (e.span(), e.message().to_owned()))?;
        let mut by_name = BTreeMap::new();
        // A passkey is one person's: an id listed twice (another reviewer's
        // credential id copied into an entry) is refused, or its holder
        // would be locked out, or signed in as someone else.
        let mut passkey_of: BTreeMap<&str, &str> = BTreeMap::new();
        for r in &file.reviewers {
            for k in &r.passkeys {
                if let Some(first) = passkey_of.insert(&k.id, &r.name) {
                    return Err((
                        None,
                        format!(
                            "passkey `{}` is listed for `{first}` and again for `{}`: a passkey belongs to one reviewer; remove the copy",
                            k.id, r.name
                        ),
                    ));
                }
            }
        }
        for r in file.reviewers {
            check_reviewer_name(&r.name).map_err(|e| (None, e.to_string()))?;
            let texts: Vec<&String> = r.public_key.iter().chain(&r.public_keys).collect();
            if texts.is_empty() && r.passkeys.is_empty() {
                return Err((
                    None,
                    format!(
                        "reviewer `{}` has no key: set `public_key` (or `public_keys` for several), or `passkeys` from an enrolment",
                        r.name
                    ),
                ));
            }
            for k in &r.passkeys {
                k.check()
                    .map_err(|e| (None, format!("reviewer `{}`: {e}", r.name)))?;
            }
            let keys = texts
                .into_iter()
                .map(|t| parse_public_key(t).map_err(|e| (None, e.to_string())))
                .collect::<Result<Vec<_>, _>>()?;
            if r.tenants.is_empty() {
                return Err((
                    None,
                    format!(
                        "reviewer `{}` has no `tenants`: list the tenants they review, or `[\"*\"]` for all",
                        r.name
                    ),
                ));
            }
            let name = r.name.clone();
            let reviewer = Reviewer {
                name: r.name,
                keys,
                groups: r.groups,
                tenants: r.tenants,
                passkeys: r.passkeys,
                principals: r.principals,
            };
            if by_name.insert(name.clone(), reviewer).is_some() {
                return Err((None, format!("reviewer `{name}` is listed twice")));
            }
        }
        Ok(Reviewers { by_name })
    }

    /// A reviewer by name.
    pub fn get(&self, name: &str) -> Option<&Reviewer> {
        self.by_name.get(name)
    }

    /// Every reviewer, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Reviewer> {
        self.by_name.values()
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// None registered.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

/// One entry of `reviewers.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReviewerEntry {
    name: String,
    /// One key.
    public_key: Option<String>,
    /// Several keys of the same person (besides or instead of `public_key`).
    #[serde(default)]
    public_keys: Vec<String>,
    /// Passkeys from enrolments in the review console.
    #[serde(default)]
    passkeys: Vec<crate::core::passkey::PasskeyKey>,
    #[serde(default)]
    groups: Vec<String>,
    tenants: Vec<String>,
    /// The principals this person also calls as (`idp:henry`).
    #[serde(default)]
    principals: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReviewersFile {
    #[serde(default)]
    reviewers: Vec<ReviewerEntry>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> SigningKey {
        SigningKey::from_bytes(&[n; 32])
    }

    #[test]
    fn keys_round_trip_and_bad_keys_are_explained() {
        let kf = KeyFile::generate("alice", [7; 32]);
        let text = toml::to_string(&kf).unwrap();
        let back = KeyFile::parse(&text).unwrap();
        let public = format_public_key(&back.signing_key().unwrap().verifying_key());
        assert_eq!(parse_public_key(&public).unwrap(), key(7).verifying_key());
        assert!(parse_public_key("ssh-ed25519 AAAA")
            .unwrap_err()
            .to_string()
            .contains("must start with"));
        assert!(parse_public_key("ed25519:AAAA")
            .unwrap_err()
            .to_string()
            .contains("32 bytes"));
        assert!(KeyFile::parse("name = \"a b\"\nsecret_key = \"x\"").is_err());
        assert!(KeyFile::parse("garbage")
            .unwrap_err()
            .to_string()
            .contains("keygen"));
    }

    #[test]
    fn reviewers_file_is_strict() {
        let pk = format_public_key(&key(1).verifying_key());
        let ok = format!("[[reviewers]]\nname = \"alice\"\npublic_key = \"{pk}\"\ngroups = [\"leads\"]\ntenants = [\"acme\"]\n");
        let r = Reviewers::parse(&ok).unwrap();
        let alice = r.get("alice").unwrap();
        assert!(alice.covers("acme") && !alice.covers("globex"));
        assert!(Reviewers::parse(&ok.replace("groups", "grups")).is_err());
        let (span, msg) = Reviewers::parse(&ok.replace("tenants = [\"acme\"]\n", "")).unwrap_err();
        assert!(span.is_some() && msg.contains("tenants"), "{msg}");
        assert!(Reviewers::parse(&format!("{ok}{ok}"))
            .unwrap_err()
            .1
            .contains("twice"));
        assert!(Reviewers::parse(&ok.replace(&pk, "ed25519:xx")).is_err());
        // F8: one passkey id listed for two reviewers is refused.
        let passkey = "passkeys = [{ id = \"cred-1\", public_key = \"pQECAyYgASFYIGJaE5ISyx7a2bx0XDEH8BVxsx-TS4MuEUtqTV3MMdlNIlggwcO1ZU8ycN3qJBcqv8pi2H3U-tIU_nryI2cVNdR-f1A\", alg = \"ES256\" }]";
        let entry = |name: &str| {
            format!(
                "[[reviewers]]\nname = \"{name}\"\ngroups = []\ntenants = [\"acme\"]\n{passkey}\n"
            )
        };
        let (_, msg) =
            Reviewers::parse(&format!("{}{}", entry("alice"), entry("mallory"))).unwrap_err();
        assert!(msg.contains("cred-1") && msg.contains("mallory"), "{msg}");
        assert!(Reviewers::parse("").unwrap().is_empty());
        // Several keys of one person: one reviewer, either key verifies.
        let pk2 = format_public_key(&key(2).verifying_key());
        let two = ok.replace(
            &format!("public_key = \"{pk}\""),
            &format!("public_keys = [\"{pk}\", \"{pk2}\"]"),
        );
        let r = Reviewers::parse(&two).unwrap();
        assert_eq!(r.len(), 1);
        let alice = r.get("alice").unwrap();
        assert!(alice.has_key(&pk) && alice.has_key(&pk2));
        let signed_by = |n: u8| {
            move |k: &VerifyingKey| {
                if *k == key(n).verifying_key() {
                    Ok(())
                } else {
                    Err(())
                }
            }
        };
        assert_eq!(alice.verify_with(signed_by(2)), Ok(&key(2).verifying_key()));
        assert_eq!(alice.verify_with(signed_by(3)), Err(Some(())));
        let none = ok.replace(&format!("public_key = \"{pk}\"\n"), "");
        assert!(Reviewers::parse(&none)
            .unwrap_err()
            .1
            .contains("has no key"));
    }

    #[test]
    fn a_reviewer_is_the_requester_by_name_subject_principal_or_email() {
        let pk = format_public_key(&key(1).verifying_key());
        let text = format!(
            "[[reviewers]]\nname = \"henry\"\npublic_key = \"{pk}\"\ntenants = [\"*\"]\n\
             [[reviewers]]\nname = \"hal\"\npublic_key = \"{pk}\"\ntenants = [\"*\"]\nprincipals = [\"idp:h-77\", \"Hal@Acme.example\"]\n"
        );
        let rs = Reviewers::parse(&text).unwrap();
        let (henry, hal) = (rs.get("henry").unwrap(), rs.get("hal").unwrap());
        assert!(henry.is_requester("henry", &[]));
        assert!(henry.is_requester("idp:henry", &[]), "the issuer's subject");
        assert!(
            henry.is_requester("idp:u-1", &["Henry".into()]),
            "its sub claim"
        );
        assert!(!henry.is_requester("idp:henrietta", &[]));
        assert!(hal.is_requester("idp:h-77", &[]), "a listed principal");
        assert!(
            hal.is_requester("other:x", &["hal@acme.example".into()]),
            "the email"
        );
        assert!(!hal.is_requester("idp:h-78", &["hal@acme.example.org".into()]));
    }
}
