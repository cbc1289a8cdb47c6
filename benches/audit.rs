//! Audit log throughput: appends per second through the writer thread, and
//! `audit verify` speed, on a log of `BENCH_ENTRIES` entries (default
//! 1,000,000) shaped like real `call_received` entries. Also the latency of
//! a durable append (the one a write call waits for).
//!
//! `taskset -c 0 cargo bench --bench audit`; `BENCH_PARTS=1` instead times
//! the parts of one entry (the JCS writer against serde_jcs);
//! `BENCH_SHAPE=read` writes entries shaped like an unattended read's one
//! `completed` entry instead (what a log of mostly reads holds).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use countersign::audit::log::{AuditLog, Settings};
use countersign::audit::ArgumentMode;
use serde_json::{json, Map, Value};

/// An unattended read's one entry, as the gateway writes it.
fn read_entry(i: u64) -> Map<String, Value> {
    let mut f = Map::new();
    f.insert(
        "call_digest".into(),
        json!(format!(
            "sha256:0de1b961e2d4da72965c05ca9235aa5f2672806edafb6c3474effa4b1cb{:05x}",
            i % 0xfffff
        )),
    );
    f.insert("principal".into(), json!("agent-7"));
    f.insert("tenant".into(), json!("acme"));
    f.insert("server".into(), json!("payments"));
    f.insert("tool".into(), json!("get_balance"));
    f.insert("decision".into(), json!("allow"));
    f.insert("policies".into(), json!(["default/read-only"]));
    f.insert("is_error".into(), json!(false));
    f.insert("received_at".into(), json!("2026-12-04T10:00:00.123Z"));
    f
}

fn reads() -> bool {
    static READS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *READS.get_or_init(|| std::env::var("BENCH_SHAPE").is_ok_and(|s| s == "read"))
}

fn entry(i: u64) -> Map<String, Value> {
    if reads() {
        return read_entry(i);
    }
    let mut f = Map::new();
    f.insert(
        "call_digest".into(),
        json!("sha256:0de1b961e2d4da72965c05ca9235aa5f2672806edafb6c3474effa4b1cb73a26"),
    );
    f.insert("idempotency_key".into(), json!(format!("bench-{i}")));
    f.insert("principal".into(), json!("agent-7"));
    f.insert("tenant".into(), json!("acme"));
    f.insert("server".into(), json!("payments"));
    f.insert("tool".into(), json!("charge_card"));
    f.insert(
        "arguments".into(),
        json!({"account": "acct-1", "amount": i % 1000, "currency": "EUR"}),
    );
    f.insert(
        "arguments_digest".into(),
        json!("sha256:5f2672806edafb6c3474effa4b1cb73a260de1b961e2d4da72965c05ca9235aa"),
    );
    f
}

fn main() {
    let n: u64 = std::env::var("BENCH_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    if std::env::var_os("BENCH_PARTS").is_some() {
        let mut e = entry(7);
        e.insert("seq".into(), json!(1));
        e.insert("time".into(), json!("2026-11-30T10:00:00.123Z"));
        e.insert("kind".into(), json!("call_received"));
        e.insert(
            "prev".into(),
            json!("sha256:0de1b961e2d4da72965c05ca9235aa5f2672806edafb6c3474effa4b1cb73a26"),
        );
        let v = Value::Object(e.clone());
        let t = Instant::now();
        for _ in 0..100_000 {
            std::hint::black_box(countersign::audit::entry_hash(&e));
        }
        println!("entry_hash {:.2} µs", t.elapsed().as_secs_f64() * 10.0);
        let t = Instant::now();
        for _ in 0..100_000 {
            std::hint::black_box(serde_jcs::to_vec(&v).unwrap());
        }
        println!("serde_jcs {:.2} µs", t.elapsed().as_secs_f64() * 10.0);
        let t = Instant::now();
        for _ in 0..100_000 {
            std::hint::black_box(serde_json::to_vec(&v).unwrap());
        }
        println!("serde_json {:.2} µs", t.elapsed().as_secs_f64() * 10.0);
        let t = Instant::now();
        for i in 0..100_000 {
            std::hint::black_box(entry(i));
        }
        println!("build {:.2} µs", t.elapsed().as_secs_f64() * 10.0);
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = Settings {
        dir: dir.path().to_owned(),
        checkpoint_every: 1000,
        checkpoint_interval: Duration::from_secs(60),
        segment_bytes: 64 << 20,
        arguments: ArgumentMode::Full,
        redact: vec![],
        gateway: Some("gw-bench".into()),
        origin: None,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");

    // Buffered appends: what every entry but `dispatched` costs.
    let log = AuditLog::open(settings.clone()).expect("open");
    let start = Instant::now();
    for i in 0..n {
        log.record(
            if reads() {
                "completed"
            } else {
                "call_received"
            },
            entry(i),
        );
    }
    log.close();
    let append = start.elapsed();
    let bytes: u64 = std::fs::read_dir(dir.path())
        .expect("dir")
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    println!(
        "append   {n} entries in {:.2} s = {:.0} entries/s ({:.0} bytes/entry, checkpoint every 1000)",
        append.as_secs_f64(),
        n as f64 / append.as_secs_f64(),
        bytes as f64 / n as f64
    );

    // Durable appends, one at a time: the wait a write call sees.
    let log = AuditLog::open(settings.clone()).expect("open");
    let mut lat = Vec::with_capacity(2000);
    rt.block_on(async {
        for i in 0..2000 {
            let t = Instant::now();
            log.record_durable("dispatched", entry(i))
                .await
                .expect("durable");
            lat.push(t.elapsed());
        }
    });
    log.close();
    lat.sort();
    println!(
        "durable  p50 {:.1} µs  p99 {:.1} µs (one fsync each, 2000 sequential)",
        lat[lat.len() / 2].as_secs_f64() * 1e6,
        lat[lat.len() * 99 / 100].as_secs_f64() * 1e6
    );

    // Verify everything written.
    let start = Instant::now();
    let report = countersign::audit::verify::verify_dir(dir.path(), None, None).expect("verify");
    let took = start.elapsed();
    assert!(report.brk.is_none(), "{}", report.render());
    println!(
        "verify   {} entries in {:.2} s = {:.0} entries/s ({} checkpoints)",
        report.entries,
        took.as_secs_f64(),
        report.entries as f64 / took.as_secs_f64(),
        report.checkpoints
    );
}
