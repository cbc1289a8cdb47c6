//! Time in one place: unix milliseconds, RFC 3339 text, and the [`Clock`]
//! that the enforcement pipeline reads (so tests can move time by hand).

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    // From the system clock directly: `time`'s conversion to a calendar
    // date is not needed for a count of milliseconds.
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => ms(d),
        Err(before) => -ms(before.duration()),
    }
}

/// RFC 3339 (UTC, to the millisecond) of unix milliseconds. Milliseconds,
/// not seconds: an expiry rounded down to the second could be in the past
/// by the time a short approval reaches the gateway.
///
/// Every audit entry carries such a time (a read two), so the text is
/// written here from the calendar fields rather than through `time`'s
/// general formatter (553 instructions a stamp). It is the same text:
/// the fraction as `time` writes it (no trailing zeros, none when zero),
/// which `rfc3339_is_the_text_time_writes` checks against the crate.
pub fn rfc3339(ms: i64) -> String {
    let Ok(t) = OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000) else {
        return String::new();
    };
    if !(0..=9999).contains(&t.year()) {
        return t.format(&Rfc3339).unwrap_or_default();
    }
    let mut b = [0u8; 24];
    let mut put = |at: usize, n: u32, digits: usize| {
        let mut n = n;
        for i in (0..digits).rev() {
            b[at + i] = b'0' + (n % 10) as u8;
            n /= 10;
        }
    };
    put(0, t.year() as u32, 4);
    put(5, u8::from(t.month()) as u32, 2);
    put(8, t.day() as u32, 2);
    put(11, t.hour() as u32, 2);
    put(14, t.minute() as u32, 2);
    put(17, t.second() as u32, 2);
    let milli = t.millisecond() as u32;
    put(20, milli, 3);
    (b[4], b[7], b[10], b[13], b[16], b[19]) = (b'-', b'-', b'T', b':', b':', b'.');
    // The fraction without its trailing zeros, and without the point when
    // it is zero.
    let end = match milli {
        0 => 19,
        m if m % 100 == 0 => 21,
        m if m % 10 == 0 => 22,
        _ => 23,
    };
    let mut text = String::with_capacity(end + 1);
    text.push_str(std::str::from_utf8(&b[..end]).unwrap_or_default());
    text.push('Z');
    text
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

    /// The text `time`'s own RFC 3339 formatter writes for the same instant.
    fn by_time(ms: i64) -> String {
        use time::format_description::well_known::Rfc3339;
        time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
            .ok()
            .and_then(|t| t.format(&Rfc3339).ok())
            .unwrap_or_default()
    }

    #[test]
    fn rfc3339_is_the_text_time_writes_at_the_edges() {
        for ms in [
            0,
            1,
            10,
            100,
            120,
            999,
            -1,
            -86_400_000,
            951_782_400_000,     // 2000-02-29
            253_402_300_799_999, // 9999-12-31T23:59:59.999
            253_402_300_800_000, // year 10000: `time`'s own text
            -62_167_219_200_000, // 0000-01-01
            -62_167_219_200_001, // before year 0
        ] {
            assert_eq!(super::rfc3339(ms), by_time(ms), "{ms}");
        }
    }

    proptest::proptest! {
        #[test]
        fn rfc3339_is_the_text_time_writes(ms in -62_167_219_200_000i64..253_402_300_800_000) {
            proptest::prop_assert_eq!(super::rfc3339(ms), by_time(ms));
        }
    }
}
