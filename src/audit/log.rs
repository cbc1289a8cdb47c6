//! The audit writer: one thread appends entries in order, chains them,
//! signs checkpoints, rotates segments and fsyncs what must be durable.
//!
//! Files under the audit dir (`gateway.data_dir/audit` by default):
//! `gateway.key` (the gateway's ed25519 key, 0600, made on first start),
//! `gateway.pub`, and segments `000001.jsonl`, `000002.jsonl`, ... The
//! chain continues across segments.
//!
//! Durability:
//! - A dispatch's entries share the ledger's fsync: [`AuditLog::stage`]
//!   tags them for the ledger's outbox, which commits them with the durable
//!   `dispatched` record; [`AuditLog::record_staged`] queues them here, and
//!   the writer fsyncs them within 50 ms and clears the outbox rows. At
//!   startup [`AuditLog::attach_outbox`] appends what a crash left in the
//!   outbox (marked `recovered`), recognizing entries already written by
//!   their `outbox` tag.
//! - [`AuditLog::record_durable`] returns once its entry (and every entry
//!   before it) is fsynced here (offline reconciliation, recovery).
//! - Other entries are buffered: queued without waking the writer (drained
//!   every 2 ms while busy), handed to the OS within 100 ms or with the next
//!   sync, and fsynced with the next sync or checkpoint. A crash loses at
//!   most that tail, which `audit verify` reports as truncation after the
//!   last checkpoint, never as corruption. At startup a torn final line is
//!   cut off and the cut is recorded in the `log_started` entry.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use serde_json::{json, Map, Value};
use tokio::sync::oneshot;

use super::merkle::Hash;
use super::note::{self, Checkpoint, Note};
use super::segment::{io_err, segment_path, segments, AuditError};
use super::tree::TreeWriter;
use sha2::Digest;

use super::{
    hash_bytes, sign_checkpoint, ArgumentMode, CHECKPOINT, CHECKPOINT_FILE, COSIGNED, LOG_STARTED,
};
use crate::core::reviewers::{format_public_key, KeyFile};

/// `[audit]` settings the writer needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The audit dir.
    pub dir: PathBuf,
    /// A checkpoint after this many entries.
    pub checkpoint_every: u64,
    /// A checkpoint after this long with unsigned entries.
    pub checkpoint_interval: Duration,
    /// A new segment once the current one is this large.
    pub segment_bytes: u64,
    /// How arguments are recorded.
    pub arguments: ArgumentMode,
    /// JSON pointers redacted in `redact` mode.
    pub redact: Vec<String>,
    /// The gateway id every entry carries (several gateways share one
    /// store; each keeps its own log and key).
    pub gateway: Option<String>,
    /// The checkpoints' origin line and key name (`audit.origin`; by
    /// default `countersign/` and the gateway id).
    pub origin: Option<String>,
}

impl Settings {
    /// The writer settings of a configuration's `[audit]` table.
    pub fn from_config(config: &crate::core::config::Config) -> Settings {
        Settings {
            dir: config.audit_dir(),
            checkpoint_every: config.audit.checkpoint_every,
            checkpoint_interval: config.audit.checkpoint_interval,
            segment_bytes: config.audit.segment_bytes,
            arguments: config.audit.arguments,
            redact: config.audit.redact.clone(),
            gateway: None,
            origin: config.audit.origin.clone(),
        }
    }

    /// The origin of this log's checkpoints.
    pub fn origin(&self) -> String {
        self.origin.clone().unwrap_or_else(|| {
            format!("countersign/{}", self.gateway.as_deref().unwrap_or("local"))
        })
    }

    /// Entries carry `gateway`.
    pub fn with_gateway(mut self, gateway: String) -> Settings {
        self.gateway = Some(gateway);
        self
    }
}

/// A `&'static str` for a kind read back from an outbox row (the set of
/// kinds is small and fixed; unknown ones are leaked once each).
fn intern(kind: &str) -> &'static str {
    const KINDS: [&str; 8] = [
        "call_received",
        "decision",
        "dispatched",
        "approval_consumed",
        "completed",
        "not_dispatched",
        "outcome_unknown",
        "rejected",
    ];
    KINDS
        .iter()
        .find(|k| **k == kind)
        .copied()
        .unwrap_or_else(|| Box::leak(kind.to_owned().into_boxed_str()))
}

/// The lock file in the audit dir, locked by the process that writes the log.
pub const WRITER_LOCK: &str = "writer.lock";

/// Lock the log for this writer. Two writers would interleave two chains in
/// one file and break it, so a second one (another gateway started on the
/// same data dir) is refused. The lock goes with the process, so a crash
/// leaves nothing to clean up.
fn take_writer_lock(dir: &Path) -> Result<File, AuditError> {
    let path = dir.join(WRITER_LOCK);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_err(&path))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(AuditError {
            path: dir.to_owned(),
            message: "another process writes this audit log (is a gateway already running on this data dir?): \
                      one writer per log"
                .into(),
        }),
        Err(std::fs::TryLockError::Error(e)) => Err(io_err(&path)(e)),
    }
}

/// Whether a process holds the log's writer lock now (a running gateway).
pub fn writer_running(dir: &Path) -> bool {
    let Ok(file) = File::open(dir.join(WRITER_LOCK)) else {
        return false;
    };
    matches!(
        file.try_lock_shared(),
        Err(std::fs::TryLockError::WouldBlock)
    )
}

/// The key file name in the audit dir.
pub const KEY_FILE: &str = "gateway.key";

/// Load the gateway's audit key, or make one (0600) on first start.
pub fn load_or_create_key(dir: &Path) -> Result<SigningKey, AuditError> {
    let path = dir.join(KEY_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => KeyFile::parse(&text)
            .and_then(|k| k.signing_key())
            .map_err(|e| AuditError {
                path: path.clone(),
                message: format!("{e} (the audit key is damaged: restore it from backup)"),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let kf = KeyFile::generate("gateway", rand::random());
            let key = kf.signing_key().map_err(|e| AuditError {
                path: path.clone(),
                message: e.to_string(),
            })?;
            let text = format!(
                "# countersign gateway audit key: signs checkpoints; keep it secret, back it up\n{}",
                toml::to_string(&kf).map_err(|e| AuditError {
                    path: path.clone(),
                    message: e.to_string(),
                })?
            );
            let mut opts = OpenOptions::new();
            opts.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                opts.mode(0o600);
            }
            let mut f = opts.open(&path).map_err(io_err(&path))?;
            f.write_all(text.as_bytes()).map_err(io_err(&path))?;
            f.sync_all().map_err(io_err(&path))?;
            let pub_path = dir.join("gateway.pub");
            std::fs::write(
                &pub_path,
                format!("{}\n", format_public_key(&key.verifying_key())),
            )
            .map_err(io_err(&pub_path))?;
            Ok(key)
        }
        Err(e) => Err(io_err(&path)(e)),
    }
}

/// Where the chain stands when the log is opened.
struct Tail {
    segment: u32,
    seq: u64,
    head: String,
    /// Bytes of a torn final line cut off.
    cut: u64,
    /// The last entry was a clean-shutdown checkpoint.
    clean: bool,
}

/// Write the latest signed note (atomically: a reader never sees half).
fn write_latest(dir: &Path, note: &str) -> std::io::Result<()> {
    let tmp = dir.join(format!("{CHECKPOINT_FILE}.tmp"));
    std::fs::write(&tmp, note)?;
    std::fs::rename(&tmp, dir.join(CHECKPOINT_FILE))
}

/// The last checkpoint this gateway signed, from its checkpoint file (which
/// must carry the gateway's own signature).
fn latest_signed(dir: &Path, key: &SigningKey) -> Result<Option<Checkpoint>, AuditError> {
    let path = dir.join(CHECKPOINT_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(&path)(e)),
    };
    // The file is a copy (each note is also in its checkpoint entry) and is
    // not fsynced: one a crash left unreadable is replaced by the next. One
    // that reads well and carries another key's signature was put there.
    let parsed = Note::parse(&text).and_then(|n| Checkpoint::parse(&n.text).map(|cp| (n, cp)));
    let Ok((n, cp)) = parsed else {
        tracing::warn!(path = %path.display(), "the latest checkpoint file is unreadable (a crash?); the next checkpoint replaces it");
        return Ok(None);
    };
    n.verify(&cp.origin, &key.verifying_key())
        .map_err(|e| AuditError {
            path: path.clone(),
            message: format!("{e}: not this gateway's checkpoint"),
        })?;
    Ok(Some(cp))
}

/// The log, as it is now, must hold what checkpoint `cp` covered: at least
/// its entries, with its root. Otherwise it was truncated or rewritten
/// after the gateway signed; the gateway does not sign over that.
fn check_extends(tree: &TreeWriter, cp: &Checkpoint, dir: &Path) -> Result<(), AuditError> {
    let refuse = |why: String| {
        AuditError {
        path: dir.to_owned(),
        message: format!(
            "{why}: the log no longer holds what this gateway signed. Keep this directory as evidence, \
             check it with `countersign audit verify --checkpoint {}/{CHECKPOINT_FILE}`, and start with a new audit.dir",
            dir.display()
        ),
    }
    };
    if tree.size() < cp.size {
        return Err(refuse(format!(
            "the log has {} entries and checkpoint {} covered {}",
            tree.size(),
            cp.size,
            cp.size
        )));
    }
    let reader = tree.reader().map_err(io_err(dir))?;
    let root = super::merkle::root(&reader, cp.size).map_err(io_err(dir))?;
    if root != cp.root {
        return Err(refuse(format!(
            "the first {} entries no longer hash to the root checkpoint {} signed",
            cp.size, cp.size
        )));
    }
    Ok(())
}

/// The entry hashes of seq `from` on, read from the log's segments: the
/// segment holding `from` is found by the first seq of each, so only the
/// tail is read.
fn tail_hashes(dir: &Path, from: u64) -> Result<Vec<Hash>, AuditError> {
    #[derive(serde::Deserialize)]
    struct Head<'a> {
        seq: u64,
        #[serde(borrow)]
        hash: std::borrow::Cow<'a, str>,
    }
    let segs = segments(dir)?;
    let mut start = 0;
    for (i, seg) in segs.iter().enumerate() {
        let f = File::open(seg).map_err(io_err(seg))?;
        let mut first = Vec::new();
        BufReader::new(f)
            .read_until(b'\n', &mut first)
            .map_err(io_err(seg))?;
        match serde_json::from_slice::<Head<'_>>(&first) {
            Ok(h) if h.seq <= from => start = i,
            _ => break,
        }
    }
    let mut out = Vec::new();
    for seg in &segs[start.min(segs.len())..] {
        let f = File::open(seg).map_err(io_err(seg))?;
        for line in BufReader::new(f).split(b'\n') {
            let line = line.map_err(io_err(seg))?;
            let Ok(h) = serde_json::from_slice::<Head<'_>>(&line) else {
                continue;
            };
            if h.seq >= from {
                let hash = hash_bytes(&h.hash).ok_or_else(|| AuditError {
                    path: seg.clone(),
                    message: format!("entry {} has no usable `hash`", h.seq),
                })?;
                out.push(hash);
            }
        }
    }
    Ok(out)
}

/// Find the end of the chain; cut a torn final line of the last segment.
fn recover(dir: &Path) -> Result<Tail, AuditError> {
    let segs = segments(dir)?;
    let Some(last) = segs.last() else {
        return Ok(Tail {
            segment: 1,
            seq: 0,
            head: String::new(),
            cut: 0,
            clean: true,
        });
    };
    let number: u32 = last
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(last)
        .map_err(io_err(last))?;
    let len = f.metadata().map_err(io_err(last))?.len();
    let mut reader = BufReader::new(&mut f);
    let (mut good_end, mut pos) = (0u64, 0u64);
    let mut last_entry: Option<Map<String, Value>> = None;
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).map_err(io_err(last))?;
        if n == 0 {
            break;
        }
        pos += n as u64;
        let complete = line.ends_with(b"\n");
        match serde_json::from_slice::<Map<String, Value>>(&line) {
            Ok(e) if complete => {
                good_end = pos;
                last_entry = Some(e);
            }
            // A torn or garbled line: everything from here is cut.
            _ => break,
        }
    }
    drop(reader);
    let cut = len - good_end;
    if cut > 0 {
        f.set_len(good_end).map_err(io_err(last))?;
        f.sync_all().map_err(io_err(last))?;
    }
    // An empty last segment: the chain ends in the one before.
    if last_entry.is_none() && segs.len() > 1 {
        let mut t = recover_from(&segs[segs.len() - 2])?;
        t.segment = number;
        t.cut = cut;
        return Ok(t);
    }
    Ok(tail_of(last_entry, number, cut))
}

fn recover_from(seg: &Path) -> Result<Tail, AuditError> {
    let f = File::open(seg).map_err(io_err(seg))?;
    let mut last = None;
    for line in BufReader::new(f).split(b'\n') {
        let line = line.map_err(io_err(seg))?;
        if let Ok(e) = serde_json::from_slice::<Map<String, Value>>(&line) {
            last = Some(e);
        }
    }
    Ok(tail_of(last, 1, 0))
}

fn tail_of(last: Option<Map<String, Value>>, segment: u32, cut: u64) -> Tail {
    match last {
        Some(e) => Tail {
            segment,
            seq: e.get("seq").and_then(Value::as_u64).unwrap_or(0),
            head: e
                .get("hash")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            cut,
            clean: e.get("kind").and_then(Value::as_str) == Some(CHECKPOINT)
                && e.get("reason").and_then(Value::as_str) == Some("shutdown"),
        },
        None => Tail {
            segment,
            seq: 0,
            head: String::new(),
            cut,
            clean: true,
        },
    }
}

pub use super::Entries;

type Queue = Arc<parking_lot::Mutex<Entries>>;

/// The outbox side of the log (see [`crate::store::Store::transition_with`]).
#[derive(Default)]
struct OutboxState {
    store: parking_lot::Mutex<Option<Arc<dyn crate::store::Store>>>,
    /// Highest outbox id whose entries are queued.
    queued: std::sync::atomic::AtomicU64,
}

/// How soon entries that came through the outbox are fsynced here (after
/// which their outbox rows are cleared).
const OUTBOX_SYNC: Duration = Duration::from_millis(50);

/// Entries staged for a dispatch: committed to the ledger's outbox with the
/// `dispatched` record (one fsync), then queued here.
pub struct Staged {
    /// Outbox id.
    pub id: u64,
    /// The entries as JSON, for the outbox row.
    pub text: String,
    /// The entries, tagged with their outbox place.
    pub entries: Entries,
}

/// How often the writer drains the queue of buffered entries.
const QUEUE_POLL: Duration = Duration::from_millis(2);

/// Past this many queued entries, the writer is woken at once (bounds the
/// queue under load).
const QUEUE_WAKE: usize = 4096;

/// Entries appended together, in order; `durable` is answered once all of
/// them are on disk.
struct Msg {
    entries: Vec<(&'static str, Map<String, Value>)>,
    durable: Option<oneshot::Sender<Result<(), String>>>,
}

/// The audit log of a running gateway.
pub struct AuditLog {
    dir: PathBuf,
    // Buffered entries wait here without waking the writer, which drains
    // the queue every few milliseconds: a relayed call costs no thread
    // wake-up for its audit entries (the wake-up was most of their cost).
    queue: Queue,
    // Set by an idle writer that blocks instead of polling: the next
    // producer wakes it (once).
    sleeping: Arc<std::sync::atomic::AtomicBool>,
    /// Shared with the writer: the ledger store whose outbox holds entries
    /// committed with a dispatch, and the highest outbox id queued.
    outbox: Arc<OutboxState>,
    outbox_next: std::sync::atomic::AtomicU64,
    // Behind locks only so that a shared log can be closed at shutdown
    // (`close(&self)`); uncontended in practice.
    tx: parking_lot::Mutex<Option<mpsc::Sender<Msg>>>,
    thread: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The gateway's public key (`ed25519:...`).
    pub public_key: String,
    /// The gateway's key, which also signs the `requestState` of questions
    /// to clients (a JSON payload of its own type: never a checkpoint).
    key: SigningKey,
    /// The latest signed checkpoint note, as each is made (the witness
    /// submitter follows it).
    checkpoints: tokio::sync::watch::Receiver<Option<Arc<str>>>,
    /// The checkpoints' origin.
    pub origin: String,
    /// How arguments are recorded.
    pub arguments: ArgumentMode,
    /// Pointers redacted.
    pub redact: Vec<String>,
}

impl AuditLog {
    /// The gateway's signing key (for the `requestState` of questions to
    /// clients; see [`crate::core::confirm`]).
    pub fn signing_key(&self) -> SigningKey {
        self.key.clone()
    }

    /// Each checkpoint note as the writer signs it (the latest first).
    pub fn checkpoints(&self) -> tokio::sync::watch::Receiver<Option<Arc<str>>> {
        self.checkpoints.clone()
    }

    /// The audit dir.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Open (or create) the log, recover its tail, write `log_started`.
    pub fn open(s: Settings) -> Result<AuditLog, AuditError> {
        std::fs::create_dir_all(&s.dir).map_err(io_err(&s.dir))?;
        let writer_lock = take_writer_lock(&s.dir)?;
        let key = load_or_create_key(&s.dir)?;
        let public_key = format_public_key(&key.verifying_key());
        let tail = recover(&s.dir)?;
        let path = segment_path(&s.dir, tail.segment);
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io_err(&path))?;
        let size = file.metadata().map_err(io_err(&path))?.len();
        // The tree, level with the log; then the promise of the last
        // checkpoint signed: the log must still hold what it covered.
        let tail_of_log = |from| tail_hashes(&s.dir, from);
        let mut tree = TreeWriter::open(&s.dir, tail.seq, hash_bytes(&tail.head), tail_of_log)?;
        let origin = s.origin();
        let last_signed = latest_signed(&s.dir, &key)?;
        if let Some(cp) = &last_signed {
            // The tree is derived: one that disagrees with the last signed
            // checkpoint is made again from the log, and only the log itself
            // is judged against the checkpoint.
            if check_extends(&tree, cp, &s.dir).is_err() {
                tracing::warn!("the audit tree does not match the last signed checkpoint: making it again from the log");
                drop(tree);
                let path = s.dir.join(super::tree::TREE_FILE);
                std::fs::remove_file(&path).map_err(io_err(&path))?;
                tree = TreeWriter::open(&s.dir, tail.seq, hash_bytes(&tail.head), tail_of_log)?;
                check_extends(&tree, cp, &s.dir)?;
            }
            // The leaves after it were never signed: checked against the
            // log's tail (at most about `checkpoint_every` entries), mended
            // if a damaged file holds others.
            let after = tail_of_log(cp.size + 1)?;
            if tree.mend_tail(cp.size, &after).map_err(io_err(&s.dir))? {
                tracing::warn!(
                    from = cp.size + 1,
                    "the audit tree's tail did not match the log: mended from the log"
                );
            }
        }
        let (notes, checkpoints) = tokio::sync::watch::channel(None);
        let mut started = Map::new();
        started.insert("public_key".into(), json!(public_key));
        started.insert("origin".into(), json!(origin));
        started.insert(
            "previous".into(),
            json!({ "seq": tail.seq, "clean_shutdown": tail.clean, "torn_bytes_cut": tail.cut }),
        );
        let (tx, rx) = mpsc::channel();
        let queue: Queue = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let sleeping = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let outbox = Arc::new(OutboxState::default());
        let mut w = Writer {
            queue: queue.clone(),
            sleeping: sleeping.clone(),
            outbox: outbox.clone(),
            outbox_cleared: 0,
            outbox_since: None,
            dir: s.dir.clone(),
            key: key.clone(),
            tree,
            origin: origin.clone(),
            last_signed,
            notes,
            file: BufWriter::with_capacity(1 << 16, file),
            segment: tail.segment,
            size,
            seq: tail.seq,
            head: tail.head,
            since_checkpoint: 0,
            settings: s.clone(),
            _writer_lock: writer_lock,
        };
        if tail.cut > 0 || !tail.clean {
            tracing::warn!(
                last_seq = tail.seq,
                torn_bytes = tail.cut,
                "audit log: the previous run did not end with a shutdown checkpoint (crash?)"
            );
        }
        w.append(LOG_STARTED, started).map_err(io_err(&path))?;
        w.sync().map_err(io_err(&path))?;
        let thread = std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || w.run(&rx))
            .map_err(io_err(&s.dir))?;
        Ok(AuditLog {
            dir: s.dir.clone(),
            queue,
            sleeping,
            outbox,
            outbox_next: std::sync::atomic::AtomicU64::new(0),
            tx: parking_lot::Mutex::new(Some(tx)),
            thread: parking_lot::Mutex::new(Some(thread)),
            public_key,
            key,
            checkpoints,
            origin,
            arguments: s.arguments,
            redact: s.redact,
        })
    }

    /// Append an entry (buffered).
    pub fn record(&self, kind: &'static str, fields: Map<String, Value>) {
        self.record_all(vec![(kind, fields)]);
    }

    /// Append entries, in order (buffered). One message to the writer: a
    /// call's entries cost one wake-up of the writer thread, not one each.
    pub fn record_all(&self, entries: Vec<(&'static str, Map<String, Value>)>) {
        if entries.is_empty() {
            return;
        }
        let queued = {
            let mut q = self.queue.lock();
            q.extend(entries);
            q.len()
        };
        let wake = queued >= QUEUE_WAKE
            || self
                .sleeping
                .swap(false, std::sync::atomic::Ordering::SeqCst);
        if wake {
            if let Some(tx) = &*self.tx.lock() {
                let _ = tx.send(Msg {
                    entries: Vec::new(),
                    durable: None,
                });
            }
        }
    }

    /// Append an entry and return once it is on disk.
    pub async fn record_durable(
        &self,
        kind: &'static str,
        fields: Map<String, Value>,
    ) -> Result<(), String> {
        self.record_all_durable(vec![(kind, fields)]).await
    }

    /// Append entries, in order, and return once all are on disk.
    pub async fn record_all_durable(
        &self,
        entries: Vec<(&'static str, Map<String, Value>)>,
    ) -> Result<(), String> {
        let (done, wait) = oneshot::channel();
        {
            let tx = self.tx.lock();
            let tx = tx.as_ref().ok_or("the audit log is closed")?;
            tx.send(Msg {
                entries,
                durable: Some(done),
            })
            .map_err(|_| "the audit writer stopped".to_owned())?;
        }
        wait.await
            .map_err(|_| "the audit writer dropped an entry".to_owned())?
    }

    /// Take over the ledger store's outbox: append the entries a crash left
    /// there (committed with a dispatch but not fsynced here), marked
    /// `recovered`, and from now on share the ledger's fsync for the entries
    /// a dispatch needs on disk. Returns how many entries were recovered.
    pub async fn attach_outbox(
        &self,
        store: Arc<dyn crate::store::Store>,
    ) -> Result<usize, String> {
        let rows = store.outbox().await.map_err(|e| e.to_string())?;
        let mut recovered = Vec::new();
        if !rows.is_empty() {
            let dir = self.dir.clone();
            let tail = tokio::task::spawn_blocking(move || super::segment::tail(&dir, u64::MAX))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
            let present: std::collections::HashSet<String> = tail
                .iter()
                .filter_map(|e| e.get("outbox").and_then(Value::as_str).map(str::to_owned))
                .collect();
            for (_, text) in &rows {
                let entries: Vec<(String, Map<String, Value>)> =
                    serde_json::from_str(text).map_err(|e| format!("a damaged outbox row: {e}"))?;
                for (kind, mut fields) in entries {
                    let tag = fields.get("outbox").and_then(Value::as_str).unwrap_or("");
                    if !present.contains(tag) {
                        fields.insert("recovered".into(), Value::Bool(true));
                        recovered.push((intern(&kind), fields));
                    }
                }
            }
        }
        let n = recovered.len();
        if n > 0 {
            tracing::warn!(
                entries = n,
                "audit log: appending entries a crash left in the ledger's outbox"
            );
            self.record_all_durable(recovered).await?;
        }
        if let Some(max) = rows.iter().map(|(id, _)| *id).max() {
            store.outbox_clear(max).await.map_err(|e| e.to_string())?;
        }
        // Ids never repeat across runs: they start at the clock (µs), past
        // any id a previous run used.
        let start = (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1000) as u64;
        let after_rows = rows.iter().map(|(id, _)| id + 1).max().unwrap_or(0);
        self.outbox_next
            .store(start.max(after_rows), std::sync::atomic::Ordering::SeqCst);
        *self.outbox.store.lock() = Some(store);
        Ok(n)
    }

    /// Stage entries for a dispatch: tag them with an outbox id and give
    /// the JSON for the outbox row. `Err` (the entries back) when no outbox
    /// is attached (the caller must then not dispatch).
    pub fn stage(&self, mut entries: Entries) -> Result<Staged, Entries> {
        if self.outbox.store.lock().is_none() {
            return Err(entries);
        }
        let id = self
            .outbox_next
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        for (i, (_, f)) in entries.iter_mut().enumerate() {
            f.insert("outbox".into(), Value::from(format!("{id}/{i}")));
        }
        let text = serde_json::to_string(&entries).unwrap_or_default();
        Ok(Staged { id, text, entries })
    }

    /// Queue staged entries whose outbox row is committed; the writer
    /// fsyncs them within 50 ms and clears the row.
    pub fn record_staged(&self, staged: Staged) {
        self.record_all(staged.entries);
        self.outbox
            .queued
            .fetch_max(staged.id, std::sync::atomic::Ordering::SeqCst);
    }

    /// Staged entries whose dispatch did not happen: queue all but the
    /// last (the `dispatched` entry), untagged.
    pub fn unstage(&self, staged: Staged) {
        let mut entries = staged.entries;
        entries.pop();
        for (_, f) in entries.iter_mut() {
            f.remove("outbox");
        }
        self.record_all(entries);
    }

    /// The recorded form of `arguments` (see [`super::record_arguments`]).
    pub fn arguments_fields(&self, arguments: &Value, fields: &mut Map<String, Value>) {
        super::record_arguments(self.arguments, &self.redact, arguments, fields);
    }

    /// [`AuditLog::arguments_fields`] from the arguments' JCS text.
    pub fn arguments_fields_jcs(
        &self,
        arguments: &Value,
        jcs: &str,
        fields: &mut Map<String, Value>,
    ) {
        use sha2::{Digest, Sha256};
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(jcs.as_bytes())));
        super::record_arguments_digested(self.arguments, &self.redact, arguments, digest, fields);
    }

    /// Write the shutdown checkpoint and stop the writer.
    pub fn close(&self) {
        self.tx.lock().take();
        let thread = self.thread.lock().take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

impl Drop for AuditLog {
    fn drop(&mut self) {
        self.close();
    }
}

struct Writer {
    /// Held as long as the writer runs: one writer per log.
    _writer_lock: File,
    queue: Queue,
    sleeping: Arc<std::sync::atomic::AtomicBool>,
    outbox: Arc<OutboxState>,
    /// Outbox ids up to this are fsynced here and cleared.
    outbox_cleared: u64,
    /// Since when outbox entries wait for an fsync.
    outbox_since: Option<Instant>,
    dir: PathBuf,
    key: SigningKey,
    /// The Merkle tree over the entries (one leaf each).
    tree: TreeWriter,
    /// The checkpoints' origin.
    origin: String,
    /// The last checkpoint signed: the next must extend it.
    last_signed: Option<Checkpoint>,
    /// Each signed note, for the witness submitter.
    notes: tokio::sync::watch::Sender<Option<Arc<str>>>,
    file: BufWriter<File>,
    segment: u32,
    size: u64,
    seq: u64,
    head: String,
    since_checkpoint: u64,
    settings: Settings,
}

fn now() -> String {
    crate::core::time::rfc3339(crate::core::time::now_ms())
}

impl Writer {
    fn append(&mut self, kind: &str, fields: Map<String, Value>) -> std::io::Result<()> {
        let mut e = Map::with_capacity(fields.len() + 6);
        e.insert("seq".into(), json!(self.seq + 1));
        e.insert("kind".into(), json!(kind));
        if let Some(g) = &self.settings.gateway {
            e.insert("gateway".into(), json!(g));
        }
        let mut stamped = false;
        for (k, v) in fields {
            // The chain fields are the writer's alone; `time` may come with
            // the entry (stamped when the event happened).
            match k.as_str() {
                "seq" | "kind" | "prev" | "hash" | "gateway" => {}
                "time" => {
                    stamped = v.is_string();
                    e.insert(k, v);
                }
                _ => {
                    e.insert(k, v);
                }
            }
        }
        if !stamped {
            e.insert("time".into(), json!(now()));
        }
        e.insert("prev".into(), json!(self.head));
        // The entry's JCS is hashed, then written with `hash` spliced in at
        // its sorted place: the line is the JCS of the whole entry, so a
        // verifier hashes the line's own bytes with `hash` cut out instead
        // of parsing and re-serializing each entry.
        let mut jcs = Vec::with_capacity(640);
        let slot = crate::core::canonical::jcs_object_into_at(&e, &mut jcs, "hash");
        let digest: Hash = sha2::Sha256::digest(&jcs).into();
        let hash = format!("sha256:{}", hex::encode(digest));
        let member = format!("\"hash\":\"{hash}\"");
        let mut line = Vec::with_capacity(jcs.len() + member.len() + 2);
        slot.splice(&jcs, member.as_bytes(), &mut line);
        line.push(b'\n');
        self.file.write_all(&line)?;
        self.tree.push(&digest)?;
        self.size += line.len() as u64;
        self.seq += 1;
        self.head = hash;
        self.since_checkpoint += 1;
        if kind == COSIGNED {
            e.insert("hash".into(), json!(self.head));
            self.add_cosignatures(&e);
        }
        Ok(())
    }

    /// A witness's cosignatures go beside the checkpoint they cosign, in
    /// the checkpoint file (a note with more signature lines), when it is
    /// still the latest.
    fn add_cosignatures(&mut self, e: &Map<String, Value>) {
        let size = e.get("size").and_then(Value::as_u64);
        let lines: Vec<&str> = e
            .get("cosignatures")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let path = self.dir.join(CHECKPOINT_FILE);
        let Ok(text) = std::fs::read_to_string(&path) else {
            return;
        };
        let Ok(mut n) = Note::parse(&text) else {
            return;
        };
        if Checkpoint::parse(&n.text).ok().map(|c| c.size) != size {
            return;
        }
        for sig in lines
            .into_iter()
            .filter_map(|l| note::SigLine::parse(l).ok())
        {
            if !n.sigs.contains(&sig) {
                n.sigs.push(sig);
            }
        }
        if let Err(e) = write_latest(&self.dir, &n.render()) {
            tracing::error!("audit log: the cosigned checkpoint could not be written: {e}");
        }
    }

    fn checkpoint(&mut self, reason: &str) -> std::io::Result<()> {
        // What the checkpoint covers is on disk before it is signed: a crash
        // can then never take back a leaf that a signed checkpoint covers,
        // and the gateway never signs two histories.
        self.sync()?;
        self.tree.flush()?;
        let cp = Checkpoint {
            origin: self.origin.clone(),
            size: self.tree.size(),
            root: self.tree.root(),
        };
        if let Some(last) = &self.last_signed {
            if cp.size < last.size || (cp.size == last.size && cp.root != last.root) {
                return Err(std::io::Error::other(format!(
                    "refusing to sign checkpoint {} : it does not extend checkpoint {} signed before",
                    cp.size, last.size
                )));
            }
        }
        let signed = note::sign(&cp, &self.key).render();
        write_latest(&self.dir, &signed)?;
        let time = now();
        let mut f = Map::new();
        f.insert(
            "checkpoint".into(),
            json!({ "seq": self.seq, "head": self.head, "time": time }),
        );
        f.insert(
            "signature".into(),
            json!(sign_checkpoint(&self.key, self.seq, &self.head, &time)),
        );
        f.insert("note".into(), json!(signed));
        f.insert("reason".into(), json!(reason));
        self.append(CHECKPOINT, f)?;
        self.since_checkpoint = 0;
        self.last_signed = Some(cp);
        // The checkpoint entry itself goes to disk with the next sync (a
        // clean stop syncs it now): the note's promise rests on the entries
        // it covers, which are on disk already, so a new note after a crash
        // can only extend it.
        if reason == "shutdown" {
            self.sync()?;
        }
        self.notes.send_replace(Some(Arc::from(signed)));
        Ok(())
    }

    fn sync(&mut self) -> std::io::Result<()> {
        self.file.flush()?;
        self.file.get_ref().sync_data()
    }

    fn rotate_if_full(&mut self) -> std::io::Result<()> {
        if self.size < self.settings.segment_bytes {
            return Ok(());
        }
        self.sync()?;
        self.segment += 1;
        let path = segment_path(&self.dir, self.segment);
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        self.file = BufWriter::with_capacity(1 << 16, file);
        self.size = 0;
        // The new file's directory entry is durable too.
        File::open(&self.dir)?.sync_all()?;
        Ok(())
    }

    fn clear_outbox(&mut self, upto: u64) {
        let store = self.outbox.store.lock().clone();
        if let Some(store) = store {
            // Enqueued on the ledger writer at once; not awaited (this is
            // not an async thread, and the clear need not be durable).
            drop(store.outbox_clear(upto));
        }
        self.outbox_cleared = upto;
        self.outbox_since = None;
    }

    /// Append what waits in the queue (before any message that came after
    /// it, so a durable entry follows every buffered entry made before it).
    fn drain(&mut self, failed: &mut Option<String>, last_checkpoint: &mut Instant) -> bool {
        let queued = std::mem::take(&mut *self.queue.lock());
        let any = !queued.is_empty();
        for (kind, fields) in queued {
            self.append_counted(kind, fields, failed, last_checkpoint);
        }
        any
    }

    fn append_counted(
        &mut self,
        kind: &str,
        fields: Map<String, Value>,
        failed: &mut Option<String>,
        last_checkpoint: &mut Instant,
    ) {
        if let Err(e) = self.append(kind, fields) {
            *failed = Some(e.to_string());
        }
        if self.since_checkpoint >= self.settings.checkpoint_every {
            if let Err(e) = self.checkpoint("count") {
                *failed = Some(e.to_string());
            }
            *last_checkpoint = Instant::now();
        }
    }

    fn run(mut self, rx: &mpsc::Receiver<Msg>) {
        let mut last_checkpoint = Instant::now();
        // Written to the BufWriter but not yet handed to the OS, and since
        // when.
        let mut buffered_since: Option<Instant> = None;
        let mut open = true;
        // Consecutive polls that found nothing.
        let mut quiet = 0u32;
        while open {
            // Idle long enough with nothing buffered: block until a producer
            // or the checkpoint interval wakes us, instead of polling.
            let outbox_waiting =
                self.outbox.queued.load(std::sync::atomic::Ordering::SeqCst) > self.outbox_cleared;
            let asleep = quiet >= 10 && buffered_since.is_none() && !outbox_waiting;
            let timeout = if asleep {
                self.sleeping
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                // Re-check after announcing sleep: an entry queued just
                // before would otherwise wait for the next message.
                if self.queue.lock().is_empty() {
                    (self.since_checkpoint > 0).then(|| {
                        self.settings
                            .checkpoint_interval
                            .saturating_sub(last_checkpoint.elapsed())
                    })
                } else {
                    Some(Duration::ZERO)
                }
            } else {
                Some(QUEUE_POLL)
            };
            let first = match timeout {
                Some(t) => match rx.recv_timeout(t) {
                    Ok(m) => Some(m),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        open = false;
                        None
                    }
                },
                None => match rx.recv() {
                    Ok(m) => Some(m),
                    Err(_) => {
                        open = false;
                        None
                    }
                },
            };
            self.sleeping
                .store(false, std::sync::atomic::Ordering::SeqCst);
            let got_message = first.is_some();
            let mut waiters = Vec::new();
            let mut failed = None;
            // Read before draining: every entry of an outbox id up to this
            // was queued before it was published, so the drain appends it.
            let outbox_max = self.outbox.queued.load(std::sync::atomic::Ordering::SeqCst);
            if outbox_max > self.outbox_cleared {
                self.outbox_since.get_or_insert_with(Instant::now);
            }
            let drained = self.drain(&mut failed, &mut last_checkpoint);
            if drained {
                buffered_since.get_or_insert_with(Instant::now);
            }
            quiet = if drained || got_message {
                0
            } else {
                quiet.saturating_add(1)
            };
            let mut batch: Vec<Msg> = first.into_iter().collect();
            while batch.len() < 1024 {
                match rx.try_recv() {
                    Ok(m) => batch.push(m),
                    Err(_) => break,
                }
            }
            for msg in batch {
                for (kind, fields) in msg.entries {
                    self.append_counted(kind, fields, &mut failed, &mut last_checkpoint);
                    buffered_since.get_or_insert_with(Instant::now);
                }
                if let Some(d) = msg.durable {
                    waiters.push(d);
                }
            }
            let interval_due = self.since_checkpoint > 0
                && last_checkpoint.elapsed() >= self.settings.checkpoint_interval;
            let flush_due = buffered_since.is_some_and(|t| t.elapsed() >= IDLE_FLUSH);
            let outbox_due = self
                .outbox_since
                .is_some_and(|t| t.elapsed() >= OUTBOX_SYNC);
            let result = if outbox_due && !interval_due && waiters.is_empty() {
                buffered_since = None;
                self.sync()
            } else if interval_due {
                last_checkpoint = Instant::now();
                buffered_since = None;
                self.checkpoint("interval")
            } else if !waiters.is_empty() {
                buffered_since = None;
                self.sync()
            } else if flush_due {
                buffered_since = None;
                self.file.flush()
            } else {
                Ok(())
            };
            let synced = result.is_ok() && (outbox_due || interval_due || !waiters.is_empty());
            if let Err(e) = result.and_then(|()| self.rotate_if_full()) {
                failed = Some(e.to_string());
            }
            // Entries of outbox ids up to `outbox_max` are on disk here now:
            // their rows in the ledger can go (a lost clear is repaired at
            // the next start, which finds the entries present).
            if synced && outbox_max > self.outbox_cleared && failed.is_none() {
                self.clear_outbox(outbox_max);
            }
            if let Some(e) = &failed {
                tracing::error!("audit log write failed: {e}");
            }
            for w in waiters {
                let _ = w.send(match &failed {
                    None => Ok(()),
                    Some(e) => Err(e.clone()),
                });
            }
        }
        let mut failed = None;
        let outbox_max = self.outbox.queued.load(std::sync::atomic::Ordering::SeqCst);
        self.drain(&mut failed, &mut last_checkpoint);
        match self.checkpoint("shutdown") {
            Ok(()) if failed.is_none() && outbox_max > self.outbox_cleared => {
                self.clear_outbox(outbox_max)
            }
            Ok(()) => {}
            Err(e) => tracing::error!("audit log: the shutdown checkpoint failed: {e}"),
        }
    }
}

/// How long appended entries may wait in the file buffer before they are
/// handed to the OS (a gateway process crash loses at most these and the
/// queue; `verify` reports such a loss as truncation).
const IDLE_FLUSH: Duration = Duration::from_millis(100);

/// The current length of a file (tests).
#[cfg(test)]
fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

impl super::AuditSink for AuditLog {
    fn record_all(&self, entries: Entries) {
        AuditLog::record_all(self, entries);
    }

    fn lag(&self) -> usize {
        self.queue.lock().len()
    }

    fn stage(&self, entries: Entries) -> Result<Staged, Entries> {
        AuditLog::stage(self, entries)
    }

    fn record_staged(&self, staged: Staged) {
        AuditLog::record_staged(self, staged);
    }

    fn unstage(&self, staged: Staged) {
        AuditLog::unstage(self, staged);
    }

    fn arguments_fields_jcs(&self, arguments: &Value, jcs: &str, fields: &mut Map<String, Value>) {
        AuditLog::arguments_fields_jcs(self, arguments, jcs, fields);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(dir: &Path) -> Settings {
        Settings {
            dir: dir.to_owned(),
            checkpoint_every: 3,
            checkpoint_interval: Duration::from_secs(60),
            segment_bytes: 1500,
            arguments: ArgumentMode::Full,
            redact: vec![],
            gateway: Some("gw-test".into()),
            origin: None,
        }
    }

    #[tokio::test]
    async fn a_second_writer_of_one_log_is_refused_and_the_lock_goes_with_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let first = AuditLog::open(settings(dir.path())).unwrap();
        assert!(writer_running(dir.path()));
        let second = AuditLog::open(settings(dir.path()));
        let err = second.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            err.contains("another process writes this audit log"),
            "{err}"
        );
        drop(first);
        assert!(!writer_running(dir.path()));
        AuditLog::open(settings(dir.path())).unwrap();
    }

    #[tokio::test]
    async fn the_chain_continues_across_segments_restarts_and_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        {
            let log = AuditLog::open(settings(dir.path())).unwrap();
            for i in 0..10 {
                log.record(
                    "call_received",
                    json!({ "i": i }).as_object().unwrap().clone(),
                );
            }
            log.record_durable("dispatched", Map::new()).await.unwrap();
        }
        let segs = segments(dir.path()).unwrap();
        assert!(segs.len() > 1, "rotated: {segs:?}");
        // A torn write at the end (a crash mid-line).
        let last = segs.last().unwrap().clone();
        let before = file_len(&last);
        let mut f = OpenOptions::new().append(true).open(&last).unwrap();
        f.write_all(b"{\"seq\":99,\"ti").unwrap();
        drop(f);
        {
            let _log = AuditLog::open(settings(dir.path())).unwrap();
        }
        assert!(file_len(&last) >= before);
        let report = super::super::verify::verify_dir(dir.path(), None, None).unwrap();
        assert!(report.brk.is_none(), "{report:?}");
        assert!(report.entries > 14, "{report:?}");
        assert!(report.ended_clean);
    }

    #[tokio::test]
    async fn a_damaged_tree_is_made_again_from_the_log_across_segments() {
        let dir = tempfile::tempdir().unwrap();
        {
            let log = AuditLog::open(settings(dir.path())).unwrap();
            for i in 0..30 {
                log.record_durable(
                    "call_received",
                    json!({ "i": i }).as_object().unwrap().clone(),
                )
                .await
                .unwrap();
            }
        }
        assert!(segments(dir.path()).unwrap().len() > 2);
        let root = |dir: &Path| {
            let r = super::super::verify::verify_dir(dir, None, None).unwrap();
            assert!(r.brk.is_none(), "{}", r.render());
            r.tree
        };
        let good = root(dir.path());
        // The first leaf of the tree file damaged: the last checkpoint no
        // longer matches the tree, which is made again from the log.
        let tree = dir.path().join(super::super::tree::TREE_FILE);
        let f = OpenOptions::new().write(true).open(&tree).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &[0xee; 32], 0).unwrap();
        drop(f);
        {
            let _log = AuditLog::open(settings(dir.path())).unwrap();
        }
        let reader = super::super::tree::TreeReader::open(dir.path()).unwrap();
        let now = root(dir.path());
        assert!(
            now.0 > good.0,
            "two more entries: log_started, the shutdown checkpoint"
        );
        let rebuilt = super::super::merkle::root(&reader, now.0).unwrap();
        assert_eq!(
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, rebuilt),
            now.1,
            "the tree is the log's again"
        );
    }

    #[test]
    fn an_idle_writer_wakes_for_the_next_entry_and_hands_it_to_the_os() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::open(settings(dir.path())).unwrap();
        let lines = || {
            segments(dir.path())
                .unwrap()
                .iter()
                .map(|s| std::fs::read_to_string(s).unwrap().lines().count())
                .sum::<usize>()
        };
        // Long enough for the writer to go to sleep.
        std::thread::sleep(Duration::from_millis(300));
        log.record("call_received", Map::new());
        let deadline = Instant::now() + Duration::from_secs(2);
        while lines() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            lines(),
            2,
            "log_started and the entry, without closing the log"
        );
    }

    #[tokio::test]
    async fn entries_left_in_the_ledger_outbox_by_a_crash_are_appended_once() {
        use crate::core::ledger::{Claim, Record, State};
        use crate::store::{MemoryStore, Store};
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        // A dispatch committed its entries to the outbox, then the gateway
        // died before the audit writer appended them.
        let claim = Claim {
            key: "k".into(),
            client_key: "k".into(),
            explicit: true,
            digest: "d".into(),
            server: "s".into(),
            tool: "t".into(),
        };
        let r = Record::reserve(&claim, 0, 1000);
        store.reserve("k".into(), r.clone(), 0).await.unwrap();
        let mut dispatched = r.clone();
        dispatched.state = State::Dispatched;
        let row = serde_json::to_string(&vec![
            (
                "call_received",
                json!({"idempotency_key": "k", "outbox": "7/0"}),
            ),
            (
                "dispatched",
                json!({"idempotency_key": "k", "outbox": "7/1"}),
            ),
        ])
        .unwrap();
        assert!(store
            .transition_with("k".into(), State::Reserved, dispatched, Some((7, row)))
            .await
            .unwrap());
        {
            let log = AuditLog::open(settings(dir.path())).unwrap();
            assert_eq!(log.attach_outbox(store.clone()).await.unwrap(), 2);
        }
        assert!(
            store.outbox().await.unwrap().is_empty(),
            "the rows are cleared"
        );
        let all: Vec<Map<String, Value>> = segments(dir.path())
            .unwrap()
            .iter()
            .flat_map(|s| {
                std::fs::read_to_string(s)
                    .unwrap()
                    .lines()
                    .filter_map(|l| serde_json::from_str(l).ok())
                    .collect::<Vec<_>>()
            })
            .collect();
        let recovered: Vec<_> = all
            .iter()
            .filter(|e| e.get("recovered").is_some())
            .collect();
        assert_eq!(recovered.len(), 2);
        assert_eq!(recovered[1]["kind"], "dispatched");
        let report = super::super::verify::verify_dir(dir.path(), None, None).unwrap();
        assert!(report.brk.is_none(), "{report:?}");

        // A row whose entries did reach the file is not appended again.
        let r2 = Record::reserve(
            &Claim {
                key: "k2".into(),
                ..claim
            },
            0,
            1000,
        );
        store.reserve("k2".into(), r2.clone(), 0).await.unwrap();
        let mut d2 = r2;
        d2.state = State::Dispatched;
        let log = AuditLog::open(settings(dir.path())).unwrap();
        log.record(
            "dispatched",
            json!({"outbox": "8/0"}).as_object().unwrap().clone(),
        );
        log.close();
        let row = serde_json::to_string(&vec![("dispatched", json!({"outbox": "8/0"}))]).unwrap();
        store
            .transition_with("k2".into(), State::Reserved, d2, Some((8, row)))
            .await
            .unwrap();
        let log = AuditLog::open(settings(dir.path())).unwrap();
        assert_eq!(log.attach_outbox(store.clone()).await.unwrap(), 0);
        assert!(store.outbox().await.unwrap().is_empty());
    }
}
