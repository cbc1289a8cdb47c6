//! First-use pins and single-use nonces on redb.

use redb::{Durability, ReadableTable};

use super::{blocking, err, Op, RedbStore, NONCES, PINS};
use crate::store::{Seen, StoreFuture};

impl Seen for RedbStore {
    fn pin_first_use(&self, pins: Vec<(String, String)>) -> StoreFuture<'_, usize> {
        if pins.is_empty() {
            return Box::pin(std::future::ready(Ok(0)));
        }
        self.submit(|reply| Op::Pin { pins, reply })
    }

    fn use_nonce(&self, nonce: String, expires_ms: i64, now_ms: i64) -> StoreFuture<'_, bool> {
        let db = self.db.clone();
        Box::pin(blocking(move || {
            // Its own fsynced commit: a replay after a crash finds it.
            let mut txn = db.begin_write().map_err(|e| err("begin")(e.into()))?;
            txn.set_durability(Durability::Immediate);
            let fresh = {
                let mut table = txn
                    .open_table(NONCES)
                    .map_err(|e| err("open table")(e.into()))?;
                let seen = table
                    .get(nonce.as_str())
                    .map_err(|e| err("read")(e.into()))?
                    .is_some_and(|until| until.value() > now_ms);
                if !seen {
                    table
                        .insert(nonce.as_str(), expires_ms)
                        .map_err(|e| err("write")(e.into()))?;
                    // Expired nonces can no longer match: drop them.
                    table
                        .retain(|_, until| until > now_ms)
                        .map_err(|e| err("write")(e.into()))?;
                }
                !seen
            };
            txn.commit().map_err(|e| err("commit")(e.into()))?;
            Ok(fresh)
        }))
    }

    fn first_use_pins<'a>(&'a self) -> StoreFuture<'a, Vec<String>> {
        Box::pin(async move {
            let txn = self.db.begin_read().map_err(|e| err("begin")(e.into()))?;
            let table = txn
                .open_table(PINS)
                .map_err(|e| err("open table")(e.into()))?;
            let mut out = Vec::new();
            for entry in table.iter().map_err(|e| err("scan")(e.into()))? {
                let (_, v) = entry.map_err(|e| err("scan")(e.into()))?;
                out.push(v.value().to_owned());
            }
            Ok(out)
        })
    }
}
