//! The reviewer UI's state. `App::event` is the only thing that changes it
//! (keys, network results, clock ticks); drawing only reads it (`ui.rs`).
//! What the app wants done over the network comes back as [`Command`]s,
//! which `net.rs` performs and answers with [`Net`] events.

use std::collections::BTreeMap;

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use serde_json::Value;

/// The screens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// Proposals waiting for a decision.
    Pending,
    /// One proposal in full.
    Detail,
    /// `unknown` outcomes to reconcile.
    Outcomes,
    /// Decided proposals, newest first.
    History,
    /// The newest audit entries.
    Audit,
}

/// A prompt over the current view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Modal {
    /// Approve this proposal, with an optional reason and how long the
    /// approval stays usable (empty: the default TTL).
    Approve {
        /// The proposal.
        id: String,
        /// The reason being typed (optional; recorded with the approval).
        reason: String,
        /// The TTL being typed (`10m`, `1h`).
        ttl: String,
        /// Typing into the TTL (else the reason); Tab switches.
        on_ttl: bool,
    },
    /// Deny this proposal: the reason being typed.
    DenyReason(String, String),
    /// Reconcile outcome `index` as executed or not, with a note being typed.
    Reconcile {
        /// Index into the outcomes list.
        index: usize,
        /// Executed (true) or not executed.
        executed: bool,
        /// The note.
        note: String,
    },
}

/// The connection to the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Link {
    /// Not connected yet.
    Connecting,
    /// Receiving live events.
    Live,
    /// Lost; reconnecting.
    Lost(String),
}

/// What the network side reports.
#[derive(Debug, Clone)]
pub enum Net {
    /// Every proposal (after connecting).
    Snapshot(Vec<Value>),
    /// One proposal created or changed (event stream).
    Proposal(Value),
    /// The unknown outcomes.
    Outcomes(Vec<Value>),
    /// The audit tail.
    Audit(Vec<Value>),
    /// The event stream is live.
    Linked,
    /// The connection failed; retrying.
    Lost(String),
    /// A command succeeded.
    Done(String),
    /// A command failed; the gateway's message.
    Failed(String),
}

/// What happened.
#[derive(Debug, Clone)]
pub enum Input {
    /// A key press.
    Key(KeyEvent),
    /// From the network.
    Net(Net),
    /// The clock (unix ms), for ages and countdowns.
    Tick(i64),
}

/// What the app asks the network side to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Sign and submit an approval.
    Approve {
        /// The proposal.
        id: String,
        /// The reviewer's reason (may be empty).
        reason: String,
        /// How long the approval stays usable.
        ttl: std::time::Duration,
    },
    /// Sign and submit a denial.
    Deny(String, String),
    /// Settle an unknown outcome.
    Reconcile {
        /// Tenant.
        tenant: String,
        /// Principal.
        principal: String,
        /// Idempotency key.
        key: String,
        /// Executed or not.
        executed: bool,
        /// Note.
        note: String,
    },
    /// Reload the unknown outcomes.
    LoadOutcomes,
    /// Reload the audit tail.
    LoadAudit,
}

/// An approval's TTL when the reviewer types none (the CLI's default too).
pub const DEFAULT_TTL: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// The TTL typed in the approve prompt: empty means [`DEFAULT_TTL`].
fn parse_ttl(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(DEFAULT_TTL);
    }
    match humantime::parse_duration(text) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err("the TTL must be longer than zero".into()),
        Err(e) => Err(format!("TTL `{text}`: {e} (for example 10m or 1h)")),
    }
}

/// The whole UI state.
#[derive(Debug)]
pub struct App {
    /// Now (unix ms), from the last tick.
    pub now_ms: i64,
    /// The reviewer's name.
    pub reviewer: String,
    /// The gateway URL.
    pub gateway: String,
    /// The current screen.
    pub view: View,
    /// Every proposal seen, by id.
    pub proposals: BTreeMap<String, Value>,
    /// Selected row of the current list.
    pub selected: usize,
    /// The proposal shown in Detail.
    pub detail: Option<String>,
    /// Detail shows the raw canonical JSON.
    pub raw: bool,
    /// Unknown outcomes.
    pub outcomes: Vec<Value>,
    /// Audit tail.
    pub audit: Vec<Value>,
    /// An open prompt.
    pub modal: Option<Modal>,
    /// The last result to show: (text, is an error).
    pub status: Option<(String, bool)>,
    /// The connection.
    pub link: Link,
    /// Leave.
    pub quit: bool,
}

fn str_of<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

impl App {
    /// A fresh app.
    pub fn new(reviewer: &str, gateway: &str, now_ms: i64) -> App {
        App {
            now_ms,
            reviewer: reviewer.into(),
            gateway: gateway.into(),
            view: View::Pending,
            proposals: BTreeMap::new(),
            selected: 0,
            detail: None,
            raw: false,
            outcomes: Vec::new(),
            audit: Vec::new(),
            modal: None,
            status: None,
            link: Link::Connecting,
            quit: false,
        }
    }

    /// Pending proposals in the queue's order: the one that expires first
    /// first, as `countersign pending` and the console list them.
    pub fn pending(&self) -> Vec<&Value> {
        let mut v: Vec<&Value> = self
            .proposals
            .values()
            .filter(|p| str_of(p, "state") == "pending")
            .collect();
        v.sort_by_key(|p| countersign::core::approval::queue_key(p));
        v
    }

    /// Decided proposals, newest change first.
    pub fn history(&self) -> Vec<&Value> {
        let mut v: Vec<&Value> = self
            .proposals
            .values()
            .filter(|p| str_of(p, "state") != "pending")
            .collect();
        v.sort_by_key(|p| std::cmp::Reverse(p["updated_ms"].as_i64().unwrap_or(0)));
        v
    }

    /// A possible duplicate: the same call by the same requester already
    /// approved or run, or the same call pending from someone else.
    pub fn possible_duplicate(&self, p: &Value) -> Option<String> {
        let id = str_of(p, "id");
        let digest = str_of(p, "call_digest");
        self.proposals.values().find_map(|o| {
            if str_of(o, "id") == id || str_of(o, "call_digest") != digest {
                return None;
            }
            let same_requester = str_of(o, "requester") == str_of(p, "requester")
                && str_of(o, "tenant") == str_of(p, "tenant");
            match str_of(o, "state") {
                "approved" | "consumed" if same_requester => Some(format!(
                    "the same call was {} as {}",
                    str_of(o, "state"),
                    str_of(o, "id")
                )),
                "pending" if !same_requester => Some(format!(
                    "{} asks for the same call ({})",
                    str_of(o, "requester"),
                    str_of(o, "id")
                )),
                _ => None,
            }
        })
    }

    fn list_len(&self) -> usize {
        match self.view {
            View::Pending => self.pending().len(),
            View::History => self.history().len(),
            View::Outcomes => self.outcomes.len(),
            View::Audit => self.audit.len(),
            View::Detail => 0,
        }
    }

    fn selected_pending(&self) -> Option<String> {
        match self.view {
            View::Detail => self.detail.clone(),
            View::Pending => self
                .pending()
                .get(self.selected)
                .map(|p| str_of(p, "id").to_owned()),
            _ => None,
        }
    }

    /// Handle one input; return what to do over the network.
    pub fn event(&mut self, input: Input) -> Vec<Command> {
        match input {
            Input::Tick(now) => {
                self.now_ms = now;
                Vec::new()
            }
            Input::Net(n) => {
                self.net(n);
                Vec::new()
            }
            Input::Key(k) => self.key(k),
        }
    }

    fn net(&mut self, n: Net) {
        match n {
            Net::Snapshot(all) => {
                self.proposals = all
                    .into_iter()
                    .map(|p| (str_of(&p, "id").to_owned(), p))
                    .collect();
            }
            Net::Proposal(p) => {
                let id = str_of(&p, "id").to_owned();
                self.proposals.insert(id, p);
            }
            Net::Outcomes(o) => self.outcomes = o,
            Net::Audit(a) => self.audit = a,
            Net::Linked => self.link = Link::Live,
            Net::Lost(e) => self.link = Link::Lost(e),
            Net::Done(m) => self.status = Some((m, false)),
            Net::Failed(m) => self.status = Some((m, true)),
        }
        let len = self.list_len();
        if self.selected >= len {
            self.selected = len.saturating_sub(1);
        }
    }

    fn key(&mut self, k: KeyEvent) -> Vec<Command> {
        if k.modifiers.contains(KeyModifiers::CONTROL) && k.code == KeyCode::Char('c') {
            self.quit = true;
            return Vec::new();
        }
        if let Some(modal) = self.modal.take() {
            return self.modal_key(modal, k);
        }
        match k.code {
            KeyCode::Char('q') => self.quit = true,
            KeyCode::Char('1') => self.show(View::Pending),
            KeyCode::Char('2') => {
                self.show(View::Outcomes);
                return vec![Command::LoadOutcomes];
            }
            KeyCode::Char('3') => self.show(View::History),
            KeyCode::Char('4') => {
                self.show(View::Audit);
                return vec![Command::LoadAudit];
            }
            KeyCode::Esc if self.view == View::Detail => {
                self.view = View::Pending;
                self.raw = false;
            }
            KeyCode::Up | KeyCode::Char('k') => self.selected = self.selected.saturating_sub(1),
            KeyCode::Down | KeyCode::Char('j') if self.selected + 1 < self.list_len() => {
                self.selected += 1;
            }
            KeyCode::Enter if self.view == View::Pending => {
                if let Some(id) = self.selected_pending() {
                    self.detail = Some(id);
                    self.view = View::Detail;
                }
            }
            KeyCode::Char('v') if self.view == View::Detail => self.raw = !self.raw,
            KeyCode::Char('a') => {
                if let Some(id) = self.selected_pending() {
                    self.modal = Some(Modal::Approve {
                        id,
                        reason: String::new(),
                        ttl: String::new(),
                        on_ttl: false,
                    });
                }
            }
            KeyCode::Char('d') => {
                if let Some(id) = self.selected_pending() {
                    self.modal = Some(Modal::DenyReason(id, String::new()));
                }
            }
            KeyCode::Char(c @ ('e' | 'n'))
                if self.view == View::Outcomes && self.selected < self.outcomes.len() =>
            {
                self.modal = Some(Modal::Reconcile {
                    index: self.selected,
                    executed: c == 'e',
                    note: String::new(),
                });
            }
            KeyCode::Char('r') => {
                return match self.view {
                    View::Outcomes => vec![Command::LoadOutcomes],
                    View::Audit => vec![Command::LoadAudit],
                    _ => Vec::new(),
                }
            }
            _ => {}
        }
        Vec::new()
    }

    fn show(&mut self, v: View) {
        self.view = v;
        self.selected = 0;
        self.raw = false;
    }

    fn modal_key(&mut self, modal: Modal, k: KeyEvent) -> Vec<Command> {
        match modal {
            Modal::Approve {
                id,
                mut reason,
                mut ttl,
                mut on_ttl,
            } => {
                match k.code {
                    KeyCode::Esc => return Vec::new(),
                    KeyCode::Enter => match parse_ttl(&ttl) {
                        Ok(ttl) => {
                            self.status = Some((format!("approving {id}…"), false));
                            return vec![Command::Approve {
                                id,
                                reason: reason.trim().to_owned(),
                                ttl,
                            }];
                        }
                        Err(e) => self.status = Some((e, true)),
                    },
                    KeyCode::Tab | KeyCode::BackTab => on_ttl = !on_ttl,
                    KeyCode::Backspace => {
                        if on_ttl { &mut ttl } else { &mut reason }.pop();
                    }
                    KeyCode::Char(c) => {
                        if on_ttl { &mut ttl } else { &mut reason }.push(c);
                    }
                    _ => {}
                }
                self.modal = Some(Modal::Approve {
                    id,
                    reason,
                    ttl,
                    on_ttl,
                });
                Vec::new()
            }
            Modal::DenyReason(id, mut text) => match k.code {
                KeyCode::Esc => Vec::new(),
                KeyCode::Enter if !text.trim().is_empty() => {
                    self.status = Some((format!("denying {id}…"), false));
                    vec![Command::Deny(id, text.trim().to_owned())]
                }
                KeyCode::Backspace => {
                    text.pop();
                    self.modal = Some(Modal::DenyReason(id, text));
                    Vec::new()
                }
                KeyCode::Char(c) => {
                    text.push(c);
                    self.modal = Some(Modal::DenyReason(id, text));
                    Vec::new()
                }
                _ => {
                    // Enter without a reason: a denial needs one.
                    self.modal = Some(Modal::DenyReason(id, text));
                    Vec::new()
                }
            },
            Modal::Reconcile {
                index,
                executed,
                mut note,
            } => match k.code {
                KeyCode::Esc => Vec::new(),
                KeyCode::Enter => match self.outcomes.get(index) {
                    Some(o) => vec![Command::Reconcile {
                        tenant: str_of(o, "tenant").into(),
                        principal: str_of(o, "principal").into(),
                        key: str_of(o, "key").into(),
                        executed,
                        note,
                    }],
                    None => Vec::new(),
                },
                KeyCode::Backspace => {
                    note.pop();
                    self.modal = Some(Modal::Reconcile {
                        index,
                        executed,
                        note,
                    });
                    Vec::new()
                }
                KeyCode::Char(c) => {
                    note.push(c);
                    self.modal = Some(Modal::Reconcile {
                        index,
                        executed,
                        note,
                    });
                    Vec::new()
                }
                _ => {
                    self.modal = Some(Modal::Reconcile {
                        index,
                        executed,
                        note,
                    });
                    Vec::new()
                }
            },
        }
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use ratatui::crossterm::event::KeyEventKind;
    use serde_json::json;

    pub fn key(c: KeyCode) -> Input {
        Input::Key(KeyEvent {
            code: c,
            modifiers: KeyModifiers::NONE,
            kind: KeyEventKind::Press,
            state: ratatui::crossterm::event::KeyEventState::NONE,
        })
    }

    pub fn proposal(id: &str, state: &str, created_ms: i64, amount: i64) -> Value {
        json!({
            "id": id, "state": state, "created_ms": created_ms, "updated_ms": created_ms,
            "server": "payments", "tool": "charge_card",
            "arguments": {"account": "acct_42", "amount": amount, "currency": "EUR", "meta": {"note": "x"}},
            "call_digest": format!("sha256:{amount:064}"), "requester": "agent-7", "tenant": "acme",
            "resource_version": "v1", "risk": "write", "policies": ["default/writes-need-approval"],
            "revises": null, "joined": 0, "decision": null, "expires_ms": null, "consumed_by": null,
            "reason": null, "pending_expires_ms": created_ms + 86_400_000,
            "summary": format!("agent-7 of acme wants payments/charge_card (a write) with account acct_42, amount {amount}, currency EUR"),
        })
    }

    pub fn app() -> App {
        let mut a = App::new("alice", "http://127.0.0.1:7373", 1_000_000);
        a.event(Input::Net(Net::Snapshot(vec![
            proposal("p-1", "pending", 900_000, 120),
            proposal("p-2", "pending", 940_000, 80),
            proposal("p-0", "consumed", 100_000, 80),
        ])));
        a.event(Input::Net(Net::Linked));
        a
    }

    #[test]
    fn the_queue_puts_the_one_that_expires_first_first_and_live_events_update_it() {
        let mut a = app();
        let ids: Vec<&str> = a.pending().iter().map(|p| str_of(p, "id")).collect();
        assert_eq!(ids, ["p-1", "p-2"]);
        a.event(Input::Net(Net::Proposal(proposal(
            "p-1", "approved", 900_000, 120,
        ))));
        assert_eq!(a.pending().len(), 1);
        assert_eq!(a.history().len(), 2);
        assert!(a
            .possible_duplicate(a.pending()[0])
            .unwrap()
            .contains("p-0"));
    }

    #[test]
    fn approve_takes_a_reason_and_ttl_and_deny_needs_a_reason() {
        let mut a = app();
        assert!(a.event(key(KeyCode::Char('a'))).is_empty());
        assert!(matches!(&a.modal, Some(Modal::Approve { id, .. }) if id == "p-1"));
        // A reason, then Tab to the TTL.
        for c in "ticket 42".chars() {
            assert!(a.event(key(KeyCode::Char(c))).is_empty(), "typing asks on");
        }
        a.event(key(KeyCode::Tab));
        for c in "5x".chars() {
            a.event(key(KeyCode::Char(c)));
        }
        // A TTL that does not parse keeps the prompt and says why.
        assert!(a.event(key(KeyCode::Enter)).is_empty());
        assert!(a
            .status
            .as_ref()
            .is_some_and(|(t, err)| *err && t.contains("5x")));
        assert!(a.modal.is_some());
        a.event(key(KeyCode::Backspace));
        a.event(key(KeyCode::Char('m')));
        assert_eq!(
            a.event(key(KeyCode::Enter)),
            vec![Command::Approve {
                id: "p-1".into(),
                reason: "ticket 42".into(),
                ttl: std::time::Duration::from_secs(300),
            }]
        );
        assert_eq!(a.modal, None);
        // Nothing typed: no reason, the default TTL.
        a.event(key(KeyCode::Char('a')));
        assert_eq!(
            a.event(key(KeyCode::Enter)),
            vec![Command::Approve {
                id: "p-1".into(),
                reason: String::new(),
                ttl: DEFAULT_TTL,
            }]
        );

        a.event(key(KeyCode::Down));
        a.event(key(KeyCode::Char('d')));
        assert!(a.event(key(KeyCode::Enter)).is_empty(), "no empty reason");
        for c in "dup".chars() {
            a.event(key(KeyCode::Char(c)));
        }
        a.event(key(KeyCode::Backspace));
        a.event(key(KeyCode::Char('p')));
        assert_eq!(
            a.event(key(KeyCode::Enter)),
            vec![Command::Deny("p-2".into(), "dup".into())]
        );
        // Escape cancels without a command.
        a.event(key(KeyCode::Char('a')));
        assert!(a.event(key(KeyCode::Esc)).is_empty());
        assert_eq!(a.modal, None);
    }

    #[test]
    fn views_switch_and_load_what_they_show() {
        let mut a = app();
        a.event(key(KeyCode::Enter));
        assert_eq!((a.view, a.detail.as_deref()), (View::Detail, Some("p-1")));
        a.event(key(KeyCode::Char('v')));
        assert!(a.raw);
        a.event(key(KeyCode::Esc));
        assert_eq!(a.view, View::Pending);
        assert_eq!(
            a.event(key(KeyCode::Char('2'))),
            vec![Command::LoadOutcomes]
        );
        a.event(Input::Net(Net::Outcomes(vec![
            json!({"tenant":"acme","principal":"agent-7","key":"k-9"}),
        ])));
        a.event(key(KeyCode::Char('e')));
        a.event(key(KeyCode::Char('o')));
        a.event(key(KeyCode::Char('k')));
        assert_eq!(
            a.event(key(KeyCode::Enter)),
            vec![Command::Reconcile {
                tenant: "acme".into(),
                principal: "agent-7".into(),
                key: "k-9".into(),
                executed: true,
                note: "ok".into()
            }]
        );
        assert_eq!(a.event(key(KeyCode::Char('4'))), vec![Command::LoadAudit]);
        a.event(key(KeyCode::Char('q')));
        assert!(a.quit);
    }

    #[test]
    fn a_lost_link_and_failures_are_shown_not_fatal() {
        let mut a = app();
        a.event(Input::Net(Net::Lost("connection refused".into())));
        assert_eq!(a.link, Link::Lost("connection refused".into()));
        a.event(Input::Net(Net::Failed(
            "proposal `p-1` is approved, not pending".into(),
        )));
        assert_eq!(a.status.as_ref().map(|s| s.1), Some(true));
        a.event(Input::Net(Net::Linked));
        assert_eq!(a.link, Link::Live);
    }
}
