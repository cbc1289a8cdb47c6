//! The `countersign` command.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use countersign::config::Config;
use countersign::relay::session::Gateway;

/// Approval-binding policy enforcement point for MCP tool calls.
#[derive(Parser)]
#[command(name = "countersign", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve {
        /// Configuration file.
        #[arg(long, short, default_value = "countersign.toml")]
        config: PathBuf,
    },
    /// Bridge a stdio-only MCP client to the gateway's endpoint for one server.
    Stdio {
        /// Upstream server name, as configured in the gateway.
        #[arg(long)]
        server: String,
        /// Gateway base URL.
        #[arg(
            long,
            default_value = "http://127.0.0.1:7373",
            env = "COUNTERSIGN_GATEWAY"
        )]
        gateway: String,
        /// Longest stdin line accepted, in bytes.
        #[arg(long, default_value_t = 16 << 20)]
        max_line_bytes: usize,
        /// How long to keep retrying while the gateway is down (e.g. "30s").
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        reconnect_for: Duration,
    },
    /// Check or test the Cedar policies.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Settle an `unknown` outcome on a stopped gateway's ledger.
    Reconcile {
        /// Configuration file (for `gateway.data_dir`).
        #[arg(long, short, default_value = "countersign.toml")]
        config: PathBuf,
        /// List unknown outcomes instead.
        #[arg(long, conflicts_with_all = ["key", "executed", "not_executed"])]
        list: bool,
        /// The idempotency key, as the client sent it (or `derived:...`).
        #[arg(required_unless_present = "list")]
        key: Option<String>,
        /// The requester's tenant.
        #[arg(long, required_unless_present = "list")]
        tenant: Option<String>,
        /// The requester.
        #[arg(long, required_unless_present = "list")]
        principal: Option<String>,
        /// The call ran: retries get its (reconciled) answer.
        #[arg(long, conflicts_with = "not_executed", required_unless_present_any = ["list", "not_executed"])]
        executed: bool,
        /// The call did not run: the next retry runs it.
        #[arg(long)]
        not_executed: bool,
        /// A note for the record.
        #[arg(long)]
        note: Option<String>,
        /// With --executed: the CallToolResult JSON retries should get.
        #[arg(long, requires = "executed")]
        result: Option<String>,
    },
    /// Initialize every configured upstream and report up/down with latency.
    Check {
        /// Configuration file.
        #[arg(long, short, default_value = "countersign.toml")]
        config: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Parse the policies and validate them against `schema.cedarschema`;
    /// errors print as `file:line:column: message`; exit 1 on any.
    Check {
        /// The policy folder.
        #[arg(long, default_value = "policies")]
        dir: PathBuf,
    },
    /// Write the `Arguments` type of the policy schema from a server's live
    /// tools/list, so that policies naming argument fields are validated.
    Schema {
        /// The server, as configured.
        #[arg(long)]
        server: String,
        /// Configuration file.
        #[arg(long, short, default_value = "countersign.toml")]
        config: PathBuf,
    },
    /// Run decision cases (principal, tenant, server, tool, annotations,
    /// arguments → allow | approval | deny) and report each; exit 1 on any
    /// failure.
    Test {
        /// The case file (TOML, `[[case]]` tables).
        file: PathBuf,
        /// The policy folder.
        #[arg(long, default_value = "policies")]
        dir: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
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

/// Logs go to stderr, always: in stdio mode stdout is the protocol.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("COUNTERSIGN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve { config } => {
            let config = Config::load(&config)?;
            countersign::serve::serve(config).await?;
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
            countersign::bridge::run(countersign::bridge::Options {
                gateway,
                server,
                token,
                max_line: max_line_bytes,
                reconnect_for,
            })
            .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Reconcile {
            config,
            list,
            key,
            tenant,
            principal,
            executed,
            not_executed: _,
            note,
            result,
        } => {
            let config = Config::load(&config)?;
            if list {
                for (t, p, k, r) in countersign::reconcile::list_unknown(&config)? {
                    println!("{t}\t{p}\t{k}\t{}/{}\t{}", r.server, r.tool, r.digest);
                }
                return Ok(ExitCode::SUCCESS);
            }
            let (Some(key), Some(tenant), Some(principal)) = (key, tenant, principal) else {
                anyhow::bail!("reconcile needs KEY, --tenant and --principal");
            };
            let verdict = if executed {
                countersign::reconcile::Verdict::Executed { result }
            } else {
                countersign::reconcile::Verdict::NotExecuted
            };
            let rec = countersign::reconcile::reconcile(
                &config, &tenant, &principal, &key, verdict, note,
            )
            .await?;
            println!(
                "reconciled `{key}` of {principal}@{tenant}: now {:?}",
                rec.state
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Policy { command } => {
            let ok = match command {
                PolicyCommand::Check { dir } => countersign::policy_cli::check(&dir),
                PolicyCommand::Test { file, dir } => countersign::policy_cli::test(&dir, &file)?,
                PolicyCommand::Schema { server, config } => {
                    let config = Config::load(&config)?;
                    anyhow::ensure!(
                        config.servers.contains_key(&server),
                        "unknown server `{server}`: configured servers are {}",
                        config
                            .servers
                            .keys()
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                    let gw = Gateway::new(
                        config,
                        std::sync::Arc::new(countersign::store::MemoryStore::default()),
                        countersign::decision::Policies::empty(),
                    );
                    let tools = countersign::check::list_tools(&gw, &server)
                        .await
                        .map_err(|e| anyhow::anyhow!(e))?;
                    print!(
                        "{}",
                        countersign::policy_cli::arguments_schema(&server, &tools)
                    );
                    true
                }
            };
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Check { config, json } => {
            let config = Config::load(&config)?;
            // `check` sends no tools/call: no ledger file, no policies needed.
            let gw = Gateway::new(
                config,
                std::sync::Arc::new(countersign::store::MemoryStore::default()),
                countersign::decision::Policies::empty(),
            );
            let report = countersign::check::check_all(&gw).await;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                for h in &report {
                    let state = if h.up { "up" } else { "down" };
                    let detail = h.error.clone().unwrap_or_else(|| {
                        h.server_info
                            .as_ref()
                            .map(|i| i.to_string())
                            .unwrap_or_default()
                    });
                    println!(
                        "{:<20} {:<5} {:>9.1} ms  {}",
                        h.server, state, h.latency_ms, detail
                    );
                }
            }
            let all_up = !report.is_empty() && report.iter().all(|h| h.up);
            Ok(if all_up {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}
