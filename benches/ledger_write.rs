//! The write path: added latency of a write `tools/call` (a durable
//! `dispatched` record, fsynced, before the request goes upstream) and of a
//! read, and write throughput with 16 concurrent clients.
//!
//! ```text
//! cargo build --release --examples && taskset -c 0 cargo bench --bench ledger_write
//! ```
//!
//! Latency: the same calls alternately direct to the example server and
//! through the gateway (A/B interleaved), every write with a fresh explicit
//! idempotency key so that each one really executes. Throughput: 16 threads,
//! each with its own gateway session, writing with fresh keys.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;

fn write_call(i: usize, key: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"charge_card","arguments":{{"account":"acct_{i}","amount":1}},"_meta":{{"dev.countersign/idempotency-key":"{key}"}}}}}}"#
    )
}

fn main() {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_countersign"));
    let iterations: usize = std::env::var("BENCH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let pair = start_pair(&bin);
    let mut direct = Conn::new(&pair.up_addr, "/mcp", false);
    direct.initialize();
    let mut through = Conn::new(&pair.gw_addr, "/mcp/payments", true);
    through.initialize();
    through.post(r#"{"jsonrpc":"2.0","id":0,"method":"tools/list"}"#);

    let (_, first) = through.post(&write_call(0, "warm-0"));
    assert!(first.contains("charged"), "a write must run: {first}");

    // Fresh keys: every write really executes.
    let (d, g) = ab_interleaved(&mut direct, &mut through, iterations, |i| {
        write_call(i + 1, &format!("w-{i}"))
    });
    report(
        &format!(
            "write tools/call (durable ledger), {iterations} calls each side, A/B interleaved"
        ),
        &d,
        &g,
    );

    let read = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_balance","arguments":{"account":"acct_42"}}}"#;
    let (d, g) = ab_interleaved(&mut direct, &mut through, iterations, |_| read.to_owned());
    println!();
    report(
        &format!("read-only tools/call (no ledger write), {iterations} calls each side"),
        &d,
        &g,
    );

    // Throughput: 16 clients writing at once through the gateway.
    let clients = 16;
    let per_client: usize = std::env::var("BENCH_PER_CLIENT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let started = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let addr = pair.gw_addr.clone();
            std::thread::spawn(move || {
                let mut conn = Conn::new(&addr, "/mcp/payments", true);
                conn.initialize();
                for i in 0..per_client {
                    let (_, body) = conn.post(&write_call(i, &format!("c{c}-{i}")));
                    assert!(body.contains("charged"), "{body}");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let elapsed = started.elapsed().max(Duration::from_millis(1));
    let total = clients * per_client;
    println!();
    println!(
        "throughput: {total} writes from {clients} concurrent clients in {:.2} s = {:.0} writes/s",
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64()
    );
}
