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
    ApprovalError, Confirmation, DefinitionChange, Given, Proposal, ProposalState, Quorum,
    Revision, Risk, SignedDecision, Statement,
};
use crate::core::config::ApprovalsConfig;
use crate::core::identity::Identity;
use crate::core::refusal::{ApprovalCode, ApprovalNote};
use crate::core::review::{self, decided_kind, note, Step};
use crate::core::reviewers::{Reviewer, Reviewers};
use crate::core::time::{ms, rfc3339, Clock};
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

impl From<review::Refusal> for DecideError {
    fn from(r: review::Refusal) -> DecideError {
        match r {
            review::Refusal::TooLate { id, state, by } => DecideError::TooLate { id, state, by },
            review::Refusal::NotPending { id, state } => DecideError::NotPending { id, state },
            review::Refusal::Refused(why) => DecideError::Refused(why),
            review::Refusal::Forbidden(why) => DecideError::Forbidden(why),
        }
    }
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
        let call = review::HeldCall {
            tenant: &who.tenant,
            requester: &who.principal,
            server: ask.server,
            digest: ask.digest,
            key: ask.key,
            resource_version: ask.resource_version,
            tool_definition: ask.tool_definition,
            quorum: ask.quorum,
        };
        match review::step(&mine, &call, reviewers, now, self.config.max_pending) {
            Step::Flooded(note) => {
                tracing::warn!(requester = %who.principal, tenant = %who.tenant, "proposal refused: too many pending");
                Ok(Found::Refuse(note))
            }
            Step::Create => self.create(ask, &mine, now).await.map(Found::Wait),
            Step::ExpireThenRefresh { was, mut expired } => {
                if self
                    .write(&mut expired, Some(ProposalState::Approved))
                    .await?
                {
                    self.audit("approval_expired", &was, &[]);
                }
                let fresh = self.create(ask, &mine, now).await?;
                Ok(Found::Refuse(note(ApprovalCode::Expired, &fresh, None)))
            }
            Step::Replace { old, reason, code } => {
                self.invalidate(&old, &reason).await?;
                let fresh = self.create(ask, &mine, now).await?;
                Ok(match code {
                    Some(code) => Found::Refuse(note(code, &fresh, Some(reason))),
                    None => Found::Wait(fresh),
                })
            }
            Step::Requorum { was, mut next } => {
                if !self.write(&mut next, Some(ProposalState::Approved)).await? {
                    // Changed in between: the caller looks again.
                    return Ok(Found::Wait(was));
                }
                self.audit(
                    "quorum_changed",
                    &next,
                    &[(
                        "quorum",
                        serde_json::to_value(&next.quorum).unwrap_or(Value::Null),
                    )],
                );
                Ok(if next.state == ProposalState::Approved {
                    Found::Usable(next)
                } else {
                    Found::Wait(next)
                })
            }
            Step::Usable(p) => Ok(Found::Usable(p)),
            Step::Lapsed { was, mut expired } => {
                self.expire_lapsed(&was, &mut expired).await?;
                let fresh = self.create(ask, &mine, now).await?;
                Ok(Found::Refuse(note(ApprovalCode::Expired, &fresh, None)))
            }
            Step::Join { was, mut joined } => {
                if !self
                    .write(&mut joined, Some(ProposalState::Pending))
                    .await?
                {
                    // Decided in between: the caller looks again.
                    return Ok(Found::Wait(was));
                }
                if joined.state != ProposalState::Approved {
                    return Ok(Found::Wait(joined));
                }
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
                Ok(Found::Usable(joined))
            }
            Step::Refuse(note) => Ok(Found::Refuse(note)),
            Step::Refresh => {
                let fresh = self.create(ask, &mine, now).await?;
                Ok(Found::Refuse(note(ApprovalCode::Expired, &fresh, None)))
            }
        }
    }

    async fn create(
        &self,
        ask: &Ask<'_>,
        mine: &[Proposal],
        now: i64,
    ) -> Result<Proposal, StoreError> {
        let mut p = Proposal {
            created_ms: now,
            updated_ms: now,
            requester_aka: ask.identity.aka.clone(),
            client: ask.identity.client.clone(),
            resource_version: ask.resource_version.map(str::to_owned),
            tool_definition: ask.tool_definition.map(str::to_owned),
            definition_change: ask.definition_change.clone(),
            risk: ask.risk,
            policies: ask.policies.to_vec(),
            call_key: Some(ask.key.to_owned()),
            quorum: ask.quorum.clone(),
            trace: ask.trace.clone(),
            looks_like: ask.looks_like.clone(),
            headline: ask.headline.clone(),
            guards: ask.guards.clone(),
            ..Proposal::pending(
                format!("p-{:016x}", rand::random::<u64>()),
                ask.identity.tenant.clone(),
                ask.identity.principal.clone(),
                ask.server.to_owned(),
                ask.tool.to_owned(),
                ask.arguments.clone(),
                ask.digest.to_owned(),
            )
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
            let mut args = crate::audit::Fields::new();
            a.arguments_fields(&p.arguments, &mut args);
            extra.extend(args.into_iter().map(|(k, v)| match k.as_ref() {
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
            return Err(review::not_pending(&p).into());
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
        let expires_ms = review::timely(
            &statement,
            now,
            ms(self.config.clock_skew),
            ms(self.config.ttl),
        )?;
        let given = Given {
            signed: SignedDecision {
                statement,
                signature,
                public_key,
                passkey,
            },
            groups: reviewer.groups.clone(),
            expires_ms,
        };
        // Change and write over the revision read; a write that finds
        // another reviewer's decision landed first reads again.
        for _ in 0..16 {
            if p.state != ProposalState::Pending {
                return Err(review::not_pending(&p).into());
            }
            if let Some(mut expired) = review::lapsed(&p, now) {
                self.expire_lapsed(&p, &mut expired).await?;
                return Err(DecideError::NotPending {
                    id: p.id.clone(),
                    state: ProposalState::Expired.as_str(),
                });
            }
            let mut next = review::decided(
                &p,
                &given,
                &digest,
                reviewer,
                under.reviewers,
                now,
                &may_approve,
            )?;
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
            let (mut next, gone) = review::withdrawn(&p, &reviewer.name, now)?;
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

    /// Write `expired` over the lapsed quorum `was` (from `pending`; see
    /// [`review::lapsed`]), and say so in the audit log if this write made
    /// it.
    async fn expire_lapsed(
        &self,
        was: &Proposal,
        expired: &mut Proposal,
    ) -> Result<(), StoreError> {
        if self.write(expired, Some(ProposalState::Pending)).await? {
            self.audit(
                "approval_expired",
                was,
                &[
                    ("was", Value::from("pending")),
                    ("reason", Value::from(review::LAPSED)),
                ],
            );
        }
        Ok(())
    }

    /// Write a decided proposal over its pending self; the first decision
    /// wins, a later one is told who came first.
    async fn settle(&self, mut next: Proposal) -> Result<(), DecideError> {
        if self.write(&mut next, Some(ProposalState::Pending)).await? {
            return Ok(());
        }
        Err(match self.store.get_proposal(&next.id).await? {
            Some(now) => review::not_pending(&now).into(),
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
        let next = review::confirmed(&p, &c, self.clock.now_ms(), ms(self.config.ttl))?;
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

    /// Expire approvals past their expiry and proposals pending too long;
    /// forget final ones older than `retention`.
    pub async fn sweep(&self, retention: std::time::Duration) -> Result<usize, StoreError> {
        let now = self.clock.now_ms();
        let mut changed = 0;
        for p in self.store.open_proposals().await? {
            if let Some(mut expired) = review::lapsed(&p, now) {
                self.expire_lapsed(&p, &mut expired).await?;
                changed += 1;
                continue;
            }
            if let Some(mut next) = review::overdue(&p, now, ms(self.config.pending_ttl)) {
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

mod passkey;
#[cfg(test)]
mod tests;
mod told;
