//! The redb ledger's journal: an append-only file beside the database
//! (`ledger.journal`) that takes the write path's ledger changes (the
//! `dispatched` record with its audit outbox row, the answer, outbox
//! clears). A change is durable when its frame is fsynced here, one
//! `fdatasync` of a sequential file instead of a redb commit, which copies
//! and checksums every B-tree page on the path of each key it touches (over
//! half of a write's instructions, measured in docs/performance.md). The
//! writer thread folds the journal into redb in one transaction now and then
//! (a checkpoint), and at the next open after a crash.
//!
//! Layout: a 16-byte header (`CSLJ`, format version, the generation), then
//! frames `[payload length u32][CRC-32 of payload u32][payload]`, little
//! endian. A payload is the generation again, an item count, and the items
//! of one batch, which apply together or not at all. The generation is
//! stored in redb with each checkpoint: a journal of another generation
//! (its truncation after a checkpoint lost to a crash) and frames of another
//! generation (old bytes past a shorter new journal) are never applied.
//! Reading stops at the first frame that is cut short or fails its CRC: a
//! crash tore it while it was written, and it was not fsynced, so no caller
//! was told it was durable. A frame whose CRC holds but whose items do not
//! parse is corruption, and opening fails with [`StoreError::Corrupt`].

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::StoreError;

const MAGIC: &[u8; 4] = b"CSLJ";
const VERSION: u32 = 1;
const HEADER: usize = 16;

/// One change in a frame.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Item {
    /// The ledger record of `key` is now `bytes` (the encoded record).
    Record { key: String, bytes: Vec<u8> },
    /// An audit outbox row.
    Outbox { id: u64, text: String },
    /// Outbox rows with ids up to `upto` are gone.
    Clear { upto: u64 },
    /// Changes to the guards' rows (budgets, effect keys) a dispatched call
    /// made, encoded (see `store::guards::Change`).
    Guards { bytes: Vec<u8> },
}

/// Where a journal's bytes go: its file, or (tests of power loss) a disk
/// that loses what was not fsynced.
pub(super) trait Medium: Send {
    /// Empty it; the next append starts at its beginning.
    fn truncate(&mut self) -> std::io::Result<()>;
    /// Add `bytes` at its end (handed to the OS, not fsynced).
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()>;
    /// fsync what was appended.
    fn sync(&mut self) -> std::io::Result<()>;
}

impl Medium for File {
    fn truncate(&mut self) -> std::io::Result<()> {
        self.set_len(0)?;
        self.seek(SeekFrom::Start(0)).map(drop)
    }

    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.write_all(bytes)
    }

    fn sync(&mut self) -> std::io::Result<()> {
        // Data only: the file's length is data here.
        self.sync_data()
    }
}

/// The open journal, positioned at its end.
pub(super) struct Journal {
    file: Box<dyn Medium>,
    path: PathBuf,
    generation: u64,
    len: u64,
}

fn io<'p>(op: &'static str, path: &'p Path) -> impl Fn(std::io::Error) -> StoreError + 'p {
    move |e| StoreError::Backend {
        op,
        reason: format!("{}: {e}", path.display()),
        cause: Some(super::Cause::new(e)),
    }
}

fn corrupt(reason: String) -> StoreError {
    StoreError::Corrupt {
        what: "ledger journal",
        reason,
        cause: None,
    }
}

/// The journal's file for the database at `db`.
pub(super) fn path_for(db: &Path) -> PathBuf {
    db.with_extension("journal")
}

/// The items of generation `generation` in the journal at `path`, in order
/// (none when there is no such file, or it belongs to another generation).
pub(super) fn read(path: &Path, generation: u64) -> Result<Vec<Item>, StoreError> {
    let mut bytes = Vec::new();
    match File::open(path) {
        Ok(mut f) => {
            f.read_to_end(&mut bytes)
                .map_err(io("read the ledger journal", path))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("open the ledger journal", path)(e)),
    }
    items(&bytes, generation)
}

/// The items of generation `generation` in a journal's bytes.
pub(super) fn items(bytes: &[u8], generation: u64) -> Result<Vec<Item>, StoreError> {
    if bytes.len() < HEADER
        || &bytes[..4] != MAGIC
        || u32_at(bytes, 4) != VERSION
        || u64_at(bytes, 8) != generation
    {
        return Ok(Vec::new());
    }
    let mut items = Vec::new();
    let mut at = HEADER;
    while bytes.len() - at >= 8 {
        let len = u32_at(bytes, at) as usize;
        let crc = u32_at(bytes, at + 4);
        let Some(payload) = bytes.get(at + 8..at + 8 + len) else {
            break; // cut short
        };
        if crc32fast::hash(payload) != crc {
            break; // torn
        }
        if payload.len() < 12 || u64_at(payload, 0) != generation {
            break; // a frame of an earlier generation, past the new end
        }
        items.extend(parse(payload)?);
        at += 8 + len;
    }
    Ok(items)
}

// Callers check the bounds first (the header's length, a frame's 8 bytes,
// the cursor's `take`).
fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// A cursor over a frame's payload whose every read is bounds-checked.
struct Cursor<'b> {
    b: &'b [u8],
    at: usize,
}

impl<'b> Cursor<'b> {
    fn take(&mut self, n: usize) -> Result<&'b [u8], StoreError> {
        let out = self
            .b
            .get(self.at..self.at.saturating_add(n))
            .ok_or_else(|| corrupt(format!("a frame ends inside an item (at byte {})", self.at)))?;
        self.at += n;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, StoreError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, StoreError> {
        Ok(u32_at(self.take(4)?, 0))
    }
    fn u64(&mut self) -> Result<u64, StoreError> {
        Ok(u64_at(self.take(8)?, 0))
    }
    fn bytes(&mut self) -> Result<&'b [u8], StoreError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn text(&mut self) -> Result<String, StoreError> {
        String::from_utf8(self.bytes()?.to_vec())
            .map_err(|_| corrupt("a key or outbox row is not UTF-8".into()))
    }
}

fn parse(payload: &[u8]) -> Result<Vec<Item>, StoreError> {
    let mut c = Cursor { b: payload, at: 8 };
    let n = c.u32()?;
    let mut items = Vec::with_capacity(n.min(1024) as usize);
    for _ in 0..n {
        items.push(match c.u8()? {
            1 => Item::Record {
                key: c.text()?,
                bytes: c.bytes()?.to_vec(),
            },
            2 => Item::Outbox {
                id: c.u64()?,
                text: c.text()?,
            },
            3 => Item::Clear { upto: c.u64()? },
            4 => Item::Guards {
                bytes: c.bytes()?.to_vec(),
            },
            tag => return Err(corrupt(format!("unknown item tag {tag}"))),
        });
    }
    if c.at != payload.len() {
        return Err(corrupt("bytes after a frame's last item".into()));
    }
    Ok(items)
}

/// Frames being built for one append.
#[derive(Default)]
pub(super) struct Frames {
    buf: Vec<u8>,
}

impl Frames {
    /// One frame of `items` (applied together or not at all).
    pub(super) fn push(&mut self, generation: u64, items: &[ItemRef<'_>]) {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0; 8]);
        self.buf.extend_from_slice(&generation.to_le_bytes());
        self.buf
            .extend_from_slice(&(items.len() as u32).to_le_bytes());
        for item in items {
            match item {
                ItemRef::Record { key, bytes } => {
                    self.buf.push(1);
                    self.put_bytes(key.as_bytes());
                    self.put_bytes(bytes);
                }
                ItemRef::Outbox { id, text } => {
                    self.buf.push(2);
                    self.buf.extend_from_slice(&id.to_le_bytes());
                    self.put_bytes(text.as_bytes());
                }
                ItemRef::Clear { upto } => {
                    self.buf.push(3);
                    self.buf.extend_from_slice(&upto.to_le_bytes());
                }
                ItemRef::Guards { bytes } => {
                    self.buf.push(4);
                    self.put_bytes(bytes);
                }
            }
        }
        let payload = &self.buf[start + 8..];
        let len = payload.len() as u32;
        let crc = crc32fast::hash(payload);
        self.buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
        self.buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    }

    fn put_bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(&(b.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(b);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// An item to write, borrowed from the operation that makes it.
pub(super) enum ItemRef<'a> {
    Record { key: &'a str, bytes: &'a [u8] },
    Outbox { id: u64, text: &'a str },
    Clear { upto: u64 },
    Guards { bytes: &'a [u8] },
}

impl Journal {
    /// Start an empty journal of `generation` at `path` (replacing what is
    /// there: call it only once that is in redb).
    pub(super) fn create(path: &Path, generation: u64) -> Result<Journal, StoreError> {
        let new = !path.exists();
        let file = super::private::options()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)
            .map_err(io("open the ledger journal", path))?;
        if new {
            // Its entry in the folder outlives a power cut: frames fsynced
            // into it are not in a file the folder forgot.
            super::durable::created(path).map_err(io("fsync the data folder", path))?;
        }
        Journal::on(Box::new(file), path, generation)
    }

    /// Start an empty journal of `generation` on `medium` (named `path` in
    /// errors).
    pub(super) fn on(
        medium: Box<dyn Medium>,
        path: &Path,
        generation: u64,
    ) -> Result<Journal, StoreError> {
        let mut j = Journal {
            file: medium,
            path: path.to_owned(),
            generation,
            len: 0,
        };
        j.reset(generation)?;
        Ok(j)
    }

    /// Empty the journal and start `generation` (its content is in redb).
    /// Not fsynced: the next durable append carries the header with it, and
    /// a header lost to a crash only leaves a journal redb ignores.
    pub(super) fn reset(&mut self, generation: u64) -> Result<(), StoreError> {
        let path = self.path.clone();
        self.file
            .truncate()
            .map_err(io("empty the ledger journal", &path))?;
        let mut header = [0u8; HEADER];
        header[..4].copy_from_slice(MAGIC);
        header[4..8].copy_from_slice(&VERSION.to_le_bytes());
        header[8..].copy_from_slice(&generation.to_le_bytes());
        self.file
            .append(&header)
            .map_err(io("write the ledger journal", &path))?;
        self.generation = generation;
        self.len = HEADER as u64;
        Ok(())
    }

    pub(super) fn generation(&self) -> u64 {
        self.generation
    }

    /// Bytes in the journal.
    pub(super) fn len(&self) -> u64 {
        self.len
    }

    /// Append `frames` (handed to the OS, not fsynced).
    pub(super) fn append(&mut self, frames: &Frames) -> Result<(), StoreError> {
        self.file
            .append(&frames.buf)
            .map_err(io("write the ledger journal", &self.path))?;
        self.len += frames.buf.len() as u64;
        Ok(())
    }

    /// fsync what was appended.
    pub(super) fn sync(&mut self) -> Result<(), StoreError> {
        self.file
            .sync()
            .map_err(io("fsync the ledger journal", &self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(generation: u64, items: &[ItemRef<'_>]) -> Frames {
        let mut f = Frames::default();
        f.push(generation, items);
        f
    }

    #[test]
    fn frames_read_back_in_order_and_only_of_their_generation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.journal");
        let mut j = Journal::create(&path, 7).unwrap();
        j.append(&frames(
            7,
            &[
                ItemRef::Record {
                    key: "k1",
                    bytes: b"{}",
                },
                ItemRef::Outbox { id: 3, text: "[3]" },
            ],
        ))
        .unwrap();
        j.append(&frames(7, &[ItemRef::Clear { upto: 3 }])).unwrap();
        j.sync().unwrap();
        let items = read(&path, 7).unwrap();
        assert_eq!(
            items,
            vec![
                Item::Record {
                    key: "k1".into(),
                    bytes: b"{}".to_vec()
                },
                Item::Outbox {
                    id: 3,
                    text: "[3]".into()
                },
                Item::Clear { upto: 3 },
            ]
        );
        assert!(read(&path, 8).unwrap().is_empty(), "another generation");
        assert!(read(&dir.path().join("none"), 7).unwrap().is_empty());
    }

    #[test]
    fn a_torn_tail_and_stale_frames_past_a_reset_are_not_applied() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.journal");
        let mut j = Journal::create(&path, 1).unwrap();
        for i in 0..3 {
            let key = format!("old{i}");
            j.append(&frames(
                1,
                &[ItemRef::Record {
                    key: &key,
                    bytes: b"x",
                }],
            ))
            .unwrap();
        }
        // A new generation whose bytes end before the old ones did, as
        // after a truncation that a crash undid: the old frames after the
        // new one are of generation 1 and are not read.
        let old = std::fs::read(&path).unwrap();
        let mut mixed = Vec::new();
        mixed.extend_from_slice(MAGIC);
        mixed.extend_from_slice(&VERSION.to_le_bytes());
        mixed.extend_from_slice(&2u64.to_le_bytes());
        let f = frames(2, &[ItemRef::Clear { upto: 9 }]);
        mixed.extend_from_slice(&f.buf);
        mixed.extend_from_slice(&old[mixed.len()..]);
        std::fs::write(&path, &mixed).unwrap();
        assert_eq!(read(&path, 2).unwrap(), vec![Item::Clear { upto: 9 }]);
        // A frame cut short by a crash is not applied; those before it are.
        let mut torn = Journal::create(&path, 3).unwrap();
        torn.append(&frames(3, &[ItemRef::Clear { upto: 1 }]))
            .unwrap();
        torn.append(&frames(3, &[ItemRef::Clear { upto: 2 }]))
            .unwrap();
        let full = std::fs::read(&path).unwrap();
        std::fs::write(&path, &full[..full.len() - 3]).unwrap();
        assert_eq!(read(&path, 3).unwrap(), vec![Item::Clear { upto: 1 }]);
        // A flipped bit fails the CRC: the frame and all after it stop.
        let mut flipped = full.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        std::fs::write(&path, &flipped).unwrap();
        assert_eq!(read(&path, 3).unwrap(), vec![Item::Clear { upto: 1 }]);
    }

    #[test]
    fn a_frame_whose_crc_holds_but_whose_items_do_not_parse_is_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.journal");
        let mut j = Journal::create(&path, 1).unwrap();
        // An item tag no writer makes, under a valid CRC.
        let mut payload = Vec::new();
        payload.extend_from_slice(&1u64.to_le_bytes());
        payload.extend_from_slice(&1u32.to_le_bytes());
        payload.push(9);
        let mut f = Frames::default();
        f.buf
            .extend_from_slice(&(payload.len() as u32).to_le_bytes());
        f.buf
            .extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        f.buf.extend_from_slice(&payload);
        j.append(&f).unwrap();
        let e = read(&path, 1).unwrap_err();
        assert!(e.to_string().contains("unknown item tag 9"), "{e}");
    }
}
