//! `countersign audit export`: stream entries (constant memory) as JSON
//! Lines, CSV or OCSF.
//!
//! OCSF mapping (schema 1.3, class API Activity `6003`, category Application
//! Activity `6`), one event per entry:
//!
//! | OCSF field | from |
//! |---|---|
//! | `class_uid`, `category_uid`, `type_uid` | 6003, 6, 600399 (activity Other) |
//! | `activity_id`, `activity_name` | 99, the entry's `kind` |
//! | `time` | `time`, as epoch milliseconds |
//! | `severity_id` | 1 (informational); 3 (medium) for denials, rejections, unknown outcomes and breaks |
//! | `status_id`, `status` | 1 Success / 2 Failure (refusals, `outcome_unknown`, `not_dispatched`), the `kind` |
//! | `actor.user.name`, `actor.user.uid`, `actor.user.domain` | `principal`, `principal`, `tenant` |
//! | `api.operation`, `api.service.name`, `api.request.uid` | `tools/call`, `server`, `idempotency_key` |
//! | `resources[0]` | `{type: "mcp_tool", name: "server/tool", uid: call_digest}` |
//! | `authorizations[0]` | `{decision, policy: {uid: policies joined}}` for `decision` entries |
//! | `metadata.product`, `metadata.version`, `metadata.uid`, `metadata.sequence`, `metadata.log_name` | countersign, "1.3.0", `hash`, `seq`, "countersign-audit" |
//! | `unmapped` | the whole entry |

use std::io::Write;
use std::path::PathBuf;

use serde_json::{json, Map, Value};

use super::segment::AuditError;
use super::verify::each_line;
use crate::core::time::parse_rfc3339;

/// Export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// The entries as they are.
    Jsonl,
    /// One row per entry with the common columns.
    Csv,
    /// OCSF API Activity events, one JSON object per line.
    Ocsf,
}

/// CSV columns, in order.
pub const CSV_COLUMNS: [&str; 15] = [
    "seq",
    "time",
    "kind",
    "principal",
    "tenant",
    "server",
    "tool",
    "call_digest",
    "idempotency_key",
    "decision",
    "policies",
    "proposal_id",
    "reviewer",
    "code",
    "hash",
];

fn text(e: &Map<String, Value>, k: &str) -> String {
    match e.get(k) {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
            .collect::<Vec<_>>()
            .join(" "),
        Some(v) => v.to_string(),
    }
}

fn failure(kind: &str) -> bool {
    matches!(
        kind,
        "rejected" | "outcome_unknown" | "not_dispatched" | "approval_denied" | "approval_expired"
    ) || kind.ends_with("_denied")
}

/// One entry as an OCSF API Activity event.
pub fn ocsf(e: &Map<String, Value>) -> Value {
    let kind = text(e, "kind");
    let time_ms = e
        .get("time")
        .and_then(Value::as_str)
        .and_then(parse_rfc3339)
        .unwrap_or(0);
    let denied = kind == "decision" && text(e, "decision") == "deny";
    let bad = failure(&kind) || denied;
    let mut event = json!({
        "class_uid": 6003,
        "class_name": "API Activity",
        "category_uid": 6,
        "category_name": "Application Activity",
        "activity_id": 99,
        "activity_name": kind,
        "type_uid": 600399,
        "time": time_ms,
        "severity_id": if bad { 3 } else { 1 },
        "status_id": if bad { 2 } else { 1 },
        "status": kind,
        "metadata": {
            "version": "1.3.0",
            "product": { "name": "countersign", "vendor_name": "countersign", "version": env!("CARGO_PKG_VERSION") },
            "uid": text(e, "hash"),
            "sequence": e.get("seq").cloned().unwrap_or(Value::Null),
            "log_name": "countersign-audit",
        },
        "unmapped": Value::Object(e.clone()),
    });
    if e.contains_key("principal") {
        event["actor"] = json!({ "user": {
            "name": text(e, "principal"), "uid": text(e, "principal"), "domain": text(e, "tenant"),
        }});
    }
    if e.contains_key("server") {
        event["api"] = json!({
            "operation": "tools/call",
            "service": { "name": text(e, "server") },
            "request": { "uid": text(e, "idempotency_key") },
        });
        event["resources"] = json!([{
            "type": "mcp_tool",
            "name": format!("{}/{}", text(e, "server"), text(e, "tool")),
            "uid": text(e, "call_digest"),
        }]);
    }
    if kind == "decision" {
        event["authorizations"] = json!([{
            "decision": text(e, "decision"),
            "policy": { "uid": text(e, "policies") },
        }]);
    }
    event
}

/// One line of a log: the line, where it is (`segment:line`), its time in
/// unix ms.
type Line = (Vec<u8>, String, Option<i64>);

/// One log's lines, read on a thread of its own into a bounded channel (so
/// several logs merge in constant memory).
type Lines = std::sync::mpsc::Receiver<Line>;

fn read_log(dir: PathBuf) -> (Lines, std::thread::JoinHandle<Result<(), AuditError>>) {
    let (tx, rx) = std::sync::mpsc::sync_channel(256);
    let reader = std::thread::spawn(move || {
        each_line(&dir, |line, place| {
            let time = serde_json::from_slice::<Map<String, Value>>(line)
                .ok()
                .and_then(|e| {
                    e.get("time")
                        .and_then(Value::as_str)
                        .and_then(parse_rfc3339)
                });
            // A closed receiver means the export stopped: stop reading.
            tx.send((line.to_vec(), place.to_string(), time)).is_ok()
        })
        .map(|_| ())
    });
    (rx, reader)
}

/// Stream the entries with `time` in `[since, until]` of the logs in `dirs`
/// to `out`, merged in time order (each log's own order kept); returns how
/// many were written. Memory stays constant: a few lines per log.
pub fn export(
    dirs: &[PathBuf],
    format: Format,
    since: Option<i64>,
    until: Option<i64>,
    out: &mut dyn Write,
) -> Result<u64, AuditError> {
    let first = dirs.first().cloned().unwrap_or_default();
    let mut written = 0u64;
    let mut err: Option<String> = None;
    enum Sink<'a> {
        Csv(Box<csv::Writer<&'a mut dyn Write>>),
        Plain(&'a mut dyn Write),
    }
    let mut sink = match format {
        Format::Csv => {
            let mut w = csv::Writer::from_writer(out);
            w.write_record(CSV_COLUMNS).map_err(|e| AuditError {
                path: first.clone(),
                message: e.to_string(),
            })?;
            Sink::Csv(Box::new(w))
        }
        _ => Sink::Plain(out),
    };
    let mut logs: Vec<_> = dirs.iter().map(|d| read_log(d.clone())).collect();
    let mut heads: Vec<Option<Line>> = logs.iter().map(|(rx, _)| rx.recv().ok()).collect();
    // The earliest head next; ties (and entries without a time) by log order.
    while let Some(i) = heads
        .iter()
        .enumerate()
        .filter_map(|(i, h)| h.as_ref().map(|(_, _, t)| (t.unwrap_or(i64::MIN), i)))
        .min()
        .map(|(_, i)| i)
    {
        let Some((line, place, _)) = heads[i].take() else {
            break;
        };
        heads[i] = logs[i].0.recv().ok();
        let Ok(e) = serde_json::from_slice::<Map<String, Value>>(&line) else {
            err = Some(format!(
                "{}: {place} is not a JSON entry: run `countersign audit verify`",
                dirs[i].display()
            ));
            break;
        };
        let t = e
            .get("time")
            .and_then(Value::as_str)
            .and_then(parse_rfc3339);
        if since.is_some_and(|s| t.is_none_or(|t| t < s))
            || until.is_some_and(|u| t.is_none_or(|t| t > u))
        {
            continue;
        }
        let result = match (&mut sink, format) {
            (Sink::Csv(w), _) => w
                .write_record(CSV_COLUMNS.iter().map(|c| text(&e, c)))
                .map_err(|e| e.to_string()),
            (Sink::Plain(out), Format::Ocsf) => {
                writeln!(out, "{}", ocsf(&e)).map_err(|e| e.to_string())
            }
            (Sink::Plain(out), _) => out
                .write_all(&line)
                .and_then(|()| out.write_all(b"\n"))
                .map_err(|e| e.to_string()),
        };
        match result {
            Ok(()) => written += 1,
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    // Readers stop when their channel closes.
    drop(heads);
    let readers: Vec<_> = logs
        .drain(..)
        .map(|(rx, r)| {
            drop(rx);
            r
        })
        .collect();
    for (r, dir) in readers.into_iter().zip(dirs) {
        match r.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                err.get_or_insert(e.to_string());
            }
            Err(_) => {
                err.get_or_insert(format!("{}: the reader stopped", dir.display()));
            }
        }
    }
    let flushed = match &mut sink {
        Sink::Csv(w) => w.flush(),
        Sink::Plain(out) => out.flush(),
    };
    if let Err(e) = flushed {
        err.get_or_insert(e.to_string());
    }
    match err {
        Some(message) => Err(AuditError {
            path: first,
            message,
        }),
        None => Ok(written),
    }
}
