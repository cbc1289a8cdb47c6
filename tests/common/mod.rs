//! Shared helpers: start the real gateway binary and the real example
//! server, and speak MCP to them over real HTTP.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub mod bridge;
pub mod docs;
pub mod idp;
pub mod otlp;
pub mod pg;
pub mod pki;

/// Where `.ci/setup-peers` installs the peers no one here wrote.
pub fn peers_cache() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(".ci")
        .join("cache")
}

/// The Python with the `mcp` SDK.
pub fn peer_python() -> PathBuf {
    let p = peers_cache().join("venv").join("bin").join("python");
    assert!(
        p.exists(),
        "the Python mcp SDK is not installed: run `.ci/setup-peers` (then `cargo test` again)"
    );
    p
}

/// Run `tests/peers/SCRIPT` with the SDK's Python: (success, stdout, stderr).
pub fn run_peer_script(script: &str, args: &[&str]) -> (bool, String, String) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/peers")
        .join(script);
    let out = Command::new(peer_python())
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Run SQL in the local PostgreSQL (127.0.0.1:5432, database `test`, as
/// postgres), which must succeed; its output, trimmed.
pub fn psql(sql: &str) -> String {
    let out = Command::new("psql")
        .args([
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-d",
            "test",
            "-Atqc",
            sql,
        ])
        .output()
        .expect("psql (PostgreSQL client): `.ci/run` installs it");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

pub const TOKEN: &str = "tok-agent7";

/// One policy that permits every call unattended.
pub const ALLOW_ALL: &str = "@id(\"allow-all\")\npermit (principal, action, resource);\n";
pub const OTHER_TOKEN: &str = "tok-agent9";
/// `agent-7` again, but in tenant `globex`.
pub const GLOBEX_TOKEN: &str = "tok-agent7-globex";
/// `dev-1` of tenant `acme`, group `solo`: someone running their own agent,
/// whom the shipped policies let confirm non-destructive calls in the client.
pub const SOLO_TOKEN: &str = "tok-dev1-solo";

/// Run `countersign ARGS` (no gateway or key from the environment):
/// (success, stdout, stderr).
pub fn run_cli(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(countersign_bin())
        .args(args)
        .env_remove("COUNTERSIGN_GATEWAY")
        .env_remove("COUNTERSIGN_KEY")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`run_cli`] without blocking the async runtime.
pub async fn run_cli_async(args: &[&str]) -> (bool, String, String) {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_cli(&args)
    })
    .await
    .unwrap()
}

/// The segment files of an audit log directory, in order.
pub fn audit_segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    v.sort();
    v
}

/// Every entry of an audit log directory, in order.
pub fn audit_entries(dir: &Path) -> Vec<serde_json::Map<String, Value>> {
    audit_segments(dir)
        .iter()
        .flat_map(|s| {
            std::fs::read_to_string(s)
                .unwrap()
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Wait (up to 10 s) until `pred` holds for the gateway's audit log,
/// polling its files; panic with `what` otherwise.
pub async fn wait_for_audit(
    gw: &Gateway,
    what: &str,
    pred: impl Fn(&[serde_json::Map<String, Value>]) -> bool,
) {
    let dir = gw.audit_dir();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if dir.exists() && pred(&audit_entries(&dir)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what}: not in the audit log within 10 s");
}

/// Wait (up to 10 s, polling) until `cond` holds; panic with `what`
/// otherwise. For state another process changes (a file it writes, a
/// process it ends).
pub async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what}: not within 10 s");
}

/// An initialized client of `server` whose `tools/list` told the gateway
/// which tools only read.
pub async fn listed(gw: &Gateway, server: &str) -> Client {
    let mut c = Client::new(&gw.url(server));
    c.initialize().await;
    c.post(&json!({"jsonrpc":"2.0","id":0,"method":"tools/list"}))
        .await;
    c
}

/// One server's entry in a `countersign check --json` report.
pub fn report_server(report: &Value, server: &str) -> Value {
    report
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["server"] == server)
        .unwrap_or_else(|| panic!("no `{server}` in {report}"))
        .clone()
}

/// One tool's entry under a server in a `countersign check --json` report.
pub fn report_tool(report: &Value, server: &str, tool: &str) -> Value {
    report_server(report, server)["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == tool)
        .unwrap_or_else(|| panic!("no `{server}/{tool}` in {report}"))
        .clone()
}

/// `structuredContent.countersign` of the answer's last message.
pub fn countersign(a: &Answer) -> Value {
    a.last()["result"]["structuredContent"]["countersign"].clone()
}

/// The proposal a held call waits on (panics when the answer names none).
pub fn proposal_id(a: &Answer) -> String {
    countersign(a)["proposal_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no proposal in {a:?}"))
        .to_owned()
}

/// The `countersign` code the answer carries ("" when none).
pub fn code(a: &Answer) -> String {
    countersign(a)["code"].as_str().unwrap_or("").to_owned()
}

pub fn countersign_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_countersign"))
}

/// `target/debug/examples/payments_server`, built by `cargo test`.
pub fn example_server_bin() -> PathBuf {
    let bin = countersign_bin();
    let dir = bin.parent().unwrap();
    let path = dir.join("examples").join("payments_server");
    assert!(
        path.exists(),
        "example server not built at {}: run `cargo build --examples`",
        path.display()
    );
    path
}

pub fn sha(token: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

/// Wait for `prefix` + address on a child's stderr; keep draining it after.
pub fn wait_listening(child: &mut Child, what: &str) -> String {
    wait_listening_logged(child, what, None)
}

/// The same, keeping every stderr line in `log`.
fn wait_listening_logged(
    child: &mut Child,
    what: &str,
    log: Option<std::sync::Arc<std::sync::Mutex<Vec<String>>>>,
) -> String {
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(log) = &log {
                log.lock().unwrap().push(line.clone());
            }
            if std::env::var_os("TEST_VERBOSE").is_some() {
                eprintln!("[{line}]");
            }
            if !sent {
                // Only the line that names an address (a warning about a
                // non-loopback listener says "listening on" too).
                if let Some(addr) = line
                    .split("listening on ")
                    .nth(1)
                    .map(str::trim)
                    .filter(|a| a.parse::<std::net::SocketAddr>().is_ok())
                {
                    let _ = tx.send(addr.to_owned());
                    sent = true;
                }
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("{what} did not report its listening address"))
}

/// The example server over HTTP.
pub struct HttpUpstream {
    child: Child,
    pub addr: String,
}

impl HttpUpstream {
    pub fn start(record: &Path, faults: &Path) -> HttpUpstream {
        HttpUpstream::start_at("127.0.0.1:0", record, faults)
    }

    /// The example server over HTTP on `addr` (an upstream restarted on the
    /// same port).
    pub fn start_at(addr: &str, record: &Path, faults: &Path) -> HttpUpstream {
        let mut child = Command::new(example_server_bin())
            .args(["--http", addr, "--record"])
            .arg(record)
            .arg("--faults")
            .arg(faults)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let addr = wait_listening(&mut child, "example server");
        HttpUpstream { child, addr }
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }
}

impl Drop for HttpUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running gateway with its temp dir, record and fault files.
pub struct Gateway {
    child: Option<Child>,
    /// Every line the gateway wrote to stderr.
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    env: Vec<(String, String)>,
    /// What the gateway runs under (see [`Options::wrapper`]).
    wrapper: Vec<String>,
    pub addr: String,
    pub dir: tempfile::TempDir,
    pub http_upstream: Option<HttpUpstream>,
}

pub struct Options {
    /// Also run the example server over HTTP as server `phttp`.
    pub http_upstream: bool,
    /// Extra TOML appended to the config.
    pub extra: String,
    pub listen: String,
    /// Extra environment for the gateway process.
    pub gateway_env: Vec<(String, String)>,
    /// The gateway's policy folder: `None` is one permissive policy (most
    /// tests are about the relay and the ledger, not about policies).
    pub policies: Option<PathBuf>,
    /// The body of `[approvals]` (by default calls are not held).
    pub approvals: String,
    /// Extra lines for the `[gateway]` table.
    pub gateway: String,
    /// Extra lines for the `[limits]` table.
    pub limits: String,
    /// `call_timeout` of the `payments` server.
    pub call_timeout: String,
    /// A command the gateway runs under (`valgrind --tool=callgrind ...`):
    /// its program and arguments, before the gateway's own.
    pub wrapper: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            http_upstream: false,
            extra: String::new(),
            listen: "127.0.0.1:0".into(),
            gateway_env: Vec::new(),
            policies: None,
            approvals: "hold = \"0s\"\n".into(),
            gateway: String::new(),
            wrapper: Vec::new(),
            limits: String::new(),
            call_timeout: "5s".into(),
        }
    }
}

impl Gateway {
    pub fn start() -> Gateway {
        Gateway::start_with(Options::default())
    }

    /// A gateway with the example server both as stdio `payments` and as
    /// HTTP `phttp`.
    pub fn with_http_upstream() -> Gateway {
        Gateway::start_with(Options {
            http_upstream: true,
            ..Default::default()
        })
    }

    pub fn start_with(opts: Options) -> Gateway {
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("executions.jsonl");
        let faults = dir.path().join("faults.json");
        std::fs::write(&faults, "{}").unwrap();
        let http_upstream = opts
            .http_upstream
            .then(|| HttpUpstream::start(&record, &faults));
        let policies = match &opts.policies {
            Some(p) => p.clone(),
            None => {
                let p = dir.path().join("policies");
                std::fs::create_dir_all(&p).unwrap();
                std::fs::write(p.join("allow-all.cedar"), ALLOW_ALL).unwrap();
                p
            }
        };
        let mut config = format!(
            r#"
[gateway]
listen = "{listen}"
data_dir = "{data}"
policies = "{policies}"
shutdown_grace = "500ms"
{gateway_extra}

[[identities]]
token_sha256 = "{t1}"
principal = "agent-7"
tenant = "acme"
groups = ["agents"]

[[identities]]
token_sha256 = "{t2}"
principal = "agent-9"
tenant = "acme"

[[identities]]
token_sha256 = "{t3}"
principal = "agent-7"
tenant = "globex"

[[identities]]
token_sha256 = "{t4}"
principal = "dev-1"
tenant = "acme"
groups = ["solo"]

[approvals]
{approvals}

[limits]
max_body_bytes = 65536
max_arguments_bytes = 32768
{limits_extra}

[servers.payments]
command = "{bin}"
args = ["--record", "{record}", "--faults", "{faults}"]
call_timeout = "{call_timeout}"
"#,
            listen = opts.listen,
            policies = policies.display(),
            data = dir.path().join("data").display(),
            t1 = sha(TOKEN),
            t2 = sha(OTHER_TOKEN),
            t3 = sha(GLOBEX_TOKEN),
            t4 = sha(SOLO_TOKEN),
            approvals = opts.approvals,
            gateway_extra = opts.gateway,
            limits_extra = opts.limits,
            call_timeout = opts.call_timeout,
            bin = example_server_bin().display(),
            record = record.display(),
            faults = faults.display(),
        );
        if let Some(up) = &http_upstream {
            config.push_str(&format!(
                "\n[servers.phttp]\nurl = \"{}\"\ncall_timeout = \"5s\"\n",
                up.url()
            ));
        }
        config.push_str(&opts.extra);
        let config_path = dir.path().join("countersign.toml");
        std::fs::write(&config_path, config).unwrap();
        let mut gw = Gateway {
            child: None,
            log: Default::default(),
            env: opts.gateway_env,
            wrapper: opts.wrapper,
            addr: String::new(),
            dir,
            http_upstream,
        };
        gw.spawn();
        gw
    }

    /// A record file for servers added through `Options::extra` (one per
    /// test process and thread, outside the gateway's temp dir).
    pub fn record_path_for_extra() -> String {
        let name = format!(
            "countersign-extra-{}-{:?}.jsonl",
            std::process::id(),
            std::thread::current().id()
        )
        .replace(['(', ')'], "");
        std::env::temp_dir().join(name).display().to_string()
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("countersign.toml")
    }

    fn spawn(&mut self) {
        let mut command = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(countersign_bin());
                c
            }
            None => Command::new(countersign_bin()),
        };
        let mut child = command
            .args(["serve", "--config"])
            .arg(self.config_path())
            .env("COUNTERSIGN_LOG", "info")
            .envs(self.env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        self.addr = wait_listening_logged(&mut child, "gateway", Some(self.log.clone()));
        self.child = Some(child);
    }

    /// Kill the gateway (SIGKILL) and start it again on the same address.
    pub fn restart(&mut self) {
        self.kill();
        self.start_again();
    }

    /// Start a stopped gateway again on the same address.
    pub fn start_again(&mut self) {
        let text = std::fs::read_to_string(self.config_path()).unwrap();
        let old_listen = text
            .lines()
            .find(|l| l.starts_with("listen"))
            .unwrap()
            .to_owned();
        let text = text.replacen(&old_listen, &format!("listen = \"{}\"", self.addr), 1);
        std::fs::write(self.config_path(), text).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // The old socket may linger a moment.
            if std::net::TcpListener::bind(&self.addr).is_ok() || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.spawn();
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The gateway process's id (to pause it with SIGSTOP, say).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the gateway runs").id()
    }

    /// Send `signal` (`STOP`, `CONT`, ...) to the gateway process.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal}");
    }

    /// Wait for the gateway process to exit (after a signal) and reap it.
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        self.child.take().unwrap().wait().unwrap()
    }

    /// Stop with SIGTERM and wait for a clean exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().unwrap();
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(c.id().to_string())
            .status();
        c.wait().unwrap()
    }

    pub fn url(&self, server: &str) -> String {
        format!("http://{}/mcp/{server}", self.addr)
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn faults_path(&self) -> PathBuf {
        self.dir.path().join("faults.json")
    }

    /// Inject a fault for the example server's next call of `tool`.
    pub fn fault(&self, tool: &str, fault: &str, delay_ms: u64) {
        let v = json!({ tool: { "fault": fault, "times": 1, "delay_ms": delay_ms } });
        std::fs::write(self.faults_path(), v.to_string()).unwrap();
    }

    /// Every record the example server wrote.
    pub fn records(&self) -> Vec<Value> {
        let path = self.dir.path().join("executions.jsonl");
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The audit log directory (the default under the data dir).
    pub fn audit_dir(&self) -> PathBuf {
        self.dir.path().join("data").join("audit")
    }

    /// Everything the gateway logged so far.
    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Wait (up to 10 s) for a gateway log line containing `needle`.
    pub async fn wait_for_log(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.log.lock().unwrap().iter().any(|l| l.contains(needle)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("no gateway log line with `{needle}` within 10 s");
    }

    /// Run `countersign` with this gateway's config appended to `args`.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(countersign_bin())
            .args(args)
            .arg("--config")
            .arg(self.config_path())
            .output()
            .unwrap()
    }

    /// How many times `tool` was executed.
    pub fn executions(&self, tool: &str) -> usize {
        self.records()
            .iter()
            .filter(|r| r["event"] == "executed" && r["tool"] == tool)
            .count()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What one POST produced.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    /// Every JSON-RPC message of the body (one for JSON, several for SSE).
    pub messages: Vec<Value>,
    /// The raw body text.
    pub text: String,
    pub sse: bool,
}

impl Answer {
    /// The last message (the response, for a request).
    pub fn last(&self) -> &Value {
        self.messages
            .last()
            .unwrap_or_else(|| panic!("no message in answer: {self:?}"))
    }

    /// The raw text of the response message (the body for JSON, the response
    /// event's data for SSE), for byte-for-byte comparisons.
    pub fn response_text(&self) -> String {
        if !self.sse {
            return self.text.clone();
        }
        self.text
            .split("\n\n")
            .filter_map(|ev| ev.lines().find_map(|l| l.strip_prefix("data: ")))
            .find(|d| {
                serde_json::from_str::<Value>(d)
                    .is_ok_and(|v| v.get("id").is_some() && v.get("method").is_none())
            })
            .unwrap_or_else(|| panic!("no response event in {self:?}"))
            .to_owned()
    }
}

/// A minimal handshake-era MCP client over real HTTP.
pub struct Client {
    pub http: reqwest::Client,
    pub url: String,
    pub token: String,
    pub session: Option<String>,
    pub protocol: String,
}

pub fn parse_messages(text: &str, sse: bool) -> Vec<Value> {
    if !sse {
        return serde_json::from_str::<Value>(text)
            .map(|v| vec![v])
            .unwrap_or_default();
    }
    text.split("\n\n")
        .filter_map(|ev| {
            let data: Vec<&str> = ev
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .collect();
            (!data.is_empty())
                .then(|| serde_json::from_str(&data.join("\n")).ok())
                .flatten()
        })
        .collect()
}

impl Client {
    pub fn new(url: &str) -> Client {
        Client {
            http: reqwest::Client::new(),
            url: url.into(),
            token: TOKEN.into(),
            session: None,
            protocol: "2025-06-18".into(),
        }
    }

    pub fn request(&self, method: reqwest::Method) -> reqwest::RequestBuilder {
        let mut r = self
            .http
            .request(method, &self.url)
            .bearer_auth(&self.token);
        if let Some(s) = &self.session {
            r = r
                .header("mcp-session-id", s)
                .header("mcp-protocol-version", &self.protocol);
        }
        r
    }

    pub async fn post_raw(&self, body: impl Into<reqwest::Body>) -> Answer {
        let resp = self
            .request(reqwest::Method::POST)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body)
            .send()
            .await
            .unwrap();
        answer(resp).await
    }

    pub async fn post(&self, body: &Value) -> Answer {
        self.post_raw(body.to_string()).await
    }

    pub async fn initialize(&mut self) -> Answer {
        self.initialize_with(json!({"sampling": {}})).await
    }

    /// `initialize` declaring `capabilities`, then `notifications/initialized`.
    pub async fn initialize_with(&mut self, capabilities: Value) -> Answer {
        let a = self
            .post(
                &json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
                "protocolVersion": self.protocol, "capabilities": capabilities,
                "clientInfo": {"name": "countersign-tests", "version": "1"}}}),
            )
            .await;
        assert_eq!(a.status, 200, "initialize failed: {a:?}");
        self.session = a
            .headers
            .get("mcp-session-id")
            .map(|v| v.to_str().unwrap().to_owned());
        assert!(self.session.is_some(), "no Mcp-Session-Id in {a:?}");
        let n = self
            .post(&json!({"jsonrpc":"2.0","method":"notifications/initialized"}))
            .await;
        assert_eq!(n.status, 202);
        a
    }

    pub async fn call(&self, id: i64, tool: &str, args: Value) -> Answer {
        self.post(&json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":tool,"arguments":args}}))
            .await
    }
}

/// A 2026-07-28 POST as a conforming client sends it: authenticated, with
/// `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` mirroring the body.
pub fn modern_post(url: &str, body: &Value) -> reqwest::RequestBuilder {
    modern_post_as(url, body, TOKEN)
}

/// A 2026-07-28 POST of `body` with bearer `token`.
pub fn modern_post_as(url: &str, body: &Value, token: &str) -> reqwest::RequestBuilder {
    let version = body
        .pointer("/params/_meta/io.modelcontextprotocol~1protocolVersion")
        .and_then(Value::as_str)
        .unwrap_or("2026-07-28");
    let mut req = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", version)
        .header("mcp-method", body["method"].as_str().unwrap_or(""));
    if let Some(name) = body.pointer("/params/name").and_then(Value::as_str) {
        req = req.header("mcp-name", name);
    }
    req.body(body.to_string())
}

pub async fn answer(resp: reqwest::Response) -> Answer {
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let sse = headers
        .get("content-type")
        .is_some_and(|v| v.to_str().unwrap_or("").starts_with("text/event-stream"));
    let text = resp.text().await.unwrap_or_default();
    let messages = parse_messages(&text, sse);
    Answer {
        status,
        headers,
        messages,
        text,
        sse,
    }
}

/// The raw text of `result.tools` in a JSON-RPC response body.
pub fn raw_tools(body: &str) -> String {
    #[derive(serde::Deserialize)]
    struct Resp<'a> {
        #[serde(borrow)]
        result: Res<'a>,
    }
    #[derive(serde::Deserialize)]
    struct Res<'a> {
        #[serde(borrow)]
        tools: &'a serde_json::value::RawValue,
    }
    let r: Resp = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("not a tools/list response ({e}): {body}"));
    r.result.tools.get().to_owned()
}

/// A policy folder with the shipped schema and default policies, and one
/// reviewer, `alice` (group `leads`, tenant `acme`); returns it and the path of
/// alice's key (made by the real `countersign keygen`).
pub fn default_policies_with_alice() -> (tempfile::TempDir, PathBuf) {
    let pdir = tempfile::tempdir().unwrap();
    let shipped = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policies");
    for f in ["schema.cedarschema", "default.cedar"] {
        std::fs::copy(shipped.join(f), pdir.path().join(f)).unwrap();
    }
    let (key, entry) = lead_of_acme(pdir.path(), "alice");
    std::fs::write(pdir.path().join("reviewers.toml"), entry).unwrap();
    (pdir, key)
}

/// A reviewer made by the real `countersign keygen` in `dir`, of group
/// `leads` and tenant `acme`: the key's path and the `[[reviewers]]` entry.
pub fn lead_of_acme(dir: &Path, name: &str) -> (PathBuf, String) {
    let key = dir.join(format!("{name}.key"));
    let out = Command::new(countersign_bin())
        .args(["keygen", "--name", name, "--out"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let entry = String::from_utf8(out.stdout)
        .unwrap()
        .replace("groups = []", "groups = [\"leads\"]")
        .replace("tenants = [\"*\"]", "tenants = [\"acme\"]");
    (key, entry)
}

/// Run a reviewer command against `gw` with `key`; (success, stdout, stderr).
pub fn review_cli(gw: &Gateway, key: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(countersign_bin())
        .args(args)
        .arg("--key")
        .arg(key)
        .args(["--gateway", &gw.base()])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `GET /metrics` with the scraper's `token`: the exposition text.
pub async fn scrape_metrics(gw: &Gateway, token: &str) -> String {
    reqwest::Client::new()
        .get(format!("{}/metrics", gw.base()))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}
