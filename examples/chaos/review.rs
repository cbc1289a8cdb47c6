//! `--approvals`: the simulated reviewers, the webhook receiver, and the
//! invariants of the approval path checked at the end of a run.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use countersign::cli::client::{load_key, Client};
use countersign::core::approval::Verdict;
use serde_json::{json, Value};

/// What becomes of a proposal, chosen by the seed and its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fate {
    /// Every reviewer it needs approves.
    Approve,
    /// `chaos-lead` denies it.
    Deny,
    /// One approval, withdrawn, then every approval it needs.
    Withdraw,
    /// Nobody decides: it expires (`approvals.pending_ttl`).
    Expire,
}

impl Fate {
    fn of(seed: u64, id: &str) -> Fate {
        let mut h = seed ^ 0x9e37_79b9_7f4a_7c15;
        for b in id.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        match h % 100 {
            0..=9 => Fate::Expire,
            10..=24 => Fate::Deny,
            25..=39 => Fate::Withdraw,
            _ => Fate::Approve,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Fate::Approve => "approve",
            Fate::Deny => "deny",
            Fate::Withdraw => "withdraw_then_approve",
            Fate::Expire => "expire",
        }
    }
}

/// What the reviewers did, counted.
#[derive(Default, Debug)]
pub struct Decisions {
    /// Proposal id → its fate.
    pub fates: HashMap<String, Fate>,
    /// Approvals accepted by a gateway.
    pub approvals: usize,
    /// Denials accepted.
    pub denials: usize,
    /// Withdrawals accepted.
    pub withdrawals: usize,
    /// Decisions that failed (a gateway down, a proposal already decided):
    /// tried again on the next round.
    pub failed: usize,
    /// Decisions signed with the passkey in the review console.
    pub passkey_decisions: usize,
    /// The last refusal the console gave the passkey, if any.
    pub last_passkey_error: Option<String>,
    /// Proposal ids whose approval was withdrawn (the dance's first step is
    /// done).
    withdrawn: HashSet<String>,
    /// Proposal id → when its first approval was given (for the dance).
    first_yes: HashMap<String, Instant>,
}

/// The reviewers: `chaos-lead` (leads), `chaos-finance` (finance) and
/// `chaos-reviewer` (no group), deciding through the control API of the
/// gateways in turn, until `stop`.
pub async fn reviewers(
    dir: std::path::PathBuf,
    bases: Vec<String>,
    seed: u64,
    passkey: Arc<crate::passkey::SoftKey>,
    stop: Arc<AtomicBool>,
    decisions: Arc<Mutex<Decisions>>,
) -> Result<(), String> {
    // `chaos-console` (leads) decides in each gateway's review console with
    // its passkey: half of the proposals' `leads` decisions go that way.
    let consoles: Vec<crate::passkey::Console> = bases
        .iter()
        .map(|b| crate::passkey::Console::new(b))
        .collect();
    let key =
        |name: &str| load_key(&dir.join(format!("{name}.key"))).map_err(|e| format!("{name}: {e}"));
    let (lead, finance) = (key("chaos-lead")?, key("chaos-finance")?);
    let mut round = 0usize;
    while !stop.load(Ordering::SeqCst) {
        round += 1;
        let base = &bases[round % bases.len()];
        let console = &consoles[round % bases.len()];
        let (Ok(lead), Ok(finance)) = (Client::new(base, &lead), Client::new(base, &finance))
        else {
            return Err("no reviewer client".into());
        };
        let open = match lead.proposals(Some("pending")).await {
            Ok(p) => p,
            Err(_) => {
                // The gateway is down or restarting: the other one, or later.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let approved = lead.proposals(Some("approved")).await.unwrap_or_default();
        for p in open.iter().chain(approved.iter()) {
            let Some(id) = p["id"].as_str() else { continue };
            let fate = Fate::of(seed, id);
            decisions
                .lock()
                .map(|mut d| d.fates.insert(id.to_owned(), fate))
                .ok();
            let two = p["arguments"]["currency"] == "GBP";
            let by = |name: &str| {
                p["approvals"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|g| g["statement"]["reviewer"] == name))
            };
            // The `leads` decision of this proposal: the CLI's key, or the
            // console's passkey.
            let by_console = id.ends_with(['1', '3', '5', '7', '9', 'b', 'd', 'f']);
            let leader = if by_console {
                "chaos-console"
            } else {
                "chaos-lead"
            };
            let mut steps: Vec<(&Client, Step)> = Vec::new();
            let mut passkey_steps: Vec<&str> = Vec::new();
            match fate {
                Fate::Expire => {}
                Fate::Deny if p["state"] == "pending" && by_console => passkey_steps.push("deny"),
                Fate::Deny if p["state"] == "pending" => steps.push((&lead, Step::Deny)),
                Fate::Deny => {}
                Fate::Withdraw => {
                    let (withdrawn, first) = decisions
                        .lock()
                        .map(|d| (d.withdrawn.contains(id), d.first_yes.get(id).copied()))
                        .unwrap_or((false, None));
                    match (withdrawn, first) {
                        // First a yes that is then taken back.
                        (false, None) if !by("chaos-lead") => steps.push((&lead, Step::Approve)),
                        (false, Some(at)) if at.elapsed() > Duration::from_millis(200) => {
                            steps.push((&lead, Step::Withdraw))
                        }
                        (false, _) => {}
                        // Then approved for good.
                        (true, _) => {
                            if !by("chaos-lead") {
                                steps.push((&lead, Step::Approve));
                            }
                            if two && !by("chaos-finance") {
                                steps.push((&finance, Step::Approve));
                            }
                        }
                    }
                }
                Fate::Approve => {
                    // The two approvals in either order, as the seed says.
                    let mut both = vec![(&lead, leader)];
                    if two {
                        both.push((&finance, "chaos-finance"));
                        if id.ends_with(['0', '2', '4', '6', '8', 'a', 'c', 'e']) {
                            both.reverse();
                        }
                    }
                    match both.into_iter().find(|(_, n)| !by(n)) {
                        Some((_, "chaos-console")) => passkey_steps.push("approve"),
                        Some((c, _)) => steps.push((c, Step::Approve)),
                        None => {}
                    }
                }
            }
            for decision in passkey_steps {
                let done = console.decide(&passkey, id, decision).await;
                let mut d = decisions.lock().map_err(|_| "poisoned")?;
                match (done, decision) {
                    (Ok(()), "approve") => {
                        d.approvals += 1;
                        d.passkey_decisions += 1;
                    }
                    (Ok(()), _) => {
                        d.denials += 1;
                        d.passkey_decisions += 1;
                    }
                    (Err(e), _) => {
                        d.failed += 1;
                        d.last_passkey_error = Some(e);
                    }
                }
            }
            for (client, step) in steps {
                // A gateway that does not answer holds up no reviewer.
                let within = Duration::from_secs(20);
                let done = match step {
                    Step::Approve => tokio::time::timeout(
                        within,
                        client.decide(id, Verdict::Approve, "chaos", Duration::from_secs(600)),
                    )
                    .await
                    .map_err(|_| anyhow::anyhow!("timed out"))
                    .and_then(|r| r.map(|_| ())),
                    Step::Deny => tokio::time::timeout(
                        within,
                        client.decide(id, Verdict::Deny, "chaos", Duration::from_secs(600)),
                    )
                    .await
                    .map_err(|_| anyhow::anyhow!("timed out"))
                    .and_then(|r| r.map(|_| ())),
                    Step::Withdraw => tokio::time::timeout(within, client.withdraw(id))
                        .await
                        .map_err(|_| anyhow::anyhow!("timed out"))
                        .and_then(|r| r.map(|_| ())),
                };
                let mut d = decisions.lock().map_err(|_| "poisoned")?;
                match (done, step) {
                    (Ok(()), Step::Approve) => {
                        d.approvals += 1;
                        d.first_yes
                            .entry(id.to_owned())
                            .or_insert_with(Instant::now);
                    }
                    (Ok(()), Step::Deny) => d.denials += 1,
                    (Ok(()), Step::Withdraw) => {
                        d.withdrawals += 1;
                        d.withdrawn.insert(id.to_owned());
                    }
                    // A withdrawal refused (the approval was already used,
                    // or completed a quorum): the dance goes on without it.
                    (Err(_), Step::Withdraw) => {
                        d.failed += 1;
                        d.withdrawn.insert(id.to_owned());
                    }
                    (Err(_), _) => d.failed += 1,
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Approve,
    Deny,
    Withdraw,
}

/// The webhook receiver: every event body it was sent, with its event id
/// header.
#[derive(Default)]
pub struct Hook {
    pub events: Mutex<Vec<(String, Value)>>,
}

/// Start the receiver on a free loopback port: its URL.
pub async fn receiver(hook: Arc<Hook>) -> Result<String, String> {
    use axum::routing::post;
    // The traces of a soak come here too, and are dropped.
    let app = axum::Router::new()
        .route("/v1/traces", post(|| async { axum::http::StatusCode::OK }))
        .route(
            "/hook",
            post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let hook = hook.clone();
                    async move {
                        let id = headers
                            .get("x-countersign-event")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_owned();
                        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        hook.events.lock().map(|mut e| e.push((id, v))).ok();
                        axum::http::StatusCode::OK
                    }
                },
            ),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(format!("http://{addr}/hook"))
}

/// Wait until every proposal's `proposal_created` reached the receiver, or
/// `within` passed.
pub async fn await_delivery(proposals: &[Value], hook: &Hook, within: Duration) {
    let until = Instant::now() + within;
    while Instant::now() < until {
        let delivered: HashSet<String> = hook
            .events
            .lock()
            .map(|e| {
                e.iter()
                    .filter(|(_, v)| v["kind"] == "proposal_created")
                    .filter_map(|(_, v)| v["facts"]["proposal_id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        if proposals
            .iter()
            .all(|p| p["id"].as_str().is_some_and(|id| delivered.contains(id)))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The call a proposal or an execution is for: (account, amount's bits).
pub type CallId = (String, u64);

fn call_of(arguments: &Value) -> CallId {
    (
        arguments["account"].as_str().unwrap_or("").to_owned(),
        arguments["amount"].as_f64().map_or(0, f64::to_bits),
    )
}

/// What the approval checks found, each a list of what broke (empty when
/// the invariant holds).
pub struct Found {
    pub summary: Value,
    pub ok: bool,
}

/// What a run left, for the approval checks.
pub struct Evidence<'a> {
    /// Every proposal, from the store.
    pub proposals: &'a [Value],
    /// The server's record: executions per call.
    pub executions: &'a HashMap<CallId, usize>,
    /// The calls the policies hold.
    pub held_calls: &'a HashSet<CallId>,
    /// The calls `reconcile --list` lists as unknown.
    pub unknown_listed: &'a HashSet<CallId>,
    /// The calls the agents were told their review refused.
    pub refused: &'a HashSet<CallId>,
    /// What the webhook receiver got.
    pub hook: &'a Hook,
    /// `audit verify --reviewers` of each log.
    pub verified: &'a [(String, bool, String)],
    /// What the reviewers did.
    pub decisions: &'a Decisions,
}

/// Check the approval invariants.
pub fn check(ev: &Evidence<'_>) -> Found {
    let Evidence {
        proposals,
        executions,
        held_calls,
        unknown_listed,
        refused,
        hook,
        verified,
        decisions,
    } = *ev;
    let groups_of = |p: &Value| -> Vec<String> {
        p["approvals"]
            .as_array()
            .map(|a| {
                a.iter()
                    .flat_map(|g| {
                        g["groups"]
                            .as_array()
                            .cloned()
                            .unwrap_or_default()
                            .into_iter()
                            .filter_map(|x| x.as_str().map(str::to_owned))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let meets_quorum = |p: &Value| -> bool {
        let n = p["approvals"].as_array().map_or(0, Vec::len);
        match p["arguments"]["currency"].as_str() {
            Some("GBP") => {
                let g = groups_of(p);
                n >= 2 && g.iter().any(|x| x == "finance") && g.iter().any(|x| x == "leads")
            }
            _ => n >= 1,
        }
    };
    let mut consumed: HashMap<CallId, Vec<&Value>> = HashMap::new();
    let mut states: HashMap<String, usize> = HashMap::new();
    for p in proposals {
        *states
            .entry(p["state"].as_str().unwrap_or("?").to_owned())
            .or_default() += 1;
        if p["state"] == "consumed" {
            consumed
                .entry(call_of(&p["arguments"]))
                .or_default()
                .push(p);
        }
    }
    // No held call ran without a consumed proposal that met its quorum.
    // A call whose proposals the store no longer holds (final proposals
    // are forgotten after `idempotency.retention`, ten minutes in a soak)
    // cannot be judged from the store: counted apart, not passed.
    let known: HashSet<CallId> = proposals.iter().map(|p| call_of(&p["arguments"])).collect();
    let mut without_quorum = Vec::new();
    let mut past_retention = 0usize;
    for (call, n) in executions {
        if !held_calls.contains(call) || *n == 0 {
            continue;
        }
        if !known.contains(call) {
            past_retention += 1;
            continue;
        }
        let ok = consumed
            .get(call)
            .is_some_and(|ps| ps.iter().any(|p| meets_quorum(p)));
        if !ok {
            without_quorum.push(format!("{} {}", call.0, f64::from_bits(call.1)));
        }
    }
    // Every consumed proposal: its call ran exactly once, or is an
    // unknown outcome that reconcile lists; one proposal per execution.
    let mut consumed_unaccounted = Vec::new();
    let mut counted_twice = Vec::new();
    for (call, ps) in &consumed {
        let runs = executions.get(call).copied().unwrap_or(0);
        if runs == 0 && !unknown_listed.contains(call) {
            for p in ps {
                consumed_unaccounted.push(p["id"].as_str().unwrap_or("?").to_owned());
            }
        }
        if runs > 1 {
            counted_twice.push(format!(
                "{} {}: {runs} runs",
                call.0,
                f64::from_bits(call.1)
            ));
        }
    }
    // A call refused by its review never ran.
    let refused_but_ran: Vec<String> = refused
        .iter()
        .filter(|c| executions.get(*c).copied().unwrap_or(0) > 0)
        .map(|c| format!("{} {}", c.0, f64::from_bits(c.1)))
        .collect();
    // Every proposal's creation was delivered, under one event id.
    let events = hook.events.lock().map(|e| e.clone()).unwrap_or_default();
    let mut created: HashMap<String, HashSet<String>> = HashMap::new();
    let mut kinds: HashMap<String, usize> = HashMap::new();
    for (id, e) in &events {
        let kind = e["kind"].as_str().unwrap_or("?").to_owned();
        *kinds.entry(kind.clone()).or_default() += 1;
        if kind == "proposal_created" {
            if let Some(p) = e["facts"]["proposal_id"].as_str() {
                created.entry(p.to_owned()).or_default().insert(id.clone());
            }
        }
    }
    let mut not_delivered = Vec::new();
    let mut two_ids = Vec::new();
    for p in proposals {
        let id = p["id"].as_str().unwrap_or("?");
        match created.get(id) {
            None => not_delivered.push(id.to_owned()),
            Some(ids) if ids.len() > 1 => two_ids.push(id.to_owned()),
            Some(_) => {}
        }
    }
    let unverified: Vec<String> = verified
        .iter()
        .filter(|(_, ok, _)| !ok)
        .map(|(dir, _, out)| format!("{dir}: {out}"))
        .collect();
    let mut fates: HashMap<&str, usize> = HashMap::new();
    for f in decisions.fates.values() {
        *fates.entry(f.name()).or_default() += 1;
    }
    let ok = without_quorum.is_empty()
        && consumed_unaccounted.is_empty()
        && counted_twice.is_empty()
        && refused_but_ran.is_empty()
        && not_delivered.is_empty()
        && two_ids.is_empty()
        && unverified.is_empty();
    Found {
        ok,
        summary: json!({
            "held_calls": held_calls.len(),
            "proposals": proposals.len(),
            "proposal_states": states,
            "fates": fates,
            "reviewer_approvals": decisions.approvals,
            "reviewer_denials": decisions.denials,
            "reviewer_withdrawals": decisions.withdrawals,
            "passkey_decisions_in_the_console": decisions.passkey_decisions,
            "last_passkey_refusal": decisions.last_passkey_error,
            "reviewer_decisions_refused": decisions.failed,
            "webhook_events": kinds,
            "executed_without_quorum": without_quorum,
            "held_executions_whose_proposals_retention_removed": past_retention,
            "consumed_without_execution_or_listed_unknown": consumed_unaccounted,
            "approval_counted_for_two_executions": counted_twice,
            "refused_but_ran": refused_but_ran,
            "proposal_created_not_delivered": not_delivered,
            "proposal_created_under_two_ids": two_ids,
            "audit_verify_failed": unverified,
        }),
    }
}

/// Every proposal in the store, through the control API of `base` (tried
/// for up to 20 s: the gateway may be restarting).
pub async fn all_proposals(dir: &Path, base: &str) -> Result<Vec<Value>, String> {
    let key = load_key(&dir.join("chaos-lead.key")).map_err(|e| e.to_string())?;
    let client = Client::new(base, &key).map_err(|e| e.to_string())?;
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        match client.proposals(None).await {
            Ok(p) => return Ok(p),
            Err(e) if Instant::now() > until => return Err(format!("proposals: {e}")),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// `audit verify --reviewers` on each gateway's log: (dir, passed, output).
pub fn verify_logs(
    countersign: &Path,
    dirs: &[std::path::PathBuf],
    reviewers: &Path,
) -> Vec<(String, bool, String)> {
    dirs.iter()
        .map(|d| {
            let out = Command::new(countersign)
                .args(["audit", "verify", "--dir"])
                .arg(d)
                .arg("--reviewers")
                .arg(reviewers)
                .output();
            match out {
                Ok(o) => (
                    d.display().to_string(),
                    o.status.success(),
                    format!(
                        "{}{}",
                        String::from_utf8_lossy(&o.stdout).trim(),
                        String::from_utf8_lossy(&o.stderr).trim()
                    ),
                ),
                Err(e) => (d.display().to_string(), false, e.to_string()),
            }
        })
        .collect()
}
