//! Proofs over an audit dir, for `countersign audit prove`, the read-only
//! endpoints and `audit export --with-proofs`: the latest signed checkpoint,
//! inclusion proofs of entries and consistency proofs between sizes, read
//! from `tree.hashes` (O(log n) stored hashes each).
//!
//! A proof is JSON: hashes are standard base64, as in the checkpoint note,
//! and sizes and indexes are counts of entries (leaf index = seq - 1).

use std::path::Path;

use base64::Engine;
use serde::Serialize;

use super::merkle;
use super::note::{Checkpoint, Note};
use super::segment::AuditError;
use super::tree::TreeReader;
use super::CHECKPOINT_FILE;

fn b64(h: &merkle::Hash) -> String {
    base64::engine::general_purpose::STANDARD.encode(h)
}

/// The latest signed checkpoint of the log in `dir`: its note (with any
/// cosignatures) and what it says.
pub(crate) fn latest(dir: &Path) -> Result<(String, Checkpoint), AuditError> {
    let path = dir.join(CHECKPOINT_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| AuditError {
        path: path.clone(),
        message: format!("{e} (the gateway writes it at its first checkpoint: audit.checkpoint_every entries, audit.checkpoint_interval, or a clean stop)"),
        cause: Some(Box::new(e)),
    })?;
    let bad = |why: String| AuditError {
        path: path.clone(),
        message: why,
        cause: None,
    };
    let note = Note::parse(&text).map_err(|e| bad(e.to_string()))?;
    let cp = Checkpoint::parse(&note.text).map_err(|e| bad(e.to_string()))?;
    Ok((text, cp))
}

/// An inclusion proof.
#[derive(Debug, Serialize)]
pub(crate) struct Inclusion {
    /// The entry's seq.
    pub seq: u64,
    /// Its leaf index (seq - 1).
    pub leaf_index: u64,
    /// The tree size the proof is for.
    pub tree_size: u64,
    /// The leaf hash (SHA-256 of 0x00 and the entry's hash).
    pub leaf_hash: String,
    /// The proof, leaf to root.
    pub hashes: Vec<String>,
    /// The signed checkpoint of that size, when the size is the latest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
}

/// A consistency proof.
#[derive(Debug, Serialize)]
pub(crate) struct Consistency {
    /// The older size.
    pub old_size: u64,
    /// The newer size.
    pub tree_size: u64,
    /// The root at the older size.
    pub old_root: String,
    /// The proof (RFC 6962 section 2.1.2).
    pub hashes: Vec<String>,
    /// The signed checkpoint of the newer size, when it is the latest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
}

/// Why a proof cannot be given.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProveError {
    /// The log's files.
    #[error(transparent)]
    Audit(#[from] AuditError),
    /// Outside the tree.
    #[error("{0}")]
    Range(String),
}

fn size_or_latest(dir: &Path, size: Option<u64>) -> Result<(u64, Option<String>), ProveError> {
    let (note, cp) = latest(dir)?;
    Ok(match size {
        None => (cp.size, Some(note)),
        Some(s) if s == cp.size => (s, Some(note)),
        Some(s) => (s, None),
    })
}

fn reader(dir: &Path, size: u64) -> Result<TreeReader, ProveError> {
    let r = TreeReader::open(dir)?;
    if size > r.size {
        return Err(ProveError::Range(format!(
            "the tree holds {} entries, not {size}",
            r.size
        )));
    }
    Ok(r)
}

fn io(dir: &Path) -> impl Fn(std::io::Error) -> ProveError + '_ {
    move |e| {
        ProveError::Audit(AuditError {
            path: dir.join(super::tree::TREE_FILE),
            message: e.to_string(),
            cause: Some(Box::new(e)),
        })
    }
}

/// The inclusion proof of entry `seq` in the tree of `size` entries
/// (default: the latest checkpoint's).
pub(crate) fn inclusion(dir: &Path, seq: u64, size: Option<u64>) -> Result<Inclusion, ProveError> {
    let (size, checkpoint) = size_or_latest(dir, size)?;
    if seq == 0 || seq > size {
        return Err(ProveError::Range(format!(
            "entry {seq} is not in a tree of {size} entries (seq counts from 1{})",
            if checkpoint.is_some() {
                "; the latest checkpoint covers no more: wait for the next one"
            } else {
                ""
            }
        )));
    }
    let r = reader(dir, size)?;
    let index = seq - 1;
    let leaf = r.stored_leaf(index).map_err(io(dir))?;
    let hashes = merkle::inclusion(&r, index, size).map_err(io(dir))?;
    Ok(Inclusion {
        seq,
        leaf_index: index,
        tree_size: size,
        leaf_hash: b64(&leaf),
        hashes: hashes.iter().map(b64).collect(),
        checkpoint,
    })
}

/// The consistency proof from `old` entries to `size` (default: the latest
/// checkpoint's).
pub(crate) fn consistency(
    dir: &Path,
    old: u64,
    size: Option<u64>,
) -> Result<Consistency, ProveError> {
    let (size, checkpoint) = size_or_latest(dir, size)?;
    if old > size {
        return Err(ProveError::Range(format!(
            "old size {old} is beyond the tree size {size}"
        )));
    }
    let r = reader(dir, size)?;
    let old_root = merkle::root(&r, old).map_err(io(dir))?;
    let hashes = merkle::consistency(&r, old, size).map_err(io(dir))?;
    Ok(Consistency {
        old_size: old,
        tree_size: size,
        old_root: b64(&old_root),
        hashes: hashes.iter().map(b64).collect(),
        checkpoint,
    })
}

impl TreeReader {
    /// The leaf hash of leaf `index`.
    pub fn stored_leaf(&self, index: u64) -> std::io::Result<merkle::Hash> {
        use merkle::Stored;
        self.stored(merkle::stored_index(0, index))
    }
}
