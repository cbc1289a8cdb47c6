//! The `countersign` command: argument parsing, the commands, printing.
//! `main.rs` only calls [`main`].
//!
//! - [`serve`]: the gateway process and its shutdown.
//! - [`check`]: upstream health.
//! - [`policy`]: `policy check|test|schema`.
//! - [`reconcile`]: settling unknown outcomes on a stopped gateway's ledger.
//! - [`review`]: `keygen|pending|show|approve|deny` for reviewers.
//! - [`client`]: the signed client of the control API (also the TUI's).
//! - [`files`]: reading the configuration and the policy folder.
//! - [`args`]: the command line as clap types.
//! - [`tools`]: `tools list|diff|pin|accept`.
//! - [`transparency`]: `audit ...`: verify, prove, export.
//! - [`store`]: `store migrate`.
//! - [`demo`]: the guided demo.
//! - [`log`]: log lines that client values cannot forge.

pub(crate) mod args;
pub(crate) mod check;
pub mod client;
pub(crate) mod demo;
pub mod files;
pub(crate) mod log;
pub(crate) mod policy;
pub(crate) mod reconcile;
pub(crate) mod review;
pub(crate) mod serve;
pub(crate) mod store;
pub(crate) mod tools;
pub(crate) mod transparency;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

use args::{Cli, Command, StoreCommand};

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    log::init();
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
        Err(e) => {
            eprintln!("countersign: error: {e:#}");
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
        Command::Serve { config } => {
            let config = files::load_config(&config)?;
            crate::cli::serve::serve(config).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Stdio {
            server,
            gateway,
            max_line_bytes,
            reconnect_for,
        } => {
            let token = std::env::var("COUNTERSIGN_TOKEN").context(
                "COUNTERSIGN_TOKEN is not set: export the bearer token the gateway knows for you",
            )?;
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
        } => {
            let entry = crate::cli::review::keygen(&out, &name, &groups, &tenants)?;
            eprintln!(
                "countersign: wrote the private key to {} (mode 0600); add this entry to the gateway's \
                 reviewers file (approvals.reviewers, by default policies/reviewers.toml):",
                out.display()
            );
            print!("{entry}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Pending { reviewer, json } => {
            let c = crate::cli::review::client(&reviewer.gateway, &reviewer.key)?;
            print!("{}", crate::cli::review::pending(&c, json).await?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Show { id, reviewer, json } => {
            let c = crate::cli::review::client(&reviewer.gateway, &reviewer.key)?;
            println!("{}", crate::cli::review::show(&c, &id, json).await?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Approve {
            id,
            reviewer,
            reason,
            ttl,
        } => {
            let c = crate::cli::review::client(&reviewer.gateway, &reviewer.key)?;
            let out = crate::cli::review::decide(
                &c,
                &id,
                crate::core::approval::Verdict::Approve,
                &reason,
                ttl,
            )
            .await?;
            print!("{out}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Deny {
            id,
            reviewer,
            reason,
        } => {
            let c = crate::cli::review::client(&reviewer.gateway, &reviewer.key)?;
            let out = crate::cli::review::decide(
                &c,
                &id,
                crate::core::approval::Verdict::Deny,
                &reason,
                Duration::from_secs(0),
            )
            .await?;
            print!("{out}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Store {
            command: StoreCommand::Migrate { config },
        } => {
            let config = files::load_config(&config)?;
            println!("{}", crate::cli::store::migrate(&config).await?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Tools { command, config } => crate::cli::tools::command(command, &config).await,
        Command::Check { config, json } => crate::cli::check::command(&config, json).await,
    }
}
