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
    self, ApprovalError, Confirmation, DefinitionChange, Proposal, ProposalState, Revision, Risk,
    SignedDecision, Statement, Verdict,
};
use crate::core::config::ApprovalsConfig;
use crate::core::identity::Identity;
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
    /// Risk from the effective annotations.
    pub risk: Risk,
    /// The policies that asked for approval.
    pub policies: &'a [String],
    /// The call's ledger key (storage key).
    pub key: &'a str,
    /// The idempotency key as the client sent it (or derived).
    pub client_key: &'a str,
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

/// Proposals and approvals over the store.
pub struct Book {
    store: Arc<dyn Store>,
    config: ApprovalsConfig,
    // Serializes create-or-join: two identical calls with different keys
    // must not both create a proposal (retries never stack approvals). A
    // tokio mutex: it is held across the store write.
    making: tokio::sync::Mutex<()>,
    events: broadcast::Sender<Event>,
    audit: Option<Arc<dyn AuditSink>>,
    /// Expiries are judged on this clock (tests move it by hand).
    clock: Arc<dyn Clock>,
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
            making: tokio::sync::Mutex::new(()),
            events,
            audit,
            clock,
        }
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

    /// Move `p` from `from` to its new contents; publish on success.
    async fn write(&self, p: Proposal, from: Option<ProposalState>) -> Result<bool, StoreError> {
        let ok = self.store.put_proposal(p.clone(), from).await?;
        if ok {
            self.publish(
                if from.is_none() {
                    "proposal_created"
                } else {
                    "proposal_updated"
                },
                &p,
            );
        }
        Ok(ok)
    }

    /// Void `p` (resource changed, reviewer removed, superseded).
    pub async fn invalidate(&self, p: &Proposal, reason: &str) -> Result<(), StoreError> {
        let mut next = p.clone();
        next.state = ProposalState::Invalidated;
        next.reason = Some(reason.to_owned());
        next.updated_ms = self.clock.now_ms();
        if self.write(next, Some(p.state)).await? {
            self.audit(
                "approval_invalidated",
                p,
                &[
                    ("reason", Value::from(reason)),
                    ("was", Value::from(p.state.as_str())),
                ],
            );
        }
        Ok(())
    }

    /// Find what a call that needs approval may use, or create (or join)
    /// the pending proposal it waits on. Revalidates an approval before
    /// offering it: expiry, resource version, the reviewer still registered
    /// with the same key.
    pub async fn find(&self, ask: &Ask<'_>, reviewers: &Reviewers) -> Result<Found, StoreError> {
        let _making = self.making.lock().await;
        let now = self.clock.now_ms();
        let who = ask.identity;
        let mine: Vec<Proposal> = self
            .store
            .list_proposals()
            .await?
            .into_iter()
            .filter(|p| p.tenant == who.tenant && p.requester == who.principal)
            .collect();
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
                    if self.write(expired, Some(ProposalState::Approved)).await? {
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
                Ok(Found::Usable(p))
            }
            // A retry of the key that consumed it (its first attempt was
            // proven not sent): the same consumption, not a second one.
            ProposalState::Consumed if p.consumed_by.as_deref() == Some(ask.key) => {
                Ok(Found::Usable(p))
            }
            ProposalState::Pending
                if p.resource_version.as_deref() == ask.resource_version
                    && p.tool_definition.as_deref() == ask.tool_definition =>
            {
                let mut joined = p.clone();
                joined.joined = joined.joined.saturating_add(1);
                joined.updated_ms = now;
                if self
                    .write(joined.clone(), Some(ProposalState::Pending))
                    .await?
                {
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
        let window = ms(self.config.revision_window);
        // A revision: the most recent proposal of the same requester and
        // tool, within the window, for other arguments. Shown to the
        // reviewer with the difference, so a drifted retry is not mistaken
        // for a new request.
        let revises = mine
            .iter()
            .filter(|p| {
                p.server == ask.server
                    && p.tool == ask.tool
                    && p.call_digest != ask.digest
                    && now - p.created_ms <= window
            })
            .max_by(|a, b| a.created_ms.cmp(&b.created_ms).then(a.id.cmp(&b.id)))
            .map(|p| Revision {
                proposal_id: p.id.clone(),
                changes: approval::diff(&p.arguments, ask.arguments),
            });
        let p = Proposal {
            id: format!("p-{:016x}", rand::random::<u64>()),
            state: ProposalState::Pending,
            created_ms: now,
            updated_ms: now,
            server: ask.server.to_owned(),
            tool: ask.tool.to_owned(),
            arguments: ask.arguments.clone(),
            call_digest: ask.digest.to_owned(),
            requester: ask.identity.principal.clone(),
            client: ask.identity.client.clone(),
            tenant: ask.identity.tenant.clone(),
            resource_version: ask.resource_version.map(str::to_owned),
            tool_definition: ask.tool_definition.map(str::to_owned),
            definition_change: ask.definition_change.clone(),
            risk: ask.risk,
            policies: ask.policies.to_vec(),
            revises,
            joined: 0,
            decision: None,
            expires_ms: None,
            consumed_by: None,
            reason: None,
            confirmation: None,
            asked_by: Vec::new(),
        };
        if !self.write(p.clone(), None).await? {
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
        match &p.revises {
            Some(r) => {
                extra.push(("revises", serde_json::to_value(r).unwrap_or(Value::Null)));
                self.audit("proposal_revised", &p, &extra);
            }
            None => self.audit("proposal_created", &p, &extra),
        }
        tracing::info!(proposal = %p.id, server = %p.server, tool = %p.tool, requester = %p.requester, tenant = %p.tenant, revises = %p.revises.as_ref().map_or("none", |r| r.proposal_id.as_str()), "proposal created");
        Ok(p)
    }

    /// Accept a reviewer's signed decision: the statement must describe this
    /// proposal exactly, be signed by `reviewer`'s registered key, be timely,
    /// and (for an approval) be allowed by `may_approve`.
    pub async fn decide(
        &self,
        id: &str,
        statement: Statement,
        signature: &str,
        reviewer: &Reviewer,
        may_approve: impl FnOnce(&Proposal) -> Result<(), String>,
    ) -> Result<Proposal, DecideError> {
        let p = self
            .store
            .get_proposal(id)
            .await?
            .filter(|p| reviewer.covers(&p.tenant))
            .ok_or_else(|| DecideError::NotFound(id.to_owned()))?;
        if p.state != ProposalState::Pending {
            return Err(not_pending(&p));
        }
        let refused = |e: ApprovalError| DecideError::Refused(e.to_string());
        statement.check_binding(&p.binding()).map_err(refused)?;
        if statement.reviewer != reviewer.name {
            return Err(DecideError::Refused(format!(
                "the statement is signed for reviewer `{}`, but the request comes from `{}`",
                statement.reviewer, reviewer.name
            )));
        }
        // The signature is checked before anything else is trusted in it.
        statement
            .verify(&reviewer.key, signature)
            .map_err(refused)?;
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
        let mut next = p.clone();
        match statement.decision {
            Verdict::Approve => {
                // The reviewer chooses the expiry; the gateway caps it at
                // `approvals.ttl` after signing (never extends it).
                if expires <= now {
                    return Err(DecideError::Refused(format!(
                        "`expires_at` {} is already past",
                        statement.expires_at
                    )));
                }
                if let Err(why) = may_approve(&p) {
                    return Err(DecideError::Forbidden(why));
                }
                next.state = ProposalState::Approved;
                next.expires_ms = Some(expires.min(issued.saturating_add(ms(self.config.ttl))));
            }
            Verdict::Deny => {
                if statement.reason.trim().is_empty() {
                    return Err(DecideError::Refused(
                        "a denial needs a reason (`--reason TEXT`): the agent and the audit log get it".into(),
                    ));
                }
                next.state = ProposalState::Denied;
            }
        }
        next.updated_ms = now;
        next.decision = Some(SignedDecision {
            statement,
            signature: signature.to_owned(),
            public_key: crate::core::reviewers::format_public_key(&reviewer.key),
        });
        self.settle(next.clone()).await?;
        tracing::info!(proposal = %id, reviewer = %reviewer.name, state = next.state.as_str(), "proposal decided");
        // The signed statement goes into the log whole: `audit verify`
        // checks it against reviewers.toml without trusting the gateway.
        self.audit(
            decided_kind(&next),
            &next,
            &[
                ("channel", Value::from("reviewer")),
                ("reviewer", Value::from(reviewer.name.clone())),
                (
                    "approval",
                    serde_json::to_value(&next.decision).unwrap_or(Value::Null),
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

    /// Write a decided proposal over its pending self; the first decision
    /// wins, a later one is told who came first.
    async fn settle(&self, next: Proposal) -> Result<(), DecideError> {
        if self
            .write(next.clone(), Some(ProposalState::Pending))
            .await?
        {
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
            self.write(next, Some(ProposalState::Pending)).await?;
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
        for p in self.store.list_proposals().await? {
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
                if self.write(next, Some(p.state)).await? {
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
    reviewers.get(&d.statement.reviewer).is_some_and(|r| {
        crate::core::reviewers::format_public_key(&r.key) == d.public_key && r.covers(&p.tenant)
    })
}

/// The pending answer for a proposal.
pub(crate) fn pending(p: &Proposal) -> ApprovalNote {
    note(ApprovalCode::Pending, p, None)
}
