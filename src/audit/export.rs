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
//! | `actor.user.name`, `actor.user.uid`, `actor.user.domain` | `principal`, `principal`, `tenant`; on a reviewer's entry (approval, denial) the `reviewer` (`actor.user.type` `reviewer`, `actor.authorizations` the decision and key kind; the agent who asked stays in `unmapped.principal`) |
//! | `api.operation`, `api.service.name`, `api.request.uid` | `tools/call`, `server`, `idempotency_key` (a read without one: `call_digest`) |
//! | `resources[0]` | `{type: "mcp_tool", name: "server/tool", uid: call_digest}` |
//! | `authorizations[0]` | `{decision, policy: {uid: policies joined}}` for `decision` entries |
//! | `metadata.product`, `metadata.version`, `metadata.uid`, `metadata.sequence`, `metadata.log_name` | countersign, "1.3.0", `hash`, `seq`, "countersign-audit" |
//! | `unmapped` | the whole entry |

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::segment::AuditError;
use super::verify::each_line;
use crate::core::time::parse_rfc3339;

/// Export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// The entries as they are.
    Jsonl,
    /// One row per entry with the common columns.
    Csv,
    /// OCSF API Activity events, one JSON object per line.
    Ocsf,
}

/// CSV columns, in order. `reason` is the reviewer's (or the lapse's)
/// word; `budgets` the figures of each budget a write ran under, from its
/// `dispatched` entry (`name: spent S + amount A of limit L`, `; ` between
/// budgets), so that an auditor reads the money without the JSON.
pub(crate) const CSV_COLUMNS: [&str; 18] = [
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
    "key_kind",
    "reason",
    "budgets",
    "code",
    "hash",
];

/// The reason of an entry: its own `reason`, else the one in the reviewer's
/// signed statement.
fn reason(e: &Map<String, Value>) -> String {
    e.get("reason")
        .and_then(Value::as_str)
        .or_else(|| {
            e.get("approval")
                .and_then(|a| a.pointer("/statement/reason"))
                .and_then(Value::as_str)
        })
        .unwrap_or_default()
        .to_owned()
}

/// The budget figures a write ran under (`guards.budgets` of `dispatched`).
fn budgets(e: &Map<String, Value>) -> String {
    let Some(list) = e
        .get("guards")
        .and_then(|g| g.get("budgets"))
        .and_then(Value::as_array)
    else {
        return String::new();
    };
    let s = |b: &Value, k: &str| b.get(k).and_then(Value::as_str).unwrap_or("?").to_owned();
    list.iter()
        .map(|b| {
            format!(
                "{}: spent {} + amount {} of limit {}",
                s(b, "name"),
                s(b, "spent"),
                s(b, "amount"),
                s(b, "limit")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Which kind of key signed an entry's reviewer statement: `passkey`,
/// `ed25519`, or nothing when it holds none.
fn key_kind(e: &Map<String, Value>) -> &'static str {
    match e.get("approval") {
        Some(a) if a.get("passkey").is_some_and(|p| !p.is_null()) => "passkey",
        Some(a) if a.is_object() => "ed25519",
        _ => "",
    }
}

fn text(e: &Map<String, Value>, k: &str) -> String {
    match k {
        "key_kind" => return key_kind(e).to_owned(),
        "reason" => return reason(e),
        "budgets" => return budgets(e),
        _ => {}
    }
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

/// A CSV cell that a spreadsheet shows as text. Agents choose tool names,
/// idempotency keys and more: a cell starting with `=`, `+`, `-`, `@`, a
/// tab or a carriage return would be read as a formula when the export is
/// opened (`=HYPERLINK(...)`), so it gets a leading `'`, as OWASP's CSV
/// injection guidance says.
fn csv_cell(cell: String) -> String {
    match cell.chars().next() {
        Some('=' | '+' | '-' | '@' | '\t' | '\r') => format!("'{cell}"),
        _ => cell,
    }
}

fn failure(kind: &str) -> bool {
    matches!(
        kind,
        "rejected" | "outcome_unknown" | "not_dispatched" | "approval_denied" | "approval_expired"
    ) || kind.ends_with("_denied")
}

/// One entry as an OCSF API Activity event.
pub(crate) fn ocsf(e: &Map<String, Value>) -> Value {
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
    // The actor is who acted: on a reviewer's approval or denial, the
    // reviewer (the agent who asked is `requester`); on the call's own
    // entries, the agent.
    if let Some(reviewer) = e.get("reviewer").and_then(Value::as_str) {
        event["actor"] = json!({
            "user": { "name": reviewer, "uid": reviewer, "type_id": 99, "type": "reviewer", "domain": text(e, "tenant") },
            "authorizations": [{ "decision": kind, "key_kind": key_kind(e) }],
        });
    } else if e.contains_key("principal") {
        event["actor"] = json!({ "user": {
            "name": text(e, "principal"), "uid": text(e, "principal"), "domain": text(e, "tenant"),
        }});
    }
    if e.contains_key("server") {
        // The request's id: the idempotency key when the call has one (a
        // write and its retries are one request), else the call's digest.
        let request = match text(e, "idempotency_key") {
            k if k.is_empty() => text(e, "call_digest"),
            k => k,
        };
        event["api"] = json!({
            "operation": "tools/call",
            "service": { "name": text(e, "server") },
            "request": { "uid": request },
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

/// Why an export stopped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExportError {
    /// A log could not be read or holds a line that is not an entry.
    #[error(transparent)]
    Log(#[from] AuditError),
    /// The output could not be written. A reader that went away (`| head`)
    /// is `BrokenPipe`: the export is cut short, and the log is fine.
    #[error("cannot write the export: {0}")]
    Output(std::io::Error),
}

impl ExportError {
    /// The reader of the output went away (`| head`): not a failure of the log.
    pub(crate) fn is_closed_output(&self) -> bool {
        matches!(self, ExportError::Output(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }
}

/// Where entries go, in one format.
enum Sink<'a> {
    Csv(Box<csv::Writer<&'a mut dyn Write>>),
    Plain(&'a mut dyn Write, Format),
}

fn csv_io(e: csv::Error) -> std::io::Error {
    match e.into_kind() {
        csv::ErrorKind::Io(e) => e,
        other => std::io::Error::other(format!("{other:?}")),
    }
}

impl<'a> Sink<'a> {
    fn new(format: Format, out: &'a mut dyn Write) -> std::io::Result<Sink<'a>> {
        Ok(match format {
            Format::Csv => {
                let mut w = csv::Writer::from_writer(out);
                w.write_record(CSV_COLUMNS).map_err(csv_io)?;
                Sink::Csv(Box::new(w))
            }
            _ => Sink::Plain(out, format),
        })
    }

    /// One entry: its line as written, and parsed.
    fn entry(&mut self, line: &[u8], e: &Map<String, Value>) -> std::io::Result<()> {
        match self {
            Sink::Csv(w) => w
                .write_record(CSV_COLUMNS.iter().map(|c| csv_cell(text(e, c))))
                .map_err(csv_io),
            Sink::Plain(out, Format::Ocsf) => writeln!(out, "{}", ocsf(e)),
            Sink::Plain(out, _) => out.write_all(line).and_then(|()| out.write_all(b"\n")),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Sink::Csv(w) => w.flush(),
            Sink::Plain(out, _) => out.flush(),
        }
    }
}

/// Whether an entry's `time` is in `[since, until]`.
fn in_window(e: &Map<String, Value>, since: Option<i64>, until: Option<i64>) -> bool {
    let t = e
        .get("time")
        .and_then(Value::as_str)
        .and_then(parse_rfc3339);
    !(since.is_some_and(|s| t.is_none_or(|t| t < s))
        || until.is_some_and(|u| t.is_none_or(|t| t > u)))
}

/// Stream the entries with `time` in `[since, until]` of the logs in `dirs`
/// to `out`, merged in time order (each log's own order kept); returns how
/// many were written. Memory stays constant: a few lines per log.
pub(crate) fn export(
    dirs: &[PathBuf],
    format: Format,
    since: Option<i64>,
    until: Option<i64>,
    out: &mut dyn Write,
) -> Result<u64, ExportError> {
    let mut written = 0u64;
    let mut err: Option<ExportError> = None;
    let mut sink = Sink::new(format, out).map_err(ExportError::Output)?;
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
            err = Some(not_an_entry(&dirs[i], &place));
            break;
        };
        if !in_window(&e, since, until) {
            continue;
        }
        match sink.entry(&line, &e) {
            Ok(()) => written += 1,
            Err(e) => {
                err = Some(ExportError::Output(e));
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
                err.get_or_insert(ExportError::Log(e));
            }
            Err(_) => {
                err.get_or_insert(ExportError::Log(AuditError {
                    path: dir.clone(),
                    message: "the reader stopped".into(),
                    cause: None,
                }));
            }
        }
    }
    if let Err(e) = sink.flush() {
        err.get_or_insert(ExportError::Output(e));
    }
    match err {
        Some(e) => Err(e),
        None => Ok(written),
    }
}

fn not_an_entry(dir: &Path, place: &str) -> ExportError {
    ExportError::Log(AuditError {
        path: dir.to_owned(),
        message: format!("{place} is not a JSON entry: run `countersign audit verify`"),
        cause: None,
    })
}

/// How often `follow` looks for new entries.
const FOLLOW_POLL: Duration = Duration::from_millis(200);

/// Stream the entries of the log in `dir` at or after `since`, then keep
/// streaming new ones as the gateway writes them (across segments), as
/// `tail -f` does, until `stop` is set or the output goes away. Only whole
/// lines are written: a line the gateway is still writing waits for its
/// newline. Each entry is flushed at once, for log shippers.
pub(crate) fn follow(
    dir: &Path,
    format: Format,
    since: Option<i64>,
    out: &mut dyn Write,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<u64, ExportError> {
    use std::io::{Read, Seek, SeekFrom};
    let mut sink = Sink::new(format, out).map_err(ExportError::Output)?;
    sink.flush().map_err(ExportError::Output)?;
    let mut written = 0u64;
    // The segment being read, how far, and its line count (for messages).
    let mut current: Option<(PathBuf, u64, usize)> = None;
    let mut pending: Vec<u8> = Vec::new();
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let segs = super::segment::segments(dir)?;
        let (seg, mut offset, mut number) = match current.take() {
            Some(c) => c,
            None => match segs.first() {
                Some(first) => (first.clone(), 0, 0),
                None => {
                    std::thread::sleep(FOLLOW_POLL);
                    continue;
                }
            },
        };
        let io = |e: std::io::Error| AuditError {
            path: seg.clone(),
            message: e.to_string(),
            cause: Some(Box::new(e)),
        };
        let mut file = std::fs::File::open(&seg).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let mut got = false;
        if len > offset {
            file.seek(SeekFrom::Start(offset)).map_err(io)?;
            let mut chunk = Vec::with_capacity((len - offset) as usize);
            (&mut file)
                .take(len - offset)
                .read_to_end(&mut chunk)
                .map_err(io)?;
            offset += chunk.len() as u64;
            pending.extend_from_slice(&chunk);
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                let line = &line[..line.len() - 1];
                number += 1;
                got = true;
                let name = seg.file_name().map(|s| s.to_string_lossy().into_owned());
                let place = format!("{} line {number}", name.unwrap_or_default());
                let e = serde_json::from_slice::<Map<String, Value>>(line)
                    .map_err(|_| not_an_entry(dir, &place))?;
                if !in_window(&e, since, None) {
                    continue;
                }
                sink.entry(line, &e).map_err(ExportError::Output)?;
                written += 1;
            }
            if got {
                sink.flush().map_err(ExportError::Output)?;
            }
        }
        // A newer segment and nothing left here: the writer rotated. (A
        // torn line at the end of an older segment is left to `verify`.)
        let next = segs.iter().find(|s| **s > seg).cloned();
        match next {
            Some(next) if !got && len == offset => {
                pending.clear();
                current = Some((next, 0, 0));
            }
            _ => {
                current = Some((seg, offset, number));
                if !got {
                    std::thread::sleep(FOLLOW_POLL);
                }
            }
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::audit::log::{AuditLog, Settings};

    /// An output the test can read while `follow` writes to it.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Shared {
        fn seqs(&self) -> Vec<u64> {
            String::from_utf8_lossy(&self.0.lock().unwrap())
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok()?["seq"].as_u64())
                .collect()
        }
    }

    #[tokio::test]
    async fn follow_streams_every_entry_once_across_segment_rotations() {
        let dir = tempfile::tempdir().unwrap();
        let settings = Settings {
            dir: dir.path().to_owned(),
            checkpoint_every: 1000,
            checkpoint_interval: std::time::Duration::from_secs(60),
            // A few entries a segment: the log rotates while it is followed.
            segment_bytes: 1500,
            arguments: crate::audit::ArgumentMode::Full,
            redact: vec![],
            gateway: None,
            origin: None,
        };
        let log = AuditLog::open(settings).unwrap();
        let out = Shared::default();
        let stop = Arc::new(AtomicBool::new(false));
        let follower = {
            let (mut out, stop, dir) = (out.clone(), stop.clone(), dir.path().to_owned());
            std::thread::spawn(move || follow(&dir, Format::Jsonl, None, &mut out, &stop))
        };
        // Written while it follows, in bursts.
        for i in 0..60 {
            log.record(
                "call_received",
                json!({ "i": i }).as_object().unwrap().clone(),
            );
            if i % 10 == 9 {
                log.record_durable("dispatched", Map::new()).await.unwrap();
            }
        }
        // log_started, 60 entries and 6 durable ones.
        let expected = 67;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while out.seqs().len() < expected && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        stop.store(true, Ordering::SeqCst);
        let written = follower.join().unwrap().unwrap();
        let segs = super::super::segment::segments(dir.path()).unwrap();
        assert!(segs.len() > 3, "the log did not rotate: {segs:?}");
        let seqs = out.seqs();
        assert_eq!(
            seqs,
            (1..=expected as u64).collect::<Vec<_>>(),
            "each entry once, in order"
        );
        assert_eq!(written, expected as u64);
    }
}
