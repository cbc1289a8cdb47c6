//! The retry loop of a dispatch: what one attempt ended with, the pause
//! before the next (`retry.*`: capped exponential backoff with jitter), an
//! upstream failure counted by the circuit breaker. A write is tried again
//! only when it is proven not to have run; a read whenever it failed.

use std::time::Duration;

use super::breakers::Admitted;
use super::outcome::CallOutcome;
use super::upstream::UpstreamError;
use crate::core::config::RetryConfig;
use crate::core::recovery::Backoff;

/// What one attempt ended with.
pub(crate) enum Attempt {
    /// Final.
    Done(CallOutcome),
    /// Proven not run (or a read): try again if attempts remain.
    Retry(CallOutcome),
}

/// After an attempt: the outcome to give, or `None` after pausing when a
/// retry is due (`retry.*`: capped exponential backoff with jitter).
pub(crate) async fn next_attempt(
    cfg: &RetryConfig,
    server: &str,
    result: Attempt,
    attempt: &mut u32,
) -> Option<CallOutcome> {
    let backoff = Backoff {
        max_attempts: cfg.max_attempts,
        base: cfg.base_delay,
        max: cfg.max_delay,
    };
    match result {
        Attempt::Done(o) => Some(o),
        Attempt::Retry(o) if *attempt >= backoff.max_attempts => Some(o),
        Attempt::Retry(_) => {
            *attempt += 1;
            let pause: Duration = backoff.delay(*attempt, rand::random::<f64>());
            tracing::info!(server, attempt = *attempt, pause = %humantime::format_duration(pause), "retrying a call that is safe to retry");
            tokio::time::sleep(pause).await;
            None
        }
    }
}

/// An upstream failure, counted by the breaker when it says the
/// upstream is unhealthy (otherwise the admission is returned unused).
pub(crate) fn failed(server: &str, e: UpstreamError, admitted: Admitted<'_>) -> CallOutcome {
    if e.class().unhealthy() {
        admitted.record(false);
    }
    tracing::warn!(
        server,
        dispatched = e.dispatched(),
        "upstream call failed: {e}"
    );
    CallOutcome::Failed(e)
}

#[track_caller]
pub(crate) fn unreachable_hold() -> ! {
    // INVARIANT: a read's permit comes back as a read, a write's as a write;
    // the pipeline builds both, and the upstream can only hand them back.
    unreachable!("a ledger hold came back of the other kind")
}
