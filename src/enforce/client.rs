//! Approval in the client (DESIGN.md section 14) as a service: putting a
//! proposal to the person at the client and taking their answer.
//!
//! - Handshake era: the gateway sends `elicitation/create` on the held
//!   call's response stream and keeps the question in the session's
//!   [`Asks`]; the client's response (a POST of its own) is matched by id
//!   and applied to the proposal ([`answered`]).
//! - 2026-07-28: the call is answered `input_required` with a signed
//!   `requestState` ([`Asker::question`]); the client's retry carries the
//!   state and the answer ([`Asker::reply`]).
//!
//! Either way the answer goes to the approval book, which applies the first
//! answer to a pending proposal exactly once (a reviewer's included), and
//! the approval is consumed at execution start with the idempotency key.

use parking_lot::Mutex;
use std::collections::HashMap;

use ed25519_dalek::SigningKey;
use serde_json::Value;

use super::book::{Book, DecideError};
use crate::core::approval::{self, Confirmation, Proposal, ProposalState, Verdict};
use crate::core::canonical::Reply;
use crate::core::confirm::{self, Answer, StateClaims, STATE_TYPE};
use crate::core::identity::Identity;
use crate::core::refusal::{ConfirmCode, ConfirmRefusal, Outcome, Question};
use crate::core::review::answered_by;
use crate::core::time::rfc3339;
use crate::store::StoreError;
use crate::wire::jsonrpc::{raw, Message};

/// The most questions one session keeps open.
const MAX_OPEN: usize = 64;

/// Prefix of the JSON-RPC id of the gateway's own `elicitation/create`.
const ASK_ID_PREFIX: &str = "countersign-confirm-";

/// A question put to a handshake-era client and not answered yet.
#[derive(Debug, Clone)]
pub struct Open {
    /// The proposal it decides.
    pub proposal_id: String,
    /// Who was asked (the session's identity).
    pub principal: String,
    /// Unix ms after which an answer is refused.
    pub expires_ms: i64,
    /// The request id, recorded with the answer.
    pub nonce: String,
}

/// The questions one handshake-era session has open. Only sessions whose
/// client declared form elicitation have one.
#[derive(Debug, Default)]
pub struct Asks {
    open: Mutex<HashMap<String, Open>>,
    /// The client knows elicitation modes (2025-11-25 and later).
    pub with_mode: bool,
}

impl Asks {
    /// The questions of a session that negotiated `version`.
    pub fn new(version: Option<&str>) -> Asks {
        Asks {
            open: Mutex::default(),
            with_mode: version.is_some_and(|v| v >= "2025-11-25"),
        }
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, HashMap<String, Open>> {
        self.open.lock()
    }

    /// Whether a question about `proposal_id` is open (it is asked once per
    /// session, however many calls join the proposal).
    pub fn asking(&self, proposal_id: &str, now_ms: i64) -> bool {
        self.lock()
            .values()
            .any(|o| o.proposal_id == proposal_id && o.expires_ms > now_ms)
    }

    /// Open a question; returns its request id, or `None` when the session
    /// has too many open (a client that never answers cannot grow it).
    pub fn ask(
        &self,
        proposal_id: &str,
        principal: &str,
        expires_ms: i64,
        now_ms: i64,
    ) -> Option<String> {
        let mut open = self.lock();
        open.retain(|_, o| o.expires_ms > now_ms);
        if open.len() >= MAX_OPEN {
            return None;
        }
        let id = format!("{ASK_ID_PREFIX}{:016x}", rand::random::<u64>());
        open.insert(
            id.clone(),
            Open {
                proposal_id: proposal_id.to_owned(),
                principal: principal.to_owned(),
                expires_ms,
                nonce: id.clone(),
            },
        );
        Some(id)
    }

    /// The open question a client response answers, taken out (answered
    /// once). Any other id is not the gateway's: it goes upstream.
    pub fn take(&self, id: Option<&Value>) -> Option<Open> {
        let id = id?.as_str()?;
        if !id.starts_with(ASK_ID_PREFIX) {
            return None;
        }
        self.lock().remove(id)
    }
}

/// The `elicitation/create` request for a question.
pub fn elicitation(id: &str, params: &Value) -> Message {
    Message::request(Value::from(id), "elicitation/create", Some(raw(params)))
}

/// The question's params: the plain sentence and arguments of the
/// proposal (the gateway's canonical copy).
pub fn question_params(p: &Proposal, with_mode: bool) -> Value {
    confirm::question(
        &approval::summary(p),
        &crate::core::canonical::jcs(&p.arguments),
        &p.call_digest,
        &p.id,
        with_mode,
    )
}

/// A handshake-era client's response to an open question: applied to the
/// proposal if it came in time and first. Every outcome is logged; an
/// answer that lost is audited as `confirmation_too_late`.
pub async fn answered(book: &Book, identity: &Identity, open: Open, response: &Message) {
    let now_ms = book.now_ms();
    let result = match (&response.result, &response.error) {
        (Some(r), _) => serde_json::from_str::<Value>(r.get()).unwrap_or(Value::Null),
        (None, Some(e)) => {
            tracing::info!(proposal = %open.proposal_id, error = %e.get(), "the client did not ask its user: the proposal stays with the reviewers");
            return;
        }
        (None, None) => return,
    };
    let answer = match confirm::read_answer(&result) {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(proposal = %open.proposal_id, "the client's answer is not usable, nothing decided: {e}");
            return;
        }
    };
    let Some(decision) = verdict(&answer) else {
        tracing::info!(proposal = %open.proposal_id, "the person at the client dismissed the question: the proposal stays with the reviewers");
        return;
    };
    let c = Confirmation {
        channel: "client".into(),
        principal: identity.principal.clone(),
        decision,
        reason: reason(&answer),
        at: rfc3339(now_ms),
        via: "elicitation/create".into(),
        nonce: open.nonce.clone(),
    };
    let p = match book.get(&open.proposal_id).await {
        Ok(Some(p)) => p,
        Ok(None) => return,
        Err(e) => {
            tracing::error!(proposal = %open.proposal_id, "the client's answer could not be recorded: {e}");
            return;
        }
    };
    if now_ms > open.expires_ms {
        book.too_late(&p, &c, "the question had expired (approvals.client_ttl)");
        return;
    }
    if let Err(e) = apply(book, &p, c).await {
        tracing::error!(proposal = %open.proposal_id, "the client's answer could not be recorded: {e}");
    }
}

/// Give the book the client's answer; an answer someone else beat is
/// recorded as too late.
async fn apply(book: &Book, p: &Proposal, c: Confirmation) -> Result<(), StoreError> {
    match book.confirm(&p.id, c.clone()).await {
        Ok(_) => Ok(()),
        Err(DecideError::Store(e)) => Err(e),
        Err(DecideError::TooLate { by, state, .. }) => {
            let now = book.get(&p.id).await.ok().flatten();
            book.too_late(
                now.as_ref().unwrap_or(p),
                &c,
                &format!("{by} answered first (the proposal is {state})"),
            );
            Ok(())
        }
        Err(e) => {
            tracing::warn!(proposal = %p.id, "the client's answer is not applied: {e}");
            Ok(())
        }
    }
}

fn verdict(a: &Answer) -> Option<Verdict> {
    match a {
        Answer::Approve { .. } => Some(Verdict::Approve),
        Answer::Deny { .. } => Some(Verdict::Deny),
        Answer::Cancel => None,
    }
}

fn reason(a: &Answer) -> String {
    match a {
        Answer::Approve { reason } | Answer::Deny { reason } => reason.clone(),
        Answer::Cancel => String::new(),
    }
}

/// The call a question is about, as the client channel binds it.
pub struct Subject<'a> {
    /// Requester.
    pub identity: &'a Identity,
    /// Server.
    pub server: &'a str,
    /// Tool.
    pub tool: &'a str,
    /// Canonical digest.
    pub digest: &'a str,
    /// The tool's definition digest now.
    pub tool_definition: Option<&'a str>,
    /// The ledger key.
    pub key: &'a str,
}

/// What the reply stage decided.
pub enum Replied {
    /// Go on with the call: the answer (if any) is with the book, and the
    /// gate finds what it decided.
    Continue,
    /// End the call here, nothing run.
    Stop(Outcome),
    /// The params are malformed (`-32602`).
    Invalid(String),
    /// The store did not answer.
    Store(StoreError),
}

/// The gateway's signer of `requestState`: its own Ed25519 key (the audit
/// log's), whose public half is recorded on every proposal it asks about.
pub struct Asker {
    key: SigningKey,
    public: String,
}

impl Asker {
    /// A signer with `key`.
    pub fn new(key: SigningKey) -> Asker {
        let public = crate::core::reviewers::format_public_key(&key.verifying_key());
        Asker { key, public }
    }

    fn claims(
        &self,
        s: &Subject<'_>,
        proposal_id: &str,
        expires_ms: i64,
        nonce: String,
    ) -> StateClaims {
        StateClaims {
            kind: STATE_TYPE.into(),
            proposal_id: proposal_id.to_owned(),
            server: s.server.to_owned(),
            tool: s.tool.to_owned(),
            call_digest: s.digest.to_owned(),
            principal: s.identity.principal.clone(),
            tenant: s.identity.tenant.clone(),
            tool_definition: s.tool_definition.map(str::to_owned),
            idempotency_key: s.key.to_owned(),
            expires_ms,
            nonce,
        }
    }

    /// 2026-07-28: the question about `p` as an `input_required` answer,
    /// with a state signed for exactly this call, principal and key.
    pub async fn question(
        &self,
        book: &Book,
        s: &Subject<'_>,
        p: &Proposal,
        now_ms: i64,
    ) -> Result<Question, StoreError> {
        // Recorded before the state leaves: whichever gateway the retry
        // reaches verifies it against the keys on the proposal.
        if !book.asked_by(p, &self.public).await? {
            return Err(StoreError::Collision(format!(
                "{} changed while the question was made",
                p.id
            )));
        }
        let expires_ms = now_ms.saturating_add(crate::core::time::ms(book.config().client_ttl));
        let claims = self.claims(
            s,
            &p.id,
            expires_ms,
            format!("{:032x}", rand::random::<u128>()),
        );
        Ok(Question {
            proposal_id: p.id.clone(),
            params: question_params(p, true),
            state: confirm::seal(&claims, &self.key),
        })
    }

    /// 2026-07-28: a retry that carries a `requestState` of the gateway's
    /// and (maybe) the answer. Checked in this order, each refusal precise:
    /// the form and the signature (against the keys recorded on the
    /// proposal it names), the binding to this very call, the expiry, and
    /// single use. A valid answer goes to the book; the call then goes on
    /// and the gate finds what was decided.
    pub async fn reply(&self, book: &Book, s: &Subject<'_>, reply: &Reply, now_ms: i64) -> Replied {
        let refuse = |code, reason: String| {
            Replied::Stop(Outcome::Confirmation(ConfirmRefusal { code, reason }))
        };
        let Some(state) = &reply.state else {
            return refuse(
                ConfirmCode::Invalid,
                "it answers countersign's question without the `requestState` it came with".into(),
            );
        };
        let opened = match confirm::open(state) {
            Ok(o) => o,
            Err(e) => return refuse(ConfirmCode::Invalid, e.to_string()),
        };
        let p = match book.get(&opened.claims.proposal_id).await {
            Ok(Some(p)) => p,
            Ok(None) => {
                return refuse(
                    ConfirmCode::Invalid,
                    format!(
                        "the requestState names proposal `{}`, which this gateway does not know",
                        opened.claims.proposal_id
                    ),
                )
            }
            Err(e) => return Replied::Store(e),
        };
        let keys: Vec<_> = p
            .asked_by
            .iter()
            .filter_map(|k| crate::core::reviewers::parse_public_key(k).ok())
            .collect();
        // Nothing in the state is trusted before this: it passed through
        // the client, so it is attacker input.
        if let Err(e) = opened.verify(&keys) {
            return refuse(ConfirmCode::Invalid, e.to_string());
        }
        let claims = opened.claims;
        let want = self.claims(s, &p.id, claims.expires_ms, claims.nonce.clone());
        // Issued for another call, principal, tenant, key or definition:
        // a yes for one call never runs another.
        if let Some((field, got, want)) = confirm::mismatch(&claims, &want) {
            return refuse(
                ConfirmCode::Mismatch,
                format!("it was issued for {field} `{got}`, and this call has `{want}`"),
            );
        }
        let ours = p
            .confirmation
            .as_ref()
            .is_some_and(|c| c.nonce == claims.nonce);
        // Used up: its yes ran the call once. Checked before the expiry, so
        // that a replay is named as one whenever it comes.
        if ours && p.state == ProposalState::Consumed {
            return refuse(
                ConfirmCode::Used,
                format!(
                    "its answer was already used: proposal {} ran this call once",
                    p.id
                ),
            );
        }
        if now_ms > claims.expires_ms {
            return refuse(
                ConfirmCode::Expired,
                format!("it expired at {}", rfc3339(claims.expires_ms)),
            );
        }
        let Some(response) = &reply.response else {
            // Sent back without an answer: the gate asks again.
            return Replied::Continue;
        };
        let answer = match confirm::read_answer(response) {
            Ok(a) => a,
            Err(e) => {
                return Replied::Invalid(format!(
                    "`params.inputResponses[\"{}\"]`: {e}",
                    confirm::INPUT_KEY
                ))
            }
        };
        let Some(decision) = verdict(&answer) else {
            // Dismissed: no decision; the proposal waits for reviewers.
            return Replied::Stop(Outcome::Approval(crate::core::review::pending(&p)));
        };
        if ours {
            // The same answer again before its yes was used (the first retry
            // did not get through): the gate uses it.
            return Replied::Continue;
        }
        let c = Confirmation {
            channel: "client".into(),
            principal: s.identity.principal.clone(),
            decision,
            reason: reason(&answer),
            at: rfc3339(now_ms),
            via: "input_required".into(),
            nonce: claims.nonce,
        };
        if p.state != ProposalState::Pending {
            let why = if p.decision.is_some() || p.confirmation.is_some() {
                format!(
                    "{} answered first (the proposal is {})",
                    answered_by(&p),
                    p.state.as_str()
                )
            } else {
                format!("the proposal is {}", p.state.as_str())
            };
            book.too_late(&p, &c, &why);
            return Replied::Continue;
        }
        match apply(book, &p, c).await {
            Ok(()) => Replied::Continue,
            Err(e) => Replied::Store(e),
        }
    }
}
