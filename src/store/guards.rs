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
            amount: amount.to_string(),
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
    })
}

/// A sorted table of guard rows (redb's, memory's).
pub(crate) trait Table {
    /// Every row whose table key is in `from..to`, in order.
    fn range(&self, from: &str, to: &str) -> Result<Vec<(String, GuardRow)>, StoreError>;
    /// One row.
    fn get(&self, key: &str) -> Result<Option<GuardRow>, StoreError>;
    /// Write a row.
    fn put(&mut self, key: &str, row: &GuardRow) -> Result<(), StoreError>;
    /// Remove a row.
    fn delete(&mut self, key: &str) -> Result<(), StoreError>;

    /// Every row whose table key starts with `prefix` (ASCII), in order.
    fn scan(&self, prefix: &str) -> Result<Vec<(String, GuardRow)>, StoreError> {
        self.range(prefix, &format!("{prefix}\u{10ffff}"))
    }

    /// Write a call's row (and its index entry), adding its amount to its
    /// group's sum.
    fn insert_row(&mut self, row_key: &str, row: &GuardRow) -> Result<(), StoreError> {
        self.put(row_key, row)?;
        self.put(&(index_prefix(&row.key) + row_key), row)?;
        self.add_sum(group_in(row_key), amount(row)?)
    }

    /// Remove a row (and its index entry) when it is there, taking its
    /// amount from its group's sum. Removing a row that is not there changes
    /// nothing: changes replayed in another order add up the same.
    fn remove_row(&mut self, row_key: &str) -> Result<(), StoreError> {
        let Some(row) = self.get(row_key)? else {
            return Ok(());
        };
        self.delete(row_key)?;
        self.delete(&(index_prefix(&row.key) + row_key))?;
        self.add_sum(group_in(row_key), -amount(&row)?)
    }

    /// The sum of a group's rows kept.
    fn sum_of(&self, group: &str) -> Result<Decimal, StoreError>;

    /// Add `by` to a group's sum.
    fn add_sum(&mut self, group: &str, by: Decimal) -> Result<(), StoreError>;
}

/// One change to a table, as a journal carries it (redb): a row inserted
/// or removed, each moving its group's sum when applied, so that changes
/// applied in another order than they were made (two calls dispatched in
/// the other order) add up the same.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Change {
    /// A call's row.
    Insert(String, GuardRow),
    /// A row gone (out of its window, or its call not sent).
    Remove(String),
}

/// A table in memory that records the rows inserted and removed.
pub(crate) struct Recording<'a> {
    /// The rows.
    pub(crate) rows: &'a mut Rows,
    /// What changed, in order.
    pub(crate) changes: Vec<Change>,
}

impl Table for Recording<'_> {
    fn range(&self, from: &str, to: &str) -> Result<Vec<(String, GuardRow)>, StoreError> {
        Table::range(&*self.rows, from, to)
    }

    fn get(&self, key: &str) -> Result<Option<GuardRow>, StoreError> {
        Table::get(&*self.rows, key)
    }

    fn put(&mut self, key: &str, row: &GuardRow) -> Result<(), StoreError> {
        Table::put(self.rows, key, row)
    }

    fn delete(&mut self, key: &str) -> Result<(), StoreError> {
        Table::delete(self.rows, key)
    }

    fn sum_of(&self, group: &str) -> Result<Decimal, StoreError> {
        self.rows.sum_of(group)
    }

    fn add_sum(&mut self, group: &str, by: Decimal) -> Result<(), StoreError> {
        self.rows.add_sum(group, by)
    }

    fn insert_row(&mut self, row_key: &str, row: &GuardRow) -> Result<(), StoreError> {
        self.changes
            .push(Change::Insert(row_key.to_owned(), row.clone()));
        self.rows.insert_row(row_key, row)
    }

    fn remove_row(&mut self, row_key: &str) -> Result<(), StoreError> {
        self.changes.push(Change::Remove(row_key.to_owned()));
        self.rows.remove_row(row_key)
    }
}

/// The group of a row's table key (`g` + its length in 8 digits + the
/// group + ...).
fn group_in(row_key: &str) -> &str {
    let len = row_key
        .get(1..9)
        .and_then(|l| l.parse::<usize>().ok())
        .unwrap_or(0);
    row_key.get(9..9 + len).unwrap_or("")
}

/// Where a group's rows start: `g`, the group's length (8 digits), the
/// group. No group's prefix is another's.
fn group_prefix(group: &str) -> String {
    format!("g{:08}{group}", group.len())
}

/// Table keys: `g LEN GROUP AT KEY` for the rows (a group's rows in time
/// order) and `k LEN\x1f KEY\x1f ROWKEY` for the index by ledger key. Each
/// group's sum is kept beside (so a budget's spending is read without
/// adding up its window).
fn row_key(group: &str, at_ms: i64, key: &str) -> String {
    format!("{}{at_ms:020}{key}", group_prefix(group))
}

fn index_prefix(key: &str) -> String {
    format!("k{}\x1f", key.len()) + key + "\x1f"
}

/// A claim's standing, and the rows its window left behind (for the
/// caller to prune). Reads only the expired rows, the call's own and, for
/// an effect, the rows of the window: a budget's spending is its group's
/// sum less those.
/// A claim's figure: a budget's spending, or the latest other call that
/// made an effect.
enum Figure {
    Spent(Decimal),
    Earlier(Option<(String, i64)>),
}

fn standing_of(
    t: &impl Table,
    key: &str,
    c: &Claim,
    now_ms: i64,
) -> Result<(Figure, Vec<(String, GuardRow)>), StoreError> {
    let g = group(c);
    let since = now_ms - window_ms(c);
    let start = group_prefix(g);
    let live = row_key(g, since + 1, "");
    let expired = t.range(&start, &live)?;
    let own_prefix = index_prefix(key) + &start;
    let own: Vec<GuardRow> = t
        .scan(&own_prefix)?
        .into_iter()
        .map(|(_, r)| r)
        .filter(|r| r.at_ms > since)
        .collect();
    let figure = match c {
        Claim::Budget { .. } => {
            let mut spent = t.sum_of(g)?;
            for r in expired.iter().map(|(_, r)| r).chain(&own) {
                spent -= amount(r)?;
            }
            Figure::Spent(spent)
        }
        Claim::Effect { .. } => Figure::Earlier(
            t.range(&live, &format!("{start}\u{10ffff}"))?
                .into_iter()
                .rev()
                .find(|(_, r)| r.key != key)
                .map(|(_, r)| (r.key, r.at_ms)),
        ),
    };
    Ok((figure, expired))
}

/// [`Guards::guards_look`] over a table; the rows the windows left behind
/// are returned for the caller to prune.
pub(crate) fn look_in(
    t: &impl Table,
    key: &str,
    claims: &[Claim],
    now_ms: i64,
) -> Result<(Standing, Vec<(String, GuardRow)>), StoreError> {
    let mut standing = Standing::default();
    let mut stale = Vec::new();
    for c in claims {
        let (figure, expired) = standing_of(t, key, c, now_ms)?;
        match figure {
            Figure::Spent(spent) => standing.spent.push(spent),
            Figure::Earlier(earlier) => standing.earlier.push(earlier),
        }
        stale.extend(expired);
    }
    Ok((standing, stale))
}

/// [`Guards::guards_take`] over a table, in the caller's one transaction.
pub(crate) fn take_in(
    t: &mut impl Table,
    key: &str,
    claims: &[Claim],
    force: bool,
    now_ms: i64,
) -> Result<Taken, StoreError> {
    let (standing, stale) = look_in(t, key, claims, now_ms)?;
    for (k, _) in stale {
        t.remove_row(&k)?;
    }
    let index = index_prefix(key);
    if !t.scan(&index)?.is_empty() {
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
    for c in claims {
        let r = row(c, key, now_ms);
        let g = group(c);
        let k = row_key(g, now_ms, key);
        t.insert_row(&k, &r)?;
    }
    Ok(Taken {
        taken: true,
        standing,
    })
}

/// [`Guards::guards_release`] over a table.
pub(crate) fn release_in(t: &mut impl Table, key: &str) -> Result<usize, StoreError> {
    let index = index_prefix(key);
    let rows = t.scan(&index)?;
    for (k, _) in &rows {
        t.remove_row(&k[index.len()..])?;
    }
    Ok(rows.len())
}

/// [`Guards::guards_gc`] over a table: the row keys removed.
pub(crate) fn gc_in(t: &mut impl Table, now_ms: i64) -> Result<Vec<String>, StoreError> {
    let gone: Vec<String> = t
        .scan("g")?
        .into_iter()
        // A row of an older release without `until_ms` is kept until a take
        // of its guard prunes it.
        .filter(|(_, r)| r.until_ms > 0 && r.until_ms <= now_ms)
        .map(|(k, _)| k)
        .collect();
    for k in &gone {
        t.remove_row(k)?;
    }
    Ok(gone)
}

/// [`Guards::guards_rows`] over a table.
pub(crate) fn rows_in(t: &impl Table, since_ms: i64) -> Result<Vec<GuardRow>, StoreError> {
    Ok(t.scan("g")?
        .into_iter()
        .map(|(_, r)| r)
        .filter(|r| r.at_ms >= since_ms)
        .collect())
}

/// The guards' rows in memory, with each group's sum.
#[derive(Debug, Default)]
pub(crate) struct Rows {
    rows: std::collections::BTreeMap<String, GuardRow>,
    sums: std::collections::HashMap<String, Decimal>,
}

impl Table for Rows {
    fn range(&self, from: &str, to: &str) -> Result<Vec<(String, GuardRow)>, StoreError> {
        if from >= to {
            return Ok(Vec::new());
        }
        Ok(self
            .rows
            .range(from.to_owned()..to.to_owned())
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect())
    }

    fn get(&self, key: &str) -> Result<Option<GuardRow>, StoreError> {
        Ok(self.rows.get(key).cloned())
    }

    fn put(&mut self, key: &str, row: &GuardRow) -> Result<(), StoreError> {
        self.rows.insert(key.to_owned(), row.clone());
        Ok(())
    }

    fn delete(&mut self, key: &str) -> Result<(), StoreError> {
        self.rows.remove(key);
        Ok(())
    }

    fn sum_of(&self, group: &str) -> Result<Decimal, StoreError> {
        Ok(self.sums.get(group).copied().unwrap_or_default())
    }

    fn add_sum(&mut self, group: &str, by: Decimal) -> Result<(), StoreError> {
        let sum = self.sums.entry(group.to_owned()).or_default();
        *sum += by;
        if sum.is_zero() {
            self.sums.remove(group);
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::core::config::Over;
    use crate::store::Store;
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
                            let taken = take_in(&mut t, &key, &claim, what == 1, now).unwrap();
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
        let (_schema, config) = crate::store::tests::PgSchema::new().await;
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
