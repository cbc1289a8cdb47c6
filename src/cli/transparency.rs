//! The transparency commands of `countersign audit`: proofs, the
//! checkpoints' verifier key, and exports whose entries can each be checked
//! against a checkpoint without the rest of the log.

use crate::cli::args::AuditCommand;
use crate::cli::out::{out, outln};
use std::io::{BufRead, Write};
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use base64::Engine;
use serde_json::{json, Value};

use crate::audit::merkle::{self, Hash};
use crate::audit::note::{self, Checkpoint, Note};
use crate::audit::{proofs, tree::TreeReader, verify};

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// `audit prove SEQ` and `audit prove --consistency OLD`.
pub(crate) fn prove(
    dir: &Path,
    seq: Option<u64>,
    old: Option<u64>,
    size: Option<u64>,
) -> anyhow::Result<ExitCode> {
    let out = match (seq, old) {
        (_, Some(old)) => serde_json::to_value(proofs::consistency(dir, old, size)?)?,
        (Some(seq), None) => serde_json::to_value(proofs::inclusion(dir, seq, size)?)?,
        (None, None) => anyhow::bail!("give an entry's SEQ, or --consistency OLD_SIZE"),
    };
    outln!("{}", serde_json::to_string_pretty(&out)?);
    Ok(ExitCode::SUCCESS)
}

/// The gateway's signing key, read from its key file in the audit dir.
fn gateway_key(dir: &Path) -> anyhow::Result<ed25519_dalek::SigningKey> {
    let path = dir.join(crate::audit::log::KEY_FILE);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read `{}`: the gateway makes it on its first start (is --dir the audit dir?)",
            path.display()
        )
    })?;
    crate::core::reviewers::KeyFile::parse(&text)
        .and_then(|k| k.signing_key())
        .with_context(|| format!("`{}`", path.display()))
}

/// `audit pubkey --vkey`: the checkpoints' verifier key.
pub(crate) fn vkey(dir: &Path) -> anyhow::Result<String> {
    let (_, cp) = proofs::latest(dir)?;
    Ok(note::vkey(&cp.origin, &gateway_key(dir)?.verifying_key()))
}

/// `audit export --with-proofs`: the latest checkpoint, then each entry it
/// covers with its inclusion proof against it.
pub(crate) fn export_with_proofs(dir: &Path, out: Option<&Path>) -> anyhow::Result<ExitCode> {
    let (text, cp) = proofs::latest(dir)?;
    let tree = TreeReader::open(dir)?;
    anyhow::ensure!(
        tree.size >= cp.size,
        "the tree holds {} entries and the checkpoint covers {}: start the gateway once to bring it level",
        tree.size,
        cp.size
    );
    let mut sink: Box<dyn Write> = match out {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("cannot create `{}`", p.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout())),
    };
    // A closed standard output ends the command quietly; a file that
    // cannot be written is named.
    let fail = |e: std::io::Error| match out {
        None => crate::cli::out::written(e),
        Some(p) => anyhow::Error::new(e).context(format!("cannot write `{}`", p.display())),
    };
    writeln!(sink, "{}", json!({ "checkpoint": text })).map_err(fail)?;
    let mut failed: Option<anyhow::Error> = None;
    let mut n = 0u64;
    verify::each_line(dir, |line, place| {
        let seq = serde_json::from_slice::<Value>(line)
            .ok()
            .and_then(|v| v.get("seq").and_then(Value::as_u64));
        let Some(seq) = seq else {
            failed = Some(anyhow::anyhow!("{place}: not an entry with a seq"));
            return false;
        };
        if seq > cp.size {
            return false;
        }
        let proof = match merkle::inclusion(&tree, seq - 1, cp.size) {
            Ok(p) => p,
            Err(e) => {
                failed = Some(e.into());
                return false;
            }
        };
        let inclusion = json!({
            "leaf_index": seq - 1,
            "tree_size": cp.size,
            "hashes": proof.iter().map(|h| b64().encode(h)).collect::<Vec<_>>(),
        });
        // The entry's own bytes, unchanged: its hash is over them.
        let written = sink
            .write_all(b"{\"entry\":")
            .and_then(|()| sink.write_all(line))
            .and_then(|()| writeln!(sink, ",\"inclusion\":{inclusion}}}"));
        if let Err(e) = written {
            failed = Some(fail(e));
            return false;
        }
        n += 1;
        true
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    sink.flush().map_err(fail)?;
    eprintln!(
        "countersign: exported {n} entries with inclusion proofs against checkpoint {}",
        cp.size
    );
    Ok(ExitCode::SUCCESS)
}

/// The key to check a checkpoint with: a vkey, or the gateway's public key
/// (then the note's origin is the key name).
fn checkpoint_key(text: &str) -> anyhow::Result<(Option<String>, ed25519_dalek::VerifyingKey)> {
    let text = if text.starts_with(crate::core::reviewers::PUBLIC_PREFIX) || text.contains('+') {
        text.to_owned()
    } else {
        std::fs::read_to_string(text)
            .with_context(|| format!("cannot read --pubkey file `{text}`"))?
    };
    let text = text.trim();
    if text.starts_with(crate::core::reviewers::PUBLIC_PREFIX) {
        let key = crate::core::reviewers::parse_public_key(text).context("--pubkey")?;
        return Ok((None, key));
    }
    let v = note::parse_vkey(text).context("--pubkey")?;
    Ok((Some(v.name), v.key))
}

/// `audit check-export FILE`: each entry of an export with proofs against
/// the checkpoint at its top, on its own.
pub(crate) fn check_export(file: &Path, pubkey: &str) -> anyhow::Result<ExitCode> {
    let (name, key) = checkpoint_key(pubkey)?;
    let input: Box<dyn BufRead> = if file == Path::new("-") {
        Box::new(std::io::BufReader::new(std::io::stdin()))
    } else {
        Box::new(std::io::BufReader::new(
            std::fs::File::open(file)
                .with_context(|| format!("cannot read `{}`", file.display()))?,
        ))
    };
    let mut lines = input.lines();
    let first = lines.next().transpose()?.context("the export is empty")?;
    let head: Value = serde_json::from_str(&first).context("the first line is not JSON")?;
    let text = head
        .get("checkpoint")
        .and_then(Value::as_str)
        .context("the first line holds no `checkpoint`: not an export with proofs")?;
    let n = Note::parse(text).context("the checkpoint")?;
    let cp = Checkpoint::parse(&n.text).context("the checkpoint")?;
    n.verify(name.as_deref().unwrap_or(&cp.origin), &key)
        .context("the checkpoint")?;
    let mut checked = 0u64;
    for (i, line) in lines.enumerate() {
        let line = line?;
        let at = i + 2;
        let problem = |why: String| anyhow::anyhow!("line {at}: {why}");
        #[derive(serde::Deserialize)]
        struct Row<'a> {
            #[serde(borrow)]
            entry: &'a serde_json::value::RawValue,
            inclusion: Inclusion,
        }
        #[derive(serde::Deserialize)]
        struct Inclusion {
            leaf_index: u64,
            tree_size: u64,
            hashes: Vec<String>,
        }
        let row: Row<'_> = serde_json::from_str(&line)
            .map_err(|e| problem(format!("not an entry with a proof ({e})")))?;
        let digest =
            crate::audit::check_entry_line(row.entry.get().as_bytes()).map_err(&problem)?;
        let seq = serde_json::from_str::<Value>(row.entry.get())
            .ok()
            .and_then(|v| v.get("seq").and_then(Value::as_u64));
        if seq != Some(row.inclusion.leaf_index + 1) || row.inclusion.tree_size != cp.size {
            return Err(problem(
                "the proof is for another entry or another checkpoint".into(),
            ));
        }
        let proof = row
            .inclusion
            .hashes
            .iter()
            .map(|h| {
                b64()
                    .decode(h)
                    .ok()
                    .and_then(|b| Hash::try_from(b).ok())
                    .ok_or_else(|| problem("a proof hash is not 32 bytes of base64".into()))
            })
            .collect::<anyhow::Result<Vec<Hash>>>()?;
        merkle::check_inclusion(
            &proof,
            row.inclusion.leaf_index,
            cp.size,
            &merkle::leaf_hash(&digest),
            &cp.root,
        )
        .map_err(|e| problem(format!("entry {}: {e}", row.inclusion.leaf_index + 1)))?;
        checked += 1;
    }
    outln!(
        "ok: {checked} entries, each included in checkpoint {} of {} (signature verified)",
        cp.size,
        cp.origin
    );
    Ok(ExitCode::SUCCESS)
}

fn parse_time(flag: &str, text: Option<String>) -> anyhow::Result<Option<i64>> {
    text.map(|t| {
        crate::core::time::parse_rfc3339(&t).ok_or_else(|| {
            anyhow::anyhow!("{flag} `{t}` is not an RFC 3339 time (like 2026-11-30T10:00:00Z)")
        })
    })
    .transpose()
}

/// The checkpoint the gateway published in the audit dir (`checkpoint`),
/// held as any checkpoint kept elsewhere: a log cut after it (its clean
/// shutdown checkpoint and the entries before it gone) then fails, naming
/// the missing range, instead of reading as a crash. The gateway writes it
/// only after what it covers is on disk, so a crash never leaves it ahead
/// of the log. One that does not read as a signed checkpoint (a power cut
/// under an older release) is said and not used; one removed with the
/// tail is why SECURITY.md asks for a copy elsewhere or a witness.
fn published(dir: &Path) -> Option<(String, String)> {
    let path = dir.join(crate::audit::CHECKPOINT_FILE);
    let text = std::fs::read_to_string(&path).ok()?;
    let reads = crate::audit::note::Note::parse(&text)
        .ok()
        .and_then(|n| crate::audit::note::Checkpoint::parse(&n.text).ok())
        .is_some();
    if !reads {
        eprintln!(
            "countersign: {} does not read as a signed checkpoint: not used",
            path.display()
        );
        return None;
    }
    Some((
        format!("the checkpoint the gateway published ({})", path.display()),
        text,
    ))
}

/// `countersign audit ...`.
pub(crate) fn command(command: AuditCommand) -> anyhow::Result<ExitCode> {
    use crate::audit;
    match command {
        AuditCommand::Checkpoint { dir } => {
            let (note, _) = audit::proofs::latest(&dir)?;
            out!("{note}");
            Ok(ExitCode::SUCCESS)
        }
        AuditCommand::Prove {
            seq,
            consistency,
            size,
            dir,
        } => prove(&dir, seq, consistency, size),
        AuditCommand::CheckExport { file, pubkey } => check_export(&file, &pubkey),
        AuditCommand::Verify {
            dir,
            reviewers,
            pubkey,
            checkpoint,
            witness,
        } => {
            let pubkey = pubkey
                .map(|k| {
                    let text = if k.starts_with(crate::core::reviewers::PUBLIC_PREFIX) {
                        k
                    } else {
                        std::fs::read_to_string(&k)
                            .with_context(|| format!("cannot read --pubkey file `{k}`"))?
                    };
                    crate::core::reviewers::parse_public_key(text.trim()).context("--pubkey")
                })
                .transpose()?;
            let reviewers = reviewers
                .map(|f| {
                    let text = std::fs::read_to_string(&f)
                        .with_context(|| format!("cannot read --reviewers `{}`", f.display()))?;
                    crate::core::reviewers::Reviewers::parse(&text)
                        .map_err(|(_, m)| anyhow::anyhow!("--reviewers `{}`: {m}", f.display()))
                })
                .transpose()?;
            anyhow::ensure!(
                pubkey.is_none() || dir.len() == 1,
                "--pubkey pins one log's key: verify each gateway's log with its own key, one --dir at a time"
            );
            anyhow::ensure!(
                checkpoint.is_empty() || dir.len() == 1,
                "--checkpoint is one log's: verify each gateway's log against its own checkpoints, one --dir at a time"
            );
            let checkpoints = checkpoint
                .iter()
                .map(|f| {
                    std::fs::read_to_string(f)
                        .with_context(|| format!("cannot read --checkpoint `{}`", f.display()))
                        .map(|t| (f.display().to_string(), t))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let witnesses = witness
                .iter()
                .map(|w| audit::note::parse_vkey(w).context("--witness"))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let mut broken = false;
            for d in &dir {
                let mut held = checkpoints.clone();
                held.extend(published(d));
                let also = audit::verify::Also {
                    checkpoints: held,
                    witnesses: witnesses.clone(),
                };
                let report = audit::verify::verify_dir_with(d, pubkey, reviewers.clone(), also)?;
                if dir.len() > 1 {
                    outln!("{}:", d.display());
                }
                out!("{}", report.render());
                broken |= report.brk.is_some();
            }
            Ok(if broken {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        AuditCommand::Export {
            dir,
            format,
            since,
            until,
            out,
            follow,
            with_proofs,
        } => {
            if with_proofs {
                anyhow::ensure!(
                    dir.len() == 1 && format == crate::audit::export::Format::Jsonl,
                    "--with-proofs exports one log (one --dir) as JSON Lines"
                );
                return export_with_proofs(&dir[0], out.as_deref());
            }
            let since = parse_time("--since", since)?;
            let until = parse_time("--until", until)?;
            anyhow::ensure!(
                !follow || dir.len() == 1,
                "--follow streams one log: give one --dir (run one export per gateway)"
            );
            let mut sink: Box<dyn std::io::Write> = match out {
                Some(path) => Box::new(std::io::BufWriter::new(
                    std::fs::File::create(&path)
                        .with_context(|| format!("cannot create `{}`", path.display()))?,
                )),
                None => Box::new(std::io::BufWriter::new(std::io::stdout())),
            };
            let result = if follow {
                // Runs until Ctrl-C ends the process (every entry is flushed
                // as it is written) or the reader goes away.
                let never = std::sync::atomic::AtomicBool::new(false);
                audit::export::follow(&dir[0], format, since, &mut *sink, &never)
            } else {
                audit::export::export(&dir, format, since, until, &mut *sink)
            };
            match result {
                Ok(n) => {
                    eprintln!("countersign: exported {n} entries");
                    Ok(ExitCode::SUCCESS)
                }
                // `| head` closed the pipe: the reader has what it wanted.
                Err(e) if e.is_closed_output() => Ok(ExitCode::SUCCESS),
                Err(e) => Err(e.into()),
            }
        }
        AuditCommand::Pubkey { dir, vkey: true } => {
            outln!("{}", vkey(&dir)?);
            Ok(ExitCode::SUCCESS)
        }
        AuditCommand::Pubkey { dir, vkey: false } => {
            let path = dir.join(audit::log::KEY_FILE);
            let text = std::fs::read_to_string(&path).with_context(|| {
                format!(
                    "cannot read `{}`: the gateway makes it on its first start (is --dir the audit dir?)",
                    path.display()
                )
            })?;
            let key = crate::core::reviewers::KeyFile::parse(&text)
                .and_then(|k| k.signing_key())
                .with_context(|| format!("`{}`", path.display()))?;
            outln!(
                "{}",
                crate::core::reviewers::format_public_key(&key.verifying_key())
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
