//! Reviewer notifications (DESIGN.md section 19), the pure part: the event
//! a webhook is told, written once when what it announces happens; its body
//! in each format, with the arguments only as far as the webhook allows; and
//! its signature. Delivery (HTTP, retries) is `upstream::notify`; the queue
//! is the store's.
//!
//! An event never carries a credential or a token: it is built from a
//! proposal (the gateway's canonical copy of the call, the requester's
//! principal and client name, never their token) or from a server's name.
//! A notification cannot approve anything: approving stays a signed act of a
//! reviewer's key.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::core::approval::{Proposal, ProposalState};
use crate::core::config::{EventKind, WebhookConfig, WebhookFormat};
use crate::core::legible;
use crate::core::time::rfc3339;

/// One event for one webhook, as the store queues it until it is delivered
/// or given up. The id is the event's, shared by every webhook told of it:
/// a receiver drops what it has seen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Notice {
    /// `ev-` and 16 hex digits.
    pub id: String,
    /// The webhook's name.
    pub webhook: String,
    /// The event (see [`Event`]), as JSON; formatted per webhook when sent.
    pub event: Value,
    /// Unix ms: when the event happened.
    pub created_ms: i64,
    /// Attempts so far.
    pub attempts: u32,
    /// Unix ms: not before this.
    pub next_ms: i64,
    /// The last attempt's failure, if any.
    pub last_error: Option<String>,
    /// Given up: kept for `check` and the metrics, never sent again.
    pub gave_up: bool,
    /// The gateway delivering it now, and until when (unix ms): another
    /// takes it over once the lease lapses (a gateway killed mid-delivery).
    pub lease: Option<(String, i64)>,
}

impl Notice {
    /// The store's key: one row per event and webhook.
    pub fn key(&self) -> String {
        format!("{}/{}", self.id, self.webhook)
    }
}

/// How one webhook has fared, for `check` and the metrics.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WebhookStatus {
    /// Unix ms of the last delivery.
    pub last_success_ms: Option<i64>,
    /// Unix ms of the last failed attempt.
    pub last_failure_ms: Option<i64>,
    /// What the last failure was.
    pub last_error: Option<String>,
    /// Events delivered.
    pub delivered: u64,
    /// Attempts that failed and were tried again.
    pub retried: u64,
    /// Events given up.
    pub gave_up: u64,
}

/// An event, before it is fanned out to the webhooks that want it.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// Whose it is (`None`: no tenant's, as a circuit or a tool change).
    pub tenant: Option<String>,
    /// The facts, by name (see the constructors).
    pub facts: Map<String, Value>,
}

fn id() -> String {
    format!("ev-{:016x}", rand::random::<u64>())
}

impl Event {
    /// A proposal event: `proposal_created`, `proposal_decided` (with
    /// `decision`: `approved`, `quorum met`, `denied`, `approval withdrawn`
    /// and who), or `proposal_expired`. `pending_until`: when an undecided
    /// proposal expires (unix ms), said as its `expires_at` while pending.
    pub fn proposal(
        kind: EventKind,
        p: &Proposal,
        decision: Option<(&str, &str, &str)>,
        pending_until: i64,
    ) -> Event {
        let mut f = Map::new();
        f.insert("proposal_id".into(), json!(p.id));
        f.insert("requester".into(), json!(p.requester));
        if let Some(c) = &p.client {
            f.insert("client".into(), json!(c));
        }
        f.insert("tenant".into(), json!(p.tenant));
        f.insert("server".into(), json!(p.server));
        f.insert("tool".into(), json!(p.tool));
        f.insert("risk".into(), json!(p.risk));
        f.insert("call_digest".into(), json!(p.call_digest));
        f.insert("state".into(), json!(p.state.as_str()));
        f.insert("arguments".into(), p.arguments.clone());
        if let Some(h) = &p.headline {
            f.insert("headline".into(), json!(h));
        }
        match p.expires_ms {
            Some(e) => f.insert("expires_at".into(), json!(rfc3339(e))),
            None if p.state == ProposalState::Pending => {
                f.insert("expires_at".into(), json!(rfc3339(pending_until)))
            }
            None => None,
        };
        if let Some(progress) = p.progress() {
            f.insert("progress".into(), json!(progress));
        }
        if let Some((what, by, reason)) = decision {
            f.insert("decision".into(), json!(what));
            f.insert("by".into(), json!(by));
            if !reason.is_empty() {
                f.insert("reason".into(), json!(reason));
            }
        }
        if p.state == ProposalState::Expired {
            if let Some(r) = &p.reason {
                f.insert("reason".into(), json!(r));
            }
        }
        f.insert(
            "command".into(),
            json!(format!("countersign show {}", p.id)),
        );
        Event {
            kind,
            tenant: Some(p.tenant.clone()),
            facts: f,
        }
    }

    /// An incident of no proposal: `outcome_unknown` (a write whose answer
    /// was lost), `tools_changed`, `circuit_open`, with its facts.
    pub fn incident(kind: EventKind, tenant: Option<&str>, facts: Map<String, Value>) -> Event {
        Event {
            kind,
            tenant: tenant.map(str::to_owned),
            facts,
        }
    }

    /// The notices of this event for the webhooks that want it: one id for
    /// all of them.
    pub fn notices(&self, webhooks: &[WebhookConfig], now_ms: i64) -> Vec<Notice> {
        let id = id();
        let event = json!({
            "id": id,
            "kind": self.kind.as_str(),
            "time": rfc3339(now_ms),
            "tenant": self.tenant,
            "facts": self.facts,
        });
        webhooks
            .iter()
            .filter(|w| w.events.contains(&self.kind))
            .filter(|w| {
                w.tenants.is_empty()
                    || self
                        .tenant
                        .as_ref()
                        .is_none_or(|t| w.tenants.iter().any(|x| x == t))
            })
            .map(|w| Notice {
                id: id.clone(),
                webhook: w.name.clone(),
                event: event.clone(),
                created_ms: now_ms,
                attempts: 0,
                next_ms: now_ms,
                last_error: None,
                gave_up: false,
                lease: None,
            })
            .collect()
    }
}

/// A redacted value: `hmac-sha256:` and the hex HMAC-SHA256, under the
/// webhook's secret, of the value's JCS. Keyed: a short value (a card
/// number, an account id) cannot be found by hashing every candidate,
/// which a plain SHA-256 would allow; the receiver, who holds the secret,
/// can still match a value it knows.
fn redacted(v: &Value, secret: &[u8]) -> String {
    let mut bytes = Vec::new();
    crate::core::canonical::jcs_into(v, &mut bytes);
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    format!(
        "hmac-sha256:{}",
        hex::encode(ring::hmac::sign(&key, &bytes).as_ref())
    )
}

/// The event as `w` may see it: without the arguments unless it includes
/// them, and then with the values it redacts replaced by their HMAC under
/// the webhook's `secret`.
pub fn visible(event: &Value, w: &WebhookConfig, secret: &[u8]) -> Value {
    let mut e = event.clone();
    if let Some(facts) = e.get_mut("facts").and_then(Value::as_object_mut) {
        // The headline is made of argument values: it goes only where the
        // arguments go whole (a redacted value must not come back in it).
        if !(w.include_arguments && w.redact.is_empty()) {
            facts.remove("headline");
        }
        match facts.remove("arguments") {
            Some(args) if w.include_arguments => {
                let mut args = args;
                if let Some(map) = args.as_object_mut() {
                    for name in &w.redact {
                        if let Some(v) = map.get_mut(name) {
                            *v = json!(redacted(v, secret));
                        }
                    }
                }
                facts.insert("arguments".into(), args);
            }
            _ => {}
        }
    }
    e
}

fn s<'a>(facts: &'a Value, k: &str) -> &'a str {
    facts.get(k).and_then(Value::as_str).unwrap_or("")
}

/// The plain sentence a reviewer reads, the one the TUI shows: who, what,
/// where, and what to run. Every value in it is the event's, shown through
/// [`crate::core::legible`]: an agent's control characters, bidi overrides
/// and invisible characters are written out.
pub fn sentence(event: &Value) -> String {
    let legible = |s: &str| legible::text(s).into_owned();
    sentence_with(event, &legible, &legible)
}

/// The sentence with each value of the event that others chose (names,
/// arguments, reasons: much of it an agent's) written by `shown`, and the
/// gateway's own (ids, digests, states, times) by `ours`.
fn sentence_with(
    event: &Value,
    shown: &dyn Fn(&str) -> String,
    ours: &dyn Fn(&str) -> String,
) -> String {
    let f = &event["facts"];
    let v = |k: &str| shown(s(f, k));
    let o = |k: &str| ours(s(f, k));
    let who = match f.get("client").and_then(Value::as_str) {
        Some(c) => format!("{} via {}", v("requester"), shown(c)),
        None => v("requester"),
    };
    let tool = format!("{}/{}", v("server"), v("tool"));
    let args = match f.get("arguments").and_then(Value::as_object) {
        Some(m) if !m.is_empty() => format!(
            " with {}",
            m.iter()
                .map(|(k, a)| format!(
                    "{} {}",
                    shown(&legible::key(k)),
                    shown(&legible::marked(crate::core::canonical::jcs(a), a))
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        _ => String::new(),
    };
    // The operator's plain words for the call, when the tool has them
    // (made by the gateway, its values already legible).
    let args = match f.get("headline").and_then(Value::as_str) {
        Some(h) => format!(": {}", ours(h)),
        None => args,
    };
    let id = o("proposal_id");
    match s(event, "kind") {
        "proposal_created" => format!(
            "{who} of {} wants {tool} ({}){args}: proposal {id} waits for approval{} (call {}). Look at it with `countersign show {id}`.",
            v("tenant"),
            o("risk"),
            f.get("expires_at")
                .and_then(Value::as_str)
                .map(|e| format!(" until {}", ours(e)))
                .unwrap_or_default(),
            o("call_digest"),
        ),
        "proposal_decided" => format!(
            "Proposal {id} ({tool} for {who} of {}): {} by {}{}{}.",
            v("tenant"),
            o("decision"),
            v("by"),
            f.get("reason")
                .and_then(Value::as_str)
                .map(|r| format!(": {}", shown(r)))
                .unwrap_or_default(),
            f.get("progress")
                .and_then(Value::as_str)
                .map(|p| format!(" ({})", shown(p)))
                .unwrap_or_default(),
        ),
        "proposal_expired" => format!(
            "Proposal {id} ({tool} for {who} of {}) expired: {}.",
            v("tenant"),
            shown(f.get("reason").and_then(Value::as_str).unwrap_or("nobody decided it in time")),
        ),
        "outcome_unknown" if f.get("count").is_some() => format!(
            "{} calls may have run: {}. Settle them with `countersign reconcile`.",
            ours(&f["count"].to_string()),
            v("reason"),
        ),
        "outcome_unknown" => format!(
            "A call to {tool} by {who} of {} may have run: its answer was lost (key {}). Settle it with `countersign reconcile`.",
            v("tenant"),
            o("key_digest"),
        ),
        "tools_changed" => format!(
            "{tool}'s definition changed: its calls need approval until an operator accepts it (`countersign tools accept {tool}`).",
        ),
        "circuit_open" => format!(
            "The circuit to server {} opened: its calls fail fast until it recovers ({}).",
            v("server"),
            v("reason"),
        ),
        other => format!("countersign event {}", ours(other)),
    }
}

/// A value of an event as a Slack message shows it: legible, then in an
/// inline code span with `&`, `<` and `>` escaped as Slack asks. A code
/// span is never a link, a mention or formatting, so agent text cannot
/// ping `<!channel>`, draw a fake "Approve here" link or bold a lie; a
/// backquote of its own would end the span, so it is written `\u{60}`.
fn slack_value(s: &str) -> String {
    if s.is_empty() {
        return String::new();
    }
    let text = legible::text(s).replace('`', "\\u{60}");
    format!("`{}`", slack_escape(&text))
}

/// Slack's three control characters, escaped (its formatting reference).
fn slack_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The body sent to `w` for `event` (`secret`: the webhook's, which keys
/// the redactions).
pub fn body(event: &Value, w: &WebhookConfig, secret: &[u8]) -> String {
    let shown = visible(event, w, secret);
    match w.format {
        WebhookFormat::Json => {
            let mut v = shown;
            let text = sentence(&v);
            if let Some(o) = v.as_object_mut() {
                o.insert("text".into(), json!(text));
            }
            v.to_string()
        }
        WebhookFormat::Slack => slack(&shown).to_string(),
    }
}

/// A Slack incoming-webhook message: `text` (the fallback and the
/// notification), and Block Kit `blocks`: the sentence, then a context line
/// with the event id and the command to run. Every value of the event is
/// shown by `slack_value`, and the blocks' text is `verbatim` (Slack turns
/// no URL or channel name in it into a link).
pub fn slack(event: &Value) -> Value {
    let text = sentence_with(event, &slack_value, &|s| slack_escape(&legible::text(s)));
    let f = &event["facts"];
    let mut context = vec![
        format!("event {}", slack_value(s(event, "id"))),
        slack_value(s(event, "kind")),
    ];
    if let Some(c) = f.get("command").and_then(Value::as_str) {
        context.push(slack_value(c));
    }
    if let Some(e) = f.get("expires_at").and_then(Value::as_str) {
        context.push(format!("expires {}", slack_value(e)));
    }
    let mut blocks = vec![
        json!({"type": "section", "text": {"type": "mrkdwn", "text": text, "verbatim": true}}),
        json!({"type": "context", "elements": [
            {"type": "mrkdwn", "text": context.join(" · "), "verbatim": true}
        ]}),
    ];
    // The review console's page of the proposal: the gateway's own URL,
    // never an agent's text.
    if let Some(url) = f.get("review_url").and_then(Value::as_str) {
        blocks.push(json!({"type": "actions", "elements": [
            {"type": "button", "text": {"type": "plain_text", "text": "Review"}, "url": url, "action_id": "review"}
        ]}));
    }
    json!({ "text": text, "blocks": blocks })
}

/// The signature header's value for `body` sent at `timestamp` (unix
/// seconds): `v1=` and the hex HMAC-SHA256 under `secret` of
/// `"{timestamp}.{body}"`, the way Stripe and GitHub sign. The timestamp is
/// signed with the body, so a receiver that refuses old timestamps refuses
/// replays too.
pub fn signature(secret: &[u8], timestamp: i64, body: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    let tag = ring::hmac::sign(&key, format!("{timestamp}.{body}").as_bytes());
    format!("v1={}", hex::encode(tag.as_ref()))
}

/// The wait before attempt `attempts + 1`: one second doubled per attempt,
/// up to `max_ms`, less up to a fifth at random (so receivers that came
/// back are not hit by every gateway at once).
pub fn backoff_ms(attempts: u32, max_ms: i64, jitter: f64) -> i64 {
    let base = 1000i64.saturating_mul(1i64 << attempts.min(30));
    let capped = base.min(max_ms).max(1);
    capped - (capped as f64 * 0.2 * jitter.clamp(0.0, 1.0)) as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::config::Credential;

    fn hook(format: WebhookFormat) -> WebhookConfig {
        WebhookConfig {
            name: "ops".into(),
            url: "http://127.0.0.1:9/hook".into(),
            events: EventKind::ALL.to_vec(),
            tenants: vec!["acme".into()],
            format,
            secret: Credential::Literal("s".into()),
            include_arguments: false,
            redact: vec![],
            tls: None,
        }
    }

    fn event() -> Value {
        let mut f = Map::new();
        for (k, v) in [
            ("proposal_id", "p-1"),
            ("requester", "corp:alice"),
            ("client", "claude-code"),
            ("tenant", "acme"),
            ("server", "payments"),
            ("tool", "charge_card"),
            ("risk", "write"),
            ("call_digest", "sha256:aa"),
            ("command", "countersign show p-1"),
            ("expires_at", "2026-12-02T10:00:00Z"),
        ] {
            f.insert(k.into(), json!(v));
        }
        f.insert(
            "arguments".into(),
            json!({"account": "acct_1", "card": "4242"}),
        );
        let e = Event::incident(EventKind::ProposalCreated, Some("acme"), f);
        e.notices(&[hook(WebhookFormat::Json)], 0)[0].event.clone()
    }

    /// The operator's headline is made of argument values: it leads the
    /// sentence where the arguments go whole, and goes nowhere they don't
    /// (left out, or with a value redacted).
    #[test]
    fn the_headline_goes_only_where_the_arguments_go_whole() {
        let mut e = event();
        e["facts"]["headline"] = json!("Charge 4242 to acct_1");
        for fmt in [WebhookFormat::Json, WebhookFormat::Slack] {
            let mut w = hook(fmt);
            let b = body(&e, &w, b"s");
            assert!(!b.contains("4242") && !b.contains("Charge"), "{b}");
            w.include_arguments = true;
            w.redact = vec!["card".into()];
            let b = body(&e, &w, b"s");
            assert!(!b.contains("4242") && !b.contains("Charge"), "{b}");
            w.redact.clear();
            let b = body(&e, &w, b"s");
            assert!(
                b.contains("(write): Charge 4242 to acct_1: proposal p-1"),
                "{b}"
            );
        }
    }

    #[test]
    fn arguments_only_as_far_as_the_webhook_allows() {
        let e = event();
        let mut w = hook(WebhookFormat::Json);
        let b = body(&e, &w, b"s");
        assert!(!b.contains("acct_1") && !b.contains("4242"), "{b}");
        assert!(
            b.contains("corp:alice via claude-code of acme wants payments/charge_card (write)"),
            "{b}"
        );
        assert!(b.contains("countersign show p-1"), "{b}");
        w.include_arguments = true;
        w.redact = vec!["card".into()];
        let b = body(&e, &w, b"s");
        assert!(b.contains("acct_1") && !b.contains("4242"), "{b}");
        // Keyed: the value under this webhook's secret, which a plain hash
        // of a guessed card number does not give, and another secret does
        // not either.
        let tag = ring::hmac::sign(
            &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"s"),
            b"\"4242\"",
        );
        assert!(
            b.contains(&format!(
                "\"card\":\"hmac-sha256:{}\"",
                hex::encode(tag.as_ref())
            )),
            "{b}"
        );
        assert!(!body(&e, &w, b"other").contains(&hex::encode(tag.as_ref())));
        use sha2::Digest as _;
        assert!(
            !b.contains(&hex::encode(sha2::Sha256::digest(b"\"4242\""))),
            "{b}"
        );
    }

    #[test]
    fn a_slack_message_has_the_shape_of_an_incoming_webhook_payload() {
        let v: Value =
            serde_json::from_str(&body(&event(), &hook(WebhookFormat::Slack), b"s")).unwrap();
        // Incoming webhooks take `text` (required as the fallback when
        // blocks are given) and `blocks`; nothing else is sent.
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["blocks", "text"]);
        let text = v["text"].as_str().unwrap();
        assert!(text.contains("proposal p-1 waits for approval"), "{text}");
        let blocks = v["blocks"].as_array().unwrap();
        assert!(blocks.len() <= 50);
        assert_eq!(blocks[0]["type"], "section");
        assert_eq!(blocks[0]["text"]["type"], "mrkdwn");
        assert!(blocks[0]["text"]["text"].as_str().unwrap().len() <= 3000);
        assert_eq!(blocks[1]["type"], "context");
        let el = &blocks[1]["elements"][0];
        assert_eq!(el["type"], "mrkdwn");
        assert!(el["text"]
            .as_str()
            .unwrap()
            .contains("countersign show p-1"));
        assert!(!v.to_string().contains("acct_1"));
    }

    #[test]
    fn webhooks_get_the_kinds_and_tenants_they_want_under_one_id() {
        let mut other = hook(WebhookFormat::Json);
        other.name = "globex".into();
        other.tenants = vec!["globex".into()];
        let mut quiet = hook(WebhookFormat::Json);
        quiet.name = "quiet".into();
        quiet.tenants = vec![];
        quiet.events = vec![EventKind::CircuitOpen];
        let mut all = hook(WebhookFormat::Slack);
        all.name = "all".into();
        all.tenants = vec![];
        let hooks = [hook(WebhookFormat::Json), other, quiet, all];
        let e = Event::incident(EventKind::ProposalCreated, Some("acme"), Map::new());
        let n = e.notices(&hooks, 5);
        let names: Vec<&str> = n.iter().map(|n| n.webhook.as_str()).collect();
        assert_eq!(names, ["ops", "all"]);
        assert_eq!(n[0].id, n[1].id);
        assert!(n[0].id.starts_with("ev-"));
        let c = Event::incident(EventKind::CircuitOpen, None, Map::new()).notices(&hooks, 5);
        let names: Vec<&str> = c.iter().map(|n| n.webhook.as_str()).collect();
        assert_eq!(
            names,
            ["ops", "globex", "quiet", "all"],
            "no tenant: every webhook that wants it"
        );
    }

    #[test]
    fn the_signature_covers_the_timestamp_and_the_body() {
        // The HMAC-SHA256 test vector of RFC 4231, case 2, through the
        // same function: key "Jefe", message "what do ya want for nothing?".
        let tag = signature(b"Jefe", 0, "x");
        assert!(tag.starts_with("v1=") && tag.len() == 67, "{tag}");
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"Jefe");
        assert_eq!(
            hex::encode(ring::hmac::sign(&key, b"what do ya want for nothing?").as_ref()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_ne!(signature(b"k", 1, "body"), signature(b"k", 2, "body"));
        assert_ne!(signature(b"k", 1, "body"), signature(b"k", 1, "body "));
        assert_ne!(signature(b"k", 1, "body"), signature(b"j", 1, "body"));
    }

    #[test]
    fn backoff_doubles_to_its_cap_with_jitter_below_it() {
        assert_eq!(backoff_ms(0, 300_000, 0.0), 1000);
        assert_eq!(backoff_ms(3, 300_000, 0.0), 8000);
        assert_eq!(backoff_ms(30, 300_000, 0.0), 300_000);
        assert_eq!(backoff_ms(3, 300_000, 1.0), 6400);
    }
}
