//! Drawing: reads the [`App`], never changes it. Laid out for 80x24 and up.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Row, Table, Tabs, Wrap};
use ratatui::Frame;
use std::borrow::Cow;

use countersign::core::legible;
use serde_json::Value;

use crate::app::{App, Link, Modal, View};

/// A string field as it is, for decisions; never drawn as it is.
fn raw<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

/// A string field as people may see it: agents choose names, keys and
/// values, and a terminal obeys what they hold, so everything drawn goes
/// through [`legible`] (an ESC or a bidi override shows as `\u{1b}`).
fn s<'a>(v: &'a Value, k: &str) -> Cow<'a, str> {
    legible::text(raw(v, k))
}

/// A short duration: `45s`, `12m`, `3h`, `2d`.
pub fn short(ms: i64) -> String {
    let secs = (ms / 1000).max(0);
    match secs {
        0..=59 => format!("{secs}s"),
        60..=3599 => format!("{}m", secs / 60),
        3600..=86_399 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

fn risk_style(risk: &str) -> Style {
    match risk {
        "destructive" => Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
        "write" => Style::default().fg(Color::Yellow),
        _ => Style::default().fg(Color::Green),
    }
}

/// Draw everything.
pub fn draw(app: &App, f: &mut Frame) {
    let [header, tabs, body, status, hints] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Min(5),
        Constraint::Length(1),
        Constraint::Length(1),
    ])
    .areas(f.area());
    let (link, link_style) = match &app.link {
        Link::Live => ("● live".to_owned(), Style::default().fg(Color::Green)),
        Link::Connecting => (
            "○ connecting".to_owned(),
            Style::default().fg(Color::Yellow),
        ),
        Link::Lost(e) => (
            format!("✕ gateway lost, reconnecting: {e}"),
            Style::default().fg(Color::Red),
        ),
    };
    f.render_widget(
        Paragraph::new(Line::from(vec![
            Span::styled(
                "countersign-review ",
                Style::default().add_modifier(Modifier::BOLD),
            ),
            Span::raw(format!("{} @ {}  ", app.reviewer, app.gateway)),
            Span::styled(link, link_style),
        ])),
        header,
    );
    let selected = match app.view {
        View::Pending | View::Detail => 0,
        View::Outcomes => 1,
        View::History => 2,
        View::Audit => 3,
    };
    f.render_widget(
        Tabs::new(vec![
            format!("1 Pending ({})", app.pending().len()),
            format!("2 Unknown outcomes ({})", app.outcomes.len()),
            "3 History".to_owned(),
            "4 Audit".to_owned(),
        ])
        .select(selected)
        .highlight_style(Style::default().add_modifier(Modifier::REVERSED)),
        tabs,
    );
    match app.view {
        View::Pending => pending(app, f, body),
        View::Detail => detail(app, f, body),
        View::Outcomes => outcomes(app, f, body),
        View::History => history(app, f, body),
        View::Audit => audit(app, f, body),
    }
    if let Some((text, error)) = &app.status {
        let style = if *error {
            Style::default().fg(Color::Red)
        } else {
            Style::default().fg(Color::Green)
        };
        f.render_widget(Paragraph::new(text.as_str()).style(style), status);
    }
    let keys = match (&app.modal, app.view) {
        (Some(Modal::Approve { .. }), _) => "type · Tab reason / TTL · Enter approve · Esc cancel",
        (Some(_), _) => "type · Enter confirm · Esc cancel",
        (None, View::Pending) => {
            "↑↓ select · Enter detail · a approve · d deny · 1-4 views · q quit"
        }
        (None, View::Detail) => "a approve · d deny · v raw JSON · Esc back · q quit",
        (None, View::Outcomes) => "↑↓ select · e executed · n not executed · r reload · q quit",
        (None, View::History) => "↑↓ select · 1-4 views · q quit",
        (None, View::Audit) => "r reload · 1-4 views · q quit",
    };
    f.render_widget(
        Paragraph::new(keys).style(Style::default().fg(Color::DarkGray)),
        hints,
    );
    if let Some(m) = &app.modal {
        modal(app, m, f);
    }
}

fn highlight() -> Style {
    Style::default().add_modifier(Modifier::REVERSED)
}

/// A list view: rows (the selected one highlighted), a bold header, a rule
/// above with an optional title.
fn list<'a>(
    rows: impl IntoIterator<Item = Row<'a>>,
    selected: usize,
    widths: &[Constraint],
    header: &[&'a str],
    title: &'a str,
) -> Table<'a> {
    let rows = rows.into_iter().enumerate().map(|(i, r)| {
        if i == selected {
            r.style(highlight())
        } else {
            r
        }
    });
    Table::new(rows, widths.to_vec())
        .header(Row::new(header.to_vec()).style(Style::default().add_modifier(Modifier::BOLD)))
        .block(Block::default().borders(Borders::TOP).title(title))
}

fn pending(app: &App, f: &mut Frame, area: Rect) {
    let queue = app.pending();
    if queue.is_empty() {
        f.render_widget(
            Paragraph::new("No proposals waiting. New ones appear here as agents ask.")
                .block(Block::default().borders(Borders::TOP)),
            area,
        );
        return;
    }
    let rows = queue.iter().map(|p| {
        let age = short(app.now_ms - p["created_ms"].as_i64().unwrap_or(app.now_ms));
        let expires = p["pending_expires_ms"]
            .as_i64()
            .map_or("-".into(), |e| short(e - app.now_ms));
        // The same words as `countersign pending` (one function for both).
        let mut flags = countersign::core::approval::flags(p);
        if app.possible_duplicate(p).is_some() {
            flags.push("dup?".into());
        }
        Row::new(vec![
            Span::raw(age),
            Span::raw(expires),
            Span::raw(match p["client"].as_str() {
                Some(c) => format!("{} via {}", s(p, "requester"), legible::text(c)),
                None => s(p, "requester").into_owned(),
            }),
            Span::raw(s(p, "tenant").into_owned()),
            Span::raw(format!("{}/{}", s(p, "server"), s(p, "tool"))),
            Span::styled(s(p, "risk").into_owned(), risk_style(raw(p, "risk"))),
            Span::raw(legible::visible(&flags.join(", ")).into_owned()),
        ])
    });
    let table = list(
        rows.collect::<Vec<_>>(),
        app.selected,
        &[
            Constraint::Length(4),
            Constraint::Length(4),
            Constraint::Length(10),
            Constraint::Length(8),
            Constraint::Length(22),
            Constraint::Length(11),
            Constraint::Min(10),
        ],
        &["AGE", "EXP", "REQUESTER", "TENANT", "TOOL", "RISK", "FLAGS"],
        "",
    );
    f.render_widget(table, area);
}

/// Argument rows, nested values indented under their key. Keys that are
/// not printable identifiers are quoted and marked, and values escaped
/// ([`legible`]): a key built to erase the line above cannot make a
/// reviewer read another amount.
pub fn argument_lines(v: &Value, depth: usize, out: &mut Vec<Line<'static>>) {
    if let Value::Object(m) = v {
        for (k, val) in m {
            let pad = "  ".repeat(depth);
            let k = legible::key(k);
            match val {
                Value::Object(_) => {
                    out.push(Line::from(format!("  {pad}{k}")));
                    argument_lines(val, depth + 1, out);
                }
                Value::String(t) => {
                    let mut spans = vec![
                        Span::raw(format!("  {pad}{k:<18} ")),
                        Span::styled(
                            legible::text(t).into_owned(),
                            Style::default().add_modifier(Modifier::BOLD),
                        ),
                    ];
                    // A value that could pass for another is said so.
                    if let Some(mark) = legible::lookalike(t) {
                        spans.push(Span::styled(
                            format!(" ({mark})"),
                            Style::default().fg(Color::Yellow),
                        ));
                    }
                    out.push(Line::from(spans));
                }
                other => out.push(Line::from(vec![
                    Span::raw(format!("  {pad}{k:<18} ")),
                    Span::styled(
                        legible::value(other),
                        Style::default().add_modifier(Modifier::BOLD),
                    ),
                ])),
            }
        }
    }
}

fn detail(app: &App, f: &mut Frame, area: Rect) {
    let Some(p) = app.detail.as_ref().and_then(|id| app.proposals.get(id)) else {
        f.render_widget(Paragraph::new("That proposal is gone."), area);
        return;
    };
    let block = Block::default().borders(Borders::TOP).title(format!(
        " {} · {} ",
        s(p, "id"),
        s(p, "state")
    ));
    if app.raw {
        let canonical = countersign::core::canonical::jcs(&p["arguments"]);
        // JSON escapes kept; whatever else does not display itself
        // (C1, bidi, zero-width) written out, line by line.
        let text = format!(
            "canonical arguments (what the server receives, digest {}):\n{canonical}\n\n{}",
            s(p, "call_digest"),
            serde_json::to_string_pretty(p).unwrap_or_default()
        )
        .lines()
        .map(legible::visible)
        .collect::<Vec<_>>()
        .join("\n");
        f.render_widget(
            Paragraph::new(text).block(block).wrap(Wrap { trim: false }),
            area,
        );
        return;
    }
    let mut lines = vec![
        Line::from(Span::styled(
            // Made legible by the gateway; kept free of raw controls here.
            legible::visible(raw(p, "summary")).into_owned(),
            Style::default().add_modifier(Modifier::BOLD),
        )),
        Line::from(""),
    ];
    // Only a standing approval or an undecided proposal has a countdown; a
    // consumed approval can never be used again, whatever its expiry said.
    let expiry = match (raw(p, "state"), p["expires_ms"].as_i64()) {
        ("approved", Some(e)) => format!("approval expires in {}", short(e - app.now_ms)),
        ("pending", _) | ("", None) => {
            p["pending_expires_ms"].as_i64().map_or(String::new(), |e| {
                format!("undecided, expires in {}", short(e - app.now_ms))
            })
        }
        ("consumed", _) => "approval used up (it ran once)".to_owned(),
        (state, _) => state.to_owned(),
    };
    lines.push(Line::from(vec![
        Span::raw("risk "),
        Span::styled(s(p, "risk").into_owned(), risk_style(raw(p, "risk"))),
        Span::raw(format!(
            " · resource version {} · {expiry}",
            legible::text(p["resource_version"].as_str().unwrap_or("none"))
        )),
    ]));
    lines.push(Line::from(format!(
        "tool definition {}",
        legible::text(
            p["tool_definition"]
                .as_str()
                .unwrap_or("(not listed by the server)")
        )
    )));
    if p["looks_like"].is_string() {
        lines.push(Line::from(Span::styled(
            format!(
                "the tool's name looks like `{}`, another tool of this server: it is not that tool",
                s(p, "looks_like")
            ),
            Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
        )));
    }
    for g in p["guards"].as_array().into_iter().flatten() {
        lines.push(Line::from(Span::styled(
            legible::text(g.as_str().unwrap_or("?")).into_owned(),
            Style::default()
                .fg(Color::Yellow)
                .add_modifier(Modifier::BOLD),
        )));
    }
    if let Some(d) = p.get("definition_change").filter(|d| !d.is_null()) {
        lines.push(Line::from(Span::styled(
            format!(
                "the tool's definition is not the pinned one ({})",
                s(d, "pinned")
            ),
            Style::default()
                .fg(Color::Yellow)
                .add_modifier(Modifier::UNDERLINED),
        )));
        change_lines(&d["changes"], &mut lines);
    }
    let asked: Vec<&str> = p["policies"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    lines.push(Line::from(format!(
        "approval required by {}",
        if asked.is_empty() {
            "the policies".to_owned()
        } else {
            asked.join(", ")
        }
    )));
    // Where a quorum stands, and who approved under which policy set.
    if let Some(progress) = p["progress"].as_str() {
        lines.push(Line::from(Span::styled(
            legible::visible(progress).into_owned(),
            Style::default().add_modifier(Modifier::BOLD),
        )));
        for g in p["approvals"].as_array().into_iter().flatten() {
            let st = &g["statement"];
            lines.push(Line::from(format!(
                "  approved by {} at {} under policy set {}",
                s(st, "reviewer"),
                s(st, "issued_at"),
                legible::text(
                    st["policy_set"]
                        .as_str()
                        .map_or("(not named)", |d| d.get(..19).unwrap_or(d))
                ),
            )));
        }
    }
    if let Some(d) = app.possible_duplicate(p) {
        lines.push(Line::from(Span::styled(
            format!("possible duplicate: {}", legible::visible(&d)),
            Style::default().fg(Color::Yellow),
        )));
    }
    lines.push(Line::from(""));
    lines.push(Line::from(Span::styled(
        "arguments",
        Style::default().add_modifier(Modifier::UNDERLINED),
    )));
    argument_lines(&p["arguments"], 0, &mut lines);
    if let Some(r) = p.get("revises").filter(|r| !r.is_null()) {
        lines.push(Line::from(""));
        lines.push(Line::from(Span::styled(
            format!("revises {}", s(r, "proposal_id")),
            Style::default()
                .fg(Color::Yellow)
                .add_modifier(Modifier::UNDERLINED),
        )));
        change_lines(&r["changes"], &mut lines);
    }
    if let Some(b) = p.get("beside").filter(|r| !r.is_null()) {
        // A separate call (its own key): named, not shown as a change.
        lines.push(Line::from(""));
        lines.push(Line::from(format!(
            "another call by the same requester: {} (its own key)",
            s(b, "proposal_id")
        )));
    }
    f.render_widget(
        Paragraph::new(lines)
            .block(block)
            .wrap(Wrap { trim: false }),
        area,
    );
}

/// One line per change (`[{pointer, before, after}]`).
fn change_lines(changes: &Value, lines: &mut Vec<Line<'_>>) {
    for c in changes.as_array().into_iter().flatten() {
        let show = |v: &Value| {
            if v.is_null() {
                "(absent)".to_owned()
            } else {
                legible::value(v)
            }
        };
        lines.push(Line::from(format!(
            "  {:<20} {} → {}",
            s(c, "pointer"),
            show(&c["before"]),
            show(&c["after"])
        )));
    }
}

fn outcomes(app: &App, f: &mut Frame, area: Rect) {
    if app.outcomes.is_empty() {
        f.render_widget(
            Paragraph::new("No unknown outcomes: every dispatched call has an answer.")
                .block(Block::default().borders(Borders::TOP)),
            area,
        );
        return;
    }
    let rows = app.outcomes.iter().map(|o| {
        Row::new(vec![
            s(o, "tenant").into_owned(),
            s(o, "principal").into_owned(),
            s(o, "key").into_owned(),
            format!("{}/{}", s(o, "server"), s(o, "tool")),
            s(o, "created_at").into_owned(),
        ])
    });
    let table = list(
        rows,
        app.selected,
        &[
            Constraint::Length(8),
            Constraint::Length(10),
            Constraint::Length(16),
            Constraint::Length(22),
            Constraint::Min(10),
        ],
        &["TENANT", "PRINCIPAL", "KEY", "TOOL", "SINCE"],
        " sent, answer lost: check the system, then mark executed or not ",
    );
    f.render_widget(table, area);
}

fn history(app: &App, f: &mut Frame, area: Rect) {
    let rows = app.history().into_iter().map(|p| {
        // A reviewer, or the requester themselves in their client.
        // With a quorum, every reviewer who approved.
        let approvers: Vec<&str> = p["approvals"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g.pointer("/statement/reviewer").and_then(Value::as_str))
            .collect();
        let by = match p.pointer("/confirmation/principal").and_then(Value::as_str) {
            Some(who) => format!("{} (client)", legible::text(who)),
            None if approvers.len() > 1 && p.get("quorum").is_some_and(|q| !q.is_null()) => {
                legible::text(&approvers.join(", ")).into_owned()
            }
            None => legible::text(
                p.pointer("/decision/statement/reviewer")
                    .and_then(Value::as_str)
                    .unwrap_or("-"),
            )
            .into_owned(),
        };
        Row::new(vec![
            s(p, "id").into_owned(),
            s(p, "state").into_owned(),
            s(p, "requester").into_owned(),
            format!("{}/{}", s(p, "server"), s(p, "tool")),
            by,
            short(app.now_ms - p["updated_ms"].as_i64().unwrap_or(app.now_ms)),
        ])
    });
    let table = list(
        rows,
        app.selected,
        &[
            Constraint::Length(19),
            Constraint::Length(11),
            Constraint::Length(10),
            Constraint::Length(22),
            // A reviewer's name, or `NAME (client)`.
            Constraint::Length(14),
            Constraint::Min(4),
        ],
        &["ID", "STATE", "REQUESTER", "TOOL", "BY", "AGO"],
        "",
    );
    f.render_widget(table, area);
}

fn audit(app: &App, f: &mut Frame, area: Rect) {
    let lines: Vec<Line> = app
        .audit
        .iter()
        .rev()
        .map(|e| {
            let time = raw(e, "time");
            let clock = legible::text(time.get(11..19).unwrap_or(time));
            Line::from(format!(
                "{:>6} {} {:<18} {} {}",
                e["seq"].as_u64().unwrap_or(0),
                clock,
                s(e, "kind"),
                s(e, "principal"),
                if e.get("tool").is_some() {
                    format!("{}/{}", s(e, "server"), s(e, "tool"))
                } else {
                    String::new()
                }
            ))
        })
        .collect();
    f.render_widget(
        Paragraph::new(lines).block(
            Block::default()
                .borders(Borders::TOP)
                .title(" newest first (countersign audit verify checks the chain) "),
        ),
        area,
    );
}

fn centered(area: Rect, width: u16, height: u16) -> Rect {
    let w = width.min(area.width);
    let h = height.min(area.height);
    Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    }
}

fn modal(app: &App, m: &Modal, f: &mut Frame) {
    // The approve prompt has two fields and a line more of keys.
    let height = if matches!(m, Modal::Approve { .. }) {
        11
    } else {
        9
    };
    let area = centered(f.area(), 70, height);
    let summary = |id: &str| {
        app.proposals
            .get(id)
            .map(|p| legible::visible(raw(p, "summary")).into_owned())
            .unwrap_or_default()
    };
    let (title, body) = match m {
        Modal::Approve {
            id,
            reason,
            ttl,
            on_ttl,
        } => {
            let (r_cursor, t_cursor) = if *on_ttl { ("", "▏") } else { ("▏", "") };
            // An empty field means the default: say which, focused or not.
            let default = humantime::format_duration(crate::app::DEFAULT_TTL).to_string();
            let ttl_shown = match (ttl.is_empty(), *on_ttl) {
                (false, _) => ttl.clone(),
                (true, false) => format!("{default} (default)"),
                (true, true) => String::new(),
            };
            let t_cursor = if ttl.is_empty() && *on_ttl {
                format!("{t_cursor} (empty: {default}, the default; e.g. 10m, 1h)")
            } else {
                t_cursor.to_owned()
            };
            (
                format!(" approve {id} "),
                format!(
                    "{}\n\nReason (optional, recorded): {reason}{r_cursor}\nUsable for: {ttl_shown}{t_cursor}\n\nSigned with your key; it may run once.\n[Enter] approve   [Tab] reason / TTL   [Esc] cancel",
                    summary(id)
                ),
            )
        }
        Modal::DenyReason(id, text) => (
            format!(" deny {id} "),
            format!(
                "{}\n\nReason (the agent is told): {text}▏\n\n[Enter] deny   [Esc] cancel",
                summary(id)
            ),
        ),
        Modal::Reconcile {
            index,
            executed,
            note,
        } => {
            let key = app
                .outcomes
                .get(*index)
                .map(|o| s(o, "key").into_owned())
                .unwrap_or_default();
            (
                format!(
                    " mark `{key}` {} ",
                    if *executed {
                        "executed"
                    } else {
                        "not executed"
                    }
                ),
                format!(
                    "{}\n\nNote: {note}▏\n\n[Enter] confirm   [Esc] cancel",
                    if *executed {
                        "Retries will get a note that it ran; it is never sent again."
                    } else {
                        "The key is freed: the next retry runs the call."
                    }
                ),
            )
        }
    };
    f.render_widget(Clear, area);
    f.render_widget(
        Paragraph::new(body)
            .wrap(Wrap { trim: false })
            .block(Block::default().borders(Borders::ALL).title(title)),
        area,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::tests::{app, key, proposal};
    use crate::app::{Input, Net};
    use ratatui::backend::TestBackend;
    use ratatui::crossterm::event::KeyCode;
    use ratatui::Terminal;
    use serde_json::json;

    fn render(app: &App, w: u16, h: u16) -> String {
        let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
        t.draw(|f| draw(app, f)).unwrap();
        // The clock is fixed by the test (`now_ms`), so nothing needs masking
        // but the gateway URL's port, which is fixed too.
        format!("{}", t.backend())
    }

    #[test]
    fn a_quorum_shows_its_count_and_who_approved() {
        let mut a = app();
        let mut q = proposal("p-4", "pending", 995_000, 20_000);
        q["quorum"] = json!({"approvals": 1, "from": ["finance", "leads"], "denials": 1});
        q["approvals"] = json!([{
            "statement": {"reviewer": "alice", "issued_at": "2026-11-30T10:00:00Z",
                          "policy_set": "sha256:0123456789abcdef0123"},
            "signature": "", "public_key": "", "groups": ["leads"], "expires_ms": 1_900_000
        }]);
        q["progress"] = json!("1 of 2 approvals: alice (leads); needs one more from finance");
        a.event(Input::Net(Net::Proposal(q.clone())));
        insta::assert_snapshot!("quorum_pending", render(&a, 100, 24));
        // Oldest first: the quorum's proposal is the third.
        a.event(key(KeyCode::Down));
        a.event(key(KeyCode::Down));
        a.event(key(KeyCode::Enter));
        insta::assert_snapshot!("quorum_detail", render(&a, 100, 24));
        // Met and used: the history names both reviewers.
        q["state"] = json!("consumed");
        q["approvals"].as_array_mut().unwrap().push(json!({
            "statement": {"reviewer": "dave", "issued_at": "2026-11-30T10:01:00Z"},
            "signature": "", "public_key": "", "groups": ["finance"], "expires_ms": 1_900_000
        }));
        q["decision"] = json!({"statement": {"reviewer": "dave"}});
        a.event(Input::Net(Net::Proposal(q)));
        a.event(key(KeyCode::Esc));
        a.event(key(KeyCode::Char('3')));
        let history = render(&a, 100, 24);
        assert!(history.contains("alice, dave"), "{history}");
    }

    /// A proposal built to deceive: a key that erases the line above it
    /// and poses as `amount`, values with a bell, a bidi override and a
    /// zero-width joiner, an OAuth client name that clears the screen.
    fn hostile() -> Value {
        let mut p = proposal("p-9", "pending", 995_000, 900);
        p["arguments"] = json!({
            "amount": 900,
            "zz\r\u{1b}[2K\u{1b}[1A\u{1b}[2K\r  amount              ": 9,
            "memo": "ok\u{7}\u{202e}9 tnuoma\u{200d}",
        });
        p["client"] = json!("cli\u{1b}[2J");
        p["tool"] = json!("charge\u{200b}_card");
        p["summary"] = json!("agent-7 of acme wants payments/charge_card\u{1b}[2K");
        p
    }

    /// Whether a drawn screen holds a character that a terminal would obey
    /// instead of showing.
    fn obeyed(screen: &str) -> Option<char> {
        screen.chars().find(|c| {
            (*c != '\n' && c.is_control())
                || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
    }

    #[test]
    fn a_deceiving_proposal_is_drawn_as_what_it_is() {
        let mut a = app();
        a.event(Input::Net(Net::Proposal(hostile())));
        let list = render(&a, 100, 24);
        assert_eq!(obeyed(&list), None, "{list}");
        // The tool column cuts it, but the invisible space shows.
        assert!(list.contains(r"payments/charge\u{200b"), "{list}");
        a.event(key(KeyCode::Down));
        a.event(key(KeyCode::Down));
        a.event(key(KeyCode::Enter));
        let detail = render(&a, 100, 24);
        assert_eq!(obeyed(&detail), None, "{detail}");
        // The real amount is on its own line, and the key that posed as
        // `amount` is quoted, escaped and marked.
        assert!(
            detail.lines().any(|l| {
                let cells = l.trim_start_matches('"').trim_start();
                cells.starts_with("amount") && cells.contains(" 900")
            }),
            "{detail}"
        );
        assert!(
            detail.contains(r#""zz\u{d}\u{1b}[2K\u{1b}[1A\u{1b}[2K\u{d}  amount"#),
            "{detail}"
        );
        assert!(detail.contains("(unusual key)"), "{detail}");
        assert!(
            detail.contains(r"ok\u{7}\u{202e}9 tnuoma\u{200d}"),
            "{detail}"
        );
        insta::assert_snapshot!("deceiving_detail", detail);
        a.event(key(KeyCode::Char('v')));
        let raw = render(&a, 100, 24);
        assert_eq!(obeyed(&raw), None, "{raw}");
    }

    #[test]
    fn pending_view() {
        let mut a = app();
        let mut rev = proposal("p-3", "pending", 990_000, 150);
        rev["revises"] = json!({"proposal_id": "p-1", "changes": [{"pointer": "/amount", "before": 120, "after": 150}]});
        a.event(Input::Net(Net::Proposal(rev)));
        insta::assert_snapshot!(render(&a, 80, 24));
    }

    #[test]
    fn detail_view_with_revision() {
        let mut a = app();
        let mut rev = proposal("p-3", "pending", 990_000, 150);
        rev["revises"] = json!({"proposal_id": "p-1", "changes": [{"pointer": "/amount", "before": 120, "after": 150}]});
        a.event(Input::Net(Net::Proposal(rev)));
        a.event(key(KeyCode::Down));
        a.event(key(KeyCode::Down));
        a.event(key(KeyCode::Enter));
        insta::assert_snapshot!(render(&a, 80, 24));
        a.event(key(KeyCode::Char('v')));
        insta::assert_snapshot!("detail_raw", render(&a, 80, 24));
    }

    #[test]
    fn a_consumed_approval_shows_no_countdown() {
        let mut a = app();
        a.event(key(KeyCode::Enter));
        let mut approved = proposal("p-1", "approved", 900_000, 120);
        approved["expires_ms"] = json!(1_000_000 + 14 * 60_000);
        a.event(Input::Net(Net::Proposal(approved.clone())));
        let screen = render(&a, 100, 30);
        assert!(screen.contains("approval expires in 14m"), "{screen}");
        // The call ran: the same approval can never be used again.
        approved["state"] = json!("consumed");
        a.event(Input::Net(Net::Proposal(approved)));
        let screen = render(&a, 100, 30);
        assert!(screen.contains("approval used up"), "{screen}");
        assert!(!screen.contains("expires in"), "{screen}");
    }

    #[test]
    fn detail_view_with_definition_change() {
        let mut a = app();
        let mut changed = proposal("p-4", "pending", 990_000, 120);
        changed["tool_definition"] = json!("sha256:2b2b");
        changed["definition_change"] = json!({"pinned": "sha256:1a1a", "changes": [
            {"pointer": "/description", "before": "Charge a card.", "after": "Charge a card twice."}]});
        a.event(Input::Net(Net::Proposal(changed)));
        a.event(key(KeyCode::Down));
        a.event(key(KeyCode::Down));
        a.event(key(KeyCode::Enter));
        let screen = render(&a, 100, 30);
        assert!(screen.contains("sha256:2b2b"), "{screen}");
        assert!(
            screen.contains("not the pinned one (sha256:1a1a)"),
            "{screen}"
        );
        assert!(screen.contains("/description"), "{screen}");
        insta::assert_snapshot!(screen);
    }

    /// A value that mixes scripts is marked beside it, as the CLI and the
    /// console mark it; a plain one is not.
    #[test]
    fn a_value_that_mixes_scripts_is_marked() {
        let mut lines = Vec::new();
        argument_lines(
            &serde_json::json!({"to": "p\u{430}ypal.com", "from": "acct_1"}),
            0,
            &mut lines,
        );
        let text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
        assert!(
            text[0].ends_with(r"pаypal.com (mixed scripts: p\u{430}ypal.com)"),
            "{text:?}"
        );
        assert!(!text[1].contains('('), "{text:?}");
    }

    #[test]
    fn flags_say_what_countersign_pending_says() {
        let mut joined = proposal("p-9", "pending", 990_000, 7);
        joined["joined"] = serde_json::json!(1);
        let mut a = App::new("alice", "http://127.0.0.1:7373", 1_000_000);
        a.event(Input::Net(Net::Snapshot(vec![joined.clone()])));
        a.event(Input::Net(Net::Linked));
        let screen = render(&a, 120, 12);
        // The same words as the CLI's FLAGS column (one function for both).
        let cli = countersign::core::approval::flags(&joined).join(", ");
        assert_eq!(cli, "1 retry joined");
        assert!(screen.contains(&cli), "{screen}");
    }

    #[test]
    fn approve_and_deny_prompts() {
        let mut a = app();
        a.event(key(KeyCode::Char('a')));
        insta::assert_snapshot!("confirm_approve", render(&a, 80, 24));
        // On the TTL field, still empty: the default is named there too.
        a.event(key(KeyCode::Tab));
        let screen = render(&a, 80, 24);
        assert!(screen.contains("Usable for: ▏ (empty: 15m"), "{screen}");
        insta::assert_snapshot!("confirm_approve_ttl_focused", screen);
        a.event(key(KeyCode::Esc));
        a.event(key(KeyCode::Char('d')));
        for c in "wrong account".chars() {
            a.event(key(KeyCode::Char(c)));
        }
        insta::assert_snapshot!("deny_reason", render(&a, 80, 24));
    }

    #[test]
    fn the_history_names_a_yes_given_in_the_client() {
        let mut a = app();
        let mut p = crate::app::tests::proposal("p-9", "consumed", 500_000, 30);
        p["requester"] = json!("dev-1");
        p["confirmation"] = json!({"channel": "client", "principal": "dev-1", "decision": "approve",
            "reason": "", "at": "2026-11-30T10:00:00Z", "via": "input_required", "nonce": "n"});
        a.event(Input::Net(Net::Snapshot(vec![p])));
        a.event(key(KeyCode::Char('3')));
        let screen = render(&a, 100, 24);
        let row = screen
            .lines()
            .find(|l| l.contains("p-9"))
            .unwrap_or_default();
        assert!(row.contains("dev-1 (client)"), "{screen}");
    }

    #[test]
    fn outcomes_history_audit_and_a_lost_gateway() {
        let mut a = app();
        a.event(key(KeyCode::Char('2')));
        a.event(Input::Net(Net::Outcomes(vec![json!({
            "tenant": "acme", "principal": "agent-7", "key": "k-lost",
            "server": "payments", "tool": "charge_card", "created_at": "2026-11-30T10:00:00Z"
        })])));
        insta::assert_snapshot!("outcomes", render(&a, 80, 24));
        a.event(key(KeyCode::Char('3')));
        insta::assert_snapshot!("history", render(&a, 80, 24));
        a.event(key(KeyCode::Char('4')));
        a.event(Input::Net(Net::Audit(vec![
            json!({"seq": 41, "time": "2026-11-30T10:00:01.5Z", "kind": "call_received", "principal": "agent-7", "server": "payments", "tool": "charge_card"}),
            json!({"seq": 42, "time": "2026-11-30T10:00:02Z", "kind": "checkpoint"}),
        ])));
        a.event(Input::Net(Net::Lost("connection refused".into())));
        a.event(Input::Net(Net::Failed(
            "the gateway refused (409 Conflict): proposal `p-1` is approved, not pending".into(),
        )));
        insta::assert_snapshot!("audit_lost_link", render(&a, 80, 24));
    }

    #[test]
    fn small_and_resized_terminals_do_not_panic() {
        let mut a = app();
        for (w, h) in [(20, 5), (80, 24), (200, 60), (1, 1)] {
            render(&a, w, h);
        }
        a.event(key(KeyCode::Enter));
        render(&a, 30, 8);
    }
}
