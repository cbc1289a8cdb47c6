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
//! - [`log`]: log lines that client values cannot forge.

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

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::front::gateway::Gateway;

/// Approval-binding policy enforcement point for MCP tool calls.
#[derive(Parser)]
#[command(name = "countersign", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the guarantees in two minutes: the example payments server
    /// behind a gateway in a temporary folder, and a scripted agent.
    Demo {
        /// Leave the gateway running and print what to try next.
        #[arg(long)]
        keep: bool,
        /// The example payments server (default: examples/payments_server
        /// next to this binary, as `cargo build --release --examples` makes it).
        #[arg(long)]
        server_bin: Option<PathBuf>,
        /// Put the demo's files here instead of a new temporary folder (kept).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// After the narration, print one JSON object of what was shown.
        #[arg(long)]
        json: bool,
    },
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
        /// Reconcile through the running gateway's control API, signed with
        /// this reviewer key (the ledger file is locked while it runs).
        #[arg(long)]
        reviewer_key: Option<PathBuf>,
        /// Gateway base URL (with --reviewer-key).
        #[arg(
            long,
            default_value = "http://127.0.0.1:7373",
            env = "COUNTERSIGN_GATEWAY"
        )]
        gateway: String,
    },
    /// The audit log: verify it, export it, print the gateway's key.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Make a reviewer key: writes the private key (mode 0600) and prints
    /// the entry for `policies/reviewers.toml`.
    Keygen {
        /// Where to write the private key (never overwritten).
        #[arg(long)]
        out: PathBuf,
        /// The reviewer's name (defaults to $USER).
        #[arg(long, env = "USER")]
        name: String,
        /// Groups for the printed entry, comma-separated. The shipped
        /// policies let only group `leads` approve destructive tools.
        #[arg(long, value_delimiter = ',')]
        groups: Vec<String>,
        /// Tenants whose calls the reviewer may decide, comma-separated
        /// (default every tenant, `*`).
        #[arg(long, value_delimiter = ',', default_value = "*")]
        tenants: Vec<String>,
    },
    /// List proposals waiting for a decision.
    Pending {
        #[command(flatten)]
        reviewer: ReviewerArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one proposal: what would run, the arguments, what changed.
    Show {
        /// Proposal id (`p-...`).
        id: String,
        #[command(flatten)]
        reviewer: ReviewerArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Approve a proposal: signs the statement with your key.
    Approve {
        /// Proposal id.
        id: String,
        #[command(flatten)]
        reviewer: ReviewerArgs,
        /// Why (recorded with the signature).
        #[arg(long, default_value = "")]
        reason: String,
        /// How long the approval lasts (capped by the gateway's approvals.ttl).
        #[arg(long, default_value = "15m", value_parser = humantime::parse_duration)]
        ttl: Duration,
    },
    /// Deny a proposal: signs the statement with your key.
    Deny {
        /// Proposal id.
        id: String,
        #[command(flatten)]
        reviewer: ReviewerArgs,
        /// Why (the agent is told).
        #[arg(long)]
        reason: String,
    },
    /// Tool definitions against `policies/tools.lock`: list, diff, pin,
    /// accept.
    Tools {
        #[command(subcommand)]
        command: ToolsCommand,
        /// Configuration file (servers, and the policy folder holding the lock).
        #[arg(long, short, global = true, default_value = "countersign.toml")]
        config: PathBuf,
    },
    /// The ledger store: `migrate` brings a PostgreSQL schema up to date
    /// (the gateway also does so when it starts).
    Store {
        #[command(subcommand)]
        command: StoreCommand,
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
enum AuditCommand {
    /// Check the hash chain, every checkpoint signature and every embedded
    /// reviewer signature; print a summary and the first break; exit 1 on any.
    Verify {
        /// The audit dir (`gateway.data_dir/audit`); repeat it for the logs
        /// of several gateways (each is checked on its own).
        #[arg(long, default_value = ".countersign/audit")]
        dir: Vec<PathBuf>,
        /// `policies/reviewers.toml`: check reviewer statements against it
        /// (default: against the key embedded with each statement).
        #[arg(long)]
        reviewers: Option<PathBuf>,
        /// The gateway's public key (`ed25519:...`, or a file holding it, as
        /// `audit pubkey` prints it); default: the key the log names.
        #[arg(long)]
        pubkey: Option<String>,
        /// A signed checkpoint held elsewhere (a file, as `audit
        /// checkpoint` prints it): the log must still hold it, so a
        /// truncation or a rewrite before it is found. Repeatable; two of
        /// one size with different roots are reported as a fork.
        #[arg(long)]
        checkpoint: Vec<PathBuf>,
        /// A witness's verifier key (`name+id+base64`): the cosignatures
        /// the log records from it are checked.
        #[arg(long)]
        witness: Vec<String>,
    },
    /// Print the latest signed checkpoint (a C2SP tlog-checkpoint signed
    /// note, with any witness cosignatures).
    Checkpoint {
        /// The audit dir.
        #[arg(long, default_value = ".countersign/audit")]
        dir: PathBuf,
    },
    /// Print an inclusion proof of entry SEQ, or with --consistency a
    /// consistency proof from an older tree size, against the latest
    /// checkpoint (or --size), as JSON.
    Prove {
        /// The entry's seq (counted from 1).
        #[arg(
            required_unless_present = "consistency",
            conflicts_with = "consistency"
        )]
        seq: Option<u64>,
        /// Prove that the tree of this many entries is a prefix of the
        /// newer one.
        #[arg(long, value_name = "OLD_SIZE")]
        consistency: Option<u64>,
        /// The tree size to prove against (default: the latest checkpoint's).
        #[arg(long)]
        size: Option<u64>,
        /// The audit dir.
        #[arg(long, default_value = ".countersign/audit")]
        dir: PathBuf,
    },
    /// Check an `audit export --with-proofs` file on its own: the
    /// checkpoint's signature, and each entry's hash and inclusion proof.
    CheckExport {
        /// The export (`-` for standard input).
        file: PathBuf,
        /// The gateway's public key (`ed25519:...` or a file), or its
        /// verifier key (`name+id+base64`, from `audit pubkey --vkey`).
        #[arg(long)]
        pubkey: String,
    },
    /// Stream entries as JSON Lines, CSV or OCSF.
    Export {
        /// The audit dir; repeat it to merge the logs of several gateways
        /// in time order.
        #[arg(long, default_value = ".countersign/audit")]
        dir: Vec<PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value = "jsonl")]
        format: crate::audit::export::Format,
        /// Only entries at or after this RFC 3339 time.
        #[arg(long)]
        since: Option<String>,
        /// Only entries at or before this RFC 3339 time.
        #[arg(long)]
        until: Option<String>,
        /// Write here instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Keep streaming new entries as the gateway writes them, as
        /// `tail -f` does (one --dir; stops on Ctrl-C or when the reader
        /// goes away).
        #[arg(long, conflicts_with = "until")]
        follow: bool,
        /// JSON Lines of `{entry, inclusion}`, after one line holding the
        /// latest signed checkpoint: each entry can then be checked against
        /// it without the rest of the log (`audit check-export`). One
        /// --dir, jsonl only; entries after the checkpoint are left out.
        #[arg(long, conflicts_with_all = ["follow", "since", "until"])]
        with_proofs: bool,
    },
    /// Print the gateway's audit public key (made on the gateway's first start).
    Pubkey {
        /// The audit dir.
        #[arg(long, default_value = ".countersign/audit")]
        dir: PathBuf,
        /// Print the checkpoints' verifier key instead (`origin+id+base64`,
        /// the C2SP signed-note form witnesses and verifiers take).
        #[arg(long)]
        vkey: bool,
    },
}

/// How a reviewer command reaches the gateway.
#[derive(clap::Args)]
struct ReviewerArgs {
    /// The reviewer's key file (from `countersign keygen`).
    #[arg(long, env = "COUNTERSIGN_KEY")]
    key: PathBuf,
    /// Gateway base URL.
    #[arg(
        long,
        default_value = "http://127.0.0.1:7373",
        env = "COUNTERSIGN_GATEWAY"
    )]
    gateway: String,
}

#[derive(Subcommand)]
enum StoreCommand {
    /// Apply the migrations this countersign knows to the `[store] url`
    /// database; refuses a schema newer than it knows.
    Migrate {
        /// Configuration file.
        #[arg(long, short, default_value = "countersign.toml")]
        config: PathBuf,
    },
}

#[derive(Subcommand)]
enum ToolsCommand {
    /// Each server's tools with their definition digest and how they stand
    /// against the lock: pinned, changed, unpinned, vanished.
    List {
        /// Only this server.
        #[arg(long)]
        server: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// What differs between the pinned definitions and what the servers
    /// list now, field by field; exit 1 when anything differs.
    Diff {
        /// Only this tool (`SERVER/TOOL`).
        tool: Option<String>,
    },
    /// Write the lock: pin every tool each server (or one) lists now.
    Pin {
        /// Only this server.
        #[arg(long)]
        server: Option<String>,
    },
    /// Accept one tool's definition as listed now (or its removal).
    Accept {
        /// `SERVER/TOOL`.
        tool: String,
        /// The digest you reviewed (`tools diff` shows it): refused if the
        /// server lists another one by now.
        #[arg(long)]
        digest: Option<String>,
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

/// Run the command line.
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
            reviewer_key,
            gateway,
        } => {
            if let Some(key_file) = reviewer_key {
                let c = crate::cli::review::client(&gateway, &key_file)?;
                if list {
                    let v = c.call(reqwest::Method::GET, "/v1/outcomes", None).await?;
                    for o in v["outcomes"].as_array().into_iter().flatten() {
                        println!(
                            "{}\t{}\t{}\t{}/{}\t{}",
                            o["tenant"].as_str().unwrap_or(""),
                            o["principal"].as_str().unwrap_or(""),
                            o["key"].as_str().unwrap_or(""),
                            o["server"].as_str().unwrap_or(""),
                            o["tool"].as_str().unwrap_or(""),
                            o["call_digest"].as_str().unwrap_or("")
                        );
                    }
                    return Ok(ExitCode::SUCCESS);
                }
                let body = serde_json::json!({
                    "tenant": tenant, "principal": principal, "key": key,
                    "resolution": if executed { "executed" } else { "not_executed" },
                    "note": note, "result": result,
                });
                print!("{}", crate::cli::review::reconcile(&c, &body).await?);
                return Ok(ExitCode::SUCCESS);
            }
            let config = files::load_config(&config)?;
            if list {
                for (t, p, k, r) in crate::cli::reconcile::list_unknown(&config).await? {
                    println!("{t}\t{p}\t{k}\t{}/{}\t{}", r.server, r.tool, r.digest);
                }
                return Ok(ExitCode::SUCCESS);
            }
            let (Some(key), Some(tenant), Some(principal)) = (key, tenant, principal) else {
                anyhow::bail!("reconcile needs KEY, --tenant and --principal");
            };
            let verdict = if executed {
                crate::enforce::reconcile::Verdict::Executed { result }
            } else {
                crate::enforce::reconcile::Verdict::NotExecuted
            };
            let rec =
                crate::cli::reconcile::reconcile(&config, &tenant, &principal, &key, verdict, note)
                    .await?;
            println!(
                "reconciled `{key}` of {principal}@{tenant}: now {:?}",
                rec.state
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Policy { command } => {
            let ok = match command {
                PolicyCommand::Check { dir } => crate::cli::policy::check(&dir),
                PolicyCommand::Test { file, dir } => crate::cli::policy::test(&dir, &file)?,
                PolicyCommand::Schema { server, config } => {
                    let config = files::load_config(&config)?;
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
                    let gw = offline(config);
                    let tools = crate::cli::check::list_tools(&gw, &server)
                        .await
                        .map_err(|e| anyhow::anyhow!(e))?;
                    print!("{}", crate::cli::policy::arguments_schema(&server, &tools));
                    true
                }
            };
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Audit { command } => audit(command),
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
        Command::Tools { command, config } => {
            let gw = offline(files::load_config(&config)?);
            tools_command(&gw, command).await
        }
        Command::Check { config, json } => {
            let gw = offline(files::load_config(&config)?);
            let report = crate::cli::check::check_all(&gw).await;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                // The running gateway's own store, when one answers.
                if let Some(store) = crate::cli::check::running_health(&gw)
                    .await
                    .and_then(|h| h.get("store")?.as_str().map(str::to_owned))
                {
                    println!("{:<20} store {store}", "(gateway)");
                }
                for h in &report {
                    let state = if h.up { "up" } else { "down" };
                    let detail = h.error.clone().unwrap_or_else(|| {
                        h.server_info
                            .as_ref()
                            .map(|i| i.to_string())
                            .unwrap_or_default()
                    });
                    let circuit = h
                        .circuit
                        .as_deref()
                        .map(|c| format!("circuit {c}  "))
                        .unwrap_or_default();
                    println!(
                        "{:<20} {:<5} {:>9.1} ms  {circuit}{}",
                        h.server, state, h.latency_ms, detail
                    );
                    for t in &h.tools {
                        println!("  {}", crate::cli::check::tool_line(t));
                    }
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

/// A gateway for commands that send no `tools/call` (`check`, `tools`,
/// `policy schema`): no ledger file, no policies, no audit log.
fn offline(config: crate::core::config::Config) -> std::sync::Arc<Gateway> {
    Gateway::new(
        config,
        std::sync::Arc::new(crate::store::MemoryStore::default()),
        crate::core::decision::Policies::empty(),
        None,
    )
}

async fn tools_command(gw: &Gateway, command: ToolsCommand) -> anyhow::Result<ExitCode> {
    use crate::cli::tools;
    let mut lock = tools::lock_of(gw)?;
    match command {
        ToolsCommand::List { server, json } => {
            let listed = tools::fetch(gw, server.as_deref()).await?;
            let states = tools::compare(&listed, &lock);
            if json {
                println!("{}", serde_json::to_string_pretty(&states)?);
            } else {
                for s in &states {
                    let digest = s.digest.as_deref().or(s.pinned.as_deref()).unwrap_or("");
                    let standing = serde_json::to_value(s.standing)?;
                    println!(
                        "{:<32} {:<9} {digest}",
                        format!("{}/{}", s.server, s.tool),
                        standing.as_str().unwrap_or_default()
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        ToolsCommand::Diff { tool } => {
            let only = tool.as_deref().map(tools::split).transpose()?;
            let listed = tools::fetch(gw, only.map(|o| o.0)).await?;
            let mut differs = false;
            for s in tools::compare(&listed, &lock) {
                if only.is_some_and(|(_, t)| t != s.tool) {
                    continue;
                }
                let name = format!("{}/{}", s.server, s.tool);
                match s.standing {
                    tools::Standing::Pinned | tools::Standing::Unpinned => continue,
                    tools::Standing::Changed => println!(
                        "{name}: pinned {} → listed {}\n{}",
                        s.pinned.unwrap_or_default(),
                        s.digest.unwrap_or_default(),
                        tools::describe(&s.changes)
                    ),
                    tools::Standing::Vanished => {
                        println!(
                            "{name}: pinned {}, no longer listed",
                            s.pinned.unwrap_or_default()
                        );
                    }
                }
                differs = true;
            }
            Ok(if differs {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        ToolsCommand::Pin { server } => {
            let listed = tools::fetch(gw, server.as_deref()).await?;
            let n = tools::pin(&mut lock, &listed);
            let path = tools::save(gw, &lock)?;
            println!("pinned {n} tools in {}", path.display());
            Ok(ExitCode::SUCCESS)
        }
        ToolsCommand::Accept { tool, digest } => {
            let (server, name) = tools::split(&tool)?;
            let listed = tools::fetch(gw, Some(server)).await?;
            let said = tools::accept(&mut lock, &listed, server, name, digest.as_deref())?;
            let path = tools::save(gw, &lock)?;
            println!("{said} in {}", path.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn parse_time(flag: &str, text: Option<String>) -> anyhow::Result<Option<i64>> {
    text.map(|t| {
        crate::core::time::parse_rfc3339(&t).ok_or_else(|| {
            anyhow::anyhow!("{flag} `{t}` is not an RFC 3339 time (like 2026-11-30T10:00:00Z)")
        })
    })
    .transpose()
}

fn audit(command: AuditCommand) -> anyhow::Result<ExitCode> {
    use crate::audit;
    match command {
        AuditCommand::Checkpoint { dir } => {
            let (note, _) = audit::proofs::latest(&dir)?;
            print!("{note}");
            Ok(ExitCode::SUCCESS)
        }
        AuditCommand::Prove {
            seq,
            consistency,
            size,
            dir,
        } => transparency::prove(&dir, seq, consistency, size),
        AuditCommand::CheckExport { file, pubkey } => transparency::check_export(&file, &pubkey),
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
                    crate::core::reviewers::parse_public_key(text.trim())
                        .map_err(|e| anyhow::anyhow!("--pubkey: {e}"))
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
                .map(|w| audit::note::parse_vkey(w).map_err(|e| anyhow::anyhow!("--witness: {e}")))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let mut broken = false;
            for d in &dir {
                let also = audit::verify::Also {
                    checkpoints: checkpoints.clone(),
                    witnesses: witnesses.clone(),
                };
                let report = audit::verify::verify_dir_with(d, pubkey, reviewers.clone(), also)?;
                if dir.len() > 1 {
                    println!("{}:", d.display());
                }
                print!("{}", report.render());
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
                return transparency::export_with_proofs(&dir[0], out.as_deref());
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
            println!("{}", transparency::vkey(&dir)?);
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
                .map_err(|e| anyhow::anyhow!("`{}`: {e}", path.display()))?;
            println!(
                "{}",
                crate::core::reviewers::format_public_key(&key.verifying_key())
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
