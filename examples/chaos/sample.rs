//! A soak's samples: every so often, for each gateway, what could grow
//! without bound if something leaked.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The CSV header.
const HEADER: &str = "minute,gateway,calls_done,rss_kib,fds,threads,tasks,store_kib,audit_kib,notifications_queued,pending_proposals";

/// Where to look for one gateway.
pub struct Target {
    pub pid: u32,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Its data dir (redb files, the audit log).
    pub data: PathBuf,
}

/// Sample every `every` into `file` until `stop`.
pub async fn sampler(
    file: PathBuf,
    every: Duration,
    targets: Vec<Target>,
    postgres: Option<(String, String)>,
    metrics_token: &'static str,
    done: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
) -> Result<(), String> {
    let mut out = std::fs::File::create(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    writeln!(out, "{HEADER}").map_err(|e| e.to_string())?;
    let http = reqwest::Client::new();
    let started = Instant::now();
    let mut next = started;
    while !stop.load(Ordering::SeqCst) {
        if Instant::now() < next {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        next += every;
        let minute = started.elapsed().as_secs_f64() / 60.0;
        for (g, t) in targets.iter().enumerate() {
            let status =
                std::fs::read_to_string(format!("/proc/{}/status", t.pid)).unwrap_or_default();
            let field = |name: &str| -> u64 {
                status
                    .lines()
                    .find(|l| l.starts_with(name))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            let fds = std::fs::read_dir(format!("/proc/{}/fd", t.pid)).map_or(0, |d| d.count());
            let metrics = http
                .get(format!("{}/metrics", t.base))
                .bearer_auth(metrics_token)
                .send()
                .await;
            let text = match metrics {
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            let gauge = |name: &str| -> i64 {
                text.lines()
                    .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
                    .and_then(|l| l.split_whitespace().last())
                    .and_then(|v| v.parse::<f64>().ok())
                    .map_or(-1, |v| v as i64)
            };
            let store_kib = match &postgres {
                Some((url, schema)) if g == 0 => pg_size(url, schema),
                Some(_) => 0,
                None => files_kib(&t.data, false),
            };
            writeln!(
                out,
                "{minute:.2},{g},{},{},{fds},{},{},{store_kib},{},{},{}",
                done.load(Ordering::SeqCst),
                field("VmRSS:"),
                field("Threads:"),
                gauge("countersign_runtime_tasks"),
                files_kib(&t.data.join("audit"), true),
                gauge("countersign_notifications_queued"),
                gauge("countersign_pending_proposals"),
            )
            .map_err(|e| e.to_string())?;
        }
        out.flush().map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The size of the files in `dir` (and below, with `deep`), KiB.
fn files_kib(dir: &Path, deep: bool) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut bytes = 0;
    for e in entries.flatten() {
        let Ok(m) = e.metadata() else { continue };
        if m.is_file() {
            bytes += m.len();
        } else if deep && m.is_dir() {
            bytes += files_kib(&e.path(), true) * 1024;
        }
    }
    bytes / 1024
}

/// The size of every table of `schema` (with indexes and TOAST), KiB.
fn pg_size(url: &str, schema: &str) -> u64 {
    let out = std::process::Command::new("psql")
        .args([url, "-tAc"])
        .arg(format!(
            "SELECT (coalesce(sum(pg_total_relation_size(c.oid)), 0) / 1024)::bigint FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = '{schema}' AND c.relkind = 'r'"
        ))
        .output();
    out.ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(0)
}
