//! Tests: a redb storage that loses what was not fsynced. Writes land in
//! the live image; `sync_data` makes the live image the durable one; a
//! power cut ([`Disk::cut`]) leaves only the durable image, as a disk does
//! for writes that never reached it (the most the OS may lose).

use std::io;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{JournalAt, RedbStore};
use crate::store::StoreError;

/// The two images of one database file.
#[derive(Debug, Default)]
pub(crate) struct Disk {
    live: Mutex<Vec<u8>>,
    durable: Mutex<Vec<u8>>,
    /// Every fsync fails (a disk that went read-only, or away).
    failing: std::sync::atomic::AtomicBool,
}

impl Disk {
    /// A disk holding `image`, all of it durable.
    pub(crate) fn holding(image: Vec<u8>) -> Arc<Disk> {
        Arc::new(Disk {
            live: Mutex::new(image.clone()),
            durable: Mutex::new(image),
            failing: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// From now on every fsync fails.
    pub(crate) fn fail_syncs(&self) {
        self.failing
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// What a power cut now leaves: the durable image.
    pub(crate) fn cut(&self) -> Vec<u8> {
        self.durable.lock().clone()
    }

    /// What was written, synced or not.
    pub(crate) fn live(&self) -> Vec<u8> {
        self.live.lock().clone()
    }
}

/// The journal's [`super::super::journal::Medium`] on a [`Disk`].
pub(crate) struct JournalOn(pub(crate) Arc<Disk>);

impl super::super::journal::Medium for JournalOn {
    fn truncate(&mut self) -> io::Result<()> {
        self.0.live.lock().clear();
        Ok(())
    }

    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.0.live.lock().extend_from_slice(bytes);
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        redb::StorageBackend::sync_data(&Backend(self.0.clone()), false)
    }
}

/// A [`redb::StorageBackend`] over a [`Disk`].
#[derive(Debug)]
pub(crate) struct Backend(pub(crate) Arc<Disk>);

impl redb::StorageBackend for Backend {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(self.0.live.lock().len() as u64)
    }

    fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, io::Error> {
        let live = self.0.live.lock();
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        live.get(start..start + len)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end"))
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let len = usize::try_from(len).map_err(io::Error::other)?;
        self.0.live.lock().resize(len, 0);
        Ok(())
    }

    fn sync_data(&self, _eventual: bool) -> Result<(), io::Error> {
        if self.0.failing.load(std::sync::atomic::Ordering::Acquire) {
            return Err(io::Error::other("the disk refuses writes"));
        }
        let live = self.0.live.lock();
        self.0.durable.lock().clone_from(&live);
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let mut live = self.0.live.lock();
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        if live.len() < start + data.len() {
            live.resize(start + data.len(), 0);
        }
        live[start..start + data.len()].copy_from_slice(data);
        Ok(())
    }
}

/// The test hooks of the store: its disks, its cuts, its limits.
impl RedbStore {
    /// The store over the database `disk` holds (tests of power loss), its
    /// journal in the file beside `path`, or on `journal` when given.
    pub(super) fn open_on(
        path: &Path,
        disk: Arc<Disk>,
        journal: Option<Arc<Disk>>,
    ) -> Result<RedbStore, StoreError> {
        let db = redb::Database::builder()
            .create_with_backend(Backend(disk))
            .map_err(|e| StoreError::Open {
                path: path.display().to_string(),
                reason: e.to_string(),
                cause: Some(crate::store::Cause::new(e)),
            })?;
        RedbStore::on(path, db, journal.map_or(JournalAt::File, JournalAt::Disk))
    }

    /// Cut the power right after the next durable frame is handed to the
    /// OS: the writer stops there, fsyncing nothing more, as a crash at that
    /// point would (the frame's bytes stay in the page cache, as they may
    /// reach the disk; redb's unsynced commits are lost at the next open).
    pub(crate) fn cut_after_next_durable_append(&self) {
        self.cut_after_durable_appends(1);
    }

    /// The same after the `n`th durable frame from now.
    pub(crate) fn cut_after_durable_appends(&self, n: u64) {
        self.cut.store(n, Ordering::Release);
        self.crash.store(true, Ordering::Release);
    }

    /// Checkpoints past `checkpoint` bytes of journal, and writes refused
    /// past `limit` while they fail.
    pub(crate) fn limit_journal(&self, checkpoint: u64, limit: u64) {
        self.checkpoint_bytes.store(checkpoint, Ordering::Release);
        self.journal_limit.store(limit, Ordering::Release);
    }

    /// Append a dispatch before redb's commit is fsynced, as the gateway
    /// once did (the power-loss property test must catch it).
    pub(crate) fn break_dispatch_order(&self) {
        self.broken_order.store(true, Ordering::Release);
    }
}

/// Power loss, on these disks: the ledger's regression tests and its
/// property test.
mod tests {
    use super::Disk;
    use crate::core::approval::ProposalState;
    use crate::core::ledger::{Answer, Record, State};
    use crate::store::tests::{claim, proposal, with_state};
    use crate::store::{Ledger, Proposals};
    use crate::store::{RedbStore, Reservation, Store};

    /// Power loss (F5): an approval consumed with its reservation, then
    /// the `dispatched` frame, and the power cut right after that frame is
    /// handed to the OS (which may write it back before any fsync). After
    /// the restart, a dispatch that came back has its approval consumed:
    /// redb's commit was fsynced before the frame was appended. (With the
    /// frame appended first, the approval came back unused, able to run the
    /// call again under a fresh key.)
    #[tokio::test]
    async fn redb_an_approval_used_by_a_dispatch_stays_used_across_a_power_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.redb");
        let r = Record::reserve(&claim("d1"), 0, 1000);
        let disk = Disk::holding(Vec::new());
        let left = {
            let store = RedbStore::open_on(&path, disk.clone(), None).unwrap();
            let p = proposal("p1", ProposalState::Approved, Some(1000));
            assert!(store.put_proposal(p, None).await.unwrap());
            assert_eq!(
                store
                    .reserve_with("k1".into(), r.clone(), 10, Some("p1".into()))
                    .await
                    .unwrap(),
                Reservation::Reserved
            );
            store.cut_after_next_durable_append();
            let sent = store
                .transition(
                    "k1".into(),
                    State::Reserved,
                    with_state(r.clone(), State::Dispatched),
                )
                .await;
            assert!(sent.is_err(), "the power went out: {sent:?}");
            // What the database's disk holds at the cut; the journal's
            // frame stays in the file (the OS may have written it back).
            let left = disk.cut();
            store.crash_on_drop();
            left
        };
        let store = RedbStore::open_on(&path, Disk::holding(left), None).unwrap();
        let record = store.get("k1").await.unwrap();
        assert_eq!(
            record.map(|r| r.state),
            Some(State::Dispatched),
            "the frame reached the disk in this run"
        );
        let p = store.get_proposal("p1").await.unwrap().unwrap();
        assert_eq!(p.state, ProposalState::Consumed, "{p:?}");
        assert_eq!(p.consumed_by.as_deref(), Some("k1"));
    }

    /// Power loss (F4): a cut during the very first creation left a file
    /// redb refused at every start, and every open error said "is a gateway
    /// running?". A database is now made under a temporary name and renamed
    /// once whole: one left half-made is made again. Only the lock error
    /// speaks of another process; a damaged file says so.
    #[tokio::test]
    async fn redb_a_first_creation_cut_short_is_made_again_and_errors_say_what_they_are() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.redb");
        std::fs::write(dir.path().join("ledger.redb.new"), b"half a datab").unwrap();
        {
            let store = RedbStore::open(&path).unwrap();
            assert!(!dir.path().join("ledger.redb.new").exists());
            let held = RedbStore::open(&path).err().map(|e| e.to_string());
            assert!(
                held.as_deref()
                    .is_some_and(|e| e.contains("another process has it open")),
                "{held:?}"
            );
            drop(store);
        }
        std::fs::write(&path, vec![0xa5u8; 4096]).unwrap();
        let damaged = RedbStore::open(&path).err().map(|e| e.to_string());
        let damaged = damaged.unwrap_or_default();
        assert!(damaged.contains("may be damaged"), "{damaged}");
        assert!(!damaged.contains("another process"), "{damaged}");
    }

    /// One call of the power-loss workload: with an approval or not, and
    /// answered or not.
    #[derive(Debug, Clone)]
    struct Step {
        approved: bool,
        answered: bool,
    }

    /// Where the power goes out, and what the disks keep of what was not
    /// fsynced.
    #[derive(Debug, Clone)]
    struct Cut {
        /// After this many durable frames are handed to the OS (past the
        /// workload's end: at its end, between calls).
        after: u64,
        /// redb keeps its unsynced writes (else it loses them all).
        redb_keeps: bool,
        /// Of the journal's unsynced bytes, this share stays (a frame may be
        /// torn anywhere).
        journal_keeps: u8,
    }

    /// Run `steps` on a redb store over disks that lose what was not
    /// fsynced, cut the power at `cut`, reopen and recover, then check what
    /// the client was told: no acknowledged answer lost or changed, no
    /// dispatched call forgotten or made runnable again, no approval usable
    /// after its use.
    async fn power_case(steps: &[Step], cut: &Cut, broken: bool) -> Result<(), String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.redb");
        let (db, journal) = (Disk::holding(Vec::new()), Disk::holding(Vec::new()));
        let store = RedbStore::open_on(&path, db.clone(), Some(journal.clone())).unwrap();
        if broken {
            store.break_dispatch_order();
        }
        store.cut_after_durable_appends(cut.after);
        let r = Record::reserve(&claim("d1"), 0, i64::MAX / 2);
        // What the client was told: dispatched, completed. (Approvals are
        // checked below for every call whose record came back, told or not.)
        let mut dispatched: Vec<String> = Vec::new();
        let mut completed: Vec<(String, Answer)> = Vec::new();
        'calls: for (i, step) in steps.iter().enumerate() {
            let key = format!("k{i}");
            let approval = step.approved.then(|| format!("p{i}"));
            if let Some(p) = &approval {
                let mut p = proposal(p, ProposalState::Approved, Some(i64::MAX / 2));
                p.call_digest = "d1".into();
                if store.put_proposal(p, None).await.is_err() {
                    break 'calls;
                }
            }
            match store
                .reserve_with(key.clone(), r.clone(), 1, approval.clone())
                .await
            {
                Ok(Reservation::Reserved) => {}
                Ok(other) => return Err(format!("{key}: reserved as {other:?}")),
                Err(_) => break 'calls,
            }
            let sent = with_state(r.clone(), State::Dispatched);
            if store
                .transition(key.clone(), State::Reserved, sent.clone())
                .await
                .is_err()
            {
                break 'calls;
            }
            dispatched.push(key.clone());
            if step.answered {
                let answer = Answer::Result(format!("{{\"n\":{i}}}"));
                let mut done = with_state(r.clone(), State::Complete);
                done.answer = Some(answer.clone());
                if store
                    .transition(key.clone(), State::Dispatched, done)
                    .await
                    .is_err()
                {
                    break 'calls;
                }
                completed.push((key, answer));
            }
        }
        // The cut: what each disk holds now (before the store's drop,
        // which would sync).
        let redb_image = if cut.redb_keeps { db.live() } else { db.cut() };
        let (synced, live) = (journal.cut(), journal.live());
        let journal_image = if live.starts_with(&synced) {
            let extra = (live.len() - synced.len()) * usize::from(cut.journal_keeps) / 100;
            live[..synced.len() + extra].to_vec()
        } else if cut.journal_keeps < 50 {
            // Emptied since its last fsync (a checkpoint): the emptying lost.
            synced
        } else {
            live[..live.len() * usize::from(cut.journal_keeps) / 100].to_vec()
        };
        store.crash_on_drop();
        drop(store);
        let store = RedbStore::open_on(
            &path,
            Disk::holding(redb_image),
            Some(Disk::holding(journal_image)),
        )
        .map_err(|e| format!("reopen: {e}"))?;
        store.recover().await.map_err(|e| format!("recover: {e}"))?;
        for key in &dispatched {
            let state = store.get(key).await.unwrap().map(|r| r.state);
            if !matches!(state, Some(State::Unknown | State::Complete)) {
                return Err(format!("{key} was dispatched, and is now {state:?}"));
            }
        }
        for (key, answer) in &completed {
            let rec = store.get(key).await.unwrap();
            if rec.as_ref().and_then(|r| r.answer.as_ref()) != Some(answer) {
                return Err(format!("{key}'s answer {answer:?} is now {rec:?}"));
            }
        }
        for (i, step) in steps.iter().enumerate() {
            let key = format!("k{i}");
            let Some(rec) = store.get(&key).await.unwrap() else {
                continue;
            };
            if !step.approved || rec.state == State::NotDispatched {
                continue;
            }
            // A call that went out used its approval up, for good.
            let p = store.get_proposal(&format!("p{i}")).await.unwrap();
            let used = p.as_ref().is_some_and(|p| {
                p.state == ProposalState::Consumed && p.consumed_by.as_deref() == Some(key.as_str())
            });
            if !used {
                return Err(format!("{key} is {:?}, its approval {p:?}", rec.state));
            }
            let again = store
                .reserve_with(format!("again{i}"), r.clone(), 2, Some(format!("p{i}")))
                .await
                .map_err(|e| e.to_string())?;
            if again != Reservation::Unapproved(ProposalState::Consumed) {
                return Err(format!("p{i} used by {key} served another key: {again:?}"));
            }
        }
        Ok(())
    }

    fn power_strategy() -> impl proptest::strategy::Strategy<Value = (Vec<Step>, Cut)> {
        use proptest::prelude::*;
        proptest::collection::vec(
            (any::<bool>(), any::<bool>())
                .prop_map(|(approved, answered)| Step { approved, answered }),
            1..6,
        )
        .prop_flat_map(|steps| {
            // Each call appends one or two durable frames; one more is the
            // workload's end.
            let frames = 2 * steps.len() as u64 + 1;
            (
                Just(steps),
                (
                    1..=frames,
                    any::<bool>(),
                    prop_oneof![Just(0u8), Just(100u8), 0u8..=100],
                )
                    .prop_map(|(after, redb_keeps, journal_keeps)| Cut {
                        after,
                        redb_keeps,
                        journal_keeps,
                    }),
            )
        })
    }

    /// The power-loss property (redb and its journal on disks that keep,
    /// lose or tear what was not fsynced): random calls, approvals and
    /// answers, a cut after any durable frame or at the end, a reopen.
    #[test]
    fn redb_power_loss_never_loses_an_answer_or_runs_a_call_or_an_approval_twice() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let cases = std::env::var("COUNTERSIGN_POWER_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(96);
        let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
            cases,
            failure_persistence: None,
            ..Default::default()
        });
        runner
            .run(&power_strategy(), |(steps, cut)| {
                rt.block_on(power_case(&steps, &cut, false))
                    .map_err(proptest::test_runner::TestCaseError::fail)
            })
            .unwrap();
        eprintln!("power loss: {cases} cut states explored, every check held");
    }

    /// The property catches the old order (a dispatch appended before the
    /// approval's consumption was fsynced).
    #[test]
    fn redb_power_loss_property_catches_a_dispatch_appended_before_the_flush() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
            cases: 256,
            failure_persistence: None,
            max_shrink_iters: 0,
            ..Default::default()
        });
        let found = runner.run(&power_strategy(), |(steps, cut)| {
            rt.block_on(power_case(&steps, &cut, true))
                .map_err(proptest::test_runner::TestCaseError::fail)
        });
        let why = found
            .expect_err("the broken order went unnoticed")
            .to_string();
        assert!(why.contains("approval"), "{why}");
    }

    /// Fail closed: a journal whose checkpoints keep failing (the database's
    /// disk refuses fsyncs) grows only to its bound; past it, writes are
    /// refused with a clear error and the store says so, and reads go on.
    #[tokio::test]
    async fn redb_a_journal_that_cannot_be_folded_in_refuses_writes_past_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let disk = Disk::holding(Vec::new());
        let store =
            RedbStore::open_on(&dir.path().join("ledger.redb"), disk.clone(), None).unwrap();
        store.limit_journal(512, 4096);
        let r = Record::reserve(&claim("d1"), 0, i64::MAX);
        assert_eq!(
            store.reserve("k0".into(), r.clone(), 1).await.unwrap(),
            Reservation::Reserved
        );
        disk.fail_syncs();
        let mut refused = None;
        for i in 1..200 {
            let key = format!("k{i}");
            match store.reserve(key.clone(), r.clone(), 1).await {
                Ok(_) => {}
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
            if let Err(e) = store
                .transition(
                    key,
                    State::Reserved,
                    with_state(r.clone(), State::Dispatched),
                )
                .await
            {
                refused = Some(e);
                break;
            }
        }
        let refused = refused.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            refused.contains("keeps failing") && refused.contains("writes are refused"),
            "{refused}"
        );
        assert!(store.refusing_writes());
        assert!(store.reserve("late".into(), r, 1).await.is_err());
        // Reads go on.
        assert_eq!(
            store.get("k0").await.unwrap().map(|r| r.state),
            Some(State::Reserved)
        );
    }
}
