//! The audit log (DESIGN.md section 8): append-only JSON Lines, hash
//! chained, with checkpoints signed by the gateway's own ed25519 key.
//!
//! An entry is one JSON object per line: `seq`, `time` (RFC 3339), `kind`,
//! the kind's fields, `prev` (the previous entry's `hash`) and `hash` =
//! `sha256:` + hex SHA-256 of the RFC 8785 JCS of the entry without `hash`.
//! A `checkpoint` entry signs `{seq, head, time}` of the entry before it,
//! and is itself in the chain. Reviewer decisions are embedded with their
//! signed statements, so a third party can check them against
//! `reviewers.toml` without trusting the gateway.
//!
//! This file is the pure part: building and hashing entries, checkpoint
//! signatures, argument recording, and [`Verifier`], the chain checker that
//! `countersign audit verify` runs. The writer thread is in [`log`], the
//! file reader and the report in [`verify`], the exports in [`export`].

pub mod export;
pub mod log;
pub mod segment;
pub mod trail;
pub mod verify;

use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use crate::core::approval::{self, Reviewers, Statement};

/// The kind of a checkpoint entry.
pub const CHECKPOINT: &str = "checkpoint";
/// The kind of the entry a gateway writes when it opens the log.
pub const LOG_STARTED: &str = "log_started";

/// `sha256:` + hex SHA-256 of the JCS of `entry` without its `hash`.
pub fn entry_hash(entry: &Map<String, Value>) -> String {
    let mut buf = Vec::with_capacity(1024);
    if entry.contains_key("hash") {
        let without: Map<String, Value> = entry
            .iter()
            .filter(|(k, _)| k.as_str() != "hash")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        crate::core::canonical::jcs_into(&Value::Object(without), &mut buf);
    } else {
        // The writer hashes an entry before it has a `hash`: no copy.
        crate::core::canonical::jcs_object_into(entry, &mut buf);
    }
    format!("sha256:{}", hex::encode(Sha256::digest(&buf)))
}

/// What a checkpoint signs: the JCS of `{seq, head, time}`.
pub fn checkpoint_bytes(seq: u64, head: &str, time: &str) -> Vec<u8> {
    crate::core::canonical::jcs(&json!({ "seq": seq, "head": head, "time": time })).into_bytes()
}

/// Sign a checkpoint; base64 of the signature.
pub fn sign_checkpoint(key: &SigningKey, seq: u64, head: &str, time: &str) -> String {
    base64::engine::general_purpose::STANDARD
        .encode(key.sign(&checkpoint_bytes(seq, head, time)).to_bytes())
}

/// `sha256:` + hex of the JCS of `value` (argument digests and redaction).
pub fn value_digest(value: &Value) -> String {
    format!(
        "sha256:{}",
        hex::encode(Sha256::digest(serde_jcs::to_vec(value).unwrap_or_default()))
    )
}

pub use crate::core::config::ArgumentMode;

/// Entries in order: kind and fields.
pub type Entries = Vec<(&'static str, Map<String, Value>)>;

/// Where evidence goes: the enforcement pipeline, the approval book and a
/// call's trail record through this trait. [`log::AuditLog`] is the
/// implementation `serve` uses; a test may keep entries in memory.
pub trait AuditSink: Send + Sync {
    /// Hand entries to the writer (buffered, in order).
    fn record_all(&self, entries: Entries);

    /// One entry.
    fn record(&self, kind: &'static str, fields: Map<String, Value>) {
        self.record_all(vec![(kind, fields)]);
    }

    /// Stage entries that must be durable with a dispatch (committed in
    /// the ledger's outbox in the same fsync). `Err` gives them back when
    /// the sink cannot stage: then the caller must not dispatch.
    fn stage(&self, entries: Entries) -> Result<log::Staged, Entries>;

    /// Staged entries whose outbox row is committed.
    fn record_staged(&self, staged: log::Staged);

    /// Staged entries whose dispatch did not happen.
    fn unstage(&self, staged: log::Staged);

    /// The `arguments` fields of an entry, as `audit.arguments` says, from
    /// the arguments and their JCS text.
    fn arguments_fields_jcs(&self, arguments: &Value, jcs: &str, fields: &mut Map<String, Value>);

    /// Entries handed to the writer and not yet appended to the log file
    /// (the audit lag, for `/metrics`).
    fn lag(&self) -> usize {
        0
    }

    /// [`AuditSink::arguments_fields_jcs`], canonicalizing the arguments.
    fn arguments_fields(&self, arguments: &Value, fields: &mut Map<String, Value>) {
        let jcs = crate::core::canonical::jcs(arguments);
        self.arguments_fields_jcs(arguments, &jcs, fields);
    }
}

/// The `arguments` fields of an entry: the recorded form (absent in digest
/// mode) and, always, `arguments_digest`, so verification never needs the
/// payload.
pub fn record_arguments(
    mode: ArgumentMode,
    redact: &[String],
    arguments: &Value,
    fields: &mut Map<String, Value>,
) {
    record_arguments_digested(mode, redact, arguments, value_digest(arguments), fields);
}

/// [`record_arguments`] with the digest already known (the relay has the
/// arguments' JCS bytes at hand).
pub fn record_arguments_digested(
    mode: ArgumentMode,
    redact: &[String],
    arguments: &Value,
    digest: String,
    fields: &mut Map<String, Value>,
) {
    fields.insert("arguments_digest".into(), json!(digest));
    match mode {
        ArgumentMode::Full => {
            fields.insert("arguments".into(), arguments.clone());
        }
        ArgumentMode::Digest => {}
        ArgumentMode::Redact => {
            let mut copy = arguments.clone();
            for pointer in redact {
                if let Some(v) = copy.pointer_mut(pointer) {
                    *v = json!(value_digest(v));
                }
            }
            fields.insert("arguments".into(), copy);
        }
    }
}

/// Why a log does not verify, at which entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Break {
    /// The sequence number where the log stops being trustworthy (the entry
    /// expected there).
    pub seq: u64,
    /// Segment file and line.
    pub place: String,
    /// What is wrong.
    pub reason: String,
}

/// The chain checker: feed it lines in order.
#[derive(Debug)]
pub struct Verifier {
    pubkey: Option<VerifyingKey>,
    reviewers: Option<Reviewers>,
    next_seq: u64,
    prev: String,
    /// Entries checked.
    pub entries: u64,
    /// Checkpoints whose signature verified.
    pub checkpoints: u64,
    /// Reviewer statements whose signature verified.
    pub statements: u64,
    /// Sequence number of the last checkpoint, and what it covered.
    pub last_checkpoint: Option<u64>,
    /// The last entry seen was the clean-shutdown checkpoint.
    pub ended_clean: bool,
    /// The public key the log names (in `log_started`), when none was pinned.
    pub named_key: Option<String>,
}

fn str_field<'a>(e: &'a Map<String, Value>, k: &str) -> Option<&'a str> {
    e.get(k).and_then(Value::as_str)
}

impl Verifier {
    /// A verifier; `pubkey` pins the gateway's key (else the key named in
    /// the log's `log_started` entries is used, and the report says so);
    /// `reviewers` checks embedded statements against `reviewers.toml` (else
    /// against the key embedded with each statement).
    pub fn new(pubkey: Option<VerifyingKey>, reviewers: Option<Reviewers>) -> Verifier {
        Verifier {
            pubkey,
            reviewers,
            next_seq: 1,
            prev: String::new(),
            entries: 0,
            checkpoints: 0,
            statements: 0,
            last_checkpoint: None,
            ended_clean: false,
            named_key: None,
        }
    }

    /// Check one line (without its newline).
    pub fn feed(
        &mut self,
        line: &[u8],
        place: &dyn std::fmt::Display,
    ) -> Result<Map<String, Value>, Break> {
        let brk = |reason: String| Break {
            seq: self.next_seq,
            place: place.to_string(),
            reason,
        };
        let mut entry: Map<String, Value> = serde_json::from_slice(line).map_err(|e| {
            brk(format!(
                "not a JSON object ({e}): bytes were changed or lost"
            ))
        })?;
        let seq = entry.get("seq").and_then(Value::as_u64);
        if seq != Some(self.next_seq) {
            return Err(brk(format!(
                "sequence number is {}, expected {}: an entry was removed, inserted or moved",
                seq.map_or("missing".into(), |s| s.to_string()),
                self.next_seq
            )));
        }
        let prev = str_field(&entry, "prev").unwrap_or("");
        if prev != self.prev {
            return Err(brk(format!(
                "`prev` does not match the hash of entry {}: the chain is broken",
                self.next_seq - 1
            )));
        }
        // Hashed without its `hash` (taken out, then put back): no copy.
        let stored = entry.remove("hash");
        let hash = stored
            .as_ref()
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if hash != entry_hash(&entry) {
            return Err(brk(
                "the entry's content does not match its hash: it was edited".into(),
            ));
        }
        if let Some(h) = stored {
            entry.insert("hash".into(), h);
        }
        let kind = str_field(&entry, "kind").unwrap_or("");
        if kind == LOG_STARTED && self.pubkey.is_none() {
            if let Some(k) = str_field(&entry, "public_key") {
                self.named_key = Some(k.to_owned());
            }
        }
        if kind == CHECKPOINT {
            self.check_checkpoint(&entry).map_err(brk)?;
            self.checkpoints += 1;
            self.last_checkpoint = Some(self.next_seq);
        }
        if let Some(approval) = entry
            .get("approval")
            .filter(|d| d.get("statement").is_some())
        {
            self.check_statement(approval).map_err(brk)?;
            self.statements += 1;
        }
        self.ended_clean = kind == CHECKPOINT && str_field(&entry, "reason") == Some("shutdown");
        self.prev = hash;
        self.next_seq += 1;
        self.entries += 1;
        Ok(entry)
    }

    fn check_checkpoint(&self, e: &Map<String, Value>) -> Result<(), String> {
        let cp = e
            .get("checkpoint")
            .ok_or("a checkpoint without `checkpoint`")?;
        let seq = cp.get("seq").and_then(Value::as_u64).unwrap_or(0);
        let head = cp.get("head").and_then(Value::as_str).unwrap_or("");
        let time = cp.get("time").and_then(Value::as_str).unwrap_or("");
        if seq + 1 != self.next_seq || head != self.prev {
            return Err(format!(
                "the checkpoint covers seq {seq} / {head}, not the entry before it"
            ));
        }
        let key = match (&self.pubkey, &self.named_key) {
            (Some(k), _) => *k,
            (None, Some(named)) => approval::parse_public_key(named).map_err(|e| e.to_string())?,
            (None, None) => {
                return Err(
                    "no gateway public key to check the checkpoint with (pass --pubkey)".into(),
                )
            }
        };
        let sig = str_field(e, "signature").unwrap_or("");
        let raw = base64::engine::general_purpose::STANDARD
            .decode(sig)
            .map_err(|_| "the checkpoint signature is not base64".to_owned())?;
        let sig = Signature::from_slice(&raw)
            .map_err(|_| "the checkpoint signature is not 64 bytes".to_owned())?;
        key.verify_strict(&checkpoint_bytes(seq, head, time), &sig)
            .map_err(|_| "the checkpoint signature does not verify with the gateway's key".into())
    }

    fn check_statement(&self, d: &Value) -> Result<(), String> {
        let statement: Statement = serde_json::from_value(d["statement"].clone())
            .map_err(|e| format!("an embedded approval statement does not parse: {e}"))?;
        let sig = d["signature"].as_str().unwrap_or("");
        let key = match &self.reviewers {
            Some(r) => {
                let reviewer = r.get(&statement.reviewer).ok_or_else(|| {
                    format!(
                        "the approval statement is signed by `{}`, who is not in the reviewers file",
                        statement.reviewer
                    )
                })?;
                reviewer.key
            }
            None => approval::parse_public_key(d["public_key"].as_str().unwrap_or(""))
                .map_err(|e| format!("the embedded reviewer key: {e}"))?,
        };
        statement.verify(&key, sig).map_err(|e| {
            format!(
                "the approval statement of reviewer `{}` does not verify: {}",
                statement.reviewer, e
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(n: u64, key: &SigningKey) -> Vec<Vec<u8>> {
        let mut prev = String::new();
        let mut out = Vec::new();
        for seq in 1..=n {
            let mut e = Map::new();
            e.insert("seq".into(), json!(seq));
            e.insert("time".into(), json!("2026-11-30T10:00:00Z"));
            if seq == 1 {
                e.insert("kind".into(), json!(LOG_STARTED));
                e.insert(
                    "public_key".into(),
                    json!(approval::format_public_key(&key.verifying_key())),
                );
            } else if seq == n {
                e.insert("kind".into(), json!(CHECKPOINT));
                e.insert(
                    "checkpoint".into(),
                    json!({"seq": seq - 1, "head": prev, "time": "t"}),
                );
                e.insert(
                    "signature".into(),
                    json!(sign_checkpoint(key, seq - 1, &prev, "t")),
                );
            } else {
                e.insert("kind".into(), json!("call_received"));
                e.insert("tool".into(), json!(format!("t{seq}")));
            }
            e.insert("prev".into(), json!(prev));
            let h = entry_hash(&e);
            e.insert("hash".into(), json!(h));
            prev = h;
            out.push(serde_json::to_vec(&e).unwrap());
        }
        out
    }

    fn run(lines: &[Vec<u8>], pubkey: Option<VerifyingKey>) -> Result<Verifier, Break> {
        let mut v = Verifier::new(pubkey, None);
        for (i, l) in lines.iter().enumerate() {
            v.feed(l, &format!("line {}", i + 1))?;
        }
        Ok(v)
    }

    #[test]
    fn a_chain_verifies_and_every_tampering_names_its_entry() {
        let key = SigningKey::from_bytes(&[9; 32]);
        let lines = chain(6, &key);
        let v = run(&lines, Some(key.verifying_key())).unwrap();
        assert_eq!((v.entries, v.checkpoints), (6, 1));

        let mut edited = lines.clone();
        edited[2] = String::from_utf8(edited[2].clone())
            .unwrap()
            .replace("t3", "t9")
            .into_bytes();
        let b = run(&edited, None).unwrap_err();
        assert_eq!(b.seq, 3);
        assert!(b.reason.contains("edited"), "{b:?}");

        let mut deleted = lines.clone();
        deleted.remove(3);
        assert_eq!(run(&deleted, None).unwrap_err().seq, 4);

        let mut swapped = lines.clone();
        swapped.swap(2, 3);
        assert_eq!(run(&swapped, None).unwrap_err().seq, 3);

        let mut flipped = lines.clone();
        flipped[4][10] ^= 0x01;
        assert_eq!(run(&flipped, None).unwrap_err().seq, 5);

        let other = SigningKey::from_bytes(&[8; 32]);
        let b = run(&lines, Some(other.verifying_key())).unwrap_err();
        assert_eq!(b.seq, 6);
        assert!(b.reason.contains("does not verify"), "{b:?}");
    }

    #[test]
    fn redaction_replaces_values_by_their_digest_and_the_digest_stays() {
        let args = json!({"card": {"number": "4111"}, "amount": 5});
        let mut f = Map::new();
        record_arguments(
            ArgumentMode::Redact,
            &["/card/number".into()],
            &args,
            &mut f,
        );
        assert_eq!(f["arguments"]["amount"], 5);
        assert_eq!(
            f["arguments"]["card"]["number"],
            json!(value_digest(&json!("4111")))
        );
        assert_eq!(f["arguments_digest"], json!(value_digest(&args)));
        let mut f = Map::new();
        record_arguments(ArgumentMode::Digest, &[], &args, &mut f);
        assert!(f.get("arguments").is_none() && f.get("arguments_digest").is_some());
    }
}
