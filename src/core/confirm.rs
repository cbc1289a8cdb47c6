//! Approval in the client (DESIGN.md section 14), the pure part: the
//! question put to the person at the client, the answer read back, and the
//! `requestState` of the 2026-07-28 era, which the gateway signs.
//!
//! Why a signature and a store: the specification lets a `requestState`
//! travel through the client, so it is attacker input. The signature binds
//! it to the principal, tenant, server, tool, call digest, tool definition,
//! idempotency key, proposal and expiry, so it cannot be altered or moved to
//! another call. A signature does not make it single-use: the proposal it
//! names is answered once, in the store, by compare-and-set, and consumed
//! at execution start with the idempotency key, like a reviewer's approval.

use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The strict parse recognises the gateway's `requestState` and input key,
/// so they are defined beside it; named here too, where states are made.
pub use crate::core::canonical::{INPUT_KEY, STATE_PREFIX};
/// `type` of the signed claims.
pub const STATE_TYPE: &str = "countersign.request_state.v1";
/// The most bytes of a `requestState` the gateway reads.
const MAX_STATE: usize = 4096;
/// The most bytes of arguments a question shows.
const MAX_SHOWN: usize = 4096;

/// What a `requestState` binds. Unknown fields are refused: nothing rides
/// along under the signature that the gateway does not check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateClaims {
    /// Always [`STATE_TYPE`].
    #[serde(rename = "type")]
    pub kind: String,
    /// The proposal the answer decides.
    pub proposal_id: String,
    /// Server.
    pub server: String,
    /// Tool.
    pub tool: String,
    /// Canonical call digest.
    pub call_digest: String,
    /// The authenticated principal the question was put to.
    pub principal: String,
    /// Its tenant.
    pub tenant: String,
    /// The tool's definition digest when asked (`None`: not listed).
    pub tool_definition: Option<String>,
    /// The call's ledger key (idempotency key in its scope).
    pub idempotency_key: String,
    /// Unix ms after which the state answers nothing.
    pub expires_ms: i64,
    /// Random, names this question (recorded with the answer).
    pub nonce: String,
}

impl StateClaims {
    /// The claims as the JSON object that is signed, built field by field so
    /// that it cannot fail: signed bytes never fall back to something else
    /// (a test holds it equal to the claims' serde form, which `open` reads).
    fn to_json(&self) -> Value {
        let text = |s: &str| Value::String(s.to_owned());
        let mut m = serde_json::Map::new();
        m.insert("type".into(), text(&self.kind));
        m.insert("proposal_id".into(), text(&self.proposal_id));
        m.insert("server".into(), text(&self.server));
        m.insert("tool".into(), text(&self.tool));
        m.insert("call_digest".into(), text(&self.call_digest));
        m.insert("principal".into(), text(&self.principal));
        m.insert("tenant".into(), text(&self.tenant));
        m.insert(
            "tool_definition".into(),
            self.tool_definition.as_deref().map_or(Value::Null, text),
        );
        m.insert("idempotency_key".into(), text(&self.idempotency_key));
        m.insert("expires_ms".into(), Value::from(self.expires_ms));
        m.insert("nonce".into(), text(&self.nonce));
        Value::Object(m)
    }
}

/// Why a `requestState` is not acceptable (before any binding is compared).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// Not of the gateway's form.
    #[error("the requestState is not one countersign issued ({0})")]
    Malformed(String),
    /// Well formed, and the signature does not verify.
    #[error("the requestState's signature does not verify: it was altered, or another gateway's key signed it")]
    BadSignature,
}

/// A `requestState` taken apart: the claims and what the signature covers.
#[derive(Debug, Clone)]
pub struct Opened {
    /// The claims (not to be trusted before [`Opened::verify`]).
    pub claims: StateClaims,
    payload: Vec<u8>,
    signature: Signature,
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
}

/// Sign `claims` into a `requestState`: the prefix, base64url of the
/// claims' JCS, a dot, base64url of the Ed25519 signature over those bytes.
pub fn seal(claims: &StateClaims, key: &SigningKey) -> String {
    let payload = crate::core::canonical::jcs(&claims.to_json());
    let signature = key.sign(payload.as_bytes());
    format!(
        "{STATE_PREFIX}{}.{}",
        b64().encode(payload.as_bytes()),
        b64().encode(signature.to_bytes())
    )
}

/// Take a `requestState` apart. Nothing in it is trusted until
/// [`Opened::verify`] passed.
pub fn open(text: &str) -> Result<Opened, StateError> {
    let bad = |why: &str| StateError::Malformed(why.to_owned());
    if text.len() > MAX_STATE {
        return Err(bad("too long"));
    }
    let body = text
        .strip_prefix(STATE_PREFIX)
        .ok_or_else(|| bad("wrong prefix"))?;
    let (payload, signature) = body
        .split_once('.')
        .ok_or_else(|| bad("no signature part"))?;
    let payload = b64()
        .decode(payload)
        .map_err(|_| bad("the claims are not base64url"))?;
    let signature = b64()
        .decode(signature)
        .map_err(|_| bad("the signature is not base64url"))?;
    let signature =
        Signature::from_slice(&signature).map_err(|_| bad("the signature is not 64 bytes"))?;
    let claims: StateClaims = serde_json::from_slice(&payload)
        .map_err(|e| StateError::Malformed(format!("claims: {e}")))?;
    if claims.kind != STATE_TYPE {
        return Err(bad("another type of state"));
    }
    Ok(Opened {
        claims,
        payload,
        signature,
    })
}

impl Opened {
    /// Check the signature with one of the keys that may have signed it
    /// (the gateways that asked about the proposal). `verify_strict`: one
    /// state, one valid signature per key.
    pub fn verify<'a>(
        &self,
        keys: impl IntoIterator<Item = &'a VerifyingKey>,
    ) -> Result<(), StateError> {
        if keys
            .into_iter()
            .any(|k| k.verify_strict(&self.payload, &self.signature).is_ok())
        {
            Ok(())
        } else {
            Err(StateError::BadSignature)
        }
    }
}

/// The first binding field of `claims` that differs from `want`, with both
/// values, or `None` when the state is for exactly this call.
pub fn mismatch(
    claims: &StateClaims,
    want: &StateClaims,
) -> Option<(&'static str, String, String)> {
    let pairs: [(&'static str, Option<&str>, Option<&str>); 8] = [
        ("principal", Some(&claims.principal), Some(&want.principal)),
        ("tenant", Some(&claims.tenant), Some(&want.tenant)),
        ("server", Some(&claims.server), Some(&want.server)),
        ("tool", Some(&claims.tool), Some(&want.tool)),
        (
            "call_digest",
            Some(&claims.call_digest),
            Some(&want.call_digest),
        ),
        (
            "tool_definition",
            claims.tool_definition.as_deref(),
            want.tool_definition.as_deref(),
        ),
        (
            "idempotency_key",
            Some(&claims.idempotency_key),
            Some(&want.idempotency_key),
        ),
        (
            "proposal_id",
            Some(&claims.proposal_id),
            Some(&want.proposal_id),
        ),
    ];
    pairs
        .into_iter()
        .find(|(_, got, want)| got != want)
        .map(|(field, got, want)| {
            (
                field,
                got.unwrap_or("null").to_owned(),
                want.unwrap_or("null").to_owned(),
            )
        })
}

/// Whether client capabilities declare form elicitation: `elicitation: {}`
/// (form, before modes existed) or `elicitation.form`.
pub fn declares_elicitation(capabilities: Option<&Value>) -> bool {
    match capabilities.and_then(|c| c.get("elicitation")) {
        Some(Value::Object(e)) => e.is_empty() || e.contains_key("form"),
        _ => false,
    }
}

/// The question, as `elicitation/create` params: the plain sentence and the
/// arguments of the gateway's canonical copy, and a form asking yes or no
/// with an optional reason. `with_mode`: the peer knows elicitation modes
/// (2025-11-25 and later).
pub fn question(
    summary: &str,
    arguments_jcs: &str,
    digest: &str,
    proposal_id: &str,
    with_mode: bool,
) -> Value {
    // Very large arguments are cut for the eye; the yes binds their digest,
    // which is named, so what is approved stays exact.
    let shown = if arguments_jcs.len() > MAX_SHOWN {
        let mut end = MAX_SHOWN;
        while !arguments_jcs.is_char_boundary(end) {
            end -= 1;
        }
        format!(
            "{}… ({} bytes in all; their digest is {digest})",
            &arguments_jcs[..end],
            arguments_jcs.len()
        )
    } else {
        arguments_jcs.to_owned()
    };
    let message = format!(
        "countersign asks you to approve a call your agent made. {summary}.\n\
         The exact arguments that will be sent: {shown}\n\
         Approve it to run it once (proposal {proposal_id}); decline to refuse it."
    );
    let mut params = json!({
        "message": message,
        "requestedSchema": {
            "type": "object",
            "properties": {
                "approve": {
                    "type": "boolean",
                    "title": "Run this call once",
                    "description": "Yes runs exactly this call, once; no refuses it.",
                },
                "reason": {
                    "type": "string",
                    "title": "Reason (optional)",
                    "maxLength": 500,
                },
            },
            "required": ["approve"],
        },
    });
    if with_mode {
        params["mode"] = json!("form");
    }
    params
}

/// What the person at the client said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Yes (`accept` with `approve: true`).
    Approve {
        /// Their reason, if they gave one.
        reason: String,
    },
    /// No (`decline`, or `accept` with `approve: false`).
    Deny {
        /// Their reason, if they gave one.
        reason: String,
    },
    /// Dismissed without a choice (`cancel`): the proposal stays with the
    /// reviewers.
    Cancel,
}

/// Read an `ElicitResult`. Anything but an explicit `approve: true` under
/// `accept` is not a yes (fail closed); a shape that is not an
/// `ElicitResult` at all is an error, said precisely.
pub fn read_answer(result: &Value) -> Result<Answer, String> {
    let action = result
        .get("action")
        .and_then(Value::as_str)
        .ok_or("the elicitation result has no string `action`")?;
    let content = result.get("content");
    let reason = content
        .and_then(|c| c.get("reason"))
        .and_then(Value::as_str)
        .map(|r| r.chars().take(500).collect::<String>())
        .unwrap_or_default();
    match action {
        "accept" => match content.and_then(|c| c.get("approve")) {
            Some(Value::Bool(true)) => Ok(Answer::Approve { reason }),
            Some(Value::Bool(false)) => Ok(Answer::Deny { reason }),
            Some(other) => Err(format!(
                "the elicitation result's `content.approve` is {other}, not true or false"
            )),
            None => Err("the elicitation result accepts without `content.approve`".into()),
        },
        "decline" => Ok(Answer::Deny { reason }),
        "cancel" => Ok(Answer::Cancel),
        other => Err(format!(
            "the elicitation result's `action` is `{other}`, not accept, decline or cancel"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_claims_are_their_serde_form() {
        let mut c = claims();
        assert_eq!(c.to_json(), serde_json::to_value(&c).unwrap());
        c.tool_definition = None;
        assert_eq!(c.to_json(), serde_json::to_value(&c).unwrap());
        c.tool_definition = Some("sha256:ab".into());
        assert_eq!(c.to_json(), serde_json::to_value(&c).unwrap());
    }

    fn claims() -> StateClaims {
        StateClaims {
            kind: STATE_TYPE.into(),
            proposal_id: "p-0123456789abcdef".into(),
            server: "payments".into(),
            tool: "charge_card".into(),
            call_digest: "sha256:aa".into(),
            principal: "dev-1".into(),
            tenant: "acme".into(),
            tool_definition: Some("sha256:bb".into()),
            idempotency_key: "k-1".into(),
            expires_ms: 1_000,
            nonce: "n1".into(),
        }
    }

    #[test]
    fn a_sealed_state_opens_and_verifies_with_its_key_only() {
        let key = SigningKey::from_bytes(&[7; 32]);
        let other = SigningKey::from_bytes(&[8; 32]);
        let text = seal(&claims(), &key);
        assert!(text.starts_with(STATE_PREFIX));
        let opened = open(&text).unwrap();
        assert_eq!(opened.claims, claims());
        opened.verify([&key.verifying_key()]).unwrap();
        assert_eq!(
            opened.verify([&other.verifying_key()]),
            Err(StateError::BadSignature)
        );
        opened
            .verify([&other.verifying_key(), &key.verifying_key()])
            .unwrap();
    }

    #[test]
    fn every_altered_byte_is_refused() {
        let key = SigningKey::from_bytes(&[7; 32]);
        let text = seal(&claims(), &key);
        let mut refused = 0;
        for i in STATE_PREFIX.len()..text.len() {
            let mut bytes = text.clone().into_bytes();
            bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
            let Ok(altered) = String::from_utf8(bytes) else {
                continue;
            };
            let ok = open(&altered).and_then(|o| o.verify([&key.verifying_key()]));
            assert!(ok.is_err(), "byte {i} altered and still accepted");
            refused += 1;
        }
        assert!(refused > 100);
    }

    #[test]
    fn malformed_states_say_why() {
        for (text, why) in [
            ("plain", "wrong prefix"),
            ("countersign.1.abc", "no signature part"),
            ("countersign.1.!!.AAAA", "not base64url"),
            ("countersign.1.e30.AAAA", "not 64 bytes"),
        ] {
            let e = open(text).unwrap_err().to_string();
            assert!(e.contains(why), "{text}: {e}");
        }
        let key = SigningKey::from_bytes(&[7; 32]);
        let sig = b64().encode(key.sign(b"{}").to_bytes());
        let e = open(&format!("{STATE_PREFIX}e30.{sig}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("claims"), "{e}");
        assert!(open(&"x".repeat(MAX_STATE + 1)).is_err());
    }

    #[test]
    fn mismatch_names_the_first_differing_binding() {
        let want = claims();
        assert_eq!(mismatch(&claims(), &want), None);
        let mut other = claims();
        other.call_digest = "sha256:cc".into();
        assert_eq!(
            mismatch(&other, &want),
            Some(("call_digest", "sha256:cc".into(), "sha256:aa".into()))
        );
        let mut other = claims();
        other.tool_definition = None;
        assert_eq!(
            mismatch(&other, &want).map(|m| m.0),
            Some("tool_definition")
        );
        let mut other = claims();
        other.principal = "agent-9".into();
        assert_eq!(mismatch(&other, &want).map(|m| m.0), Some("principal"));
    }

    #[test]
    fn large_arguments_are_cut_for_the_eye_and_their_digest_named() {
        let big = format!("{{\"note\":\"{}\"}}", "é".repeat(5000));
        let q = question("s", &big, "sha256:ab", "p-1", false);
        let m = q["message"].as_str().unwrap();
        assert!(
            m.len() < 5000 && m.contains("bytes in all; their digest is sha256:ab"),
            "{}",
            m.len()
        );
        assert!(q.get("mode").is_none());
        let small = question("s", "{}", "sha256:ab", "p-1", true);
        assert!(small["message"].as_str().unwrap().contains("sent: {}\n"));
        assert_eq!(small["mode"], "form");
    }

    #[test]
    fn only_explicit_yes_approves() {
        let yes = json!({"action": "accept", "content": {"approve": true, "reason": "fine"}});
        assert_eq!(
            read_answer(&yes),
            Ok(Answer::Approve {
                reason: "fine".into()
            })
        );
        let no = json!({"action": "accept", "content": {"approve": false}});
        assert_eq!(
            read_answer(&no),
            Ok(Answer::Deny {
                reason: String::new()
            })
        );
        assert_eq!(
            read_answer(&json!({"action": "decline"})),
            Ok(Answer::Deny {
                reason: String::new()
            })
        );
        assert_eq!(
            read_answer(&json!({"action": "cancel"})),
            Ok(Answer::Cancel)
        );
        for bad in [
            json!({"action": "accept"}),
            json!({"action": "accept", "content": {"approve": "yes"}}),
            json!({"action": "maybe"}),
            json!({}),
        ] {
            assert!(read_answer(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn elicitation_capability_is_read_as_the_spec_defines_it() {
        assert!(declares_elicitation(Some(&json!({"elicitation": {}}))));
        assert!(declares_elicitation(Some(
            &json!({"elicitation": {"form": {}, "url": {}}})
        )));
        assert!(!declares_elicitation(Some(
            &json!({"elicitation": {"url": {}}})
        )));
        assert!(!declares_elicitation(Some(&json!({"sampling": {}}))));
        assert!(!declares_elicitation(None));
    }
}
