//! A held write with many stored proposals: the hold path reads the
//! requester's own proposals by an index, and the sweep only the open ones,
//! so 100,000 proposals of other requesters in the store (a thousand of them
//! pending, the rest decided) cost it next to nothing (the aim: at most 2×
//! the time with 10). On redb and, when a server answers at 127.0.0.1:5432,
//! on PostgreSQL.
//!
//! ```text
//! cargo build --release --examples && cargo bench --bench held_write
//! ```
//!
//! Each held write is a `charge_card` with a fresh idempotency key under a
//! policy that asks for approval: the gateway reads the requester's
//! proposals, makes a new one and answers `approval_pending` at once
//! (`hold = "0s"`). The stored proposals are made before the gateway starts,
//! through the store's own API. `BENCH_ITERATIONS` held writes per run
//! (default 300), `BENCH_STORED` the large count (default 100,000).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use countersign::core::approval::{Proposal, ProposalState};
use countersign::store::Store;

const HOLD: &str =
    "permit (principal, action == Action::\"call\", resource) when { context.approved };\n";

/// A proposal of another requester (one of many tenants' agents), made
/// `now_ms`: one in a hundred still pending (the sweep looks at those; made
/// now, none expires while the run is measured), the rest decided, the
/// history a store keeps until retention.
fn other(i: usize, now_ms: i64) -> Proposal {
    Proposal {
        state: if i.is_multiple_of(100) {
            ProposalState::Pending
        } else {
            ProposalState::Denied
        },
        created_ms: now_ms,
        updated_ms: now_ms,
        policies: vec!["bench".into()],
        call_key: Some(format!("key-{i}")),
        ..Proposal::pending(
            format!("p-bench-{i:012}"),
            format!("tenant-{}", i % 50),
            format!("agent-{}", i % 5_000),
            "payments".into(),
            "charge_card".into(),
            serde_json::json!({"account": format!("acct_{i}"), "amount": 120}),
            format!("sha256:{i:064}"),
        )
    }
}

/// Put `n` proposals into the store `open` opens (in the runtime that
/// fills it: a pool's connections live in their runtime), 256 at a time.
fn fill<F: std::future::Future<Output = Arc<dyn Store>>>(open: impl FnOnce() -> F, n: usize) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = open().await;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let mut i = 0;
        while i < n {
            let end = (i + 256).min(n);
            let mut puts = tokio::task::JoinSet::new();
            for j in i..end {
                let s = store.clone();
                puts.spawn(async move { s.put_proposal(other(j, now), None).await });
            }
            while let Some(r) = puts.join_next().await {
                assert!(r.unwrap().unwrap(), "a new proposal is written");
            }
            i = end;
        }
    });
}

/// Seconds per held write through a gateway whose store holds `stored`
/// proposals of other requesters.
fn run(bin: &Path, stored: usize, iterations: usize, postgres: Option<&str>) -> f64 {
    let extra = format!(
        "[approvals]\nhold = \"0s\"\nmax_pending = 1000000\n{}",
        postgres.map_or(String::new(), |url| format!(
            "[store]\nurl = \"{url}\"\npool_size = 4\n"
        ))
    );
    let pair = start_pair_with(bin, HOLD, &extra, |data| match postgres {
        None => {
            let path = data.join("ledger.redb");
            fill(
                || async move {
                    Arc::new(countersign::store::RedbStore::open(&path).unwrap()) as Arc<dyn Store>
                },
                stored,
            );
        }
        Some(url) => {
            let config: tokio_postgres::Config = url.parse().unwrap();
            fill(
                || async move {
                    let (store, _) =
                        countersign::store::PgStore::connect(config, None, 4, "bench-fill")
                            .await
                            .unwrap();
                    Arc::new(store) as Arc<dyn Store>
                },
                stored,
            );
        }
    });
    let mut through = Conn::new(&pair.gw_addr, "/mcp/payments", true);
    through.initialize();
    through.post(r#"{"jsonrpc":"2.0","id":0,"method":"tools/list"}"#);
    let call = |i: usize| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"charge_card","arguments":{{"account":"acct_1","amount":{i}}},"_meta":{{"dev.countersign/idempotency-key":"held-{i}"}}}}}}"#
        )
    };
    let (_, first) = through.post(&call(1_000_000));
    assert!(first.contains("approval_pending"), "a held write: {first}");
    for i in 0..iterations / 10 {
        through.post(&call(2_000_000 + i));
    }
    let t = std::time::Instant::now();
    for i in 0..iterations {
        let (_, body) = through.post(&call(i));
        assert!(body.contains("approval_pending"), "{body}");
    }
    t.elapsed().as_secs_f64() / iterations as f64
}

/// A schema of its own in the local PostgreSQL, when one answers.
fn postgres_schema() -> Option<(String, String)> {
    let name = format!("cs_bench_{:016x}", rand::random::<u64>());
    let made = std::process::Command::new("psql")
        .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-qc"])
        .arg(format!("CREATE SCHEMA {name}"))
        .output()
        .ok()?;
    made.status.success().then(|| {
        let url =
            format!("postgres://postgres@127.0.0.1:5432/test?options=-c%20search_path%3D{name}");
        (name, url)
    })
}

fn main() {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_countersign"));
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let iterations = env("BENCH_ITERATIONS", 300);
    let large = env("BENCH_STORED", 100_000);
    println!("held write (approval_pending at once), {iterations} calls per run");
    let few = run(&bin, 10, iterations, None);
    let many = run(&bin, large, iterations, None);
    println!(
        "redb        {:>7} stored: {:8.1} µs   {large} stored: {:8.1} µs   ratio {:.2}x",
        10,
        few * 1e6,
        many * 1e6,
        many / few
    );
    match postgres_schema() {
        None => println!("PostgreSQL  skipped: no server answers at 127.0.0.1:5432"),
        Some((name, url)) => {
            let few = run(&bin, 10, iterations, Some(&url));
            let drop_schema = |n: &str| {
                let _ = std::process::Command::new("psql")
                    .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-qc"])
                    .arg(format!("DROP SCHEMA IF EXISTS {n} CASCADE"))
                    .output();
            };
            drop_schema(&name);
            let (name, url) = postgres_schema().unwrap();
            let many = run(&bin, large, iterations, Some(&url));
            drop_schema(&name);
            println!(
                "PostgreSQL  {:>7} stored: {:8.1} µs   {large} stored: {:8.1} µs   ratio {:.2}x",
                10,
                few * 1e6,
                many * 1e6,
                many / few
            );
        }
    }
}
