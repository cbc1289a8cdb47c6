//! Proposals on redb: the `proposals` table by id, its index by requester
//! (`proposals_by_requester`), so that a held call reads its own
//! requester's proposals and never the whole table, and the ids of the
//! proposals still open (`open_proposals`: pending or approved), which the
//! sweep reads instead of every proposal kept. The by-requester index
//! changes only when a proposal is made or forgotten (a proposal's tenant
//! and requester never change); the open one with a proposal's state; both
//! in the same transaction as the table.

use redb::{ReadableTable, TableDefinition, TableHandle};

use super::{blocking, decode_proposal, encode_proposal, err, Op, RedbStore, Table, PROPOSALS};
use crate::core::approval::{Proposal, ProposalState};
use crate::core::notify::Notice;
use crate::store::{proposal_final, Proposals, StoreError, StoreFuture};

/// The index: `LEN:TENANT` `LEN:REQUESTER` `ID` (each name after its length,
/// so that no tenant and requester make another pair's prefix).
pub(super) const BY_REQUESTER: TableDefinition<&str, ()> =
    TableDefinition::new("proposals_by_requester");

/// The ids of the proposals pending or approved.
pub(super) const OPEN: TableDefinition<&str, ()> = TableDefinition::new("open_proposals");

pub(super) type Index<'t> = redb::Table<'t, &'static str, ()>;

/// Whether `p` is still open (the sweep may expire it).
fn open(p: &Proposal) -> bool {
    matches!(p.state, ProposalState::Pending | ProposalState::Approved)
}

/// The index's prefix of one requester's proposals.
pub(super) fn prefix(tenant: &str, requester: &str) -> String {
    let mut digits = itoa::Buffer::new();
    let mut out = String::with_capacity(tenant.len() + requester.len() + 8);
    out.push_str(digits.format(tenant.len()));
    out.push(':');
    out.push_str(tenant);
    out.push_str(digits.format(requester.len()));
    out.push(':');
    out.push_str(requester);
    out
}

fn index_key(p: &Proposal) -> String {
    let mut k = prefix(&p.tenant, &p.requester);
    k.push_str(&p.id);
    k
}

/// Write `p` when the stored one is as `expect`ed (see
/// [`crate::store::Proposals::put_proposal_with`]); a new one enters the index.
pub(super) fn put(
    proposals: &mut Table<'_>,
    index: &mut Index<'_>,
    open_ids: &mut Index<'_>,
    p: &Proposal,
    expect: Option<ProposalState>,
) -> Result<bool, StoreError> {
    let current = match proposals
        .get(p.id.as_str())
        .map_err(|e| err("read")(e.into()))?
    {
        Some(v) => {
            let stored = decode_proposal(v.value())?;
            Some((stored.state, stored.revision))
        }
        None => None,
    };
    if !crate::store::proposal_expected(current, expect, p) {
        return Ok(false);
    }
    proposals
        .insert(p.id.as_str(), encode_proposal(p)?.as_slice())
        .map_err(|e| err("write")(e.into()))?;
    if current.is_none() {
        index
            .insert(index_key(p).as_str(), ())
            .map_err(|e| err("write")(e.into()))?;
    }
    let was_open =
        current.is_some_and(|(s, _)| matches!(s, ProposalState::Pending | ProposalState::Approved));
    match (was_open, open(p)) {
        (false, true) => {
            open_ids
                .insert(p.id.as_str(), ())
                .map_err(|e| err("write")(e.into()))?;
        }
        (true, false) => {
            open_ids
                .remove(p.id.as_str())
                .map_err(|e| err("write")(e.into()))?;
        }
        _ => {}
    }
    Ok(true)
}

/// Forget the final proposals last changed before `before_ms`, from the
/// table and the index.
pub(super) fn gc(
    proposals: &mut Table<'_>,
    index: &mut Index<'_>,
    open_ids: &mut Index<'_>,
    before_ms: i64,
) -> Result<usize, StoreError> {
    let mut stale = Vec::new();
    for entry in proposals.iter().map_err(|e| err("scan")(e.into()))? {
        let (_, v) = entry.map_err(|e| err("scan")(e.into()))?;
        let p = decode_proposal(v.value())?;
        if proposal_final(&p) && p.updated_ms < before_ms {
            stale.push((p.id.clone(), index_key(&p)));
        }
    }
    for (id, key) in &stale {
        proposals
            .remove(id.as_str())
            .map_err(|e| err("delete")(e.into()))?;
        index
            .remove(key.as_str())
            .map_err(|e| err("delete")(e.into()))?;
        // Final proposals are not open; removed all the same, whatever an
        // earlier writer left.
        open_ids
            .remove(id.as_str())
            .map_err(|e| err("delete")(e.into()))?;
    }
    Ok(stale.len())
}

/// The proposals of `requester` in `tenant`, by the index.
pub(super) fn of(
    db: &redb::Database,
    tenant: &str,
    requester: &str,
) -> Result<Vec<Proposal>, StoreError> {
    let txn = db.begin_read().map_err(|e| err("begin read")(e.into()))?;
    let index = txn
        .open_table(BY_REQUESTER)
        .map_err(|e| err("open table")(e.into()))?;
    let proposals = txn
        .open_table(PROPOSALS)
        .map_err(|e| err("open table")(e.into()))?;
    let from = prefix(tenant, requester);
    let mut out = Vec::new();
    for entry in index
        .range(from.as_str()..)
        .map_err(|e| err("scan")(e.into()))?
    {
        let (k, _) = entry.map_err(|e| err("scan")(e.into()))?;
        let Some(id) = k.value().strip_prefix(from.as_str()) else {
            break;
        };
        // An index entry without its proposal (never written so) is passed
        // over: the table is what holds proposals.
        if let Some(v) = proposals.get(id).map_err(|e| err("read")(e.into()))? {
            out.push(decode_proposal(v.value())?);
        }
    }
    Ok(out)
}

/// The proposals still open (pending or approved), by their index.
pub(super) fn open_ones(db: &redb::Database) -> Result<Vec<Proposal>, StoreError> {
    let txn = db.begin_read().map_err(|e| err("begin read")(e.into()))?;
    let ids = txn
        .open_table(OPEN)
        .map_err(|e| err("open table")(e.into()))?;
    let proposals = txn
        .open_table(PROPOSALS)
        .map_err(|e| err("open table")(e.into()))?;
    let mut out = Vec::new();
    for entry in ids.iter().map_err(|e| err("scan")(e.into()))? {
        let (id, _) = entry.map_err(|e| err("scan")(e.into()))?;
        if let Some(v) = proposals
            .get(id.value())
            .map_err(|e| err("read")(e.into()))?
        {
            out.push(decode_proposal(v.value())?);
        }
    }
    Ok(out)
}

/// Build the indexes a ledger made before them lacks (once, at open, in the
/// opening transaction).
pub(super) fn index_at_open(txn: &redb::WriteTransaction) -> Result<(), StoreError> {
    let have: Vec<String> = txn
        .list_tables()
        .map_err(|e| err("list tables")(e.into()))?
        .map(|t| t.name().to_owned())
        .collect();
    let has = |def: &TableDefinition<&str, ()>| have.iter().any(|n| n == def.name());
    let (by_requester, open_ids) = (!has(&BY_REQUESTER), !has(&OPEN));
    let mut index = txn
        .open_table(BY_REQUESTER)
        .map_err(|e| err("create table")(e.into()))?;
    let mut opened = txn
        .open_table(OPEN)
        .map_err(|e| err("create table")(e.into()))?;
    if !by_requester && !open_ids {
        return Ok(());
    }
    let proposals = txn
        .open_table(PROPOSALS)
        .map_err(|e| err("open table")(e.into()))?;
    for entry in proposals.iter().map_err(|e| err("scan")(e.into()))? {
        let (_, v) = entry.map_err(|e| err("scan")(e.into()))?;
        let p = decode_proposal(v.value())?;
        if by_requester {
            index
                .insert(index_key(&p).as_str(), ())
                .map_err(|e| err("write")(e.into()))?;
        }
        if open_ids && open(&p) {
            opened
                .insert(p.id.as_str(), ())
                .map_err(|e| err("write")(e.into()))?;
        }
    }
    Ok(())
}

impl Proposals for RedbStore {
    fn put_proposal_with(
        &self,
        proposal: Proposal,
        expect: Option<ProposalState>,
        notices: Vec<Notice>,
    ) -> StoreFuture<'_, bool> {
        self.submit(|reply| Op::PutProposal {
            proposal: Box::new(proposal),
            expect,
            notices,
            reply,
        })
    }

    fn get_proposal<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Proposal>> {
        Box::pin(async move {
            match self
                .read(PROPOSALS)?
                .get(id)
                .map_err(|e| err("read")(e.into()))?
            {
                Some(v) => decode_proposal(v.value()).map(Some),
                None => Ok(None),
            }
        })
    }

    fn list_proposals<'a>(&'a self) -> StoreFuture<'a, Vec<Proposal>> {
        Box::pin(async move {
            let table = self.read(PROPOSALS)?;
            let mut out = Vec::new();
            for entry in table.iter().map_err(|e| err("scan")(e.into()))? {
                let (_, v) = entry.map_err(|e| err("scan")(e.into()))?;
                out.push(decode_proposal(v.value())?);
            }
            Ok(out)
        })
    }

    fn gc_proposals(&self, before_ms: i64) -> StoreFuture<'_, usize> {
        self.submit(|reply| Op::GcProposals { before_ms, reply })
    }

    fn proposals_of<'a>(
        &'a self,
        tenant: &'a str,
        requester: &'a str,
    ) -> StoreFuture<'a, Vec<Proposal>> {
        Box::pin(async move { of(&self.db, tenant, requester) })
    }

    fn open_proposals(&self) -> StoreFuture<'_, Vec<Proposal>> {
        let db = self.db.clone();
        Box::pin(blocking(move || open_ones(&db)))
    }
}
