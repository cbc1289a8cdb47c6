//! What a command prints on standard output, ended quietly when the reader
//! goes away.
//!
//! `countersign policy inputs export | head -2` closes the pipe after two
//! lines. Rust ignores `SIGPIPE`, so the next write fails with `EPIPE`, and
//! `println!` would panic on it. Every command prints through [`outln!`] and
//! [`out!`] instead: a closed pipe becomes [`Closed`], which `main` ends on
//! with success and no message, as `cat` or `grep` do. Any other failure to
//! write (a full disk behind `> file`) is an error that says so.

use std::fmt;
use std::io::Write;

/// The reader of standard output has gone: the command stops printing and
/// ends quietly. Not a failure of what it was asked to do.
#[derive(Debug, thiserror::Error)]
#[error("the reader of standard output has gone")]
pub(crate) struct Closed;

/// Writes to standard output; a closed pipe is [`Closed`].
pub(crate) fn write(args: fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_fmt(args)
        .and_then(|()| stdout.flush())
        .map_err(written)
}

/// The error of a write to standard output (also through a buffered sink):
/// [`Closed`] for a closed pipe, else what the system said.
pub(crate) fn written(e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        anyhow::Error::new(Closed)
    } else {
        anyhow::Error::new(e).context("cannot write to standard output")
    }
}

/// Whether an error ends in a closed standard output.
pub(crate) fn is_closed(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<Closed>())
}

/// `print!` that returns from the command on a closed pipe.
macro_rules! out {
    ($($t:tt)*) => {
        $crate::cli::out::write(format_args!($($t)*))?
    };
}

/// `println!` that returns from the command on a closed pipe.
macro_rules! outln {
    () => {
        $crate::cli::out::write(format_args!("\n"))?
    };
    ($($t:tt)*) => {
        $crate::cli::out::write(format_args!("{}\n", format_args!($($t)*)))?
    };
}

pub(crate) use {out, outln};
