//! `countersign reviewer invite|enrolled`: enrolment links for the review
//! console, and the entries finished enrolments made.
//!
//! An invitation is written into the gateway's data dir (`review/invites/`,
//! named by its token's SHA-256: the token is in the link only), and on a
//! PostgreSQL store into the store too, so that every gateway sharing it
//! serves the link at once. Nothing an enrolment makes is trusted until its
//! entry is in `reviewers.toml`.

use crate::cli::out::outln;
use anyhow::Context as _;
use std::path::Path;
use std::process::ExitCode;

use crate::cli::args::ReviewerCommand;

/// Run a `reviewer` command.
pub(crate) async fn command(command: ReviewerCommand, config: &Path) -> anyhow::Result<ExitCode> {
    let cfg = crate::cli::files::load_config(config)?;
    let dir = cfg.gateway.data_dir.join("review");
    match command {
        ReviewerCommand::Invite {
            name,
            groups,
            tenants,
            ttl,
        } => {
            crate::core::reviewers::check_reviewer_name(&name)?;
            let groups: Vec<String> = groups.into_iter().filter(|g| !g.is_empty()).collect();
            let tenants: Vec<String> = tenants.into_iter().filter(|t| !t.is_empty()).collect();
            let ttl = ttl.unwrap_or(cfg.review.invite_ttl);
            let now = crate::core::time::now_ms();
            let (token, invite) = crate::front::review::invite::write_invite(
                &dir, &name, &groups, &tenants, ttl, now,
            )
            .map_err(|e| {
                anyhow::anyhow!("cannot write the invitation under `{}`: {e}", dir.display())
            })?;
            // Gateways sharing a database serve the link through any of
            // them from now on.
            if let Some(store) = crate::cli::store::shared(&cfg).await? {
                use crate::store::console::ConsoleState;
                let hash = crate::front::review::invite::hash_of(&token);
                store
                    .console_put(
                        crate::front::review::invite::Invite::key(&hash),
                        invite.text(),
                        invite.kept_until(),
                    )
                    .await
                    .map_err(|e| {
                        anyhow::anyhow!("cannot record the invitation in the store: {e}")
                    })?;
            }
            // The link: at the console's origin when the config names it;
            // else the path, for the gateway's address.
            let origin = match crate::core::config::console_of(
                &cfg,
                cfg.gateway.listen,
                cfg.gateway.tls_cert.is_some(),
            ) {
                Ok((origin, _))
                    if cfg.gateway.listen.port() != 0
                        || cfg.review.origin.is_some()
                        || cfg.gateway.public_url.is_some() =>
                {
                    origin
                }
                _ => String::new(),
            };
            if !cfg.review.enabled {
                eprintln!("countersign: note: [review] enabled is not set in {}: the gateway serves the link once it is", config.display());
            }
            eprintln!(
                "countersign: an enrolment link for reviewer `{name}`, good once, until {} (the link is the secret: send it to {name} alone):",
                crate::core::time::rfc3339(now.saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)))
            );
            outln!("{origin}/review/enrol/{token}");
            Ok(ExitCode::SUCCESS)
        }
        ReviewerCommand::Enrolled { append } => {
            let folder = crate::front::review::invite::enrolled_dir(&dir);
            let mut files: Vec<_> = match std::fs::read_dir(&folder) {
                Ok(entries) => entries
                    .filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                    .collect(),
                Err(_) => Vec::new(),
            };
            files.sort();
            if files.is_empty() {
                eprintln!(
                    "countersign: no finished enrolments under `{}`",
                    folder.display()
                );
                return Ok(ExitCode::SUCCESS);
            }
            if let Some(target) = append {
                let mut text = match std::fs::read_to_string(&target) {
                    Ok(t) => t,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                    Err(e) => anyhow::bail!("cannot read {}: {e}", target.display()),
                };
                let mut said = Vec::new();
                for f in &files {
                    let entry = std::fs::read_to_string(f)?;
                    let (next, merged) =
                        crate::cli::enrolled::merge(&text, &entry).map_err(|e| {
                            anyhow::anyhow!("{} into {}: {e}", f.display(), target.display())
                        })?;
                    text = next;
                    said.push(merged);
                }
                // Whole or not at all: the gateway reloads the file when it
                // changes, and must never read half of it.
                let tmp = target.with_extension("toml.new");
                std::fs::write(&tmp, &text)
                    .and_then(|()| std::fs::rename(&tmp, &target))
                    .with_context(|| format!("cannot write {}", target.display()))?;
                for m in said {
                    eprintln!("countersign: {m}");
                }
                eprintln!("countersign: wrote {}", target.display());
                return Ok(ExitCode::SUCCESS);
            }
            eprintln!("countersign: add these entries to reviewers.toml (a reviewer listed already gets the `passkeys` line added to their entry; `--append FILE` does it):");
            for f in files {
                let text = std::fs::read_to_string(&f)?;
                outln!("{}", text.trim_end());
                outln!();
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
