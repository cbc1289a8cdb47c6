//! The `countersign` command line, as clap types: every subcommand, its
//! flags and their help. The commands themselves live in the module each
//! one is named after.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// Approval-binding policy enforcement point for MCP tool calls.
#[derive(Parser)]
#[command(name = "countersign", version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Show the guarantees in a second: the example payments server behind
    /// a gateway in a temporary folder, and a scripted agent.
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
        /// Listen here instead of `gateway.listen` (e.g. 127.0.0.1:7474
        /// when 7373 is taken). Reviewer commands then need
        /// `--gateway`/`COUNTERSIGN_GATEWAY` set to match.
        #[arg(long, env = "COUNTERSIGN_LISTEN", value_name = "ADDR")]
        listen: Option<std::net::SocketAddr>,
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
        /// Read the bearer token from this file (again after a 401) instead
        /// of `COUNTERSIGN_TOKEN`.
        #[arg(long, conflicts_with = "token_command")]
        token_file: Option<PathBuf>,
        /// Run this command (`sh -c`) for the bearer token, again after a
        /// 401: an identity provider's CLI printing an access token.
        #[arg(long)]
        token_command: Option<String>,
    },
    /// Cedar policies: check, test, schema, diff two sets, and the kept
    /// decision inputs.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Settle an `unknown` outcome on a stopped gateway's ledger.
    Reconcile(ReconcileArgs),
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
        /// The reviewer's name (default: $USER).
        #[arg(long, env = "USER")]
        name: Option<String>,
        /// Groups for the printed entry, comma-separated. The shipped
        /// policies let only group `leads` approve destructive tools.
        #[arg(long, value_delimiter = ',')]
        groups: Vec<String>,
        /// Tenants whose calls the reviewer may decide, comma-separated
        /// (default every tenant, `*`).
        #[arg(long, value_delimiter = ',', default_value = "*")]
        tenants: Vec<String>,
        /// Also append the entry to this reviewers file, making the file and
        /// its folder if they are missing (e.g. `.countersign/reviewers.toml`
        /// before the first `serve`).
        #[arg(long, value_name = "FILE")]
        append: Option<PathBuf>,
    },
    /// Each budget's spending per principal or tenant in its window, and
    /// each effect key's effects (through the gateway, in your tenants).
    Budgets {
        #[command(flatten)]
        reviewer: ReviewerArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
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
        /// Why (required: the agent is told, word for word).
        // Checked after parsing, so that its absence is said alone: clap's
        // usage line would also list `--key` and `--gateway` as missing
        // when they come from the environment.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Take your approval of a proposal back, while it still waits for more
    /// reviewers (a quorum not met yet).
    Withdraw {
        /// Proposal id.
        id: String,
        #[command(flatten)]
        reviewer: ReviewerArgs,
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
    /// Reviewers of the web console: `invite` prints a one-time enrolment
    /// link; `enrolled` prints the `[[reviewers]]` entry of every finished
    /// enrolment.
    Reviewer {
        #[command(subcommand)]
        command: ReviewerCommand,
        /// Configuration file (its data dir keeps the invitations).
        #[arg(long, short, global = true, default_value = "countersign.toml")]
        config: PathBuf,
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
pub(crate) enum AuditCommand {
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
        /// checkpoint` prints it, or a witness keeps): the log must still
        /// hold it, so a truncation or a rewrite before it is found.
        /// Repeatable; two of one size with different roots are reported as
        /// a fork. The checkpoint the gateway published in the audit dir
        /// (`checkpoint`) is always held as well.
        #[arg(long, visible_alias = "expect-checkpoint", value_name = "FILE")]
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
pub(crate) struct ReviewerArgs {
    /// The reviewer's key file (from `countersign keygen`).
    #[arg(long, env = "COUNTERSIGN_KEY")]
    pub(crate) key: PathBuf,
    /// Gateway base URL.
    #[arg(
        long,
        default_value = "http://127.0.0.1:7373",
        env = "COUNTERSIGN_GATEWAY"
    )]
    pub(crate) gateway: String,
}

/// How a command reads kept decision inputs while a gateway runs on a redb
/// data dir (it holds the files): through that gateway, signed by a
/// reviewer, limited to the reviewer's tenants.
#[derive(clap::Args, Clone)]
pub(crate) struct ThroughGateway {
    /// A reviewer's key file: read the inputs through the running gateway
    /// (needed on redb while the gateway runs).
    #[arg(long, env = "COUNTERSIGN_KEY")]
    pub(crate) key: Option<PathBuf>,
    /// The running gateway's base URL (default: the configuration's
    /// `public_url`, or `http://` and `gateway.listen`).
    #[arg(long, env = "COUNTERSIGN_GATEWAY")]
    pub(crate) gateway: Option<String>,
}

#[derive(Subcommand)]
pub(crate) enum ReviewerCommand {
    /// A one-time link on which NAME makes a passkey for the review console.
    Invite {
        /// The reviewer's name, as `reviewers.toml` will list it.
        name: String,
        /// Groups for the entry, comma-separated.
        #[arg(long, value_delimiter = ',')]
        groups: Vec<String>,
        /// Tenants whose calls the reviewer may decide, comma-separated
        /// (default every tenant, `*`).
        #[arg(long, value_delimiter = ',', default_value = "*")]
        tenants: Vec<String>,
        /// How long the link is good for (default `review.invite_ttl`, 24h).
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Option<std::time::Duration>,
    },
    /// The `[[reviewers]]` entries of every finished enrolment, to add to
    /// `reviewers.toml`.
    Enrolled {
        /// Merge them into this reviewers file instead: a reviewer listed
        /// already gets the passkey added to their entry, which keeps its
        /// groups and tenants; a new reviewer's entry is appended.
        #[arg(long, value_name = "FILE")]
        append: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
pub(crate) enum StoreCommand {
    /// Apply the migrations this countersign knows to the `[store] url`
    /// database; refuses a schema newer than it knows.
    Migrate {
        /// Configuration file.
        #[arg(long, short, default_value = "countersign.toml")]
        config: PathBuf,
    },
}

#[derive(Subcommand)]
pub(crate) enum ToolsCommand {
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
pub(crate) enum PolicyCommand {
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
    /// What a policy change would move: the shadow set's disagreements on
    /// the calls the gateway saw (`--shadow`), or decision cases decided
    /// under two policy folders (`BASE HEAD --cases FILE`).
    Diff {
        /// The policy folder before the change.
        #[arg(
            required_unless_present_any = ["shadow", "base_rev"],
            requires = "head",
            conflicts_with = "base_rev"
        )]
        base: Option<PathBuf>,
        /// The policy folder after the change.
        head: Option<PathBuf>,
        /// The policies before the change as this git revision holds them
        /// (`origin/main`), read from git in the folder this runs in.
        #[arg(long, value_name = "REV", conflicts_with = "shadow")]
        base_rev: Option<String>,
        /// With --base-rev: the policies after the change at this revision
        /// (default: the folder as it is now, edits not yet committed
        /// included).
        #[arg(long, value_name = "REV", requires = "base_rev")]
        head_rev: Option<String>,
        /// With --base-rev: the policy folder, relative to where this runs.
        #[arg(
            long,
            value_name = "DIR",
            default_value = "policies",
            requires = "base_rev"
        )]
        policies: PathBuf,
        /// Summarize the `shadow_disagreement` entries of the audit log.
        #[arg(long, conflicts_with_all = ["base", "cases"])]
        shadow: bool,
        /// The window, back from now: of the audit log with --shadow, of the
        /// kept decision inputs with BASE HEAD.
        #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
        since: std::time::Duration,
        /// With --shadow: the audit dir (repeat it to merge several
        /// gateways' logs); default the one of --config.
        #[arg(long)]
        dir: Vec<PathBuf>,
        /// With --shadow and no --dir: the configuration naming the audit dir.
        #[arg(long, short, default_value = "countersign.toml")]
        config: PathBuf,
        /// With BASE HEAD: the decision cases to decide (the `policy test`
        /// format), instead of the kept decision inputs.
        #[arg(long, conflicts_with = "inputs")]
        cases: Option<PathBuf>,
        /// With BASE HEAD: decision inputs exported by `policy inputs
        /// export` (JSON lines), instead of reading them from the store of
        /// --config.
        #[arg(long)]
        inputs: Option<PathBuf>,
        #[command(flatten)]
        through: ThroughGateway,
        /// text, json or markdown (for a pull-request comment).
        #[arg(long, value_enum, default_value = "text")]
        format: crate::cli::policy_diff::Format,
        /// Exit 1 when a call would move towards allow (`loosen`), or move at
        /// all (`any`). Without it the exit is 0 whatever moved.
        #[arg(long, value_enum)]
        fail_on: Option<crate::cli::policy_diff::FailOn>,
    },
    /// The decision inputs the gateway keeps (`[policy] inputs`): export
    /// or erase them, per tenant.
    Inputs {
        #[command(subcommand)]
        command: InputsCommand,
    },
}

#[derive(Subcommand)]
pub(crate) enum InputsCommand {
    /// Print kept decision inputs as JSON lines (for `policy diff
    /// --inputs`, or a subject access request). The argument values
    /// `audit.redact` names are replaced by their digests unless `--full`.
    Export {
        /// Only this tenant's.
        #[arg(long)]
        tenant: Option<String>,
        /// The arguments as kept, `audit.redact` values included (for a
        /// `policy diff --inputs` whose policies read those values).
        #[arg(long)]
        full: bool,
        /// Only those newer than this.
        #[arg(long, value_parser = humantime::parse_duration)]
        since: Option<std::time::Duration>,
        /// Configuration file (the store).
        #[arg(long, short, default_value = "countersign.toml")]
        config: PathBuf,
        #[command(flatten)]
        through: ThroughGateway,
    },
    /// Forget every kept decision input of a tenant.
    Erase {
        /// The tenant whose inputs are forgotten.
        #[arg(long)]
        tenant: String,
        /// Configuration file (the store).
        #[arg(long, short, default_value = "countersign.toml")]
        config: PathBuf,
    },
}

/// Run the command line.

// The flags of `countersign reconcile` (its help is the variant's).
#[derive(clap::Args)]
pub(crate) struct ReconcileArgs {
    /// Configuration file (for `gateway.data_dir`).
    #[arg(long, short, default_value = "countersign.toml")]
    pub(crate) config: PathBuf,
    /// List unknown outcomes instead.
    #[arg(long, conflicts_with_all = ["key", "executed", "not_executed"])]
    pub(crate) list: bool,
    /// The idempotency key, as the client sent it (or `derived:...`).
    #[arg(required_unless_present = "list")]
    pub(crate) key: Option<String>,
    /// The requester's tenant.
    #[arg(long, required_unless_present = "list")]
    pub(crate) tenant: Option<String>,
    /// The requester.
    #[arg(long, required_unless_present = "list")]
    pub(crate) principal: Option<String>,
    /// The call ran: retries get its (reconciled) answer.
    #[arg(long, conflicts_with = "not_executed", required_unless_present_any = ["list", "not_executed"])]
    pub(crate) executed: bool,
    /// The call did not run: the next retry runs it.
    #[arg(long)]
    pub(crate) not_executed: bool,
    /// A note for the record.
    #[arg(long)]
    pub(crate) note: Option<String>,
    /// With --executed: the CallToolResult JSON retries should get.
    #[arg(long, requires = "executed")]
    pub(crate) result: Option<String>,
    /// Reconcile through the running gateway's control API, signed with
    /// this reviewer key (the ledger file is locked while it runs).
    #[arg(long)]
    pub(crate) reviewer_key: Option<PathBuf>,
    /// Gateway base URL (with --reviewer-key).
    #[arg(
        long,
        default_value = "http://127.0.0.1:7373",
        env = "COUNTERSIGN_GATEWAY"
    )]
    pub(crate) gateway: String,
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    /// Every subcommand, by its full name (`audit verify`), with clap's
    /// view of it.
    fn every(c: &clap::Command, above: &str, out: &mut Vec<(String, clap::Command)>) {
        for sub in c.get_subcommands() {
            let name = format!("{above} {}", sub.get_name()).trim().to_owned();
            out.push((name.clone(), sub.clone()));
            every(sub, &name, out);
        }
    }

    fn subcommands() -> Vec<(String, clap::Command)> {
        let mut out = Vec::new();
        every(&super::Cli::command(), "", &mut out);
        out
    }

    #[test]
    fn every_subcommand_and_every_option_says_what_it_is() {
        let mut missing = Vec::new();
        for (name, c) in subcommands() {
            if c.get_about().is_none() {
                missing.push(format!("`{name}` has no description"));
            }
            for a in c.get_arguments() {
                let id = a.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if a.get_help().is_none() {
                    missing.push(format!("`{name}`'s `{id}` has no description"));
                }
            }
        }
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }

    #[test]
    fn the_command_reference_names_every_subcommand() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/commands.md");
        let text = std::fs::read_to_string(path).expect("docs/commands.md");
        let missing: Vec<String> = subcommands()
            .into_iter()
            // A command with subcommands is named through them.
            .filter(|(_, c)| !c.has_subcommands())
            .map(|(name, _)| name)
            .filter(|name| !text.contains(&format!("`countersign {name}")))
            .collect();
        assert!(
            missing.is_empty(),
            "docs/commands.md does not name: {}",
            missing.join(", ")
        );
    }

    /// The shell lines of the ```sh blocks of a Markdown file, with their
    /// continuation lines joined and comments dropped.
    fn shell_lines(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut in_sh = false;
        let mut pending = String::new();
        for line in text.lines() {
            let trimmed = line.trim_start();
            if trimmed.starts_with("```") {
                in_sh = !in_sh && trimmed.trim_start_matches('`').starts_with("sh");
                continue;
            }
            if !in_sh {
                continue;
            }
            pending.push_str(line.trim());
            if pending.ends_with('\\') {
                pending.pop();
                pending.push(' ');
                continue;
            }
            out.push(std::mem::take(&mut pending));
        }
        out
    }

    /// Every `countersign ...` command the README and the guides show in a
    /// shell block parses: its subcommand and every flag exist. A renamed
    /// flag fails here, not in a new user's terminal.
    #[test]
    fn every_documented_command_parses() {
        let root = env!("CARGO_MANIFEST_DIR");
        let mut files = vec![std::path::PathBuf::from(root).join("README.md")];
        let mut docs: Vec<_> = std::fs::read_dir(std::path::Path::new(root).join("docs"))
            .expect("docs/")
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        docs.sort();
        files.extend(docs);
        let mut checked = 0;
        let mut failed = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file).expect("a doc");
            // Shell blocks, and inline `countersign ...` spans in prose that
            // are a command as typed (not a synopsis with `[...]` or `|`).
            let inline = text
                .split('`')
                .skip(1)
                .step_by(2)
                .filter(|span| span.starts_with("countersign "))
                .filter(|span| {
                    !span.contains(['[', '|', '…']) && !span.contains("...") && !span.contains(": ")
                })
                .map(str::to_owned);
            for line in shell_lines(&text).into_iter().chain(inline) {
                // Each command of a line (`a && b`, `a | b`, `X=1 cmd`).
                for part in line.split("&&").flat_map(|p| p.split(" | ")) {
                    let code = part.split(" #").next().unwrap_or_default();
                    let Some(words) = shlex::split(code) else {
                        continue;
                    };
                    // The command word, after any `NAME=value` assignments.
                    let Some(at) = words.iter().position(|w| !w.contains('=')) else {
                        continue;
                    };
                    if words[at] != "countersign" && !words[at].ends_with("/countersign") {
                        continue;
                    }
                    // Output redirections and `&` end the command's own words;
                    // a placeholder (`ID`, `SEQ`, `FILE`) stands for a value.
                    let args: Vec<String> = words[at..]
                        .iter()
                        .take_while(|w| !w.starts_with('>') && !w.starts_with("2>") && *w != "&")
                        .map(|w| {
                            if w.len() > 1 && w.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                            {
                                "1".to_owned()
                            } else {
                                w.clone()
                            }
                        })
                        .collect();
                    checked += 1;
                    use clap::error::ErrorKind as K;
                    match super::Cli::try_parse_from(&args) {
                        Ok(_) => {}
                        // A mention names the command; its key and gateway
                        // may come from the environment.
                        Err(e)
                            if matches!(
                                e.kind(),
                                K::DisplayHelp
                                    | K::DisplayVersion
                                    | K::MissingRequiredArgument
                                    | K::DisplayHelpOnMissingArgumentOrSubcommand
                            ) => {}
                        Err(e) => failed.push(format!(
                            "{}: `{}`: {}",
                            file.display(),
                            code.trim(),
                            e.kind()
                        )),
                    }
                }
            }
        }
        assert!(checked > 60, "only {checked} documented commands found");
        assert!(failed.is_empty(), "{}", failed.join("\n"));
    }

    /// The README's test command is the one `.ci/run` runs: a newcomer who
    /// types it runs what CI runs.
    #[test]
    fn the_readme_test_command_is_the_one_ci_runs() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
        let ci = std::fs::read_to_string(root.join(".ci/run")).expect(".ci/run");
        let command = shell_lines(&readme)
            .into_iter()
            .find(|l| l.starts_with("cargo test"))
            .expect("the README names a `cargo test` command");
        assert!(
            ci.lines().any(|l| l.trim_start().starts_with(&command)),
            "`.ci/run` does not run the README's `{command}`"
        );
        assert!(shell_lines(&readme).iter().any(|l| l == ".ci/run"));
    }

    #[test]
    fn keygen_names_its_name_as_optional() {
        let mut cmd = super::Cli::command();
        let usage = cmd
            .find_subcommand_mut("keygen")
            .expect("keygen")
            .render_usage()
            .to_string();
        // Defaulted from $USER: among the options, not a required flag.
        assert!(!usage.contains("--name"), "{usage}");
        assert!(usage.contains("--out <OUT>"), "{usage}");
    }
}
