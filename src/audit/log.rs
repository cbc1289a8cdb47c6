//! The audit log of a running gateway ([`AuditLog`]): what the gateway
//! records through. One thread appends entries in order, chains them,
//! signs checkpoints, rotates segments and fsyncs what must be durable (the
//! writer task, `audit::writer`); the log opens where the last run left it
//! (`audit::recover`) and shares the ledger's fsync through its outbox
//! (`audit::outbox`).
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

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};

use ed25519_dalek::SigningKey;
use serde_json::{json, Map, Value};
use tokio::sync::oneshot;

use super::segment::{io_err, segment_path, AuditError};
use super::tree::TreeWriter;

pub use super::outbox::Staged;
use super::outbox::{self, Outbox};
use super::recover::{check_extends, latest_signed, recover, tail_hashes};
use super::writer::{Msg, Queue, Writer, QUEUE_WAKE};
use super::{hash_bytes, ArgumentMode, Fields, LOG_STARTED};
use crate::core::reviewers::{format_public_key, KeyFile};
use crate::store::Store;

pub use super::writer::Settings;

/// The lock file in the audit dir, locked by the process that writes the log.
pub const WRITER_LOCK: &str = "writer.lock";

#[cfg(test)]
thread_local! {
    /// Tests: open the log trusting its tree file, as before the tree was
    /// checked against the log after a power cut.
    pub(super) static TRUST_THE_TREE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[cfg(test)]
fn trusting_the_tree() -> bool {
    TRUST_THE_TREE.with(std::cell::Cell::get)
}

#[cfg(not(test))]
const fn trusting_the_tree() -> bool {
    false
}

/// Lock the log for this writer. Two writers would interleave two chains in
/// one file and break it, so a second one (another gateway started on the
/// same data dir) is refused. The lock goes with the process, so a crash
/// leaves nothing to clean up.
fn take_writer_lock(dir: &Path) -> Result<File, AuditError> {
    let path = dir.join(WRITER_LOCK);
    let file = crate::store::private::options()
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
            cause: None,
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
                cause: Some(Box::new(e)),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let kf = KeyFile::generate("gateway", rand::random());
            let key = kf.signing_key().map_err(|e| AuditError {
                path: path.clone(),
                message: e.to_string(),
                cause: Some(Box::new(e)),
            })?;
            let text = format!(
                "# countersign gateway audit key: signs checkpoints; keep it secret, back it up\n{}",
                toml::to_string(&kf).map_err(|e| AuditError {
                    path: path.clone(),
                    message: e.to_string(),
                    cause: Some(Box::new(e)),
                })?
            );
            // Durably (file and folder): a key lost to a power cut after
            // it signed a checkpoint would leave the log unverifiable.
            crate::store::durable::write(&path, text).map_err(io_err(&path))?;
            let pub_path = dir.join("gateway.pub");
            crate::store::durable::write(
                &pub_path,
                format!("{}\n", format_public_key(&key.verifying_key())),
            )
            .map_err(io_err(&pub_path))?;
            Ok(key)
        }
        Err(e) => Err(io_err(&path)(e)),
    }
}

pub use super::Entries;

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
    outbox: Arc<Outbox>,
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

/// Stamp each entry that carries no `time` with now: when it was recorded,
/// not when the writer thread gets to it. A call's entries are stamped as
/// they happen (see `trail`); had the writer stamped an entry recorded just
/// before them (a `tools_learned` on a call's first use), a late drain would
/// give it a later time than the call's, and the log's times would step
/// back from cause to effect.
fn stamp(entries: &mut [(&'static str, Fields)]) {
    let mut now: Option<Value> = None;
    for (_, f) in entries.iter_mut() {
        if !f.get("time").is_some_and(Value::is_string) {
            let t = now.get_or_insert_with(|| {
                Value::from(crate::core::time::rfc3339(crate::core::time::now_ms()))
            });
            f.insert("time", t.clone());
        }
    }
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
        crate::store::durable::dir_all(&s.dir).map_err(io_err(&s.dir))?;
        let writer_lock = take_writer_lock(&s.dir)?;
        let key = load_or_create_key(&s.dir)?;
        let public_key = format_public_key(&key.verifying_key());
        let tail = recover(&s.dir)?;
        let path = segment_path(&s.dir, tail.segment);
        let new_segment = !path.exists();
        let file = crate::store::private::options()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io_err(&path))?;
        if new_segment {
            // The first segment's entry in the folder outlives a power cut.
            crate::store::durable::created(&path).map_err(io_err(&path))?;
        }
        let size = file.metadata().map_err(io_err(&path))?.len();
        // The tree, level with the log; then the promise of the last
        // checkpoint signed: the log must still hold what it covered.
        let tail_of_log = |from| tail_hashes(&s.dir, from);
        let mut tree = TreeWriter::open(&s.dir, tail.seq, hash_bytes(&tail.head), tail_of_log)?;
        let origin = s.origin();
        let last_signed = latest_signed(&s.dir, &key)?;
        if trusting_the_tree() {
            // Tests only: the old behaviour, to show the power-loss
            // property catches it.
        } else if let Some(cp) = &last_signed {
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
        } else {
            // Nothing signed yet: the tree (never fsynced, so a power cut
            // may leave zeros or a torn sector in it) is checked leaf by
            // leaf against the log, so that the first root signed is one
            // made from entries on disk.
            let all = tail_of_log(1)?;
            if tree.mend_tail(0, &all).map_err(io_err(&s.dir))? {
                tracing::warn!("the audit tree did not match the log: made again from the log");
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
        let outbox = Arc::new(Outbox::default());
        let mut w = Writer {
            queue: queue.clone(),
            sleeping: sleeping.clone(),
            outbox: outbox.clone(),
            outbox_cleared: 0,
            outbox_synced: 0,
            outbox_cleared_at: std::time::Instant::now(),
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
        w.append(LOG_STARTED, started.into())
            .map_err(io_err(&path))?;
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

    /// Append an entry (buffered), stamped now unless it carries its time.
    pub fn record(&self, kind: &'static str, fields: impl Into<Fields>) {
        self.record_all(vec![(kind, fields.into())]);
    }

    /// Append entries, in order (buffered). One message to the writer: a
    /// call's entries cost one wake-up of the writer thread, not one each.
    pub fn record_all(&self, mut entries: Entries) {
        if entries.is_empty() {
            return;
        }
        stamp(&mut entries);
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
        fields: impl Into<Fields>,
    ) -> Result<(), String> {
        self.record_all_durable(vec![(kind, fields.into())]).await
    }

    /// Append entries, in order, and return once all are on disk.
    pub async fn record_all_durable(&self, mut entries: Entries) -> Result<(), String> {
        stamp(&mut entries);
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
        store: Arc<dyn Store>,
    ) -> Result<usize, outbox::RecoveryError> {
        let rows = store.outbox().await?;
        let recovered = outbox::recovered(&self.dir, &rows).await?;
        let n = recovered.len();
        if n > 0 {
            tracing::warn!(
                entries = n,
                "audit log: appending entries a crash left in the ledger's outbox"
            );
            self.record_all_durable(recovered)
                .await
                .map_err(outbox::RecoveryError::Writer)?;
        }
        if let Some(max) = rows.iter().map(|(id, _)| *id).max() {
            store.outbox_clear(max).await?;
        }
        self.outbox.attach(store, &rows);
        Ok(n)
    }

    /// Stage entries for a dispatch: tag them with an outbox id and give
    /// the JSON for the outbox row. `Err` (the entries back) when no outbox
    /// is attached (the caller must then not dispatch).
    pub fn stage(&self, entries: Entries) -> Result<Staged, Entries> {
        self.outbox.stage(entries)
    }

    /// Queue staged entries whose outbox row is committed; the writer
    /// fsyncs them within 50 ms and clears the row (within a second while
    /// calls keep coming, at once when it goes idle).
    pub fn record_staged(&self, staged: Staged) {
        let id = staged.id;
        self.record_all(staged.entries);
        self.outbox.queued_up_to(id);
    }

    /// Staged entries whose dispatch did not happen: queue all but the
    /// last (the `dispatched` entry), untagged.
    pub fn unstage(&self, staged: Staged) {
        self.record_all(outbox::unstaged(staged));
    }

    /// The recorded form of `arguments` (see [`super::record_arguments`]).
    pub fn arguments_fields(&self, arguments: &Value, fields: &mut Fields) {
        super::record_arguments(self.arguments, &self.redact, arguments, fields);
    }

    /// [`AuditLog::arguments_fields`] from the arguments' JCS text.
    pub fn arguments_fields_jcs(&self, arguments: &Value, jcs: &str, fields: &mut Fields) {
        let digest =
            crate::core::canonical::sha256_text(&crate::core::sha256::digest(jcs.as_bytes()));
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

    fn arguments_fields_jcs(&self, arguments: &Value, jcs: &str, fields: &mut Fields) {
        AuditLog::arguments_fields_jcs(self, arguments, jcs, fields);
    }

    fn changes_value(&self, changes: &[crate::core::approval::Change]) -> Value {
        super::record_changes(self.arguments, &self.redact, changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::segment::segments;
    use std::fs::OpenOptions;
    use std::io::Write;
    use std::time::{Duration, Instant};

    /// The current length of a file (tests).
    fn file_len(path: &Path) -> u64 {
        std::fs::metadata(path).map_or(0, |m| m.len())
    }

    /// Every entry of the log in `dir`, in order, read as `audit verify`
    /// reads it; a line that is not an entry fails the test.
    fn entries(dir: &Path) -> Vec<Map<String, Value>> {
        let mut all = Vec::new();
        super::super::verify::each_line(dir, |line, place| {
            all.push(serde_json::from_slice(line).unwrap_or_else(|e| panic!("{place}: {e}")));
            true
        })
        .unwrap();
        all
    }

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

    /// Power loss (F1): `tree.hashes` is never fsynced and an older
    /// release wrote `checkpoint` without an fsync. After a cut, ext4 may
    /// leave the tree's length with zeros in it and the checkpoint empty.
    /// The gateway then took "no checkpoint" for true, trusted the zeros,
    /// and signed a checkpoint over a wrong root. The log's own checkpoint
    /// entry now stands in for the file, the tree is judged against it and
    /// made again, and the next checkpoint verifies.
    #[tokio::test]
    async fn a_zeroed_tree_and_an_empty_checkpoint_file_never_get_a_wrong_root_signed() {
        let dir = tempfile::tempdir().unwrap();
        {
            let log = AuditLog::open(settings(dir.path())).unwrap();
            for i in 0..12 {
                log.record_durable(
                    "call_received",
                    json!({ "i": i }).as_object().unwrap().clone(),
                )
                .await
                .unwrap();
            }
        }
        let tree = dir.path().join(super::super::tree::TREE_FILE);
        let kept = file_len(&tree) / 2 / 32 * 32;
        std::fs::write(&tree, vec![0u8; usize::try_from(kept).unwrap()]).unwrap();
        std::fs::write(dir.path().join(super::super::CHECKPOINT_FILE), "").unwrap();
        {
            let log = AuditLog::open(settings(dir.path())).unwrap();
            for i in 0..4 {
                log.record_durable(
                    "call_received",
                    json!({ "after": i }).as_object().unwrap().clone(),
                )
                .await
                .unwrap();
            }
        }
        let report = super::super::verify::verify_dir(dir.path(), None, None).unwrap();
        assert!(report.brk.is_none(), "{}", report.render());
        assert!(report.ended_clean);
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

    #[test]
    fn an_entry_is_stamped_when_recorded_not_when_the_writer_gets_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::open(settings(dir.path())).unwrap();
        log.record("tools_learned", Map::new());
        let recorded = crate::core::time::now_ms();
        // The writer is held off the queue for a while, as a busy machine
        // would hold it; the delay is the point, not a wait for an event.
        {
            let _held = log.queue.lock();
            std::thread::sleep(Duration::from_millis(50));
        }
        log.close();
        let entry = entries(dir.path())
            .into_iter()
            .find(|e| e["kind"] == "tools_learned")
            .expect("the entry is written");
        let t = crate::core::time::parse_rfc3339(entry["time"].as_str().unwrap()).unwrap();
        assert!(
            t <= recorded,
            "stamped at {t}, after it was recorded ({recorded})"
        );
    }

    /// Dispatches' entries staged in the ledger's outbox: once the writer
    /// has them fsynced, their rows are cleared (the first at once), and
    /// the entries are in the log. A second round, within the minute that
    /// paces this store's clears, is cleared when the writer goes idle, not
    /// after it wakes (here the next checkpoint is a minute away).
    #[tokio::test]
    async fn outbox_rows_are_cleared_once_their_entries_are_on_disk() {
        use crate::core::ledger::{Claim, Record, State};
        use crate::store::{MemoryStore, Store};
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(MemoryStore::default().with_outbox_clear_pace(Duration::from_secs(60)));
        let log = AuditLog::open(settings(dir.path())).unwrap();
        log.attach_outbox(store.clone()).await.unwrap();
        for round in 0..2 {
            for i in 0..3 {
                let key = format!("k{round}-{i}");
                let claim = Claim {
                    key: key.clone(),
                    client_key: key.clone(),
                    explicit: true,
                    digest: "d".into(),
                    server: "s".into(),
                    tool: "t".into(),
                };
                let mut r = Record::reserve(&claim, 0, 1000);
                r.state = State::Dispatched;
                let mut fields = Fields::new();
                fields.insert("idempotency_key", json!(key));
                let staged = log.stage(vec![("dispatched", fields)]).unwrap();
                assert!(store
                    .reserve_dispatched(key, r, 0, Some((staged.id, staged.text.clone())))
                    .await
                    .unwrap());
                log.record_staged(staged);
            }
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while !store.outbox().await.unwrap().is_empty() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "round {round}: the rows stay"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let dispatched = entries(dir.path())
                .iter()
                .filter(|e| e["kind"] == "dispatched")
                .count();
            assert_eq!(dispatched, 3 * (round + 1));
        }
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
        let all = entries(dir.path());
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
