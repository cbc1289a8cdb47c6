//! The writer task: one thread appends entries in order, chains them, signs
//! checkpoints, rotates segments and fsyncs what must be durable. Buffered
//! entries wait in a queue it drains every few milliseconds; durable ones
//! come with a reply that is answered once they are on disk.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::merkle::Hash;
use super::note::{self, Checkpoint, Note};
use super::outbox::{Outbox, OUTBOX_CLEAR_IDS, OUTBOX_SYNC};
use super::recover::write_latest;
use super::segment::segment_path;
use super::tree::TreeWriter;
use super::ArgumentMode;
use super::{sign_checkpoint, Entries, Fields, Member, CHECKPOINT, CHECKPOINT_FILE, COSIGNED};

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

pub(super) type Queue = Arc<parking_lot::Mutex<Entries>>;

/// How often the writer drains the queue of buffered entries.
pub(super) const QUEUE_POLL: Duration = Duration::from_millis(2);

/// Past this many queued entries, the writer is woken at once (bounds the
/// queue under load).
pub(super) const QUEUE_WAKE: usize = 4096;

/// Entries appended together, in order; `durable` is answered once all of
/// them are on disk.
pub(super) struct Msg {
    pub(super) entries: Entries,
    pub(super) durable: Option<oneshot::Sender<Result<(), String>>>,
}

pub(super) struct Writer {
    /// Held as long as the writer runs: one writer per log.
    pub(super) _writer_lock: File,
    pub(super) queue: Queue,
    pub(super) sleeping: Arc<std::sync::atomic::AtomicBool>,
    pub(super) outbox: Arc<Outbox>,
    /// Outbox ids up to this are fsynced here and cleared.
    pub(super) outbox_cleared: u64,
    /// Outbox ids up to this are fsynced here (their rows may be cleared).
    pub(super) outbox_synced: u64,
    /// When the outbox was last cleared.
    pub(super) outbox_cleared_at: Instant,
    /// Since when outbox entries wait for an fsync.
    pub(super) outbox_since: Option<Instant>,
    pub(super) dir: PathBuf,
    pub(super) key: SigningKey,
    /// The Merkle tree over the entries (one leaf each).
    pub(super) tree: TreeWriter,
    /// The checkpoints' origin.
    pub(super) origin: String,
    /// The last checkpoint signed: the next must extend it.
    pub(super) last_signed: Option<Checkpoint>,
    /// Each signed note, for the witness submitter.
    pub(super) notes: tokio::sync::watch::Sender<Option<Arc<str>>>,
    pub(super) file: BufWriter<File>,
    pub(super) segment: u32,
    pub(super) size: u64,
    pub(super) seq: u64,
    pub(super) head: String,
    pub(super) since_checkpoint: u64,
    pub(super) settings: Settings,
}

fn now() -> String {
    crate::core::time::rfc3339(crate::core::time::now_ms())
}

impl Writer {
    pub(super) fn append(&mut self, kind: &str, fields: Fields) -> std::io::Result<()> {
        // The entry is the fields handed in, with the chain fields (the
        // writer's alone) set here: whatever a caller put under those names
        // is replaced. `time` may come with the entry (stamped when the
        // event happened).
        let mut e = fields;
        if self.settings.gateway.is_none() {
            e.remove("gateway");
        }
        let stamped = (!e.get("time").is_some_and(Value::is_string)).then(now);
        // In key order, set over the fields as the entry is written.
        let over = [
            self.settings
                .gateway
                .as_deref()
                .map(|g| ("gateway", Member::Text(g))),
            Some(("kind", Member::Text(kind))),
            Some(("prev", Member::Text(&self.head))),
            Some(("seq", Member::Count(self.seq + 1))),
            stamped.as_deref().map(|t| ("time", Member::Text(t))),
        ];
        // The entry's JCS is hashed, then written with `hash` spliced in at
        // its sorted place: the line is the JCS of the whole entry, so a
        // verifier hashes the line's own bytes with `hash` cut out instead
        // of parsing and re-serializing each entry.
        let mut jcs = Vec::with_capacity(640);
        let slot = e.jcs_over_into_at(over.into_iter().flatten(), &mut jcs, "hash");
        let digest: Hash = crate::core::sha256::digest(&jcs);
        let hash = crate::core::canonical::sha256_text(&digest);
        let member: [&[u8]; 3] = [b"\"hash\":\"", hash.as_bytes(), b"\""];
        let mut line = Vec::with_capacity(jcs.len() + hash.len() + 12);
        slot.splice(&jcs, &member, &mut line);
        line.push(b'\n');
        self.file.write_all(&line)?;
        self.tree.push(&digest)?;
        self.size += line.len() as u64;
        self.seq += 1;
        self.head = hash;
        self.since_checkpoint += 1;
        if kind == COSIGNED {
            self.add_cosignatures(&e);
        }
        Ok(())
    }

    /// A witness's cosignatures go beside the checkpoint they cosign, in
    /// the checkpoint file (a note with more signature lines), when it is
    /// still the latest.
    fn add_cosignatures(&mut self, e: &Fields) {
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
        let f = Fields::from([
            (
                "checkpoint",
                json!({ "seq": self.seq, "head": self.head, "time": time }),
            ),
            (
                "signature",
                json!(sign_checkpoint(&self.key, self.seq, &self.head, &time)),
            ),
            ("note", json!(signed)),
            ("reason", json!(reason)),
        ]);
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

    pub(super) fn sync(&mut self) -> std::io::Result<()> {
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
        let file = crate::store::private::options()
            .create(true)
            .append(true)
            .open(&path)?;
        self.file = BufWriter::with_capacity(1 << 16, file);
        self.size = 0;
        // The new file's directory entry is durable too.
        crate::store::durable::created(&path)?;
        Ok(())
    }

    fn clear_outbox(&mut self, upto: u64) {
        let store = self.outbox.store();
        if let Some(store) = store {
            // Enqueued on the ledger writer at once; not awaited (this is
            // not an async thread, and the clear need not be durable).
            drop(store.outbox_clear(upto));
        }
        self.outbox_cleared = upto;
        self.outbox_cleared_at = Instant::now();
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
        fields: Fields,
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

    pub(super) fn run(mut self, rx: &mpsc::Receiver<Msg>) {
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
            let outbox_waiting = self.outbox.queued() > self.outbox_synced;
            let asleep = quiet >= 10 && buffered_since.is_none() && !outbox_waiting;
            // Going idle: what is fsynced and not yet cleared is cleared
            // now, not after the writer wakes.
            if asleep && self.outbox_synced > self.outbox_cleared {
                self.clear_outbox(self.outbox_synced);
            }
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
            let outbox_max = self.outbox.queued();
            if outbox_max > self.outbox_synced {
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
            if synced && outbox_max > self.outbox_synced && failed.is_none() {
                self.outbox_synced = outbox_max;
                self.outbox_since = None;
            }
            let clear_due = self.outbox_cleared_at.elapsed() >= self.outbox.clear_pace()
                || self.outbox_synced - self.outbox_cleared >= OUTBOX_CLEAR_IDS;
            if self.outbox_synced > self.outbox_cleared && clear_due {
                self.clear_outbox(self.outbox_synced);
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
        let outbox_max = self.outbox.queued();
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
