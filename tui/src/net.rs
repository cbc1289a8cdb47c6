//! The network side: keeps a live view of the gateway (a snapshot, then
//! the `/v1/events` stream, reconnecting with backoff when it drops) and
//! performs the app's commands. Everything comes back to the app as
//! [`Net`] events; nothing here touches the UI state.

use std::sync::Arc;
use std::time::Duration;

use countersign::cli::client::Client;
use countersign::core::approval::Verdict;
use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::app::{Command, Net};

/// Keep the proposal list live: snapshot, then events; on any failure say
/// so and try again (1 s, doubling to 10 s).
pub async fn follow(client: Arc<Client>, tx: mpsc::Sender<Net>) {
    let mut backoff = Duration::from_secs(1);
    loop {
        let result = session(&client, &tx).await;
        let why = match result {
            Ok(()) => "the event stream ended".to_owned(),
            Err(e) => format!("{e:#}"),
        };
        if tx.send(Net::Lost(why)).await.is_err() {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(10));
    }
}

async fn session(client: &Client, tx: &mpsc::Sender<Net>) -> anyhow::Result<()> {
    // Subscribe first, then take the snapshot: nothing falls between them.
    let resp = client
        .signed(reqwest::Method::GET, "/v1/events", Vec::new())
        .send()
        .await?;
    if !resp.status().is_success() {
        anyhow::bail!("the gateway refused the event stream ({})", resp.status());
    }
    let all = client.proposals(None).await?;
    tx.send(Net::Snapshot(all)).await?;
    tx.send(Net::Linked).await?;
    let mut body = resp.bytes_stream();
    let mut buf = String::new();
    while let Some(chunk) = body.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let data: Vec<&str> = event
                .lines()
                .filter_map(|l| l.strip_prefix("data:").map(str::trim_start))
                .collect();
            if event.lines().any(|l| l == "event: resync") {
                tx.send(Net::Snapshot(client.proposals(None).await?))
                    .await?;
                continue;
            }
            if let Ok(v) = serde_json::from_str::<Value>(&data.join("\n")) {
                if let Some(p) = v.get("proposal") {
                    tx.send(Net::Proposal(p.clone())).await?;
                }
            }
        }
    }
    Ok(())
}

/// Perform commands one at a time, reporting each result.
pub async fn perform(client: Arc<Client>, mut rx: mpsc::Receiver<Command>, tx: mpsc::Sender<Net>) {
    while let Some(cmd) = rx.recv().await {
        let result = run(&client, cmd, &tx).await;
        let event = match result {
            Ok(Some(m)) => Net::Done(m),
            Ok(None) => continue,
            // The gateway's own message (expired, already decided, not
            // allowed): shown in place, never fatal.
            Err(e) => Net::Failed(format!("{e:#}")),
        };
        if tx.send(event).await.is_err() {
            return;
        }
    }
}

async fn run(
    client: &Client,
    cmd: Command,
    tx: &mpsc::Sender<Net>,
) -> anyhow::Result<Option<String>> {
    // A denial's statement carries an expiry too; it means nothing there.
    let ttl = crate::app::DEFAULT_TTL;
    match cmd {
        Command::Approve { id, reason, ttl } => {
            let p = client.decide(&id, Verdict::Approve, &reason, ttl).await?;
            let waits = p["state"] == "pending";
            let progress = p["progress"].as_str().map(str::to_owned);
            tx.send(Net::Proposal(p)).await?;
            Ok(Some(match (waits, progress) {
                (true, Some(progress)) => format!("your approval of {id} is recorded: {progress}"),
                _ => format!(
                    "approved {id}: it may run once, within {}",
                    humantime::format_duration(ttl)
                ),
            }))
        }
        Command::Deny(id, reason) => {
            let p = client.decide(&id, Verdict::Deny, &reason, ttl).await?;
            tx.send(Net::Proposal(p)).await?;
            Ok(Some(format!("denied {id}")))
        }
        Command::Reconcile {
            tenant,
            principal,
            key,
            executed,
            note,
        } => {
            client
                .reconcile(&tenant, &principal, &key, executed, &note)
                .await?;
            tx.send(Net::Outcomes(client.outcomes().await?)).await?;
            Ok(Some(format!(
                "`{key}` marked {}",
                if executed { "executed" } else { "not executed" }
            )))
        }
        Command::LoadOutcomes => {
            tx.send(Net::Outcomes(client.outcomes().await?)).await?;
            Ok(None)
        }
        Command::LoadAudit => {
            tx.send(Net::Audit(client.audit_tail(200).await?)).await?;
            Ok(None)
        }
    }
}
