//! Failed sign-ins to the console, counted per credential and per address
//! in a window, so that a guesser is slowed before any work is done.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Failed sign-ins allowed per credential and per address in [`WINDOW`].
const FAILURES: u32 = 5;
const WINDOW: Duration = Duration::from_secs(300);

/// Failed sign-ins, by `credential:ID` and `address:IP`.
#[derive(Default)]
pub(crate) struct Failures(Mutex<HashMap<String, (u32, Instant)>>);

impl Failures {
    /// Whether `key` may try again.
    pub(crate) fn allowed(&self, key: &str) -> bool {
        self.0
            .lock()
            .get(key)
            .is_none_or(|(n, since)| *n < FAILURES || since.elapsed() >= WINDOW)
    }

    pub(crate) fn failed(&self, key: &str) {
        let mut all = self.0.lock();
        // Many addresses failing once each must not grow this without bound:
        // entries whose window has passed say nothing any more.
        if all.len() >= 4096 {
            all.retain(|_, (_, since)| since.elapsed() < WINDOW);
        }
        let entry = all.entry(key.to_owned()).or_insert((0, Instant::now()));
        if entry.1.elapsed() >= WINDOW {
            *entry = (0, Instant::now());
        }
        entry.0 += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::{Failures, FAILURES};

    #[test]
    fn a_credential_or_address_is_refused_after_its_failures_and_others_are_not() {
        let f = Failures::default();
        for _ in 0..FAILURES - 1 {
            f.failed("credential:a");
        }
        assert!(f.allowed("credential:a"), "below the limit");
        f.failed("credential:a");
        assert!(!f.allowed("credential:a"), "at the limit");
        assert!(
            f.allowed("credential:b"),
            "another credential is unaffected"
        );
        assert!(
            f.allowed("address:192.0.2.1"),
            "an address is counted apart"
        );
    }
}
