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

pub(crate) mod export;
pub mod fields;
pub use fields::{Fields, Member};
pub mod log;
pub mod merkle;
pub mod note;
pub(crate) mod outbox;
pub use outbox::RecoveryError;
#[cfg(test)]
mod power;
pub(crate) mod proofs;
pub(crate) mod recover;
pub(crate) mod segment;
pub(crate) mod trail;
pub mod tree;
pub mod verify;
pub(crate) mod writer;

use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde_json::{json, Map, Value};

use crate::core::approval::Statement;
use crate::core::reviewers::Reviewers;

/// The kind of a checkpoint entry.
pub const CHECKPOINT: &str = "checkpoint";
/// The kind of the entry a gateway writes when it opens the log.
pub const LOG_STARTED: &str = "log_started";
/// The kind of the entry recording a witness's cosignature of a checkpoint.
pub const COSIGNED: &str = "checkpoint_cosigned";
/// The latest signed checkpoint note (with any cosignatures), in the audit dir.
pub const CHECKPOINT_FILE: &str = "checkpoint";

/// `sha256:` + hex SHA-256 of the JCS of `entry` without its `hash`.
pub fn entry_hash(entry: &Map<String, Value>) -> String {
    format!("sha256:{}", hex::encode(entry_digest(entry)))
}

/// The 32 bytes of an entry hash given as `sha256:HEX`.
pub fn hash_bytes(hash: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(hash.strip_prefix("sha256:")?, &mut out).ok()?;
    Some(out)
}

/// SHA-256 of the JCS of `entry` without its `hash`.
pub fn entry_digest(entry: &Map<String, Value>) -> [u8; 32] {
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
    crate::core::sha256::digest(&buf)
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
    crate::core::redact::digest(value)
}

pub use crate::core::config::ArgumentMode;

/// Entries in order: kind and fields.
pub type Entries = Vec<(&'static str, Fields)>;

/// Where evidence goes: the enforcement pipeline, the approval book and a
/// call's trail record through this trait. [`log::AuditLog`] is the
/// implementation `serve` uses; a test may keep entries in memory.
pub trait AuditSink: Send + Sync {
    /// Hand entries to the writer (buffered, in order).
    fn record_all(&self, entries: Entries);

    /// One entry.
    fn record(&self, kind: &'static str, fields: Map<String, Value>) {
        self.record_all(vec![(kind, fields.into())]);
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
    fn arguments_fields_jcs(&self, arguments: &Value, jcs: &str, fields: &mut Fields);

    /// A revision's argument changes as this sink records arguments (see
    /// [`record_changes`]). By default every value is a digest: a sink that
    /// does not say how it records arguments shows none.
    fn changes_value(&self, changes: &[crate::core::approval::Change]) -> Value {
        record_changes(ArgumentMode::Digest, &[], changes)
    }

    /// Entries handed to the writer and not yet appended to the log file
    /// (the audit lag, for `/metrics`).
    fn lag(&self) -> usize {
        0
    }

    /// [`AuditSink::arguments_fields_jcs`], canonicalizing the arguments.
    fn arguments_fields(&self, arguments: &Value, fields: &mut Fields) {
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
    fields: &mut Fields,
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
    fields: &mut Fields,
) {
    // `arguments` first: in key order, the digest goes in right after it
    // without a search.
    match mode {
        ArgumentMode::Full => {
            fields.insert("arguments", arguments.clone());
        }
        ArgumentMode::Digest => {}
        ArgumentMode::Redact => {
            let copy = crate::core::redact::redacted(arguments, redact).into_owned();
            fields.insert("arguments", copy);
        }
    }
    fields.insert("arguments_digest", Value::from(digest));
}

/// A revision's argument changes as `audit.arguments` records arguments:
/// as they are (`full`), every value a digest (`digest`), or the values at
/// `audit.redact` pointers a digest (`redact`).
pub fn record_changes(
    mode: ArgumentMode,
    redact: &[String],
    changes: &[crate::core::approval::Change],
) -> Value {
    let mut changes = changes.to_vec();
    match mode {
        ArgumentMode::Full => {}
        ArgumentMode::Digest => {
            for c in &mut changes {
                for v in [c.before.as_mut(), c.after.as_mut()].into_iter().flatten() {
                    *v = json!(value_digest(v));
                }
            }
        }
        ArgumentMode::Redact => crate::core::redact::redact_changes(&mut changes, redact),
    }
    serde_json::to_value(changes).unwrap_or(Value::Null)
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

/// The chain checker: feed it lines in order. Besides the chain it builds
/// the Merkle tree (its right edge only, O(log n) memory), checks each
/// checkpoint note against the root it computed, and the checkpoints held
/// elsewhere that it was given.
#[derive(Debug)]
pub struct Verifier {
    pubkey: Option<VerifyingKey>,
    reviewers: Option<Reviewers>,
    next_seq: u64,
    prev: String,
    tree: merkle::Frontier,
    /// Checkpoints held elsewhere to check this log against, by size.
    held: std::collections::BTreeMap<u64, Vec<Held>>,
    /// What became of them.
    pub held_results: Vec<String>,
    /// Roots at the sizes of the log's own checkpoints.
    roots: std::collections::BTreeMap<u64, merkle::Hash>,
    /// Witnesses whose cosignatures are checked.
    witnesses: Vec<note::Vkey>,
    /// Cosignatures that verified.
    pub cosignatures: u64,
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

/// A checkpoint held elsewhere.
#[derive(Debug)]
struct Held {
    label: String,
    note: note::Note,
    checkpoint: note::Checkpoint,
}

fn str_field<'a>(e: &'a Map<String, Value>, k: &str) -> Option<&'a str> {
    e.get(k).and_then(Value::as_str)
}

/// What the verifier reads of every line without building it.
#[derive(serde::Deserialize)]
struct Head<'a> {
    seq: Option<u64>,
    #[serde(borrow)]
    kind: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    prev: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    hash: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    approval: Option<&'a serde_json::value::RawValue>,
}

/// The byte range of the top-level member `name` of a JSON object's text
/// (its key, colon and value), or `None`. A linear scan that tracks depth
/// and strings: a member of the same name deeper down (in `arguments`, say)
/// is never taken for it.
fn member_span(line: &[u8], name: &[u8]) -> Option<(usize, usize)> {
    let (mut depth, mut i) = (0u32, 0usize);
    let (mut expect_key, mut target, mut start) = (false, false, 0usize);
    while i < line.len() {
        match line[i] {
            b'"' => {
                let open = i;
                i += 1;
                while i < line.len() && line[i] != b'"' {
                    if line[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
                if depth == 1 && expect_key {
                    target = line.get(open + 1..i) == Some(name);
                    start = open;
                    expect_key = false;
                }
            }
            b'{' | b'[' => {
                depth += 1;
                if depth == 1 {
                    expect_key = true;
                }
            }
            b'}' | b']' => {
                if depth == 1 && target {
                    return Some((start, i));
                }
                depth = depth.saturating_sub(1);
            }
            b',' if depth == 1 => {
                if target {
                    return Some((start, i));
                }
                expect_key = true;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// SHA-256 of a JCS entry line without its top-level `hash` member: the
/// entry's hash when the line is the JCS the writer writes.
fn digest_without_hash(line: &[u8]) -> Option<[u8; 32]> {
    let (s, e) = member_span(line, b"hash")?;
    let (cut_from, cut_to) = if s > 0 && line[s - 1] == b',' {
        (s - 1, e)
    } else if line.get(e) == Some(&b',') {
        (s, e + 1)
    } else {
        (s, e)
    };
    let mut h = crate::core::sha256::Hasher::new();
    h.update(&line[..cut_from]);
    h.update(&line[cut_to..]);
    Some(h.finish())
}

/// An entry line's hash, checked: the digest its content hashes to, which
/// must be the `hash` it states. For one entry on its own (an export with
/// proofs); the chain is not checked here.
pub fn check_entry_line(line: &[u8]) -> Result<[u8; 32], String> {
    let head: Head<'_> =
        serde_json::from_slice(line).map_err(|e| format!("not a JSON object ({e})"))?;
    let stated = head
        .hash
        .as_deref()
        .and_then(hash_bytes)
        .ok_or("the entry has no `hash` of the form sha256:HEX")?;
    checked_digest(line, Some(stated))
}

/// The digest of an entry line, which must be `stated`: the line's own
/// bytes with `hash` cut out first (the writer writes JCS), else (a line in
/// another form, from an older writer) parsed and put in JCS.
fn checked_digest(line: &[u8], stated: Option<[u8; 32]>) -> Result<[u8; 32], String> {
    let mut digest = digest_without_hash(line);
    if stated.is_none() || digest != stated {
        // Not the writer's own bytes: read strictly. A key twice (say a
        // second `tool` put in front of the real one) would let this parser
        // see one value and a reader of the exported line another.
        let text = std::str::from_utf8(line).map_err(|_| "not UTF-8".to_owned())?;
        crate::core::canonical::check_unambiguous(text, 256)
            .map_err(|e| format!("not an entry the writer could have written: {e}"))?;
        let mut entry: Map<String, Value> =
            serde_json::from_slice(line).map_err(|e| format!("not a JSON object ({e})"))?;
        entry.remove("hash");
        digest = Some(entry_digest(&entry));
    }
    match (digest, stated) {
        (Some(d), Some(s)) if d == s => Ok(d),
        _ => Err("the entry's content does not match its hash: it was edited".into()),
    }
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
            tree: merkle::Frontier::default(),
            held: Default::default(),
            held_results: Vec::new(),
            roots: Default::default(),
            witnesses: Vec::new(),
            cosignatures: 0,
            entries: 0,
            checkpoints: 0,
            statements: 0,
            last_checkpoint: None,
            ended_clean: false,
            named_key: None,
        }
    }

    /// Also check the log against a checkpoint note held elsewhere (`label`
    /// names it in messages). Its signature is checked with the gateway's
    /// key when the log reaches its size (or ends before it).
    pub fn hold(&mut self, label: &str, text: &str) -> Result<(), String> {
        let n = note::Note::parse(text).map_err(|e| format!("{label}: {e}"))?;
        let cp = note::Checkpoint::parse(&n.text).map_err(|e| format!("{label}: {e}"))?;
        self.held.entry(cp.size).or_default().push(Held {
            label: label.to_owned(),
            note: n,
            checkpoint: cp,
        });
        Ok(())
    }

    /// Check cosignatures by `witness` wherever the log records them.
    pub fn witness(&mut self, witness: note::Vkey) {
        self.witnesses.push(witness);
    }

    /// The root of the entries fed so far.
    pub fn root(&self) -> merkle::Hash {
        self.tree.root()
    }

    /// After the last line: a held checkpoint beyond the log's end is
    /// truncation, said precisely. `Err` names the first.
    pub fn finish(&mut self) -> Result<(), String> {
        let size = self.tree.size();
        let key = self.gateway_key();
        if let Some(h) = self.held.range(size + 1..).flat_map(|(_, v)| v).next() {
            let key = key?;
            h.note
                .verify(&h.checkpoint.origin, &key)
                .map_err(|e| format!("{}: {e}", h.label))?;
            return Err(format!(
                "truncated: {} (signed by the gateway) covers {} entries, and the log has {size}: \
                 {} entries were removed from its end (seq {} to {} are missing)",
                h.label,
                h.checkpoint.size,
                h.checkpoint.size - size,
                size + 1,
                h.checkpoint.size
            ));
        }
        Ok(())
    }

    fn check_held(&mut self) -> Result<(), String> {
        let size = self.tree.size();
        let Some(held) = self.held.get(&size) else {
            return Ok(());
        };
        let key = self.gateway_key()?;
        for h in held {
            h.note
                .verify(&h.checkpoint.origin, &key)
                .map_err(|e| format!("{}: {e}", h.label))?;
        }
        // Two signed checkpoints of one size with different roots: the key
        // signed two histories, whatever this log holds.
        if let Some(pair) = held
            .iter()
            .flat_map(|a| held.iter().map(move |b| (a, b)))
            .find(|(a, b)| a.checkpoint.root != b.checkpoint.root)
        {
            return Err(format!(
                "fork: {} and {} are two checkpoints of size {size} with different roots, both signed by \
                 the gateway's key: it signed two histories",
                pair.0.label, pair.1.label
            ));
        }
        let root = self.tree.root();
        for h in held {
            if h.checkpoint.root != root {
                return Err(format!(
                    "rewritten: the log's first {size} entries do not hash to the root of {}: the history \
                     before it is not the one the gateway signed",
                    h.label
                ));
            }
            self.held_results.push(format!(
                "{}: the log holds it (size {size}, root matches)",
                h.label
            ));
        }
        Ok(())
    }

    /// Check one line (without its newline).
    pub fn feed(&mut self, line: &[u8], place: &dyn std::fmt::Display) -> Result<(), Break> {
        let at = self.next_seq;
        let brk = |reason: String| Break {
            seq: at,
            place: place.to_string(),
            reason,
        };
        let head: Head<'_> = serde_json::from_slice(line).map_err(|e| {
            brk(format!(
                "not a JSON object ({e}): bytes were changed or lost"
            ))
        })?;
        if head.seq != Some(self.next_seq) {
            return Err(brk(format!(
                "sequence number is {}, expected {}: an entry was removed, inserted or moved",
                head.seq.map_or("missing".into(), |s| s.to_string()),
                self.next_seq
            )));
        }
        if head.prev.as_deref().unwrap_or("") != self.prev {
            return Err(brk(format!(
                "`prev` does not match the hash of entry {}: the chain is broken",
                self.next_seq - 1
            )));
        }
        let hash = head.hash.as_deref().unwrap_or("");
        let digest = checked_digest(line, hash_bytes(hash)).map_err(brk)?;
        let kind = head.kind.as_deref().unwrap_or("");
        let special = kind == LOG_STARTED
            || kind == CHECKPOINT
            || kind == COSIGNED
            || head.approval.is_some();
        let mut clean = false;
        if special {
            let entry: Map<String, Value> = serde_json::from_slice(line)
                .map_err(|e| brk(format!("not a JSON object ({e})")))?;
            if kind == LOG_STARTED && self.pubkey.is_none() {
                if let Some(k) = str_field(&entry, "public_key") {
                    self.named_key = Some(k.to_owned());
                }
            }
            if kind == CHECKPOINT {
                self.check_checkpoint(&entry).map_err(brk)?;
                self.checkpoints += 1;
                self.last_checkpoint = Some(self.next_seq);
                clean = str_field(&entry, "reason") == Some("shutdown");
            }
            if kind == COSIGNED {
                self.check_cosigned(&entry).map_err(brk)?;
            }
            if let Some(approval) = entry
                .get("approval")
                .filter(|d| d.get("statement").is_some())
            {
                self.check_statement(approval).map_err(brk)?;
                self.statements += 1;
            }
        }
        self.tree.push(merkle::leaf_hash(&digest));
        self.check_held().map_err(brk)?;
        self.ended_clean = clean;
        self.prev = hash.to_owned();
        self.next_seq += 1;
        self.entries += 1;
        Ok(())
    }

    fn gateway_key(&self) -> Result<VerifyingKey, String> {
        match (&self.pubkey, &self.named_key) {
            (Some(k), _) => Ok(*k),
            (None, Some(named)) => {
                crate::core::reviewers::parse_public_key(named).map_err(|e| e.to_string())
            }
            (None, None) => {
                Err("no gateway public key to check the checkpoint with (pass --pubkey)".into())
            }
        }
    }

    /// A checkpoint entry's note (C2SP) must be signed by the gateway's key
    /// and commit to the root of exactly the entries before it.
    fn check_note(&mut self, text: &str) -> Result<(), String> {
        let n = note::Note::parse(text).map_err(|e| format!("the checkpoint's note: {e}"))?;
        let cp =
            note::Checkpoint::parse(&n.text).map_err(|e| format!("the checkpoint's note: {e}"))?;
        n.verify(&cp.origin, &self.gateway_key()?)
            .map_err(|e| e.to_string())?;
        if cp.size != self.tree.size() || cp.root != self.tree.root() {
            return Err(format!(
                "the checkpoint's note covers {} entries with another root than the {} entries before it",
                cp.size,
                self.tree.size()
            ));
        }
        self.roots.insert(cp.size, cp.root);
        Ok(())
    }

    /// A recorded cosignature: of a checkpoint this log signed, and, for a
    /// witness the verifier knows, valid.
    fn check_cosigned(&mut self, e: &Map<String, Value>) -> Result<(), String> {
        let text = str_field(e, "note").ok_or("a cosignature entry without `note`")?;
        let n = note::Note::parse(text).map_err(|e| format!("the cosigned note: {e}"))?;
        let cp = note::Checkpoint::parse(&n.text).map_err(|e| format!("the cosigned note: {e}"))?;
        if self.roots.get(&cp.size) != Some(&cp.root) {
            return Err(format!(
                "a witness cosigned a checkpoint of size {} that is not one this log signed",
                cp.size
            ));
        }
        for w in &self.witnesses {
            if n.cosigned_by(w).map_err(|e| e.to_string())?.is_some() {
                self.cosignatures += 1;
            }
        }
        Ok(())
    }

    fn check_checkpoint(&mut self, e: &Map<String, Value>) -> Result<(), String> {
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
        let key = self.gateway_key()?;
        let sig = str_field(e, "signature").unwrap_or("");
        let raw = base64::engine::general_purpose::STANDARD
            .decode(sig)
            .map_err(|_| "the checkpoint signature is not base64".to_owned())?;
        let sig = Signature::from_slice(&raw)
            .map_err(|_| "the checkpoint signature is not 64 bytes".to_owned())?;
        key.verify_strict(&checkpoint_bytes(seq, head, time), &sig)
            .map_err(|_| {
                "the checkpoint signature does not verify with the gateway's key".to_owned()
            })?;
        // Checkpoints written before the Merkle tree have no note.
        if let Some(text) = str_field(e, "note") {
            self.check_note(text)?;
        }
        Ok(())
    }

    fn check_statement(&self, d: &Value) -> Result<(), String> {
        let statement: Statement = serde_json::from_value(d["statement"].clone())
            .map_err(|e| format!("an embedded approval statement does not parse: {e}"))?;
        if let Some(proof) = d.get("passkey").filter(|p| !p.is_null()) {
            return self.check_passkey_statement(&statement, proof);
        }
        let sig = d["signature"].as_str().unwrap_or("");
        let embedded =
            crate::core::reviewers::parse_public_key(d["public_key"].as_str().unwrap_or(""))
                .map_err(|e| format!("the embedded reviewer key: {e}"))?;
        if let Some(r) = &self.reviewers {
            // Against the reviewers file: the key that signed must be one
            // of the reviewer's own.
            let reviewer = r.get(&statement.reviewer).ok_or_else(|| {
                format!(
                    "the approval statement is signed by `{}`, who is not in the reviewers file",
                    statement.reviewer
                )
            })?;
            if !reviewer.keys.contains(&embedded) {
                return Err(format!(
                    "the approval statement of reviewer `{}` names a key that is not theirs in the reviewers file",
                    statement.reviewer
                ));
            }
        }
        statement.verify(&embedded, sig).map_err(|e| {
            format!(
                "the approval statement of reviewer `{}` does not verify: {}",
                statement.reviewer, e
            )
        })
    }

    /// A statement signed with a passkey, from the stored fields alone: the
    /// statement's digest must be the assertion's challenge, the origin and
    /// relying party the ones recorded (the relying party the origin's
    /// host), and the signature must verify with the credential's key: the
    /// one in the reviewers file when given (it must be listed for that
    /// reviewer), else the one recorded with the decision.
    fn check_passkey_statement(&self, statement: &Statement, proof: &Value) -> Result<(), String> {
        let who = &statement.reviewer;
        let proof: crate::core::approval::PasskeyProof = serde_json::from_value(proof.clone())
            .map_err(|e| format!("the passkey proof of reviewer `{who}` does not parse: {e}"))?;
        let host = proof
            .origin
            .split_once("://")
            .map(|(_, rest)| rest.split([':', '/']).next().unwrap_or(""))
            .unwrap_or("");
        if host != proof.rp_id {
            return Err(format!(
                "the passkey proof of reviewer `{who}` names relying party `{}` for origin `{}`",
                proof.rp_id, proof.origin
            ));
        }
        let recorded = crate::core::passkey::PasskeyKey {
            id: proof.assertion.credential_id.clone(),
            public_key: proof.credential_public_key.clone(),
            alg: proof.alg,
        };
        let key = match &self.reviewers {
            Some(r) => {
                let reviewer = r.get(who).ok_or_else(|| {
                    format!("the approval statement is signed by `{who}`, who is not in the reviewers file")
                })?;
                reviewer
                    .passkey(&proof.assertion.credential_id)
                    .cloned()
                    .ok_or_else(|| {
                        format!(
                            "the approval statement of reviewer `{who}` is signed with passkey `{}`, which is not theirs in the reviewers file",
                            proof.assertion.credential_id
                        )
                    })?
            }
            None => recorded,
        };
        let digest = statement
            .digest_bytes()
            .map_err(|e| format!("the approval statement of reviewer `{who}`: {e}"))?;
        crate::core::passkey::verify_assertion(
            &key,
            &proof.assertion,
            &crate::core::passkey::Expect {
                challenge: &digest,
                origin: &proof.origin,
                rp_id: &proof.rp_id,
            },
        )
        .map(drop)
        .map_err(|e| format!("the passkey approval of reviewer `{who}` does not verify: {e}"))
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
                    json!(crate::core::reviewers::format_public_key(
                        &key.verifying_key()
                    )),
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

        // A second `tool` in front of the real one: a parser that keeps the
        // last copy hashes the original, one that keeps the first reads
        // `get_balance`. The line is refused, not read either way.
        let mut twice = lines.clone();
        let text = String::from_utf8(twice[2].clone()).unwrap();
        twice[2] = format!("{{\"tool\":\"get_balance\",{}", &text[1..]).into_bytes();
        let b = run(&twice, None).unwrap_err();
        assert_eq!(b.seq, 3);
        assert!(b.reason.contains("duplicate key `tool`"), "{b:?}");

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

    /// A log of three entries whose second is a decision signed with a
    /// passkey, `tamper` applied to its proof before the entry is hashed
    /// (so only the passkey check can catch it); and the reviewers file.
    fn passkey_log(tamper: impl Fn(&mut Map<String, Value>)) -> (Vec<Vec<u8>>, Reviewers) {
        use crate::core::approval::{Statement, Verdict, STATEMENT_TYPE};
        use crate::core::passkey::tests::{Soft, ORIGIN, RP};
        let soft = Soft::es256();
        let statement = Statement {
            kind: STATEMENT_TYPE.into(),
            proposal_id: "p-0000000000000001".into(),
            server: "payments".into(),
            tool: "charge_card".into(),
            call_digest: "sha256:aa".into(),
            requester: "agent-7".into(),
            tenant: "acme".into(),
            resource_version: None,
            tool_definition: None,
            expires_at: "2026-11-30T10:15:00Z".into(),
            policy_set: Some("sha256:bb".into()),
            decision: Verdict::Approve,
            reviewer: "alice".into(),
            reason: String::new(),
            issued_at: "2026-11-30T10:00:00Z".into(),
        };
        let digest = statement.digest_bytes().unwrap();
        let assertion = soft.assert(&digest, ORIGIN, RP, 0x05, 1);
        let mut proof = serde_json::to_value(&assertion).unwrap();
        proof["credential_public_key"] = json!(soft.key.public_key);
        proof["alg"] = json!("ES256");
        proof["origin"] = json!(ORIGIN);
        proof["rp_id"] = json!(RP);
        let mut approval = Map::new();
        approval.insert(
            "statement".into(),
            serde_json::to_value(&statement).unwrap(),
        );
        approval.insert("signature".into(), json!(""));
        approval.insert(
            "public_key".into(),
            json!(format!("passkey:{}", soft.key.id)),
        );
        approval.insert("passkey".into(), proof);
        tamper(&mut approval);
        let reviewers = Reviewers::parse(&format!(
            "[[reviewers]]\nname = \"alice\"\ntenants = [\"acme\"]\npasskeys = [{{ id = \"{}\", public_key = \"{}\", alg = \"ES256\" }}]\n",
            soft.key.id, soft.key.public_key
        ))
        .unwrap();
        let mut prev = String::new();
        let mut lines = Vec::new();
        for seq in 1..=2u64 {
            let mut e = Map::new();
            e.insert("seq".into(), json!(seq));
            e.insert("time".into(), json!("2026-11-30T10:00:00Z"));
            if seq == 1 {
                e.insert("kind".into(), json!(LOG_STARTED));
            } else {
                e.insert("kind".into(), json!("approval_granted"));
                e.insert("approval".into(), Value::Object(approval.clone()));
            }
            e.insert("prev".into(), json!(prev));
            let h = entry_hash(&e);
            e.insert("hash".into(), json!(h));
            prev = h;
            lines.push(serde_json::to_vec(&e).unwrap());
        }
        (lines, reviewers)
    }

    #[test]
    fn a_passkey_approval_verifies_offline_and_a_flipped_byte_names_its_entry() {
        let run_with = |lines: &[Vec<u8>], reviewers: Reviewers| {
            let mut v = Verifier::new(None, Some(reviewers));
            for (i, l) in lines.iter().enumerate() {
                v.feed(l, &format!("line {}", i + 1))?;
            }
            Ok::<_, Break>(v.statements)
        };
        let (lines, reviewers) = passkey_log(|_| {});
        assert_eq!(run_with(&lines, reviewers).unwrap(), 1);
        for field in ["client_data_json", "authenticator_data", "signature"] {
            let (lines, reviewers) = passkey_log(|a| {
                let text = a["passkey"][field].as_str().unwrap().to_owned();
                let mut bytes = crate::core::passkey::b64url().decode(text).unwrap();
                bytes[5] ^= 1;
                a["passkey"][field] = json!(crate::core::passkey::b64url().encode(bytes));
            });
            let b = run_with(&lines, reviewers).unwrap_err();
            assert_eq!(b.seq, 2, "{field}: {b:?}");
            assert!(
                b.reason
                    .contains("passkey approval of reviewer `alice` does not verify"),
                "{field}: {b:?}"
            );
        }
        // A passkey the reviewers file does not list for alice.
        let (lines, _) = passkey_log(|_| {});
        let other = Reviewers::parse("[[reviewers]]\nname = \"alice\"\ntenants = [\"acme\"]\npublic_key = \"ed25519:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\"\n");
        let b = run_with(&lines, other.unwrap()).unwrap_err();
        assert!(b.reason.contains("which is not theirs"), "{b:?}");
    }

    #[test]
    fn redaction_replaces_values_by_their_digest_and_the_digest_stays() {
        let args = json!({"card": {"number": "4111"}, "amount": 5});
        let mut f = Fields::new();
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
        let mut f = Fields::new();
        record_arguments(ArgumentMode::Digest, &[], &args, &mut f);
        assert!(f.get("arguments").is_none() && f.get("arguments_digest").is_some());
    }
}
