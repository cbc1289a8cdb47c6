//! Tests: a redb storage that loses what was not fsynced. Writes land in
//! the live image; `sync_data` makes the live image the durable one; a
//! power cut ([`Disk::cut`]) leaves only the durable image, as a disk does
//! for writes that never reached it (the most the OS may lose).

use std::io;
use std::sync::Arc;

use parking_lot::Mutex;

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
