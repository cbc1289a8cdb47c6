//! Files made the way a power cut cannot undo. `kill -9` keeps the page
//! cache; a power cut does not: a write that was not fsynced may be lost,
//! and a file created or renamed may vanish unless its folder was fsynced
//! too. Every file under the data dir that the gateway reads back after a
//! restart is made through here:
//!
//! - a whole file ([`write`]): written under a temporary name, fsynced,
//!   renamed over the real name, and the folder fsynced: after a cut the
//!   file is the old one or the new one, whole, never empty or torn;
//! - a file that grows in place (the journal, the audit segments, the
//!   databases): created, then its folder fsynced ([`created`]), so that
//!   what is later fsynced into it is not in a file the folder forgot;
//! - a folder ([`dir_all`]): each folder made is fsynced into its parent.
//!
//! Modes are [`super::private`]'s: files 0600, folders 0700.

use std::io::{self, Write};
use std::path::Path;

/// fsync the folder `dir`: its entries (files created, renamed or removed
/// in it) survive a power cut.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        std::fs::File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        // Elsewhere a folder cannot be opened to be synced; the platform
        // keeps its entries with the file's own sync.
        let _ = dir;
        Ok(())
    }
}

/// The folder `path` is in (`.` for a bare name).
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Replace `path` with `contents`, durably and atomically: a temporary file
/// beside it (0600) written and fsynced, renamed over `path`, and the folder
/// fsynced. A cut at any point leaves the old file or the new one, whole.
pub fn write(path: &Path, contents: impl AsRef<[u8]>) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let mut tmp_name = name.to_owned();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    {
        let mut f = super::private::options()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        f.write_all(contents.as_ref())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    sync_dir(parent(path))
}

/// `path` was just created (and is written in place from now on): fsync
/// its folder, so the file's entry outlives a power cut.
pub fn created(path: &Path) -> io::Result<()> {
    sync_dir(parent(path))
}

/// Create `path` and its missing parents (0700), each fsynced into its
/// parent.
pub fn dir_all(path: &Path) -> io::Result<()> {
    if path.is_dir() {
        return Ok(());
    }
    // The missing ones, outermost first.
    let mut missing = Vec::new();
    let mut at = Some(path);
    while let Some(p) = at.filter(|p| !p.as_os_str().is_empty() && !p.exists()) {
        missing.push(p);
        at = p.parent();
    }
    super::private::dir_all(path)?;
    for p in missing.into_iter().rev() {
        sync_dir(parent(p))?;
    }
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_whole_file_replaces_the_old_one_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint");
        write(&path, "one").unwrap();
        write(&path, "two").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two");
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["checkpoint"]);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn folders_are_made_private_with_their_parents() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b/c");
        dir_all(&deep).unwrap();
        for p in [dir.path().join("a"), dir.path().join("a/b"), deep.clone()] {
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", p.display());
        }
        dir_all(&deep).unwrap();
        created(&deep.join("x")).unwrap();
    }
}
