//! The gateway's data is its own: every file it creates under the data dir
//! (the ledger, its journal, the decision inputs with full arguments, the
//! audit log, its tree and checkpoints, keys) is made readable by its owner
//! only (0600), and every folder 0700. A file the umask would make 0644
//! would hand other users of the host what `audit.arguments = "redact"`
//! keeps out of the log.

use std::fs::OpenOptions;
use std::io;
use std::path::{Path, PathBuf};

/// Options that create a file 0600 (on unix; elsewhere the platform's
/// default).
pub fn options() -> OpenOptions {
    let mut o = OpenOptions::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    o
}

/// Write `contents` to `path`, creating it 0600 (or truncating it).
pub fn write(path: &Path, contents: impl AsRef<[u8]>) -> io::Result<()> {
    use std::io::Write;
    let mut f = options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    f.write_all(contents.as_ref())
}

/// Create `path` and its missing parents 0700.
pub fn dir_all(path: &Path) -> io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(0o700);
    }
    b.create(path)
}

/// Files and folders under `dir` (itself included) that users other than
/// the owner may read or enter (made by an older release, or by hand):
/// `serve` warns of them.
pub fn exposed(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    walk(dir, &mut out, 0);
    out
}

fn walk(path: &Path, out: &mut Vec<PathBuf>, depth: usize) {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o077 != 0 {
            out.push(path.to_owned());
        }
    }
    if meta.is_dir() && depth < 4 {
        if let Ok(entries) = std::fs::read_dir(path) {
            for e in entries.flatten() {
                walk(&e.path(), out, depth + 1);
            }
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn files_and_folders_are_the_owners_only() {
        let d = tempfile::tempdir().unwrap();
        let sub = d.path().join("a/b");
        dir_all(&sub).unwrap();
        write(&sub.join("f"), "x").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&sub), 0o700);
        assert_eq!(mode(&sub.join("f")), 0o600);
        std::fs::set_permissions(sub.join("f"), std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(exposed(&sub), vec![sub.join("f")]);
    }
}
