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
/// written here from the date's arithmetic rather than through `time`'s
/// general formatter (553 instructions a stamp). It is the same text:
/// the fraction as `time` writes it (no trailing zeros, none when zero),
/// which `rfc3339_is_the_text_time_writes` checks against the crate.
pub fn rfc3339(ms: i64) -> String {
    // Years 0 to 9999 (every instant a gateway stamps); others as `time`
    // writes them.
    const FIRST: i64 = -62_167_219_200_000; // 0000-01-01T00:00:00Z
    const END: i64 = 253_402_300_800_000; // 10000-01-01T00:00:00Z
    if !(FIRST..END).contains(&ms) {
        return OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
            .ok()
            .and_then(|t| t.format(&Rfc3339).ok())
            .unwrap_or_default();
    }
    let days = ms.div_euclid(86_400_000);
    let in_day = ms.rem_euclid(86_400_000);
    let (year, month, day) = civil(days);
    let mut b = [0u8; 24];
    let mut put = |at: usize, n: i64, digits: usize| {
        let mut n = n;
        for i in (0..digits).rev() {
            b[at + i] = b'0' + (n % 10) as u8;
            n /= 10;
        }
    };
    put(0, year, 4);
    put(5, month, 2);
    put(8, day, 2);
    put(11, in_day / 3_600_000, 2);
    put(14, in_day / 60_000 % 60, 2);
    put(17, in_day / 1000 % 60, 2);
    let milli = in_day % 1000;
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

/// The proleptic Gregorian (year, month, day) of a count of days since
/// 1970-01-01 (the "civil from days" algorithm of Howard Hinnant's
/// date library: 400-year eras of 146,097 days, years counted from March).
fn civil(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
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
            -2_203_891_200_001,  // 1900-02-28T23:59:59.999 (1900 has no 29th)
            -2_203_891_200_000,  // 1900-03-01
            4_107_499_200_500,   // 2100-02-28T12:00:00.5
            4_107_542_400_000,   // 2100-03-01
            -62_035_891_200_000, // 0004-02-29
            -11_670_911_999_990, // 1600-03-01T00:00:00.01
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
