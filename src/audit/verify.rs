//! `countersign audit verify`: read every segment in order, line by line
//! (constant memory), through the [`Verifier`].

use std::io::{BufRead, BufReader};
use std::path::Path;

use base64::Engine;
use ed25519_dalek::VerifyingKey;

use super::segment::{segments, AuditError};
use super::{Break, Verifier};
use crate::core::reviewers::Reviewers;

/// What a verification found.
#[derive(Debug, Default)]
pub struct Report {
    /// Segment files read.
    pub segments: usize,
    /// Entries whose chain link and hash checked out.
    pub entries: u64,
    /// Checkpoints whose signature verified.
    pub checkpoints: u64,
    /// Embedded reviewer statements whose signature verified.
    pub statements: u64,
    /// The last checkpoint's sequence number.
    pub last_checkpoint: Option<u64>,
    /// The log ends with a clean-shutdown checkpoint.
    pub ended_clean: bool,
    /// Bytes of a partial final line (a write torn by a crash).
    pub torn_bytes: u64,
    /// The first break, if any.
    pub brk: Option<Break>,
    /// Where the gateway key came from.
    pub key_source: String,
    /// A gateway was writing the log while it was read.
    pub running: bool,
    /// What became of each checkpoint held elsewhere.
    pub held: Vec<String>,
    /// Witness cosignatures that verified.
    pub cosignatures: u64,
    /// The tree's size and root at the end.
    pub tree: (u64, String),
}

/// What a verification checks besides the log itself.
#[derive(Debug, Default)]
pub struct Also {
    /// Checkpoint notes held elsewhere: (label, text).
    pub checkpoints: Vec<(String, String)>,
    /// Witnesses whose cosignatures the log records.
    pub witnesses: Vec<super::note::Vkey>,
}

impl Report {
    /// Entries after the last checkpoint (not covered by a signature).
    pub fn unsigned_tail(&self) -> u64 {
        self.entries - self.last_checkpoint.unwrap_or(0)
    }

    /// The summary printed by `audit verify`.
    pub fn render(&self) -> String {
        let mut out = format!(
            "{} entries in {} segments; {} checkpoints and {} reviewer statements verified; gateway key: {}\n",
            self.entries, self.segments, self.checkpoints, self.statements, self.key_source
        );
        out.push_str(&format!(
            "merkle tree: {} entries, root {}{}\n",
            self.tree.0,
            self.tree.1,
            if self.cosignatures > 0 {
                format!("; {} witness cosignatures verified", self.cosignatures)
            } else {
                String::new()
            }
        ));
        for h in &self.held {
            out.push_str(h);
            out.push('\n');
        }
        if let Some(b) = &self.brk {
            out.push_str(&format!(
                "BROKEN at seq {} ({}): {}\n",
                b.seq, b.place, b.reason
            ));
            return out;
        }
        let tail = self.unsigned_tail();
        if self.running {
            // Not truncation: the writer signs the tail at its next
            // checkpoint, and an entry it is writing now may be partial.
            out.push_str(&format!(
                "live: a gateway is writing this log; the {tail} entries after its last checkpoint (seq {}) \
                 are signed at the next checkpoint (audit.checkpoint_every, audit.checkpoint_interval) or at \
                 shutdown\n",
                self.last_checkpoint.unwrap_or(0)
            ));
        } else if self.torn_bytes > 0 || !self.ended_clean {
            out.push_str(&format!(
                "truncation: the log ends {tail} entries after its last checkpoint (seq {}) without a \
                 clean-shutdown checkpoint{}: the gateway stopped abruptly; a crash loses at most this \
                 unsigned tail, so this is not corruption\n",
                self.last_checkpoint.unwrap_or(0),
                if self.torn_bytes > 0 {
                    format!(
                        ", and a partial final line of {} bytes was ignored",
                        self.torn_bytes
                    )
                } else {
                    String::new()
                }
            ));
        }
        out.push_str(if self.ended_clean {
            "ok: the chain is intact and ends with a clean-shutdown checkpoint\n"
        } else {
            "ok: the chain is intact\n"
        });
        out
    }
}

/// Where a line of a log is: its segment file and line number. Worded
/// only when it is needed (a break, an export), not for every line.
#[derive(Debug, Clone, Copy)]
pub struct Place<'a> {
    /// The segment's file name.
    pub segment: &'a str,
    /// The line, from 1.
    pub line: usize,
}

impl std::fmt::Display for Place<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.segment, self.line)
    }
}

/// Call `f` with each complete line of the log, in order, with its place.
/// A partial final line (no newline at the end of the last segment) is
/// returned as torn bytes; a partial line anywhere else is an error.
pub fn each_line(
    dir: &Path,
    mut f: impl FnMut(&[u8], &Place<'_>) -> bool,
) -> Result<(usize, u64), AuditError> {
    let segs = segments(dir)?;
    let n = segs.len();
    for (i, seg) in segs.iter().enumerate() {
        let file = std::fs::File::open(seg).map_err(|e| AuditError {
            path: seg.clone(),
            message: e.to_string(),
            cause: Some(Box::new(e)),
        })?;
        let mut reader = BufReader::with_capacity(1 << 16, file);
        let mut line = Vec::with_capacity(512);
        let mut number = 0usize;
        let name = seg
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        loop {
            line.clear();
            let got = reader
                .read_until(b'\n', &mut line)
                .map_err(|e| AuditError {
                    path: seg.clone(),
                    message: e.to_string(),
                    cause: Some(Box::new(e)),
                })?;
            if got == 0 {
                break;
            }
            number += 1;
            let place = Place {
                segment: &name,
                line: number,
            };
            if line.last() != Some(&b'\n') {
                if i + 1 == n {
                    return Ok((n, got as u64));
                }
                // A torn line in an older segment: hand it over as is, the
                // verifier reports it.
                if !f(&line, &place) {
                    return Ok((n, 0));
                }
                continue;
            }
            if !f(&line[..line.len() - 1], &place) {
                return Ok((n, 0));
            }
        }
    }
    Ok((n, 0))
}

/// Verify the log in `dir`.
pub fn verify_dir(
    dir: &Path,
    pubkey: Option<VerifyingKey>,
    reviewers: Option<Reviewers>,
) -> Result<Report, AuditError> {
    verify_dir_with(dir, pubkey, reviewers, Also::default())
}

/// Verify the log in `dir`, and against checkpoints held elsewhere and the
/// cosignatures of known witnesses.
pub fn verify_dir_with(
    dir: &Path,
    pubkey: Option<VerifyingKey>,
    reviewers: Option<Reviewers>,
    also: Also,
) -> Result<Report, AuditError> {
    let key_source = if pubkey.is_some() {
        "pinned (--pubkey)".to_owned()
    } else {
        "as named by the log itself (pass --pubkey to pin it)".to_owned()
    };
    let running = super::log::writer_running(dir);
    let mut v = Verifier::new(pubkey, reviewers);
    let mut brk = None;
    for (label, text) in &also.checkpoints {
        if let Err(reason) = v.hold(label, text) {
            brk = Some(Break {
                seq: 0,
                place: label.clone(),
                reason,
            });
        }
    }
    for w in also.witnesses {
        v.witness(w);
    }
    let (segments, torn_bytes) = if brk.is_some() {
        (0, 0)
    } else {
        each_line(dir, |line, place| match v.feed(line, place) {
            Ok(()) => true,
            Err(b) => {
                brk = Some(b);
                false
            }
        })?
    };
    if brk.is_none() {
        if let Err(reason) = v.finish() {
            brk = Some(Break {
                seq: v.entries + 1,
                place: "end of the log".into(),
                reason,
            });
        }
    }
    Ok(Report {
        segments,
        entries: v.entries,
        checkpoints: v.checkpoints,
        statements: v.statements,
        last_checkpoint: v.last_checkpoint,
        ended_clean: v.ended_clean,
        torn_bytes,
        brk,
        key_source,
        running,
        held: std::mem::take(&mut v.held_results),
        cosignatures: v.cosignatures,
        tree: (
            v.entries,
            base64::engine::general_purpose::STANDARD.encode(v.root()),
        ),
    })
}
