//! Proposals on PostgreSQL: compare-and-set writes, and the reads by requester and of the open ones by their indexes.

use super::*;

impl Proposals for PgStore {
    fn put_proposal_with(
        &self,
        proposal: Proposal,
        expect: Option<ProposalState>,
        notices: Vec<Notice>,
    ) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            let mut client = self.client().await?;
            let txn = client.transaction().await.map_err(backend("begin"))?;
            relaxed(&txn, proposal_durable(&proposal) || !notices.is_empty()).await?;
            let text = encode("proposal", &proposal)?;
            let state = proposal.state.as_str();
            let rev = revision(&proposal)?;
            let n = match expect {
                None => txn
                    .execute(
                        "INSERT INTO proposals (id, state, updated_ms, proposal, revision, tenant, requester)
                         VALUES ($1, $2, $3, $4, $5, $6, $7)
                         ON CONFLICT (id) DO NOTHING",
                        &[
                            &proposal.id,
                            &state,
                            &proposal.updated_ms,
                            &text,
                            &rev,
                            &proposal.tenant,
                            &proposal.requester,
                        ],
                    )
                    .await
                    .map_err(backend("write a proposal"))?,
                // Compare and set on the state and the revision it was read at.
                Some(from) => txn
                    .execute(
                        "UPDATE proposals SET state = $2, updated_ms = $3, proposal = $4, revision = $5
                         WHERE id = $1 AND state = $6 AND revision = $7",
                        &[
                            &proposal.id,
                            &state,
                            &proposal.updated_ms,
                            &text,
                            &rev,
                            &from.as_str(),
                            &rev.wrapping_sub(1),
                        ],
                    )
                    .await
                    .map_err(backend("write a proposal"))?,
            };
            if n == 1 {
                notify(&txn, PROPOSALS_CHANNEL, &proposal.id).await?;
                // INVARIANT: a notification commits with the proposal
                // change it announces, or not at all.
                insert_notices(&txn, &notices).await?;
            }
            txn.commit().await.map_err(backend("commit"))?;
            Ok(n == 1)
        })
    }

    fn get_proposal<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Proposal>> {
        Box::pin(async move {
            let client = self.client().await?;
            let row = client
                .query_opt("SELECT proposal FROM proposals WHERE id = $1", &[&id])
                .await
                .map_err(backend("read a proposal"))?;
            row.map(|r| decode("proposal", r.get::<_, &str>(0)))
                .transpose()
        })
    }

    fn list_proposals(&self) -> StoreFuture<'_, Vec<Proposal>> {
        Box::pin(async move {
            let client = self.client().await?;
            let rows = client
                .query("SELECT proposal FROM proposals", &[])
                .await
                .map_err(backend("list proposals"))?;
            rows.iter()
                .map(|r| decode("proposal", r.get::<_, &str>(0)))
                .collect()
        })
    }

    fn open_proposals(&self) -> StoreFuture<'_, Vec<Proposal>> {
        Box::pin(async move {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT proposal FROM proposals WHERE state IN ('pending', 'approved')",
                    &[],
                )
                .await
                .map_err(backend("list open proposals"))?;
            rows.iter()
                .map(|r| decode("proposal", r.get::<_, &str>(0)))
                .collect()
        })
    }

    fn proposals_of<'a>(
        &'a self,
        tenant: &'a str,
        requester: &'a str,
    ) -> StoreFuture<'a, Vec<Proposal>> {
        Box::pin(async move {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT proposal FROM proposals WHERE tenant = $1 AND requester = $2",
                    &[&tenant, &requester],
                )
                .await
                .map_err(backend("list a requester's proposals"))?;
            rows.iter()
                .map(|r| decode("proposal", r.get::<_, &str>(0)))
                .collect()
        })
    }

    fn gc_proposals(&self, before_ms: i64) -> StoreFuture<'_, usize> {
        Box::pin(async move {
            // Which states are final is the store's rule (`proposal_final`),
            // decided here on the decoded proposals, not in SQL.
            let mut client = self.client().await?;
            let txn = client.transaction().await.map_err(backend("begin"))?;
            relaxed(&txn, false).await?;
            let rows = txn
                .query(
                    "SELECT id, proposal FROM proposals WHERE updated_ms < $1 FOR UPDATE",
                    &[&before_ms],
                )
                .await
                .map_err(backend("list proposals"))?;
            let mut gone = 0;
            for r in &rows {
                let p: Proposal = decode("proposal", r.get::<_, &str>(1))?;
                if proposal_final(&p) {
                    gone += txn
                        .execute(
                            "DELETE FROM proposals WHERE id = $1",
                            &[&r.get::<_, &str>(0)],
                        )
                        .await
                        .map_err(backend("forget a proposal"))?;
                }
            }
            txn.commit().await.map_err(backend("commit"))?;
            Ok(usize::try_from(gone).unwrap_or(usize::MAX))
        })
    }
}
