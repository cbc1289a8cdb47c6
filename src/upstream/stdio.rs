//! A stdio upstream: one child process, newline-delimited JSON-RPC on its
//! stdin and stdout. Its stderr goes to the gateway log, line by line, and
//! never into the protocol.

use std::process::Stdio as StdStdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::Mutex;

use super::UpstreamError;
use crate::core::config::ServerConfig;
use crate::upstream::mux::{Mux, Origin};
use crate::wire::jsonrpc::Message;
use crate::wire::lines::{read_line, Line};

/// Variables a stdio child inherits from the gateway (as the MCP SDKs do for
/// their stdio clients); everything else must be listed in `servers.S.env`.
const INHERITED: &[&str] = &[
    "HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "TMPDIR", "TZ", "LANG",
];

fn inherited(key: &str) -> bool {
    INHERITED.contains(&key) || key.starts_with("LC_")
}

pub(super) struct Stdio {
    server: String,
    stdin: Mutex<Option<ChildStdin>>,
    child: Mutex<Option<Child>>,
}

impl Stdio {
    pub(super) fn spawn(
        server: &str,
        cfg: &ServerConfig,
        max_line: usize,
        mux: Arc<Mux>,
    ) -> Result<Stdio, UpstreamError> {
        let spawn_err = |reason: String| UpstreamError::Spawn {
            server: server.into(),
            reason,
        };
        let program = cfg
            .command
            .as_deref()
            .ok_or_else(|| spawn_err("no command".into()))?;
        let mut cmd = Command::new(program);
        // The child gets a minimal environment plus what the operator lists:
        // the gateway's own environment may hold credentials that an
        // untrusted server has no business reading.
        cmd.env_clear();
        for (key, value) in std::env::vars_os() {
            if key.to_str().is_some_and(inherited) {
                cmd.env(key, value);
            }
        }
        for (name, value) in &cfg.env {
            let what = format!("environment variable `{name}` of server `{server}`");
            cmd.env(
                name,
                super::credentials::resolve(value, &what).map_err(spawn_err)?,
            );
        }
        cmd.args(&cfg.args)
            .stdin(StdStdio::piped())
            .stdout(StdStdio::piped())
            .stderr(StdStdio::piped())
            // Safety net: a child whose session is dropped without shutdown is killed.
            .kill_on_drop(true);
        if let Some(dir) = &cfg.cwd {
            cmd.current_dir(dir);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| spawn_err(format!("`{program}`: {e}")))?;
        let pid = child.id().unwrap_or(0);
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(spawn_err("the child's pipes are missing".into()));
        };
        tracing::debug!(server, pid, "upstream child started");

        let name = server.to_owned();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout);
            let mut buf = Vec::new();
            let reason = loop {
                match read_line(&mut reader, &mut buf, max_line).await {
                    Ok(Line::Line) => {
                        if buf.iter().all(u8::is_ascii_whitespace) {
                            continue;
                        }
                        match Message::parse_from_upstream(&buf) {
                            Ok(msg) => mux.deliver(msg, Origin::Pipe),
                            Err(e) => {
                                tracing::warn!(server = %name, pid, "upstream wrote a line that is not JSON-RPC ({e}); ignored")
                            }
                        }
                    }
                    Ok(Line::TooLong) => {
                        // The protocol is broken from here on (the answer of some
                        // request is gone): treat it like a lost connection.
                        break format!(
                            "the child wrote a line longer than limits.max_line_bytes ({max_line})"
                        );
                    }
                    Ok(Line::Eof) => break "the child closed its stdout (exited?)".to_owned(),
                    Err(e) => break format!("reading the child's stdout failed: {e}"),
                }
            };
            tracing::info!(server = %name, pid, "upstream connection ended: {reason}");
            mux.close(&reason);
        });

        let name = server.to_owned();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stderr);
            let mut buf = Vec::new();
            while let Ok(l) = read_line(&mut reader, &mut buf, 64 * 1024).await {
                match l {
                    Line::Line => {
                        tracing::info!(target: "countersign::upstream_stderr", server = %name, pid, "{}", String::from_utf8_lossy(&buf))
                    }
                    Line::TooLong => {
                        tracing::info!(target: "countersign::upstream_stderr", server = %name, pid, "(a stderr line over 64 KiB was skipped)")
                    }
                    Line::Eof => break,
                }
            }
        });

        Ok(Stdio {
            server: server.into(),
            stdin: Mutex::new(Some(stdin)),
            child: Mutex::new(Some(child)),
        })
    }

    pub(super) async fn write(&self, msg: &Message) -> Result<(), UpstreamError> {
        let mut line = msg.to_bytes();
        line.push(b'\n');
        let mut guard = self.stdin.lock().await;
        let Some(stdin) = guard.as_mut() else {
            return Err(UpstreamError::Closed {
                server: self.server.clone(),
                reason: "stdin is closed".into(),
            });
        };
        // A failed write may have delivered part of the line: it counts as
        // possibly dispatched, never as "not sent".
        let result = async {
            stdin.write_all(&line).await?;
            stdin.flush().await
        }
        .await;
        result.map_err(|e| UpstreamError::Lost {
            server: self.server.clone(),
            reason: format!("writing to the child failed: {e}"),
        })
    }

    pub(super) async fn shutdown(&self, grace: Duration) {
        // 1. close stdin: a well-behaved stdio server exits on EOF.
        drop(self.stdin.lock().await.take());
        let Some(mut child) = self.child.lock().await.take() else {
            return;
        };
        if tokio::time::timeout(grace, child.wait()).await.is_ok() {
            return;
        }
        // 2. SIGTERM.
        if let Some(pid) = child.id() {
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            if tokio::time::timeout(grace, child.wait()).await.is_ok() {
                return;
            }
        }
        // 3. SIGKILL.
        tracing::warn!(server = %self.server, "upstream child ignored stdin EOF and SIGTERM; killing it");
        let _ = child.kill().await;
    }
}
