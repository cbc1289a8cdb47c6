//! The ledger's calls on redb: reads look at the writer's pending changes
//! first; writes go through the writer.

use std::collections::BTreeMap;

use redb::ReadableTable;

use super::apply::read;
use super::{decode, encode, err, Op, RedbStore, LEDGER};
use crate::core::ledger::{Record, State};
use crate::core::notify::Notice;
use crate::store::{Ledger, Recovery, Reservation, StoreFuture};

impl Ledger for RedbStore {
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move {
            // The writer's changes not yet in redb first (cleared only
            // after their checkpoint commits, so a miss finds them there).
            if let Some(r) = self.pending.lock().ledger.get(key) {
                return Ok(Some(r.clone()));
            }
            read(&self.read_table()?, key)
        })
    }

    fn reserve_with(
        &self,
        key: String,
        record: Record,
        now_ms: i64,
        approval: Option<String>,
    ) -> StoreFuture<'_, Reservation> {
        self.submit(|reply| Op::Reserve {
            key,
            record,
            now_ms,
            approval,
            reply,
        })
    }

    fn reserve_dispatched(
        &self,
        key: String,
        record: Record,
        now_ms: i64,
        outbox: Option<(u64, String)>,
    ) -> StoreFuture<'_, bool> {
        // One operation of the writer, journaled and fsynced as a move to
        // `dispatched` is: the reservation is in the same frame.
        self.submit(|reply| Op::Claim {
            key,
            record,
            now_ms,
            outbox,
            reply,
        })
    }

    fn transition_telling(
        &self,
        key: String,
        from: State,
        to: Record,
        outbox: Option<(u64, String)>,
        notices: Vec<Notice>,
    ) -> StoreFuture<'_, bool> {
        self.submit(|reply| Op::Transition {
            key,
            from,
            to,
            outbox,
            notices,
            reply,
        })
    }

    fn recover<'a>(&'a self) -> StoreFuture<'a, Recovery> {
        Box::pin(async move {
            // Recovery scans redb's ledger: the journal goes into it first.
            self.submit(|reply| Op::Checkpoint { reply }).await?;
            let txn = self.db.begin_write().map_err(|e| err("begin")(e.into()))?;
            let mut rec = Recovery::default();
            {
                let mut table = txn
                    .open_table(LEDGER)
                    .map_err(|e| err("open table")(e.into()))?;
                let mut changes = Vec::new();
                for entry in table.iter().map_err(|e| err("scan")(e.into()))? {
                    let (k, v) = entry.map_err(|e| err("scan")(e.into()))?;
                    let r = decode(v.value())?;
                    if r.state.in_flight() {
                        changes.push((k.value().to_owned(), r));
                    }
                }
                for (k, mut r) in changes {
                    if r.state == State::Reserved {
                        table
                            .remove(k.as_str())
                            .map_err(|e| err("delete")(e.into()))?;
                        rec.freed += 1;
                    } else {
                        r.state = State::Unknown;
                        table
                            .insert(k.as_str(), encode(&r)?.as_slice())
                            .map_err(|e| err("write")(e.into()))?;
                        rec.unknown += 1;
                    }
                }
            }
            txn.commit().map_err(|e| err("commit")(e.into()))?;
            Ok(rec)
        })
    }

    fn gc(&self, now_ms: i64) -> StoreFuture<'_, usize> {
        self.submit(|reply| Op::Gc { now_ms, reply })
    }

    fn list<'a>(&'a self, state: Option<State>) -> StoreFuture<'a, Vec<(String, Record)>> {
        Box::pin(async move {
            // Pending first, then redb (as in `outbox`).
            let pending = self.pending.lock().ledger.clone();
            let table = self.read_table()?;
            let mut all = BTreeMap::new();
            for entry in table.iter().map_err(|e| err("scan")(e.into()))? {
                let (k, v) = entry.map_err(|e| err("scan")(e.into()))?;
                all.insert(k.value().to_owned(), decode(v.value())?);
            }
            all.extend(pending);
            Ok(all
                .into_iter()
                .filter(|(_, r)| state.is_none_or(|s| r.state == s))
                .collect())
        })
    }
}
