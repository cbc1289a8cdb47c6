//! The guards' atomic operations (DESIGN.md section 25): budgets' spending
//! and effects made, per ledger key. A call under guards *takes* them right
//! after its ledger key is reserved and before it is dispatched: one
//! compare-and-set checks every guard and records the call in each, or
//! records nothing. What it took stays counted once dispatched (an unknown
//! outcome counts) and is *released* when the call is proven not sent.
//! A held call has taken nothing: a denial, an expired hold or a cancelled
//! task releases nothing because nothing was spent.
//!
//! redb and memory share the rules below over a sorted table
//! ([`Table`]); PostgreSQL does the same in one transaction under advisory
//! locks on the guards' groups (`postgres::guards`), so gateways sharing a
//! database share each count exactly.

use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use super::{StoreError, StoreFuture};
use crate::core::guard::Claim;

/// One call's share of one guard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardRow {
    /// `budget` or `effect`.
    pub kind: String,
    /// The guard's name.
    pub name: String,
    /// The requester's tenant.
    pub tenant: String,
    /// A budget's scope (`principal:NAME`, `tenant:NAME`) or an effect's
    /// digest.
    pub scope: String,
    /// The call's ledger key.
    pub key: String,
    /// What it spent (a decimal's text; `0` for an effect).
    pub amount: String,
    /// When it was taken, Unix ms.
    pub at_ms: i64,
    /// When its window ends (it no longer counts), Unix ms.
    #[serde(default)]
    pub until_ms: i64,
}

/// Each claim's standing for a call, in the claims' order, leaving out the
/// call's own rows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Standing {
    /// Per budget claim: spent in its window.
    pub spent: Vec<Decimal>,
    /// Per effect claim: the latest other call that made it in its window
    /// (ledger key, when).
    pub earlier: Vec<Option<(String, i64)>>,
}

impl Standing {
    /// Whether the claims pass: no budget past its limit with the call, no
    /// effect made before.
    pub fn passes(&self, claims: &[Claim]) -> bool {
        let mut spent = self.spent.iter();
        let mut earlier = self.earlier.iter();
        claims.iter().all(|c| match c {
            Claim::Budget { amount, limit, .. } => {
                spent.next().is_some_and(|s| *s + *amount <= *limit)
            }
            Claim::Effect { .. } => earlier.next().is_some_and(Option::is_none),
        })
    }
}

/// What a take did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    /// The call is now counted in every guard (or was already, under its
    /// key).
    pub taken: bool,
    /// The standing it was judged on.
    pub standing: Standing,
}

/// The guards' operations. A store without them refuses every call that
/// falls under a guard (fail closed).
pub trait Guards {
    /// The standing of `claims` for the call under ledger `key` now.
    fn guards_look<'a>(
        &'a self,
        key: &'a str,
        claims: &'a [Claim],
        now_ms: i64,
    ) -> StoreFuture<'a, Standing> {
        let _ = (key, claims, now_ms);
        Box::pin(async { Err(unsupported()) })
    }

    /// Atomically: when the claims pass (or `force`, an approved call),
    /// count the call under `key` in each; otherwise count nothing. A key
    /// counted already is not counted again (a retry of one call).
    fn guards_take<'a>(
        &'a self,
        key: &'a str,
        claims: &'a [Claim],
        force: bool,
        now_ms: i64,
    ) -> StoreFuture<'a, Taken> {
        let _ = (key, claims, force, now_ms);
        Box::pin(async { Err(unsupported()) })
    }

    /// The call under `key` was not sent: it counts nowhere. Returns how
    /// many rows went.
    fn guards_release<'a>(&'a self, key: &'a str) -> StoreFuture<'a, usize> {
        let _ = key;
        Box::pin(async { Err(unsupported()) })
    }

    /// Forget the rows whose window ended by `now_ms` (a take prunes its own
    /// guards' rows; this is for the groups nobody calls again, such as
    /// each distinct effect). Returns how many went.
    fn guards_gc(&self, now_ms: i64) -> StoreFuture<'_, usize> {
        let _ = now_ms;
        Box::pin(async { Ok(0) })
    }

    /// Every row taken at or after `since_ms` (for `countersign budgets`).
    fn guards_rows(&self, since_ms: i64) -> StoreFuture<'_, Vec<GuardRow>> {
        let _ = since_ms;
        Box::pin(async { Err(unsupported()) })
    }
}

fn unsupported() -> StoreError {
    StoreError::Backend {
        op: "guards",
        reason: "this store keeps no budgets or effect keys".into(),
        cause: None,
    }
}

/// The group of rows a claim counts in (see [`Claim::group`]).
pub(crate) fn group(claim: &Claim) -> &str {
    claim.group()
}

/// The claim's window.
pub(crate) fn window_ms(claim: &Claim) -> i64 {
    match claim {
        Claim::Budget { window_ms, .. } | Claim::Effect { window_ms, .. } => *window_ms,
    }
}

/// The row a claim takes for `key` at `now_ms`.
pub(crate) fn row(claim: &Claim, key: &str, now_ms: i64) -> GuardRow {
    match claim {
        Claim::Budget {
            name,
            tenant,
            scope,
            amount,
            ..
        } => GuardRow {
            kind: "budget".into(),
            name: name.clone(),
            tenant: tenant.clone(),
            scope: scope.clone(),
            key: key.into(),
            amount: crate::core::guard::decimal_text(*amount),
            at_ms: now_ms,
            until_ms: now_ms + window_ms(claim),
        },
        Claim::Effect {
            name,
            tenant,
            digest,
            ..
        } => GuardRow {
            kind: "effect".into(),
            name: name.clone(),
            tenant: tenant.clone(),
            scope: digest.clone(),
            key: key.into(),
            amount: "0".into(),
            at_ms: now_ms,
            until_ms: now_ms + window_ms(claim),
        },
    }
}

/// A row's amount.
pub(crate) fn amount(row: &GuardRow) -> Result<Decimal, StoreError> {
    Decimal::from_str(&row.amount).map_err(|e| StoreError::Corrupt {
        what: "guards",
        reason: format!("row of key {} has amount `{}`: {e}", row.key, row.amount),
        cause: Some(crate::store::Cause::new(e)),
    })
}

/// One change to the guards' rows, as redb's journal carries it: the row of
/// a dispatched call, under its table key. (A journal of an earlier release
/// may also hold `Remove`s; rows now leave redb's table at its checkpoint,
/// see [`crate::store::redb_store`]'s `guards::fold`.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Change {
    /// A call's row.
    Insert(String, std::sync::Arc<GuardRow>),
    /// A row gone (out of its window).
    Remove(String),
}

/// The table key of a row in redb's `guards` table: `g`, the group's length
/// in 8 digits, the group, when it was taken in 20 digits, the ledger key.
/// A group's rows sort in time order, and no group's prefix is another's.
pub(crate) fn row_key(group: &str, at_ms: i64, key: &str) -> String {
    let mut out = String::with_capacity(29 + group.len() + key.len());
    out.push('g');
    push_digits(&mut out, group.len() as u64, 8);
    out.push_str(group);
    push_digits(&mut out, u64::try_from(at_ms).unwrap_or(0), 20);
    out.push_str(key);
    out
}

/// `n` in decimal, zero-padded to `width` digits (no `format!`: a take
/// makes a few of these per call).
fn push_digits(out: &mut String, n: u64, width: usize) {
    let mut digits = itoa::Buffer::new();
    let text = digits.format(n);
    for _ in text.len()..width {
        out.push('0');
    }
    out.push_str(text);
}

/// The group of a row's table key.
pub(crate) fn group_of_row_key(row_key: &str) -> Option<&str> {
    split_row_key(row_key).map(|(g, _, _)| g)
}

/// A table key's group, time and ledger key.
fn split_row_key(row_key: &str) -> Option<(&str, i64, &str)> {
    let len: usize = row_key.get(1..9)?.parse().ok()?;
    let group = row_key.get(9..9 + len)?;
    let at = row_key.get(9 + len..29 + len)?.parse().ok()?;
    Some((group, at, row_key.get(29 + len..)?))
}

/// The guards' rows in memory (redb's and the memory store's): per group,
/// its rows in time order and their sum (a budget's spending is read without
/// adding up its window); per ledger key, where its rows are.
#[derive(Debug, Default)]
pub(crate) struct Rows {
    /// Groups are made of configured names, the requester's tenant and
    /// principal, and an effect's SHA-256: no client picks their hash, so
    /// foldhash serves. Ledger keys below can be a client's: SipHash.
    groups: crate::core::FastMap<String, Group>,
    /// Per ledger key: the group and time of each of its rows.
    by_key: HashMap<String, Vec<(String, i64)>>,
}

#[derive(Debug, Default)]
struct Group {
    /// By (when taken, ledger key).
    rows: BTreeMap<(i64, String), Kept>,
    /// The sum of the rows' amounts.
    sum: Decimal,
}

#[derive(Debug)]
struct Kept {
    row: std::sync::Arc<GuardRow>,
    amount: Decimal,
}

/// What a take changed, for a store that journals it (redb): the rows it
/// made, and the table keys of the rows the windows left behind (pruned).
#[derive(Debug, Default)]
pub(crate) struct TakeLog {
    /// The rows made, journaled with the call's dispatch.
    pub(crate) made: Vec<Change>,
    /// The rows pruned, for the table's next checkpoint.
    pub(crate) pruned: Vec<String>,
}

/// A claim's figure: a budget's spending, or the latest other call that
/// made an effect.
enum Figure {
    Spent(Decimal),
    Earlier(Option<(String, i64)>),
}

impl Rows {
    /// Add a row of `group`. A row that is there already (the same call at
    /// the same time, replayed) is kept once.
    pub(crate) fn insert(
        &mut self,
        group: &str,
        row: std::sync::Arc<GuardRow>,
    ) -> Result<(), StoreError> {
        let amount = amount(&row)?;
        let g = match self.groups.get_mut(group) {
            Some(g) => g,
            None => self.groups.entry(group.to_owned()).or_default(),
        };
        let slot = (row.at_ms, row.key.clone());
        if g.rows.contains_key(&slot) {
            return Ok(());
        }
        self.by_key
            .entry(row.key.clone())
            .or_default()
            .push((group.to_owned(), row.at_ms));
        g.sum += amount;
        g.rows.insert(slot, Kept { row, amount });
        Ok(())
    }

    /// Add the rows a call under `key` made now (none of it is counted
    /// yet): each in its group with its amount, and the key's index once.
    fn insert_call(
        &mut self,
        key: &str,
        at_ms: i64,
        rows: Vec<(&str, std::sync::Arc<GuardRow>, Decimal)>,
    ) {
        let mut at = Vec::with_capacity(rows.len());
        for (group, row, amount) in rows {
            let g = match self.groups.get_mut(group) {
                Some(g) => g,
                None => self.groups.entry(group.to_owned()).or_default(),
            };
            g.sum += amount;
            g.rows.insert((at_ms, key.to_owned()), Kept { row, amount });
            at.push((group.to_owned(), at_ms));
        }
        self.by_key.insert(key.to_owned(), at);
    }

    /// Add a row of redb's table, under its table key.
    pub(crate) fn insert_keyed(
        &mut self,
        row_key: &str,
        row: std::sync::Arc<GuardRow>,
    ) -> Result<(), StoreError> {
        let (group, _, _) = split_row_key(row_key).ok_or_else(|| StoreError::Corrupt {
            what: "guards",
            reason: format!("`{row_key}` is not a guard row's key"),
            cause: None,
        })?;
        self.insert(group, row)
    }

    /// Remove the row of `group` taken at `at_ms` under `key`.
    fn remove(&mut self, group: &str, at_ms: i64, key: &str) -> Option<std::sync::Arc<GuardRow>> {
        let g = self.groups.get_mut(group)?;
        let kept = g.rows.remove(&(at_ms, key.to_owned()))?;
        g.sum -= kept.amount;
        // An emptied group stays (an effect's group empties and fills on
        // every call); the sweep forgets empty groups.
        if let Some(at) = self.by_key.get_mut(key) {
            at.retain(|(gg, t)| !(gg == group && *t == at_ms));
            if at.is_empty() {
                self.by_key.remove(key);
            }
        }
        Some(kept.row)
    }

    /// The rows of `group` taken at or before `since` (out of the window).
    fn expired(&self, group: &str, since: i64) -> Vec<(i64, String)> {
        self.groups
            .get(group)
            .map(|g| {
                g.rows
                    .range(..(since.saturating_add(1), String::new()))
                    .map(|(slot, _)| slot.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A claim's figure for the call under `key`, leaving out the call's own
    /// rows and every row taken at or before `now_ms` less the window.
    fn figure(&self, key: &str, c: &Claim, now_ms: i64, counted: bool) -> Figure {
        let since = now_ms - window_ms(c);
        let g = self.groups.get(group(c));
        match c {
            Claim::Budget { .. } => {
                let Some(g) = g else {
                    return Figure::Spent(Decimal::ZERO);
                };
                let mut spent = g.sum;
                for (_, kept) in g.rows.range(..(since.saturating_add(1), String::new())) {
                    spent -= kept.amount;
                }
                let own = if counted { self.by_key.get(key) } else { None };
                for (gg, at) in own.into_iter().flatten() {
                    if gg == group(c) && *at > since {
                        if let Some(kept) = g.rows.get(&(*at, key.to_owned())) {
                            spent -= kept.amount;
                        }
                    }
                }
                Figure::Spent(spent)
            }
            Claim::Effect { .. } => Figure::Earlier(g.and_then(|g| {
                g.rows
                    .range((since.saturating_add(1), String::new())..)
                    .rev()
                    .find(|((_, k), _)| k != key)
                    .map(|((at, k), _)| (k.clone(), *at))
            })),
        }
    }
}

/// [`Guards::guards_look`] over rows in memory.
pub(crate) fn look_in(
    t: &Rows,
    key: &str,
    claims: &[Claim],
    now_ms: i64,
) -> Result<Standing, StoreError> {
    look_counted(t, key, claims, now_ms, t.by_key.contains_key(key))
}

/// [`look_in`], knowing whether the call under `key` counts already.
fn look_counted(
    t: &Rows,
    key: &str,
    claims: &[Claim],
    now_ms: i64,
    counted: bool,
) -> Result<Standing, StoreError> {
    let mut standing = Standing::default();
    for c in claims {
        match t.figure(key, c, now_ms, counted) {
            Figure::Spent(spent) => standing.spent.push(spent),
            Figure::Earlier(earlier) => standing.earlier.push(earlier),
        }
    }
    Ok(standing)
}

/// [`Guards::guards_take`] over rows in memory, under the caller's lock;
/// `log` (redb) is told what changed.
pub(crate) fn take_in(
    t: &mut Rows,
    key: &str,
    claims: &[Claim],
    force: bool,
    now_ms: i64,
    mut log: Option<&mut TakeLog>,
) -> Result<Taken, StoreError> {
    let counted = t.by_key.contains_key(key);
    let standing = look_counted(t, key, claims, now_ms, counted)?;
    for c in claims {
        let g = group(c);
        for (at, k) in t.expired(g, now_ms - window_ms(c)) {
            t.remove(g, at, &k);
            if let Some(log) = log.as_deref_mut() {
                log.pruned.push(row_key(g, at, &k));
            }
        }
    }
    // (Pruning only takes rows away: a call not counted before is not now.)
    if counted && t.by_key.contains_key(key) {
        // This call (a retry under its key) counts already.
        return Ok(Taken {
            taken: true,
            standing,
        });
    }
    if !force && !standing.passes(claims) {
        return Ok(Taken {
            taken: false,
            standing,
        });
    }
    let mut made = Vec::with_capacity(claims.len());
    for c in claims {
        let r = std::sync::Arc::new(row(c, key, now_ms));
        let g = group(c);
        if let Some(log) = log.as_deref_mut() {
            log.made
                .push(Change::Insert(row_key(g, now_ms, key), r.clone()));
        }
        let amount = match c {
            Claim::Budget { amount, .. } => *amount,
            Claim::Effect { .. } => Decimal::ZERO,
        };
        made.push((g, r, amount));
    }
    t.insert_call(key, now_ms, made);
    Ok(Taken {
        taken: true,
        standing,
    })
}

/// [`Guards::guards_release`] over rows in memory.
pub(crate) fn release_in(t: &mut Rows, key: &str) -> Result<usize, StoreError> {
    let at = t.by_key.get(key).cloned().unwrap_or_default();
    for (g, at_ms) in &at {
        t.remove(g, *at_ms, key);
    }
    Ok(at.len())
}

/// [`Guards::guards_gc`] over rows in memory: the table keys removed.
pub(crate) fn gc_in(t: &mut Rows, now_ms: i64) -> Result<Vec<String>, StoreError> {
    let mut gone = Vec::new();
    for (g, group) in &t.groups {
        for ((at, k), kept) in &group.rows {
            // A row of an older release without `until_ms` is kept until a
            // take of its guard prunes it.
            if kept.row.until_ms > 0 && kept.row.until_ms <= now_ms {
                gone.push((g.clone(), *at, k.clone()));
            }
        }
    }
    let gone = gone
        .into_iter()
        .map(|(g, at, k)| {
            t.remove(&g, at, &k);
            row_key(&g, at, &k)
        })
        .collect();
    t.groups.retain(|_, g| !g.rows.is_empty());
    Ok(gone)
}

/// [`Guards::guards_rows`] over rows in memory: by group, in time order.
pub(crate) fn rows_in(t: &Rows, since_ms: i64) -> Result<Vec<GuardRow>, StoreError> {
    let mut groups: Vec<(&String, &Group)> = t.groups.iter().collect();
    groups.sort_by(|a, b| a.0.cmp(b.0));
    Ok(groups
        .into_iter()
        .flat_map(|(_, g)| g.rows.values())
        .filter(|k| k.row.at_ms >= since_ms)
        .map(|k| GuardRow::clone(&k.row))
        .collect())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::core::config::Over;
    use crate::store::{Ledger, Store};
    use std::sync::Arc;

    pub(crate) fn budget(scope: &str, amount: i64, limit: i64) -> Claim {
        Claim::budget(
            "card",
            "acme",
            scope,
            Decimal::from(amount),
            Decimal::from(limit),
            1000,
            Over::Approval,
        )
    }

    pub(crate) fn effect(digest: &str) -> Claim {
        Claim::effect("once", "acme", digest, 1000, Over::Deny)
    }

    /// What every store does with guards: take within the limit, refuse
    /// past it unless forced, count a key once, release, roll the window,
    /// keep scopes and effects apart, and let exactly as many concurrent
    /// takes through as the limit holds.
    pub(crate) async fn guards_conformance(store: Arc<dyn Store>) {
        let a = [budget("principal:a", 400, 1000)];
        let t = store.guards_take("k1", &a, false, 10_000).await.unwrap();
        assert!(t.taken);
        assert_eq!(t.standing.spent, [Decimal::ZERO]);
        assert!(
            store
                .guards_take("k2", &a, false, 10_001)
                .await
                .unwrap()
                .taken
        );
        let third = store.guards_take("k3", &a, false, 10_002).await.unwrap();
        assert!(!third.taken, "800 + 400 passes 1,000");
        assert_eq!(third.standing.spent, [Decimal::from(800)]);
        // A retry of k1 counts once.
        let again = store.guards_take("k1", &a, false, 10_003).await.unwrap();
        assert!(again.taken);
        assert_eq!(
            store.guards_look("k9", &a, 10_003).await.unwrap().spent,
            [Decimal::from(800)]
        );
        // Approved: it goes over.
        assert!(
            store
                .guards_take("k3", &a, true, 10_004)
                .await
                .unwrap()
                .taken
        );
        assert_eq!(
            store.guards_look("k9", &a, 10_004).await.unwrap().spent,
            [Decimal::from(1200)]
        );
        // Another principal has its own budget.
        let b = [budget("principal:b", 1000, 1000)];
        assert!(
            store
                .guards_take("k4", &b, false, 10_005)
                .await
                .unwrap()
                .taken
        );
        // Not sent: released.
        assert_eq!(store.guards_release("k3").await.unwrap(), 1);
        assert_eq!(store.guards_release("k3").await.unwrap(), 0);
        assert_eq!(
            store.guards_look("k9", &a, 10_006).await.unwrap().spent,
            [Decimal::from(800)]
        );
        // The window rolls: at 11,001 k1 (taken at 10,000) and k2 no longer count.
        assert_eq!(
            store.guards_look("k9", &a, 11_001).await.unwrap().spent,
            [Decimal::ZERO]
        );
        let rows = store.guards_rows(0).await.unwrap();
        assert_eq!(rows.len(), 3, "{rows:?}");
        // Nobody takes this budget again: the sweep forgets its rows once
        // their window ended (k1, k2 at 10,000 and 10,001; k4 at 10,005).
        assert_eq!(store.guards_gc(11_002).await.unwrap(), 2);
        assert_eq!(store.guards_rows(0).await.unwrap().len(), 1);
        assert_eq!(store.guards_gc(11_002).await.unwrap(), 0);

        // Effects: the same digest from another key is a repeat.
        let e = [effect("sha256:x")];
        assert!(
            store
                .guards_take("e1", &e, false, 20_000)
                .await
                .unwrap()
                .taken
        );
        let rep = store.guards_take("e2", &e, false, 20_001).await.unwrap();
        assert!(!rep.taken);
        assert_eq!(rep.standing.earlier, [Some(("e1".to_owned(), 20_000))]);
        assert!(
            store
                .guards_take("e1", &e, false, 20_002)
                .await
                .unwrap()
                .taken,
            "its own retry"
        );
        assert!(
            store
                .guards_take("e3", &[effect("sha256:y")], false, 20_003)
                .await
                .unwrap()
                .taken
        );
        // Budget and effect together: one failing takes neither.
        let both = [budget("principal:c", 10, 100), effect("sha256:x")];
        assert!(
            !store
                .guards_take("m1", &both, false, 20_004)
                .await
                .unwrap()
                .taken
        );
        assert_eq!(
            store
                .guards_look("k9", &[budget("principal:c", 1, 100)], 20_004)
                .await
                .unwrap()
                .spent,
            [Decimal::ZERO],
            "nothing taken when one guard stops the call"
        );
        assert!(
            store
                .guards_take("e4", &e, false, 21_001)
                .await
                .unwrap()
                .taken,
            "the window rolled"
        );

        // Ten concurrent takes of 200 under 1,000: exactly five.
        let c = [budget("tenant:t", 200, 1000)];
        let taken = at_once(&[store], &c, "c", 30_000).await;
        assert_eq!(taken, 5, "exactly five of ten fit in the budget");
    }

    /// Ten takes of `c` at once, through `stores` in turn (keys `PREFIX0`
    /// ...): how many were taken.
    async fn at_once(stores: &[Arc<dyn Store>], c: &[Claim], prefix: &str, now: i64) -> usize {
        let mut set = tokio::task::JoinSet::new();
        for i in 0..10 {
            let store = stores[i % stores.len()].clone();
            let (c, key) = (c.to_vec(), format!("{prefix}{i}"));
            set.spawn(async move { store.guards_take(&key, &c, false, now).await.unwrap().taken });
        }
        let mut taken = 0;
        while let Some(t) = set.join_next().await {
            taken += usize::from(t.unwrap());
        }
        taken
    }

    /// The kept sums never drift from the rows: random takes (forced or
    /// not), releases and times, against a count made from scratch.
    #[test]
    fn a_budgets_spending_from_its_sum_is_the_sum_of_its_window() {
        use proptest::prelude::*;
        let op = (0u8..3, 0u8..6, 1i64..300, 0i64..400);
        let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
            cases: 256,
            failure_persistence: None,
            ..Default::default()
        });
        runner
            .run(&proptest::collection::vec(op, 1..60), |ops| {
                let mut t = Rows::default();
                // Every call counted: key -> (amount, at).
                let mut counted = std::collections::BTreeMap::<String, (i64, i64)>::new();
                let mut now = 10_000;
                for (what, k, amount, step) in ops {
                    now += step;
                    let key = format!("k{k}");
                    let claim = [budget("principal:a", amount, 1500)];
                    let since = now - 1000;
                    let expected: i64 = counted
                        .iter()
                        .filter(|(kk, (_, at))| **kk != key && *at > since)
                        .map(|(_, (a, _))| a)
                        .sum();
                    match what {
                        0 | 1 => {
                            let taken =
                                take_in(&mut t, &key, &claim, what == 1, now, None).unwrap();
                            prop_assert_eq!(taken.standing.spent[0], Decimal::from(expected));
                            // Rows out of the window are gone.
                            counted.retain(|_, (_, at)| *at > since);
                            if taken.taken && !counted.contains_key(&key) {
                                counted.insert(key, (amount, now));
                            }
                        }
                        _ => {
                            release_in(&mut t, &key).unwrap();
                            counted.remove(&key);
                        }
                    }
                }
                Ok(())
            })
            .unwrap();
    }

    #[tokio::test]
    async fn memory_guards_conform() {
        guards_conformance(Arc::new(crate::store::MemoryStore::default())).await;
    }

    /// Reserve and dispatch `key` in the ledger (what makes its take count
    /// after a restart on redb).
    async fn dispatched(store: &dyn Store, key: &str) {
        use crate::core::ledger::Record;
        use crate::store::tests::{claim, dispatch};
        let r = Record::reserve(&claim(key), 0, 10_000_000);
        store.reserve(key.into(), r.clone(), 0).await.unwrap();
        assert!(dispatch(store, key, &r).await);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redb_guards_conform_and_count_what_was_dispatched_across_restarts_and_crashes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.redb");
        guards_conformance(Arc::new(crate::store::RedbStore::open(&path).unwrap())).await;
        let path = dir.path().join("second.redb");
        let c = |n| [budget("tenant:t", n, 1000)];
        {
            let store = crate::store::RedbStore::open(&path).unwrap();
            assert!(
                store
                    .guards_take("d1", &c(200), false, 50_000)
                    .await
                    .unwrap()
                    .taken
            );
            dispatched(&store, "d1").await;
            // Taken, never dispatched: lost with the process, as it should be.
            assert!(
                store
                    .guards_take("d2", &c(300), false, 50_001)
                    .await
                    .unwrap()
                    .taken
            );
        }
        {
            let store = crate::store::RedbStore::open(&path).unwrap();
            assert_eq!(
                store.guards_look("x", &c(1), 50_002).await.unwrap().spent,
                [Decimal::from(200)],
                "the dispatched call counts after a restart; the other does not"
            );
            assert!(
                store
                    .guards_take("d3", &c(100), false, 50_003)
                    .await
                    .unwrap()
                    .taken
            );
            dispatched(&store, "d3").await;
            // A crash: the journal alone holds d3's share.
            store.crash_on_drop();
        }
        let store = crate::store::RedbStore::open(&path).unwrap();
        assert_eq!(
            store.guards_look("x", &c(1), 50_004).await.unwrap().spent,
            [Decimal::from(300)],
            "replayed from the journal after a crash"
        );
        // Their windows ended: the sweep forgets them, in the table too.
        assert_eq!(store.guards_gc(1_000_000).await.unwrap(), 2);
        drop(store);
        let store = crate::store::RedbStore::open(&path).unwrap();
        assert!(store.guards_rows(0).await.unwrap().is_empty());
    }

    /// Two gateways on one database share each budget exactly: ten takes
    /// of 200 through two stores at once, five fit in 1,000.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_guards_conform_and_two_gateways_share_one_budget() {
        use crate::store::PgStore;
        let Some((_schema, config)) = crate::store::tests::PgSchema::new().await else {
            return;
        };
        let (store, _) = PgStore::connect(config.clone(), None, 4, "gw-a")
            .await
            .unwrap();
        guards_conformance(Arc::new(store)).await;
        let (a, _) = PgStore::connect(config.clone(), None, 4, "gw-a")
            .await
            .unwrap();
        let (b, _) = PgStore::connect(config.clone(), None, 4, "gw-b")
            .await
            .unwrap();
        let stores: [Arc<dyn Store>; 2] = [Arc::new(a), Arc::new(b)];
        let c = [budget("tenant:shared", 200, 1000)];
        let taken = at_once(&stores, &c, "s", 40_000).await;
        assert_eq!(taken, 5, "two gateways together fit five of ten");

        // A gateway that stopped between a take and its dispatch: its
        // recovery frees the reserved key and gives the share back.
        use crate::core::ledger::Record;
        let (gone, _) = PgStore::connect(config, None, 2, "gw-c").await.unwrap();
        let r = Record::reserve(&crate::store::tests::claim("r1"), 0, 10_000_000);
        gone.reserve("r1".into(), r, 0).await.unwrap();
        let c = [budget("tenant:stopped", 300, 1000)];
        assert!(
            gone.guards_take("r1", &c, false, 60_000)
                .await
                .unwrap()
                .taken
        );
        assert_eq!(
            gone.guards_look("x", &c, 60_001).await.unwrap().spent,
            [Decimal::from(300)]
        );
        gone.recover().await.unwrap();
        assert_eq!(
            gone.guards_look("x", &c, 60_002).await.unwrap().spent,
            [Decimal::ZERO],
            "never sent, never spent"
        );
    }
}
