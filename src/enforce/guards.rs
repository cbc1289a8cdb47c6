//! Guards on the business effect in the write path (DESIGN.md section 25):
//! before the decision, the figures of the budgets and effect keys a call
//! falls under (for Cedar's `context.budgets` and the reviewer); after its
//! ledger key is reserved and before it is dispatched, the atomic take
//! ([`crate::store::guards`]). A call the figures stop is held for a
//! reviewer (or refused); a call that loses a race for the last of a budget
//! gives its key back and is decided again on the new figures, so that
//! concurrent calls can never together pass a limit unattended.

use std::sync::Arc;

use serde_json::json;

use super::call::Call;
use super::flight::Ticket;
use super::metrics::Metrics;
use crate::core::config::Config;
use crate::core::guard::{self, Claim, Figures, Repeat, Spending};
use crate::core::ledger::State;
use crate::store::guards::Standing;
use crate::store::{Store, StoreError};

/// The guards of calls (built by the pipeline).
pub(crate) struct Guarding {
    pub(crate) config: Arc<Config>,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) clock: Arc<dyn crate::core::time::Clock>,
}

/// Why a take did not count the call.
pub(crate) enum NotTaken {
    /// The guards stop the call (another call took the last of a budget,
    /// or made the effect, first; or the call was never within them):
    /// decide again, on the figures.
    Raced,
    /// The store failed: nothing is dispatched.
    Store(StoreError),
}

impl Guarding {
    /// Whether any guard covers `server`/`tool` (a read with none pays for
    /// nothing more than this look).
    pub(crate) fn covers(&self, server: &str, tool: &str) -> bool {
        if self.config.budgets.is_empty() && self.config.effect_keys.is_empty() {
            return false;
        }
        let named = |tools: &[String]| {
            tools.iter().any(|t| {
                t.split_once('/')
                    .is_some_and(|(s, n)| s == server && n == tool)
            })
        };
        self.config.budgets.iter().any(|b| named(&b.tools))
            || self.config.effect_keys.iter().any(|e| named(&e.tools))
    }

    /// The guards of `c`. `Err`: a budget's amount is missing or not a
    /// number (the call is refused as invalid: counting it as 0 would let
    /// it spend unattended).
    pub(crate) fn claims<U>(&self, c: &Call<'_, U>) -> Result<Vec<Claim>, String> {
        guard::claims(
            &self.config,
            c.ctx.server,
            &c.call.tool,
            &c.ctx.caller.identity,
            &c.call.arguments,
        )
    }

    /// The figures of `claims` for `c` now.
    pub(crate) async fn look<U>(
        &self,
        c: &Call<'_, U>,
        claims: &[Claim],
    ) -> Result<Figures, StoreError> {
        let now = self.clock.now_ms();
        let standing = self.store.guards_look(&c.claim.key, claims, now).await?;
        Ok(self.figures(claims, &standing).await)
    }

    /// Count `c` in its guards under the ticket's key: `force` for a call a
    /// person approved (it may go over). A call counted gives its share back
    /// if it is then proven not sent ([`Ticket::not_dispatched`]).
    pub(crate) async fn take<U>(
        &self,
        c: &Call<'_, U>,
        claims: &[Claim],
        ticket: &mut Ticket,
        force: bool,
    ) -> Result<(), NotTaken> {
        let now = self.clock.now_ms();
        let taken = self
            .store
            .guards_take(ticket.key(), claims, force, now)
            .await
            .map_err(NotTaken::Store)?;
        if !taken.taken {
            return Err(NotTaken::Raced);
        }
        ticket.guarded();
        // The budgets' figures, read from the claims and the standing as
        // they are (no `Figures` made: nothing is worded for a person here).
        let mut spent = taken.standing.spent.iter();
        let mut budgets = Vec::with_capacity(claims.len());
        for c in claims {
            if let Claim::Budget {
                name,
                scope,
                amount,
                limit,
                ..
            } = c
            {
                let s = spent.next().copied().unwrap_or_default();
                self.metrics
                    .budget_counted(name, to_f64(*amount), to_f64(*limit));
                budgets.push(budget_json(name, scope, s, *amount, *limit));
            }
        }
        // The figures the call ran with, in its `dispatched` entry.
        // (The figures, not the sentences: `after` and `over` follow from them.)
        let effects: Vec<serde_json::Value> = claims
            .iter()
            .filter(|c| matches!(c, Claim::Effect { .. }))
            .map(|c| serde_json::Value::from(c.name()))
            .collect();
        // Put together by hand: `json!` serializes each value it is given
        // once more.
        let mut guards = serde_json::Map::with_capacity(3);
        // Only when a person let it go over (the common case writes nothing:
        // every byte of an entry is serialized, canonicalized and hashed).
        if force {
            guards.insert("approved_over".into(), true.into());
        }
        guards.insert("budgets".into(), serde_json::Value::Array(budgets));
        guards.insert("effect_keys".into(), serde_json::Value::Array(effects));
        c.trail
            .at_dispatch(vec![("guards", serde_json::Value::Object(guards))]);
        Ok(())
    }

    /// The figures of a standing: each budget with this call, each earlier
    /// effect with what became of it (the ledger's record now).
    async fn figures(&self, claims: &[Claim], standing: &Standing) -> Figures {
        let mut figures = Figures::default();
        let mut spent = standing.spent.iter();
        let mut earlier = standing.earlier.iter();
        for c in claims {
            match c {
                Claim::Budget {
                    name,
                    scope,
                    tenant: _,
                    group: _,
                    amount,
                    limit,
                    window_ms,
                    over,
                } => figures.spending.push(Spending {
                    name: name.clone(),
                    scope: scope.clone(),
                    spent: spent.next().copied().unwrap_or_default(),
                    amount: *amount,
                    limit: *limit,
                    window_ms: *window_ms,
                    over: *over,
                }),
                Claim::Effect { name, repeat, .. } => {
                    if let Some(Some((key, at_ms))) = earlier.next() {
                        figures.repeats.push(Repeat {
                            name: name.clone(),
                            key: key.clone(),
                            at_ms: *at_ms,
                            became: self.became(key).await,
                            repeat: *repeat,
                        });
                    }
                }
            }
        }
        figures
    }

    /// What became of the call under ledger `key`, in a reviewer's words.
    async fn became(&self, key: &str) -> String {
        match self.store.get(key).await {
            Ok(Some(r)) => match r.state {
                State::Complete => format!(
                    "it ran (answered at {})",
                    r.answered_at.as_deref().unwrap_or("?")
                ),
                State::Unknown => "its outcome is unknown (sent, the answer was lost)".into(),
                State::Dispatched => "it is running now".into(),
                State::Reserved => "it is about to run".into(),
                State::NotDispatched => "it was not sent".into(),
            },
            Ok(None) => "its ledger record is gone".into(),
            Err(e) => format!("its ledger record cannot be read now ({e})"),
        }
    }
}

/// The budgets' figures for the audit log: exact decimals as text.
pub(crate) fn budgets_json(spending: &[Spending]) -> serde_json::Value {
    serde_json::Value::Array(
        spending
            .iter()
            .map(|s| budget_json(&s.name, &s.scope, s.spent, s.amount, s.limit))
            .collect(),
    )
}

/// One budget's figures for the audit log. Built as values directly
/// (`json!` serializes each value once more).
fn budget_json(
    name: &str,
    scope: &str,
    spent: rust_decimal::Decimal,
    amount: rust_decimal::Decimal,
    limit: rust_decimal::Decimal,
) -> serde_json::Value {
    let text = |d| crate::core::guard::decimal_text(d).into();
    let mut b = serde_json::Map::with_capacity(5);
    b.insert("name".into(), name.into());
    b.insert("scope".into(), scope.into());
    b.insert("spent".into(), text(spent));
    b.insert("amount".into(), text(amount));
    b.insert("limit".into(), text(limit));
    serde_json::Value::Object(b)
}

fn to_f64(d: rust_decimal::Decimal) -> f64 {
    use rust_decimal::prelude::ToPrimitive;
    d.to_f64().unwrap_or(f64::MAX)
}

/// The budgets and effect keys as they stand (for `countersign budgets` and
/// `GET /v1/budgets`): per budget, the spending of each principal or
/// tenant in its window; per effect key, the effects it holds. Only rows of
/// tenants `covers` accepts are shown.
pub(crate) fn summary(
    config: &Config,
    rows: &[crate::store::guards::GuardRow],
    now_ms: i64,
    covers: impl Fn(&str) -> bool,
) -> serde_json::Value {
    use std::collections::BTreeMap;
    let budgets: Vec<serde_json::Value> = config
        .budgets
        .iter()
        .map(|b| {
            let since = now_ms - crate::core::time::ms(b.window);
            let mut per: BTreeMap<(&str, &str), (rust_decimal::Decimal, u64)> = BTreeMap::new();
            for r in rows.iter().filter(|r| {
                r.kind == "budget" && r.name == b.name && r.at_ms > since && covers(&r.tenant)
            }) {
                let e = per.entry((&r.tenant, &r.scope)).or_default();
                e.0 += crate::store::guards::amount(r).unwrap_or_default();
                e.1 += 1;
            }
            json!({
                "name": b.name,
                "tools": b.tools,
                "per": match b.per { crate::core::config::Per::Principal => "principal", crate::core::config::Per::Tenant => "tenant" },
                "window": guard::window(crate::core::time::ms(b.window)),
                "limit": b.limit.to_string(),
                "over": b.over.as_str(),
                "spending": per.into_iter().map(|((tenant, scope), (spent, calls))| json!({
                    "tenant": tenant,
                    "scope": scope,
                    "spent": spent.to_string(),
                    "calls": calls,
                    "left": (b.limit - spent).max(rust_decimal::Decimal::ZERO).to_string(),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let effects: Vec<serde_json::Value> = config
        .effect_keys
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let name = e.name_at(i);
            let since = now_ms - crate::core::time::ms(e.window);
            let held = rows
                .iter()
                .filter(|r| {
                    r.kind == "effect" && r.name == name && r.at_ms > since && covers(&r.tenant)
                })
                .count();
            json!({
                "name": name,
                "tools": e.tools,
                "fields": e.fields,
                "window": guard::window(crate::core::time::ms(e.window)),
                "repeat": e.repeat.as_str(),
                "effects_in_window": held,
            })
        })
        .collect();
    json!({ "budgets": budgets, "effect_keys": effects })
}

/// [`summary`] as a person reads it.
pub fn render_summary(v: &serde_json::Value) -> String {
    use crate::core::legible::text;
    let s = |v: &serde_json::Value, k: &str| text(v[k].as_str().unwrap_or("")).into_owned();
    let dec = |v: &serde_json::Value, k: &str| {
        v[k].as_str()
            .and_then(|t| t.parse::<rust_decimal::Decimal>().ok())
            .map(guard::grouped)
            .unwrap_or_default()
    };
    let mut out = String::new();
    for b in v["budgets"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "budget {}: limit {} per {} in {}, over it: {}\n",
            s(b, "name"),
            dec(b, "limit"),
            s(b, "per"),
            s(b, "window"),
            s(b, "over")
        ));
        let spending = b["spending"].as_array().cloned().unwrap_or_default();
        if spending.is_empty() {
            out.push_str("  nothing spent in the window\n");
        }
        for e in &spending {
            out.push_str(&format!(
                "  {} {}: spent {} in {} calls, {} left\n",
                s(e, "tenant"),
                s(e, "scope"),
                dec(e, "spent"),
                e["calls"],
                dec(e, "left")
            ));
        }
    }
    for e in v["effect_keys"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "effect key {}: {} effects made in the last {}, a repeat gets: {}\n",
            s(e, "name"),
            e["effects_in_window"],
            s(e, "window"),
            s(e, "repeat")
        ));
    }
    if out.is_empty() {
        out.push_str("no [[budgets]] or [[effect_keys]] in the gateway's config\n");
    }
    out
}
