//! In-memory ledger store: the reference implementation. Nothing survives
//! the process.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::{check_transition, Recovery, Reservation, Store, StoreError, StoreFuture};
use crate::ledger::{Record, State};

/// A ledger in a map.
#[derive(Default)]
pub struct MemoryStore {
    map: Mutex<BTreeMap<String, Record>>,
}

impl MemoryStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Record>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Store for MemoryStore {
    fn get(&self, key: &str) -> Result<Option<Record>, StoreError> {
        Ok(self.lock().get(key).cloned())
    }

    fn reserve(&self, key: String, record: Record, now_ms: i64) -> StoreFuture<'_, Reservation> {
        let mut map = self.lock();
        let out = match map.get(&key) {
            Some(existing) if existing.binds(now_ms) => Reservation::Bound(existing.clone()),
            _ => {
                map.insert(key, record);
                Reservation::Reserved
            }
        };
        Box::pin(async move { Ok(out) })
    }

    fn transition(&self, key: String, from: State, to: Record) -> StoreFuture<'_, bool> {
        let out = check_transition(from, to.state).map(|()| {
            let mut map = self.lock();
            match map.get_mut(&key) {
                Some(cur) if cur.state == from => {
                    *cur = to;
                    true
                }
                _ => false,
            }
        });
        Box::pin(async move { out })
    }

    fn recover(&self) -> Result<Recovery, StoreError> {
        let mut map = self.lock();
        let mut rec = Recovery::default();
        map.retain(|_, r| match r.state {
            State::Reserved => {
                rec.freed += 1;
                false
            }
            _ => true,
        });
        for r in map.values_mut().filter(|r| r.state == State::Dispatched) {
            r.state = State::Unknown;
            rec.unknown += 1;
        }
        Ok(rec)
    }

    fn gc(&self, now_ms: i64) -> StoreFuture<'_, usize> {
        let mut map = self.lock();
        let before = map.len();
        map.retain(|_, r| r.binds(now_ms));
        let n = before - map.len();
        Box::pin(async move { Ok(n) })
    }

    fn list(&self, state: Option<State>) -> Result<Vec<(String, Record)>, StoreError> {
        Ok(self
            .lock()
            .iter()
            .filter(|(_, r)| state.is_none_or(|s| r.state == s))
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect())
    }
}
