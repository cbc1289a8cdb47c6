//! The notification queue and the audit outbox on redb.

use std::collections::BTreeMap;

use redb::ReadableTable;

use super::apply::queue_txn;
use super::pending::outbox_rows;
use super::{blocking, decode_json, encode_notice, err, Op, RedbStore, NOTICES, NOTIFY};
use crate::core::notify::{Notice, WebhookStatus};
use crate::store::{Outbox, Settle, StoreError, StoreFuture};

impl Outbox for RedbStore {
    // The queue's own writes are rare (one per event and attempt): they
    // take redb's write lock on a blocking thread rather than the ledger
    // writer's batches. Enqueueing is durable; a claim's lease and a
    // settlement are not (lost to a crash, the notice is sent again, with
    // the same id).
    fn notices_enqueue(&self, notices: Vec<Notice>) -> StoreFuture<'_, ()> {
        let db = self.db.clone();
        Box::pin(blocking(move || {
            queue_txn(&db, true, |table, _| {
                for n in &notices {
                    table
                        .insert(n.key().as_str(), encode_notice(n)?.as_slice())
                        .map_err(|e| err("write")(e.into()))?;
                }
                Ok(())
            })
        }))
    }

    fn notices_claim(
        &self,
        owner: &str,
        now_ms: i64,
        lease_ms: i64,
        limit: usize,
    ) -> StoreFuture<'_, Vec<Notice>> {
        let db = self.db.clone();
        let owner = owner.to_owned();
        Box::pin(blocking(move || {
            queue_txn(&db, false, |table, _| {
                let mut all = std::collections::BTreeMap::new();
                for entry in table.iter().map_err(|e| err("scan")(e.into()))? {
                    let (k, v) = entry.map_err(|e| err("scan")(e.into()))?;
                    let n: Notice = decode_json("notice", v.value())?;
                    all.insert(k.value().to_owned(), n);
                }
                let mut out = Vec::new();
                for key in crate::store::due(&all, now_ms, limit) {
                    if let Some(mut n) = all.remove(&key) {
                        n.lease = Some((owner.clone(), now_ms.saturating_add(lease_ms)));
                        table
                            .insert(key.as_str(), encode_notice(&n)?.as_slice())
                            .map_err(|e| err("write")(e.into()))?;
                        out.push(n);
                    }
                }
                Ok(out)
            })
        }))
    }

    fn notice_settle(&self, notice: Notice, outcome: Settle) -> StoreFuture<'_, ()> {
        let db = self.db.clone();
        Box::pin(blocking(move || {
            queue_txn(&db, false, |table, status| {
                let name = notice.webhook.clone();
                let key = notice.key();
                let mut st: WebhookStatus = match status
                    .get(name.as_str())
                    .map_err(|e| err("read")(e.into()))?
                {
                    Some(v) => decode_json("webhook status", v.value())?,
                    None => WebhookStatus::default(),
                };
                match crate::store::settled(notice, &outcome, &mut st) {
                    Some(n) => {
                        table
                            .insert(key.as_str(), encode_notice(&n)?.as_slice())
                            .map_err(|e| err("write")(e.into()))?;
                    }
                    None => {
                        table
                            .remove(key.as_str())
                            .map_err(|e| err("write")(e.into()))?;
                    }
                }
                let bytes = serde_json::to_vec(&st).map_err(|e| StoreError::Encode {
                    what: "webhook status",
                    reason: e.to_string(),
                    cause: Some(crate::store::Cause::new(e)),
                })?;
                status
                    .insert(name.as_str(), bytes.as_slice())
                    .map_err(|e| err("write")(e.into()))?;
                Ok(())
            })
        }))
    }

    fn notify_status(&self) -> StoreFuture<'_, (BTreeMap<String, WebhookStatus>, usize)> {
        Box::pin(async move {
            let notices = self.read(NOTICES)?;
            let mut waiting = 0;
            for entry in notices.iter().map_err(|e| err("scan")(e.into()))? {
                let (_, v) = entry.map_err(|e| err("scan")(e.into()))?;
                let n: Notice = decode_json("notice", v.value())?;
                waiting += usize::from(!n.gave_up);
            }
            let mut out = BTreeMap::new();
            for entry in self
                .read(NOTIFY)?
                .iter()
                .map_err(|e| err("scan")(e.into()))?
            {
                let (k, v) = entry.map_err(|e| err("scan")(e.into()))?;
                out.insert(
                    k.value().to_owned(),
                    decode_json("webhook status", v.value())?,
                );
            }
            Ok((out, waiting))
        })
    }

    fn outbox<'a>(&'a self) -> StoreFuture<'a, Vec<(u64, String)>> {
        Box::pin(async move {
            // Pending first, then redb: a checkpoint in between has
            // committed before it cleared what this copy holds.
            let pending = self.pending.lock().outbox_only();
            let txn = self
                .db
                .begin_read()
                .map_err(|e| err("begin read")(e.into()))?;
            Ok(outbox_rows(&txn, &pending)?.into_iter().collect())
        })
    }

    fn outbox_clear(&self, upto: u64) -> StoreFuture<'_, usize> {
        self.submit(|reply| Op::OutboxClear { upto, reply })
    }
}
