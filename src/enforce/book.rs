//! The approval book: proposals as a service over the store. It creates or
//! joins proposals for calls that need a yes, finds the approval a call may
//! consume (revalidating it), records reviewers' signed decisions, expires
//! what nobody used, and publishes every change to live clients.

use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;
use tokio::sync::broadcast;

use crate::audit::AuditSink;
use crate::core::approval::{
    self, ApprovalError, Confirmation, DefinitionChange, Given, Proposal, ProposalState, Quorum,
    Revision, Risk, SignedDecision, Statement, Verdict,
};
use crate::core::config::ApprovalsConfig;
use crate::core::identity::Identity;
use crate::core::notify::{self, Notice};
use crate::core::reviewers::{Reviewer, Reviewers};
use crate::core::time::{ms, parse_rfc3339, rfc3339, Clock};
use crate::enforce::flight::{ApprovalCode, ApprovalNote};
use crate::store::{Store, StoreError};

/// A change, for the control API's event stream.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// `proposal_created` or `proposal_updated`.
    pub kind: &'static str,
    /// The proposal as it is now.
    pub proposal: Proposal,
}

/// What signed a decision.
#[derive(Debug, Clone, Copy)]
pub enum Proof<'a> {
    /// A base64 ed25519 signature over the statement's JCS (the CLI, the
    /// TUI).
    Ed25519(&'a str),
    /// A passkey's assertion whose challenge is the statement's digest
    /// (the review console), for the console's origin and relying party.
    Passkey {
        /// The assertion.
        assertion: &'a crate::core::passkey::Assertion,
        /// The console's origin.
        origin: &'a str,
        /// The relying party id.
        rp_id: &'a str,
    },
}

/// The call asking, as the book needs it.
pub struct Ask<'a> {
    /// Requester.
    pub identity: &'a Identity,
    /// Server.
    pub server: &'a str,
    /// Tool.
    pub tool: &'a str,
    /// Canonical arguments (the gateway's copy).
    pub arguments: &'a Value,
    /// Canonical digest.
    pub digest: &'a str,
    /// The resource version now (probe or explicit), if any.
    pub resource_version: Option<&'a str>,
    /// The tool's definition digest now (`None`: not listed).
    pub tool_definition: Option<&'a str>,
    /// How the definition differs from the pinned one, when it does.
    pub definition_change: Option<DefinitionChange>,
    /// Another listed tool whose name this one's looks like.
    pub looks_like: Option<String>,
    /// The call in plain words (the operator's template for the tool).
    pub headline: Option<String>,
    /// The budgets' and effect keys' figures, for the reviewer.
    pub guards: Vec<String>,
    /// Risk from the effective annotations.
    pub risk: Risk,
    /// The policies that asked for approval.
    pub policies: &'a [String],
    /// What those policies ask of reviewers (how many, from which groups).
    pub quorum: &'a Quorum,
    /// The call's ledger key (storage key).
    pub key: &'a str,
    /// The idempotency key as the client sent it (or derived).
    pub client_key: &'a str,
    /// The W3C `traceparent` of the asking request's span, when traced.
    pub trace: Option<String>,
    /// The proposal the agent says this call replaces
    /// (`_meta["dev.countersign/revises"]`).
    pub revises: Option<&'a str>,
}

/// What a call that needs approval finds.
#[derive(Debug)]
pub enum Found {
    /// An approval it may consume now.
    Usable(Proposal),
    /// A pending proposal (created or joined): wait, or answer pending.
    Wait(Proposal),
    /// Refused (denied, expired, stale), with the proposal to name.
    Refuse(ApprovalNote),
}

/// Why a decision was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    /// Nothing by that id (or not visible to the reviewer).
    #[error("no proposal `{0}`: list them with `countersign pending`")]
    NotFound(String),
    /// Someone else answered first: the person at the client, or a
    /// reviewer (first answer wins, exactly once).
    #[error("too late: proposal `{id}` was already {state} by {by}")]
    TooLate {
        /// Proposal.
        id: String,
        /// Its state.
        state: &'static str,
        /// Who answered it (`the person at the client (dev-1)`, `reviewer alice`).
        by: String,
    },
    /// Already decided, consumed, expired or invalidated.
    #[error("proposal `{id}` is {state}, not pending: nothing to decide")]
    NotPending {
        /// Proposal.
        id: String,
        /// Its state.
        state: &'static str,
    },
    /// The statement or signature is not acceptable.
    #[error("{0}")]
    Refused(String),
    /// The policies do not let this reviewer approve this call (the text
    /// says why: the forbidding policies, or what no permit found).
    #[error("{0}")]
    Forbidden(String),
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a decision is judged under: the policy set in force (its digest,
/// which a version-3 statement must name) and the reviewers file in force
/// (whose groups a quorum is matched against).
#[derive(Clone, Copy)]
pub struct Under<'a> {
    /// `sha256:` of the policy set in force.
    pub policy_set: &'a str,
    /// The reviewers file in force.
    pub reviewers: &'a Reviewers,
}

/// What `p`'s approvals still lack under `reviewers` in force: an approval
/// counts while its reviewer is registered with the key that signed it and
/// covers the tenant, with the groups the file gives them now. `None`: the
/// quorum is met.
pub(crate) fn quorum_missing(p: &Proposal, reviewers: &Reviewers) -> Option<approval::Missing> {
    let approvers: Vec<(&str, &[String])> = p
        .approvals
        .iter()
        .filter_map(|g| {
            let r = reviewers.get(g.reviewer())?;
            (r.has_key(&g.signed.public_key)
                && r.covers(&p.tenant)
                && !r.is_requester(&p.requester, &p.requester_aka))
            .then_some((r.name.as_str(), r.groups.as_slice()))
        })
        .collect();
    p.quorum.missing(&approvers)
}

/// How many locks the requesters' create-or-join is striped over.
const MAKING_STRIPES: usize = 64;

/// Proposals and approvals over the store.
pub struct Book {
    store: Arc<dyn Store>,
    config: ApprovalsConfig,
    // Serializes create-or-join per requester: two identical calls with
    // different keys must not both create a proposal (retries never stack
    // approvals). Striped by requester, so that one requester's calls never
    // wait on another's. Tokio mutexes: held across the store write.
    making: Vec<tokio::sync::Mutex<()>>,
    events: broadcast::Sender<Event>,
    audit: Option<Arc<dyn AuditSink>>,
    /// Expiries are judged on this clock (tests move it by hand).
    clock: Arc<dyn Clock>,
    /// `[[notify.webhooks]]`: told of proposals, in the commit that makes
    /// each change.
    webhooks: Vec<crate::core::config::WebhookConfig>,
    /// `audit.redact`: argument values no event carries (see
    /// [`crate::core::redact`]).
    redact: Vec<String>,
    /// Signalled when a write queued notices: the delivery worker wakes.
    queued: Arc<tokio::sync::Notify>,
    /// `ORIGIN/review/p/` when the review console is on: proposal events
    /// carry their page's URL.
    review_url: std::sync::OnceLock<String>,
}

/// The fields every proposal entry of the audit log carries.
fn proposal_fields(p: &Proposal) -> serde_json::Map<String, Value> {
    let mut f = serde_json::Map::new();
    f.insert("proposal_id".into(), Value::from(p.id.clone()));
    f.insert("principal".into(), Value::from(p.requester.clone()));
    f.insert("tenant".into(), Value::from(p.tenant.clone()));
    f.insert("server".into(), Value::from(p.server.clone()));
    f.insert("tool".into(), Value::from(p.tool.clone()));
    f.insert("call_digest".into(), Value::from(p.call_digest.clone()));
    f.insert(
        "resource_version".into(),
        p.resource_version.clone().map_or(Value::Null, Value::from),
    );
    f.insert(
        "tool_definition".into(),
        p.tool_definition.clone().map_or(Value::Null, Value::from),
    );
    f
}

impl Book {
    /// A book over `store`.
    pub fn new(
        store: Arc<dyn Store>,
        config: ApprovalsConfig,
        audit: Option<Arc<dyn AuditSink>>,
        clock: Arc<dyn Clock>,
    ) -> Book {
        let (events, _) = broadcast::channel(256);
        Book {
            store,
            config,
            making: (0..MAKING_STRIPES)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            events,
            audit,
            clock,
            webhooks: Vec::new(),
            redact: Vec::new(),
            queued: Arc::new(tokio::sync::Notify::new()),
            review_url: std::sync::OnceLock::new(),
        }
    }

    /// Signalled whenever a proposal change queued notifications.
    pub(crate) fn queued(&self) -> Arc<tokio::sync::Notify> {
        self.queued.clone()
    }

    /// The same book, telling `webhooks` of proposals created, decided and
    /// expired, with the argument values at `redact` (`audit.redact`)
    /// replaced by their digests.
    pub fn notifying(
        mut self,
        webhooks: Vec<crate::core::config::WebhookConfig>,
        redact: Vec<String>,
    ) -> Book {
        self.webhooks = webhooks;
        self.redact = redact;
        self
    }

    /// The notices `p`'s change announces (none without webhooks): created,
    /// decided (approved, quorum met, denied, an approval withdrawn), or
    /// expired.
    fn announce(
        &self,
        p: &Proposal,
        from: Option<ProposalState>,
        withdrawn: Option<&str>,
    ) -> Vec<Notice> {
        if self.webhooks.is_empty() {
            return Vec::new();
        }
        use crate::core::config::EventKind as K;
        let by = |d: &Option<SignedDecision>| {
            d.as_ref()
                .map(|d| {
                    (
                        format!("reviewer {}", d.statement.reviewer),
                        d.statement.reason.clone(),
                    )
                })
                .unwrap_or_default()
        };
        let (kind, decision) = match (from, p.state, withdrawn) {
            (None, ProposalState::Pending, _) => (K::ProposalCreated, None),
            (Some(ProposalState::Pending), ProposalState::Pending, Some(who)) => (
                K::ProposalDecided,
                Some((
                    "approval withdrawn".to_owned(),
                    format!("reviewer {who}"),
                    String::new(),
                )),
            ),
            (Some(ProposalState::Pending), ProposalState::Approved, _) => {
                let what = if p.quorum.is_single() {
                    "approved"
                } else {
                    "quorum met"
                };
                let (who, reason) = match &p.confirmation {
                    Some(c) => (
                        format!("the person at the client ({})", c.principal),
                        c.reason.clone(),
                    ),
                    None => by(&p.decision),
                };
                (K::ProposalDecided, Some((what.to_owned(), who, reason)))
            }
            (Some(ProposalState::Pending), ProposalState::Denied, _) => {
                let (who, reason) = match &p.confirmation {
                    Some(c) => (
                        format!("the person at the client ({})", c.principal),
                        c.reason.clone(),
                    ),
                    None => by(&p.decision),
                };
                (K::ProposalDecided, Some(("denied".to_owned(), who, reason)))
            }
            (Some(_), ProposalState::Expired, _) => (K::ProposalExpired, None),
            _ => return Vec::new(),
        };
        let decision = decision
            .as_ref()
            .map(|(w, b, r)| (w.as_str(), b.as_str(), r.as_str()));
        let pending_until = p.created_ms.saturating_add(ms(self.config.pending_ttl));
        let mut event = notify::Event::proposal(kind, p, decision, pending_until);
        // Before the event is queued: a value `audit.redact` names is in
        // neither the outbox nor any webhook's body.
        if let Some(arguments) = event.facts.get_mut("arguments") {
            crate::core::redact::redact(arguments, &self.redact);
        }
        if let Some(prefix) = self.review_url.get() {
            event.facts.insert(
                "review_url".into(),
                Value::from(format!("{prefix}{}", p.id)),
            );
        }
        event.notices(&self.webhooks, self.clock.now_ms())
    }

    /// Record a proposal's change in the audit log.
    fn audit(&self, kind: &'static str, p: &Proposal, extra: &[(&str, Value)]) {
        if let Some(a) = &self.audit {
            let mut f = proposal_fields(p);
            for (k, v) in extra {
                f.insert((*k).to_owned(), v.clone());
            }
            a.record(kind, f);
        }
    }

    /// The review console is at this origin: proposal events carry
    /// `review_url` (this prefix and the proposal id).
    pub(crate) fn set_review_url(&self, prefix: String) {
        let _ = self.review_url.set(prefix);
    }

    /// The console page of proposal `id`, when the console is on.
    pub(crate) fn review_url(&self, id: &str) -> Option<String> {
        self.review_url.get().map(|prefix| format!("{prefix}{id}"))
    }

    /// Now, on the book's clock (the one expiries are judged on).
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// The settings.
    pub fn config(&self) -> &ApprovalsConfig {
        &self.config
    }

    /// Live changes.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    fn publish(&self, kind: &'static str, p: &Proposal) {
        // No receivers is fine: nobody is watching.
        let _ = self.events.send(Event {
            kind,
            proposal: p.clone(),
        });
    }

    /// Publish a proposal changed outside the book (consumed by the store's
    /// reserve-and-consume transaction), so live views show it.
    pub async fn changed(&self, id: &str) {
        if let Ok(Some(p)) = self.store.get_proposal(id).await {
            self.publish("proposal_updated", &p);
        }
    }

    /// A proposal by id.
    pub async fn get(&self, id: &str) -> Result<Option<Proposal>, StoreError> {
        self.store.get_proposal(id).await
    }

    /// Every proposal, newest first.
    pub async fn list(&self) -> Result<Vec<Proposal>, StoreError> {
        let mut all = self.store.list_proposals().await?;
        all.sort_by(|a, b| b.created_ms.cmp(&a.created_ms).then(b.id.cmp(&a.id)));
        Ok(all)
    }

    /// Move `p` from `from` (and the revision it was read at) to its new
    /// contents, bumping its revision; publish on success. `false`: the
    /// stored proposal changed since it was read (another gateway, another
    /// reviewer), and nothing was written.
    async fn write(
        &self,
        p: &mut Proposal,
        from: Option<ProposalState>,
    ) -> Result<bool, StoreError> {
        self.write_telling(p, from, None).await
    }

    /// [`Book::write`], with the notices the change announces queued in
    /// the same commit (`withdrawn`: the reviewer whose approval it takes
    /// back).
    async fn write_telling(
        &self,
        p: &mut Proposal,
        from: Option<ProposalState>,
        withdrawn: Option<&str>,
    ) -> Result<bool, StoreError> {
        if from.is_some() {
            p.revision = p.revision.wrapping_add(1);
        }
        let notices = self.announce(p, from, withdrawn);
        let told = !notices.is_empty();
        let ok = self
            .store
            .put_proposal_with(p.clone(), from, notices)
            .await?;
        if ok && told {
            self.queued.notify_one();
        }
        if ok {
            self.publish(
                if from.is_none() {
                    "proposal_created"
                } else {
                    "proposal_updated"
                },
                p,
            );
        }
        Ok(ok)
    }

    /// Void `p` (resource changed, reviewer removed, superseded).
    pub async fn invalidate(&self, p: &Proposal, reason: &str) -> Result<(), StoreError> {
        let mut p = p.clone();
        // Over the revision read: a write that lost to a concurrent one
        // (a retry joining, a reviewer's partial approval) reads again and
        // voids what is there now, while it is still in the state it was.
        for _ in 0..16 {
            let mut next = p.clone();
            next.state = ProposalState::Invalidated;
            next.reason = Some(reason.to_owned());
            next.updated_ms = self.clock.now_ms();
            if self.write(&mut next, Some(p.state)).await? {
                self.audit(
                    "approval_invalidated",
                    &p,
                    &[
                        ("reason", Value::from(reason)),
                        ("was", Value::from(p.state.as_str())),
                    ],
                );
                return Ok(());
            }
            match self.store.get_proposal(&p.id).await? {
                Some(fresh) if fresh.state == p.state => p = fresh,
                _ => return Ok(()),
            }
        }
        Ok(())
    }

    /// The create-or-join lock of `requester` in `tenant`.
    fn making_for(&self, tenant: &str, requester: &str) -> &tokio::sync::Mutex<()> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (tenant, requester).hash(&mut h);
        let i = usize::try_from(h.finish() % MAKING_STRIPES as u64).unwrap_or(0);
        &self.making[i]
    }

    /// Find what a call that needs approval may use, or create (or join)
    /// the pending proposal it waits on. Revalidates an approval before
    /// offering it: expiry, resource version, the reviewer still registered
    /// with the same key.
    pub async fn find(&self, ask: &Ask<'_>, reviewers: &Reviewers) -> Result<Found, StoreError> {
        let who = ask.identity;
        // One requester's calls are looked at and proposed one at a time
        // (two concurrent calls must not both make a proposal for one call);
        // other requesters' go on beside them.
        let _making = self.making_for(&who.tenant, &who.principal).lock().await;
        let now = self.clock.now_ms();
        let mine: Vec<Proposal> = self.store.proposals_of(&who.tenant, &who.principal).await?;
        // The newest proposal for this call. Within one millisecond (a
        // proposal invalidated and its replacement made at once), one still in
        // play wins over a void one, whatever their random ids say.
        let live =
            |p: &Proposal| !matches!(p.state, ProposalState::Invalidated | ProposalState::Expired);
        let latest = mine
            .iter()
            .filter(|p| p.same_call(&who.tenant, &who.principal, ask.server, ask.digest))
            .max_by(|a, b| {
                a.created_ms
                    .cmp(&b.created_ms)
                    .then(live(a).cmp(&live(b)))
                    .then(a.id.cmp(&b.id))
            })
            .cloned();
        // Flooding: a requester with `approvals.max_pending` proposals
        // waiting gets no new one (reviewers' queues stay readable, the
        // store stays bounded); calls that join or use an existing proposal
        // are unaffected. The call does not run.
        let continues = latest.as_ref().is_some_and(|p| {
            matches!(
                p.state,
                ProposalState::Pending | ProposalState::Approved | ProposalState::Denied
            ) || p.consumed_by.as_deref() == Some(ask.key)
        });
        let waiting = mine
            .iter()
            .filter(|p| p.state == ProposalState::Pending)
            .count();
        if !continues && waiting >= self.config.max_pending {
            tracing::warn!(requester = %who.principal, tenant = %who.tenant, waiting, "proposal refused: too many pending");
            return Ok(Found::Refuse(ApprovalNote {
                code: ApprovalCode::Pending,
                proposal_id: None,
                revises: None,
                reason: Some(format!(
                    "{waiting} of your proposals are already waiting for reviewers (approvals.max_pending); \
                     no new one was made"
                )),
                by_client: false,
            }));
        }
        let Some(p) = latest else {
            return self.create(ask, &mine, now).await.map(Found::Wait);
        };
        match p.state {
            ProposalState::Approved => {
                if p.expires_ms.is_none_or(|e| e <= now) {
                    let mut expired = p.clone();
                    expired.state = ProposalState::Expired;
                    expired.reason = Some("approved, but not used before its expiry".into());
                    expired.updated_ms = now;
                    if self
                        .write(&mut expired, Some(ProposalState::Approved))
                        .await?
                    {
                        self.audit("approval_expired", &p, &[]);
                    }
                    let fresh = self.create(ask, &mine, now).await?;
                    return Ok(Found::Refuse(note(ApprovalCode::Expired, &fresh, None)));
                }
                if p.resource_version.as_deref() != ask.resource_version {
                    let reason = format!(
                        "the resource version changed from `{}` to `{}` after the approval",
                        p.resource_version.as_deref().unwrap_or("none"),
                        ask.resource_version.unwrap_or("none")
                    );
                    self.invalidate(&p, &reason).await?;
                    let fresh = self.create(ask, &mine, now).await?;
                    return Ok(Found::Refuse(note(
                        ApprovalCode::Stale,
                        &fresh,
                        Some(reason),
                    )));
                }
                if p.tool_definition.as_deref() != ask.tool_definition {
                    // A yes given for one definition of a tool never runs it
                    // under another: the server may have changed what the
                    // tool does since the reviewer looked.
                    let reason = format!(
                        "the tool's definition changed from `{}` to `{}` after the approval",
                        p.tool_definition.as_deref().unwrap_or("none"),
                        ask.tool_definition.unwrap_or("none")
                    );
                    self.invalidate(&p, &reason).await?;
                    return self.create(ask, &mine, now).await.map(Found::Wait);
                }
                if !reviewer_still_valid(&p, reviewers) {
                    self.invalidate(
                        &p,
                        "the approving reviewer is no longer registered with that key",
                    )
                    .await?;
                    return self.create(ask, &mine, now).await.map(Found::Wait);
                }
                // The policies in force now may ask for more reviewers than
                // approved it: then it waits for them again, with the
                // approvals it has.
                if p.quorum != *ask.quorum && p.confirmation.is_none() {
                    let mut next = p.clone();
                    next.quorum = ask.quorum.clone();
                    next.updated_ms = now;
                    if quorum_missing(&next, reviewers).is_some() {
                        next.state = ProposalState::Pending;
                        next.expires_ms = None;
                        next.decision = None;
                    }
                    if !self.write(&mut next, Some(ProposalState::Approved)).await? {
                        // Changed in between: the caller looks again.
                        return Ok(Found::Wait(p));
                    }
                    self.audit(
                        "quorum_changed",
                        &next,
                        &[(
                            "quorum",
                            serde_json::to_value(&next.quorum).unwrap_or(Value::Null),
                        )],
                    );
                    return Ok(if next.state == ProposalState::Approved {
                        Found::Usable(next)
                    } else {
                        Found::Wait(next)
                    });
                }
                Ok(Found::Usable(p))
            }
            // A retry of the key that consumed it (its first attempt was
            // proven not sent): the same consumption, not a second one.
            ProposalState::Consumed if p.consumed_by.as_deref() == Some(ask.key) => {
                Ok(Found::Usable(p))
            }
            // A quorum whose first approval expired before it was met: a
            // later approval cannot complete it; this call needs a new one.
            ProposalState::Pending if self.quorum_lapsed(&p, now).await? => {
                let fresh = self.create(ask, &mine, now).await?;
                Ok(Found::Refuse(note(ApprovalCode::Expired, &fresh, None)))
            }
            ProposalState::Pending
                if p.resource_version.as_deref() == ask.resource_version
                    && p.tool_definition.as_deref() == ask.tool_definition =>
            {
                let mut joined = p.clone();
                joined.joined = joined.joined.saturating_add(1);
                joined.updated_ms = now;
                // The quorum the policies ask for now; approvals already
                // gathered may meet a smaller one.
                joined.quorum = ask.quorum.clone();
                if !joined.approvals.is_empty() && quorum_missing(&joined, reviewers).is_none() {
                    joined.state = ProposalState::Approved;
                    joined.expires_ms = joined.earliest_expiry();
                    joined.decision = joined.approvals.last().map(|g| g.signed.clone());
                }
                if self
                    .write(&mut joined, Some(ProposalState::Pending))
                    .await?
                {
                    if joined.state == ProposalState::Approved {
                        self.audit(
                            "approval_granted",
                            &joined,
                            &[
                                ("channel", Value::from("reviewer")),
                                (
                                    "approvers",
                                    joined
                                        .approvals
                                        .iter()
                                        .map(|g| Value::from(g.reviewer()))
                                        .collect(),
                                ),
                                (
                                    "quorum",
                                    serde_json::to_value(&joined.quorum).unwrap_or(Value::Null),
                                ),
                            ],
                        );
                        return Ok(Found::Usable(joined));
                    }
                    Ok(Found::Wait(joined))
                } else {
                    // Decided in between: the caller looks again.
                    Ok(Found::Wait(p))
                }
            }
            ProposalState::Pending => {
                self.invalidate(
                    &p,
                    "superseded: the resource version or the tool's definition changed while pending",
                )
                    .await?;
                self.create(ask, &mine, now).await.map(Found::Wait)
            }
            ProposalState::Denied => {
                let reason = match (&p.confirmation, &p.decision) {
                    (Some(c), _) => Some(c.reason.clone()).filter(|r| !r.is_empty()),
                    (None, Some(d)) => Some(d.statement.reason.clone()),
                    (None, None) => None,
                };
                let mut n = note(ApprovalCode::Denied, &p, reason);
                n.by_client = p.confirmation.is_some();
                Ok(Found::Refuse(n))
            }
            // An approval that expired unused (found by the sweep): say so
            // once, with the fresh proposal that replaces it.
            ProposalState::Expired if p.decision.is_some() => {
                let fresh = self.create(ask, &mine, now).await?;
                Ok(Found::Refuse(note(ApprovalCode::Expired, &fresh, None)))
            }
            // Consumed by another key, expired while pending, invalidated:
            // this call needs a new yes.
            _ => self.create(ask, &mine, now).await.map(Found::Wait),
        }
    }

    async fn create(
        &self,
        ask: &Ask<'_>,
        mine: &[Proposal],
        now: i64,
    ) -> Result<Proposal, StoreError> {
        let mut p = Proposal {
            id: format!("p-{:016x}", rand::random::<u64>()),
            state: ProposalState::Pending,
            created_ms: now,
            updated_ms: now,
            server: ask.server.to_owned(),
            tool: ask.tool.to_owned(),
            arguments: ask.arguments.clone(),
            call_digest: ask.digest.to_owned(),
            requester: ask.identity.principal.clone(),
            requester_aka: ask.identity.aka.clone(),
            client: ask.identity.client.clone(),
            tenant: ask.identity.tenant.clone(),
            resource_version: ask.resource_version.map(str::to_owned),
            tool_definition: ask.tool_definition.map(str::to_owned),
            definition_change: ask.definition_change.clone(),
            risk: ask.risk,
            policies: ask.policies.to_vec(),
            revises: None,
            beside: None,
            call_key: Some(ask.key.to_owned()),
            joined: 0,
            decision: None,
            quorum: ask.quorum.clone(),
            approvals: Vec::new(),
            denials: Vec::new(),
            revision: 0,
            expires_ms: None,
            consumed_by: None,
            reason: None,
            confirmation: None,
            asked_by: Vec::new(),
            trace: ask.trace.clone(),
            withdrawn: Vec::new(),
            looks_like: ask.looks_like.clone(),
            headline: ask.headline.clone(),
            guards: ask.guards.clone(),
        };
        p.relate(mine, ms(self.config.revision_window), ask.revises);
        if !self.write(&mut p, None).await? {
            return Err(StoreError::Collision(p.id.clone()));
        }
        let mut extra = vec![
            ("idempotency_key", Value::from(ask.client_key)),
            ("risk", serde_json::to_value(p.risk).unwrap_or(Value::Null)),
            ("policies", Value::from(p.policies.clone())),
        ];
        if let Some(a) = &self.audit {
            let mut args = serde_json::Map::new();
            a.arguments_fields(&p.arguments, &mut args);
            extra.extend(args.into_iter().map(|(k, v)| match k.as_str() {
                "arguments" => ("arguments", v),
                _ => ("arguments_digest", v),
            }));
        }
        // The diff's values are argument values: recorded as the arguments
        // are (a redacted card number must not come back through its
        // `before` and `after`).
        let other = |r: &Revision| {
            let changes = match &self.audit {
                Some(a) => a.changes_value(&r.changes),
                None => Value::Null,
            };
            serde_json::json!({"proposal_id": r.proposal_id, "changes": changes})
        };
        match (&p.revises, &p.beside) {
            (Some(r), _) => {
                extra.push(("revises", other(r)));
                self.audit("proposal_revised", &p, &extra);
            }
            (None, beside) => {
                if let Some(b) = beside {
                    extra.push(("beside", other(b)));
                }
                self.audit("proposal_created", &p, &extra)
            }
        }
        tracing::info!(proposal = %p.id, server = %p.server, tool = %p.tool, requester = %p.requester, tenant = %p.tenant, revises = %p.revises.as_ref().map_or("none", |r| r.proposal_id.as_str()), "proposal created");
        Ok(p)
    }

    /// Accept a reviewer's signed decision: the statement must describe this
    /// proposal exactly (and name the policy set in force, from version 3),
    /// be signed by one of `reviewer`'s registered keys, be timely, and (for
    /// an approval) be allowed by `may_approve`.
    ///
    /// With a quorum (DESIGN.md section 20) an approval is one of several:
    /// the proposal stays pending, holding it, until the approvals gathered
    /// satisfy the quorum under the reviewers file in force; then it is
    /// approved, until the earliest of their expiries. A reviewer counts
    /// once, whatever key or gateway they use; the requester never counts.
    /// Each write is a compare and set on the proposal's revision: two
    /// reviewers deciding at once through two gateways both land, in turn.
    pub async fn decide(
        &self,
        id: &str,
        statement: Statement,
        proof: Proof<'_>,
        reviewer: &Reviewer,
        under: Under<'_>,
        may_approve: impl Fn(&Proposal) -> Result<(), String>,
    ) -> Result<Proposal, DecideError> {
        let refused = |e: ApprovalError| DecideError::Refused(e.to_string());
        let mut p = self
            .store
            .get_proposal(id)
            .await?
            .filter(|p| reviewer.covers(&p.tenant))
            .ok_or_else(|| DecideError::NotFound(id.to_owned()))?;
        if p.state != ProposalState::Pending {
            return Err(not_pending(&p));
        }
        // What the statement binds does not change while a proposal is
        // pending: checked once, against the policy set in force.
        let mut binding = p.binding();
        binding.policy_set = Some(under.policy_set);
        statement.check_binding(&binding).map_err(refused)?;
        if statement.reviewer != reviewer.name {
            return Err(DecideError::Refused(format!(
                "the statement is signed for reviewer `{}`, but the request comes from `{}`",
                statement.reviewer, reviewer.name
            )));
        }
        // The signature is checked before anything else is trusted in it;
        // any of the reviewer's keys may have made it.
        let (signature, public_key, passkey) = match proof {
            Proof::Ed25519(signature) => {
                let key = reviewer
                    .verify_with(|k| statement.verify(k, signature))
                    .map_err(|e| refused(e.unwrap_or(ApprovalError::BadSignature)))?;
                let public_key = crate::core::reviewers::format_public_key(key);
                (signature.to_owned(), public_key, None)
            }
            Proof::Passkey {
                assertion,
                origin,
                rp_id,
            } => (
                String::new(),
                format!("passkey:{}", assertion.credential_id),
                Some(
                    self.check_passkey(&statement, reviewer, assertion, origin, rp_id)
                        .await?,
                ),
            ),
        };
        // A statement whose approval was withdrawn stays withdrawn: sent
        // again (a replay, or a client retrying an old body), it is refused.
        let digest = statement.digest().map_err(refused)?;
        let now = self.clock.now_ms();
        let skew = ms(self.config.clock_skew);
        let issued = parse_rfc3339(&statement.issued_at).ok_or_else(|| {
            DecideError::Refused(format!(
                "`issued_at` `{}` is not RFC 3339",
                statement.issued_at
            ))
        })?;
        if (issued - now).abs() > skew {
            return Err(DecideError::Refused(format!(
                "`issued_at` {} is too far from the gateway's clock ({}): check the reviewer's clock",
                statement.issued_at,
                rfc3339(now)
            )));
        }
        let expires = parse_rfc3339(&statement.expires_at).ok_or_else(|| {
            DecideError::Refused(format!(
                "`expires_at` `{}` is not RFC 3339",
                statement.expires_at
            ))
        })?;
        match statement.decision {
            // The reviewer chooses the expiry; the gateway caps it at
            // `approvals.ttl` after signing (never extends it).
            Verdict::Approve if expires <= now => {
                return Err(DecideError::Refused(format!(
                    "`expires_at` {} is already past",
                    statement.expires_at
                )))
            }
            Verdict::Deny if statement.reason.trim().is_empty() => {
                return Err(DecideError::Refused(
                    "a denial needs a reason (`--reason TEXT`): the agent and the audit log get it"
                        .into(),
                ))
            }
            _ => {}
        }
        let given = Given {
            signed: SignedDecision {
                statement: statement.clone(),
                signature,
                public_key,
                passkey,
            },
            groups: reviewer.groups.clone(),
            expires_ms: expires.min(issued.saturating_add(ms(self.config.ttl))),
        };
        // Change and write over the revision read; a write that finds
        // another reviewer's decision landed first reads again.
        for _ in 0..16 {
            if p.state != ProposalState::Pending {
                return Err(not_pending(&p));
            }
            if self.quorum_lapsed(&p, now).await? {
                return Err(DecideError::NotPending {
                    id: p.id.clone(),
                    state: ProposalState::Expired.as_str(),
                });
            }
            if p.withdrawn.contains(&digest) {
                return Err(DecideError::Refused(format!(
                    "this approval of proposal `{id}` was withdrawn: the same signed statement is never accepted again (approve anew to sign a new one)"
                )));
            }
            if let Some(g) = p
                .approvals
                .iter()
                .chain(&p.denials)
                .find(|g| g.reviewer() == reviewer.name)
            {
                let did = match g.signed.statement.decision {
                    Verdict::Approve => "approved",
                    Verdict::Deny => "denied",
                };
                return Err(DecideError::Refused(format!(
                    "reviewer `{}` already {did} proposal `{id}`: a reviewer counts once, whichever key or gateway they use{}",
                    reviewer.name,
                    if did == "approved" { " (`countersign withdraw` takes an approval back while the quorum is not met)" } else { "" }
                )));
            }
            let mut next = p.clone();
            next.updated_ms = now;
            match statement.decision {
                Verdict::Approve => {
                    may_approve(&p).map_err(DecideError::Forbidden)?;
                    // The requester never counts, whatever the policies
                    // say: a quorum is other people's eyes on the call.
                    if reviewer.is_requester(&p.requester, &p.requester_aka) {
                        return Err(DecideError::Forbidden(format!(
                            "reviewer `{}` asked for this call (as `{}`): nobody approves their own call",
                            reviewer.name, p.requester
                        )));
                    }
                    next.approvals.push(given.clone());
                    if quorum_missing(&next, under.reviewers).is_none() {
                        next.state = ProposalState::Approved;
                        next.expires_ms = next.earliest_expiry();
                        next.decision = Some(given.signed.clone());
                    }
                }
                Verdict::Deny => {
                    next.denials.push(given.clone());
                    if next.denials.len() >= p.quorum.denials as usize {
                        next.state = ProposalState::Denied;
                        next.decision = Some(given.signed.clone());
                    }
                    if p.quorum.denials <= 1 {
                        // One denial ends it: the decision says it all.
                        next.denials.clear();
                    }
                }
            }
            if self.write(&mut next, Some(ProposalState::Pending)).await? {
                self.decided(&next, reviewer, &given);
                return Ok(next);
            }
            p = self.reread(id).await?;
        }
        Err(DecideError::Refused(format!(
            "proposal `{id}` kept changing while this decision was being recorded: try again"
        )))
    }

    /// A passkey's assertion over `statement` (W3C WebAuthn 7.2): its
    /// challenge is the statement's digest, its credential one of the
    /// reviewer's in `reviewers.toml`, and its counter above the last one
    /// seen for that credential (when the authenticator keeps one: a cloned
    /// authenticator falls behind).
    async fn check_passkey(
        &self,
        statement: &Statement,
        reviewer: &Reviewer,
        assertion: &crate::core::passkey::Assertion,
        origin: &str,
        rp_id: &str,
    ) -> Result<crate::core::approval::PasskeyProof, DecideError> {
        let refused = DecideError::Refused;
        let key = reviewer.passkey(&assertion.credential_id).ok_or_else(|| {
            refused(format!(
                "passkey `{}` is not one of reviewer `{}`'s in reviewers.toml",
                assertion.credential_id, reviewer.name
            ))
        })?;
        let digest = statement
            .digest_bytes()
            .map_err(|e| refused(e.to_string()))?;
        let verified = crate::core::passkey::verify_assertion(
            key,
            assertion,
            &crate::core::passkey::Expect {
                challenge: &digest,
                origin,
                rp_id,
            },
        )
        .map_err(|e| refused(format!("the passkey's assertion is refused: {e}")))?;
        self.passkey_counter(&reviewer.name, &key.id, verified.counter)
            .await
            .map_err(refused)?;
        Ok(crate::core::approval::PasskeyProof {
            assertion: assertion.clone(),
            credential_public_key: key.public_key.clone(),
            alg: key.alg,
            origin: origin.to_owned(),
            rp_id: rp_id.to_owned(),
        })
    }

    /// Record `counter` for credential `id` of `reviewer`: it must exceed
    /// the last one seen, unless both are 0 (an authenticator without a
    /// counter, as synced passkeys are). Kept in the store, in one
    /// compare-and-set: a cloned authenticator falls behind, and an
    /// assertion replayed at another gateway sharing the store, or after a
    /// restart, is refused.
    pub(crate) async fn passkey_counter(
        &self,
        reviewer: &str,
        id: &str,
        counter: u32,
    ) -> Result<(), String> {
        use crate::store::console::{counter_key, Counted};
        match self
            .store
            .passkey_counter(counter_key(reviewer, id), counter)
            .await
        {
            Ok(Counted::Advanced) => Ok(()),
            Ok(Counted::Behind { last }) => Err(format!(
                "the passkey's signature counter went from {last} to {counter}: the authenticator may have been cloned, or the assertion replayed"
            )),
            // Fail closed: a counter that cannot be checked lets nothing in.
            Err(e) => Err(format!(
                "the passkey's signature counter could not be checked ({e}): try again"
            )),
        }
    }

    /// Log and audit a decision just written: for a single reviewer, the
    /// decision; with a quorum, one entry per reviewer's part, and one more
    /// when the quorum is met or the denials end it. The signed statement
    /// goes into the log whole: `audit verify` checks it against
    /// reviewers.toml without trusting the gateway.
    fn decided(&self, next: &Proposal, reviewer: &Reviewer, given: &Given) {
        tracing::info!(proposal = %next.id, reviewer = %reviewer.name, state = next.state.as_str(), progress = %next.progress().unwrap_or_default(), "proposal decided");
        let policy_set = given
            .signed
            .statement
            .policy_set
            .clone()
            .map_or(Value::Null, Value::from);
        let expires_at = next
            .expires_ms
            .map_or(Value::Null, |e| Value::from(rfc3339(e)));
        if next.quorum.is_single() {
            self.audit(
                decided_kind(next),
                next,
                &[
                    ("channel", Value::from("reviewer")),
                    ("reviewer", Value::from(reviewer.name.clone())),
                    (
                        "approval",
                        serde_json::to_value(&given.signed).unwrap_or(Value::Null),
                    ),
                    ("policy_set", policy_set),
                    ("expires_at", expires_at),
                ],
            );
            return;
        }
        let kind = match given.signed.statement.decision {
            Verdict::Approve => "approval_partial",
            Verdict::Deny => "denial_partial",
        };
        self.audit(
            kind,
            next,
            &[
                ("channel", Value::from("reviewer")),
                ("reviewer", Value::from(reviewer.name.clone())),
                ("groups", Value::from(given.groups.clone())),
                (
                    "approval",
                    serde_json::to_value(&given.signed).unwrap_or(Value::Null),
                ),
                ("policy_set", policy_set),
                (
                    "quorum",
                    serde_json::to_value(&next.quorum).unwrap_or(Value::Null),
                ),
                ("progress", Value::from(next.progress().unwrap_or_default())),
            ],
        );
        if next.state != ProposalState::Pending {
            let names = |list: &[Given]| -> Value {
                list.iter().map(|g| Value::from(g.reviewer())).collect()
            };
            let (who, field) = match next.state {
                ProposalState::Approved => (names(&next.approvals), "approvers"),
                _ => (names(&next.denials), "deniers"),
            };
            self.audit(
                decided_kind(next),
                next,
                &[
                    ("channel", Value::from("reviewer")),
                    (field, who),
                    (
                        "quorum",
                        serde_json::to_value(&next.quorum).unwrap_or(Value::Null),
                    ),
                    ("expires_at", expires_at),
                ],
            );
        }
    }

    /// A reviewer takes their approval of a pending proposal back, before
    /// the quorum is met (DESIGN.md section 20). The request is signed by
    /// the reviewer (the control API checks that); once the quorum is met
    /// the approval is the call's, and it is too late.
    pub async fn withdraw(&self, id: &str, reviewer: &Reviewer) -> Result<Proposal, DecideError> {
        let now = self.clock.now_ms();
        let mut p = self
            .store
            .get_proposal(id)
            .await?
            .filter(|p| reviewer.covers(&p.tenant))
            .ok_or_else(|| DecideError::NotFound(id.to_owned()))?;
        for _ in 0..16 {
            if p.state != ProposalState::Pending {
                return Err(not_pending(&p));
            }
            let Some(at) = p
                .approvals
                .iter()
                .position(|g| g.reviewer() == reviewer.name)
            else {
                return Err(DecideError::Refused(format!(
                    "reviewer `{}` has no approval of proposal `{id}` to withdraw",
                    reviewer.name
                )));
            };
            let mut next = p.clone();
            let gone = next.approvals.remove(at);
            if let Ok(d) = gone.signed.statement.digest() {
                next.withdrawn.push(d);
            }
            next.updated_ms = now;
            if self
                .write_telling(
                    &mut next,
                    Some(ProposalState::Pending),
                    Some(&reviewer.name),
                )
                .await?
            {
                tracing::info!(proposal = %id, reviewer = %reviewer.name, "approval withdrawn");
                self.audit(
                    "approval_withdrawn",
                    &next,
                    &[
                        ("channel", Value::from("reviewer")),
                        ("reviewer", Value::from(reviewer.name.clone())),
                        (
                            "withdrawn",
                            Value::from(gone.signed.statement.issued_at.clone()),
                        ),
                        ("progress", Value::from(next.progress().unwrap_or_default())),
                    ],
                );
                return Ok(next);
            }
            p = self.reread(id).await?;
        }
        Err(DecideError::Refused(format!(
            "proposal `{id}` kept changing while the withdrawal was being recorded: try again"
        )))
    }

    /// `id` as stored now, after a write over an older revision lost.
    async fn reread(&self, id: &str) -> Result<Proposal, DecideError> {
        self.store
            .get_proposal(id)
            .await?
            .ok_or_else(|| DecideError::NotPending {
                id: id.to_owned(),
                state: "gone",
            })
    }

    /// A pending proposal whose earliest approval expired before the quorum
    /// was met: expired now (a later approval cannot complete it, and a
    /// retry of the call makes a new proposal). Returns whether it had.
    async fn quorum_lapsed(&self, p: &Proposal, now: i64) -> Result<bool, StoreError> {
        if p.state != ProposalState::Pending || p.earliest_expiry().is_none_or(|e| e > now) {
            return Ok(false);
        }
        let mut next = p.clone();
        next.state = ProposalState::Expired;
        next.reason = Some("an approval expired before the quorum was reached".into());
        next.updated_ms = now;
        if self.write(&mut next, Some(ProposalState::Pending)).await? {
            self.audit(
                "approval_expired",
                p,
                &[
                    ("was", Value::from("pending")),
                    (
                        "reason",
                        Value::from("an approval expired before the quorum was reached"),
                    ),
                ],
            );
        }
        Ok(true)
    }

    /// Write a decided proposal over its pending self; the first decision
    /// wins, a later one is told who came first.
    async fn settle(&self, mut next: Proposal) -> Result<(), DecideError> {
        if self.write(&mut next, Some(ProposalState::Pending)).await? {
            return Ok(());
        }
        Err(match self.store.get_proposal(&next.id).await? {
            Some(now) => not_pending(&now),
            None => DecideError::NotPending {
                id: next.id,
                state: "gone",
            },
        })
    }

    /// Record that this gateway put `p` to the client as a `requestState`
    /// signed with `key` (`ed25519:...`), so that any gateway sharing the
    /// store can verify the state. Written once per key, while pending.
    pub async fn asked_by(&self, p: &Proposal, key: &str) -> Result<bool, StoreError> {
        if p.asked_by.iter().any(|k| k == key) {
            return Ok(true);
        }
        // The store compares the state only: two gateways adding their keys
        // at once could each write over the other's. So each reads the
        // proposal again after writing, and writes again until its key is
        // there (both converge: every write starts from a fresh read).
        for _ in 0..8 {
            let Some(fresh) = self.store.get_proposal(&p.id).await? else {
                return Ok(false);
            };
            if fresh.state != ProposalState::Pending {
                return Ok(false);
            }
            if fresh.asked_by.iter().any(|k| k == key) {
                return Ok(true);
            }
            let mut next = fresh;
            next.asked_by.push(key.to_owned());
            next.updated_ms = self.clock.now_ms();
            self.write(&mut next, Some(ProposalState::Pending)).await?;
        }
        Ok(false)
    }

    /// The answer of the person at the client (DESIGN.md section 14): the
    /// first answer to a pending proposal wins, exactly once (compare and
    /// set on `pending`, as a reviewer's decision). A yes is an approval
    /// that expires after `approvals.ttl` and is consumed at execution start
    /// like any other.
    pub async fn confirm(&self, id: &str, c: Confirmation) -> Result<Proposal, DecideError> {
        let p = self
            .store
            .get_proposal(id)
            .await?
            .ok_or_else(|| DecideError::NotFound(id.to_owned()))?;
        if p.state != ProposalState::Pending {
            return Err(not_pending(&p));
        }
        // A yes in the client is the requester's own: it can never be one
        // of the distinct reviewers a quorum asks for.
        if !p.quorum.is_single() {
            return Err(DecideError::Refused(format!(
                "proposal `{id}` needs {} reviewers: a yes in the client is the requester's own and does not count towards them",
                p.quorum.needed()
            )));
        }
        // Only the requester answers in the client: the question went to
        // their session or their state, and the answer must come back the same way.
        if c.principal != p.requester {
            return Err(DecideError::Refused(format!(
                "proposal `{id}` is `{}`'s call; `{}` cannot answer it",
                p.requester, c.principal
            )));
        }
        let now = self.clock.now_ms();
        let mut next = p.clone();
        next.updated_ms = now;
        match c.decision {
            Verdict::Approve => {
                next.state = ProposalState::Approved;
                next.expires_ms = Some(now.saturating_add(ms(self.config.ttl)));
            }
            Verdict::Deny => next.state = ProposalState::Denied,
        }
        next.confirmation = Some(c.clone());
        self.settle(next.clone()).await?;
        tracing::info!(proposal = %id, principal = %c.principal, via = %c.via, state = next.state.as_str(), "proposal answered in the client");
        self.audit(
            decided_kind(&next),
            &next,
            &[
                ("channel", Value::from("client")),
                (
                    "confirmation",
                    serde_json::to_value(&c).unwrap_or(Value::Null),
                ),
                (
                    "expires_at",
                    next.expires_ms
                        .map_or(Value::Null, |e| Value::from(rfc3339(e))),
                ),
            ],
        );
        Ok(next)
    }

    /// An answer from the client that came after another answer won:
    /// recorded, never applied.
    pub fn too_late(&self, p: &Proposal, c: &Confirmation, why: &str) {
        tracing::warn!(proposal = %p.id, principal = %c.principal, "the client's answer came too late: {why}");
        self.audit(
            "confirmation_too_late",
            p,
            &[
                ("channel", Value::from("client")),
                (
                    "confirmation",
                    serde_json::to_value(c).unwrap_or(Value::Null),
                ),
                ("reason", Value::from(why)),
            ],
        );
    }

    /// Expire approvals past their expiry and proposals pending too long;
    /// forget final ones older than `retention`.
    pub async fn sweep(&self, retention: std::time::Duration) -> Result<usize, StoreError> {
        let now = self.clock.now_ms();
        let mut changed = 0;
        for p in self.store.open_proposals().await? {
            if self.quorum_lapsed(&p, now).await? {
                changed += 1;
                continue;
            }
            let expired = match p.state {
                ProposalState::Approved => p.expires_ms.is_none_or(|e| e <= now),
                ProposalState::Pending => now - p.created_ms > ms(self.config.pending_ttl),
                _ => false,
            };
            if expired {
                let mut next = p.clone();
                next.state = ProposalState::Expired;
                next.reason = Some(if p.state == ProposalState::Approved {
                    "approved, but not used before its expiry".into()
                } else {
                    "nobody decided it in time".into()
                });
                next.updated_ms = now;
                if self.write(&mut next, Some(p.state)).await? {
                    self.audit(
                        "approval_expired",
                        &p,
                        &[("was", Value::from(p.state.as_str()))],
                    );
                    changed += 1;
                }
            }
        }
        self.store.gc_proposals(now - ms(retention)).await?;
        Ok(changed)
    }
}

fn note(code: ApprovalCode, p: &Proposal, reason: Option<String>) -> ApprovalNote {
    ApprovalNote {
        code,
        proposal_id: Some(p.id.clone()),
        revises: p.revises.as_ref().map(|r| r.proposal_id.clone()),
        reason,
        by_client: false,
    }
}

/// The audit kind of a decision just made.
fn decided_kind(p: &Proposal) -> &'static str {
    if p.state == ProposalState::Approved {
        "approval_granted"
    } else {
        "approval_denied"
    }
}

/// Who answered `p`, in words.
pub(crate) fn answered_by(p: &Proposal) -> String {
    match (&p.confirmation, &p.decision) {
        (Some(c), _) => format!("the person at the client ({})", c.principal),
        (None, Some(d)) => format!("reviewer {}", d.statement.reviewer),
        (None, None) => "the gateway".into(),
    }
}

/// The refusal for a proposal that is no longer pending: too late when
/// someone answered it, else not pending.
fn not_pending(p: &Proposal) -> DecideError {
    if p.confirmation.is_some() || p.decision.is_some() {
        DecideError::TooLate {
            id: p.id.clone(),
            state: p.state.as_str(),
            by: answered_by(p),
        }
    } else {
        DecideError::NotPending {
            id: p.id.clone(),
            state: p.state.as_str(),
        }
    }
}

/// Revalidation: the reviewer who approved is still in `reviewers.toml`,
/// with the key that signed. Removing a reviewer voids their unused yeses.
/// A yes from the client is the requester's own: it stays valid (the
/// `confirm` policy is asked again at execution start).
fn reviewer_still_valid(p: &Proposal, reviewers: &Reviewers) -> bool {
    if let Some(c) = &p.confirmation {
        return c.principal == p.requester && c.decision == Verdict::Approve;
    }
    let Some(d) = &p.decision else {
        return false;
    };
    // A quorum: every approval still counts, and together they still meet
    // it under the reviewers file in force (a reviewer who left, or lost
    // the group they were counted for, voids it).
    if !p.approvals.is_empty() {
        let all_count = p.approvals.iter().all(|g| {
            reviewers.get(g.reviewer()).is_some_and(|r| {
                r.has_key(&g.signed.public_key)
                    && r.covers(&p.tenant)
                    && !r.is_requester(&p.requester, &p.requester_aka)
            })
        });
        return all_count && quorum_missing(p, reviewers).is_none();
    }
    // A reviewer since listed as the requester (`principals`) no longer
    // counts: the file in force says the yes was their own.
    reviewers.get(&d.statement.reviewer).is_some_and(|r| {
        r.has_key(&d.public_key)
            && r.covers(&p.tenant)
            && !r.is_requester(&p.requester, &p.requester_aka)
    })
}

/// The pending answer for a proposal.
pub(crate) fn pending(p: &Proposal) -> ApprovalNote {
    note(ApprovalCode::Pending, p, None)
}

#[cfg(test)]
mod tests;
