//! The circuit breakers as a service: one per configured server, asked
//! before anything is reserved ([`Breakers::is_open`]) and right before
//! the upstream ([`Breakers::admit`]), told how the attempt went through
//! the [`Admitted`] leave it hands out.
//!
//! The rules of one breaker are [`crate::core::recovery::Breaker`]'s; this
//! service owns the breakers, their clock and the log of their changes.

use std::collections::BTreeMap;
use std::time::Instant;

use parking_lot::Mutex;

use crate::core::config::Config;
use crate::core::recovery::{Admission, Breaker};

/// One circuit breaker per configured server. A blocking mutex each: held
/// for a state change, never across an await.
pub(crate) struct Breakers {
    by_server: crate::core::FastMap<String, Mutex<Breaker>>,
    /// Tells the webhooks of circuits that open.
    announcer: Option<std::sync::Arc<super::announce::Announcer>>,
}

impl Breakers {
    /// A closed breaker for every server of `config`.
    pub(crate) fn new(config: &Config) -> Breakers {
        let by_server = config
            .servers
            .keys()
            .map(|k| {
                let b = Breaker::new(config.circuit.failure_threshold, config.circuit.cooldown);
                (k.clone(), Mutex::new(b))
            })
            .collect();
        Breakers {
            by_server,
            announcer: None,
        }
    }

    /// The same breakers, telling `announcer` when a circuit opens.
    pub(crate) fn announcing(
        mut self,
        announcer: std::sync::Arc<super::announce::Announcer>,
    ) -> Breakers {
        self.announcer = Some(announcer);
        self
    }

    /// Each server's state: `closed`, `open` or `half-open`.
    pub(crate) fn states(&self) -> BTreeMap<String, &'static str> {
        let now = now();
        self.by_server
            .iter()
            .map(|(server, b)| (server.clone(), b.lock().state_name(now)))
            .collect()
    }

    /// The fast check, before anything is reserved: is `server`'s circuit
    /// open? Takes no trial.
    pub(crate) fn is_open(&self, server: &str) -> bool {
        self.by_server
            .get(server)
            .is_some_and(|b| b.lock().is_open(now()))
    }

    /// The admission, right before the upstream (`None`: the circuit
    /// refuses). The trial of a half-open circuit is taken here and only
    /// here, so that a call the ledger or the gate answered never uses it.
    pub(crate) fn admit<'a>(&'a self, server: &'a str) -> Option<Admitted<'a>> {
        let announcer = self.announcer.as_deref();
        let Some(breaker) = self.by_server.get(server) else {
            return Some(Admitted {
                server,
                breaker: None,
                trial: false,
                announcer,
            });
        };
        let admission = change(server, breaker, announcer, |b| b.admit(now()));
        (admission != Admission::Refuse).then_some(Admitted {
            server,
            breaker: Some(breaker),
            trial: admission == Admission::Trial,
            announcer,
        })
    }
}

/// The breakers' clock: tokio's, so that a test with a paused runtime can
/// move a cooldown along without waiting for it.
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Change a breaker, logging the change of state it makes (every one).
fn change<T>(
    server: &str,
    breaker: &Mutex<Breaker>,
    announcer: Option<&super::announce::Announcer>,
    f: impl FnOnce(&mut Breaker) -> T,
) -> T {
    let now = now();
    let mut b = breaker.lock();
    let before = b.state_name(now);
    let out = f(&mut b);
    let after = b.state_name(now);
    drop(b);
    if before != after {
        tracing::warn!(server, from = before, to = after, "circuit breaker");
        if let (Some(a), "open") = (announcer, after) {
            let mut facts = serde_json::Map::new();
            facts.insert("server".into(), serde_json::json!(server));
            facts.insert("from".into(), serde_json::json!(before));
            facts.insert(
                "reason".into(),
                serde_json::json!(format!("too many failures while {before}")),
            );
            a.incident(crate::core::config::EventKind::CircuitOpen, None, facts);
        }
    }
    out
}

/// The breaker's leave for one attempt to reach the upstream. It records
/// how the attempt went; dropped without a record (the attempt never
/// reached the upstream, or failed in a way that says nothing of its
/// health), a trial gives its slot back, so the breaker never stays
/// half-open with a trial nobody will finish.
pub(crate) struct Admitted<'a> {
    server: &'a str,
    breaker: Option<&'a Mutex<Breaker>>,
    trial: bool,
    announcer: Option<&'a super::announce::Announcer>,
}

impl Admitted<'_> {
    /// How the attempt went: `ok` closes a half-open circuit, a failure
    /// counts towards opening it.
    pub(crate) fn record(mut self, ok: bool) {
        if let Some(b) = self.breaker.take() {
            change(self.server, b, self.announcer, |b| {
                if ok {
                    b.success();
                } else {
                    b.failure(now());
                }
            });
        }
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        if let (true, Some(b)) = (self.trial, self.breaker) {
            change(self.server, b, self.announcer, Breaker::release);
        }
    }
}
