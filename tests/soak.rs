//! Sessions hold their descriptors only while they live: 100 handshake-era
//! sessions, each with its stdio child, then closed. (The 1,000-session
//! soak with memory per round is `benches/session_memory.py`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use serde_json::json;

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

#[tokio::test]
async fn a_hundred_sessions_release_their_descriptors_when_closed() {
    let gw = Gateway::start();
    // One session first: what the gateway opens once is not counted.
    let _warm = listed(&gw, "payments").await;
    let before = fds(gw.pid());
    let mut sessions = Vec::new();
    for _ in 0..100 {
        let mut c = Client::new(&gw.url("payments"));
        c.initialize().await;
        sessions.push(c);
    }
    for (n, c) in sessions.iter().enumerate() {
        let r = c
            .post(&json!({"jsonrpc":"2.0","id": n + 1,"method":"ping"}))
            .await;
        assert_eq!(r.status, 200, "session {n} was not held: {r:?}");
    }
    let held = fds(gw.pid());
    assert!(
        held >= before + 200,
        "each session's child holds pipes: {before} before, {held} with 100 sessions"
    );
    for c in &sessions {
        let r = c.request(reqwest::Method::DELETE).send().await.unwrap();
        assert!(r.status().is_success(), "{r:?}");
    }
    // The clients go too: each held a keep-alive connection of its own.
    drop(sessions);
    let pid = gw.pid();
    eventually(
        "the descriptors of 100 closed sessions are released",
        || fds(pid) <= before + 2,
    )
    .await;
}
