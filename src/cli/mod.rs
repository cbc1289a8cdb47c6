//! The `countersign` command: argument parsing, the commands, printing.
//! `main.rs` only calls [`main`].
//!
//! - [`serve`]: the gateway process and its shutdown.
//! - [`check`]: upstream health.
//! - [`policy`]: `policy check|test|schema`.
//! - [`reconcile`]: settling unknown outcomes on a stopped gateway's ledger.
//! - [`review`]: `keygen|pending|show|approve|deny` for reviewers.
//! - [`enrolled`]: `reviewer enrolled --append`: an enrolment merged into a
//!   reviewers file.
//! - [`console`]: `reviewer invite|enrolled`: enrolment links of the review
//!   console.
//! - [`client`]: the signed client of the control API (also the TUI's).
//! - [`files`]: reading the configuration and the policy folder.
//! - [`args`]: the command line as clap types.
//! - [`tools`]: `tools list|diff|pin|accept`.
//! - [`transparency`]: `audit ...`: verify, prove, export.
//! - [`store`]: `store migrate`.
//! - [`demo`]: the guided demo.
//! - [`log`]: log lines that client values cannot forge.

pub(crate) mod args;
pub(crate) mod cases;
pub(crate) mod check;
pub mod client;
pub(crate) mod console;
pub(crate) mod demo;
pub(crate) mod enrolled;
pub mod files;
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod listen;
pub(crate) mod log;
pub(crate) mod out;
pub(crate) mod policy;
pub(crate) mod policy_diff;
pub(crate) mod reconcile;
pub(crate) mod review;
pub mod running;
pub(crate) mod serve;
pub(crate) mod store;
pub(crate) mod telemetry;
pub(crate) mod tools;
pub(crate) mod transparency;
pub(crate) mod watch;

use crate::cli::out::outln;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

use crate::core::approval::Verdict;
use args::{Cli, Command, StoreCommand};

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // `serve` starts logging once its configuration says where traces go.
    if !matches!(cli.command, Command::Serve { .. }) {
        log::init(None);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("countersign: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        // `| head -1` has read what it wanted: not a failure.
        Err(e) if out::is_closed(&e) => ExitCode::SUCCESS,
        Err(e) => {
            // The error, then each cause on a line of its own: what was
            // being done, then why, down to what the system said.
            eprintln!("countersign: error: {e}");
            // A cause whose words the line above already ends with (an
            // error that repeats its source's text for one-line logs) is
            // not said twice.
            let mut above = e.to_string();
            for cause in e.chain().skip(1) {
                let said = cause.to_string();
                if !above.ends_with(&said) {
                    eprintln!("  caused by: {said}");
                }
                above = said;
            }
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Demo {
            keep,
            server_bin,
            dir,
            json,
        } => {
            crate::cli::demo::run(crate::cli::demo::Options {
                keep,
                server_bin,
                dir,
                json,
            })
            .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve { config, listen } => {
            let mut config = files::load_config(&config)?;
            if let Some(addr) = listen {
                config.gateway.listen = addr;
            }

            let traces = telemetry::settings(&config.telemetry, &|name| std::env::var(name).ok())
                .map_err(|e| anyhow::anyhow!("[telemetry]: {e}"))?;
            let export = match &traces {
                Some(s) => Some(telemetry::start(s)?),
                None => None,
            };
            log::init(export.as_ref().map(|e| e.tracer.clone()));
            if let Some(s) = &traces {
                tracing::info!(endpoint = %s.endpoint, service = %s.service_name, sampler = %s.sampler.0, "traces: exporting over OTLP/HTTP");
            }
            let served = crate::cli::serve::serve(config).await;
            if let Some(export) = export {
                export.shutdown(Duration::from_secs(5)).await;
            }
            served?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Stdio {
            server,
            gateway,
            max_line_bytes,
            reconnect_for,
            token_file,
            token_command,
        } => {
            use crate::front::bridge::TokenSource;
            let token = match (token_file, token_command) {
                (Some(file), _) => TokenSource::File(file),
                (None, Some(cmd)) => TokenSource::Command(cmd),
                (None, None) => TokenSource::Fixed(std::env::var("COUNTERSIGN_TOKEN").context(
                    "COUNTERSIGN_TOKEN is not set: export the bearer token the gateway knows for you, or give --token-file or --token-command",
                )?),
            };
            crate::front::bridge::run(crate::front::bridge::Options {
                gateway,
                server,
                token,
                max_line: max_line_bytes,
                reconnect_for,
            })
            .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Reconcile(args) => crate::cli::reconcile::command(args).await,
        Command::Policy { command } => crate::cli::policy::command(command).await,
        Command::Audit { command } => crate::cli::transparency::command(command),
        Command::Keygen {
            out,
            name,
            groups,
            tenants,
            append,
        } => {
            let name = name.filter(|n| !n.trim().is_empty()).context(
                "keygen needs the reviewer's name: give --name NAME (it defaults to $USER, which is not set)",
            )?;
            crate::cli::review::keygen_command(&out, &name, &groups, &tenants, append.as_deref())
        }
        Command::Budgets { reviewer, json } => {
            crate::cli::review::budgets_command(&reviewer, json).await
        }
        Command::Pending { reviewer, json } => {
            crate::cli::review::pending_command(&reviewer, json).await
        }
        Command::Show { id, reviewer, json } => {
            crate::cli::review::show_command(&reviewer, &id, json).await
        }
        Command::Approve {
            id,
            reviewer,
            reason,
            ttl,
        } => {
            crate::cli::review::decide_command(&reviewer, &id, Verdict::Approve, &reason, ttl).await
        }
        Command::Deny {
            id,
            reviewer,
            reason,
        } => {
            let Some(reason) = reason.filter(|r| !r.trim().is_empty()) else {
                anyhow::bail!(
                    "deny needs a reason: countersign deny {id} --reason \"...\" (the agent is told why its call was refused)"
                );
            };
            let ttl = Duration::from_secs(0);
            crate::cli::review::decide_command(&reviewer, &id, Verdict::Deny, &reason, ttl).await
        }
        Command::Withdraw { id, reviewer } => {
            crate::cli::review::withdraw_command(&reviewer, &id).await
        }
        Command::Store {
            command: StoreCommand::Migrate { config },
        } => {
            let config = files::load_config(&config)?;
            outln!("{}", crate::cli::store::migrate(&config).await?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Tools { command, config } => crate::cli::tools::command(command, &config).await,
        Command::Check { config, json } => crate::cli::check::command(&config, json).await,
        Command::Reviewer { command, config } => {
            crate::cli::console::command(command, &config).await
        }
    }
}
