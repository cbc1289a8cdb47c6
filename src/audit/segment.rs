//! The files of an audit log directory: numbered segments, and reading
//! the newest entries back (a live tail, recovery at open).

use std::path::{Path, PathBuf};

/// Why the audit log could not be opened, read or written.
#[derive(Debug, thiserror::Error)]
#[error("audit log `{path}`: {message}")]
pub struct AuditError {
    /// The file or dir.
    pub path: PathBuf,
    /// What went wrong and what to do.
    pub message: String,
    /// The error it was made from (the system's, a parser's), kept for the
    /// CLI's "caused by" lines; `None` for a rule of the log's own.
    #[source]
    pub cause: Option<Box<dyn std::error::Error + Send + Sync>>,
}

pub(super) fn io_err(path: &Path) -> impl Fn(std::io::Error) -> AuditError + '_ {
    move |e| AuditError {
        path: path.to_owned(),
        message: e.to_string(),
        cause: Some(Box::new(e)),
    }
}

/// The segment files of `dir`, in order.
pub(crate) fn segments(dir: &Path) -> Result<Vec<PathBuf>, AuditError> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io_err(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "jsonl")
                && p.file_stem()
                    .and_then(|s| s.to_str())
                    .is_some_and(|s| s.len() == 6 && s.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    out.sort();
    Ok(out)
}

pub(super) fn segment_path(dir: &Path, n: u32) -> PathBuf {
    dir.join(format!("{n:06}.jsonl"))
}

/// The entries in the last `bytes` of the log (for a live tail): complete
/// lines of the newest segment, and of the one before when the newest is
/// short.
pub(crate) fn tail(
    dir: &Path,
    bytes: u64,
) -> Result<Vec<serde_json::Map<String, serde_json::Value>>, AuditError> {
    use std::io::{Read, Seek, SeekFrom};
    let segs = segments(dir)?;
    let mut out = Vec::new();
    let mut budget = bytes;
    for seg in segs.iter().rev().take(2) {
        let err = |e: std::io::Error| AuditError {
            path: seg.clone(),
            message: e.to_string(),
            cause: Some(Box::new(e)),
        };
        let mut f = std::fs::File::open(seg).map_err(err)?;
        let len = f.metadata().map_err(err)?.len();
        let from = len.saturating_sub(budget);
        f.seek(SeekFrom::Start(from)).map_err(err)?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf).map_err(err)?;
        let mut lines: Vec<&[u8]> = buf.split(|b| *b == b'\n').collect();
        if from > 0 && !lines.is_empty() {
            lines.remove(0); // a partial first line
        }
        let mut these: Vec<_> = lines
            .into_iter()
            .filter_map(|l| serde_json::from_slice(l).ok())
            .collect();
        these.append(&mut out);
        out = these;
        budget = budget.saturating_sub(len);
        if budget == 0 {
            break;
        }
    }
    Ok(out)
}
