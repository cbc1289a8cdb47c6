//! The database restarts under a running gateway (`pg_ctlcluster … restart`):
//! no duplicate, no acknowledged answer lost, and the gateway recovers by
//! itself. A test binary of its own: the restart would disturb other tests
//! using the server at the same time (cargo runs test binaries one by one).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

use common::*;
use serde_json::{json, Value};

/// The local cluster on port 5432: (version, name).
fn cluster() -> (String, String) {
    let out = Command::new("pg_lsclusters")
        .arg("--no-header")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text
        .lines()
        .find(|l| l.split_whitespace().nth(2) == Some("5432"))
        .expect("a cluster on 5432");
    let mut f = line.split_whitespace();
    (f.next().unwrap().to_owned(), f.next().unwrap().to_owned())
}

async fn charge(c: &Client, id: i64, key: &str) -> Value {
    let a = c
        .post(
            &json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
            "name":"charge_card","arguments":{"account":"acct_r","amount":2},
            "_meta":{"dev.countersign/idempotency-key": key}}}),
        )
        .await;
    a.last()["result"].clone()
}

#[tokio::test]
async fn a_database_restart_loses_no_answer_and_runs_nothing_twice() {
    let schema = format!("cs_restart_{:016x}", rand::random::<u64>());
    psql(&format!("CREATE SCHEMA {schema}"));
    let gw = Gateway::start_with(Options {
        extra: format!(
            "\n[store]\nurl = \"postgres://postgres@127.0.0.1:5432/test?options=-c%20search_path%3D{schema}\"\npool_size = 4\n"
        ),
        ..Default::default()
    });
    let mut c = Client::new(&gw.url("payments"));
    c.initialize().await;
    let mut acknowledged = Vec::new();
    for n in 0..5 {
        let r = charge(&c, n, &format!("before-{n}")).await;
        assert_eq!(r["isError"], false, "{r}");
        acknowledged.push((format!("before-{n}"), r["content"].clone()));
    }
    let (version, name) = cluster();
    let restarted = Command::new("pg_ctlcluster")
        .args([&version, &name, "restart"])
        .status()
        .unwrap();
    assert!(restarted.success(), "pg_ctlcluster restart");
    // Calls go on; a call the store could not record ran nothing and is
    // retried with its key until it runs (the gateway reconnects by itself).
    for n in 0..5 {
        let key = format!("after-{n}");
        let mut done = None;
        for attempt in 0..50 {
            let r = charge(&c, 100 + attempt, &key).await;
            if r["isError"] == false {
                done = Some(r);
                break;
            }
            let code = &r["structuredContent"]["countersign"]["code"];
            assert_eq!(
                code, "upstream_unavailable",
                "only 'nothing ran' while it reconnects: {r}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        let r = done.expect("the gateway recovered by itself");
        acknowledged.push((key, r["content"].clone()));
    }
    // Every acknowledged answer is the same when asked again; nothing ran twice.
    for (i, (key, content)) in acknowledged.iter().enumerate() {
        let again = charge(&c, 1000 + i as i64, key).await;
        assert_eq!(&again["content"], content, "{key}");
    }
    assert_eq!(gw.executions("charge_card"), acknowledged.len());
    psql(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
}
