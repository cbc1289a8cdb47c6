//! Refusals at the door: what the fronts turn away before anything runs
//! (a `tools/call` without an id, a foreign origin, a forged token, a
//! replayed control request, ...). Each one is counted in `/metrics`
//! (`countersign_refusals_total{what}`), and a repeated refusal reaches the
//! audit log as one `refused` entry per kind per interval, with how many
//! there were since the last one: an attack leaves evidence without
//! letting it flood the log.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{Map, Value};

use crate::enforce::pipeline::Pipeline;

/// At most one `refused` audit entry per kind in this long.
const AUDIT_EVERY: Duration = Duration::from_secs(60);

/// Counts per kind since the last audit entry of that kind.
#[derive(Default)]
pub(crate) struct Refusals {
    seen: Mutex<HashMap<&'static str, (Instant, u64)>>,
}

impl Refusals {
    /// A refusal of kind `what` (a metrics label, and the audit entry's
    /// `what`). `detail` says what was refused, in words that hold no
    /// secret (never a token); `server` names the server asked for.
    pub(crate) fn refused(
        &self,
        pipeline: &Pipeline,
        what: &'static str,
        server: Option<&str>,
        detail: &str,
    ) {
        pipeline.metrics().refused(what);
        let now = Instant::now();
        let count = {
            let mut seen = self.seen.lock();
            match seen.get_mut(what) {
                Some((last, n)) if now.duration_since(*last) < AUDIT_EVERY => {
                    *n += 1;
                    return;
                }
                Some((last, n)) => {
                    let count = *n + 1;
                    *last = now;
                    *n = 0;
                    count
                }
                None => {
                    seen.insert(what, (now, 0));
                    1
                }
            }
        };
        let mut fields = Map::new();
        fields.insert("what".into(), Value::from(what));
        if let Some(s) = server {
            fields.insert("server".into(), Value::from(s));
        }
        fields.insert("detail".into(), Value::from(detail));
        fields.insert("count".into(), Value::from(count));
        fields.insert(
            "interval_seconds".into(),
            Value::from(AUDIT_EVERY.as_secs()),
        );
        pipeline.audit("refused", fields);
    }
}
