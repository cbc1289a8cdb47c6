//! The enforcement pipeline without HTTP: `Pipeline::tool_call` driven
//! with the memory store, a hand-moved clock and an in-process upstream.
//!
//! One test per row of DESIGN.md section 3's state table, one per code of
//! section 7, concurrent duplicates, a store failure at each step, two held
//! copies released by one approval, and an approval racing its expiry.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use countersign::audit::log::Staged;
use countersign::audit::{AuditSink, Entries};
use countersign::core::approval::{Proposal, ProposalState, Verdict};
use countersign::core::config::Config;
use countersign::core::identity::Identity;
use countersign::core::ledger::{Answer, Record, State};
use countersign::core::refusal::Outcome;
use countersign::core::reviewers::format_public_key;
use countersign::core::time::{rfc3339, Clock, ManualClock};
use countersign::enforce::answer::{self, Rejection};
use countersign::enforce::outcome::CallOutcome;
use countersign::enforce::permit::{Permit, Sent, ToolConn, Upstream};
use countersign::enforce::pipeline::{CallCtx, Caller, Pipeline};
use countersign::enforce::upstream::UpstreamError;
use countersign::enforce::Proof;
use countersign::enforce::Under;
use countersign::store::{
    Inputs, Ledger, MemoryStore, Outbox, Proposals, Recovery, Reservation, Seen, Store, StoreError,
    StoreFuture, Tasks,
};
use countersign::wire::era::Era;
use countersign::wire::jsonrpc::{raw, Message};
use countersign::wire::sse::UpstreamEvent;
// The memory store's futures are ready at once: test helpers read it
// without a runtime.
use ed25519_dalek::SigningKey;
use futures_util::FutureExt;
use serde_json::{json, Value};
use tokio::sync::{mpsc, Notify};

const START_MS: i64 = 1_796_000_000_000;

// ---------------------------------------------------------------- upstream

/// What the in-process upstream does with the next `tools/call`.
#[derive(Clone)]
enum Step {
    /// Answer with a result (the default).
    Answer,
    /// Answer a JSON-RPC error with this code.
    Error(i64),
    /// The request went out and the answer was lost.
    Lose,
}

/// An in-process MCP server: counts what reaches it, answers as scripted.
#[derive(Default)]
struct Fake {
    /// Every `tools/call` that reached the server: (tool, arguments).
    calls: Mutex<Vec<(String, Value)>>,
    /// What the next calls do (then `Step::Answer`).
    script: Mutex<VecDeque<Step>>,
    /// `ready()` fails this many more times (nothing sent).
    unreachable: AtomicUsize,
    /// While set, calls wait here after they are received (a call in
    /// flight) until notified.
    hold_calls: Mutex<Option<Arc<Notify>>>,
    /// While set, `ready()` waits here (the key is reserved, nothing sent).
    hold_ready: Mutex<Option<Arc<Notify>>>,
    /// Notified when a call reaches the server or waits in `ready()`.
    arrived: Notify,
    /// The resource version `get_account` reports.
    version: Mutex<String>,
    /// How many times the gateway listed the tools.
    lists: AtomicUsize,
    /// Replaces the listed tools when set (a server that changed).
    tools: Mutex<Option<Value>>,
}

impl Fake {
    fn new() -> Arc<Fake> {
        let f = Fake::default();
        *f.version.lock().unwrap() = "v1".into();
        Arc::new(f)
    }

    fn runs(&self, tool: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _)| t == tool)
            .count()
    }

    fn next(&self, step: Step) {
        self.script.lock().unwrap().push_back(step);
    }
}

struct FakeConn(Arc<Fake>);

/// The fake as the pipeline's upstream.
struct Up(Arc<Fake>);

impl std::ops::Deref for Up {
    type Target = Fake;
    fn deref(&self) -> &Fake {
        &self.0
    }
}

impl Upstream for Up {
    type Conn = FakeConn;

    async fn ready(&self) -> Result<FakeConn, UpstreamError> {
        let hold = self.hold_ready.lock().unwrap().clone();
        if let Some(hold) = hold {
            self.arrived.notify_one();
            hold.notified().await;
        }
        if self
            .unreachable
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(UpstreamError::Connect {
                server: "pay".into(),
                reason: "connection refused".into(),
            });
        }
        Ok(FakeConn(self.0.clone()))
    }

    async fn list_tools(&self, _cursor: Option<String>) -> Result<Message, UpstreamError> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        let read = json!({"readOnlyHint": true});
        let write = json!({"readOnlyHint": false, "destructiveHint": false});
        let tools = self.tools.lock().unwrap().clone().unwrap_or_else(|| {
            json!([
                {"name": "get_balance", "annotations": read},
                {"name": "get_account", "annotations": read},
                {"name": "refund", "annotations": write},
                {"name": "charge_card", "annotations": write},
                // No annotations: MCP's defaults make it destructive.
                {"name": "transfer"},
            ])
        });
        Ok(Message::response(
            json!("list"),
            raw(&json!({ "tools": tools })),
        ))
    }
}

impl ToolConn for FakeConn {
    async fn call_tool(
        &self,
        permit: Permit,
        _events: Option<mpsc::Sender<UpstreamEvent>>,
        _timeout: Duration,
    ) -> Sent {
        let (request, receipt) = permit.spend();
        let params = request.params_value().unwrap();
        let tool = params["name"].as_str().unwrap().to_owned();
        let n = {
            let mut calls = self.0.calls.lock().unwrap();
            calls.push((tool.clone(), params["arguments"].clone()));
            calls.len()
        };
        let hold = self.0.hold_calls.lock().unwrap().clone();
        if let Some(hold) = hold {
            self.0.arrived.notify_one();
            hold.notified().await;
        }
        let step = self
            .0
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Step::Answer);
        let id = request.id.clone().unwrap_or(Value::Null);
        let answer = match step {
            Step::Answer if tool == "get_account" => {
                let version = self.0.version.lock().unwrap().clone();
                Ok(Message::response(
                    id,
                    raw(&json!({"content": [], "structuredContent": {"version": version}})),
                ))
            }
            Step::Answer => Ok(Message::response(
                id,
                raw(
                    &json!({"content": [{"type": "text", "text": format!("done #{n}")}],
                            "structuredContent": {"n": n}}),
                ),
            )),
            Step::Error(code) => Ok(Message::error(id, code, "refused", None)),
            Step::Lose => Err(UpstreamError::Lost {
                server: "pay".into(),
                reason: "the child exited".into(),
            }),
        };
        receipt.sent(answer)
    }
}

// ---------------------------------------------------------------- store

/// Which store operation fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fail {
    None,
    Get,
    Reserve,
    Dispatch,
    Complete,
    /// The move to `complete` is applied, and then reported failed once
    /// (a commit whose reply was lost when the database restarted).
    CompleteLanded,
    Proposals,
}

/// The memory store, with one operation made to fail, and a hook run when
/// proposals are listed (to move the clock between a look and a reservation).
struct Flaky {
    inner: MemoryStore,
    fail: Mutex<Fail>,
    on_list: Mutex<Option<Box<dyn Fn() + Send>>>,
}

impl Flaky {
    fn failing(&self, op: Fail) -> Result<(), StoreError> {
        if *self.fail.lock().unwrap() == op {
            return Err(StoreError::Backend {
                op: "injected failure",
                reason: format!("{op:?}"),
                cause: None,
            });
        }
        Ok(())
    }
}

fn boxed<'a, T: Send + 'a>(
    r: Result<T, StoreError>,
) -> Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>> {
    Box::pin(async move { r })
}

/// No guards in these tests: a call under one is refused.
impl countersign::store::guards::Guards for Flaky {}

/// No review console in these tests.
impl countersign::store::console::ConsoleState for Flaky {}

impl Store for Flaky {}

impl Ledger for Flaky {
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>> {
        if let Err(e) = self.failing(Fail::Get) {
            return boxed(Err(e));
        }
        self.inner.get(key)
    }

    fn reserve_with(
        &self,
        key: String,
        record: Record,
        now_ms: i64,
        approval: Option<String>,
    ) -> StoreFuture<'_, Reservation> {
        if let Err(e) = self.failing(Fail::Reserve) {
            return boxed(Err(e));
        }
        self.inner.reserve_with(key, record, now_ms, approval)
    }

    fn transition_telling(
        &self,
        key: String,
        from: State,
        to: Record,
        outbox: Option<(u64, String)>,
        notices: Vec<countersign::core::notify::Notice>,
    ) -> StoreFuture<'_, bool> {
        let op = match to.state {
            State::Dispatched => Fail::Dispatch,
            State::Complete => Fail::Complete,
            _ => Fail::None,
        };
        if op == Fail::Complete && *self.fail.lock().unwrap() == Fail::CompleteLanded {
            *self.fail.lock().unwrap() = Fail::None;
            return Box::pin(async move {
                self.inner
                    .transition_telling(key, from, to, outbox, notices)
                    .await?;
                Err(StoreError::Backend {
                    op: "injected failure",
                    reason: "the commit's reply was lost".into(),
                    cause: None,
                })
            });
        }
        if op != Fail::None {
            if let Err(e) = self.failing(op) {
                return boxed(Err(e));
            }
        }
        self.inner
            .transition_telling(key, from, to, outbox, notices)
    }

    fn recover(&self) -> StoreFuture<'_, Recovery> {
        self.inner.recover()
    }

    fn gc(&self, now_ms: i64) -> StoreFuture<'_, usize> {
        self.inner.gc(now_ms)
    }

    fn list(&self, state: Option<State>) -> StoreFuture<'_, Vec<(String, Record)>> {
        self.inner.list(state)
    }
}

impl Proposals for Flaky {
    fn put_proposal_with(
        &self,
        proposal: Proposal,
        expect: Option<ProposalState>,
        notices: Vec<countersign::core::notify::Notice>,
    ) -> StoreFuture<'_, bool> {
        if let Err(e) = self.failing(Fail::Proposals) {
            return boxed(Err(e));
        }
        self.inner.put_proposal_with(proposal, expect, notices)
    }

    fn get_proposal<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Proposal>> {
        self.inner.get_proposal(id)
    }

    fn list_proposals(&self) -> StoreFuture<'_, Vec<Proposal>> {
        if let Err(e) = self.failing(Fail::Proposals) {
            return boxed(Err(e));
        }
        Box::pin(async move {
            let out = self.inner.list_proposals().await;
            if let Some(hook) = self.on_list.lock().unwrap().as_ref() {
                hook();
            }
            out
        })
    }

    fn gc_proposals(&self, before_ms: i64) -> StoreFuture<'_, usize> {
        self.inner.gc_proposals(before_ms)
    }
}

impl Outbox for Flaky {
    fn outbox(&self) -> StoreFuture<'_, Vec<(u64, String)>> {
        self.inner.outbox()
    }

    fn outbox_clear(&self, upto: u64) -> StoreFuture<'_, usize> {
        self.inner.outbox_clear(upto)
    }
}

impl Seen for Flaky {
    fn pin_first_use(&self, pins: Vec<(String, String)>) -> StoreFuture<'_, usize> {
        self.inner.pin_first_use(pins)
    }

    fn first_use_pins(&self) -> StoreFuture<'_, Vec<String>> {
        self.inner.first_use_pins()
    }

    fn use_nonce(&self, nonce: String, until: i64, now: i64) -> StoreFuture<'_, bool> {
        self.inner.use_nonce(nonce, until, now)
    }
}

impl Inputs for Flaky {}

impl Tasks for Flaky {}

// ---------------------------------------------------------------- fixture

const POLICIES: &str = r#"
@id("read-only")
permit (principal, action == Action::"call", resource) when { resource.readOnly };
@id("writes-need-approval")
permit (principal, action == Action::"call", resource) when { context.approved };
@id("charge-ceiling")
forbid (principal, action == Action::"call", resource == Tool::"pay/charge_card")
when { context.arguments has amount && context.arguments.amount.greaterThan(decimal("1000.0")) };
@id("reviewers-approve")
permit (principal, action == Action::"approve", resource);
@id("changed-tools-need-approval")
forbid (principal, action == Action::"call", resource)
when { resource has definitionChanged && resource.definitionChanged && !context.approved };
@id("solo-confirms-writes")
permit (principal in Group::"solo", action == Action::"confirm", resource)
when { !resource.destructive };
"#;

/// Calls to `refund` run unattended (a write without approval).
const UNATTENDED_REFUND: &str = r#"
@id("refund-unattended")
permit (principal, action == Action::"call", resource == Tool::"pay/refund");
"#;

struct Fixture {
    pipeline: Pipeline,
    store: Arc<Flaky>,
    clock: Arc<ManualClock>,
    fake: Up,
    caller: Caller,
    reviewer: SigningKey,
    _dir: tempfile::TempDir,
}

fn fixture(hold: &str) -> Fixture {
    fixture_with(hold, "")
}

fn fixture_with(hold: &str, extra_config: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies).unwrap();
    let schema = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/schema.cedarschema"),
    )
    .unwrap();
    std::fs::write(policies.join("schema.cedarschema"), schema).unwrap();
    std::fs::write(
        policies.join("test.cedar"),
        format!("{POLICIES}{UNATTENDED_REFUND}"),
    )
    .unwrap();
    let reviewer = SigningKey::from_bytes(&[7u8; 32]);
    std::fs::write(
        policies.join("reviewers.toml"),
        format!(
            "[[reviewers]]\nname = \"bob\"\npublic_key = \"{}\"\ngroups = [\"leads\"]\ntenants = [\"*\"]\n",
            format_public_key(&reviewer.verifying_key())
        ),
    )
    .unwrap();
    let text = format!(
        r#"
[gateway]
data_dir = "{data}"
policies = "{policies}"

[approvals]
hold = "{hold}"
progress_interval = "100ms"

[retry]
max_attempts = 3
base_delay = "1ms"
max_delay = "2ms"

[circuit]
failure_threshold = 4
cooldown = "1h"

[servers.pay]
command = "unused-the-upstream-is-in-process"
{extra_config}
"#,
        data = dir.path().join("data").display(),
        policies = policies.display(),
    );
    let config = Config::parse(&text, &dir.path().join("countersign.toml")).unwrap();
    let policies = countersign::cli::files::load_policies(&policies, None).unwrap();
    let store = Arc::new(Flaky {
        inner: MemoryStore::default(),
        fail: Mutex::new(Fail::None),
        on_list: Mutex::new(None),
    });
    let clock = Arc::new(ManualClock::new(START_MS));
    let pipeline = Pipeline::new(
        Arc::new(config),
        store.clone(),
        policies,
        None,
        clock.clone(),
    );
    Fixture {
        pipeline,
        store,
        clock,
        fake: Up(Fake::new()),
        caller: Caller {
            identity: Arc::new(Identity {
                principal: "agent-7".into(),
                tenant: "acme".into(),
                groups: vec!["agents".into()],
                ..Default::default()
            }),
            scope: Some("session-1".into()),
            subject: None,
        },
        reviewer,
        _dir: dir,
    }
}

fn request(tool: &str, args: Value, key: Option<&str>) -> Message {
    let mut params = json!({ "name": tool, "arguments": args });
    if let Some(k) = key {
        params["_meta"] = json!({ "dev.countersign/idempotency-key": k });
    }
    Message::request(json!(1), "tools/call", Some(raw(&params)))
}

fn charge(amount: i64) -> Value {
    json!({ "account": "acct-1", "amount": amount, "currency": "USD" })
}

impl Fixture {
    async fn call(&self, tool: &str, args: Value, key: Option<&str>) -> CallOutcome {
        let ctx = CallCtx {
            caller: &self.caller,
            server: "pay",
            era: Era::Handshake,
            events: None,
            upstream: &self.fake,
            asks: None,
            task: false,
        };
        self.pipeline
            .tool_call(&ctx, request(tool, args, key))
            .await
    }

    fn fail(&self, op: Fail) {
        *self.store.fail.lock().unwrap() = op;
    }

    fn record(&self, key: &str) -> Option<Record> {
        let k = countersign::core::ledger::storage_key("acme", "agent-7", key);
        self.store.inner.get(&k).now_or_never().unwrap().unwrap()
    }

    fn pending(&self) -> Vec<Proposal> {
        self.store
            .inner
            .list_proposals()
            .now_or_never()
            .unwrap()
            .unwrap()
            .into_iter()
            .filter(|p| p.state == ProposalState::Pending)
            .collect()
    }

    /// Sign and record a reviewer's decision on `p`, valid for `ttl`.
    async fn decide(&self, p: &Proposal, verdict: Verdict, ttl: Duration) {
        let now = self.clock.now_ms();
        let policies = self.pipeline.policies();
        let statement = p.statement(
            verdict,
            "bob",
            "checked",
            &rfc3339(now),
            &rfc3339(now + ttl.as_millis() as i64),
            Some(policies.digest()),
        );
        let signature = statement.sign(&self.reviewer).unwrap();
        let bob = policies
            .reviewers()
            .get("bob")
            .expect("bob is a reviewer")
            .clone();
        let under = Under {
            policy_set: policies.digest(),
            reviewers: policies.reviewers(),
        };
        self.pipeline
            .book()
            .decide(
                &p.id,
                statement,
                Proof::Ed25519(&signature),
                &bob,
                under,
                |_| Ok(()),
            )
            .await
            .unwrap();
    }
}

/// The `countersign` code the client is told, through the answer module.
fn code(o: CallOutcome) -> String {
    let m = answer::render(o, json!(1), Era::Handshake);
    let result: Value = serde_json::from_str(m.result.as_ref().unwrap().get()).unwrap();
    assert_eq!(result["isError"], json!(true), "{result}");
    result["structuredContent"]["countersign"]["code"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn answered_n(o: &CallOutcome) -> u64 {
    match o {
        CallOutcome::Answered(m) => {
            let v: Value = serde_json::from_str(m.result.as_ref().unwrap().get()).unwrap();
            v["structuredContent"]["n"].as_u64().unwrap()
        }
        other => panic!("not answered: {other:?}"),
    }
}

// ------------------------------------------------ section 3: the state table

/// Hold the original at `hold` (its key's record then `state`; none while
/// a call with nothing to consume is before its dispatch, whose commit
/// claims the key), send a retry with the same key, check it waits,
/// release the original: the retry gets the original's answer, and the
/// call ran once.
async fn a_retry_waits_while_the_original_is(state: Option<State>) {
    let f = fixture("0s");
    let hold = Arc::new(Notify::new());
    let slot = match state {
        None | Some(State::Reserved) => &f.fake.hold_ready,
        _ => &f.fake.hold_calls,
    };
    *slot.lock().unwrap() = Some(hold.clone());
    let first = f.call("refund", json!({"id": 1}), Some("k"));
    let retry = async {
        f.fake.arrived.notified().await;
        assert_eq!(f.record("k").map(|r| r.state), state);
        let retry = f.call("refund", json!({"id": 1}), Some("k"));
        tokio::pin!(retry);
        // The retry waits: it does not finish while the original is held.
        tokio::select! {
            biased;
            _ = &mut retry => panic!("the retry finished before the original"),
            () = tokio::task::yield_now() => {}
        }
        hold.notify_one();
        retry.await
    };
    let (first, retry) = tokio::join!(first, retry);
    assert_eq!(answered_n(&first), 1);
    match retry {
        CallOutcome::Replayed { key, .. } => assert_eq!(key, "k"),
        other => panic!("{other:?}"),
    }
    assert_eq!(f.fake.runs("refund"), 1);
}

#[tokio::test]
async fn reserved_a_retry_waits_for_the_original_and_gets_its_answer() {
    // Led, and nothing sent yet (the connection is being made): a call
    // with no approval to consume and no guards to take is reserved in
    // the commit that makes it `dispatched`, so until then the key is held
    // in this process only, and nothing is in the ledger.
    a_retry_waits_while_the_original_is(None).await;
}

#[tokio::test]
async fn dispatched_a_retry_waits_for_the_original_and_gets_its_answer() {
    // Durably dispatched before the server saw a byte.
    a_retry_waits_while_the_original_is(Some(State::Dispatched)).await;
}

/// A call with nothing to consume claims its key with its dispatch. When
/// another process sharing the store completes the same call under the key
/// between this call's lookup and its claim, the claim writes nothing, and
/// the call follows that record: it replays the answer, and runs nothing.
#[tokio::test]
async fn a_claim_that_finds_the_key_completed_elsewhere_replays_that_answer_and_runs_nothing() {
    let f = fixture("0s");
    // The record the other process leaves: the same call, complete.
    let first = f.call("refund", json!({"id": 1}), Some("k0")).await;
    assert_eq!(answered_n(&first), 1);
    let theirs = f.record("k0").unwrap();
    assert_eq!(theirs.state, State::Complete);
    let hold = Arc::new(Notify::new());
    *f.fake.hold_ready.lock().unwrap() = Some(hold.clone());
    let call = f.call("refund", json!({"id": 1}), Some("k"));
    let elsewhere = async {
        f.fake.arrived.notified().await;
        assert_eq!(f.record("k"), None, "led here, not yet claimed");
        let key = countersign::core::ledger::storage_key("acme", "agent-7", "k");
        let wrote = f
            .store
            .inner
            .reserve(key, theirs.clone(), f.clock.now_ms())
            .now_or_never()
            .unwrap()
            .unwrap();
        assert_eq!(wrote, Reservation::Reserved);
        *f.fake.hold_ready.lock().unwrap() = None;
        hold.notify_one();
    };
    let (outcome, ()) = tokio::join!(call, elsewhere);
    match outcome {
        CallOutcome::Replayed { key, .. } => assert_eq!(key, "k"),
        other => panic!("{other:?}"),
    }
    assert_eq!(f.fake.runs("refund"), 1, "it ran once, for k0");
    assert_eq!(f.record("k"), Some(theirs), "the other's record, untouched");
}

#[tokio::test]
async fn complete_a_retry_gets_the_same_answer_under_its_own_id_never_rerun() {
    let f = fixture("0s");
    let first = f.call("refund", json!({"id": 1}), Some("k")).await;
    assert_eq!(answered_n(&first), 1);
    assert_eq!(f.record("k").unwrap().state, State::Complete);
    let retry = f.call("refund", json!({"id": 1}), Some("k")).await;
    let CallOutcome::Replayed {
        answer,
        key,
        answered_at,
    } = retry
    else {
        panic!("{retry:?}")
    };
    assert_eq!(key, "k");
    assert!(!answered_at.is_empty());
    let m = answer::render(
        CallOutcome::Replayed {
            answer,
            key,
            answered_at,
        },
        json!(42),
        Era::Handshake,
    );
    assert_eq!(m.id, Some(json!(42)));
    let v: Value = serde_json::from_str(m.result.unwrap().get()).unwrap();
    assert_eq!(v["structuredContent"]["n"], json!(1));
    assert_eq!(v["_meta"]["dev.countersign/replayed"]["key"], json!("k"));
    assert_eq!(f.fake.runs("refund"), 1);
}

#[tokio::test]
async fn not_dispatched_the_key_is_free_and_a_retry_runs() {
    let f = fixture("0s");
    // Every attempt fails to connect: proven not sent.
    f.fake.unreachable.store(3, Ordering::SeqCst);
    let first = f.call("refund", json!({"id": 1}), Some("k")).await;
    assert_eq!(code(first), "upstream_unavailable");
    // Never claimed: its reservation is made with the dispatch.
    assert_eq!(f.record("k"), None);
    // The server refusing unprocessed (-32602) is not dispatched either.
    f.fake.next(Step::Error(-32602));
    let refused = f.call("refund", json!({"id": 1}), Some("k")).await;
    assert!(
        matches!(refused, CallOutcome::Answered(ref m) if m.error_code() == Some(-32602)),
        "{refused:?}"
    );
    assert_eq!(f.record("k").unwrap().state, State::NotDispatched);
    let retry = f.call("refund", json!({"id": 1}), Some("k")).await;
    assert_eq!(answered_n(&retry), 2, "a fresh attempt ran");
    assert_eq!(f.record("k").unwrap().state, State::Complete);
}

#[tokio::test]
async fn unknown_a_retry_is_told_outcome_unknown_and_never_reruns() {
    let f = fixture("0s");
    f.fake.next(Step::Lose);
    let first = f.call("refund", json!({"id": 1}), Some("k")).await;
    assert!(
        matches!(first, CallOutcome::Failed(ref e) if e.dispatched()),
        "{first:?}"
    );
    assert_eq!(code(first), "outcome_unknown");
    assert_eq!(f.record("k").unwrap().state, State::Unknown);
    let retry = f.call("refund", json!({"id": 1}), Some("k")).await;
    assert!(matches!(
        retry,
        CallOutcome::Refused {
            why: Outcome::Unknown,
            ..
        }
    ));
    assert_eq!(code(retry), "outcome_unknown");
    assert_eq!(f.fake.runs("refund"), 1);
}

#[tokio::test]
async fn a_write_answered_request_cancelled_after_dispatch_is_unknown_not_final() {
    let f = fixture("0s");
    f.fake.next(Step::Error(-32800));
    let o = f.call("refund", json!({"id": 1}), Some("k")).await;
    assert_eq!(code(o), "outcome_unknown");
    assert_eq!(f.record("k").unwrap().state, State::Unknown);
    let unknown = countersign::enforce::reconcile::list_unknown_in(&f.store.inner)
        .now_or_never()
        .unwrap()
        .unwrap();
    assert_eq!(unknown.len(), 1);
    assert_eq!(unknown[0].2, "k");
    let retry = f.call("refund", json!({"id": 1}), Some("k")).await;
    assert_eq!(
        code(retry),
        "outcome_unknown",
        "never replayed as cancelled"
    );
    assert_eq!(f.fake.runs("refund"), 1);
}

// ---------------------------------------------------- section 7: the codes

#[tokio::test]
async fn code_policy_denied() {
    let f = fixture("0s");
    let o = f.call("charge_card", charge(5000), Some("k")).await;
    assert_eq!(code(o), "policy_denied");
    assert_eq!(f.fake.runs("charge_card"), 0);
    assert!(f.record("k").is_none(), "a refusal leaves the key free");
}

#[tokio::test]
async fn code_approval_pending() {
    let f = fixture("0s");
    let o = f.call("charge_card", charge(10), Some("k")).await;
    assert_eq!(code(o), "approval_pending");
    assert_eq!(f.pending().len(), 1);
    assert_eq!(f.fake.runs("charge_card"), 0);
}

#[tokio::test]
async fn code_approval_denied() {
    let f = fixture("0s");
    f.call("charge_card", charge(10), Some("k")).await;
    let p = f.pending().remove(0);
    f.decide(&p, Verdict::Deny, Duration::from_secs(600)).await;
    let o = f.call("charge_card", charge(10), Some("k")).await;
    assert_eq!(code(o), "approval_denied");
    assert_eq!(f.fake.runs("charge_card"), 0);
}

#[tokio::test]
async fn code_approval_expired() {
    let f = fixture("0s");
    f.call("charge_card", charge(10), Some("k")).await;
    let p = f.pending().remove(0);
    f.decide(&p, Verdict::Approve, Duration::from_secs(60))
        .await;
    f.clock.advance(Duration::from_secs(61));
    let o = f.call("charge_card", charge(10), Some("k")).await;
    assert_eq!(code(o), "approval_expired");
    assert_eq!(f.fake.runs("charge_card"), 0);
}

#[tokio::test]
async fn code_drift_rejected() {
    let f = fixture("0s");
    f.call("refund", json!({"id": 1}), Some("k")).await;
    let o = f.call("refund", json!({"id": 2}), Some("k")).await;
    assert_eq!(code(o), "drift_rejected");
    assert_eq!(f.fake.runs("refund"), 1);
}

#[tokio::test]
async fn code_remap_rejected() {
    let f = fixture("0s");
    f.call("refund", json!({"id": 1}), Some("k")).await;
    let o = f.call("get_balance", json!({"id": 1}), Some("k")).await;
    assert_eq!(code(o), "remap_rejected");
    assert_eq!(f.fake.runs("get_balance"), 0);
}

#[tokio::test]
async fn code_stale_resource_version() {
    let f = fixture_with(
        "0s",
        r#"[servers.pay.tools.charge_card]
version_probe = { tool = "get_account", arguments = { id = "/account" }, pointer = "/structuredContent/version" }"#,
    );
    f.call("charge_card", charge(10), Some("k")).await;
    let p = f.pending().remove(0);
    assert_eq!(p.resource_version.as_deref(), Some("v1"));
    f.decide(&p, Verdict::Approve, Duration::from_secs(600))
        .await;
    // The account changed after the reviewer looked.
    *f.fake.version.lock().unwrap() = "v2".into();
    let o = f.call("charge_card", charge(10), Some("k")).await;
    assert_eq!(code(o), "stale_resource_version");
    assert_eq!(f.fake.runs("charge_card"), 0);
    assert!(
        f.fake.runs("get_account") >= 2,
        "the probe ran at each look"
    );
}

#[tokio::test]
async fn code_outcome_unknown() {
    let f = fixture("0s");
    f.fake.next(Step::Lose);
    let o = f.call("refund", json!({"id": 1}), Some("k")).await;
    assert_eq!(code(o), "outcome_unknown");
}

#[tokio::test]
async fn code_upstream_unavailable_and_the_circuit_opens() {
    let f = fixture("0s");
    f.fake.unreachable.store(100, Ordering::SeqCst);
    let o = f.call("refund", json!({"id": 1}), None).await;
    assert_eq!(code(o), "upstream_unavailable");
    assert_eq!(
        f.pipeline.circuits()["pay"],
        "closed",
        "3 failures, threshold 4"
    );
    let o = f.call("refund", json!({"id": 1}), None).await;
    assert_eq!(code(o), "upstream_unavailable");
    // The fourth failed attempt opened the circuit: the next call is
    // refused without trying to connect.
    assert_eq!(f.pipeline.circuits()["pay"], "open");
    let left = f.fake.unreachable.load(Ordering::SeqCst);
    let o = f.call("refund", json!({"id": 2}), None).await;
    assert!(matches!(o, CallOutcome::CircuitOpen { .. }), "{o:?}");
    assert_eq!(code(o), "upstream_unavailable");
    assert_eq!(f.fake.unreachable.load(Ordering::SeqCst), left);
}

#[tokio::test(start_paused = true)]
async fn the_breaker_closes_after_a_trial_the_ledger_answered_and_calls_reach_the_upstream_again() {
    let f = fixture("0s");
    assert_eq!(
        answered_n(&f.call("refund", json!({"id": 1}), Some("done")).await),
        1
    );
    // Four failed attempts open the circuit (threshold 4): three of the
    // first call, one of the second, whose next attempt is refused.
    f.fake.unreachable.store(4, Ordering::SeqCst);
    for n in 0..2 {
        let o = f.call("refund", json!({"id": 10 + n}), None).await;
        assert_eq!(code(o), "upstream_unavailable");
    }
    assert_eq!(f.pipeline.circuits()["pay"], "open");
    assert_eq!(f.pipeline.circuits()["pay"], "open");
    // After the cooldown, the first call is one the ledger answers itself:
    // a replay. It must not use up the breaker's one trial.
    tokio::time::advance(Duration::from_secs(3601)).await;
    let replay = f.call("refund", json!({"id": 1}), Some("done")).await;
    assert!(matches!(replay, CallOutcome::Replayed { .. }), "{replay:?}");
    let next = f.call("refund", json!({"id": 2}), Some("fresh")).await;
    assert_eq!(answered_n(&next), 2, "the upstream receives calls again");
    assert_eq!(f.pipeline.circuits()["pay"], "closed");
}

#[tokio::test]
async fn malformed_params_are_invalid_params_and_malformed_requests_invalid_request() {
    let f = fixture("0s");
    let o = f
        .call("refund", json!({"id": 1, "big": 9007199254740993u64}), None)
        .await;
    assert!(matches!(o, CallOutcome::Invalid(_)), "{o:?}");
    let m = answer::render(o, json!(1), Era::Handshake);
    assert_eq!(m.error_code(), Some(-32602));
    let m = Rejection::NoSession.message(json!(1));
    assert_eq!(m.error_code(), Some(-32600));
    assert_eq!(f.fake.calls.lock().unwrap().len(), 0);
}

// --------------------------------------------------------- concurrency

#[tokio::test]
async fn concurrent_duplicates_dispatch_exactly_once() {
    let f = Arc::new(fixture("0s"));
    let hold = Arc::new(Notify::new());
    *f.fake.hold_calls.lock().unwrap() = Some(hold.clone());
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let f = f.clone();
        tasks.push(tokio::spawn(async move {
            f.call("refund", json!({"id": 1}), Some("k")).await
        }));
    }
    f.fake.arrived.notified().await;
    // Let every duplicate reach its wait behind the original.
    for _ in 0..64 {
        tokio::task::yield_now().await;
    }
    hold.notify_one();
    let mut fresh = 0;
    for t in tasks {
        match t.await.unwrap() {
            CallOutcome::Answered(_) => fresh += 1,
            CallOutcome::Replayed { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(fresh, 1);
    assert_eq!(f.fake.runs("refund"), 1);
}

#[tokio::test]
async fn two_held_copies_are_released_by_one_approval_and_run_once() {
    let f = Arc::new(fixture("30s"));
    let a = tokio::spawn({
        let f = f.clone();
        async move { f.call("charge_card", charge(10), Some("k")).await }
    });
    let b = tokio::spawn({
        let f = f.clone();
        async move { f.call("charge_card", charge(10), Some("k")).await }
    });
    // Wait for the proposal the held call made.
    let mut changes = f.pipeline.book().subscribe();
    let p = loop {
        if let Some(p) = f.pending().pop() {
            break p;
        }
        changes.recv().await.unwrap();
    };
    f.decide(&p, Verdict::Approve, Duration::from_secs(600))
        .await;
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    let fresh = [&a, &b]
        .iter()
        .filter(|o| matches!(o, CallOutcome::Answered(_)))
        .count();
    assert_eq!(fresh, 1, "{a:?} {b:?}");
    assert!(matches!(a, CallOutcome::Replayed { .. }) || matches!(b, CallOutcome::Replayed { .. }));
    assert_eq!(f.fake.runs("charge_card"), 1);
    let p = f
        .store
        .inner
        .get_proposal(&p.id)
        .now_or_never()
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(p.state, ProposalState::Consumed);
}

#[tokio::test]
async fn an_approval_that_expires_between_its_lookup_and_the_reservation_is_not_used() {
    let f = Arc::new(fixture("0s"));
    f.call("charge_card", charge(10), Some("k")).await;
    let p = f.pending().remove(0);
    f.decide(&p, Verdict::Approve, Duration::from_secs(60))
        .await;
    // 1 ms before expiry the gate finds the approval usable; by the time
    // of the reservation the clock has passed its expiry.
    f.clock.advance(Duration::from_millis(59_999));
    let clock = f.clock.clone();
    *f.store.on_list.lock().unwrap() = Some(Box::new(move || {
        clock.advance(Duration::from_millis(2));
    }));
    let o = f.call("charge_card", charge(10), Some("k")).await;
    assert_eq!(code(o), "approval_expired");
    assert_eq!(f.fake.runs("charge_card"), 0);
    let p = f
        .store
        .inner
        .get_proposal(&p.id)
        .now_or_never()
        .unwrap()
        .unwrap()
        .unwrap();
    assert_ne!(p.state, ProposalState::Consumed);
    assert!(f.record("k").is_none(), "the key stays free");
}

#[tokio::test]
async fn an_approval_used_just_before_its_expiry_runs_once() {
    let f = fixture("0s");
    f.call("charge_card", charge(10), Some("k")).await;
    let p = f.pending().remove(0);
    f.decide(&p, Verdict::Approve, Duration::from_secs(60))
        .await;
    f.clock.advance(Duration::from_millis(59_999));
    let o = f.call("charge_card", charge(10), Some("k")).await;
    assert_eq!(answered_n(&o), 1);
    let again = f.call("charge_card", charge(10), Some("k2")).await;
    assert_eq!(
        code(again),
        "approval_pending",
        "single use: another key needs a new yes"
    );
    assert_eq!(f.fake.runs("charge_card"), 1);
}

// --------------------------------------------- the store fails at each step

#[tokio::test]
async fn a_store_failure_at_each_step_before_dispatch_fails_closed() {
    for (op, tool, args) in [
        (Fail::Get, "refund", json!({"id": 1})),
        (Fail::Reserve, "refund", json!({"id": 1})),
        (Fail::Dispatch, "refund", json!({"id": 1})),
        (Fail::Proposals, "charge_card", charge(10)),
    ] {
        let f = fixture("0s");
        f.fail(op);
        let o = f.call(tool, args.clone(), Some("k")).await;
        assert_eq!(code(o), "upstream_unavailable", "{op:?}");
        assert_eq!(
            f.fake.calls.lock().unwrap().len(),
            0,
            "{op:?}: nothing sent"
        );
        // Once the store is back, the same call runs (or asks for its yes).
        f.fail(Fail::None);
        let o = f.call(tool, args, Some("k")).await;
        if tool == "refund" {
            assert_eq!(answered_n(&o), 1, "{op:?}");
        } else {
            assert_eq!(code(o), "approval_pending", "{op:?}");
        }
    }
}

/// The store is asked again for a while before the call is answered
/// `outcome_unknown`: paused time runs that wait at once.
#[tokio::test(start_paused = true)]
async fn a_store_failure_after_the_answer_never_runs_the_call_again() {
    let f = fixture("0s");
    f.fail(Fail::Complete);
    let o = f.call("refund", json!({"id": 1}), Some("k")).await;
    // The server ran it, but the ledger could not record the answer: the
    // client is told `outcome_unknown` (the call ran), not a success that a
    // retry would then contradict.
    assert_eq!(code(o), "outcome_unknown");
    assert_eq!(f.fake.runs("refund"), 1);
    // It stays dispatched (or becomes unknown once the store takes the
    // transition again), which no retry may run again.
    let state = f.record("k").unwrap().state;
    assert!(
        matches!(state, State::Dispatched | State::Unknown),
        "{state:?}"
    );
    f.fail(Fail::None);
    let retry = f.call("refund", json!({"id": 1}), Some("k")).await;
    assert_eq!(code(retry), "outcome_unknown");
    assert_eq!(f.fake.runs("refund"), 1);
}

#[tokio::test]
async fn an_answer_whose_commit_landed_unacknowledged_is_answered_as_recorded() {
    let f = fixture("0s");
    f.fail(Fail::CompleteLanded);
    let o = f.call("refund", json!({"id": 1}), Some("k")).await;
    // The store reported the write failed, but it had landed: asked again,
    // the store has the answer, so the client gets it (not
    // `outcome_unknown`, which the ledger would contradict on a retry and
    // never list for reconciliation).
    let first = answered_n(&o);
    assert_eq!(f.fake.runs("refund"), 1);
    assert_eq!(f.record("k").unwrap().state, State::Complete);
    match f.call("refund", json!({"id": 1}), Some("k")).await {
        CallOutcome::Replayed {
            answer: Answer::Result(text),
            ..
        } => {
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["structuredContent"]["n"], json!(first));
        }
        other => panic!("not replayed: {other:?}"),
    }
    assert_eq!(f.fake.runs("refund"), 1);
}

// ------------------------------------------------------------- audit

/// Entries kept in memory; staged ones are marked.
#[derive(Default)]
struct MemorySink {
    entries: Mutex<Vec<(String, bool)>>,
    next: AtomicUsize,
}

impl AuditSink for MemorySink {
    fn record_all(&self, entries: Entries) {
        let mut all = self.entries.lock().unwrap();
        all.extend(entries.into_iter().map(|(k, _)| (k.to_owned(), false)));
    }
    fn stage(&self, entries: Entries) -> Result<Staged, Entries> {
        let kinds: Vec<String> = entries.iter().map(|(k, _)| (*k).to_owned()).collect();
        self.entries
            .lock()
            .unwrap()
            .extend(kinds.into_iter().map(|k| (k, true)));
        Ok(Staged {
            id: self.next.fetch_add(1, Ordering::SeqCst) as u64,
            text: String::new(),
            entries: Vec::new(),
        })
    }
    fn record_staged(&self, _staged: Staged) {}
    fn unstage(&self, _staged: Staged) {}
    fn arguments_fields_jcs(&self, _a: &Value, _jcs: &str, _f: &mut countersign::audit::Fields) {}
}

#[tokio::test]
async fn the_dispatch_entry_is_staged_with_the_dispatch_before_the_server_sees_the_call() {
    let f = fixture("0s");
    let sink = Arc::new(MemorySink::default());
    let pipeline = Pipeline::new(
        f.pipeline.config().clone(),
        f.store.clone(),
        countersign::cli::files::load_policies(&f.pipeline.config().gateway.policies, None)
            .unwrap(),
        Some(sink.clone()),
        f.clock.clone(),
    );
    let hold = Arc::new(Notify::new());
    *f.fake.hold_calls.lock().unwrap() = Some(hold.clone());
    let ctx = CallCtx {
        caller: &f.caller,
        server: "pay",
        era: Era::Handshake,
        events: None,
        upstream: &f.fake,
        asks: None,
        task: false,
    };
    let call = pipeline.tool_call(&ctx, request("refund", json!({"id": 1}), Some("k")));
    let check = async {
        f.fake.arrived.notified().await;
        // The server has the call: everything up to `dispatched` is staged
        // (durable with the ledger's `dispatched` record), in order.
        let seen: Vec<(String, bool)> = sink
            .entries
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _)| k != "tools_learned")
            .cloned()
            .collect();
        assert_eq!(
            seen,
            [
                ("call_received".to_owned(), true),
                ("decision".to_owned(), true),
                ("dispatched".to_owned(), true),
            ]
        );
        hold.notify_one();
    };
    let (o, ()) = tokio::join!(call, check);
    assert_eq!(answered_n(&o), 1);
    let kinds: Vec<String> = sink
        .entries
        .lock()
        .unwrap()
        .iter()
        .map(|(k, _)| k.clone())
        .collect();
    // The gateway's own tool list came first (the tools were new to it).
    assert_eq!(
        kinds,
        [
            "tools_learned",
            "call_received",
            "decision",
            "dispatched",
            "completed"
        ]
    );
}

// ------------------------------------------------------------- catalog

#[tokio::test]
async fn the_gateway_lists_tools_itself_once_and_again_when_stale_or_a_tool_is_unknown() {
    let f = fixture("0s");
    // No client ever listed tools: the server's hints still classify the
    // read (unattended, retried), learned by the gateway's own tools/list.
    f.fake.next(Step::Lose);
    let o = f.call("get_balance", json!({"id": 1}), None).await;
    assert_eq!(answered_n(&o), 2, "a read, so retried after a lost answer");
    assert_eq!(f.fake.lists.load(Ordering::SeqCst), 1);
    f.call("get_balance", json!({"id": 2}), None).await;
    assert_eq!(
        f.fake.lists.load(Ordering::SeqCst),
        1,
        "fresh: not listed again"
    );
    // A tool the list lacks: listed again, but not more than once a second.
    f.call("mystery", json!({}), Some("m-1")).await;
    assert_eq!(
        f.fake.lists.load(Ordering::SeqCst),
        1,
        "within the interval"
    );
    f.clock.advance(Duration::from_secs(1));
    f.call("mystery", json!({}), Some("m-2")).await;
    assert_eq!(f.fake.lists.load(Ordering::SeqCst), 2);
    // The server said its list changed.
    f.pipeline.catalog().mark_stale("pay");
    f.call("get_balance", json!({"id": 3}), None).await;
    assert_eq!(f.fake.lists.load(Ordering::SeqCst), 3);
    // Older than catalog.max_age (5 minutes).
    f.clock.advance(Duration::from_secs(301));
    f.call("get_balance", json!({"id": 4}), None).await;
    assert_eq!(f.fake.lists.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn concurrent_first_calls_share_one_tool_list_fetch() {
    let f = Arc::new(fixture("0s"));
    let mut tasks = Vec::new();
    for n in 0..8 {
        let f = f.clone();
        tasks.push(tokio::spawn(async move {
            f.call("get_balance", json!({"id": n}), None).await
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(f.fake.lists.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_read_with_cache_ttl_runs_once_within_it_and_again_after_never_a_write() {
    let f = fixture_with(
        "0s",
        "[servers.pay.tools.get_balance]\ncache_ttl = \"30s\"\n[servers.pay.tools.refund]\ncache_ttl = \"30s\"\n",
    );
    let first = f.call("get_balance", json!({"id": 1}), None).await;
    assert_eq!(answered_n(&first), 1);
    let second = f.call("get_balance", json!({"id": 1}), None).await;
    let CallOutcome::Cached { answered_at, .. } = &second else {
        panic!("{second:?}")
    };
    assert!(!answered_at.is_empty());
    let m = answer::render(second, json!(9), Era::Handshake);
    let v: Value = serde_json::from_str(m.result.unwrap().get()).unwrap();
    assert_eq!(v["structuredContent"]["n"], 1, "the first answer: {v}");
    assert!(
        v["_meta"]["dev.countersign/cached"]["first_answered_at"].is_string(),
        "{v}"
    );
    assert_eq!(f.fake.runs("get_balance"), 1);
    // Other arguments are another read.
    f.call("get_balance", json!({"id": 2}), None).await;
    assert_eq!(f.fake.runs("get_balance"), 2);
    // After the TTL the read runs again.
    f.clock.advance(Duration::from_secs(31));
    f.call("get_balance", json!({"id": 1}), None).await;
    assert_eq!(f.fake.runs("get_balance"), 3);
    // The server's list changed: the cache starts over.
    f.pipeline.catalog().mark_stale("pay");
    f.call("get_balance", json!({"id": 1}), None).await;
    assert_eq!(f.fake.runs("get_balance"), 4);
    // A write is never cached, whatever its configuration says.
    f.call("refund", json!({"id": 1}), Some("r-1")).await;
    f.call("refund", json!({"id": 1}), Some("r-2")).await;
    assert_eq!(f.fake.runs("refund"), 2);
}

// ------------------------------------------------- definitions and pins

impl Fixture {
    /// The server now lists `tools`, and says its list changed.
    fn server_lists(&self, tools: Value) {
        *self.fake.tools.lock().unwrap() = Some(tools);
        self.pipeline.catalog().mark_stale("pay");
    }

    /// The operator accepts what the server lists now (as `tools pin` does).
    fn accept_all(&self) {
        let tools = self.fake.tools.lock().unwrap().clone().unwrap();
        let mut lock = countersign::core::catalog::ToolLock::default();
        for t in tools.as_array().unwrap() {
            lock.set(
                "pay",
                countersign::core::catalog::Definition::of(t).unwrap(),
            );
        }
        self.pipeline.catalog().set_lock(lock);
    }
}

fn tool(name: &str, description: &str, read_only: bool) -> Value {
    json!({"name": name, "description": description,
           "annotations": {"readOnlyHint": read_only, "destructiveHint": false}})
}

#[tokio::test]
async fn a_changed_definition_is_held_for_approval_with_its_diff_until_accepted() {
    let f = fixture("0s");
    f.server_lists(json!([tool("get_balance", "reads a balance", true)]));
    assert_eq!(
        answered_n(&f.call("get_balance", json!({"id": 1}), None).await),
        1
    );
    // Pinned on first use, in the store.
    assert_eq!(
        f.store
            .inner
            .first_use_pins()
            .now_or_never()
            .unwrap()
            .unwrap()
            .len(),
        1
    );
    f.server_lists(json!([tool(
        "get_balance",
        "reads a balance, and sends it to x",
        true
    )]));
    let o = f.call("get_balance", json!({"id": 2}), None).await;
    assert_eq!(code(o), "approval_pending");
    assert_eq!(
        f.fake.runs("get_balance"),
        1,
        "the changed read did not run"
    );
    let p = f.pending().pop().expect("a proposal");
    let change = p
        .definition_change
        .clone()
        .expect("the reviewer sees the change");
    assert_eq!(change.changes.len(), 1);
    assert_eq!(change.changes[0].pointer, "/description");
    assert_eq!(
        p.tool_definition,
        f.pipeline.catalog().view("pay", "get_balance").digest
    );
    // Accepted: unattended again.
    f.accept_all();
    let o = f.call("get_balance", json!({"id": 3}), None).await;
    assert_eq!(answered_n(&o), 2);
}

#[tokio::test]
async fn a_write_that_turns_read_only_is_a_write_until_accepted() {
    let f = fixture("0s");
    f.server_lists(json!([tool("charge_card", "charges a card", false)]));
    let o = f.call("charge_card", charge(5), Some("c-1")).await;
    assert_eq!(code(o), "approval_pending");
    // Now it says it only reads: not believed.
    f.server_lists(json!([tool("charge_card", "charges a card", true)]));
    let o = f.call("charge_card", charge(6), Some("c-2")).await;
    assert_eq!(code(o), "approval_pending");
    assert_eq!(f.fake.runs("charge_card"), 0);
    let view = f.pipeline.catalog().view("pay", "charge_card");
    assert!(view.changed && !view.annotations.read_only);
    assert!(f.record("c-2").is_none() || f.record("c-2").unwrap().state != State::Complete);
    // The operator accepts it: now it is read as the read it says it is.
    f.accept_all();
    let o = f.call("charge_card", charge(7), None).await;
    assert_eq!(answered_n(&o), 1);
}

#[tokio::test]
async fn an_approval_granted_before_the_definition_changed_does_not_run_after_it() {
    let f = fixture("0s");
    f.server_lists(json!([tool("charge_card", "charges a card", false)]));
    let o = f.call("charge_card", charge(5), Some("c-1")).await;
    assert_eq!(code(o), "approval_pending");
    let p = f.pending().pop().unwrap();
    f.decide(&p, Verdict::Approve, Duration::from_secs(600))
        .await;
    f.server_lists(json!([tool("charge_card", "charges a card twice", false)]));
    let o = f.call("charge_card", charge(5), Some("c-1")).await;
    assert_eq!(code(o), "approval_pending");
    assert_eq!(f.fake.runs("charge_card"), 0, "the old yes did not run it");
    let old = f
        .store
        .inner
        .get_proposal(&p.id)
        .now_or_never()
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(old.state, ProposalState::Invalidated);
    assert!(old.reason.unwrap().contains("definition changed"));
    let fresh = f.pending().pop().expect("a new proposal");
    assert_ne!(fresh.tool_definition, p.tool_definition);
    // A yes for the new definition runs it, once.
    f.decide(&fresh, Verdict::Approve, Duration::from_secs(600))
        .await;
    let o = f.call("charge_card", charge(5), Some("c-1")).await;
    assert_eq!(answered_n(&o), 1);
    assert_eq!(f.fake.runs("charge_card"), 1);
}

#[tokio::test]
async fn a_pinned_tool_that_vanishes_is_refused_as_unavailable() {
    let f = fixture("0s");
    f.server_lists(json!([
        tool("get_balance", "reads", true),
        tool("refund", "refunds", false)
    ]));
    f.call("get_balance", json!({"id": 1}), None).await;
    f.server_lists(json!([tool("get_balance", "reads", true)]));
    let o = f.call("refund", json!({"id": 1}), Some("r-1")).await;
    assert_eq!(code(o), "tool_unavailable");
    assert_eq!(f.fake.runs("refund"), 0);
    assert!(f.record("r-1").is_none(), "nothing reserved");
}

// ------------------------------------------------------------- reads

#[tokio::test]
async fn unattended_reads_are_retried_never_recorded_never_replayed() {
    let f = fixture("0s");
    f.fake.next(Step::Lose);
    let o = f.call("get_balance", json!({"id": 1}), None).await;
    assert_eq!(answered_n(&o), 2, "retried after a lost answer");
    let o = f.call("get_balance", json!({"id": 1}), None).await;
    assert_eq!(answered_n(&o), 3, "a finished read is not replayed");
    assert!(
        f.store
            .inner
            .list(None)
            .now_or_never()
            .unwrap()
            .unwrap()
            .is_empty(),
        "no ledger record"
    );
}

// ------------------------------------------- section 14: approval in the client

const CAPS: &str = "io.modelcontextprotocol/clientCapabilities";

impl Fixture {
    /// The caller runs their own agent (group `solo`).
    fn solo(mut self) -> Fixture {
        self.caller = Caller {
            identity: Arc::new(Identity {
                principal: "agent-7".into(),
                tenant: "acme".into(),
                groups: vec!["solo".into()],
                ..Default::default()
            }),
            scope: None,
            subject: None,
        };
        self
    }

    /// A 2026-07-28 call; `elicits`: the client declares elicitation;
    /// `reply`: the retry's `requestState` and `inputResponses`.
    async fn modern(
        &self,
        tool: &str,
        args: Value,
        key: &str,
        elicits: bool,
        reply: Option<(&str, Value)>,
    ) -> CallOutcome {
        let caps = if elicits {
            json!({"elicitation": {}})
        } else {
            json!({})
        };
        let mut params = json!({ "name": tool, "arguments": args,
            "_meta": { "dev.countersign/idempotency-key": key, CAPS: caps } });
        if let Some((state, response)) = reply {
            params["requestState"] = json!(state);
            if !response.is_null() {
                params["inputResponses"] = json!({ "dev.countersign/confirm": response });
            }
        }
        let ctx = CallCtx {
            caller: &self.caller,
            server: "pay",
            era: Era::Modern,
            events: None,
            upstream: &self.fake,
            asks: None,
            task: false,
        };
        self.pipeline
            .tool_call(
                &ctx,
                Message::request(json!(2), "tools/call", Some(raw(&params))),
            )
            .await
    }

    fn proposal(&self, id: &str) -> Proposal {
        self.store
            .inner
            .get_proposal(id)
            .now_or_never()
            .unwrap()
            .unwrap()
            .unwrap()
    }
}

fn yes() -> Value {
    json!({"action": "accept", "content": {"approve": true, "reason": "mine"}})
}

/// The question of an `input_required` outcome: (proposal id, state), after
/// checking the wire form the client gets.
fn asked(o: CallOutcome) -> (String, String) {
    let m = answer::render(o, json!(2), Era::Modern);
    let r: Value = serde_json::from_str(m.result.as_ref().unwrap().get()).unwrap();
    assert_eq!(r["resultType"], "input_required", "{r}");
    let q = &r["inputRequests"]["dev.countersign/confirm"];
    assert_eq!(q["method"], "elicitation/create", "{r}");
    let message = q["params"]["message"].as_str().unwrap();
    assert!(
        message.contains("pay/refund"),
        "the plain sentence: {message}"
    );
    assert!(
        message.contains(r#""charge":"ch-1"}"#),
        "the canonical arguments: {message}"
    );
    assert_eq!(
        q["params"]["requestedSchema"]["required"],
        json!(["approve"])
    );
    let proposal = message
        .split("proposal ")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap()
        .to_owned();
    (proposal, r["requestState"].as_str().unwrap().to_owned())
}

/// A `refund` that needs approval: with the unattended refund policy gone.
fn confirm_fixture() -> Fixture {
    let f = fixture("0s").solo();
    let policies = f._dir.path().join("policies");
    std::fs::write(policies.join("test.cedar"), POLICIES).unwrap();
    f.pipeline
        .set_policies(countersign::cli::files::load_policies(&policies, None).unwrap());
    f
}

fn refund(amount: i64) -> Value {
    json!({ "charge": "ch-1", "amount": amount })
}

#[tokio::test]
async fn a_client_that_declares_elicitation_is_asked_and_its_yes_runs_the_call_once() {
    let f = confirm_fixture();
    let (id, state) = asked(f.modern("refund", refund(5), "c-1", true, None).await);
    assert_eq!(f.fake.runs("refund"), 0, "asking runs nothing");
    let p = f.proposal(&id);
    assert_eq!(p.state, ProposalState::Pending, "reviewers see it too");
    assert_eq!(
        p.asked_by.len(),
        1,
        "the asking gateway's key is on the proposal"
    );
    let o = f
        .modern("refund", refund(5), "c-1", true, Some((&state, yes())))
        .await;
    assert_eq!(answered_n(&o), 1);
    assert_eq!(f.fake.runs("refund"), 1);
    let p = f.proposal(&id);
    assert_eq!(p.state, ProposalState::Consumed);
    let c = p.confirmation.expect("decided in the client");
    assert_eq!(
        (c.channel.as_str(), c.principal.as_str(), c.via.as_str()),
        ("client", "agent-7", "input_required")
    );
    assert_eq!(c.reason, "mine");
    // The upstream never saw the question or the answer.
    let sent = f.fake.calls.lock().unwrap()[0].1.clone();
    assert_eq!(sent, refund(5));
}

#[tokio::test]
async fn a_decline_is_approval_denied_and_nothing_runs() {
    let f = confirm_fixture();
    let (id, state) = asked(f.modern("refund", refund(5), "c-1", true, None).await);
    let no = json!({"action": "decline"});
    let o = f
        .modern("refund", refund(5), "c-1", true, Some((&state, no)))
        .await;
    let m = answer::render(o, json!(2), Era::Modern);
    let r: Value = serde_json::from_str(m.result.as_ref().unwrap().get()).unwrap();
    assert_eq!(
        r["structuredContent"]["countersign"]["code"],
        "approval_denied"
    );
    assert_eq!(r["structuredContent"]["countersign"]["channel"], "client");
    assert!(r["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("the person at the client declined"));
    assert_eq!(f.fake.runs("refund"), 0);
    assert_eq!(f.proposal(&id).state, ProposalState::Denied);
}

#[tokio::test]
async fn an_altered_moved_replayed_or_expired_state_is_refused_and_runs_nothing() {
    let f = confirm_fixture();
    let (_, state) = asked(f.modern("refund", refund(5), "c-1", true, None).await);
    // One byte of the signed claims changed.
    let mut bytes = state.clone().into_bytes();
    let at = countersign::core::confirm::STATE_PREFIX.len() + 20;
    bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
    let altered = String::from_utf8(bytes).unwrap();
    let o = f
        .modern("refund", refund(5), "c-1", true, Some((&altered, yes())))
        .await;
    assert_eq!(code(o), "confirmation_invalid");
    // The state of one call sent with another (other arguments, other key).
    let o = f
        .modern("refund", refund(6), "c-2", true, Some((&state, yes())))
        .await;
    assert_eq!(code(o), "confirmation_mismatch");
    // Another principal presenting it.
    let other = Fixture {
        caller: Caller {
            identity: Arc::new(Identity {
                principal: "agent-9".into(),
                tenant: "acme".into(),
                groups: vec!["solo".into()],
                ..Default::default()
            }),
            scope: None,
            subject: None,
        },
        ..f
    };
    let o = other
        .modern("refund", refund(5), "c-1", true, Some((&state, yes())))
        .await;
    assert_eq!(code(o), "confirmation_mismatch");
    let f = other.solo();
    assert_eq!(f.fake.runs("refund"), 0);
    // Used once, then replayed.
    let o = f
        .modern("refund", refund(5), "c-1", true, Some((&state, yes())))
        .await;
    assert_eq!(answered_n(&o), 1);
    let o = f
        .modern("refund", refund(5), "c-1", true, Some((&state, yes())))
        .await;
    assert_eq!(code(o), "confirmation_used");
    assert_eq!(f.fake.runs("refund"), 1);
    // Past its expiry (approvals.client_ttl, 5 minutes by default).
    let (_, late) = asked(f.modern("refund", refund(7), "c-3", true, None).await);
    f.clock.advance(Duration::from_secs(301));
    let o = f
        .modern("refund", refund(7), "c-3", true, Some((&late, yes())))
        .await;
    assert_eq!(code(o), "confirmation_expired");
    // Not a state at all, with an answer under the gateway's key.
    let o = f
        .modern(
            "refund",
            refund(7),
            "c-3",
            true,
            Some(("countersign.1.nope", yes())),
        )
        .await;
    assert_eq!(code(o), "confirmation_invalid");
    assert_eq!(f.fake.runs("refund"), 1, "no refused state ran anything");
}

#[tokio::test]
async fn a_dismissed_question_leaves_the_proposal_to_reviewers() {
    let f = confirm_fixture();
    let (id, state) = asked(f.modern("refund", refund(5), "c-1", true, None).await);
    let o = f
        .modern(
            "refund",
            refund(5),
            "c-1",
            true,
            Some((&state, json!({"action": "cancel"}))),
        )
        .await;
    assert_eq!(code(o), "approval_pending");
    let p = f.proposal(&id);
    assert_eq!(p.state, ProposalState::Pending);
    f.decide(&p, Verdict::Approve, Duration::from_secs(600))
        .await;
    let o = f.modern("refund", refund(5), "c-1", false, None).await;
    assert_eq!(answered_n(&o), 1);
}

#[tokio::test]
async fn destructive_tools_and_clients_without_elicitation_get_the_reviewer_path() {
    let f = confirm_fixture();
    // `transfer` is listed without annotations: MCP's defaults make it
    // destructive.
    let o = f
        .modern("transfer", json!({"to": "x"}), "t-1", true, None)
        .await;
    assert_eq!(code(o), "approval_pending");
    let o = f.modern("refund", refund(5), "c-1", false, None).await;
    assert_eq!(code(o), "approval_pending");
    // Not in group solo: reviewers only, whatever the client declares.
    let f = fixture("0s");
    let policies = f._dir.path().join("policies");
    std::fs::write(policies.join("test.cedar"), POLICIES).unwrap();
    f.pipeline
        .set_policies(countersign::cli::files::load_policies(&policies, None).unwrap());
    let o = f.modern("refund", refund(5), "c-1", true, None).await;
    assert_eq!(code(o), "approval_pending");
}

#[tokio::test]
async fn the_first_answer_wins_exactly_once_and_the_other_is_too_late() {
    // A reviewer first: the client's later "no" changes nothing.
    let f = confirm_fixture();
    let (id, state) = asked(f.modern("refund", refund(5), "c-1", true, None).await);
    f.decide(&f.proposal(&id), Verdict::Approve, Duration::from_secs(600))
        .await;
    let o = f
        .modern(
            "refund",
            refund(5),
            "c-1",
            true,
            Some((&state, json!({"action": "decline"}))),
        )
        .await;
    assert_eq!(answered_n(&o), 1, "the reviewer's yes ran it");
    assert!(f.proposal(&id).confirmation.is_none());
    assert_eq!(f.fake.runs("refund"), 1);
    // The client first: the reviewer is told it is too late.
    let (id, state) = asked(f.modern("refund", refund(6), "c-2", true, None).await);
    let pending = f.proposal(&id);
    let o = f
        .modern("refund", refund(6), "c-2", true, Some((&state, yes())))
        .await;
    assert_eq!(answered_n(&o), 2);
    let now = f.clock.now_ms();
    let policies = f.pipeline.policies();
    let statement = pending.statement(
        Verdict::Approve,
        "bob",
        "ok",
        &rfc3339(now),
        &rfc3339(now + 60_000),
        Some(policies.digest()),
    );
    let signature = statement.sign(&f.reviewer).unwrap();
    let bob = policies.reviewers().get("bob").unwrap().clone();
    let under = Under {
        policy_set: policies.digest(),
        reviewers: policies.reviewers(),
    };
    let e = f
        .pipeline
        .book()
        .decide(
            &id,
            statement,
            Proof::Ed25519(&signature),
            &bob,
            under,
            |_| Ok(()),
        )
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("too late") && e.to_string().contains("the person at the client"),
        "{e}"
    );
    assert_eq!(f.fake.runs("refund"), 2, "one execution per call");
}

#[tokio::test]
async fn a_client_yes_is_void_once_the_policies_no_longer_permit_confirm() {
    let f = confirm_fixture();
    let (id, state) = asked(f.modern("refund", refund(5), "c-1", true, None).await);
    // The yes lands; then the operator withdraws `confirm` before it is used.
    f.pipeline
        .book()
        .confirm(
            &id,
            countersign::core::approval::Confirmation {
                channel: "client".into(),
                principal: "agent-7".into(),
                decision: Verdict::Approve,
                reason: String::new(),
                at: rfc3339(f.clock.now_ms()),
                via: "input_required".into(),
                nonce: "n".into(),
            },
        )
        .await
        .unwrap();
    let policies = f._dir.path().join("policies");
    std::fs::write(
        policies.join("test.cedar"),
        POLICIES.replace("Group::\"solo\"", "Group::\"nobody\""),
    )
    .unwrap();
    f.pipeline
        .set_policies(countersign::cli::files::load_policies(&policies, None).unwrap());
    let o = f
        .modern("refund", refund(5), "c-1", true, Some((&state, yes())))
        .await;
    assert_eq!(code(o), "approval_pending");
    assert_eq!(f.fake.runs("refund"), 0);
    assert_eq!(f.proposal(&id).state, ProposalState::Invalidated);
}

#[tokio::test]
async fn a_session_client_is_asked_by_elicitation_and_its_answer_releases_the_held_call() {
    let f = fixture("20s").solo();
    let policies = f._dir.path().join("policies");
    std::fs::write(policies.join("test.cedar"), POLICIES).unwrap();
    f.pipeline
        .set_policies(countersign::cli::files::load_policies(&policies, None).unwrap());
    let asks = Arc::new(countersign::enforce::client::Asks::new(Some("2025-11-25")));
    let (tx, mut rx) = mpsc::channel(8);
    let caller = Caller {
        scope: Some("s-1".into()),
        ..f.caller.clone()
    };
    let ctx = CallCtx {
        caller: &caller,
        server: "pay",
        era: Era::Handshake,
        events: Some(tx),
        upstream: &f.fake,
        asks: Some(asks.clone()),
        task: false,
    };
    let call = f
        .pipeline
        .tool_call(&ctx, request("refund", refund(5), Some("h-1")));
    let client = async {
        let ask = rx
            .recv()
            .await
            .and_then(message)
            .expect("an elicitation/create on the call's stream");
        assert_eq!(ask.method(), "elicitation/create");
        let params = ask.params_value().unwrap();
        assert_eq!(params["mode"], "form");
        assert!(params["message"].as_str().unwrap().contains("pay/refund"));
        assert!(
            asks.take(Some(&json!("someone-else"))).is_none(),
            "other ids go upstream"
        );
        let open = asks.take(ask.id.as_ref()).expect("the question is open");
        let response = Message::response(ask.id.clone().unwrap(), raw(&yes()));
        countersign::enforce::client::answered(
            f.pipeline.book(),
            &caller.identity,
            open,
            &response,
        )
        .await;
        assert!(asks.take(ask.id.as_ref()).is_none(), "answered once");
    };
    let (o, ()) = tokio::join!(call, client);
    assert_eq!(answered_n(&o), 1);
    assert_eq!(f.fake.runs("refund"), 1);
}

#[tokio::test]
async fn two_gateways_recording_their_keys_on_one_proposal_keep_both() {
    let f = confirm_fixture();
    let (id, _) = asked(f.modern("refund", refund(5), "c-1", true, None).await);
    // Both start from the same copy, as two gateways reading it at once.
    let stale = f.proposal(&id);
    assert!(f
        .pipeline
        .book()
        .asked_by(&stale, "ed25519:gateway-a")
        .await
        .unwrap());
    assert!(f
        .pipeline
        .book()
        .asked_by(&stale, "ed25519:gateway-b")
        .await
        .unwrap());
    let keys = f.proposal(&id).asked_by;
    assert!(
        keys.contains(&"ed25519:gateway-a".to_owned())
            && keys.contains(&"ed25519:gateway-b".to_owned()),
        "{keys:?}"
    );
    assert_eq!(keys.len(), 3, "this gateway's own key, and the two");
}

#[tokio::test]
async fn a_session_answer_after_the_hold_decides_for_the_next_call_and_one_after_its_expiry_does_not(
) {
    let f = fixture("0s").solo();
    let policies = f._dir.path().join("policies");
    std::fs::write(policies.join("test.cedar"), POLICIES).unwrap();
    f.pipeline
        .set_policies(countersign::cli::files::load_policies(&policies, None).unwrap());
    let asks = Arc::new(countersign::enforce::client::Asks::new(Some("2025-11-25")));
    let caller = Caller {
        scope: Some("s-1".into()),
        ..f.caller.clone()
    };
    // One call through the session (nothing holds it): its outcome, and
    // what it sent on its stream.
    let call = |args: Value, key: &'static str| {
        let (f, caller, asks) = (&f, &caller, asks.clone());
        async move {
            let (tx, rx) = mpsc::channel(8);
            let ctx = CallCtx {
                caller,
                server: "pay",
                era: Era::Handshake,
                events: Some(tx),
                upstream: &f.fake,
                asks: Some(asks),
                task: false,
            };
            (
                f.pipeline
                    .tool_call(&ctx, request("refund", args, Some(key)))
                    .await,
                rx,
            )
        }
    };
    // Nothing holds the call (`hold = 0s`): it answers pending, the question
    // already on its stream.
    let (o, mut rx) = call(refund(5), "h-1").await;
    assert_eq!(code(o), "approval_pending");
    let ask = rx
        .recv()
        .await
        .and_then(message)
        .expect("the question was sent");
    let open = asks.take(ask.id.as_ref()).unwrap();
    let response = Message::response(ask.id.clone().unwrap(), raw(&yes()));
    countersign::enforce::client::answered(f.pipeline.book(), &caller.identity, open, &response)
        .await;
    let (o, _rx) = call(refund(5), "h-1").await;
    assert_eq!(answered_n(&o), 1, "the yes ran the identical call");
    // Another call, answered after the question expired: nothing decided.
    let (o, mut rx) = call(refund(6), "h-2").await;
    assert_eq!(code(o), "approval_pending");
    let ask = rx.recv().await.and_then(message).unwrap();
    let open = asks.take(ask.id.as_ref()).unwrap();
    f.clock.advance(Duration::from_secs(301));
    let response = Message::response(ask.id.clone().unwrap(), raw(&yes()));
    countersign::enforce::client::answered(f.pipeline.book(), &caller.identity, open, &response)
        .await;
    assert_eq!(f.pending().len(), 1, "the late yes decided nothing");
    assert_eq!(f.fake.runs("refund"), 1);
}

/// The message of an event on a call's stream (`None` for what a transport
/// says about the stream itself).
fn message(e: UpstreamEvent) -> Option<Message> {
    match e {
        UpstreamEvent::Message(m) => Some(m),
        UpstreamEvent::Streamed | UpstreamEvent::Resumed => None,
    }
}
