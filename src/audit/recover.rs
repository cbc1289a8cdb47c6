//! Opening a log where the last run left it: the tail of the chain (a torn
//! final line cut off), the last checkpoint this gateway signed, and the
//! proof that the tree still extends it.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader};
use std::path::Path;

use ed25519_dalek::SigningKey;
use serde_json::{Map, Value};

use super::merkle::Hash;
use super::note::{Checkpoint, Note};
use super::segment::{io_err, segments, AuditError};
use super::tree::TreeWriter;
use super::{hash_bytes, CHECKPOINT, CHECKPOINT_FILE};

/// Where the chain stands when the log is opened.
pub(super) struct Tail {
    pub(super) segment: u32,
    pub(super) seq: u64,
    pub(super) head: String,
    /// Bytes of a torn final line cut off.
    pub(super) cut: u64,
    /// The last entry was a clean-shutdown checkpoint.
    pub(super) clean: bool,
}

/// Write the latest signed note, durably and atomically: a reader never
/// sees half, and a power cut leaves this note or the one before, whole.
pub(super) fn write_latest(dir: &Path, note: &str) -> std::io::Result<()> {
    crate::store::durable::write(&dir.join(CHECKPOINT_FILE), note)
}

/// The last checkpoint this gateway signed: the later of its checkpoint
/// file's and the last one in the log itself (each must carry the
/// gateway's own signature). The file alone is not trusted to exist: one
/// written by an older release without an fsync may be empty after a power
/// cut, and the log's own checkpoint entries are fsynced with it. Nor is the
/// log alone: a log cut short after a checkpoint would hide it, and the
/// file keeps the promise.
pub(super) fn latest_signed(
    dir: &Path,
    key: &SigningKey,
) -> Result<Option<Checkpoint>, AuditError> {
    let file = from_file(dir, key)?;
    let logged = last_logged(dir, key)?;
    Ok(match (file, logged) {
        (Some(f), Some(l)) if l.size > f.size => Some(l),
        (Some(f), _) => Some(f),
        (None, l) => l,
    })
}

/// The last checkpoint entry of the log, its note verified: the last
/// segment that holds one is read.
fn last_logged(dir: &Path, key: &SigningKey) -> Result<Option<Checkpoint>, AuditError> {
    for seg in segments(dir)?.iter().rev() {
        let f = File::open(seg).map_err(io_err(seg))?;
        let mut last: Option<Vec<u8>> = None;
        for line in BufReader::new(f).split(b'\n') {
            let line = line.map_err(io_err(seg))?;
            // Most lines are not checkpoints: look before parsing.
            if line.windows(22).any(|w| w == b"\"kind\":\"checkpoint\"") {
                last = Some(line);
            }
        }
        let Some(line) = last else { continue };
        let Ok(entry) = serde_json::from_slice::<Map<String, Value>>(&line) else {
            continue;
        };
        let Some(text) = entry.get("note").and_then(Value::as_str) else {
            continue;
        };
        let (n, cp) = Note::parse(text)
            .and_then(|n| Checkpoint::parse(&n.text).map(|cp| (n, cp)))
            .map_err(|e| AuditError {
                path: seg.clone(),
                message: format!("the log's last checkpoint entry does not parse: {e}"),
                cause: Some(Box::new(e)),
            })?;
        n.verify(&cp.origin, &key.verifying_key())
            .map_err(|e| AuditError {
                path: seg.clone(),
                message: format!("{e}: the log's last checkpoint is not this gateway's"),
                cause: Some(Box::new(e)),
            })?;
        return Ok(Some(cp));
    }
    Ok(None)
}

/// The checkpoint file's note, when it reads well.
fn from_file(dir: &Path, key: &SigningKey) -> Result<Option<Checkpoint>, AuditError> {
    let path = dir.join(CHECKPOINT_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(&path)(e)),
    };
    // The file is a copy (each note is also in its checkpoint entry): one a
    // power cut left unreadable (an older release did not fsync it) stands
    // for nothing, and the log's entry is used. One that reads well and
    // carries another key's signature was put there.
    let parsed = Note::parse(&text).and_then(|n| Checkpoint::parse(&n.text).map(|cp| (n, cp)));
    let Ok((n, cp)) = parsed else {
        tracing::warn!(path = %path.display(), "the latest checkpoint file is unreadable (a crash?); the next checkpoint replaces it");
        return Ok(None);
    };
    n.verify(&cp.origin, &key.verifying_key())
        .map_err(|e| AuditError {
            path: path.clone(),
            message: format!("{e}: not this gateway's checkpoint"),
            cause: Some(Box::new(e)),
        })?;
    Ok(Some(cp))
}

/// The log, as it is now, must hold what checkpoint `cp` covered: at least
/// its entries, with its root. Otherwise it was truncated or rewritten
/// after the gateway signed; the gateway does not sign over that.
pub(super) fn check_extends(
    tree: &TreeWriter,
    cp: &Checkpoint,
    dir: &Path,
) -> Result<(), AuditError> {
    let refuse = |why: String| {
        AuditError {
        path: dir.to_owned(),
        message: format!(
            "{why}: the log no longer holds what this gateway signed. Keep this directory as evidence, \
             check it with `countersign audit verify --checkpoint {}/{CHECKPOINT_FILE}`, and start with a new audit.dir",
            dir.display()
        ),
        cause: None,
    }
    };
    if tree.size() < cp.size {
        return Err(refuse(format!(
            "the log has {} entries and checkpoint {} covered {}",
            tree.size(),
            cp.size,
            cp.size
        )));
    }
    let reader = tree.reader().map_err(io_err(dir))?;
    let root = super::merkle::root(&reader, cp.size).map_err(io_err(dir))?;
    if root != cp.root {
        return Err(refuse(format!(
            "the first {} entries no longer hash to the root checkpoint {} signed",
            cp.size, cp.size
        )));
    }
    Ok(())
}

/// The entry hashes of seq `from` on, read from the log's segments: the
/// segment holding `from` is found by the first seq of each, so only the
/// tail is read.
pub(super) fn tail_hashes(dir: &Path, from: u64) -> Result<Vec<Hash>, AuditError> {
    #[derive(serde::Deserialize)]
    struct Head<'a> {
        seq: u64,
        #[serde(borrow)]
        hash: std::borrow::Cow<'a, str>,
    }
    let segs = segments(dir)?;
    let mut start = 0;
    for (i, seg) in segs.iter().enumerate() {
        let f = File::open(seg).map_err(io_err(seg))?;
        let mut first = Vec::new();
        BufReader::new(f)
            .read_until(b'\n', &mut first)
            .map_err(io_err(seg))?;
        match serde_json::from_slice::<Head<'_>>(&first) {
            Ok(h) if h.seq <= from => start = i,
            _ => break,
        }
    }
    let mut out = Vec::new();
    for seg in &segs[start.min(segs.len())..] {
        let f = File::open(seg).map_err(io_err(seg))?;
        for line in BufReader::new(f).split(b'\n') {
            let line = line.map_err(io_err(seg))?;
            let Ok(h) = serde_json::from_slice::<Head<'_>>(&line) else {
                continue;
            };
            if h.seq >= from {
                let hash = hash_bytes(&h.hash).ok_or_else(|| AuditError {
                    path: seg.clone(),
                    message: format!("entry {} has no usable `hash`", h.seq),
                    cause: None,
                })?;
                out.push(hash);
            }
        }
    }
    Ok(out)
}

/// Find the end of the chain; cut a torn final line of the last segment.
pub(super) fn recover(dir: &Path) -> Result<Tail, AuditError> {
    let segs = segments(dir)?;
    let Some(last) = segs.last() else {
        return Ok(Tail {
            segment: 1,
            seq: 0,
            head: String::new(),
            cut: 0,
            clean: true,
        });
    };
    let number: u32 = last
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(last)
        .map_err(io_err(last))?;
    let len = f.metadata().map_err(io_err(last))?.len();
    let mut reader = BufReader::new(&mut f);
    let (mut good_end, mut pos) = (0u64, 0u64);
    let mut last_entry: Option<Map<String, Value>> = None;
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).map_err(io_err(last))?;
        if n == 0 {
            break;
        }
        pos += n as u64;
        let complete = line.ends_with(b"\n");
        match serde_json::from_slice::<Map<String, Value>>(&line) {
            Ok(e) if complete => {
                good_end = pos;
                last_entry = Some(e);
            }
            // A torn or garbled line: everything from here is cut.
            _ => break,
        }
    }
    drop(reader);
    let cut = len - good_end;
    if cut > 0 {
        f.set_len(good_end).map_err(io_err(last))?;
        f.sync_all().map_err(io_err(last))?;
    }
    // An empty last segment: the chain ends in the one before.
    if last_entry.is_none() && segs.len() > 1 {
        let mut t = recover_from(&segs[segs.len() - 2])?;
        t.segment = number;
        t.cut = cut;
        return Ok(t);
    }
    Ok(tail_of(last_entry, number, cut))
}

pub(super) fn recover_from(seg: &Path) -> Result<Tail, AuditError> {
    let f = File::open(seg).map_err(io_err(seg))?;
    let mut last = None;
    for line in BufReader::new(f).split(b'\n') {
        let line = line.map_err(io_err(seg))?;
        if let Ok(e) = serde_json::from_slice::<Map<String, Value>>(&line) {
            last = Some(e);
        }
    }
    Ok(tail_of(last, 1, 0))
}

pub(super) fn tail_of(last: Option<Map<String, Value>>, segment: u32, cut: u64) -> Tail {
    match last {
        Some(e) => Tail {
            segment,
            seq: e.get("seq").and_then(Value::as_u64).unwrap_or(0),
            head: e
                .get("hash")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            cut,
            clean: e.get("kind").and_then(Value::as_str) == Some(CHECKPOINT)
                && e.get("reason").and_then(Value::as_str) == Some("shutdown"),
        },
        None => Tail {
            segment,
            seq: 0,
            head: String::new(),
            cut,
            clean: true,
        },
    }
}
