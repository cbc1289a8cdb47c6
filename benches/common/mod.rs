//! Shared pieces of the benchmarks: start the example server and a gateway
//! in front of it, a minimal blocking HTTP/1.1 client (the same on both sides
//! of an A/B comparison), percentiles and per-process CPU time.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const TOKEN: &str = "bench-token";

pub fn listening(child: &mut Child) -> String {
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if !sent {
                if let Some(a) = line.split("listening on ").nth(1) {
                    let _ = tx.send(a.trim().to_owned());
                    sent = true;
                }
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("no listening line")
}

pub struct Conn {
    stream: BufReader<TcpStream>,
    host: String,
    path: String,
    headers: String,
}

impl Conn {
    pub fn new(addr: &str, path: &str, auth: bool) -> Conn {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_nodelay(true).unwrap();
        let headers = if auth {
            format!("Authorization: Bearer {TOKEN}\r\n")
        } else {
            String::new()
        };
        Conn {
            stream: BufReader::new(stream),
            host: addr.into(),
            path: path.into(),
            headers,
        }
    }

    /// POST and return (headers, body).
    pub fn post(&mut self, body: &str) -> (String, String) {
        let req = format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{}Content-Length: {}\r\n\r\n{}",
            self.path,
            self.host,
            self.headers,
            body.len(),
            body
        );
        self.stream.get_mut().write_all(req.as_bytes()).unwrap();
        let mut head = String::new();
        let mut len = 0usize;
        loop {
            let mut line = String::new();
            self.stream.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
            head.push_str(&line);
        }
        assert!(
            len > 0,
            "benchmark expects JSON answers with Content-Length: {head}"
        );
        let mut body = vec![0u8; len];
        self.stream.read_exact(&mut body).unwrap();
        (head, String::from_utf8(body).unwrap())
    }

    pub fn initialize(&mut self) {
        let (head, _) = self.post(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}"#);
        let sid = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("mcp-session-id:")
                    .map(|v| v.trim().to_owned())
            })
            .expect("session id");
        self.headers.push_str(&format!(
            "Mcp-Session-Id: {sid}\r\nMCP-Protocol-Version: 2025-06-18\r\n"
        ));
        let n = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        let req = format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n{}Content-Length: {}\r\n\r\n{}",
            self.path,
            self.host,
            self.headers,
            n.len(),
            n
        );
        self.stream.get_mut().write_all(req.as_bytes()).unwrap();
        // 202 with an empty body.
        loop {
            let mut line = String::new();
            self.stream.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
        }
    }
}

/// Children die with the benchmark, also when it panics.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// CPU time (user + system) a process has used, in microseconds.
pub fn cpu_us(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may contain spaces) start at `) `.
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    // USER_HZ is 100 on Linux.
    ticks * 10_000.0
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// The example server over HTTP and a gateway in front of it.
pub struct Pair {
    pub upstream: KillOnDrop,
    pub gateway: KillOnDrop,
    pub up_addr: String,
    pub gw_addr: String,
    pub dir: PathBuf,
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Start both, the gateway with its ledger in a fresh temp dir.
pub fn start_pair(bin: &std::path::Path) -> Pair {
    start_pair_with(bin, "permit (principal, action, resource);\n", "", |_| {})
}

/// Start both, with `policy` as the gateway's one policy file, `extra`
/// appended to its config, and `prepare` run on its data dir before it
/// starts (to fill a store, say).
pub fn start_pair_with(
    bin: &std::path::Path,
    policy: &str,
    extra: &str,
    prepare: impl FnOnce(&std::path::Path),
) -> Pair {
    let example = bin.parent().unwrap().join("examples/payments_server");
    assert!(
        example.exists(),
        "build the example first: cargo build --release --examples"
    );
    let mut upstream = Command::new(&example)
        .args(["--http", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let up_addr = listening(&mut upstream);
    let upstream = KillOnDrop(upstream);
    let dir = std::env::temp_dir().join(format!("countersign-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let digest = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(TOKEN.as_bytes()))
    };
    // Benchmarks measure the relay and the ledger: one policy (by default
    // allowing all).
    let policies = dir.join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(policies.join("bench.cedar"), policy).unwrap();
    let config = format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\npolicies = \"{}\"\ndata_dir = \"{}\"\n[[identities]]\ntoken_sha256 = \"{digest}\"\nprincipal = \"bench\"\ntenant = \"bench\"\n[servers.payments]\nurl = \"http://{up_addr}/mcp\"\n{extra}",
        policies.display(),
        dir.join("data").display()
    );
    std::fs::create_dir_all(dir.join("data")).unwrap();
    prepare(&dir.join("data"));
    let config_path = dir.join("countersign.toml");
    std::fs::write(&config_path, config).unwrap();
    let mut gateway = Command::new(bin)
        .args(["serve", "--config"])
        .arg(&config_path)
        .env("COUNTERSIGN_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let gw_addr = listening(&mut gateway);
    Pair {
        upstream,
        gateway: KillOnDrop(gateway),
        up_addr,
        gw_addr,
        dir,
    }
}

/// Send `call(i)` alternately direct and through the gateway, `iterations`
/// times each, swapping which side goes first every round; returns the
/// sorted latencies in microseconds (direct, gateway).
pub fn ab_interleaved(
    direct: &mut Conn,
    through: &mut Conn,
    iterations: usize,
    call: impl Fn(usize) -> String,
) -> (Vec<f64>, Vec<f64>) {
    let mut d = Vec::with_capacity(iterations);
    let mut g = Vec::with_capacity(iterations);
    for i in 0..iterations {
        let body = call(i);
        for side in [i % 2 == 0, i % 2 != 0] {
            let conn = if side { &mut *direct } else { &mut *through };
            let t = std::time::Instant::now();
            conn.post(&body);
            let us = t.elapsed().as_secs_f64() * 1e6;
            if side {
                d.push(us)
            } else {
                g.push(us)
            }
        }
    }
    d.sort_by(f64::total_cmp);
    g.sort_by(f64::total_cmp);
    (d, g)
}

/// Print p50/p99 of two sorted samples, the difference and the ratio.
pub fn report(label: &str, d: &[f64], g: &[f64]) {
    let (d50, d99, g50, g99) = (
        percentile(d, 0.5),
        percentile(d, 0.99),
        percentile(g, 0.5),
        percentile(g, 0.99),
    );
    println!("{label}");
    println!("direct   p50 {d50:8.1} µs   p99 {d99:8.1} µs");
    println!("gateway  p50 {g50:8.1} µs   p99 {g99:8.1} µs");
    println!(
        "added    p50 {:8.1} µs   p99 {:8.1} µs",
        g50 - d50,
        g99 - d99
    );
    println!("ratio    p50 {:8.2}x     p99 {:8.2}x", g50 / d50, g99 / d99);
}

/// Run `f` `n` times (after a tenth as many to warm up) and print the time
/// per call.
pub fn time_per_call(label: &str, n: usize, mut f: impl FnMut()) {
    for _ in 0..n / 10 {
        f();
    }
    let t = std::time::Instant::now();
    for _ in 0..n {
        f();
    }
    println!(
        "{label:<45} {:8.2} µs/call",
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    );
}
