//! A real OTLP receiver for the tests: `tests/peers/otlp_receiver.py`
//! decodes OTLP/HTTP protobuf exports with the official OpenTelemetry
//! messages and appends them, as JSON, to a file.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::peer_python;

fn peers() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/peers")
}

/// The OTLP receiver: a child process appending what it decodes to a file.
pub struct Receiver {
    child: Child,
    out: PathBuf,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Receiver {
    /// Start one in `mode` (`ok` or `hang`) and wait for its listener.
    pub fn start(mode: &str) -> Receiver {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("exports.jsonl");
        let mut child = Command::new(peer_python())
            .arg(peers().join("otlp_receiver.py"))
            .arg(mode)
            .arg(&out)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stderr.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the receiver did not say where it listens: {line:?}"));
        Receiver {
            child,
            out,
            port,
            _dir: dir,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The file the exports are appended to.
    pub fn out(&self) -> &std::path::Path {
        &self.out
    }

    /// Every export request received so far.
    pub fn exports(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Value> {
        self.exports()
            .iter()
            .inspect(|e| assert!(e.get("error").is_none(), "not an OTLP export: {e}"))
            .flat_map(|e| e["spans"].as_array().cloned().unwrap_or_default())
            .collect()
    }

    /// Wait (up to 20 s) until the spans received satisfy `pred`.
    pub fn wait(&self, what: &str, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let spans = self.spans();
            if pred(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not received within 20 s; spans: {spans:#?}"
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}
