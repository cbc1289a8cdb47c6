//! Proposals: held calls waiting for reviewers, written by compare-and-set
//! on their revision.

use super::StoreFuture;
use crate::core::approval::{Proposal, ProposalState};
use crate::core::notify::Notice;

/// The proposals of held calls.
pub trait Proposals: Send + Sync {
    /// Write a proposal if its stored state is `expect` and its stored
    /// revision is the one before `proposal.revision` (`None`: only if
    /// there is none). Returns whether it did. A writer reads, changes and
    /// bumps the revision: of two writers that read the same revision, one
    /// wins and the other reads again, so concurrent partial approvals of
    /// one proposal are never lost. Durable before it returns when the new
    /// state is a reviewer's decision (`approved`, `denied`) or the proposal
    /// holds approvals: a signed human act is not lost to a crash.
    fn put_proposal(
        &self,
        proposal: Proposal,
        expect: Option<ProposalState>,
    ) -> StoreFuture<'_, bool> {
        self.put_proposal_with(proposal, expect, Vec::new())
    }

    /// [`Proposals::put_proposal`], and queue `notices` (the events it
    /// announces, DESIGN.md section 19) in the same commit: the proposal
    /// and its notifications are written together or not at all.
    fn put_proposal_with(
        &self,
        proposal: Proposal,
        expect: Option<ProposalState>,
        notices: Vec<Notice>,
    ) -> StoreFuture<'_, bool>;

    /// A proposal by id.
    fn get_proposal<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Proposal>>;

    /// Every stored proposal.
    fn list_proposals(&self) -> StoreFuture<'_, Vec<Proposal>>;

    /// The proposals still open (pending or approved): what the sweep may
    /// expire. Read by an index on the stores that keep one, not by reading
    /// every proposal kept.
    fn open_proposals(&self) -> StoreFuture<'_, Vec<Proposal>> {
        Box::pin(async move {
            Ok(self
                .list_proposals()
                .await?
                .into_iter()
                .filter(|p| matches!(p.state, ProposalState::Pending | ProposalState::Approved))
                .collect())
        })
    }

    /// The proposals `requester` of `tenant` made (every state), read by an
    /// index on the stores that keep one: a held call looks at its own
    /// requester's proposals, never at every proposal in the store.
    fn proposals_of<'a>(
        &'a self,
        tenant: &'a str,
        requester: &'a str,
    ) -> StoreFuture<'a, Vec<Proposal>> {
        Box::pin(async move {
            Ok(self
                .list_proposals()
                .await?
                .into_iter()
                .filter(|p| p.tenant == tenant && p.requester == requester)
                .collect())
        })
    }

    /// Forget proposals in a final state (denied, consumed, expired,
    /// invalidated) last changed before `before_ms`.
    fn gc_proposals(&self, before_ms: i64) -> StoreFuture<'_, usize>;
}

/// Whether a proposal is in a final state that retention may forget.
pub(super) fn proposal_final(p: &Proposal) -> bool {
    !matches!(p.state, ProposalState::Pending | ProposalState::Approved)
}

/// Whether writing a proposal in this state must be on disk when it returns:
/// a decision, or a pending one that holds reviewers' signed approvals or
/// denials.
pub(super) fn proposal_durable(p: &Proposal) -> bool {
    matches!(p.state, ProposalState::Approved | ProposalState::Denied)
        || (p.state == ProposalState::Pending && (!p.approvals.is_empty() || !p.denials.is_empty()))
}

/// The compare of [`Proposals::put_proposal`]: `current` is the stored
/// proposal's (state, revision), if any.
pub(super) fn proposal_expected(
    current: Option<(ProposalState, u64)>,
    expect: Option<ProposalState>,
    next: &Proposal,
) -> bool {
    match (current, expect) {
        (None, None) => true,
        (Some((state, revision)), Some(want)) => {
            state == want && revision.wrapping_add(1) == next.revision
        }
        _ => false,
    }
}
