//! The approval rules (DESIGN.md sections 7, 14 and 20) as pure functions
//! over proposals: what a held call finds among its requester's proposals,
//! what a reviewer's decision, a withdrawal or an answer in the client
//! makes of a proposal, when a quorum is met or has lapsed, and when an
//! approval still holds. Nothing here reads a clock or a store:
//! `enforce::book` reads the proposals, asks these rules, and writes what
//! they return (each write a compare-and-set on the proposal's revision).

use crate::core::approval::{Confirmation, Given, Missing, Proposal, ProposalState, Quorum};
use crate::core::approval::{Statement, Verdict};
use crate::core::refusal::{ApprovalCode, ApprovalNote};
use crate::core::reviewers::{Reviewer, Reviewers};
use crate::core::time::{parse_rfc3339, rfc3339};

/// A held call as the rules see it.
#[derive(Debug, Clone, Copy)]
pub struct HeldCall<'a> {
    /// The requester's tenant.
    pub tenant: &'a str,
    /// The requester.
    pub requester: &'a str,
    /// The server.
    pub server: &'a str,
    /// The call's canonical digest.
    pub digest: &'a str,
    /// The call's ledger key.
    pub key: &'a str,
    /// The resource version now, if any.
    pub resource_version: Option<&'a str>,
    /// The tool's definition digest now.
    pub tool_definition: Option<&'a str>,
    /// What the policies in force ask of reviewers.
    pub quorum: &'a Quorum,
}

/// What a held call does next, given its requester's proposals.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// The requester has `approvals.max_pending` proposals waiting: no new
    /// one is made, and the call does not run.
    Flooded(ApprovalNote),
    /// No proposal of this call is in play: make one and wait on it.
    Create,
    /// The approval expired unused: write `expired` over it (from
    /// `approved`, as `was`), then make a fresh proposal and refuse the
    /// call as expired.
    ExpireThenRefresh {
        /// The approval as found.
        was: Proposal,
        /// The approval expired.
        expired: Proposal,
    },
    /// Void `old` for `reason` and make a fresh proposal; refuse the call
    /// with `code` (naming the fresh one), or (`None`) wait on it.
    Replace {
        /// The proposal to void.
        old: Proposal,
        /// Why.
        reason: String,
        /// The refusal, if the call is refused rather than held.
        code: Option<ApprovalCode>,
    },
    /// The policies now ask another quorum of an approved proposal: write
    /// `next` (from `approved`, as `was`); usable if it is still approved,
    /// else wait.
    Requorum {
        /// The approval as found.
        was: Proposal,
        /// The approval under the new quorum.
        next: Proposal,
    },
    /// An approval the call may consume.
    Usable(Proposal),
    /// A quorum whose first approval expired before it was met: write
    /// `expired` (from `pending`, as `was`), make a fresh proposal, refuse
    /// as expired.
    Lapsed {
        /// The proposal as found.
        was: Proposal,
        /// The proposal expired.
        expired: Proposal,
    },
    /// Join the pending proposal: write `joined` (from `pending`, as
    /// `was`); usable if the join met the quorum, else wait.
    Join {
        /// The proposal as found.
        was: Proposal,
        /// The proposal joined.
        joined: Proposal,
    },
    /// Refused, with nothing to write (denied).
    Refuse(ApprovalNote),
    /// An approval that expired unused (found by the sweep): make a fresh
    /// proposal and refuse the call as expired, once.
    Refresh,
}

/// What a held call does, given `mine` (every proposal of its requester),
/// the reviewers file in force, the time and `approvals.max_pending`.
pub fn step(
    mine: &[Proposal],
    call: &HeldCall<'_>,
    reviewers: &Reviewers,
    now: i64,
    max_pending: usize,
) -> Step {
    // The newest proposal for this call. Within one millisecond (a
    // proposal invalidated and its replacement made at once), one still in
    // play wins over a void one, whatever their random ids say.
    let live =
        |p: &Proposal| !matches!(p.state, ProposalState::Invalidated | ProposalState::Expired);
    let latest = mine
        .iter()
        .filter(|p| p.same_call(call.tenant, call.requester, call.server, call.digest))
        .max_by(|a, b| {
            a.created_ms
                .cmp(&b.created_ms)
                .then(live(a).cmp(&live(b)))
                .then(a.id.cmp(&b.id))
        });
    // Flooding: a requester with `approvals.max_pending` proposals waiting
    // gets no new one (reviewers' queues stay readable, the store stays
    // bounded); calls that join or use an existing proposal are unaffected.
    let continues = latest.is_some_and(|p| {
        matches!(
            p.state,
            ProposalState::Pending | ProposalState::Approved | ProposalState::Denied
        ) || p.consumed_by.as_deref() == Some(call.key)
    });
    let waiting = mine
        .iter()
        .filter(|p| p.state == ProposalState::Pending)
        .count();
    if !continues && waiting >= max_pending {
        return Step::Flooded(ApprovalNote {
            code: ApprovalCode::Pending,
            proposal_id: None,
            revises: None,
            reason: Some(format!(
                "{waiting} of your proposals are already waiting for reviewers (approvals.max_pending); \
                 no new one was made"
            )),
            by_client: false,
        });
    }
    let Some(p) = latest.cloned() else {
        return Step::Create;
    };
    match p.state {
        ProposalState::Approved => approved(p, call, reviewers, now),
        // A retry of the key that consumed it (its first attempt was proven
        // not sent): the same consumption, not a second one.
        ProposalState::Consumed if p.consumed_by.as_deref() == Some(call.key) => Step::Usable(p),
        ProposalState::Pending => match lapsed(&p, now) {
            Some(expired) => Step::Lapsed { was: p, expired },
            None if p.resource_version.as_deref() == call.resource_version
                && p.tool_definition.as_deref() == call.tool_definition =>
            {
                Step::Join {
                    joined: joined(p.clone(), call.quorum, reviewers, now),
                    was: p,
                }
            }
            None => Step::Replace {
                old: p,
                reason: "superseded: the resource version or the tool's definition changed while pending".into(),
                code: None,
            },
        },
        ProposalState::Denied => {
            let reason = match (&p.confirmation, &p.decision) {
                (Some(c), _) => Some(c.reason.clone()).filter(|r| !r.is_empty()),
                (None, Some(d)) => Some(d.statement.reason.clone()),
                (None, None) => None,
            };
            let mut n = note(ApprovalCode::Denied, &p, reason);
            n.by_client = p.confirmation.is_some();
            Step::Refuse(n)
        }
        // An approval that expired unused (found by the sweep): said once,
        // with the fresh proposal that replaces it.
        ProposalState::Expired if p.decision.is_some() => Step::Refresh,
        // Consumed by another key, expired while pending, invalidated:
        // this call needs a new yes.
        _ => Step::Create,
    }
}

/// An approved proposal found by a held call: revalidated before it is
/// offered (expiry, resource version, tool definition, reviewers, quorum).
fn approved(p: Proposal, call: &HeldCall<'_>, reviewers: &Reviewers, now: i64) -> Step {
    if p.expires_ms.is_none_or(|e| e <= now) {
        let mut expired = p.clone();
        expired.state = ProposalState::Expired;
        expired.reason = Some("approved, but not used before its expiry".into());
        expired.updated_ms = now;
        return Step::ExpireThenRefresh { was: p, expired };
    }
    if p.resource_version.as_deref() != call.resource_version {
        let reason = format!(
            "the resource version changed from `{}` to `{}` after the approval",
            p.resource_version.as_deref().unwrap_or("none"),
            call.resource_version.unwrap_or("none")
        );
        return Step::Replace {
            old: p,
            reason,
            code: Some(ApprovalCode::Stale),
        };
    }
    if p.tool_definition.as_deref() != call.tool_definition {
        // A yes given for one definition of a tool never runs it under
        // another: the server may have changed what the tool does since
        // the reviewer looked.
        let reason = format!(
            "the tool's definition changed from `{}` to `{}` after the approval",
            p.tool_definition.as_deref().unwrap_or("none"),
            call.tool_definition.unwrap_or("none")
        );
        return Step::Replace {
            old: p,
            reason,
            code: None,
        };
    }
    if !still_valid(&p, reviewers) {
        return Step::Replace {
            old: p,
            reason: "the approving reviewer is no longer registered with that key".into(),
            code: None,
        };
    }
    // The policies in force now may ask for more reviewers than approved
    // it: then it waits for them again, with the approvals it has.
    if p.quorum != *call.quorum && p.confirmation.is_none() {
        let mut next = p.clone();
        next.quorum = call.quorum.clone();
        next.updated_ms = now;
        if quorum_missing(&next, reviewers).is_some() {
            next.state = ProposalState::Pending;
            next.expires_ms = None;
            next.decision = None;
        }
        return Step::Requorum { was: p, next };
    }
    Step::Usable(p)
}

/// `p` joined by one more identical call, under the quorum the policies
/// ask for now: approvals already gathered may meet a smaller one.
fn joined(p: Proposal, quorum: &Quorum, reviewers: &Reviewers, now: i64) -> Proposal {
    let mut joined = p;
    joined.joined = joined.joined.saturating_add(1);
    joined.updated_ms = now;
    joined.quorum = quorum.clone();
    if !joined.approvals.is_empty() && quorum_missing(&joined, reviewers).is_none() {
        joined.state = ProposalState::Approved;
        joined.expires_ms = joined.earliest_expiry();
        joined.decision = joined.approvals.last().map(|g| g.signed.clone());
    }
    joined
}

/// What `p`'s approvals still lack under `reviewers` in force: an approval
/// counts while its reviewer is registered with the key that signed it and
/// covers the tenant, with the groups the file gives them now. `None`: the
/// quorum is met.
pub fn quorum_missing(p: &Proposal, reviewers: &Reviewers) -> Option<Missing> {
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

/// A pending proposal whose earliest approval expired before its quorum
/// was met, as it is once expired (a later approval cannot complete it;
/// a retry of the call makes a new proposal). `None`: it has not lapsed.
pub fn lapsed(p: &Proposal, now: i64) -> Option<Proposal> {
    if p.state != ProposalState::Pending || p.earliest_expiry().is_none_or(|e| e > now) {
        return None;
    }
    let mut next = p.clone();
    next.state = ProposalState::Expired;
    next.reason = Some(LAPSED.into());
    next.updated_ms = now;
    Some(next)
}

/// Why a lapsed quorum expired, in the proposal and the audit log.
pub const LAPSED: &str = "an approval expired before the quorum was reached";

/// An open proposal past its time, as it is once expired: an approval not
/// used before its expiry, or a proposal pending longer than
/// `pending_ttl_ms`. `None`: still in time.
pub fn overdue(p: &Proposal, now: i64, pending_ttl_ms: i64) -> Option<Proposal> {
    let (over, reason) = match p.state {
        ProposalState::Approved => (
            p.expires_ms.is_none_or(|e| e <= now),
            "approved, but not used before its expiry",
        ),
        ProposalState::Pending => (
            now - p.created_ms > pending_ttl_ms,
            "nobody decided it in time",
        ),
        _ => (false, ""),
    };
    over.then(|| {
        let mut next = p.clone();
        next.state = ProposalState::Expired;
        next.reason = Some(reason.into());
        next.updated_ms = now;
        next
    })
}

/// Revalidation: the reviewer who approved is still in `reviewers.toml`,
/// with the key that signed. Removing a reviewer voids their unused yeses.
/// A yes from the client is the requester's own: it stays valid (the
/// `confirm` policy is asked again at execution start).
pub fn still_valid(p: &Proposal, reviewers: &Reviewers) -> bool {
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

/// Why the rules refuse a reviewer's act or a client's answer. Nothing
/// was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Someone answered it first.
    TooLate {
        /// Proposal.
        id: String,
        /// Its state.
        state: &'static str,
        /// Who answered it.
        by: String,
    },
    /// Not pending (consumed, expired, invalidated).
    NotPending {
        /// Proposal.
        id: String,
        /// Its state.
        state: &'static str,
    },
    /// The statement, its times or the act itself is not acceptable.
    Refused(String),
    /// The policies or the rules do not let this person do it.
    Forbidden(String),
}

/// The refusal for a proposal that is no longer pending: too late when
/// someone answered it, else not pending.
pub fn not_pending(p: &Proposal) -> Refusal {
    if p.confirmation.is_some() || p.decision.is_some() {
        Refusal::TooLate {
            id: p.id.clone(),
            state: p.state.as_str(),
            by: answered_by(p),
        }
    } else {
        Refusal::NotPending {
            id: p.id.clone(),
            state: p.state.as_str(),
        }
    }
}

/// Who answered `p`, in words.
pub fn answered_by(p: &Proposal) -> String {
    match (&p.confirmation, &p.decision) {
        (Some(c), _) => format!("the person at the client ({})", c.principal),
        (None, Some(d)) => format!("reviewer {}", d.statement.reviewer),
        (None, None) => "the gateway".into(),
    }
}

/// The times of a reviewer's statement, judged at `now`: issued within
/// `skew_ms` of the gateway's clock, an approval not already past (its
/// expiry capped at `ttl_ms` after signing, never extended), a denial with
/// a reason. Returns the expiry the decision holds until.
pub fn timely(statement: &Statement, now: i64, skew_ms: i64, ttl_ms: i64) -> Result<i64, Refusal> {
    let issued = parse_rfc3339(&statement.issued_at).ok_or_else(|| {
        Refusal::Refused(format!(
            "`issued_at` `{}` is not RFC 3339",
            statement.issued_at
        ))
    })?;
    if (issued - now).abs() > skew_ms {
        return Err(Refusal::Refused(format!(
            "`issued_at` {} is too far from the gateway's clock ({}): check the reviewer's clock",
            statement.issued_at,
            rfc3339(now)
        )));
    }
    let expires = parse_rfc3339(&statement.expires_at).ok_or_else(|| {
        Refusal::Refused(format!(
            "`expires_at` `{}` is not RFC 3339",
            statement.expires_at
        ))
    })?;
    match statement.decision {
        Verdict::Approve if expires <= now => {
            return Err(Refusal::Refused(format!(
                "`expires_at` {} is already past",
                statement.expires_at
            )))
        }
        Verdict::Deny if statement.reason.trim().is_empty() => {
            return Err(Refusal::Refused(
                "a denial needs a reason (`--reason TEXT`): the agent and the audit log get it"
                    .into(),
            ))
        }
        _ => {}
    }
    Ok(expires.min(issued.saturating_add(ttl_ms)))
}

/// `p` with `reviewer`'s decision `given` (its statement's digest
/// `digest`) counted: approved once the approvals meet the quorum under
/// `reviewers`, denied once the denials do. A reviewer counts once,
/// whatever key or gateway they use; an approval withdrawn is never
/// accepted again; the requester never counts; `may_approve` is the
/// policies' word on this reviewer approving this call.
pub fn decided(
    p: &Proposal,
    given: &Given,
    digest: &str,
    reviewer: &Reviewer,
    reviewers: &Reviewers,
    now: i64,
    may_approve: impl Fn(&Proposal) -> Result<(), String>,
) -> Result<Proposal, Refusal> {
    let id = &p.id;
    if p.state != ProposalState::Pending {
        return Err(not_pending(p));
    }
    if p.withdrawn.iter().any(|w| w == digest) {
        return Err(Refusal::Refused(format!(
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
        return Err(Refusal::Refused(format!(
            "reviewer `{}` already {did} proposal `{id}`: a reviewer counts once, whichever key or gateway they use{}",
            reviewer.name,
            if did == "approved" { " (`countersign withdraw` takes an approval back while the quorum is not met)" } else { "" }
        )));
    }
    let mut next = p.clone();
    next.updated_ms = now;
    match given.signed.statement.decision {
        Verdict::Approve => {
            may_approve(p).map_err(Refusal::Forbidden)?;
            // The requester never counts, whatever the policies say: a
            // quorum is other people's eyes on the call.
            if reviewer.is_requester(&p.requester, &p.requester_aka) {
                return Err(Refusal::Forbidden(format!(
                    "reviewer `{}` asked for this call (as `{}`): nobody approves their own call",
                    reviewer.name, p.requester
                )));
            }
            next.approvals.push(given.clone());
            if quorum_missing(&next, reviewers).is_none() {
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
    Ok(next)
}

/// `p` with `reviewer`'s approval taken back (DESIGN.md section 20), and
/// the approval taken: allowed while the proposal is pending (once the
/// quorum is met the approval is the call's). Its statement is remembered,
/// so that it is never accepted again.
pub fn withdrawn(p: &Proposal, reviewer: &str, now: i64) -> Result<(Proposal, Given), Refusal> {
    if p.state != ProposalState::Pending {
        return Err(not_pending(p));
    }
    let Some(at) = p.approvals.iter().position(|g| g.reviewer() == reviewer) else {
        return Err(Refusal::Refused(format!(
            "reviewer `{reviewer}` has no approval of proposal `{}` to withdraw",
            p.id
        )));
    };
    let mut next = p.clone();
    let gone = next.approvals.remove(at);
    if let Ok(d) = gone.signed.statement.digest() {
        next.withdrawn.push(d);
    }
    next.updated_ms = now;
    Ok((next, gone))
}

/// `p` answered by the person at the client (DESIGN.md section 14): only
/// the requester answers there, and only a proposal one reviewer would
/// decide (a yes in the client is the requester's own, never one of a
/// quorum's distinct reviewers). A yes holds for `ttl_ms`.
pub fn confirmed(
    p: &Proposal,
    c: &Confirmation,
    now: i64,
    ttl_ms: i64,
) -> Result<Proposal, Refusal> {
    let id = &p.id;
    if p.state != ProposalState::Pending {
        return Err(not_pending(p));
    }
    if !p.quorum.is_single() {
        return Err(Refusal::Refused(format!(
            "proposal `{id}` needs {} reviewers: a yes in the client is the requester's own and does not count towards them",
            p.quorum.needed()
        )));
    }
    // The question went to the requester's session or state; the answer
    // must come back the same way.
    if c.principal != p.requester {
        return Err(Refusal::Refused(format!(
            "proposal `{id}` is `{}`'s call; `{}` cannot answer it",
            p.requester, c.principal
        )));
    }
    let mut next = p.clone();
    next.updated_ms = now;
    match c.decision {
        Verdict::Approve => {
            next.state = ProposalState::Approved;
            next.expires_ms = Some(now.saturating_add(ttl_ms));
        }
        Verdict::Deny => next.state = ProposalState::Denied,
    }
    next.confirmation = Some(c.clone());
    Ok(next)
}

/// The answer to a call refused or held on `p`.
pub fn note(code: ApprovalCode, p: &Proposal, reason: Option<String>) -> ApprovalNote {
    ApprovalNote {
        code,
        proposal_id: Some(p.id.clone()),
        revises: p.revises.as_ref().map(|r| r.proposal_id.clone()),
        reason,
        by_client: false,
    }
}

/// The pending answer for a proposal.
pub fn pending(p: &Proposal) -> ApprovalNote {
    note(ApprovalCode::Pending, p, None)
}

/// The audit kind of a decision just made.
pub fn decided_kind(p: &Proposal) -> &'static str {
    if p.state == ProposalState::Approved {
        "approval_granted"
    } else {
        "approval_denied"
    }
}

#[cfg(test)]
mod tests;
