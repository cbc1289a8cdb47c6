//! Proposals on redb: the `proposals` table by id, and its index by
//! requester (`proposals_by_requester`), so that a held call reads its own
//! requester's proposals and never the whole table. The index changes only
//! when a proposal is made or forgotten (a proposal's tenant and requester
//! never change), in the same transaction as the table.

use redb::{ReadableTable, ReadableTableMetadata, TableDefinition};

use super::{decode_proposal, encode_proposal, err, Table, PROPOSALS};
use crate::core::approval::{Proposal, ProposalState};
use crate::store::{proposal_final, StoreError};

/// The index: `LEN:TENANT` `LEN:REQUESTER` `ID` (each name after its length,
/// so that no tenant and requester make another pair's prefix).
pub(super) const BY_REQUESTER: TableDefinition<&str, ()> =
    TableDefinition::new("proposals_by_requester");

pub(super) type Index<'t> = redb::Table<'t, &'static str, ()>;

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
/// [`crate::store::Store::put_proposal_with`]); a new one enters the index.
pub(super) fn put(
    proposals: &mut Table<'_>,
    index: &mut Index<'_>,
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
    Ok(true)
}

/// Forget the final proposals last changed before `before_ms`, from the
/// table and the index.
pub(super) fn gc(
    proposals: &mut Table<'_>,
    index: &mut Index<'_>,
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

/// Build the index when a ledger made before it has proposals and no index
/// (once, at open, in the opening transaction).
pub(super) fn index_at_open(txn: &redb::WriteTransaction) -> Result<(), StoreError> {
    let mut index = txn
        .open_table(BY_REQUESTER)
        .map_err(|e| err("create table")(e.into()))?;
    if !index.is_empty().map_err(|e| err("read")(e.into()))? {
        return Ok(());
    }
    let proposals = txn
        .open_table(PROPOSALS)
        .map_err(|e| err("open table")(e.into()))?;
    for entry in proposals.iter().map_err(|e| err("scan")(e.into()))? {
        let (_, v) = entry.map_err(|e| err("scan")(e.into()))?;
        let p = decode_proposal(v.value())?;
        index
            .insert(index_key(&p).as_str(), ())
            .map_err(|e| err("write")(e.into()))?;
    }
    Ok(())
}
