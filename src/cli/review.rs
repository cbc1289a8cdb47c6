//! The reviewer commands: `keygen`, `pending`, `show`, `approve`, `deny`,
//! and `reconcile` through a running gateway. For scripting and for
//! reviewers without the TUI; they talk to `/v1` through
//! [`crate::cli::client`].

use crate::cli::out::{out, outln};
use anyhow::Context as _;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use serde_json::{json, Value};

use crate::cli::args::ReviewerArgs;
use crate::cli::client::{load_key, Client};
use crate::core::approval::Verdict;
use crate::core::legible;
use crate::core::reviewers::{format_public_key, KeyFile};

/// `countersign keygen --out FILE [--name NAME]`: a new reviewer key, written
/// with mode 0600 (never over an existing file). Returns the lines to add to
/// `policies/reviewers.toml`.
pub(crate) fn keygen(
    out: &Path,
    name: &str,
    groups: &[String],
    tenants: &[String],
) -> anyhow::Result<String> {
    crate::core::reviewers::check_reviewer_name(name)
        .map_err(|e| anyhow::anyhow!("{e} (set --name)"))?;
    let seed: [u8; 32] = rand::random();
    let kf = KeyFile::generate(name, seed);
    let public = format_public_key(&kf.signing_key()?.verifying_key());
    let text = format!(
        "# countersign reviewer key for `{name}`: keep it secret, never commit it\n{}",
        toml::to_string(&kf)?
    );
    // A missing folder (`~/.countersign` on a first run) is made, readable
    // by its owner only: it holds private keys.
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::DirBuilderExt;
            builder.mode(0o700);
        }
        builder
            .create(dir)
            .with_context(|| format!("cannot create the folder `{}`", dir.display()))?;
    }
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Created 0600 from the first byte: there is no moment when the
        // secret is readable by others.
        opts.mode(0o600);
    }
    let mut f = opts.open(out).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => anyhow::anyhow!(
            "`{}` already exists (keygen never overwrites a key; choose another --out)",
            out.display()
        ),
        _ => anyhow::anyhow!("cannot create `{}`: {e}", out.display()),
    })?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    let list = |items: &[String]| {
        let quoted: Vec<String> = items
            .iter()
            .filter(|i| !i.is_empty())
            .map(|i| toml::Value::String(i.clone()).to_string())
            .collect();
        format!("[{}]", quoted.join(", "))
    };
    let hint = if groups.is_empty() {
        "# no groups: the shipped policies let only group \"leads\" approve destructive tools (--groups leads)\n"
    } else {
        ""
    };
    Ok(format!(
        "[[reviewers]]\nname = \"{name}\"\npublic_key = \"{public}\"\n{hint}groups = {}\ntenants = {}\n",
        list(groups),
        list(tenants)
    ))
}

/// A client for the gateway with a reviewer's key file.
pub(crate) fn client(gateway: &str, key: &Path) -> anyhow::Result<Client> {
    Client::new(gateway, &load_key(key)?)
}

fn age(created_ms: i64) -> String {
    let now = time::OffsetDateTime::now_utc().unix_timestamp() * 1000;
    let secs = ((now - created_ms) / 1000).max(0) as u64;
    humantime::format_duration(Duration::from_secs(secs)).to_string()
}

/// `countersign pending`: pending proposals, a line each (or JSON), the one
/// that expires first first ([`crate::core::approval::queue_key`]).
pub(crate) async fn pending(c: &Client, as_json: bool) -> anyhow::Result<String> {
    let mut list = c.proposals(Some("pending")).await?;
    list.sort_by_key(crate::core::approval::queue_key);
    if as_json {
        return Ok(serde_json::to_string_pretty(&json!({ "proposals": list }))?);
    }
    if list.is_empty() {
        return Ok("no pending proposals\n".into());
    }
    let mut rows =
        vec![["ID", "AGE", "REQUESTER", "TENANT", "TOOL", "RISK", "FLAGS"].map(str::to_owned)];
    for p in &list {
        let flags = crate::core::approval::flags(p);
        rows.push([
            shown(p, "id"),
            age(p["created_ms"].as_i64().unwrap_or(0)),
            requester(p),
            shown(p, "tenant"),
            format!("{}/{}", shown(p, "server"), shown(p, "tool")),
            shown(p, "risk"),
            legible::visible(&flags.join(", ")).into_owned(),
        ]);
    }
    Ok(columns(&rows))
}

/// Rows as aligned columns, each as wide as its widest cell (long server
/// and tool names shift the columns, never run into the next one).
fn columns<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == N {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$} ", width = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A string field of the gateway's answer as people may see it: whatever
/// an agent chose in it (names, tenants, reasons) through
/// [`legible::text`].
fn shown(p: &Value, field: &str) -> String {
    legible::text(p[field].as_str().unwrap_or("")).into_owned()
}

/// One line per change (`[{pointer, before, after}]`):
/// `  /pointer   before -> after`. Pointers hold the agent's keys, and
/// values its strings: both are shown legible.
pub(crate) fn describe_changes(changes: &Value) -> String {
    let show = |v: &Value| {
        if v.is_null() {
            "(absent)".to_owned()
        } else {
            legible::value(v)
        }
    };
    changes
        .as_array()
        .into_iter()
        .flatten()
        .map(|ch| {
            format!(
                "  {:<20} {} -> {}\n",
                legible::text(ch["pointer"].as_str().unwrap_or("")),
                show(&ch["before"]),
                show(&ch["after"])
            )
        })
        .collect()
}

/// `countersign show ID`: the proposal in full (or JSON).
pub(crate) async fn show(c: &Client, id: &str, as_json: bool) -> anyhow::Result<String> {
    let p = c.proposal(id).await?;
    if as_json {
        return Ok(serde_json::to_string_pretty(&p)?);
    }
    // Everything below that an agent chose (keys, values, names) is shown
    // through `legible`: a reviewer reads what would run, never what a
    // crafted string makes the terminal draw.
    let mut out = format!(
        "{}\n\n{}.\n\nstate      {}\nrequester  {} (tenant {})\ntool       {}/{}\ndefinition {}\nrisk       {}\ndigest     {}\nversion    {}\ncreated    {}\n",
        shown(&p, "id"),
        // Made legible by the gateway; kept free of raw controls here too.
        legible::visible(p["summary"].as_str().unwrap_or("")),
        shown(&p, "state"),
        requester(&p),
        shown(&p, "tenant"),
        shown(&p, "server"),
        shown(&p, "tool"),
        legible::text(
            p["tool_definition"]
                .as_str()
                .unwrap_or("(not listed by the server)")
        ),
        shown(&p, "risk"),
        shown(&p, "call_digest"),
        legible::text(p["resource_version"].as_str().unwrap_or("(none)")),
        shown(&p, "created_at"),
    );
    if let Some(l) = p["looks_like"].as_str() {
        out.push_str(&format!(
            "beware     the tool's name looks like `{}`, another tool of this server: it is not that tool\n",
            legible::text(l)
        ));
    }
    for g in p["guards"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "guard      {}\n",
            legible::text(g.as_str().unwrap_or("?"))
        ));
    }
    if let Some(policies) = p["policies"].as_array().filter(|a| !a.is_empty()) {
        let names: Vec<String> = policies
            .iter()
            .filter_map(Value::as_str)
            .map(|n| legible::text(n).into_owned())
            .collect();
        out.push_str(&format!("asked by   {}\n", names.join(", ")));
    }
    if let Some(progress) = p["progress"].as_str() {
        out.push_str(&format!("approvals  {}\n", legible::visible(progress)));
    }
    out.push_str("\narguments\n");
    if let Some(args) = p["arguments"].as_object() {
        for (k, v) in args {
            out.push_str(&format!(
                "  {:<20} {}\n",
                legible::key(k),
                legible::value(v)
            ));
        }
    }
    if let Some(d) = p.get("definition_change").filter(|d| !d.is_null()) {
        out.push_str(&format!(
            "\nthe tool's definition is not the pinned one ({}); what changed:\n{}",
            legible::text(d["pinned"].as_str().unwrap_or("")),
            describe_changes(&d["changes"])
        ));
    }
    if let Some(rev) = p.get("revises").filter(|r| !r.is_null()) {
        out.push_str(&format!(
            "\nrevises {}\n{}",
            legible::text(rev["proposal_id"].as_str().unwrap_or("")),
            describe_changes(&rev["changes"])
        ));
    }
    if let Some(b) = p.get("beside").filter(|r| !r.is_null()) {
        // Another call (its own key): the two side by side, not a change.
        out.push_str(&format!(
            "\nanother call by the same requester: {} (its own key, a separate call); where they differ, that call first:\n{}",
            legible::text(b["proposal_id"].as_str().unwrap_or("")),
            describe_changes(&b["changes"]).replace(" -> ", " | ")
        ));
    }
    let quorum = p.get("quorum").is_some_and(|q| !q.is_null());
    for (list, word) in [("approvals", "approved"), ("denials", "denied")]
        .into_iter()
        .filter(|_| quorum)
    {
        for g in p[list].as_array().into_iter().flatten() {
            let st = &g["statement"];
            out.push_str(&format!(
                "{word:<10} by {} at {}, under policy set {}\n",
                shown(st, "reviewer"),
                shown(st, "issued_at"),
                legible::text(st["policy_set"].as_str().unwrap_or("(not named)")),
            ));
        }
    }
    if let Some(d) = p.get("decision").filter(|d| !d.is_null()) {
        let st = &d["statement"];
        out.push_str(&format!(
            "\ndecision   {} by {} at {}{}\n",
            shown(st, "decision"),
            shown(st, "reviewer"),
            shown(st, "issued_at"),
            st["reason"]
                .as_str()
                .filter(|r| !r.is_empty())
                .map(|r| format!(": {}", legible::text(r)))
                .unwrap_or_default()
        ));
    }
    Ok(out)
}

/// `countersign approve|deny`.
pub(crate) async fn decide(
    c: &Client,
    id: &str,
    verdict: Verdict,
    reason: &str,
    ttl: Duration,
) -> anyhow::Result<String> {
    let p = c.decide(id, verdict, reason, ttl).await?;
    let progress = p["progress"]
        .as_str()
        .map(|t| format!(" ({t})"))
        .unwrap_or_default();
    Ok(match (verdict, p["state"].as_str()) {
        (Verdict::Approve, Some("approved")) => format!(
            "approved {id}: {}/{} for {} may run once, until {}{progress}\n",
            shown(&p, "server"),
            shown(&p, "tool"),
            shown(&p, "requester"),
            p["expires_at"].as_str().unwrap_or("")
        ),
        (Verdict::Approve, _) => {
            format!("approval of {id} recorded; it waits for more reviewers{progress}\n")
        }
        (Verdict::Deny, Some("denied")) => format!("denied {id}\n"),
        (Verdict::Deny, _) => {
            format!("denial of {id} recorded; it takes more to end it{progress}\n")
        }
    })
}

/// `countersign withdraw ID`.
pub(crate) async fn withdraw_command(
    reviewer: &ReviewerArgs,
    id: &str,
) -> anyhow::Result<ExitCode> {
    let c = client(&reviewer.gateway, &reviewer.key)?;
    let p = c.withdraw(id).await?;
    outln!(
        "withdrew your approval of {id}{}",
        p["progress"]
            .as_str()
            .map(|t| format!(" ({t})"))
            .unwrap_or_default()
    );
    Ok(ExitCode::SUCCESS)
}

/// `countersign reconcile --reviewer-key`: through a running gateway.
pub(crate) async fn reconcile(c: &Client, body: &Value) -> anyhow::Result<String> {
    let v = c
        .call(reqwest::Method::POST, "/v1/outcomes/reconcile", Some(body))
        .await?;
    Ok(format!(
        "reconciled `{}`: now {}\n",
        body["key"].as_str().unwrap_or(""),
        v["state"]
    ))
}

/// The requester as a reviewer reads it: `alice`, or `okta:alice via
/// claude-code` when the token named its OAuth client.
fn requester(p: &Value) -> String {
    // The client name is the token's `azp`: whoever registered the OAuth
    // client chose it.
    let who = shown(p, "requester");
    match p["client"].as_str() {
        Some(c) => format!("{who} via {}", legible::text(c)),
        None => who,
    }
}

/// `countersign keygen`: write the key, print the reviewers file entry.
pub(crate) fn keygen_command(
    out: &Path,
    name: &str,
    groups: &[String],
    tenants: &[String],
    append: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let entry = keygen(out, name, groups, tenants)?;
    match append {
        Some(file) => {
            append_entry(file, &entry)?;
            eprintln!(
                "countersign: wrote the private key to {} (mode 0600) and appended this entry to {}:",
                out.display(),
                file.display()
            );
        }
        None => eprintln!(
            "countersign: wrote the private key to {} (mode 0600); add this entry to the gateway's \
             reviewers file (approvals.reviewers, by default policies/reviewers.toml):",
            out.display()
        ),
    }
    out!("{entry}");
    Ok(ExitCode::SUCCESS)
}

/// Append a `[[reviewers]]` entry to `file`, making the file and its folder
/// (mode 0700, like the data dir the gateway makes) when missing, with a
/// blank line before it when the file does not end with one.
fn append_entry(file: &Path, entry: &str) -> anyhow::Result<()> {
    use std::io::Write;
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.exists() {
            let mut b = std::fs::DirBuilder::new();
            b.recursive(true);
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
            b.create(dir)
                .with_context(|| format!("cannot make {}", dir.display()))?;
        }
    }
    let before = std::fs::read_to_string(file).unwrap_or_default();
    let sep = if before.is_empty() || before.ends_with("\n\n") {
        ""
    } else if before.ends_with('\n') {
        "\n"
    } else {
        "\n\n"
    };
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .and_then(|mut f| f.write_all(format!("{sep}{entry}").as_bytes()))
        .with_context(|| format!("cannot append to {}", file.display()))
}

/// `countersign pending`.
pub(crate) async fn pending_command(
    reviewer: &ReviewerArgs,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let c = client(&reviewer.gateway, &reviewer.key)?;
    out!("{}", pending(&c, json).await?);
    Ok(ExitCode::SUCCESS)
}

/// `countersign budgets`.
pub(crate) async fn budgets_command(
    reviewer: &ReviewerArgs,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let c = client(&reviewer.gateway, &reviewer.key)?;
    let v = c.call(reqwest::Method::GET, "/v1/budgets", None).await?;
    match json {
        true => outln!("{}", serde_json::to_string_pretty(&v)?),
        false => out!("{}", crate::enforce::guards::render_summary(&v)),
    }
    Ok(ExitCode::SUCCESS)
}

/// `countersign show ID`.
pub(crate) async fn show_command(
    reviewer: &ReviewerArgs,
    id: &str,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let c = client(&reviewer.gateway, &reviewer.key)?;
    outln!("{}", show(&c, id, json).await?);
    Ok(ExitCode::SUCCESS)
}

/// `countersign approve|deny ID`: sign the statement and send it.
pub(crate) async fn decide_command(
    reviewer: &ReviewerArgs,
    id: &str,
    verdict: Verdict,
    reason: &str,
    ttl: Duration,
) -> anyhow::Result<ExitCode> {
    let c = client(&reviewer.gateway, &reviewer.key)?;
    out!("{}", decide(&c, id, verdict, reason, ttl).await?);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    #[test]
    fn columns_fit_their_widest_cell() {
        let rows = [
            ["ID", "TOOL", "RISK"].map(str::to_owned),
            [
                "p-1",
                "a-very-long-server-name/an-even-longer-tool-name",
                "write",
            ]
            .map(str::to_owned),
            ["p-2", "s/t", "read"].map(str::to_owned),
        ];
        let text = super::columns(&rows);
        let lines: Vec<&str> = text.lines().collect();
        let at = lines[1].find("write").unwrap();
        assert_eq!(lines[0].find("RISK"), Some(at), "{text}");
        assert_eq!(lines[2].find("read"), Some(at), "{text}");
        assert!(lines[1].contains("tool-name write"), "{text}");
    }
}
