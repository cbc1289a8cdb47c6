//! Outcome classification, retry backoff and the circuit breaker
//! (DESIGN.md section 5). Pure: time is passed in.
//!
//! Classification, in one place:
//! - **not dispatched** (safe to send again): spawn or connect failed, the
//!   upstream refused with 401/403 before processing, the circuit is open,
//!   the server answered `-32700/-32600/-32601/-32602`, or the upstream
//!   answered 404 for its session (the request was refused unprocessed; the
//!   call that was in flight when the session died is the one that is lost);
//! - **possibly executed**: the child exited, the connection dropped
//!   mid-response, `call_timeout` elapsed, any other failure after the request
//!   was written.
//!
//! Only read-only tools are retried after a possibly-executed failure.

use std::time::{Duration, Instant};

use crate::wire::jsonrpc::Message;

/// How an upstream failure classes, as far as retries and the breaker care.
/// Transports say which class each of their errors is in; this module
/// decides what each class means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The upstream could not be reached (spawn or connect failed, the
    /// connection was already closed): nothing was sent, and the upstream
    /// looks unhealthy.
    Unreachable,
    /// The upstream refused the request unprocessed (HTTP 401/403, or 404
    /// for its session): nothing ran, and the upstream itself is answering.
    Refused,
    /// The request was written and its answer was lost (the child exited,
    /// the connection dropped mid-response, `call_timeout` elapsed).
    Lost,
}

/// What a server's JSON-RPC answer means for a retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResponseClass {
    /// A result (error or not): the final answer.
    Answer,
    /// Refused unprocessed (`-32700/-32600/-32601/-32602`): not dispatched.
    Refused,
    /// `-32603` or `-32000..-32099`: a transient server error, worth a retry
    /// for read-only tools.
    Transient,
    /// `-32800` (request cancelled): the server may have run the call before
    /// it saw the cancellation, so for a write the outcome is unknown.
    Cancelled,
}

/// Classify a server's answer.
pub(crate) fn classify_response(resp: &Message) -> ResponseClass {
    match resp.error_code() {
        Some(-32700 | -32600 | -32601 | -32602) => ResponseClass::Refused,
        Some(-32603) | Some(-32099..=-32000) => ResponseClass::Transient,
        Some(-32800) => ResponseClass::Cancelled,
        _ => ResponseClass::Answer,
    }
}

impl Failure {
    /// Whether a failed call may have run upstream.
    pub fn possibly_executed(self) -> bool {
        self == Failure::Lost
    }

    /// Whether the failure says the upstream is unhealthy (counts for the
    /// breaker).
    pub fn unhealthy(self) -> bool {
        self != Failure::Refused
    }
}

/// Capped exponential backoff with full jitter.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// Delay before the second attempt (before jitter).
    pub base: Duration,
    /// Largest delay.
    pub max: Duration,
}

impl Backoff {
    /// Delay before attempt `attempt` (2 = the first retry), with `jitter`
    /// in `[0, 1)`: uniform in `[0, min(max, base·2^(attempt-2))]`.
    pub(crate) fn delay(&self, attempt: u32, jitter: f64) -> Duration {
        let exp = attempt.saturating_sub(2).min(20);
        let cap = self.base.saturating_mul(1u32 << exp).min(self.max);
        cap.mul_f64(jitter.clamp(0.0, 1.0))
    }
}

/// What the breaker lets through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Closed: go.
    Go,
    /// Half-open: this call is the one trial.
    Trial,
    /// Open: refuse fast, nothing is sent.
    Refuse,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BreakerState {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { trial_out: bool },
}

/// A circuit breaker for one upstream.
#[derive(Debug, Clone)]
pub(crate) struct Breaker {
    threshold: u32,
    cooldown: Duration,
    state: BreakerState,
}

impl Breaker {
    /// Opens after `threshold` consecutive failures, for `cooldown`.
    pub(crate) fn new(threshold: u32, cooldown: Duration) -> Breaker {
        Breaker {
            threshold: threshold.max(1),
            cooldown,
            state: BreakerState::Closed { failures: 0 },
        }
    }

    /// May a call go now?
    pub(crate) fn admit(&mut self, now: Instant) -> Admission {
        match self.state {
            BreakerState::Closed { .. } => Admission::Go,
            BreakerState::Open { until } if now < until => Admission::Refuse,
            BreakerState::Open { .. } | BreakerState::HalfOpen { trial_out: false } => {
                self.state = BreakerState::HalfOpen { trial_out: true };
                Admission::Trial
            }
            BreakerState::HalfOpen { trial_out: true } => Admission::Refuse,
        }
    }

    /// The upstream answered.
    pub(crate) fn success(&mut self) {
        self.state = BreakerState::Closed { failures: 0 };
    }

    /// The upstream failed.
    pub(crate) fn failure(&mut self, now: Instant) {
        self.state = match self.state {
            BreakerState::Closed { failures } if failures + 1 < self.threshold => {
                BreakerState::Closed {
                    failures: failures + 1,
                }
            }
            _ => BreakerState::Open {
                until: now + self.cooldown,
            },
        };
    }

    /// A trial that was admitted but never reached the upstream (the
    /// ledger answered, a policy refused, the store failed): give the slot
    /// back, so the next call can be the trial. Without this a breaker
    /// stays half-open with its one trial out, refusing everything.
    pub(crate) fn release(&mut self) {
        if self.state == (BreakerState::HalfOpen { trial_out: true }) {
            self.state = BreakerState::HalfOpen { trial_out: false };
        }
    }

    /// Whether calls are being refused.
    pub(crate) fn is_open(&self, now: Instant) -> bool {
        matches!(self.state, BreakerState::Open { until } if now < until)
    }

    /// `closed`, `open` or `half-open`, for logs and `/healthz`.
    pub(crate) fn state_name(&self, now: Instant) -> &'static str {
        match self.state {
            BreakerState::Closed { .. } => "closed",
            BreakerState::Open { until } if now < until => "open",
            BreakerState::Open { .. } | BreakerState::HalfOpen { .. } => "half-open",
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_released_trial_lets_the_next_call_be_the_trial() {
        let t0 = std::time::Instant::now();
        let mut b = super::Breaker::new(1, std::time::Duration::from_secs(1));
        b.failure(t0);
        let later = t0 + std::time::Duration::from_secs(2);
        assert_eq!(b.admit(later), super::Admission::Trial);
        assert_eq!(
            b.admit(later),
            super::Admission::Refuse,
            "one trial at a time"
        );
        b.release();
        assert_eq!(
            b.admit(later),
            super::Admission::Trial,
            "the slot came back"
        );
        b.success();
        assert_eq!(b.state_name(later), "closed");
    }

    use super::*;
    use crate::wire::jsonrpc::raw;
    use serde_json::{json, Value};

    #[test]
    fn response_classes() {
        let err = |code: i64| Message::error(Value::from(1), code, "x", None);
        assert_eq!(classify_response(&err(-32602)), ResponseClass::Refused);
        assert_eq!(classify_response(&err(-32601)), ResponseClass::Refused);
        assert_eq!(classify_response(&err(-32603)), ResponseClass::Transient);
        assert_eq!(classify_response(&err(-32001)), ResponseClass::Transient);
        assert_eq!(classify_response(&err(-32099)), ResponseClass::Transient);
        assert_eq!(classify_response(&err(-32100)), ResponseClass::Answer);
        assert_eq!(classify_response(&err(1)), ResponseClass::Answer);
        let ok = Message::response(Value::from(1), raw(&json!({"isError": true})));
        assert_eq!(
            classify_response(&ok),
            ResponseClass::Answer,
            "isError is an answer"
        );
    }

    #[test]
    fn backoff_is_capped_and_jittered() {
        let b = Backoff {
            max_attempts: 5,
            base: Duration::from_millis(100),
            max: Duration::from_millis(300),
        };
        assert_eq!(b.delay(2, 0.999_999).as_millis(), 99);
        assert_eq!(b.delay(3, 0.5), Duration::from_millis(100));
        assert_eq!(b.delay(4, 0.999_999).as_millis(), 299, "capped at max");
        assert_eq!(b.delay(30, 0.5), Duration::from_millis(150));
        assert_eq!(b.delay(2, 0.0), Duration::ZERO);
    }

    #[test]
    fn breaker_opens_refuses_and_half_opens() {
        let t0 = Instant::now();
        let mut b = Breaker::new(3, Duration::from_secs(10));
        b.failure(t0);
        b.failure(t0);
        assert_eq!(b.admit(t0), Admission::Go);
        b.failure(t0);
        assert_eq!(b.admit(t0), Admission::Refuse);
        assert!(b.is_open(t0));
        let later = t0 + Duration::from_secs(11);
        assert_eq!(b.admit(later), Admission::Trial);
        assert_eq!(b.admit(later), Admission::Refuse, "one trial at a time");
        b.failure(later);
        assert_eq!(b.admit(later), Admission::Refuse, "a failed trial reopens");
        let much_later = later + Duration::from_secs(11);
        assert_eq!(b.admit(much_later), Admission::Trial);
        b.success();
        assert_eq!(b.admit(much_later), Admission::Go);
        // Success resets the count.
        b.failure(much_later);
        b.failure(much_later);
        b.success();
        b.failure(much_later);
        assert_eq!(b.admit(much_later), Admission::Go);
    }
}
