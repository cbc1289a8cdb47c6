//! How a new proposal stands to the requester's recent ones: the one it
//! revises, or another call shown beside it.

use super::{diff, Proposal, Revision};

impl Proposal {
    /// Set [`Proposal::revises`] or [`Proposal::beside`] from `mine`, the
    /// requester's proposals: those of the same tool made within
    /// `window_ms`, for other arguments. The newest under this call's own
    /// key is what it revises (the same call resent with changes: shown with
    /// the difference, so a drifted retry is not mistaken for a new
    /// request). Otherwise the newest is another call, shown beside it for
    /// comparison: calls with keys of their own are separate calls (four
    /// invoices are four invoices), never "changes". An agent may also say
    /// which proposal this call replaces (`link`, from
    /// `_meta["dev.countersign/revises"]`): it is the revision when it is
    /// one of the requester's own, of the same tool (an id of another
    /// requester's, or of another tool, is not followed, and the call is
    /// related as if no link were given).
    pub fn relate(&mut self, mine: &[Proposal], window_ms: i64, link: Option<&str>) {
        let linked = link.and_then(|id| {
            mine.iter()
                .find(|p| {
                    p.id == id
                        && p.server == self.server
                        && p.tool == self.tool
                        && p.call_digest != self.call_digest
                })
                .map(|p| Revision {
                    proposal_id: p.id.clone(),
                    changes: diff(&p.arguments, &self.arguments),
                })
        });
        if linked.is_some() {
            (self.revises, self.beside) = (linked, None);
            return;
        }
        let recent = |same_key: bool| {
            mine.iter()
                .filter(|p| {
                    p.server == self.server
                        && p.tool == self.tool
                        && p.call_digest != self.call_digest
                        && self.created_ms - p.created_ms <= window_ms
                        && (p.call_key.is_some() && p.call_key == self.call_key) == same_key
                })
                .max_by(|a, b| a.created_ms.cmp(&b.created_ms).then(a.id.cmp(&b.id)))
                .map(|p| Revision {
                    proposal_id: p.id.clone(),
                    changes: diff(&p.arguments, &self.arguments),
                })
        };
        let revises = recent(true);
        let beside = match revises {
            Some(_) => None,
            None => recent(false),
        };
        (self.revises, self.beside) = (revises, beside);
    }
}
