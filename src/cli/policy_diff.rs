//! `countersign policy diff`: what a policy change would move (DESIGN.md
//! section 22), as text, JSON, or Markdown fit for a pull-request comment.
//!
//! - `--shadow` summarizes the `shadow_disagreement` entries of the audit log
//!   over a window: per tool and direction, with a few call digests as
//!   examples. The calls are ones the gateway saw; no argument leaves it.
//! - `BASE HEAD --cases FILE` decides decision cases (the `policy test`
//!   format) under two policy folders, and shows which would move.
//!
//! `--fail-on loosen` exits 1 when anything would move towards allow
//! (deny → approval → allow), `--fail-on any` on any move; otherwise the
//! exit is 0 whatever moved.

use anyhow::Context as _;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::core::decision::Decision;

/// How the report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    Text,
    Json,
    Markdown,
}

/// When the command fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum FailOn {
    /// Any call would move towards allow.
    Loosen,
    /// Any call would move.
    Any,
}

/// Examples kept per group.
const EXAMPLES: usize = 3;

/// One group of moved decisions: a tool and a direction.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Move {
    pub(crate) server: String,
    pub(crate) tool: String,
    pub(crate) from: String,
    pub(crate) to: String,
    /// Towards allow.
    pub(crate) loosens: bool,
    pub(crate) calls: u64,
    /// Call digests (shadow) or case names (cases).
    pub(crate) examples: Vec<String>,
}

/// What would move, and where the evidence comes from.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Report {
    /// `shadow`, `cases` or `inputs`.
    pub(crate) source: &'static str,
    /// Said in the heading: the window, or the two folders.
    pub(crate) over: String,
    /// Calls (or cases) looked at: every call decided in the window for
    /// `shadow` and `inputs`, every case for `cases`.
    pub(crate) looked_at: u64,
    pub(crate) moves: Vec<Move>,
}

fn rank(verdict: &str) -> u8 {
    match verdict {
        "allow" => 2,
        "approval" => 1,
        _ => 0,
    }
}

/// Whether `from` → `to` moves towards allow.
pub(crate) fn loosens(from: &str, to: &str) -> bool {
    rank(to) > rank(from)
}

/// (server, tool, from, to).
type GroupKey = (String, String, String, String);

/// Groups moves by (server, tool, from, to), in that order: how many, and
/// the first few examples.
#[derive(Default)]
struct Groups(BTreeMap<GroupKey, (u64, Vec<String>)>);

impl Groups {
    fn add(&mut self, server: &str, tool: &str, from: &str, to: &str, example: &str) {
        let g = self
            .0
            .entry((server.into(), tool.into(), from.into(), to.into()))
            .or_default();
        g.0 += 1;
        if g.1.len() < EXAMPLES {
            g.1.push(example.to_owned());
        }
    }

    fn moves(self) -> Vec<Move> {
        self.0
            .into_iter()
            .map(|((server, tool, from, to), (calls, examples))| Move {
                loosens: loosens(&from, &to),
                server,
                tool,
                from,
                to,
                calls,
                examples,
            })
            .collect()
    }
}

/// The shadow set's disagreements in the audit logs of `dirs`, from
/// `since_ms` on.
pub(crate) fn from_audit(
    dirs: &[PathBuf],
    since_ms: i64,
    window: Duration,
) -> anyhow::Result<Report> {
    let mut buf = Vec::new();
    crate::audit::export::export(
        dirs,
        crate::audit::export::Format::Jsonl,
        Some(since_ms),
        None,
        &mut buf,
    )?;
    let mut groups = Groups::default();
    // The denominator is every call decided in the window, as in the other
    // form: a `decision` entry, or a read's one `completed` entry, which
    // carries its decision. A keyed call (a write and its retries) is one
    // call, as the shadow set counts it: one per tenant, principal and key.
    let mut keyed = std::collections::HashSet::new();
    let mut unkeyed: u64 = 0;
    let mut disagreed: u64 = 0;
    for line in buf.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let e: Map<String, Value> = serde_json::from_slice(line)?;
        let decided = match e.get("kind").and_then(Value::as_str) {
            Some("decision") => true,
            Some("completed") if e.contains_key("decision") => true,
            Some("shadow_disagreement") => false,
            _ => continue,
        };
        if decided {
            let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default();
            match e.get("idempotency_key").and_then(Value::as_str) {
                Some(key) => {
                    keyed.insert(format!("{}\u{0}{}\u{0}{key}", s("tenant"), s("principal")));
                }
                None => unkeyed += 1,
            }
            continue;
        }
        let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("?").to_owned();
        disagreed += 1;
        groups.add(
            &s("server"),
            &s("tool"),
            &s("from"),
            &s("to"),
            &s("call_digest"),
        );
    }
    Ok(Report {
        source: "shadow",
        over: format!(
            "the shadow policy set, on the calls of the last {}",
            window_words(window)
        ),
        // A window that starts between a call's decision and its
        // disagreement would count fewer decisions than disagreements.
        looked_at: (keyed.len() as u64 + unkeyed).max(disagreed),
        moves: groups.moves(),
    })
}

/// A policy folder as a git revision holds it, written out to a folder of
/// its own (removed on drop): what `policy diff --base-rev` decides under.
pub(crate) struct AtRevision {
    /// Where the files are written.
    pub(crate) path: PathBuf,
    /// How the report names it: `policies@origin/main`.
    pub(crate) name: String,
}

impl Drop for AtRevision {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The files under `dir` (a folder of the git work tree the command runs
/// in) at revision `rev`, read from git itself (`git ls-tree`, `git show`):
/// no checkout, no worktree, and the work tree is not touched.
pub(crate) fn at_revision(dir: &Path, rev: &str) -> anyhow::Result<AtRevision> {
    // A revision that starts with `-` would be read by git as an option.
    anyhow::ensure!(
        !rev.starts_with('-') && !rev.is_empty(),
        "`{rev}` is not a git revision"
    );
    let git = |args: &[&str]| -> anyhow::Result<Vec<u8>> {
        let out = std::process::Command::new("git")
            .args(args)
            .output()
            .context("cannot run git (is it installed?)")?;
        anyhow::ensure!(
            out.status.success(),
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(out.stdout)
    };
    let folder = dir.display().to_string();
    let listed = git(&["ls-tree", "-r", "-z", "--name-only", rev, "--", &folder])?;
    let files: Vec<&[u8]> = listed
        .split(|b| *b == 0)
        .filter(|f| !f.is_empty())
        .collect();
    anyhow::ensure!(
        !files.is_empty(),
        "git revision `{rev}` has no files under `{folder}` (give the policy folder with --policies, relative to where you run this)"
    );
    let path = std::env::temp_dir().join(format!(
        "countersign-policies-{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    std::fs::create_dir_all(&path).with_context(|| format!("cannot create {}", path.display()))?;
    let written = AtRevision {
        path,
        name: format!("{folder}@{rev}"),
    };
    for file in files {
        let file = std::str::from_utf8(file).context("a policy file name that is not UTF-8")?;
        // Only the folder's own files: `read_policies` reads no subfolder.
        let depth = |p: &Path| {
            p.components()
                .filter(|c| !matches!(c, std::path::Component::CurDir))
                .count()
        };
        let listed = Path::new(file);
        let Some(name) = listed
            .file_name()
            .filter(|_| depth(listed) == depth(dir) + 1)
        else {
            continue;
        };
        let bytes = git(&["show", &format!("{rev}:./{file}")])?;
        std::fs::write(written.path.join(name), bytes)
            .with_context(|| format!("cannot write {}", written.path.join(name).display()))?;
    }
    Ok(written)
}

/// A window as a person says it: "day", "2 days", "hour", "90 minutes";
/// humantime's form ("1day 2h") only when no one unit says it.
pub(crate) fn window_words(window: Duration) -> String {
    let secs = window.as_secs();
    let units = [
        (86_400, "day"),
        (3_600, "hour"),
        (60, "minute"),
        (1, "second"),
    ];
    for (size, unit) in units {
        if secs >= size && secs.is_multiple_of(size) && window.subsec_nanos() == 0 {
            return match secs / size {
                1 => unit.to_owned(),
                n => format!("{n} {unit}s"),
            };
        }
    }
    humantime::format_duration(window).to_string()
}

fn verdict(d: &Decision) -> &'static str {
    crate::enforce::shadow::verdict(d)
}

/// `rows` decided under the folders `base` and `head` by `decide`; each
/// row's server, tool and example come from `name`.
fn decided_twice<R>(
    base: &Path,
    head: &Path,
    rows: &[R],
    decide: impl Fn(&crate::core::decision::Policies, &R) -> Decision,
    name: impl Fn(&R) -> (&str, &str, &str),
) -> anyhow::Result<Vec<Move>> {
    let before = crate::cli::cases::load(base)?;
    let after = crate::cli::cases::load(head)?;
    let mut groups = Groups::default();
    for r in rows {
        let (from, to) = (verdict(&decide(&before, r)), verdict(&decide(&after, r)));
        if from != to {
            let (server, tool, example) = name(r);
            groups.add(server, tool, from, to, example);
        }
    }
    Ok(groups.moves())
}

/// The cases of `file` decided under `base` and under `head`.
pub(crate) fn from_cases(base: &Path, head: &Path, file: &Path) -> anyhow::Result<Report> {
    let cases = crate::cli::cases::cases(file)?;
    let moves = decided_twice(base, head, &cases, crate::cli::cases::decide, |c| {
        (&c.server, &c.tool, &c.name)
    })?;
    Ok(Report {
        source: "cases",
        over: format!(
            "the cases of {}, under {} and then {}",
            file.display(),
            base.display(),
            head.display()
        ),
        looked_at: cases.len() as u64,
        moves,
    })
}

/// Decision inputs from JSON lines (`policy inputs export`, or one row).
pub(crate) fn parse_inputs(text: &str) -> anyhow::Result<Vec<crate::enforce::inputs::Inputs>> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| format!("decision inputs, line {}", i + 1))
        })
        .collect()
}

/// Kept decision inputs decided under `base` and under `head`.
pub(crate) fn from_inputs(
    base: &Path,
    head: &Path,
    rows: &[crate::enforce::inputs::Inputs],
    what: &str,
) -> anyhow::Result<Report> {
    let moves = decided_twice(
        base,
        head,
        rows,
        |p, i| i.decide(p),
        |i| (&i.server, &i.tool, &i.call_digest),
    )?;
    Ok(Report {
        source: "inputs",
        over: format!(
            "{what}, under {} and then {}",
            base.display(),
            head.display()
        ),
        looked_at: rows.len() as u64,
        moves,
    })
}

impl Report {
    fn moved(&self) -> u64 {
        self.moves.iter().map(|m| m.calls).sum()
    }

    fn loosened(&self) -> u64 {
        self.moves
            .iter()
            .filter(|m| m.loosens)
            .map(|m| m.calls)
            .sum()
    }

    fn unit(&self) -> &'static str {
        if self.source == "cases" {
            "cases"
        } else {
            "calls"
        }
    }

    /// Whether `fail_on` says this report fails.
    pub(crate) fn fails(&self, fail_on: Option<FailOn>) -> bool {
        match fail_on {
            None => false,
            Some(FailOn::Loosen) => self.loosened() > 0,
            Some(FailOn::Any) => self.moved() > 0,
        }
    }

    /// The report as `format` says.
    pub(crate) fn render(&self, format: Format) -> anyhow::Result<String> {
        Ok(match format {
            Format::Json => serde_json::to_string_pretty(self)? + "\n",
            Format::Text => self.text(),
            Format::Markdown => self.markdown(),
        })
    }

    fn text(&self) -> String {
        let mut out = format!(
            "policy diff over {}: {} of {} {} would be decided otherwise ({} towards allow)\n",
            self.over,
            self.moved(),
            self.looked_at,
            self.unit(),
            self.loosened()
        );
        for m in &self.moves {
            out.push_str(&format!(
                "  {}/{}  {} -> {}{}  {}  e.g. {}\n",
                m.server,
                m.tool,
                m.from,
                m.to,
                if m.loosens { " (loosens)" } else { "" },
                m.calls,
                m.examples.join(", ")
            ));
        }
        out
    }

    fn markdown(&self) -> String {
        // Names come from the audit log or the case file: backticks and
        // pipes would break out of the table's cells.
        let cell = |s: &str| s.replace(['`', '|', '\n', '\r'], " ");
        let mut out = String::from("### countersign policy diff\n\n");
        out.push_str(&format!(
            "Over {}: **{}** of {} {} would be decided otherwise, **{}** of them towards allow.\n",
            cell(&self.over),
            self.moved(),
            self.looked_at,
            self.unit(),
            self.loosened()
        ));
        if self.moves.is_empty() {
            out.push_str("\nNo decision moves.\n");
            return out;
        }
        out.push_str("\n| tool | from | to | ");
        out.push_str(self.unit());
        out.push_str(" | examples |\n|---|---|---|---:|---|\n");
        for m in &self.moves {
            out.push_str(&format!(
                "| `{}/{}` | {} | {}{} | {} | {} |\n",
                cell(&m.server),
                cell(&m.tool),
                m.from,
                m.to,
                if m.loosens { " (loosens)" } else { "" },
                m.calls,
                m.examples
                    .iter()
                    .map(|e| format!("`{}`", cell(e)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_reads_as_a_person_says_it() {
        let w = |s| window_words(Duration::from_secs(s));
        assert_eq!(w(86_400), "day");
        assert_eq!(w(7 * 86_400), "7 days");
        assert_eq!(w(3_600), "hour");
        assert_eq!(w(36 * 3_600), "36 hours");
        assert_eq!(w(90 * 60), "90 minutes");
        assert_eq!(w(61), "61 seconds");
        assert_eq!(window_words(Duration::from_millis(1_500)), "1s 500ms");
    }

    fn report() -> Report {
        let mut g = Groups::default();
        for i in 0..20 {
            g.add(
                "payments",
                "refund",
                "approval",
                "allow",
                &format!("sha256:{i:02}"),
            );
        }
        g.add("payments", "transfer", "approval", "deny", "sha256:aa");
        Report {
            source: "shadow",
            over: "the shadow policy set, on the calls of the last day".into(),
            looked_at: 21,
            moves: g.moves(),
        }
    }

    #[test]
    fn directions_towards_allow_loosen() {
        assert!(loosens("approval", "allow"));
        assert!(loosens("deny", "approval"));
        assert!(loosens("deny", "allow"));
        assert!(!loosens("allow", "approval"));
        assert!(!loosens("approval", "deny"));
    }

    #[test]
    fn groups_count_every_call_and_keep_three_examples() {
        let r = report();
        assert_eq!(r.moves.len(), 2);
        assert_eq!(r.moves[0].calls, 20);
        assert_eq!(r.moves[0].examples.len(), EXAMPLES);
        assert_eq!(r.moved(), 21);
        assert_eq!(r.loosened(), 20);
        assert!(r.fails(Some(FailOn::Loosen)));
        assert!(r.fails(Some(FailOn::Any)));
        assert!(!r.fails(None));
        let tighter = Report {
            moves: r.moves[1..].to_vec(),
            ..r.clone()
        };
        assert!(!tighter.fails(Some(FailOn::Loosen)));
        assert!(tighter.fails(Some(FailOn::Any)));
    }

    #[test]
    fn markdown_escapes_what_would_break_the_table() {
        let mut r = report();
        r.moves[1].tool = "a|b`c".into();
        let md = r.render(Format::Markdown).unwrap();
        assert!(md.contains("`payments/a b c`"), "{md}");
    }
}
