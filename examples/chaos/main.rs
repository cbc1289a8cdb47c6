//! The chaos driver: agents issuing keyed writes through a real gateway
//! while the gateway and its upstream are killed and faults are injected,
//! then the at-most-once invariants checked from the example server's own
//! execution record.
//!
//! ```text
//! chaos [--calls 500] [--kills 10] [--agents 8] [--seed N] [--countersign BIN]
//!       [--server BIN] [--work DIR] [--http] [--modern] [--postgres URL]
//!       [--pg-cluster main] [--approvals] [--tasks] [--budget LIMIT] [--rate CALLS_PER_SEC]
//!       [--samples FILE]
//!       [--sample-secs 60]
//!       [--json]
//! ```
//!
//! Each agent sends `charge_card` calls, one explicit idempotency key per
//! call (its arguments unique to it, the amount a sum in binary floating
//! point that needs up to 17 digits, `1944.7800000000002`), and retries each
//! key with identical arguments until it gets a definitive answer: a result,
//! or `outcome_unknown`. With `--modern` it speaks 2026-07-28 (no session,
//! the metadata headers on each request); else the handshake era. A connection error, a 5xx, `upstream_unavailable` and
//! a lost session are retried (a new session when the gateway forgot the
//! old one). Meanwhile, spread over the run, `--kills` times: the gateway
//! is killed with SIGKILL and restarted on the same data; the upstream is
//! killed with SIGKILL (the stdio children, or with `--http` the example
//! server over HTTP, restarted on its port); or a fault is injected into the
//! server (`exit_after_execute`, `delay` past the call timeout, `delay`
//! short, and with `--http` `drop_session`: executed, then the session
//! forgotten and the connection broken mid-answer).
//!
//! With `--postgres URL` two gateways share that database (in a schema of
//! the run's own): agents start on either and send a key again through the
//! other when they get no definitive answer, the kills hit either gateway,
//! and the database is restarted too (`pg_ctlcluster ... restart`).
//!
//! With `--approvals` the policies hold a third of the writes: a currency of
//! `USD` takes one reviewer, `GBP` one of group `finance` and one of group
//! `leads` (`@approvals_from`); `EUR` runs unattended. Three simulated
//! reviewers sign through the control API of either gateway, each proposal's
//! fate chosen by the seed: approved, denied, approved then withdrawn and
//! approved again, or left to expire (`approvals.pending_ttl`, 8 s). A
//! webhook receiver of the driver's own gets every notification. The agents
//! send a held key again until it runs or is refused (`approval_denied`,
//! `approval_expired`). With `--tasks` they ask for an MCP task for each
//! held call instead and poll it, on whichever gateway answers, until it
//! ends; a task that says the tool ran must have run, one that says it did
//! not must not have, and none may still be working at the end.
//!
//! With `--budget LIMIT` a budget of the tenant counts the charges' amounts
//! (`over = "deny"`, a 24h window): every gateway shares it, and a call that
//! would pass it is refused (`budget_exceeded`, a definitive answer).
//!
//! Checked at the end, from the server's record (`executions.jsonl`) and
//! the gateway's ledger:
//! - no key executed twice;
//! - no answer acknowledged as a success without an execution;
//! - no acknowledged answer that changed when the agent sent the key again:
//!   its result, but for `_meta`, byte for byte (the server's numbers and
//!   escapes as it wrote them);
//! - every key answered `outcome_unknown` is listed by `reconcile --list`;
//! - with `--budget`, the amounts of the calls that ran unattended add up to
//!   at most the limit, exactly (decimals);
//! - with `--approvals`, from the store's proposals, every gateway's audit
//!   log and the webhook receiver: no execution of a held call without a
//!   consumed proposal whose approvals meet its quorum; every consumed
//!   proposal's call ran once, or is an unknown outcome `reconcile --list`
//!   lists; no denied or expired call ran; `audit verify --reviewers` passes
//!   on every log; every proposal's `proposal_created` event reached the
//!   receiver, under one event id.
//!
//! A soak is a run with `--kills 0`, a steady `--rate` and `--samples FILE`:
//! every `--sample-secs` each gateway's resident memory, open descriptors,
//! threads, runtime tasks (`countersign_runtime_tasks`), store size,
//! queued notifications and pending proposals are appended to FILE (CSV);
//! traces go to the driver's own collector. `benches/soak.sh` runs it and
//! plots the file.
//!
//! Everything runs on loopback, bounded in calls and time (10 minutes, or
//! `--deadline-secs`).
//! Prints a summary (one JSON object with `--json`) and exits 1 when an
//! invariant is broken.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod passkey;
mod review;
mod sample;

const TOKEN: &str = "chaos-agent-token";
/// The sampler's `/metrics` token (a soak).
const METRICS_TOKEN: &str = "chaos-metrics-token";

fn sha_of(text: &str) -> String {
    use std::fmt::Write;
    let digest = <sha2::Sha256 as sha2::Digest>::digest(text.as_bytes());
    digest.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}
/// How long a run may take before it is called broken (`--deadline-secs`).
static DEADLINE_SECS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(600);

fn deadline() -> Duration {
    Duration::from_secs(DEADLINE_SECS.load(Ordering::SeqCst))
}

struct Opts {
    calls: usize,
    kills: usize,
    agents: usize,
    seed: u64,
    countersign: PathBuf,
    server: PathBuf,
    work: Option<PathBuf>,
    json: bool,
    http: bool,
    /// `--modern`: the agents speak 2026-07-28.
    modern: bool,
    /// `--postgres URL`: two gateways on this database (a schema of the
    /// run's own), instead of one on redb.
    postgres: Option<String>,
    /// `--tasks` (with `--approvals`): the agents ask for an MCP task for
    /// each held call (2025-11-25 `task`, or the 2026-07-28 extension) and
    /// wait on it instead of sending the call again.
    tasks: bool,
    /// `--approvals`: a third of the writes held, decided by simulated
    /// reviewers.
    approvals: bool,
    /// `--rate`: calls started per second, all agents together (0: as fast
    /// as they go).
    rate: f64,
    /// `--samples FILE`: the soak's samples (CSV).
    samples: Option<PathBuf>,
    /// `--sample-secs`.
    sample_secs: u64,
    /// `--pg-cluster`: the local cluster `db_restart` restarts (`main`).
    pg_cluster: String,
    /// `--budget LIMIT`: the tenant's budget of charges (a decimal).
    budget: Option<String>,
}

fn opts() -> Result<Opts, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // target/<profile>/examples/chaos: the binaries are one level up, and
    // the example server is beside this one.
    let examples = exe.parent().map(Path::to_owned).unwrap_or_default();
    let profile = examples.parent().map(Path::to_owned).unwrap_or_default();
    let mut o = Opts {
        calls: 500,
        kills: 10,
        agents: 8,
        seed: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
        countersign: profile.join("countersign"),
        server: examples.join("payments_server"),
        work: None,
        json: false,
        http: false,
        modern: false,
        postgres: None,
        approvals: false,
        tasks: false,
        rate: 0.0,
        samples: None,
        sample_secs: 60,
        pg_cluster: "main".into(),
        budget: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--calls" => o.calls = value()?.parse().map_err(|e| format!("--calls: {e}"))?,
            "--kills" => o.kills = value()?.parse().map_err(|e| format!("--kills: {e}"))?,
            "--agents" => o.agents = value()?.parse().map_err(|e| format!("--agents: {e}"))?,
            "--seed" => o.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--countersign" => o.countersign = value()?.into(),
            "--server" => o.server = value()?.into(),
            "--work" => o.work = Some(value()?.into()),
            "--json" => o.json = true,
            "--http" => o.http = true,
            "--modern" => o.modern = true,
            "--deadline-secs" => DEADLINE_SECS.store(
                value()?
                    .parse()
                    .map_err(|e| format!("--deadline-secs: {e}"))?,
                Ordering::SeqCst,
            ),
            "--postgres" => o.postgres = Some(value()?),
            "--approvals" => o.approvals = true,
            "--tasks" => o.tasks = true,
            "--budget" => {
                let limit = value()?;
                limit
                    .parse::<rust_decimal::Decimal>()
                    .map_err(|e| format!("--budget: {e}"))?;
                o.budget = Some(limit);
            }
            "--pg-cluster" => o.pg_cluster = value()?,
            "--rate" => o.rate = value()?.parse().map_err(|e| format!("--rate: {e}"))?,
            "--samples" => o.samples = Some(value()?.into()),
            "--sample-secs" => {
                o.sample_secs = value()?
                    .parse()
                    .map_err(|e| format!("--sample-secs: {e}"))?
            }
            other => {
                return Err(format!(
                    "unknown argument `{other}` (see the doc comment of examples/chaos/main.rs)"
                ))
            }
        }
    }
    if o.agents == 0 || o.calls < o.agents {
        return Err("--agents must be at least 1 and at most --calls".into());
    }
    for (what, p) in [("--countersign", &o.countersign), ("--server", &o.server)] {
        if !p.is_file() {
            return Err(format!(
                "{what} `{}` is not there: cargo build --bins --examples",
                p.display()
            ));
        }
    }
    Ok(o)
}

/// `--approvals`: `EUR` runs unattended, `USD` takes one reviewer, `GBP`
/// one of `finance` and one of `leads`; every other action is allowed.
const APPROVAL_POLICIES: &str = r#"@id("eur-unattended")
permit (principal, action == Action::"call", resource)
when { context.arguments has currency && context.arguments.currency == "EUR" };

@id("usd-one-reviewer")
permit (principal, action == Action::"call", resource)
when { context.approved && context.arguments has currency && context.arguments.currency == "USD" };

@id("gbp-finance-and-leads")
@approvals_from("finance, leads")
permit (principal, action == Action::"call", resource)
when { context.approved && context.arguments has currency && context.arguments.currency == "GBP" };

@id("everything-else")
permit (principal, action, resource)
unless { action == Action::"call" };
"#;

/// `--approvals`: the reviewers besides `chaos-reviewer` (no group), and
/// their groups.
const REVIEWERS: [(&str, &str); 2] = [("chaos-finance", "finance"), ("chaos-lead", "leads")];

/// The currency of call `k` with `--approvals`: every third is held, half
/// of those for two reviewers.
fn currency_of(k: usize, approvals: bool) -> &'static str {
    match (approvals, k % 3, (k / 3) % 2) {
        (true, 0, 0) => "USD",
        (true, 0, _) => "GBP",
        _ => "EUR",
    }
}

/// A small deterministic generator (xorshift64*), so a run can be repeated
/// with its `--seed`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0.max(1);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

struct Setup {
    dir: PathBuf,
    /// One config per gateway (two on PostgreSQL).
    configs: Vec<PathBuf>,
    record: PathBuf,
    faults: PathBuf,
    /// Each gateway's `/mcp/payments`.
    urls: Vec<String>,
    countersign: PathBuf,
    server: PathBuf,
    /// With `--http`: the example server's address.
    upstream: Option<String>,
    reviewer_key: PathBuf,
}

impl Setup {
    fn write(
        dir: &Path,
        o: &Opts,
        hook: Option<&str>,
        console: Option<&str>,
    ) -> std::io::Result<Setup> {
        let policies = dir.join("policies");
        std::fs::create_dir_all(&policies)?;
        std::fs::write(
            policies.join("all.cedar"),
            if o.approvals {
                APPROVAL_POLICIES
            } else {
                "@id(\"allow-all\")\npermit (principal, action, resource);\n"
            },
        )?;
        // A reviewer, to list unknown outcomes through a running gateway
        // (a PostgreSQL ledger is not read offline).
        let reviewer_key = dir.join("chaos-reviewer.key");
        if !reviewer_key.exists() {
            let out = Command::new(&o.countersign)
                .args(["keygen", "--name", "chaos-reviewer", "--out"])
                .arg(&reviewer_key)
                .output()?;
            if !out.status.success() {
                return Err(std::io::Error::other("keygen failed"));
            }
            let mut reviewers = String::from_utf8_lossy(&out.stdout).into_owned();
            if o.approvals {
                // Two more reviewers, one per group a `GBP` call needs.
                for (name, group) in REVIEWERS {
                    let key = dir.join(format!("{name}.key"));
                    let out = Command::new(&o.countersign)
                        .args(["keygen", "--name", name, "--out"])
                        .arg(&key)
                        .output()?;
                    if !out.status.success() {
                        return Err(std::io::Error::other("keygen failed"));
                    }
                    reviewers.push('\n');
                    reviewers.push_str(
                        &String::from_utf8_lossy(&out.stdout)
                            .replace("groups = []", &format!("groups = [\"{group}\"]")),
                    );
                }
            }
            if let Some(entry) = console {
                reviewers.push('\n');
                reviewers.push_str(entry);
            }
            std::fs::write(policies.join("reviewers.toml"), reviewers)?;
        }
        let record = dir.join("executions.jsonl");
        let faults = dir.join("faults.json");
        std::fs::write(&faults, "{}")?;
        let sha = sha_of(TOKEN);
        let q = |p: &Path| format!("{:?}", p.display().to_string());
        let upstream = if o.http {
            Some(format!(
                "127.0.0.1:{}",
                std::net::TcpListener::bind("127.0.0.1:0")?
                    .local_addr()?
                    .port()
            ))
        } else {
            None
        };
        let server_table = match &upstream {
            Some(addr) => format!("url = \"http://{addr}/mcp\"\n"),
            None => format!(
                "command = {}\nargs = [\"--record\", {}, \"--faults\", {}]\n",
                q(&o.server),
                q(&record),
                q(&faults)
            ),
        };
        let store = match &o.postgres {
            None => String::new(),
            Some(base) => {
                // A schema of this run's own, made before the gateways
                // start (they migrate it).
                let schema = format!("chaos_{}", o.seed % 1_000_000_007);
                // The database may be restarting (another run's action):
                // asked again for up to 20 s.
                let mut made = None;
                for _ in 0..40 {
                    let status = Command::new("psql")
                        .args([base.as_str(), "-q", "-c"])
                        .arg(format!(
                            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};"
                        ))
                        .status()?;
                    if status.success() {
                        made = Some(status);
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
                if made.is_none() {
                    return Err(std::io::Error::other(format!(
                        "psql could not create schema {schema} in {base}"
                    )));
                }
                let sep = if base.contains('?') { '&' } else { '?' };
                format!(
                    "[store]\nurl = \"{base}{sep}options=-c%20search_path%3D{schema}\"\nlease = \"2s\"\n\n"
                )
            }
        };
        let gateways = if o.postgres.is_some() { 2 } else { 1 };
        let approvals = match (o.approvals, o.tasks) {
            // A claim left by a killed gateway is taken over within seconds.
            (true, true) => {
                "[approvals]\nhold = \"0s\"\npending_ttl = \"8s\"\n\n[review]\nenabled = true\n\n\
                             [tasks]\npoll_interval = \"300ms\"\nclaim_timeout = \"5s\"\n\n"
            }
            (true, false) => {
                "[approvals]\nhold = \"0s\"\npending_ttl = \"8s\"\n\n[review]\nenabled = true\n\n"
            }
            _ => "[approvals]\nhold = \"0s\"\n\n",
        };
        let mut notify = match hook {
            Some(url) => format!(
                "[[notify.webhooks]]\nname = \"chaos\"\nurl = \"{url}\"\nsecret = \"chaos-webhook-secret\"\n\n"
            ),
            None => String::new(),
        };
        if let (Some(url), Some(_)) = (hook, &o.samples) {
            // A soak: metrics for the sampler, traces to the driver's own
            // collector, and answers kept ten minutes (the ledger reaches
            // its steady size within the hour).
            let collector = url.trim_end_matches("/hook");
            notify.push_str(&format!(
                "[metrics]\ntoken_sha256 = \"{}\"\n\n[telemetry]\nendpoint = \"{collector}\"\n\n[idempotency]\nretention = \"10m\"\n\n",
                sha_of(METRICS_TOKEN)
            ));
        }
        if let Some(limit) = &o.budget {
            notify.push_str(&format!(
                "[[budgets]]\nname = \"chaos\"\ntools = [\"payments/charge_card\"]\namount = \"/amount\"\n\
                 per = \"tenant\"\nwindow = \"24h\"\nlimit = \"{limit}\"\nover = \"deny\"\n\n"
            ));
        }
        let mut configs = Vec::new();
        let mut urls = Vec::new();
        for g in 0..gateways {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let config = format!(
                "[gateway]\nlisten = \"127.0.0.1:{port}\"\ndata_dir = {}\npolicies = {}\nshutdown_grace = \"300ms\"\n\n\
                 [[identities]]\ntoken_sha256 = \"{sha}\"\nprincipal = \"chaos\"\ntenant = \"chaos\"\n\n\
                 {approvals}[retry]\nmax_attempts = 1\n\n[circuit]\nfailure_threshold = 1000\n\n\
                 {notify}{store}[servers.payments]\n{server_table}call_timeout = \"2s\"\n",
                q(&dir.join(format!("data-{g}"))),
                q(&policies),
            );
            let path = dir.join(format!("countersign-{g}.toml"));
            std::fs::write(&path, config)?;
            configs.push(path);
            urls.push(format!("http://127.0.0.1:{port}/mcp/payments"));
        }
        Ok(Setup {
            dir: dir.to_owned(),
            configs,
            record,
            faults,
            urls,
            countersign: o.countersign.clone(),
            server: o.server.clone(),
            upstream,
            reviewer_key: dir.join("chaos-reviewer.key"),
        })
    }

    /// With `--http`: the example server over HTTP on its port.
    fn start_upstream(&self) -> Result<Option<Child>, String> {
        let Some(addr) = &self.upstream else {
            return Ok(None);
        };
        let child = Command::new(&self.server)
            .args(["--http", addr, "--record"])
            .arg(&self.record)
            .arg("--faults")
            .arg(&self.faults)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start the example server: {e}"))?;
        for _ in 0..400 {
            if std::net::TcpStream::connect(addr).is_ok() {
                return Ok(Some(child));
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        Err("the example server did not listen within 10 s".into())
    }

    fn start_gateway(&self, g: usize) -> Result<Child, String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("gateway-{g}.log")))
            .map_err(|e| e.to_string())?;
        let child = Command::new(&self.countersign)
            .args(["serve", "--config"])
            .arg(&self.configs[g])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start gateway {g}: {e}"))?;
        let addr = self.urls[g]
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap_or("")
            .to_owned();
        for _ in 0..800 {
            if std::net::TcpStream::connect(&addr).is_ok() {
                return Ok(child);
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        Err(format!(
            "gateway {g} did not listen within 20 s (see gateway-{g}.log)"
        ))
    }
}

/// What the agents saw, shared with the checks.
#[derive(Default)]
struct Seen {
    /// Key → the first success text acknowledged for it.
    acked: HashMap<String, String>,
    /// Keys answered `outcome_unknown`.
    unknown: HashSet<String>,
    /// Acknowledged answers that changed on a later send.
    changed: Vec<String>,
    /// Keys refused by their review (`approval_denied`,
    /// `approval_expired`), with the code.
    refused: HashMap<String, String>,
    /// Sends answered `approval_pending`.
    pending_answers: usize,
    /// Sends in all (retries included).
    sends: usize,
    /// `--tasks`: key → how its task ended (status, disposition).
    tasks: HashMap<String, (String, String)>,
    /// `--tasks`: keys whose task was still working at the deadline.
    tasks_lost: Vec<String>,
}

struct Agent {
    http: reqwest::Client,
    /// The gateways; a send that gets no definitive answer is sent again
    /// through the next one (its own session there).
    urls: Vec<String>,
    current: usize,
    session: Option<String>,
    /// 2026-07-28: no session, the metadata on each request.
    modern: bool,
}

enum Sent {
    /// A result: (is an error, the result's members but `_meta`, each as
    /// the gateway sent its bytes).
    Answer(bool, String),
    /// Held for a review: send again later.
    Pending,
    /// Its review refused it (the code): nothing runs, ever.
    Refused(String),
    /// No definitive answer: send again.
    Retry,
    /// `--tasks`: the held call became this task.
    Task(String),
}

impl Agent {
    async fn initialize(&mut self) -> bool {
        self.session = None;
        let body = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"chaos","version":"1"}}});
        let Ok(resp) = self.post(&body).send().await else {
            return false;
        };
        let sid = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if !resp.status().is_success() || sid.is_none() {
            return false;
        }
        self.session = sid;
        let _ = self
            .post(&json!({"jsonrpc":"2.0","method":"notifications/initialized"}))
            .send()
            .await;
        true
    }

    fn post(&self, body: &Value) -> reqwest::RequestBuilder {
        let mut r = self
            .http
            .post(&self.urls[self.current])
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .timeout(Duration::from_secs(20))
            .body(body.to_string());
        if let Some(s) = &self.session {
            r = r.header("mcp-session-id", s);
        }
        r
    }

    async fn send(&mut self, key: &str, args: &Value, task: bool) -> Sent {
        if !self.modern && self.session.is_none() && !self.initialize().await {
            return Sent::Retry;
        }
        let mut meta = json!({"dev.countersign/idempotency-key": key});
        if self.modern {
            meta["io.modelcontextprotocol/protocolVersion"] = json!("2026-07-28");
            meta["io.modelcontextprotocol/clientCapabilities"] = match task {
                true => json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}),
                false => json!({}),
            };
            meta["io.modelcontextprotocol/clientInfo"] = json!({"name": "chaos", "version": "1"});
        }
        let mut body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
            "name":"charge_card","arguments":args,"_meta":meta}});
        if task && !self.modern {
            body["params"]["task"] = json!({});
        }
        let mut request = self.post(&body);
        if self.modern {
            request = request
                .header("mcp-protocol-version", "2026-07-28")
                .header("mcp-method", "tools/call")
                .header("mcp-name", "charge_card");
        }
        let Ok(resp) = request.send().await else {
            return Sent::Retry;
        };
        if resp.status().as_u16() == 404 {
            // The gateway restarted and forgot the session.
            self.session = None;
            return Sent::Retry;
        }
        if !resp.status().is_success() {
            return Sent::Retry;
        }
        let sse = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let Ok(text) = resp.text().await else {
            return Sent::Retry;
        };
        let data = if sse {
            countersign::wire::sse::last_data(&text)
                .unwrap_or("")
                .to_owned()
        } else {
            text
        };
        let Ok(v) = serde_json::from_str::<Value>(&data) else {
            return Sent::Retry;
        };
        let result = &v["result"];
        if result.is_null() {
            return Sent::Retry;
        }
        let task_id = match self.modern {
            true => (result["resultType"] == "task").then(|| result["taskId"].as_str()),
            false => Some(result["task"]["taskId"].as_str()),
        };
        if let Some(Some(id)) = task_id {
            return Sent::Task(id.to_owned());
        }
        let code = result["structuredContent"]["countersign"]["code"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        // What a replay must repeat: the result as the gateway sent its
        // bytes, `_meta` aside (a replay is marked there).
        let text = countersign::wire::jsonrpc::Message::parse(data.as_bytes())
            .ok()
            .and_then(|m| m.result)
            .and_then(|r| {
                let members = countersign::wire::members::members(r.get())?;
                Some(
                    members
                        .iter()
                        .filter(|m| m.key != "_meta")
                        .map(|m| format!("{}:{}", m.raw_key, m.value))
                        .collect::<Vec<_>>()
                        .join(","),
                )
            })
            .unwrap_or_default();
        let is_error = result["isError"] == true;
        match code.as_str() {
            "approval_pending" => return Sent::Pending,
            "approval_denied" | "approval_expired" | "budget_exceeded" => {
                return Sent::Refused(code)
            }
            _ => {}
        }
        if is_error && code != "outcome_unknown" {
            // upstream_unavailable and the like: nothing ran; send again.
            return Sent::Retry;
        }
        Sent::Answer(is_error, text)
    }
}

impl Agent {
    /// One `tasks/*` request to the current gateway; `None`: no answer
    /// (the gateway was killed, the session is gone).
    async fn task_request(&mut self, method: &str, id: &str) -> Option<Value> {
        if !self.modern && self.session.is_none() && !self.initialize().await {
            return None;
        }
        let mut params = json!({"taskId": id});
        if self.modern {
            params["_meta"] = json!({
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
            });
        }
        let mut request =
            self.post(&json!({"jsonrpc":"2.0","id":2,"method":method,"params":params}));
        if self.modern {
            request = request
                .header("mcp-protocol-version", "2026-07-28")
                .header("mcp-method", method)
                .header("mcp-name", id);
        }
        let resp = request.send().await.ok()?;
        if resp.status().as_u16() == 404 {
            self.session = None;
            return None;
        }
        let sse = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let text = resp.text().await.ok()?;
        let data = match sse {
            true => countersign::wire::sse::last_data(&text)?.to_owned(),
            false => text,
        };
        let v: Value = serde_json::from_str(&data).ok()?;
        v.get("result").cloned()
    }

    /// Wait for task `id` to end, on whichever gateway answers: its status
    /// and disposition, or `None` at the deadline.
    async fn await_task(&mut self, id: &str, started: Instant) -> Option<(String, String)> {
        while started.elapsed() < deadline() {
            let Some(t) = self.task_request("tasks/get", id).await else {
                if self.urls.len() > 1 {
                    self.session = None;
                    self.current = (self.current + 1) % self.urls.len();
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let status = t["status"].as_str().unwrap_or("").to_owned();
            if status == "working" || status.is_empty() {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            let result = match (self.modern, status.as_str()) {
                (true, _) => t["result"].clone(),
                (false, "completed") => match self.task_request("tasks/result", id).await {
                    Some(r) => r,
                    // The gateway was killed between the two requests: the
                    // task is the store's, so ask again (on the other
                    // gateway when there are two), as for `tasks/get`.
                    None => {
                        if self.urls.len() > 1 {
                            self.session = None;
                            self.current = (self.current + 1) % self.urls.len();
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                },
                (false, _) => Value::Null,
            };
            let disposition = result["_meta"]["io.modelcontextprotocol/tool-approval-disposition"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            return Some((status, disposition));
        }
        None
    }
}

/// The amount of call `k`: a sum in binary floating point, whose shortest
/// text often needs 17 digits (a parser that is not correctly rounded
/// moves it to a neighbouring double).
fn amount_of(k: usize) -> f64 {
    1944.41 + k as f64 * 0.37
}

/// How every agent behaves.
#[derive(Clone, Copy)]
struct Style {
    /// 2026-07-28 rather than the handshake era.
    modern: bool,
    /// A third of the calls held (`--approvals`).
    approvals: bool,
    /// Held calls asked as tasks (`--tasks`).
    tasks: bool,
    /// One call per this long, per agent (`--rate`).
    pace: Option<Duration>,
}

async fn agent(
    n: usize,
    keys: Vec<usize>,
    urls: Vec<String>,
    style: Style,
    seen: Arc<Mutex<Seen>>,
    done: Arc<AtomicUsize>,
) {
    let Style {
        modern,
        approvals,
        tasks,
        pace,
    } = style;
    let current = n % urls.len();
    let mut a = Agent {
        http: reqwest::Client::new(),
        urls,
        current,
        session: None,
        modern,
    };
    let started = Instant::now();
    for (i, k) in keys.into_iter().enumerate() {
        // A steady rate: call i of this agent starts no sooner than i
        // intervals after the first.
        if let Some(p) = pace {
            let at = started + p.saturating_mul(u32::try_from(i).unwrap_or(u32::MAX));
            tokio::time::sleep_until(at.into()).await;
        }
        let key = format!("chaos-{k}");
        let args = json!({"account": format!("acct-{n}"), "amount": amount_of(k), "currency": currency_of(k, approvals)});
        let mut acked: Option<String> = None;
        loop {
            if started.elapsed() > deadline() {
                return;
            }
            let held = currency_of(k, approvals) != "EUR";
            let sent = a.send(&key, &args, tasks && held).await;
            seen.lock().map(|mut s| s.sends += 1).ok();
            match sent {
                Sent::Pending => {
                    // Asked again on the same session and gateway (a new
                    // session per wait would pile sessions up to the
                    // identity's limit); the review is the store's, and
                    // either gateway's reviewers decide it.
                    seen.lock().map(|mut s| s.pending_answers += 1).ok();
                    tokio::time::sleep(Duration::from_millis(150)).await;
                }
                Sent::Refused(code) => {
                    seen.lock()
                        .map(|mut s| s.refused.insert(key.clone(), code))
                        .ok();
                    break;
                }
                Sent::Task(id) => {
                    match a.await_task(&id, started).await {
                        Some(end) => {
                            seen.lock()
                                .map(|mut s| {
                                    // What the task says became of the call
                                    // counts as its answer: acknowledged when
                                    // it ran, unknown when it may have.
                                    match end.1.as_str() {
                                        "outcome-unknown" => {
                                            s.unknown.insert(key.clone());
                                        }
                                        "approved-executed" => {
                                            s.acked.insert(key.clone(), format!("task {id}"));
                                        }
                                        _ => {}
                                    }
                                    s.tasks.insert(key.clone(), end)
                                })
                                .ok();
                        }
                        None => {
                            seen.lock().map(|mut s| s.tasks_lost.push(key.clone())).ok();
                            return;
                        }
                    }
                    break;
                }
                Sent::Retry => {
                    if a.urls.len() > 1 {
                        // Leaving this gateway: end the session there, as a
                        // good client does (else it stays, with its stdio
                        // child, until `session_idle_timeout`).
                        if let Some(sid) = a.session.take() {
                            let _ = a
                                .http
                                .delete(&a.urls[a.current])
                                .bearer_auth(TOKEN)
                                .header("mcp-session-id", sid)
                                .timeout(Duration::from_secs(2))
                                .send()
                                .await;
                        }
                        a.current = (a.current + 1) % a.urls.len();
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Sent::Answer(true, text) => {
                    seen.lock()
                        .map(|mut s| {
                            if let Some(first) = &acked {
                                s.changed.push(format!("{key}: `{first}` then `{text}`"));
                            }
                            s.unknown.insert(key.clone())
                        })
                        .ok();
                    break;
                }
                Sent::Answer(false, text) => match &acked {
                    // Sent again once it was acknowledged: it must be the
                    // same answer, replayed.
                    None => {
                        acked = Some(text.clone());
                        seen.lock()
                            .map(|mut s| s.acked.insert(key.clone(), text))
                            .ok();
                    }
                    Some(first) => {
                        if *first != text {
                            seen.lock()
                                .map(|mut s| {
                                    s.changed.push(format!("{key}: `{first}` then `{text}`"))
                                })
                                .ok();
                        }
                        break;
                    }
                },
            }
        }
        done.fetch_add(1, Ordering::SeqCst);
    }
}

/// With `--http`: start the example server again when it exited (after
/// `exit_after_execute`), as a supervisor would.
fn revive(setup: &Setup, upstream: &mut Option<Child>) -> Result<(), String> {
    if let Some(u) = upstream.as_mut() {
        if u.try_wait().ok().flatten().is_some() {
            *upstream = setup.start_upstream()?;
        }
    }
    Ok(())
}

/// A child killed and reaped when it is dropped.
struct Reaper(Option<Child>);

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Kill the stdio children the gateway runs for this work folder.
fn kill_children(setup: &Setup) {
    let _ = Command::new("pkill")
        .args(["-9", "-f"])
        .arg(format!(
            "payments_server --record {}",
            setup.record.display()
        ))
        .status();
}

fn executions(record: &Path) -> Vec<Value> {
    std::fs::read_to_string(record)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "executed" && e["tool"] == "charge_card")
        .collect()
}

#[tokio::main]
async fn main() {
    let code = match run().await {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("chaos: {e}");
            2
        }
    };
    std::process::exit(code);
}

async fn run() -> Result<bool, String> {
    let o = opts()?;
    let dir = match &o.work {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("countersign-chaos-{}", o.seed)),
    };
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // With `--approvals`, every notification goes to a receiver of ours.
    let hook = Arc::new(review::Hook::default());
    let hook_url = match o.approvals || o.samples.is_some() {
        true => Some(review::receiver(hook.clone()).await?),
        false => None,
    };
    // A reviewer with a passkey, for the review console.
    let passkey = Arc::new(passkey::SoftKey::new()?);
    let entry = passkey.entry("chaos-console", "leads");
    let setup = Setup::write(
        &dir,
        &o,
        hook_url.as_deref(),
        o.approvals.then_some(entry.as_str()),
    )
    .map_err(|e| e.to_string())?;
    // Reaped however the run ends (an early error included): an orphan
    // example server would outlive the run and its folder.
    let mut upstream = Reaper(setup.start_upstream()?);
    let mut gateways = Vec::new();
    for g in 0..setup.urls.len() {
        gateways.push(setup.start_gateway(g)?);
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let done = Arc::new(AtomicUsize::new(0));
    let stop_sampler = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = o.samples.clone().map(|file| {
        let targets = gateways
            .iter()
            .enumerate()
            .map(|(g, c)| sample::Target {
                pid: c.id(),
                base: setup.urls[g].trim_end_matches("/mcp/payments").to_owned(),
                data: setup.dir.join(format!("data-{g}")),
            })
            .collect();
        let postgres = o
            .postgres
            .clone()
            .map(|url| (url, format!("chaos_{}", o.seed % 1_000_000_007)));
        tokio::spawn(sample::sampler(
            file,
            Duration::from_secs(o.sample_secs.max(1)),
            targets,
            postgres,
            METRICS_TOKEN,
            done.clone(),
            stop_sampler.clone(),
        ))
    });
    let bases: Vec<String> = setup
        .urls
        .iter()
        .map(|u| u.trim_end_matches("/mcp/payments").to_owned())
        .collect();
    let decisions = Arc::new(Mutex::new(review::Decisions::default()));
    let stop_reviewers = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reviewers = o.approvals.then(|| {
        tokio::spawn(review::reviewers(
            setup.dir.clone(),
            bases.clone(),
            o.seed,
            passkey.clone(),
            stop_reviewers.clone(),
            decisions.clone(),
        ))
    });
    let mut tasks = Vec::new();
    for n in 0..o.agents {
        let keys: Vec<usize> = (0..o.calls).filter(|k| k % o.agents == n).collect();
        tasks.push(tokio::spawn(agent(
            n,
            keys,
            setup.urls.clone(),
            Style {
                modern: o.modern,
                approvals: o.approvals,
                tasks: o.tasks,
                pace: (o.rate > 0.0).then(|| Duration::from_secs_f64(o.agents as f64 / o.rate)),
            },
            seen.clone(),
            done.clone(),
        )));
    }
    // The chaos: spread over the calls, one action each time another
    // calls/(kills+1) keys are done.
    let mut rng = Rng(o.seed);
    let mut counts: HashMap<&'static str, usize> = HashMap::new();
    let started = Instant::now();
    for i in 0..o.kills {
        let at = (i + 1) * o.calls / (o.kills + 1);
        while done.load(Ordering::SeqCst) < at && started.elapsed() < deadline() {
            revive(&setup, &mut upstream.0)?;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A little later than the threshold, at a random moment.
        tokio::time::sleep(Duration::from_millis(rng.below(40))).await;
        let mut choices = vec![
            "gateway_sigkill",
            "gateway_sigkill",
            if o.http {
                "upstream_sigkill"
            } else {
                "child_sigkill"
            },
            "exit_after_execute",
            if rng.below(2) == 0 {
                "delay_past_timeout"
            } else {
                "delay"
            },
        ];
        if o.http {
            choices.push("drop_session");
        }
        if o.postgres.is_some() {
            choices.push("db_restart");
        }
        let action = choices[rng.below(choices.len() as u64) as usize];
        *counts.entry(action).or_default() += 1;
        match action {
            "gateway_sigkill" => {
                // Either gateway, at random; the other keeps serving.
                let g = rng.below(gateways.len() as u64) as usize;
                let _ = gateways[g].kill();
                let _ = gateways[g].wait();
                gateways[g] = setup.start_gateway(g)?;
            }
            "db_restart" => {
                let restarted = Command::new("sh")
                    .args([
                        "-c",
                        &format!(
                            "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) {} restart",
                            o.pg_cluster
                        ),
                    ])
                    .status()
                    .map_err(|e| format!("cannot restart PostgreSQL: {e}"))?;
                if !restarted.success() {
                    return Err("pg_ctlcluster restart failed".into());
                }
            }
            "child_sigkill" => kill_children(&setup),
            "upstream_sigkill" => {
                if let Some(mut u) = upstream.0.take() {
                    let _ = u.kill();
                    let _ = u.wait();
                }
                upstream.0 = setup.start_upstream()?;
            }
            "drop_session" => {
                let _ = std::fs::write(
                    &setup.faults,
                    json!({"charge_card": {"fault": "drop_session"}}).to_string(),
                );
            }
            "exit_after_execute" => {
                let _ = std::fs::write(
                    &setup.faults,
                    json!({"charge_card": {"fault": "exit_after_execute"}}).to_string(),
                );
            }
            "delay_past_timeout" => {
                let _ = std::fs::write(
                    &setup.faults,
                    json!({"charge_card": {"fault": "delay", "delay_ms": 2500}}).to_string(),
                );
            }
            _ => {
                let _ = std::fs::write(
                    &setup.faults,
                    json!({"charge_card": {"fault": "delay", "delay_ms": 300}}).to_string(),
                );
            }
        }
    }
    while !tasks.iter().all(|t| t.is_finished()) {
        revive(&setup, &mut upstream.0)?;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop_reviewers.store(true, Ordering::SeqCst);
    stop_sampler.store(true, Ordering::SeqCst);
    if let Some(s) = sampler {
        s.await.map_err(|e| e.to_string())??;
    }
    if let Some(r) = reviewers {
        r.await.map_err(|e| e.to_string())??;
    }
    let finished = done.load(Ordering::SeqCst);
    // Every proposal, from the store, while gateway 0 runs.
    let proposals = match o.approvals {
        true => review::all_proposals(&setup.dir, &bases[0]).await?,
        false => Vec::new(),
    };
    // Notifications go out at least once, after their commit: give the
    // queue (retried with backoff after a kill) up to 30 s to drain.
    if o.approvals {
        review::await_delivery(&proposals, &hook, Duration::from_secs(30)).await;
    }
    let base0 = setup.urls[0].trim_end_matches("/mcp/payments").to_owned();
    let list_pg = || -> Result<std::process::Output, String> {
        Command::new(&setup.countersign)
            .args(["reconcile", "--list", "--reviewer-key"])
            .arg(&setup.reviewer_key)
            .args(["--gateway", base0.as_str()])
            .output()
            .map_err(|e| e.to_string())
    };
    let keys_of = |out: &std::process::Output| -> HashSet<String> {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split('\t').nth(2).map(str::to_owned))
            .collect()
    };
    let unknown_seen: HashSet<String> = seen.lock().map_err(|_| "poisoned")?.unknown.clone();
    let listed = if o.postgres.is_some() {
        // The shared ledger, through gateway 0 while it runs. A call whose
        // end the database refused while it restarted is recorded by the
        // gateway within seconds of the database's return: list again for
        // up to 20 s until every unknown answer is there.
        let mut out = list_pg()?;
        let until = Instant::now() + Duration::from_secs(20);
        while out.status.success()
            && !unknown_seen.is_subset(&keys_of(&out))
            && Instant::now() < until
        {
            tokio::time::sleep(Duration::from_millis(500)).await;
            out = list_pg()?;
        }
        out
    } else {
        for gw in &mut gateways {
            let _ = Command::new("kill").arg(gw.id().to_string()).status();
            let _ = gw.wait();
        }
        // Stopped cleanly, then the ledger read offline.
        Command::new(&setup.countersign)
            .args(["reconcile", "--list", "--config"])
            .arg(&setup.configs[0])
            .output()
            .map_err(|e| e.to_string())?
    };
    if !listed.status.success() {
        return Err(format!(
            "reconcile --list failed: {}",
            String::from_utf8_lossy(&listed.stderr)
        ));
    }
    for mut gw in gateways {
        let _ = Command::new("kill").arg(gw.id().to_string()).status();
        let _ = gw.wait();
    }
    let listed_keys = keys_of(&listed);

    let seen = seen.lock().map_err(|_| "poisoned")?;
    let runs = executions(&setup.record);
    let mut per_call: HashMap<(String, u64), usize> = HashMap::new();
    for e in &runs {
        let account = e["arguments"]["account"].as_str().unwrap_or("").to_owned();
        // The double the server read, by its bits: a call whose amount
        // reached it as a neighbouring double is not the call sent.
        let amount = e["arguments"]["amount"].as_f64().map_or(0, f64::to_bits);
        *per_call.entry((account, amount)).or_default() += 1;
    }
    // Whether the call under `key` (its arguments are its own) ran.
    let ran = |key: &str| {
        let k: usize = key
            .trim_start_matches("chaos-")
            .parse()
            .unwrap_or(usize::MAX);
        per_call.contains_key(&(format!("acct-{}", k % o.agents), amount_of(k).to_bits()))
    };
    let duplicates: Vec<String> = per_call
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|((a, m), n)| format!("{a} amount {}: {n} executions", f64::from_bits(*m)))
        .collect();
    let lost_acks: Vec<String> = seen.acked.keys().filter(|key| !ran(key)).cloned().collect();
    let unlisted: Vec<String> = seen
        .unknown
        .iter()
        .filter(|k| !listed_keys.contains(*k))
        .cloned()
        .collect();
    let unknown_executed = seen.unknown.iter().filter(|key| ran(key)).count();
    // Tasks: one that says the tool ran must have run; one that says it did
    // not, must not have.
    let task_contradictions: Vec<String> = seen
        .tasks
        .iter()
        .filter(|(key, (status, disposition))| match disposition.as_str() {
            "approved-executed" => !ran(key),
            "denied-not-executed" => ran(key),
            _ => status == "failed",
        })
        .map(|(key, (status, disposition))| format!("{key}: task {status} {disposition}"))
        .collect();
    // The call a key stands for (its arguments are its own).
    let call_of_key = |key: &str| -> Option<review::CallId> {
        let k: usize = key.trim_start_matches("chaos-").parse().ok()?;
        Some((format!("acct-{}", k % o.agents), amount_of(k).to_bits()))
    };
    let approvals = o.approvals.then(|| {
        let held: HashSet<review::CallId> = (0..o.calls)
            .filter(|k| currency_of(*k, true) != "EUR")
            .map(|k| (format!("acct-{}", k % o.agents), amount_of(k).to_bits()))
            .collect();
        let listed: HashSet<review::CallId> =
            listed_keys.iter().filter_map(|k| call_of_key(k)).collect();
        let refused: HashSet<review::CallId> =
            seen.refused.keys().filter_map(|k| call_of_key(k)).collect();
        let dirs: Vec<PathBuf> = (0..setup.urls.len())
            .map(|g| setup.dir.join(format!("data-{g}")).join("audit"))
            .collect();
        let verified = review::verify_logs(
            &setup.countersign,
            &dirs,
            &setup.dir.join("policies").join("reviewers.toml"),
        );
        let decisions = decisions
            .lock()
            .map(|mut d| std::mem::take(&mut *d))
            .unwrap_or_default();
        review::check(&review::Evidence {
            proposals: &proposals,
            executions: &per_call,
            held_calls: &held,
            unknown_listed: &listed,
            refused: &refused,
            hook: &hook,
            verified: &verified,
            decisions: &decisions,
        })
    });
    // The budget: what ran unattended (with --approvals, the EUR calls)
    // adds up to at most the limit, in exact decimals from the amounts'
    // shortest text (as the gateway reads them).
    let budget = o.budget.as_ref().map(|limit| {
        let limit: rust_decimal::Decimal = limit.parse().unwrap_or_default();
        let spent: rust_decimal::Decimal = runs
            .iter()
            .filter(|e| !o.approvals || e["arguments"]["currency"] == "EUR")
            .filter_map(|e| e["arguments"]["amount"].as_f64())
            .filter_map(|a| a.to_string().parse::<rust_decimal::Decimal>().ok())
            .sum();
        let refused = seen
            .refused
            .values()
            .filter(|c| *c == "budget_exceeded")
            .count();
        (
            spent <= limit,
            json!({
                "limit": limit.to_string(),
                "spent_unattended": spent.to_string(),
                "refused": refused,
                "ok": spent <= limit,
            }),
        )
    });
    let ok = finished == o.calls
        && budget.as_ref().is_none_or(|b| b.0)
        && duplicates.is_empty()
        && lost_acks.is_empty()
        && seen.changed.is_empty()
        && unlisted.is_empty()
        && task_contradictions.is_empty()
        && seen.tasks_lost.is_empty()
        && approvals.as_ref().is_none_or(|a| a.ok);
    let summary = json!({
        "ok": ok,
        "seed": o.seed,
        "calls": o.calls,
        "definitive": finished,
        "sends": seen.sends,
        "kills": o.kills,
        "actions": counts,
        "executions": runs.len(),
        "acknowledged": seen.acked.len(),
        "outcome_unknown": seen.unknown.len(),
        "outcome_unknown_that_ran": unknown_executed,
        "listed_by_reconcile": listed_keys.len(),
        "duplicates": duplicates,
        "lost_acknowledged": lost_acks,
        "changed_answers": seen.changed,
        "unknown_not_listed": unlisted,
        "seconds": started.elapsed().as_secs_f64(),
        "work": setup.dir.display().to_string(),
        "store": if o.postgres.is_some() { "postgres, two gateways" } else { "redb" },
        "era": if o.modern { "2026-07-28" } else { "handshake" },
        "refused_by_review": seen.refused.len(),
        "approval_pending_answers": seen.pending_answers,
        "approvals": approvals.map(|a| a.summary),
        "budget": budget.map(|b| b.1),
        "tasks": {
            "ended": seen.tasks.len(),
            "approved_executed": seen.tasks.values().filter(|t| t.1 == "approved-executed").count(),
            "denied_not_executed": seen.tasks.values().filter(|t| t.1 == "denied-not-executed").count(),
            "outcome_unknown": seen.tasks.values().filter(|t| t.1 == "outcome-unknown").count(),
            "contradictions": task_contradictions,
            "lost": seen.tasks_lost,
        },
    });
    if o.json {
        println!("{summary}");
    } else {
        println!(
            "{} calls ({} sends), {} chaos actions {:?}: {} executions, {} acknowledged, {} outcome_unknown ({} of them ran), \
             {} duplicates, {} acknowledged without an execution, {} answers that changed, {} unknown keys not listed by reconcile: {}",
            o.calls,
            seen.sends,
            o.kills,
            counts,
            runs.len(),
            seen.acked.len(),
            seen.unknown.len(),
            unknown_executed,
            duplicates.len(),
            lost_acks.len(),
            seen.changed.len(),
            unlisted.len(),
            if ok { "ok" } else { "BROKEN" }
        );
        if o.approvals {
            println!("approvals: {}", summary["approvals"]);
        }
        if o.tasks {
            println!("tasks: {}", summary["tasks"]);
        }
        if o.budget.is_some() {
            println!("budget: {}", summary["budget"]);
        }
    }
    Ok(ok)
}
