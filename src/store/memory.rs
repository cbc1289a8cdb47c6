//! In-memory ledger store: the reference implementation. Nothing survives
//! the process.

use parking_lot::Mutex;
use std::collections::BTreeMap;

use super::{
    check_transition, dispatched_only, inputs_stale, proposal_final, InputRow, Inputs, Ledger,
    Outbox, Proposals, Recovery, Reservation, Seen, Settle, Store, StoreFuture, Tasks,
};
use crate::core::approval::{self, Proposal, ProposalState};
use crate::core::ledger::{Record, State};
use crate::core::notify::{Notice, WebhookStatus};

/// A ledger in a map.
#[derive(Default)]
pub struct MemoryStore {
    map: Mutex<BTreeMap<String, Record>>,
    proposals: Mutex<BTreeMap<String, Proposal>>,
    outbox: Mutex<BTreeMap<u64, String>>,
    pins: Mutex<BTreeMap<String, String>>,
    /// Used nonces and until when they are kept.
    nonces: Mutex<BTreeMap<String, i64>>,
    /// Notices by key, and each webhook's status.
    notices: Mutex<(BTreeMap<String, Notice>, BTreeMap<String, WebhookStatus>)>,
    /// Decision inputs by key.
    inputs: Mutex<BTreeMap<String, InputRow>>,
    /// Tasks by id.
    tasks: Mutex<BTreeMap<String, crate::core::task::TaskRecord>>,
    /// Guard rows (see [`super::guards`]).
    guards: Mutex<super::guards::Rows>,
    /// The review console's entries: value, and until when it counts.
    console: Mutex<BTreeMap<String, (String, i64)>>,
    /// See [`MemoryStore::with_outbox_clear_pace`].
    clear_pace: std::time::Duration,
}

impl MemoryStore {
    /// A store that paces the audit writer's outbox clears as a networked
    /// one does ([`Outbox::outbox_clear_pace`]).
    pub fn with_outbox_clear_pace(mut self, pace: std::time::Duration) -> MemoryStore {
        self.clear_pace = pace;
        self
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, BTreeMap<String, Record>> {
        self.map.lock()
    }

    fn proposals(&self) -> parking_lot::MutexGuard<'_, BTreeMap<String, Proposal>> {
        self.proposals.lock()
    }
}

impl super::console::ConsoleState for MemoryStore {
    fn console_put(&self, key: String, value: String, until_ms: i64) -> StoreFuture<'_, ()> {
        self.console.lock().insert(key, (value, until_ms));
        Box::pin(std::future::ready(Ok(())))
    }

    fn console_get(&self, key: String, now_ms: i64) -> StoreFuture<'_, Option<String>> {
        let out = self
            .console
            .lock()
            .get(&key)
            .filter(|(_, until)| *until > now_ms)
            .map(|(v, _)| v.clone());
        Box::pin(std::future::ready(Ok(out)))
    }

    fn console_take(&self, key: String, now_ms: i64) -> StoreFuture<'_, Option<String>> {
        let out = self
            .console
            .lock()
            .remove(&key)
            .filter(|(_, until)| *until > now_ms)
            .map(|(v, _)| v);
        Box::pin(std::future::ready(Ok(out)))
    }

    fn console_count(&self, key: String, window_ms: i64, now_ms: i64) -> StoreFuture<'_, u32> {
        let mut all = self.console.lock();
        let current = all.get(&key).map(|(v, u)| (v.as_str(), *u));
        let (n, until) = super::console::next_count(current, window_ms, now_ms);
        all.insert(key, (n.to_string(), until));
        Box::pin(std::future::ready(Ok(n)))
    }

    fn passkey_counter(
        &self,
        key: String,
        counter: u32,
    ) -> StoreFuture<'_, super::console::Counted> {
        use super::console::{counter_follows, last_counter, Counted};
        let mut all = self.console.lock();
        let last = all.get(&key).map(|(v, _)| last_counter(v));
        let out = if counter_follows(last, counter) {
            all.insert(key, (counter.to_string(), i64::MAX));
            Counted::Advanced
        } else {
            Counted::Behind {
                last: last.unwrap_or(0),
            }
        };
        Box::pin(std::future::ready(Ok(out)))
    }

    fn console_gc(&self, now_ms: i64) -> StoreFuture<'_, usize> {
        let mut all = self.console.lock();
        let n = all.len();
        all.retain(|_, (_, until)| *until > now_ms);
        let gone = n - all.len();
        Box::pin(std::future::ready(Ok(gone)))
    }
}

impl super::guards::Guards for MemoryStore {
    fn guards_look<'a>(
        &'a self,
        key: &'a str,
        claims: &'a [crate::core::guard::Claim],
        now_ms: i64,
    ) -> StoreFuture<'a, super::guards::Standing> {
        let out = super::guards::look_in(&self.guards.lock(), key, claims, now_ms);
        Box::pin(async move { out })
    }

    fn guards_take<'a>(
        &'a self,
        key: &'a str,
        claims: &'a [crate::core::guard::Claim],
        force: bool,
        now_ms: i64,
    ) -> StoreFuture<'a, super::guards::Taken> {
        let out = super::guards::take_in(&mut self.guards.lock(), key, claims, force, now_ms, None);
        Box::pin(async move { out })
    }

    fn guards_release<'a>(&'a self, key: &'a str) -> StoreFuture<'a, usize> {
        let out = super::guards::release_in(&mut self.guards.lock(), key);
        Box::pin(async move { out })
    }

    fn guards_gc(&self, now_ms: i64) -> StoreFuture<'_, usize> {
        let out = super::guards::gc_in(&mut self.guards.lock(), now_ms).map(|g| g.len());
        Box::pin(async move { out })
    }

    fn guards_rows(&self, since_ms: i64) -> StoreFuture<'_, Vec<super::guards::GuardRow>> {
        let out = super::guards::rows_in(&self.guards.lock(), since_ms);
        Box::pin(async move { out })
    }
}

impl Store for MemoryStore {}

impl Ledger for MemoryStore {
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move { Ok(self.lock().get(key).cloned()) })
    }

    fn reserve_with(
        &self,
        key: String,
        record: Record,
        now_ms: i64,
        approval: Option<String>,
    ) -> StoreFuture<'_, Reservation> {
        // Both locks, always in this order: the pair is one atomic step.
        let mut map = self.lock();
        let mut proposals = self.proposals();
        let out = match map.get(&key) {
            Some(existing) if existing.binds(now_ms) => Reservation::Bound(existing.clone()),
            _ => {
                let consumed = match approval {
                    None => Ok(None),
                    Some(id) => match proposals.get(&id) {
                        None => Err(ProposalState::Invalidated),
                        Some(p) => {
                            approval::consume(p, &key, &record.server, &record.digest, now_ms)
                        }
                    },
                };
                match consumed {
                    Err(state) => Reservation::Unapproved(state),
                    Ok(next) => {
                        if let Some(p) = next {
                            proposals.insert(p.id.clone(), p);
                        }
                        map.insert(key, record);
                        Reservation::Reserved
                    }
                }
            }
        };
        Box::pin(async move { Ok(out) })
    }

    fn reserve_dispatched(
        &self,
        key: String,
        record: Record,
        _now_ms: i64,
        outbox: Option<(u64, String)>,
    ) -> StoreFuture<'_, bool> {
        let out = dispatched_only(&record).map(|()| {
            let mut map = self.lock();
            if map.contains_key(&key) {
                return false;
            }
            map.insert(key, record);
            if let Some((id, entries)) = outbox {
                self.outbox.lock().insert(id, entries);
            }
            true
        });
        Box::pin(async move { out })
    }

    fn transition_telling(
        &self,
        key: String,
        from: State,
        to: Record,
        outbox: Option<(u64, String)>,
        notices: Vec<Notice>,
    ) -> StoreFuture<'_, bool> {
        let out = check_transition(from, to.state).map(|()| {
            let mut map = self.lock();
            match map.get_mut(&key) {
                Some(cur) if cur.state == from => {
                    *cur = to;
                    if let Some((id, entries)) = outbox {
                        self.outbox.lock().insert(id, entries);
                    }
                    let mut queue = self.notices.lock();
                    for n in notices {
                        queue.0.insert(n.key(), n);
                    }
                    true
                }
                _ => false,
            }
        });
        Box::pin(async move { out })
    }

    fn recover<'a>(&'a self) -> StoreFuture<'a, Recovery> {
        Box::pin(async move {
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
        })
    }

    fn gc(&self, now_ms: i64) -> StoreFuture<'_, usize> {
        let mut map = self.lock();
        let before = map.len();
        map.retain(|_, r| r.binds(now_ms));
        let n = before - map.len();
        Box::pin(async move { Ok(n) })
    }

    fn list<'a>(&'a self, state: Option<State>) -> StoreFuture<'a, Vec<(String, Record)>> {
        Box::pin(async move {
            Ok(self
                .lock()
                .iter()
                .filter(|(_, r)| state.is_none_or(|s| r.state == s))
                .map(|(k, r)| (k.clone(), r.clone()))
                .collect())
        })
    }
}

impl Proposals for MemoryStore {
    fn put_proposal_with(
        &self,
        proposal: Proposal,
        expect: Option<ProposalState>,
        notices: Vec<Notice>,
    ) -> StoreFuture<'_, bool> {
        let mut proposals = self.proposals();
        let current = proposals.get(&proposal.id).map(|p| (p.state, p.revision));
        let ok = super::proposal_expected(current, expect, &proposal);
        if ok {
            proposals.insert(proposal.id.clone(), proposal);
            let mut queue = self.notices.lock();
            for n in notices {
                queue.0.insert(n.key(), n);
            }
        }
        Box::pin(async move { Ok(ok) })
    }

    fn get_proposal<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Proposal>> {
        Box::pin(async move { Ok(self.proposals().get(id).cloned()) })
    }

    fn list_proposals<'a>(&'a self) -> StoreFuture<'a, Vec<Proposal>> {
        Box::pin(async move { Ok(self.proposals().values().cloned().collect()) })
    }

    fn gc_proposals(&self, before_ms: i64) -> StoreFuture<'_, usize> {
        let mut proposals = self.proposals();
        let before = proposals.len();
        proposals.retain(|_, p| !(proposal_final(p) && p.updated_ms < before_ms));
        let n = before - proposals.len();
        Box::pin(async move { Ok(n) })
    }
}

impl Outbox for MemoryStore {
    fn notices_enqueue(&self, notices: Vec<Notice>) -> StoreFuture<'_, ()> {
        let mut queue = self.notices.lock();
        for n in notices {
            queue.0.insert(n.key(), n);
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn notices_claim(
        &self,
        owner: &str,
        now_ms: i64,
        lease_ms: i64,
        limit: usize,
    ) -> StoreFuture<'_, Vec<Notice>> {
        let mut queue = self.notices.lock();
        let mut out = Vec::new();
        for key in super::due(&queue.0, now_ms, limit) {
            if let Some(n) = queue.0.get_mut(&key) {
                n.lease = Some((owner.to_owned(), now_ms.saturating_add(lease_ms)));
                out.push(n.clone());
            }
        }
        Box::pin(std::future::ready(Ok(out)))
    }

    fn notice_settle(&self, notice: Notice, outcome: Settle) -> StoreFuture<'_, ()> {
        let mut queue = self.notices.lock();
        let (notices, status) = &mut *queue;
        let key = notice.key();
        let entry = status.entry(notice.webhook.clone()).or_default();
        match super::settled(notice, &outcome, entry) {
            Some(n) => {
                notices.insert(key, n);
            }
            None => {
                notices.remove(&key);
            }
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn notify_status(&self) -> StoreFuture<'_, (BTreeMap<String, WebhookStatus>, usize)> {
        let queue = self.notices.lock();
        let waiting = queue.0.values().filter(|n| !n.gave_up).count();
        let out = (queue.1.clone(), waiting);
        Box::pin(std::future::ready(Ok(out)))
    }

    fn outbox<'a>(&'a self) -> StoreFuture<'a, Vec<(u64, String)>> {
        Box::pin(async move {
            Ok(self
                .outbox
                .lock()
                .iter()
                .map(|(k, v)| (*k, v.clone()))
                .collect())
        })
    }

    fn outbox_clear_pace(&self) -> std::time::Duration {
        self.clear_pace
    }

    fn outbox_clear(&self, upto: u64) -> StoreFuture<'_, usize> {
        let mut o = self.outbox.lock();
        let before = o.len();
        o.retain(|k, _| *k > upto);
        let n = before - o.len();
        Box::pin(async move { Ok(n) })
    }
}

impl Seen for MemoryStore {
    fn pin_first_use(&self, new: Vec<(String, String)>) -> StoreFuture<'_, usize> {
        let mut pins = self.pins.lock();
        let mut wrote = 0;
        for (key, value) in new {
            if let std::collections::btree_map::Entry::Vacant(slot) = pins.entry(key) {
                slot.insert(value);
                wrote += 1;
            }
        }
        Box::pin(std::future::ready(Ok(wrote)))
    }

    fn use_nonce(&self, nonce: String, expires_ms: i64, now_ms: i64) -> StoreFuture<'_, bool> {
        let mut nonces = self.nonces.lock();
        nonces.retain(|_, until| *until > now_ms);
        let fresh = !nonces.contains_key(&nonce);
        if fresh {
            nonces.insert(nonce, expires_ms);
        }
        Box::pin(std::future::ready(Ok(fresh)))
    }

    fn first_use_pins<'a>(&'a self) -> StoreFuture<'a, Vec<String>> {
        Box::pin(async move {
            let pins = self.pins.lock();
            Ok(pins.values().cloned().collect())
        })
    }
}

impl Inputs for MemoryStore {
    fn inputs_put(&self, rows: Vec<InputRow>) -> StoreFuture<'_, ()> {
        let mut inputs = self.inputs.lock();
        for r in rows {
            inputs.insert(r.key.clone(), r);
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn inputs_since(
        &self,
        since_ms: i64,
        tenant: Option<String>,
    ) -> StoreFuture<'_, Vec<InputRow>> {
        let out = self
            .inputs
            .lock()
            .values()
            .filter(|r| r.time_ms >= since_ms && tenant.as_ref().is_none_or(|t| *t == r.tenant))
            .cloned()
            .collect();
        Box::pin(std::future::ready(Ok(out)))
    }

    fn inputs_erase(&self, tenant: String) -> StoreFuture<'_, usize> {
        let mut inputs = self.inputs.lock();
        let before = inputs.len();
        inputs.retain(|_, r| r.tenant != tenant);
        let n = before - inputs.len();
        Box::pin(std::future::ready(Ok(n)))
    }

    fn inputs_gc(&self, before_ms: i64, max_rows: usize) -> StoreFuture<'_, usize> {
        let mut inputs = self.inputs.lock();
        let stale = inputs_stale(
            inputs.values().map(|r| (r.key.as_str(), r.time_ms)),
            before_ms,
            max_rows,
        );
        for k in &stale {
            inputs.remove(k);
        }
        Box::pin(std::future::ready(Ok(stale.len())))
    }
}

impl Tasks for MemoryStore {
    fn task_create(
        &self,
        task: crate::core::task::TaskRecord,
    ) -> StoreFuture<'_, crate::core::task::TaskRecord> {
        let mut tasks = self.tasks.lock();
        let joined = tasks
            .values()
            .find(|old| super::tasks::joins(old, &task))
            .cloned();
        let out = match joined {
            Some(old) => Ok(old),
            None if tasks.contains_key(&task.id) => {
                Err(super::StoreError::Collision(task.id.clone()))
            }
            None => {
                tasks.insert(task.id.clone(), task.clone());
                Ok(task)
            }
        };
        Box::pin(std::future::ready(out))
    }

    fn task_get<'a>(
        &'a self,
        id: &'a str,
    ) -> StoreFuture<'a, Option<crate::core::task::TaskRecord>> {
        let out = self.tasks.lock().get(id).cloned();
        Box::pin(std::future::ready(Ok(out)))
    }

    fn tasks(
        &self,
        filter: super::TaskFilter,
    ) -> StoreFuture<'_, Vec<crate::core::task::TaskRecord>> {
        let mut out: Vec<_> = self
            .tasks
            .lock()
            .values()
            .filter(|t| filter.selects(t))
            .cloned()
            .collect();
        super::tasks::newest_first(&mut out);
        Box::pin(std::future::ready(Ok(out)))
    }

    fn task_put(&self, task: crate::core::task::TaskRecord) -> StoreFuture<'_, bool> {
        let mut tasks = self.tasks.lock();
        let ok = super::tasks::may_write(tasks.get(&task.id), &task);
        if ok {
            tasks.insert(task.id.clone(), task);
        }
        Box::pin(std::future::ready(Ok(ok)))
    }

    fn tasks_gc(&self, before_ms: i64) -> StoreFuture<'_, usize> {
        let mut tasks = self.tasks.lock();
        let n = tasks.len();
        tasks.retain(|_, t| !super::tasks::collectable(t, before_ms));
        let gone = n - tasks.len();
        Box::pin(std::future::ready(Ok(gone)))
    }
}
