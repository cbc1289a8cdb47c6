//! Guards on the business effect (DESIGN.md section 25): budgets, which
//! hold the call that would take a principal's or tenant's spending past a
//! limit in a rolling window, and effect keys, which hold the same business
//! effect twice within a window whatever the session or idempotency key.
//!
//! The rules only, no I/O: which guards a call falls under ([`claims`]),
//! its amount as an exact decimal, the figures a reviewer and Cedar see.
//! The atomic take and release are the store's ([`crate::store::guards`]);
//! the write path calls them around the dispatch.

use std::str::FromStr;

use rust_decimal::Decimal;
use serde_json::Value;

use super::config::{Config, Over, Per};
use super::identity::Identity;

/// One guard a call falls under, with what it would add.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// It spends `amount` of budget `name` for `scope`.
    Budget {
        /// The budget.
        name: String,
        /// The requester's tenant (the budget of one tenant's principal is
        /// not another tenant's).
        tenant: String,
        /// `principal:NAME` or `tenant:NAME`.
        scope: String,
        /// What this call adds.
        amount: Decimal,
        /// The budget's limit.
        limit: Decimal,
        /// The rolling window, in ms.
        window_ms: i64,
        /// What a call past it gets.
        over: Over,
        /// The guard's rows in the store (see [`Claim::group`]).
        group: String,
    },
    /// It makes effect `digest` of effect key `name`.
    Effect {
        /// The effect key.
        name: String,
        /// The requester's tenant (in the digest too: one tenant's effect
        /// is not another's).
        tenant: String,
        /// `sha256:` of the tool and the fields' values.
        digest: String,
        /// How long a dispatched effect stands, in ms.
        window_ms: i64,
        /// What a repeat gets.
        repeat: Over,
        /// The guard's rows in the store (see [`Claim::group`]).
        group: String,
    },
}

impl Claim {
    /// The guard's name.
    pub fn name(&self) -> &str {
        match self {
            Claim::Budget { name, .. } | Claim::Effect { name, .. } => name,
        }
    }

    /// A budget's claim.
    pub fn budget(
        name: &str,
        tenant: &str,
        scope: &str,
        amount: Decimal,
        limit: Decimal,
        window_ms: i64,
        over: Over,
    ) -> Claim {
        Claim::Budget {
            group: group_of("budget", name, tenant, scope),
            name: name.to_owned(),
            tenant: tenant.to_owned(),
            scope: scope.to_owned(),
            amount,
            limit,
            window_ms,
            over,
        }
    }

    /// An effect key's claim.
    pub fn effect(name: &str, tenant: &str, digest: &str, window_ms: i64, repeat: Over) -> Claim {
        Claim::Effect {
            group: group_of("effect", name, tenant, digest),
            name: name.to_owned(),
            tenant: tenant.to_owned(),
            digest: digest.to_owned(),
            window_ms,
            repeat,
        }
    }

    /// The rows it counts in, in the store: its kind, name, tenant and
    /// scope (or digest), each after its length, so that no name or scope
    /// can run into another's rows.
    pub fn group(&self) -> &str {
        match self {
            Claim::Budget { group, .. } | Claim::Effect { group, .. } => group,
        }
    }

    /// The requester's tenant.
    pub fn tenant(&self) -> &str {
        match self {
            Claim::Budget { tenant, .. } | Claim::Effect { tenant, .. } => tenant,
        }
    }

    /// What a call it stops gets.
    pub fn over(&self) -> Over {
        match self {
            Claim::Budget { over, .. } => *over,
            Claim::Effect { repeat, .. } => *repeat,
        }
    }
}

/// Budget `name` as it stands for a call: spent in the window, this call,
/// after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spending {
    /// The budget.
    pub name: String,
    /// `principal:NAME` or `tenant:NAME`.
    pub scope: String,
    /// Spent in the window (dispatched, or about to be).
    pub spent: Decimal,
    /// This call's amount.
    pub amount: Decimal,
    /// The limit.
    pub limit: Decimal,
    /// The window, in ms.
    pub window_ms: i64,
    /// What a call past it gets.
    pub over: Over,
}

impl Spending {
    /// Spent with this call.
    pub fn after(&self) -> Decimal {
        self.spent + self.amount
    }

    /// This call would take it past its limit.
    pub fn passes(&self) -> bool {
        self.after() > self.limit
    }

    /// What a reviewer reads: "budget card-daily (principal:agent-7):
    /// spent 800 of 1,000 in 24h; this call 400; after it 1,200 (over)".
    pub fn sentence(&self) -> String {
        format!(
            "budget {} ({}): spent {} of {} in {}; this call {}; after it {}{}",
            self.name,
            self.scope,
            grouped(self.spent),
            grouped(self.limit),
            window(self.window_ms),
            grouped(self.amount),
            grouped(self.after()),
            if self.passes() {
                " (over the limit)"
            } else {
                ""
            }
        )
    }
}

/// An earlier call that made the same effect within the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repeat {
    /// The effect key.
    pub name: String,
    /// The earlier call's ledger key.
    pub key: String,
    /// When it was taken (dispatched, or about to be), Unix ms.
    pub at_ms: i64,
    /// What became of it, as the ledger says now ("ran", "outcome unknown").
    pub became: String,
    /// What a repeat gets.
    pub repeat: Over,
}

impl Repeat {
    /// What a reviewer reads.
    pub fn sentence(&self) -> String {
        format!(
            "repeats an earlier call (effect key {}): dispatched at {} under key {}; {}",
            self.name,
            super::time::rfc3339(self.at_ms),
            self.key,
            self.became
        )
    }
}

/// What the guards of a call say before the decision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Figures {
    /// Each budget it falls under.
    pub spending: Vec<Spending>,
    /// Each effect it repeats.
    pub repeats: Vec<Repeat>,
}

impl Figures {
    /// Nothing guards the call.
    pub fn is_empty(&self) -> bool {
        self.spending.is_empty() && self.repeats.is_empty()
    }

    /// The guards the call passes (a budget it would take past its limit,
    /// an effect it repeats), each with what it gets.
    pub fn stopped(&self) -> Vec<(String, Over)> {
        let budgets = self
            .spending
            .iter()
            .filter(|s| s.passes())
            .map(|s| (format!("budget/{}", s.name), s.over));
        let repeats = self
            .repeats
            .iter()
            .map(|r| (format!("effect_key/{}", r.name), r.repeat));
        budgets.chain(repeats).collect()
    }

    /// The reviewer's sentences, budgets first.
    pub fn sentences(&self) -> Vec<String> {
        self.spending
            .iter()
            .map(Spending::sentence)
            .chain(self.repeats.iter().map(Repeat::sentence))
            .collect()
    }
}

/// A call a guard refuses (`over = "deny"`, `repeat = "deny"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `budget_exceeded` or `effect_repeated`.
    pub code: &'static str,
    /// What the agent and the log are told: the figures.
    pub sentences: Vec<String>,
}

impl Figures {
    /// The refusal, when a guard that denies stops the call.
    pub fn refusal(&self) -> Option<Refusal> {
        let budgets: Vec<String> = self
            .spending
            .iter()
            .filter(|s| s.passes() && s.over == Over::Deny)
            .map(Spending::sentence)
            .collect();
        let repeats: Vec<String> = self
            .repeats
            .iter()
            .filter(|r| r.repeat == Over::Deny)
            .map(Repeat::sentence)
            .collect();
        let code = match (budgets.is_empty(), repeats.is_empty()) {
            (true, true) => return None,
            (false, _) => "budget_exceeded",
            (true, false) => "effect_repeated",
        };
        Some(Refusal {
            code,
            sentences: budgets.into_iter().chain(repeats).collect(),
        })
    }
}

/// A guard's group: its kind, name, tenant and scope (or digest), each
/// after its length, so that no two guards share one (a scope that holds
/// the text of another's parts is still another group).
fn group_of(kind: &str, name: &str, tenant: &str, scope: &str) -> String {
    let mut out = String::with_capacity(kind.len() + name.len() + tenant.len() + scope.len() + 16);
    let mut digits = itoa::Buffer::new();
    for part in [kind, name, tenant, scope] {
        out.push_str(digits.format(part.len()));
        out.push(':');
        out.push_str(part);
    }
    out
}

/// A decimal's text, as its `Display` writes it (a whole number without
/// `fmt`: the write path writes a few per guarded call).
pub fn decimal_text(d: Decimal) -> String {
    if d.scale() == 0 {
        let mut digits = itoa::Buffer::new();
        match i64::try_from(d.mantissa()) {
            Ok(m) => digits.format(m).to_owned(),
            Err(_) => digits.format(d.mantissa()).to_owned(),
        }
    } else {
        d.to_string()
    }
}

/// `context.budgets`: per budget `{ spent, after, limit, over }`, amounts
/// as Cedar decimals (rounded to Cedar's four fractional digits; the hold
/// itself is judged on the exact amounts).
pub fn cedar_budgets(spending: &[Spending]) -> Result<cedar_policy::RestrictedExpression, String> {
    let dec = |d: rust_decimal::Decimal| {
        let text = d.round_dp(4).normalize().to_string();
        super::arguments::cedar_decimal(&text)
            .ok_or_else(|| format!("budget amount {text} is beyond a Cedar decimal's range"))
    };
    let mut out = Vec::with_capacity(spending.len());
    for s in spending {
        let record = cedar_policy::RestrictedExpression::new_record([
            ("spent".to_owned(), dec(s.spent)?),
            ("after".to_owned(), dec(s.after())?),
            ("limit".to_owned(), dec(s.limit)?),
            (
                "over".to_owned(),
                cedar_policy::RestrictedExpression::new_bool(s.passes()),
            ),
        ])
        .map_err(|e| e.to_string())?;
        out.push((s.name.clone(), record));
    }
    cedar_policy::RestrictedExpression::new_record(out).map_err(|e| e.to_string())
}

/// The guards `config` puts on a call of `server`/`tool` by `who` with
/// canonical `arguments`. A budget whose amount is missing or not a number
/// is an error the caller refuses the call with: counting it as 0 would let
/// it spend unattended.
pub fn claims(
    config: &Config,
    server: &str,
    tool: &str,
    who: &Identity,
    arguments: &Value,
) -> Result<Vec<Claim>, String> {
    if config.budgets.is_empty() && config.effect_keys.is_empty() {
        return Ok(Vec::new());
    }
    let covers = |tools: &[String]| {
        tools.iter().any(|t| {
            t.split_once('/')
                .is_some_and(|(s, n)| s == server && n == tool)
        })
    };
    let mut out = Vec::new();
    for b in config.budgets.iter().filter(|b| covers(&b.tools)) {
        let amount = match &b.amount {
            None => Decimal::ONE,
            Some(pointer) => amount_at(arguments, pointer).map_err(|why| {
                format!(
                    "budget `{}` counts the amount at `{pointer}`: {why}",
                    b.name
                )
            })?,
        };
        let scope = match b.per {
            Per::Principal => format!("principal:{}", who.principal),
            Per::Tenant => format!("tenant:{}", who.tenant),
        };
        out.push(Claim::budget(
            &b.name,
            &who.tenant,
            &scope,
            amount,
            b.limit,
            super::time::ms(b.window),
            b.over,
        ));
    }
    for (i, e) in config.effect_keys.iter().enumerate() {
        if !covers(&e.tools) {
            continue;
        }
        let name = e.name_at(i);
        // The effect is the tenant, the tool and the fields' values: the
        // same values sent to another tool, or by another tenant, are
        // another effect; by another principal or session of the tenant,
        // the same. Hashed: the JCS text of
        // `[name, tenant, server, tool, [values...]]`, written in place.
        let mut text = Vec::with_capacity(128);
        text.push(b'[');
        for part in [name.as_ref(), who.tenant.as_str(), server, tool] {
            super::canonical::jcs_string(part, &mut text);
            text.push(b',');
        }
        text.push(b'[');
        for (j, p) in e.fields.iter().enumerate() {
            if j > 0 {
                text.push(b',');
            }
            match at(arguments, p) {
                Some(v) => super::canonical::jcs_into(v, &mut text),
                None => text.extend_from_slice(b"null"),
            }
        }
        text.extend_from_slice(b"]]");
        let digest = {
            use sha2::Digest;
            super::canonical::sha256_text(&sha2::Sha256::digest(&text).into())
        };
        out.push(Claim::effect(
            &name,
            &who.tenant,
            &digest,
            super::time::ms(e.window),
            e.repeat,
        ));
    }
    Ok(out)
}

/// The value at JSON pointer `pointer` (RFC 6901), as
/// `serde_json::Value::pointer` finds it, without a new string per token
/// unless the token is escaped (`~0`, `~1`): the write path looks up each
/// guard's fields on every call.
pub fn at<'v>(value: &'v Value, pointer: &str) -> Option<&'v Value> {
    if pointer.is_empty() {
        return Some(value);
    }
    let rest = pointer.strip_prefix('/')?;
    let mut here = value;
    for token in rest.split('/') {
        let unescaped;
        let token = if token.contains('~') {
            unescaped = token.replace("~1", "/").replace("~0", "~");
            unescaped.as_str()
        } else {
            token
        };
        here = match here {
            Value::Object(map) => map.get(token)?,
            Value::Array(items) => {
                // An index: digits, without a leading zero or sign.
                if token.is_empty()
                    || (token.len() > 1 && token.starts_with('0'))
                    || !token.bytes().all(|b| b.is_ascii_digit())
                {
                    return None;
                }
                items.get(token.parse::<usize>().ok()?)?
            }
            _ => return None,
        };
    }
    Some(here)
}

/// The amount at `pointer`: a JSON number, or a string holding a plain
/// decimal ("12.50"), read exactly from its text; never negative.
pub fn amount_at(arguments: &Value, pointer: &str) -> Result<Decimal, String> {
    let text = match at(arguments, pointer) {
        None | Some(Value::Null) => return Err("the call has no amount there".into()),
        // A whole number is exact as it is (no text to read back).
        Some(Value::Number(n)) if n.is_u64() => {
            return Ok(Decimal::from(n.as_u64().unwrap_or_default()));
        }
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(format!("`{other}` is not a number or a decimal string")),
    };
    // Canonical numbers are written in their shortest form; one in
    // exponent form (1e21) is read as such.
    let d = if text.contains(['e', 'E']) {
        Decimal::from_scientific(&text)
    } else {
        Decimal::from_str(&text)
    }
    .map_err(|e| format!("`{text}` is not an exact decimal ({e})"))?;
    if d.is_sign_negative() && !d.is_zero() {
        return Err(format!("`{text}` is negative"));
    }
    Ok(d.normalize())
}

/// `1234567.5` as `1,234,567.5`.
pub fn grouped(d: Decimal) -> String {
    let text = d.normalize().to_string();
    let (sign, rest) = match text.strip_prefix('-') {
        Some(r) => ("-", r),
        None => ("", text.as_str()),
    };
    let (int, frac) = rest
        .split_once('.')
        .map_or((rest, None), |(i, f)| (i, Some(f)));
    let mut out = String::with_capacity(text.len() + int.len() / 3);
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    match frac {
        Some(f) => format!("{sign}{out}.{f}"),
        None => format!("{sign}{out}"),
    }
}

/// A window as a person writes it: `24h`, `30m`, `7d`.
pub fn window(ms: i64) -> String {
    let s = ms / 1000;
    match s {
        s if s > 0 && s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s > 0 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if s > 0 && s % 60 == 0 => format!("{}m", s / 60),
        s if s > 0 => format!("{s}s"),
        _ => format!("{ms}ms"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(text: &str) -> Config {
        Config::parse(text, std::path::Path::new("t.toml")).unwrap()
    }

    fn who(p: &str, t: &str) -> Identity {
        Identity {
            principal: p.into(),
            tenant: t.into(),
            groups: vec![],
            scopes: vec![],
            client: None,
            aka: vec![],
        }
    }

    const CARD: &str = r#"
        [[budgets]]
        name = "card-daily"
        tools = ["payments/charge_card"]
        amount = "/amount"
        per = "principal"
        window = "24h"
        limit = 1000

        [[effect_keys]]
        tools = ["payments/charge_card"]
        fields = ["/account", "/amount", "/currency"]
        window = "1h"
        repeat = "deny"
    "#;

    #[test]
    fn amounts_are_exact_decimals_and_a_missing_or_odd_one_is_refused() {
        let a =
            json!({"n": 0.1, "s": "19.99", "i": 400, "neg": -1, "t": "ten", "b": true, "e": 1e21});
        assert_eq!(amount_at(&a, "/n").unwrap().to_string(), "0.1");
        assert_eq!(amount_at(&a, "/s").unwrap().to_string(), "19.99");
        assert_eq!(amount_at(&a, "/i").unwrap().to_string(), "400");
        assert_eq!(
            amount_at(&a, "/e").unwrap().to_string(),
            "1000000000000000000000"
        );
        assert!(amount_at(&a, "/missing").unwrap_err().contains("no amount"));
        assert!(amount_at(&a, "/neg").unwrap_err().contains("negative"));
        assert!(amount_at(&a, "/t")
            .unwrap_err()
            .contains("not an exact decimal"));
        assert!(amount_at(&a, "/b").unwrap_err().contains("not a number"));
        // Three times 0.1 is 0.3 here, which floats never make it.
        let three = amount_at(&a, "/n").unwrap() * Decimal::from(3);
        assert_eq!(three, Decimal::from_str("0.3").unwrap());
    }

    #[test]
    fn a_pointer_finds_what_serde_json_finds() {
        let v = serde_json::json!({"a": {"b/c": [10, {"~d": 2}], "": 3}, "n": null});
        for p in [
            "",
            "/a",
            "/a/b~1c",
            "/a/b~1c/0",
            "/a/b~1c/1/~0d",
            "/a/",
            "/n",
            "/a/b~1c/01",
            "/a/b~1c/+1",
            "/a/b~1c/2",
            "/x",
            "a",
            "/a/b~1c/0/z",
            "/a/b~1c/",
        ] {
            assert_eq!(super::at(&v, p), v.pointer(p), "{p}");
        }
    }

    #[test]
    fn a_decimals_text_is_its_display() {
        for text in [
            "0",
            "7",
            "-3",
            "100000000",
            "12.50",
            "0.0001",
            "79228162514264337593543950335",
        ] {
            let d = Decimal::from_str(text).unwrap();
            assert_eq!(super::decimal_text(d), d.to_string(), "{text}");
        }
        let args = serde_json::json!({"a": 18446744073709551615_u64, "b": 12.5, "c": -4});
        assert_eq!(
            super::amount_at(&args, "/a").unwrap().to_string(),
            "18446744073709551615"
        );
        assert_eq!(super::amount_at(&args, "/b").unwrap().to_string(), "12.5");
        assert!(super::amount_at(&args, "/c")
            .unwrap_err()
            .contains("negative"));
    }

    #[test]
    fn an_effects_digest_is_the_sha256_of_the_jcs_of_its_parts() {
        // Written in place for speed; it must stay the digest of this
        // canonical text, or effects taken before an upgrade are forgotten.
        let c = config(CARD);
        let args = json!({"amount": 400.50, "currency": "EUR", "x": {"b": 1, "a": "é\n"}});
        let got = claims(&c, "payments", "charge_card", &who("a", "acme"), &args).unwrap();
        let text = crate::core::canonical::jcs(&json!([
            "effect-1",
            "acme",
            "payments",
            "charge_card",
            [Value::Null, 400.5, "EUR"]
        ]));
        let want = {
            use sha2::Digest;
            crate::core::canonical::sha256_text(&sha2::Sha256::digest(text.as_bytes()).into())
        };
        let Claim::Effect { digest, .. } = &got[1] else {
            panic!("{got:?}")
        };
        assert_eq!(digest, &want);
    }

    #[test]
    fn a_call_falls_under_the_guards_of_its_tool_per_principal_or_tenant() {
        let c = config(CARD);
        let args = json!({"account": "acct_42", "amount": 400, "currency": "EUR"});
        let got = claims(
            &c,
            "payments",
            "charge_card",
            &who("agent-7", "acme"),
            &args,
        )
        .unwrap();
        assert_eq!(got.len(), 2);
        let Claim::Budget {
            scope,
            amount,
            limit,
            ..
        } = &got[0]
        else {
            panic!("{got:?}")
        };
        assert_eq!(scope, "principal:agent-7");
        assert_eq!(amount.to_string(), "400");
        assert_eq!(limit.to_string(), "1000");
        // Another session, another key: the same effect.
        let again = claims(
            &c,
            "payments",
            "charge_card",
            &who("agent-8", "acme"),
            &args,
        )
        .unwrap();
        assert_eq!(got[1], again[1]);
        // Another amount: another effect.
        let other = json!({"account": "acct_42", "amount": 401, "currency": "EUR"});
        let third = claims(
            &c,
            "payments",
            "charge_card",
            &who("agent-7", "acme"),
            &other,
        )
        .unwrap();
        assert_ne!(got[1], third[1]);
        assert!(claims(&c, "payments", "refund", &who("a", "t"), &args)
            .unwrap()
            .is_empty());
        let missing =
            claims(&c, "payments", "charge_card", &who("a", "t"), &json!({})).unwrap_err();
        assert!(
            missing.contains("budget `card-daily`") && missing.contains("/amount"),
            "{missing}"
        );
    }

    #[test]
    fn the_reviewer_reads_the_figures() {
        let s = Spending {
            name: "card-daily".into(),
            scope: "principal:agent-7".into(),
            spent: Decimal::from(800),
            amount: Decimal::from(400),
            limit: Decimal::from(1000),
            window_ms: 86_400_000,
            over: Over::Approval,
        };
        assert_eq!(
            s.sentence(),
            "budget card-daily (principal:agent-7): spent 800 of 1,000 in 1d; this call 400; after it 1,200 (over the limit)"
        );
        assert_eq!(
            grouped(Decimal::from_str("-1234567.50").unwrap()),
            "-1,234,567.5"
        );
        assert_eq!(window(3_600_000 * 24), "1d");
        assert_eq!(window(3_600_000 * 5), "5h");
    }

    #[test]
    fn bad_guard_config_is_refused_precisely() {
        let bad = |text: &str| {
            Config::parse(text, std::path::Path::new("t.toml"))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(bad("[[budgets]]\nname = \"a b\"\ntools = [\"s/t\"]\nper = \"principal\"\nwindow = \"1h\"\nlimit = 1\n").contains("letters, digits"));
        assert!(bad("[[budgets]]\nname = \"a\"\ntools = [\"st\"]\nper = \"principal\"\nwindow = \"1h\"\nlimit = 1\n").contains("SERVER/TOOL"));
        assert!(bad("[[budgets]]\nname = \"a\"\ntools = [\"s/t\"]\nper = \"principal\"\nwindow = \"1h\"\nlimit = \"x\"\n").contains("not a decimal"));
        assert!(bad("[[budgets]]\nname = \"a\"\ntools = [\"s/t\"]\namount = \"amount\"\nper = \"tenant\"\nwindow = \"1h\"\nlimit = 1\n").contains("JSON pointer"));
        assert!(
            bad("[[effect_keys]]\ntools = [\"s/t\"]\nfields = []\nwindow = \"1h\"\n")
                .contains("`fields` is empty")
        );
        let ok = config("[[budgets]]\nname = \"a\"\ntools = [\"s/t\"]\nper = \"tenant\"\nwindow = \"1h\"\nlimit = \"99.95\"\n");
        assert_eq!(ok.budgets[0].limit.to_string(), "99.95");
    }
}
