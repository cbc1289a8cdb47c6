//! Time in one place: unix milliseconds, RFC 3339 text, and the [`Clock`]
//! that the enforcement pipeline reads (so tests can move time by hand).

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    (OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// RFC 3339 (UTC, to the millisecond) of unix milliseconds. Milliseconds,
/// not seconds: an expiry rounded down to the second could be in the past
/// by the time a short approval reaches the gateway.
pub fn rfc3339(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_default()
}

/// RFC 3339 of now, to the nanosecond the system clock gives.
pub fn now_rfc3339() -> String {
    OffsetDateTime::now_utc()
        .format(&Rfc3339)
        .unwrap_or_default()
}

/// Unix milliseconds of an RFC 3339 time.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    OffsetDateTime::parse(text, &Rfc3339)
        .ok()
        .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64)
}

/// A duration in milliseconds, saturating at `i64::MAX`.
pub fn ms(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

/// Where the enforcement pipeline reads the time of day from (expiries,
/// retention). Timers and timeouts still run on tokio's clock.
pub trait Clock: Send + Sync {
    /// Unix milliseconds now.
    fn now_ms(&self) -> i64;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        now_ms()
    }
}

/// A clock that moves only when told to (tests).
#[derive(Debug)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    /// Starting at `ms`.
    pub fn new(ms: i64) -> ManualClock {
        ManualClock(AtomicI64::new(ms))
    }

    /// Move forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.0.fetch_add(ms(d), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_round_trips_milliseconds() {
        let ms = 1_796_033_537_855;
        let text = super::rfc3339(ms);
        assert_eq!(text, "2026-11-30T10:12:17.855Z");
        assert_eq!(super::parse_rfc3339(&text), Some(ms));
        assert_eq!(super::rfc3339(1_796_033_537_000), "2026-11-30T10:12:17Z");
    }
}
