//! `countersign stdio`, driven as a stdio-only client drives it: lines in,
//! lines out.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

use super::{countersign_bin, Gateway, TOKEN};

/// A running bridge and its stdout, line by line.
pub struct Bridge {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Bridge {
    pub fn start(gw: &Gateway) -> Bridge {
        Bridge::start_with(gw, &[])
    }

    pub fn start_with(gw: &Gateway, extra: &[&str]) -> Bridge {
        Bridge::for_server(gw, "payments", extra)
    }

    /// `countersign stdio --server SERVER` against `gw`, with `extra` flags.
    pub fn for_server(gw: &Gateway, server: &str, extra: &[&str]) -> Bridge {
        let mut child = Command::new(countersign_bin())
            .args(["stdio", "--server", server, "--gateway", &gw.base()])
            .args(extra)
            .env("COUNTERSIGN_TOKEN", TOKEN)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout: ChildStdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Bridge {
            child,
            stdin,
            lines: rx,
        }
    }

    pub fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    pub fn recv(&self) -> Value {
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(20))
            .expect("no answer from the bridge");
        serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("stdout carried a non-JSON line ({e}): {line}"))
    }

    /// Read until the response with `id`.
    pub fn answer(&self, id: Value) -> Value {
        loop {
            let v = self.recv();
            if v.get("id") == Some(&id) && v.get("method").is_none() {
                return v;
            }
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
