//! Added latency of the gateway on a read-only `tools/call`.
//!
//! ```text
//! cargo build --release --examples && taskset -c 0 cargo bench --bench relay_latency
//! ```
//!
//! Starts the example server over Streamable HTTP and a gateway in front of
//! it, opens one session on each, then sends the same `get_balance` call
//! alternately direct and through the gateway (A/B interleaved in one run),
//! over one keep-alive connection each, with a minimal blocking HTTP/1.1
//! client so that client overhead is the same on both sides. Reports p50/p99
//! of each side, the added latency and the ratio.
//!
//! Run it under `taskset -c 0`: every process then shares one CPU, and
//! cross-CPU wake-ups (about 45 µs on these VMs) do not swamp the numbers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;

use common::*;

fn main() {
    // `cargo bench` passes `--bench`; ignore arguments.
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_countersign"));
    let iterations: usize = std::env::var("BENCH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let pair = start_pair(&bin);
    let (up_addr, gw_addr) = (pair.up_addr.clone(), pair.gw_addr.clone());
    let mut direct = Conn::new(&up_addr, "/mcp", false);
    direct.initialize();
    let mut through = Conn::new(&gw_addr, "/mcp/payments", true);
    through.initialize();
    // The gateway must see the annotations to treat get_balance as a read
    // (relayed every time) rather than a write (replayed from the ledger).
    through.post(r#"{"jsonrpc":"2.0","id":0,"method":"tools/list"}"#);

    let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_balance","arguments":{"account":"acct_42"}}}"#;
    let (_, a) = direct.post(call);
    let (_, b) = through.post(call);
    let (a, b): (serde_json::Value, serde_json::Value) = (
        serde_json::from_str(&a).unwrap(),
        serde_json::from_str(&b).unwrap(),
    );
    assert_eq!(a, b, "the gateway must answer what the upstream answered");

    // Warm-up, then A/B interleaved.
    for _ in 0..1000 {
        direct.post(call);
        through.post(call);
    }
    let (gw_pid, up_pid) = (pair.gateway.0.id(), pair.upstream.0.id());
    let (gw_cpu0, up_cpu0) = (cpu_us(gw_pid), cpu_us(up_pid));
    let (d, g) = ab_interleaved(&mut direct, &mut through, iterations, |_| call.to_owned());
    let gw_cpu = (cpu_us(gw_pid) - gw_cpu0) / iterations as f64;
    let up_cpu = (cpu_us(up_pid) - up_cpu0) / (2 * iterations) as f64;
    report(&format!("read-only tools/call, {iterations} calls each side, A/B interleaved, one connection each"), &d, &g);
    println!(
        "cpu per call: gateway {gw_cpu:.1} µs, upstream {up_cpu:.1} µs (from /proc, 10 ms ticks)"
    );
}
