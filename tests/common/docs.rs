//! The commands a guide shows, run as written: its ```sh blocks, with this
//! run's free ports and debug binaries in place of the guide's fixed ports
//! and `target/release`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// The ```sh blocks of `file` (from the repository's root) between the
/// heading line starting with `from` and the one starting with `to` (or the
/// end), each block as one script.
pub fn sh_blocks(file: &str, from: &str, to: Option<&str>) -> Vec<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text
        .lines()
        .position(|l| l.starts_with(from))
        .unwrap_or_else(|| panic!("{file} has no heading `{from}`"));
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in text.lines().skip(start + 1) {
        if to.is_some_and(|t| line.starts_with(t)) {
            break;
        }
        let trimmed = line.trim_start();
        match (&mut current, trimmed.starts_with("```")) {
            (None, true) if trimmed == "```sh" => current = Some(Vec::new()),
            (Some(lines), true) => {
                blocks.push(lines.join("\n"));
                current = None;
            }
            (Some(lines), false) => lines.push(trimmed),
            _ => {}
        }
    }
    blocks
}

/// The substitutions that make a guide's commands this run's.
pub struct Rewrite(pub Vec<(String, String)>);

impl Rewrite {
    /// `target/release/` becomes the directory of this run's binaries.
    pub fn new() -> Rewrite {
        let bin = super::countersign_bin();
        let dir = bin.parent().unwrap().display().to_string();
        Rewrite(vec![("target/release/".into(), format!("{dir}/"))])
    }

    pub fn port(mut self, from: u16, to: u16) -> Rewrite {
        self.0.push((format!(":{from}"), format!(":{to}")));
        self
    }

    pub fn apply(&self, text: &str) -> String {
        self.0
            .iter()
            .fold(text.to_owned(), |t, (from, to)| t.replace(from, to))
    }
}

/// Runs `script` with `sh -e` in `dir`, this run's binaries first on the
/// path.
pub fn sh(dir: &Path, script: &str) -> Output {
    let bin = super::countersign_bin();
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new("sh")
        .args(["-ec", script])
        .current_dir(dir)
        .env("PATH", path)
        .output()
        .unwrap()
}

/// A process a guide leaves running, killed on drop.
pub struct Background(pub Child);

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a guide's long-running command line (`VAR=value program args`)
/// in `dir`, its stderr piped for `wait_listening`.
pub fn spawn(dir: &Path, line: &str) -> Child {
    let words = shlex::split(line).unwrap();
    let at = words.iter().position(|w| !w.contains('=')).unwrap();
    let mut cmd = Command::new(&words[at]);
    for assignment in &words[..at] {
        let (k, v) = assignment.split_once('=').unwrap();
        cmd.env(k, v);
    }
    cmd.args(&words[at + 1..])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start `{line}`: {e}"))
}

/// A folder as a clone holds it for the example gateway: the shipped
/// `policies/` and `examples/countersign.toml` listening on a free port,
/// with a 1 s `approvals.hold` for the example's 10 s. Its port, and the
/// rewrite that puts that port in a guide's commands.
pub fn example_clone(dir: &Path) -> (u16, Rewrite) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::create_dir_all(dir.join("examples")).unwrap();
    std::fs::create_dir_all(dir.join("policies")).unwrap();
    for f in [
        "default.cedar",
        "quorum.cedar",
        "schema.cedarschema",
        "tests.toml",
    ] {
        std::fs::copy(root.join("policies").join(f), dir.join("policies").join(f)).unwrap();
    }
    let port = super::idp::free_port();
    let rw = Rewrite::new().port(7373, port);
    let config = std::fs::read_to_string(root.join("examples/countersign.toml"))
        .unwrap()
        .replace("hold = \"10s\"", "hold = \"1s\"");
    std::fs::write(dir.join("examples/countersign.toml"), rw.apply(&config)).unwrap();
    (port, rw)
}

/// What a command printed, stdout then stderr.
pub fn said(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
