//! The audit log's Merkle tree on disk: `tree.hashes` in the audit dir,
//! every stored hash (see [`super::merkle`]) as 32 raw bytes, in order.
//!
//! The file is derived from the log and never fsynced: the log is the
//! record. At open it is brought level with the log, so a crash costs
//! neither a rebuild nor a wrong root: a tail the log lost is cut from the
//! tree, and entries the tree lacks (a crash between the two writes, or a
//! log made before the tree existed) are added from the log's tail only.
//! Appends go through a buffer that is flushed at every log sync, before a
//! checkpoint is signed, so that readers (`audit prove`, the read-only
//! endpoints) find every hash a checkpoint covers.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::merkle::{self, Frontier, Hash, Stored};
use super::segment::{io_err, AuditError};

/// The tree file in the audit dir.
pub const TREE_FILE: &str = "tree.hashes";

/// Stored hashes read from the file (positional reads, any thread).
pub struct TreeReader {
    file: File,
    /// Leaves whose hashes are all in the file.
    pub size: u64,
}

impl Stored for TreeReader {
    fn stored(&self, index: u64) -> std::io::Result<Hash> {
        let mut h = [0u8; 32];
        self.file.read_exact_at(&mut h, index * 32)?;
        Ok(h)
    }
}

impl TreeReader {
    /// Open the tree of the log in `dir` for reading.
    pub fn open(dir: &Path) -> Result<TreeReader, AuditError> {
        let path = dir.join(TREE_FILE);
        let file = File::open(&path).map_err(|e| AuditError {
            path: path.clone(),
            message: format!(
                "{e} (the tree is made by a gateway of this version; start it once on this log)"
            ),
            cause: Some(Box::new(e)),
        })?;
        let len = file.metadata().map_err(io_err(&path))?.len();
        Ok(TreeReader {
            file,
            size: merkle::size_for_count(len / 32),
        })
    }
}

/// The writer's tree: the right edge in memory, appends buffered.
pub struct TreeWriter {
    path: PathBuf,
    out: BufWriter<File>,
    frontier: Frontier,
}

impl TreeWriter {
    /// Open (or make) the tree of a log of `entries` entries, level with
    /// it. `tail(from)` gives the log's entry hashes of seq `from` on (seq
    /// counts from 1), to add what the tree lacks. `last` is the hash of
    /// the log's last entry, to check that the tree is this log's.
    pub fn open(
        dir: &Path,
        entries: u64,
        last: Option<Hash>,
        tail: impl Fn(u64) -> Result<Vec<Hash>, AuditError>,
    ) -> Result<TreeWriter, AuditError> {
        let path = dir.join(TREE_FILE);
        let file = crate::store::private::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io_err(&path))?;
        let len = file.metadata().map_err(io_err(&path))?.len();
        // Whole leaves only: a torn write, or leaves the log lost, are cut.
        let mut size = merkle::size_for_count(len / 32).min(entries);
        let reader = TreeReader {
            file: file.try_clone().map_err(io_err(&path))?,
            size,
        };
        // The tree must be this log's: its leaf for the log's last entry it
        // holds is that entry's hash. Otherwise it is made again.
        if size > 0 && size == entries {
            let want = last.map(|h| merkle::leaf_hash(&h));
            let have = reader.stored(merkle::stored_index(0, size - 1)).ok();
            if want != have {
                tracing::warn!(path = %path.display(), "the audit tree is not this log's: making it again from the log");
                size = 0;
            }
        }
        file.set_len(merkle::stored_count(size) * 32)
            .map_err(io_err(&path))?;
        let frontier = Frontier::load(&reader, size).map_err(io_err(&path))?;
        let mut out = BufWriter::with_capacity(1 << 16, file);
        use std::io::Seek;
        out.seek(std::io::SeekFrom::End(0)).map_err(io_err(&path))?;
        let mut tree = TreeWriter {
            path,
            out,
            frontier,
        };
        if size < entries {
            let missing = tail(size + 1)?;
            if missing.len() as u64 != entries - size {
                return Err(AuditError {
                    path: tree.path.clone(),
                    message: format!(
                        "the log's tail from seq {} has {} entries, expected {}",
                        size + 1,
                        missing.len(),
                        entries - size
                    ),
                    cause: None,
                });
            }
            if size + 1 < entries {
                tracing::info!(
                    from = size + 1,
                    to = entries,
                    "audit tree: adding the log's entries it lacks"
                );
            }
            for h in &missing {
                tree.push(h).map_err(io_err(&tree.path))?;
            }
            tree.flush().map_err(io_err(&tree.path))?;
        }
        Ok(tree)
    }

    /// The leaves after the first `size` must be those of `entries` (the
    /// log's hashes from seq `size + 1`): where they are not, the tree is cut
    /// to `size` and they are appended again. Whether it mended anything.
    pub fn mend_tail(&mut self, size: u64, entries: &[Hash]) -> std::io::Result<bool> {
        self.out.flush()?;
        let reader = self.reader()?;
        let same = self.frontier.size() == size + entries.len() as u64
            && entries.iter().enumerate().all(|(i, h)| {
                reader.stored(merkle::stored_index(0, size + i as u64)).ok()
                    == Some(merkle::leaf_hash(h))
            });
        if same {
            return Ok(false);
        }
        self.out
            .get_ref()
            .set_len(merkle::stored_count(size) * 32)?;
        use std::io::Seek;
        self.out.seek(std::io::SeekFrom::End(0))?;
        self.frontier = Frontier::load(&self.reader()?, size)?;
        for h in entries {
            self.push(h)?;
        }
        self.flush()?;
        Ok(true)
    }

    /// Append the leaf of an entry whose hash is `entry_hash`.
    pub fn push(&mut self, entry_hash: &Hash) -> std::io::Result<()> {
        for h in self.frontier.push(merkle::leaf_hash(entry_hash)) {
            self.out.write_all(&h)?;
        }
        Ok(())
    }

    /// Hand buffered hashes to the OS (readers see them).
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }

    /// Leaves so far.
    pub fn size(&self) -> u64 {
        self.frontier.size()
    }

    /// The root now.
    pub fn root(&self) -> Hash {
        self.frontier.root()
    }

    /// A reader of the flushed file.
    pub fn reader(&self) -> std::io::Result<TreeReader> {
        Ok(TreeReader {
            file: self.out.get_ref().try_clone()?,
            size: self.frontier.size(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;

    fn h(i: u64) -> Hash {
        merkle::leaf_hash(&i.to_le_bytes())
    }

    fn log(n: u64) -> Vec<Hash> {
        (1..=n).map(h).collect()
    }

    #[test]
    fn the_tree_follows_the_log_across_reopens_torn_writes_and_lost_tails() {
        let dir = tempfile::tempdir().unwrap();
        let entries = log(20);
        // The log's tail when it holds `len` entries.
        let tail = |len: u64| {
            let entries = entries.clone();
            move |from: u64| Ok(entries[(from - 1) as usize..len as usize].to_vec())
        };
        let mut t = TreeWriter::open(dir.path(), 0, None, tail(0)).unwrap();
        for e in &entries[..10] {
            t.push(e).unwrap();
        }
        t.flush().unwrap();
        let root10 = t.root();
        drop(t);
        // The log has 12 entries now: the tree adds the two it lacks, and
        // reads only those from the log (not the whole log again).
        let asked = std::cell::Cell::new(0);
        let t = TreeWriter::open(dir.path(), 12, Some(entries[11]), |from| {
            asked.set(from);
            tail(12)(from)
        })
        .unwrap();
        assert_eq!(asked.get(), 11);
        assert_eq!(t.size(), 12);
        let r = t.reader().unwrap();
        assert_eq!(merkle::root(&r, 10).unwrap(), root10);
        let mut in_memory = Frontier::default();
        for e in &entries[..12] {
            in_memory.push(merkle::leaf_hash(e));
        }
        assert_eq!(t.root(), in_memory.root());
        drop(t);
        // A torn write (half a hash), then a log that lost its last entry.
        let path = dir.path().join(TREE_FILE);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&[1u8; 16]).unwrap();
        let t = TreeWriter::open(dir.path(), 11, Some(entries[10]), tail(11)).unwrap();
        assert_eq!(t.size(), 11);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            merkle::stored_count(11) * 32
        );
        let reader = TreeReader::open(dir.path()).unwrap();
        assert_eq!(reader.size, 11);
        // A damaged leaf after `size` 8 is mended from the log.
        let mut t = TreeWriter::open(dir.path(), 11, Some(entries[10]), tail(11)).unwrap();
        let good = t.root();
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0xee; 32], merkle::stored_index(0, 9) * 32)
            .unwrap();
        assert!(t.mend_tail(8, &entries[8..11]).unwrap());
        assert_eq!(t.root(), good);
        assert_eq!(
            TreeReader::open(dir.path())
                .unwrap()
                .stored(merkle::stored_index(0, 9))
                .unwrap(),
            merkle::leaf_hash(&entries[9])
        );
        assert!(!t.mend_tail(8, &entries[8..11]).unwrap(), "nothing to mend");
        drop(t);
        // Another log's tree is made again.
        let other: Vec<Hash> = (100..111).map(h).collect();
        let t = TreeWriter::open(dir.path(), 11, Some(other[10]), |from| {
            Ok(other[(from - 1) as usize..].to_vec())
        })
        .unwrap();
        let mut f = Frontier::default();
        for e in &other {
            f.push(merkle::leaf_hash(e));
        }
        assert_eq!(t.root(), f.root());
    }
}
