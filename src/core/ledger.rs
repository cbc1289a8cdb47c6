//! The idempotency ledger's rules (DESIGN.md section 3), without I/O.
//!
//! A write-capable `tools/call` runs at most once per idempotency key. This
//! module decides, from the record a key already has (if any), what a new
//! call with that key gets; [`crate::store`] makes the transitions durable
//! and atomic, and the relay drives them in the order of section 3.
//!
//! States and what a call with the same key gets:
//!
//! | state | meaning | same key again |
//! |---|---|---|
//! | `reserved` | claimed, nothing sent yet | waits for the original |
//! | `dispatched` | durably recorded before the request went upstream | waits for the original |
//! | `complete` | the server answered | the same answer, replayed |
//! | `not_dispatched` | proven never sent | a fresh attempt |
//! | `unknown` | sent, answer lost | `outcome_unknown`, until reconciled |

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::core::canonical::Reserved;

/// Where a key's call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Claimed by a call that has not been sent yet.
    Reserved,
    /// Durably recorded as sent (the request may be upstream now).
    Dispatched,
    /// The server answered; the answer is kept for replay.
    Complete,
    /// Proven never sent: the key is free again.
    NotDispatched,
    /// Sent, and the answer was lost: never re-executed until reconciled.
    Unknown,
}

impl State {
    /// Held by a call that has not settled: reserved, or sent and waiting
    /// for its answer. Another call of the key waits for it.
    pub fn in_flight(self) -> bool {
        matches!(self, State::Reserved | State::Dispatched)
    }
}

/// The server's answer, kept for replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// `result` of the response, raw JSON.
    Result(String),
    /// `error` of the response, raw JSON.
    Error(String),
}

/// One key's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Current state.
    pub state: State,
    /// `call_digest` of the call that claimed the key.
    pub digest: String,
    /// Server of that call.
    pub server: String,
    /// Tool of that call.
    pub tool: String,
    /// Whether the key came from the client (a promise) or was derived (an inference).
    pub explicit: bool,
    /// Unix milliseconds when the key was claimed.
    pub created_ms: i64,
    /// Unix milliseconds after which a `complete` or `not_dispatched` record
    /// may be forgotten. `unknown` records never expire.
    pub expires_ms: i64,
    /// The answer, once `complete`.
    pub answer: Option<Answer>,
    /// RFC 3339 time the answer arrived.
    pub answered_at: Option<String>,
    /// The operator's reconciliation note.
    pub note: Option<String>,
}

impl Record {
    /// A fresh reservation.
    pub fn reserve(claim: &Claim, now_ms: i64, ttl_ms: i64) -> Record {
        Record {
            state: State::Reserved,
            digest: claim.digest.clone(),
            server: claim.server.clone(),
            tool: claim.tool.clone(),
            explicit: claim.explicit,
            created_ms: now_ms,
            expires_ms: now_ms.saturating_add(ttl_ms),
            answer: None,
            answered_at: None,
            note: None,
        }
    }

    /// Whether the record still binds its key at `now_ms`. A free key
    /// (`not_dispatched`, or a `complete` record past its retention) may be
    /// claimed again.
    pub fn binds(&self, now_ms: i64) -> bool {
        match self.state {
            State::NotDispatched => false,
            State::Complete => now_ms < self.expires_ms,
            State::Reserved | State::Dispatched | State::Unknown => true,
        }
    }
}

/// What a call presents to the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The namespaced key (see [`storage_key`]).
    pub key: String,
    /// The key as the client knows it (shown in replays).
    pub client_key: String,
    /// Whether the client sent the key.
    pub explicit: bool,
    /// The call's digest.
    pub digest: String,
    /// The call's server.
    pub server: String,
    /// The call's tool.
    pub tool: String,
}

/// What a call with a key gets, given the key's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The key is free: reserve it and go on.
    Proceed,
    /// The same call already completed: replay its answer.
    Replay,
    /// The same call is in flight: wait for its answer.
    Wait,
    /// The same call was sent and its answer lost.
    OutcomeUnknown,
    /// The key was used for another tool (`remap_rejected`).
    Remap,
    /// The key was used for the same tool with other arguments (`drift_rejected`).
    Drift,
}

/// Decide what a call gets. A key reused with another digest is refused
/// whatever the state, while the record binds: a key names one call.
pub fn judge(existing: Option<&Record>, claim: &Claim, now_ms: i64) -> Verdict {
    let Some(rec) = existing.filter(|r| r.binds(now_ms)) else {
        return Verdict::Proceed;
    };
    if rec.digest != claim.digest {
        // INVARIANT: an old answer (or an old approval, later) never rides
        // on a different call.
        return if rec.tool != claim.tool || rec.server != claim.server {
            Verdict::Remap
        } else {
            Verdict::Drift
        };
    }
    match rec.state {
        State::Complete => Verdict::Replay,
        State::Reserved | State::Dispatched => Verdict::Wait,
        State::Unknown => Verdict::OutcomeUnknown,
        // Unreachable: `binds` is false for it.
        State::NotDispatched => Verdict::Proceed,
    }
}

/// Whether `from → to` is a transition the ledger allows.
pub fn allowed(from: State, to: State) -> bool {
    use State::*;
    matches!(
        (from, to),
        (Reserved, Dispatched)
            | (Reserved, NotDispatched)
            | (Dispatched, Complete)
            | (Dispatched, NotDispatched)
            | (Dispatched, Unknown)
            // Reconciliation by an operator.
            | (Unknown, Complete)
            | (Unknown, NotDispatched)
    )
}

/// Namespaced storage key: tenant and principal first, so no one ever sees
/// another principal's record. JSON array text keeps the parts unambiguous.
pub fn storage_key(tenant: &str, principal: &str, key: &str) -> String {
    serde_json::json!([tenant, principal, key]).to_string()
}

/// Why an idempotency key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "idempotency key from `{source_name}` must be a non-empty string of at most 256 characters"
)]
pub struct BadKey {
    /// Where it came from.
    pub source_name: &'static str,
}

/// The idempotency key of a call, first that applies:
/// `_meta["dev.countersign/idempotency-key"]`, `_meta.idempotencyKey`,
/// `arguments._idempotency_key`, `_meta["com.nousresearch.hermes/toolAttemptId"]`;
/// otherwise derived from (principal, tenant, session scope, digest).
/// Returns the key and whether the client sent it.
pub fn idempotency_key(
    reserved: &Reserved,
    principal: &str,
    tenant: &str,
    scope: Option<&str>,
    digest: &str,
) -> Result<(String, bool), BadKey> {
    Ok(match explicit_key(reserved)? {
        Some(k) => (k, true),
        None => (derived_key(principal, tenant, scope, digest), false),
    })
}

/// The key the client sent, first that applies (see [`idempotency_key`]),
/// or `None`.
pub fn explicit_key(reserved: &Reserved) -> Result<Option<String>, BadKey> {
    let sources: [(&'static str, Option<&Value>); 4] = [
        (
            "_meta[\"dev.countersign/idempotency-key\"]",
            reserved.meta.get("dev.countersign/idempotency-key"),
        ),
        (
            "_meta.idempotencyKey",
            reserved.other_meta.get("idempotencyKey"),
        ),
        ("arguments._idempotency_key", reserved.argument_key.as_ref()),
        (
            "_meta[\"com.nousresearch.hermes/toolAttemptId\"]",
            reserved
                .other_meta
                .get("com.nousresearch.hermes/toolAttemptId"),
        ),
    ];
    for (source_name, value) in sources {
        let Some(value) = value else { continue };
        return match value.as_str() {
            Some(k) if !k.is_empty() && k.chars().count() <= 256 => Ok(Some(k.to_owned())),
            _ => Err(BadKey { source_name }),
        };
    }
    Ok(None)
}

/// The key of a call that carries none: a digest of who calls, in which
/// scope, and the call's digest.
pub fn derived_key(principal: &str, tenant: &str, scope: Option<&str>, digest: &str) -> String {
    let basis = serde_json::json!([principal, tenant, scope, digest]);
    let derived = hex::encode(Sha256::digest(
        crate::core::canonical::jcs(&basis).as_bytes(),
    ));
    format!("derived:{derived}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(digest: &str, tool: &str) -> Claim {
        Claim {
            key: "k".into(),
            client_key: "k".into(),
            explicit: true,
            digest: digest.into(),
            server: "s".into(),
            tool: tool.into(),
        }
    }

    fn rec(state: State, digest: &str, tool: &str) -> Record {
        let mut r = Record::reserve(&claim(digest, tool), 0, 1000);
        r.state = state;
        r
    }

    #[test]
    fn the_table_of_section_3() {
        let c = claim("d1", "charge");
        assert_eq!(judge(None, &c, 0), Verdict::Proceed);
        assert_eq!(
            judge(Some(&rec(State::Reserved, "d1", "charge")), &c, 0),
            Verdict::Wait
        );
        assert_eq!(
            judge(Some(&rec(State::Dispatched, "d1", "charge")), &c, 0),
            Verdict::Wait
        );
        assert_eq!(
            judge(Some(&rec(State::Complete, "d1", "charge")), &c, 0),
            Verdict::Replay
        );
        assert_eq!(
            judge(Some(&rec(State::NotDispatched, "d1", "charge")), &c, 0),
            Verdict::Proceed
        );
        assert_eq!(
            judge(Some(&rec(State::Unknown, "d1", "charge")), &c, 0),
            Verdict::OutcomeUnknown
        );
    }

    #[test]
    fn drift_and_remap() {
        let c = claim("d2", "charge");
        assert_eq!(
            judge(Some(&rec(State::Complete, "d1", "charge")), &c, 0),
            Verdict::Drift
        );
        assert_eq!(
            judge(Some(&rec(State::Dispatched, "d1", "charge")), &c, 0),
            Verdict::Drift
        );
        assert_eq!(
            judge(Some(&rec(State::Complete, "d1", "refund")), &c, 0),
            Verdict::Remap
        );
        assert_eq!(
            judge(Some(&rec(State::Unknown, "d1", "refund")), &c, 0),
            Verdict::Remap
        );
        // A freed key may be used for anything.
        assert_eq!(
            judge(Some(&rec(State::NotDispatched, "d1", "refund")), &c, 0),
            Verdict::Proceed
        );
    }

    #[test]
    fn retention() {
        let c = claim("d1", "charge");
        let done = rec(State::Complete, "d1", "charge");
        assert_eq!(judge(Some(&done), &c, 999), Verdict::Replay);
        assert_eq!(
            judge(Some(&done), &c, 1000),
            Verdict::Proceed,
            "expired answers are forgotten"
        );
        let lost = rec(State::Unknown, "d1", "charge");
        assert_eq!(
            judge(Some(&lost), &c, i64::MAX),
            Verdict::OutcomeUnknown,
            "unknown never expires"
        );
    }

    #[test]
    fn transitions() {
        use State::*;
        assert!(allowed(Reserved, Dispatched));
        assert!(allowed(Dispatched, Unknown));
        assert!(allowed(Unknown, NotDispatched));
        assert!(
            !allowed(Complete, Dispatched),
            "a complete call is never sent again"
        );
        assert!(
            !allowed(Unknown, Dispatched),
            "an unknown outcome is never re-executed"
        );
        assert!(
            !allowed(Reserved, Complete),
            "nothing completes without being dispatched"
        );
    }

    #[test]
    fn key_sources_in_order() {
        let mut r = Reserved::default();
        r.other_meta.insert(
            "com.nousresearch.hermes/toolAttemptId".into(),
            json!("hermes"),
        );
        assert_eq!(
            idempotency_key(&r, "p", "t", None, "d").unwrap(),
            ("hermes".into(), true)
        );
        r.argument_key = Some(json!("arg"));
        assert_eq!(idempotency_key(&r, "p", "t", None, "d").unwrap().0, "arg");
        r.other_meta.insert("idempotencyKey".into(), json!("meta"));
        assert_eq!(idempotency_key(&r, "p", "t", None, "d").unwrap().0, "meta");
        r.meta
            .insert("dev.countersign/idempotency-key".into(), json!("ours"));
        assert_eq!(idempotency_key(&r, "p", "t", None, "d").unwrap().0, "ours");
        r.meta
            .insert("dev.countersign/idempotency-key".into(), json!(42));
        assert!(
            idempotency_key(&r, "p", "t", None, "d").is_err(),
            "a non-string key is refused, not ignored"
        );
    }

    #[test]
    fn derived_keys_depend_on_who_where_and_what() {
        let r = Reserved::default();
        let (k, explicit) = idempotency_key(&r, "p", "t", Some("s1"), "d").unwrap();
        assert!(!explicit);
        assert!(k.starts_with("derived:"));
        assert_eq!(k, idempotency_key(&r, "p", "t", Some("s1"), "d").unwrap().0);
        for (p, t, s, d) in [
            ("q", "t", Some("s1"), "d"),
            ("p", "u", Some("s1"), "d"),
            ("p", "t", Some("s2"), "d"),
            ("p", "t", None, "d"),
            ("p", "t", Some("s1"), "e"),
        ] {
            assert_ne!(k, idempotency_key(&r, p, t, s, d).unwrap().0);
        }
    }

    #[test]
    fn storage_keys_are_namespaced_and_unambiguous() {
        assert_ne!(storage_key("a", "b:c", "k"), storage_key("a:b", "c", "k"));
        assert_ne!(storage_key("t", "alice", "k"), storage_key("t", "bob", "k"));
    }
}
