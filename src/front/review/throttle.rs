//! Failed sign-ins and enrolment requests to the console, counted per
//! credential and per address in a window, so that a guesser is slowed
//! before any work is done. The counts are in the store: a guesser who
//! spreads attempts over several gateways behind one address is counted
//! once.

use std::time::Duration;

use crate::store::{Store, StoreError};

/// Failed attempts allowed per credential and per address in [`WINDOW`].
pub(crate) const FAILURES: u32 = 5;
const WINDOW: Duration = Duration::from_secs(300);

fn key_of(key: &str) -> String {
    format!("failures/{key}")
}

/// Whether `key` (`credential:ID`, `address:IP`, `enrol:IP`) may try again:
/// fewer than [`FAILURES`] in the window.
pub(crate) async fn allowed(store: &dyn Store, now_ms: i64, key: &str) -> Result<bool, StoreError> {
    let n = store.console_get(key_of(key), now_ms).await?;
    Ok(n.is_none_or(|n| n.parse::<u32>().is_ok_and(|n| n < FAILURES)))
}

/// Count one more failure of `key`. A count that cannot be recorded is
/// logged: the attempt was refused already.
pub(crate) async fn failed(store: &dyn Store, now_ms: i64, key: &str) {
    let window = crate::core::time::ms(WINDOW);
    if let Err(e) = store.console_count(key_of(key), window, now_ms).await {
        tracing::warn!("a failed console attempt could not be counted: {e}");
    }
}
