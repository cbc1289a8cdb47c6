//! `countersign demo`: the example payments server behind a real gateway in
//! a temporary folder, a scripted agent, and each guarantee narrated as it
//! is shown. Everything runs on loopback; the demo's reviewer key is made
//! for the demo and says so.
//!
//! The steps, each checked from the server's execution record or the
//! audit log before it is claimed:
//! 1. a charge held for approval, approved by the demo reviewer;
//! 2. five sends of that charge with one idempotency key: one execution;
//! 3. the key reused with another amount: `drift_rejected`, nothing runs;
//! 4. the server killed after it charged and before it answered:
//!    `outcome_unknown`, never sent again, then reconciled;
//! 5. `audit verify` over the log (after a clean stop, which signs its
//!    tail; with `--keep`, over the live log).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::cli::out::outln;
use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::core::approval::Verdict;

/// The demo's agent token (an identity in the demo's own config only).
const AGENT_TOKEN: &str = "demo-agent-token";
/// The demo reviewer's name: made for the demo, in group `leads`.
const REVIEWER: &str = "demo-reviewer";

/// Options of `countersign demo`.
pub(crate) struct Options {
    /// Leave the gateway running and print what to try next.
    pub keep: bool,
    /// The example server binary (default: `examples/payments_server` next
    /// to this binary, as `cargo build --release --examples` leaves it).
    pub server_bin: Option<PathBuf>,
    /// Where to put the demo's files (default: a new folder under the
    /// system's temporary folder).
    pub dir: Option<PathBuf>,
    /// Print one JSON object of what was shown, after the narration (tests).
    pub json: bool,
}

/// What the demo showed, for `--json`.
#[derive(Default, serde::Serialize)]
struct Shown {
    dir: String,
    gateway: String,
    executions_after_five_sends: usize,
    replayed: usize,
    drift_code: String,
    unknown_code: String,
    unknown_retry_code: String,
    executions_after_kill: usize,
    reconciled_text: String,
    task_status: String,
    task_disposition: String,
    verify_ok: bool,
    verify_report: String,
}

/// The demo's narration. A reader that has gone (`| head -1`) does not stop
/// the demo: it runs to its end and cleans up, silently.
fn say(text: &str) {
    let _ = crate::cli::out::write(format_args!("{text}\n"));
}

fn step(n: u32, title: &str) {
    say(&format!("\n{n}. {title}"));
}

/// Run the demo.
pub(crate) async fn run(opts: Options) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the countersign binary")?;
    let server_bin = match &opts.server_bin {
        Some(p) => p.clone(),
        None => exe
            .parent()
            .map(|d| d.join("examples").join("payments_server"))
            .unwrap_or_default(),
    };
    if !server_bin.is_file() {
        bail!(
            "the demo needs the example payments server, and `{}` is not there: run \
             `cargo build --release --bins --examples` in the repository, then \
             `target/release/countersign demo` (or pass --server-bin PATH)",
            server_bin.display()
        );
    }
    let dir = match &opts.dir {
        Some(d) => {
            std::fs::create_dir_all(d)
                .with_context(|| format!("cannot create `{}`", d.display()))?;
            d.clone()
        }
        None => {
            let d = std::env::temp_dir()
                .join(format!("countersign-demo-{:016x}", rand::random::<u64>()));
            std::fs::create_dir(&d).with_context(|| format!("cannot create `{}`", d.display()))?;
            d
        }
    };
    let mut shown = Shown {
        dir: dir.display().to_string(),
        ..Shown::default()
    };
    let setup = Setup::write(&dir, &server_bin)?;
    say("countersign demo: the example payments server behind a gateway, with the shipped policies.");
    say(&format!(
        "Everything lives in {} and runs on loopback.",
        dir.display()
    ));
    let mut gateway = Gateway::start(&exe, &setup)?;
    let result = script(&setup, &mut shown).await;
    if result.is_err() {
        say(&format!(
            "\nThe gateway's log is in {}.",
            setup.log.display()
        ));
    }
    result?;
    step(
        5,
        "Evidence: every decision and outcome is in a signed, hash-chained audit log.",
    );
    if opts.keep {
        settle(&setup.audit);
    } else {
        // A clean stop signs the log's tail (the shutdown checkpoint).
        gateway.stop();
        say("   The gateway stops cleanly: it signs a last checkpoint over the log.");
    }
    let report = crate::audit::verify::verify_dir(&setup.audit, None, None)?;
    shown.verify_ok = report.brk.is_none();
    shown.verify_report = report.render();
    say(&format!(
        "   countersign audit verify --dir {}\n{}",
        setup.audit.display(),
        shown
            .verify_report
            .lines()
            .map(|l| format!("   {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    ));
    if !shown.verify_ok {
        bail!("the audit log does not verify");
    }
    if opts.keep {
        let pid = gateway.pid();
        gateway.detach();
        say(&format!(
            "\nThe gateway keeps running (pid {}) at {}. Try next:\n\
             \x20 countersign-review --key {key} --gateway {url}          # the reviewer TUI\n\
             \x20 countersign pending --key {key} --gateway {url}\n\
             \x20 countersign audit export --follow --dir {audit}\n\
             \x20 COUNTERSIGN_TOKEN={AGENT_TOKEN} countersign stdio --server payments --gateway {url}   # the bridge, as a desktop client spawns it\n\
             \x20 {{\"mcpServers\": {{\"payments\": {{\"command\": \"countersign\", \"args\": [\"stdio\", \"--server\", \"payments\", \"--gateway\", \"{url}\"], \"env\": {{\"COUNTERSIGN_TOKEN\": \"{AGENT_TOKEN}\"}}}}}}}}\n\
             Stop it with `kill {pid}`; its files stay in {dir}.",
            pid,
            setup.url,
            key = setup.reviewer_key.display(),
            url = setup.url,
            audit = setup.audit.display(),
            dir = dir.display(),
        ));
    } else if opts.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
        say("\nThe demo's folder is removed (`--keep` leaves it, with the gateway running).");
    }
    if opts.json {
        outln!("{}", serde_json::to_string(&shown)?);
    }
    Ok(())
}

/// Wait (at most 3 s) until a running gateway's log stops growing: entries
/// reach the file within about 100 ms of a call's end.
fn settle(audit: &Path) {
    let size = || {
        crate::audit::segment::segments(audit)
            .unwrap_or_default()
            .iter()
            .filter_map(|s| std::fs::metadata(s).ok())
            .map(|m| m.len())
            .sum::<u64>()
    };
    let mut last = size();
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(300));
        let now = size();
        if now == last {
            return;
        }
        last = now;
    }
}

/// The demo's files.
struct Setup {
    config: PathBuf,
    record: PathBuf,
    faults: PathBuf,
    audit: PathBuf,
    log: PathBuf,
    reviewer_key: PathBuf,
    url: String,
}

impl Setup {
    fn write(dir: &Path, server_bin: &Path) -> anyhow::Result<Setup> {
        let policies = dir.join("policies");
        std::fs::create_dir_all(&policies)?;
        // The shipped policies, as the binary was built with them.
        std::fs::write(
            policies.join("default.cedar"),
            include_str!("../../policies/default.cedar"),
        )?;
        std::fs::write(
            policies.join("schema.cedarschema"),
            include_str!("../../policies/schema.cedarschema"),
        )?;
        let reviewer_key = dir.join("demo-reviewer.key");
        let entry = crate::cli::review::keygen(
            &reviewer_key,
            REVIEWER,
            &["leads".to_owned()],
            &["*".to_owned()],
        )?;
        std::fs::write(
            policies.join("reviewers.toml"),
            format!("# The demo's own reviewer: a key made for this demo only.\n{entry}"),
        )?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let record = dir.join("executions.jsonl");
        let faults = dir.join("faults.json");
        std::fs::write(&faults, "{}")?;
        let token_sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
            AGENT_TOKEN.as_bytes(),
        ));
        let q = |p: &Path| toml::Value::String(p.display().to_string()).to_string();
        let config = format!(
            "# countersign demo: made by `countersign demo`.\n\
             [gateway]\nlisten = \"127.0.0.1:{port}\"\ndata_dir = {data}\npolicies = {policies}\n\
             shutdown_grace = \"500ms\"\n\n\
             [[identities]]\ntoken_sha256 = \"{token_sha}\"\nprincipal = \"demo-agent\"\ntenant = \"demo\"\n\
             groups = [\"agents\"]\n\n\
             [approvals]\nhold = \"0s\"\n\n\
             [servers.payments]\ncommand = {bin}\nargs = [\"--record\", {record}, \"--faults\", {faults}]\n\
             call_timeout = \"10s\"\n",
            data = q(&dir.join("data")),
            policies = q(&policies),
            bin = q(server_bin),
            record = q(&record),
            faults = q(&faults),
        );
        let config_path = dir.join("countersign.toml");
        std::fs::write(&config_path, config)?;
        Ok(Setup {
            config: config_path,
            record,
            faults,
            audit: dir.join("data").join("audit"),
            log: dir.join("gateway.log"),
            reviewer_key,
            url: format!("http://127.0.0.1:{port}"),
        })
    }

    /// Executions of `tool` in the server's own record.
    fn executions(&self, tool: &str) -> usize {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["event"] == "executed" && e["tool"] == tool)
            .count()
    }
}

/// The gateway process.
struct Gateway {
    child: Option<Child>,
}

impl Gateway {
    fn start(exe: &Path, setup: &Setup) -> anyhow::Result<Gateway> {
        let log = std::fs::File::create(&setup.log)?;
        let child = Command::new(exe)
            .args(["serve", "--config"])
            .arg(&setup.config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("cannot start the gateway")?;
        let mut gw = Gateway { child: Some(child) };
        // Ready when it answers /healthz (or gone when it exited).
        for _ in 0..200 {
            if let Some(c) = gw.child.as_mut() {
                if let Some(status) = c.try_wait()? {
                    bail!(
                        "the gateway exited at start ({status}):\n{}",
                        std::fs::read_to_string(&setup.log).unwrap_or_default()
                    );
                }
            }
            if std::net::TcpStream::connect(setup.url.trim_start_matches("http://")).is_ok() {
                return Ok(gw);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        gw.stop();
        bail!(
            "the gateway did not listen within 10 s; its log: {}",
            setup.log.display()
        )
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Stop it cleanly (SIGTERM: it writes its shutdown checkpoint).
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            if let Ok(pid) = i32::try_from(c.id()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            let _ = c.wait();
        }
    }

    /// Leave it running after the demo.
    fn detach(&mut self) {
        self.child.take();
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A scripted MCP agent over Streamable HTTP (the handshake era).
struct Agent {
    http: reqwest::Client,
    url: String,
    session: Option<String>,
    next: u64,
}

impl Agent {
    async fn connect(base: &str) -> anyhow::Result<Agent> {
        let mut a = Agent {
            http: reqwest::Client::new(),
            url: format!("{base}/mcp/payments"),
            session: None,
            next: 1,
        };
        let init = a
            .rpc(
                "initialize",
                json!({"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "countersign-demo-agent", "version": "1"}}),
            )
            .await?;
        if init.get("result").is_none() {
            bail!("initialize failed: {init}");
        }
        a.notify("notifications/initialized").await?;
        a.rpc("tools/list", json!({})).await?;
        Ok(a)
    }

    fn post(&self, body: &Value) -> reqwest::RequestBuilder {
        let mut req = self
            .http
            .post(&self.url)
            .bearer_auth(AGENT_TOKEN)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(s) = &self.session {
            req = req.header("mcp-session-id", s);
        }
        req
    }

    async fn notify(&self, method: &str) -> anyhow::Result<()> {
        self.post(&json!({"jsonrpc": "2.0", "method": method}))
            .send()
            .await?;
        Ok(())
    }

    async fn rpc(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        let id = self.next;
        self.next += 1;
        let resp = self
            .post(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .send()
            .await?;
        if let Some(s) = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
        {
            self.session = Some(s.to_owned());
        }
        let sse = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let text = resp.text().await?;
        let body = if sse {
            // The answer is the last `data:` event.
            crate::wire::sse::last_data(&text)
                .unwrap_or("null")
                .to_owned()
        } else {
            text
        };
        Ok(serde_json::from_str(&body)?)
    }

    /// `charge_card` of `amount` to acct_42 under idempotency key `key`.
    async fn charge(&mut self, amount: f64, key: &str) -> anyhow::Result<Value> {
        let answer = self
            .rpc(
                "tools/call",
                json!({"name": "charge_card",
                       "arguments": {"account": "acct_42", "amount": amount, "currency": "EUR"},
                       "_meta": {"dev.countersign/idempotency-key": key}}),
            )
            .await?;
        Ok(answer["result"].clone())
    }
}

fn code(result: &Value) -> String {
    result["structuredContent"]["countersign"]["code"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

fn text(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

fn proposal_id(result: &Value) -> String {
    result["structuredContent"]["countersign"]["proposal_id"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

/// The demo reviewer approves `proposal` (signed with its key, 10 minutes).
async fn approve(reviewer: &crate::cli::client::Client, proposal: &str) -> anyhow::Result<()> {
    reviewer
        .decide(proposal, Verdict::Approve, "demo", Duration::from_secs(600))
        .await?;
    Ok(())
}

fn replayed(result: &Value) -> bool {
    result["_meta"]["dev.countersign/replayed"].is_object()
}

async fn script(setup: &Setup, shown: &mut Shown) -> anyhow::Result<()> {
    shown.gateway = setup.url.clone();
    let reviewer = crate::cli::client::Client::new(
        &setup.url,
        &crate::cli::client::load_key(&setup.reviewer_key)?,
    )?;
    let mut agent = Agent::connect(&setup.url).await?;
    say(&format!(
        "A scripted agent connects to {}/mcp/payments with its bearer token.",
        setup.url
    ));

    step(1, "A write needs a human yes, bound to exactly this call.");
    let held = agent.charge(42.0, "demo-charge-1").await?;
    if code(&held) != "approval_pending" {
        bail!("expected the charge to wait for approval, got {held}");
    }
    let proposal = proposal_id(&held);
    say(&format!(
        "   The agent asks to charge EUR 42 to acct_42 (idempotency key demo-charge-1). The shipped \
         policies hold every write: the answer is approval_pending, proposal {proposal}. Nothing ran \
         ({} executions in the server's record).",
        setup.executions("charge_card")
    ));
    approve(&reviewer, &proposal).await?;
    say(&format!(
        "   `{REVIEWER}` approves it: an ed25519 signature over the call's digest, the requester, the \
         tenant, the tool's definition and an expiry. (This reviewer's key was made for this demo only, \
         in {}.)",
        setup.reviewer_key.display()
    ));

    step(
        2,
        "At most once: five sends of the same charge, one execution.",
    );
    let mut replays = 0;
    for n in 1..=5 {
        let r = agent.charge(42.0, "demo-charge-1").await?;
        if r["isError"] == true {
            bail!("send {n} of the approved charge failed: {r}");
        }
        if replayed(&r) {
            replays += 1;
        }
    }
    shown.executions_after_five_sends = setup.executions("charge_card");
    shown.replayed = replays;
    say(&format!(
        "   The agent sends it five times, as an agent does when answers get lost. The server's record \
         shows {} execution; {replays} of the five answers are the first one, replayed \
         (_meta dev.countersign/replayed). The approval was used up by the first.",
        shown.executions_after_five_sends
    ));
    if shown.executions_after_five_sends != 1 || replays != 4 {
        bail!("expected one execution and four replays");
    }

    step(
        3,
        "A key means one call: other arguments under it are refused.",
    );
    let drift = agent.charge(4200.0, "demo-charge-1").await?;
    shown.drift_code = code(&drift);
    say(&format!(
        "   The agent reuses demo-charge-1 for EUR 4200: {}. Still {} execution.",
        shown.drift_code,
        setup.executions("charge_card")
    ));
    if shown.drift_code != "drift_rejected" || setup.executions("charge_card") != 1 {
        bail!("expected drift_rejected and no execution, got {drift}");
    }

    step(
        4,
        "When the outcome is unknown, the answer says so, and nothing is sent again.",
    );
    let second = agent.charge(7.0, "demo-charge-2").await?;
    approve(&reviewer, &proposal_id(&second)).await?;
    // The server charges, then dies before it answers.
    std::fs::write(
        &setup.faults,
        json!({"charge_card": {"fault": "exit_after_execute"}}).to_string(),
    )?;
    let lost = agent.charge(7.0, "demo-charge-2").await?;
    shown.unknown_code = code(&lost);
    let retry = agent.charge(7.0, "demo-charge-2").await?;
    shown.unknown_retry_code = code(&retry);
    shown.executions_after_kill = setup.executions("charge_card");
    say(&format!(
        "   A second charge (EUR 7, key demo-charge-2) is approved; the server charges the card and is \
         killed before it answers. The agent gets {}, and its retry {} again: the call is never sent \
         twice. The server's record shows {} executions in all.",
        shown.unknown_code, shown.unknown_retry_code, shown.executions_after_kill
    ));
    if shown.unknown_code != "outcome_unknown"
        || shown.unknown_retry_code != "outcome_unknown"
        || shown.executions_after_kill != 2
    {
        bail!("expected outcome_unknown twice and two executions");
    }
    crate::cli::review::reconcile(
        &reviewer,
        &json!({"tenant": "demo", "principal": "demo-agent", "key": "demo-charge-2",
                "resolution": "executed", "note": "the card statement shows the charge",
                "result": null}),
    )
    .await?;
    let settled = agent.charge(7.0, "demo-charge-2").await?;
    shown.reconciled_text = text(&settled);
    say(&format!(
        "   The operator checks the card statement and reconciles the key as executed. The agent's next \
         retry is told: \"{}\" Still {} executions.",
        shown.reconciled_text,
        setup.executions("charge_card")
    ));
    if setup.executions("charge_card") != 2 {
        bail!("the reconciled call ran again");
    }

    step(
        5,
        "An agent whose client speaks MCP tasks simply waits for the human.",
    );
    let created = agent
        .rpc(
            "tools/call",
            json!({"name": "charge_card",
                   "arguments": {"account": "acct_42", "amount": 12.0, "currency": "EUR"},
                   "task": {},
                   "_meta": {"dev.countersign/idempotency-key": "demo-charge-3"}}),
        )
        .await?;
    let task = created["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if task.is_empty() {
        bail!("expected a task for the held charge, got {created}");
    }
    say(&format!(
        "   The agent's client asks for a task (2025-11-25 `task`, or the 2026-07-28 tasks extension).          Instead of approval_pending it gets task {task}, \"{}\", and waits: no retry, no prompt          for the model to understand.",
        created["result"]["task"]["statusMessage"].as_str().unwrap_or_default()
    ));
    let pending = reviewer.proposals(Some("pending")).await?;
    let Some(held) = pending.first().and_then(|p| p["id"].as_str()) else {
        bail!("expected the task's proposal to wait for the reviewer");
    };
    approve(&reviewer, held).await?;
    let mut done = Value::Null;
    for _ in 0..100 {
        done = agent.rpc("tasks/get", json!({"taskId": task})).await?;
        if done["result"]["status"] != "working" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shown.task_status = done["result"]["status"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let result = agent.rpc("tasks/result", json!({"taskId": task})).await?;
    shown.task_disposition = result["result"]["_meta"]
        ["io.modelcontextprotocol/tool-approval-disposition"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    say(&format!(
        "   `{REVIEWER}` approves; the gateway runs the call itself, through the same ledger, whether or          not the agent is still connected. The task is {}, with disposition {} (SEP-2848): the tool ran          once. {} executions in all.",
        shown.task_status,
        shown.task_disposition,
        setup.executions("charge_card")
    ));
    if shown.task_status != "completed"
        || shown.task_disposition != "approved-executed"
        || setup.executions("charge_card") != 3
    {
        bail!("expected the task to complete with one more execution, got {result}");
    }

    Ok(())
}
