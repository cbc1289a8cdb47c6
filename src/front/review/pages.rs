//! The console's pages, server-rendered with maud (which escapes every
//! value it writes). What an agent chose is passed through
//! `core::legible` first, so a control or invisible character shows as
//! `\u{..}` here as in the terminal. The automation contract of DESIGN.md
//! section 21 is kept here: `data-action` on every control, `data-role` on
//! status messages, the reviewer entry, proposals and the quorum line.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::{html, Markup, DOCTYPE};

use super::console::Console;
use super::invite::Invite;
use super::reply::hardened;
use super::session;
use crate::core::approval::{summary, Change, Proposal, ProposalState, SignedDecision, Verdict};
use crate::core::legible;
use crate::core::reviewers::Reviewer;
use crate::core::time::rfc3339;
use crate::front::gateway::Gateway;

/// A page, hardened.
pub(crate) fn html(page: Markup) -> Response {
    html_status(StatusCode::OK, page)
}

/// A page with `status`, hardened.
pub(crate) fn html_status(status: StatusCode, page: Markup) -> Response {
    hardened(
        (
            status,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            page.into_string(),
        )
            .into_response(),
    )
}

/// The frame of every page: the style sheet, the one script, the CSRF
/// token for it, who is signed in, and the status line.
fn layout(
    title: &str,
    who: Option<(&Reviewer, &str)>,
    status: Option<&str>,
    body: Markup,
) -> Markup {
    layout_refreshing(title, who, status, None, body)
}

/// [`layout`], reloaded by the browser every `refresh` seconds (the pending
/// list: a decision made elsewhere, or a new proposal, shows without a
/// click, and the list is never older than that).
fn layout_refreshing(
    title: &str,
    who: Option<(&Reviewer, &str)>,
    status: Option<&str>,
    refresh: Option<u32>,
    body: Markup,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                @if let Some(secs) = refresh {
                    meta http-equiv="refresh" content=(secs);
                }
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if let Some((_, csrf)) = who {
                    meta name="csrf-token" content=(csrf);
                }
                title { (title) " · countersign review" }
                link rel="stylesheet" href="/review/assets/console.css";
                link rel="icon" type="image/svg+xml" href="/review/assets/icon.svg";
                script src="/review/assets/console.js" defer {}
            }
            body {
                header {
                    a href="/review/" class="brand" { "countersign review" }
                    @if let Some((r, csrf)) = who {
                        nav {
                            a href="/review/" data-action="pending" { "Pending" }
                            " "
                            a href="/review/history" data-action="history" { "History" }
                            " "
                            span class="who" { (r.name) }
                            form method="post" action="/review/sign-out" class="inline" {
                                input type="hidden" name="csrf" value=(csrf);
                                button type="submit" data-action="sign-out" { "Sign out" }
                            }
                        }
                    }
                }
                main {
                    p data-role="status" role="status" aria-live="polite" { @if let Some(s) = status { (s) } }
                    (body)
                }
            }
        }
    }
}

/// The signed-in reviewer of a page request, or the sign-in page.
async fn signed_in(
    c: &Console,
    headers: &HeaderMap,
) -> Result<(Reviewer, session::Session), Response> {
    match c.signed_in(headers).await {
        Ok((r, s)) => Ok((r, s)),
        Err(session::NotSignedIn::NoSession) => Err(hardened(
            (
                StatusCode::SEE_OTHER,
                [(header::LOCATION, "/review/sign-in")],
            )
                .into_response(),
        )),
        Err(why @ session::NotSignedIn::Revoked(_)) => Err(html_status(
            StatusCode::UNAUTHORIZED,
            sign_in_with(c, Some(&why.words())),
        )),
        Err(why @ session::NotSignedIn::Unavailable(_)) => Err(html_status(
            StatusCode::SERVICE_UNAVAILABLE,
            sign_in_with(c, Some(&why.words())),
        )),
    }
}

/// How often the pending list reloads itself.
const LIST_REFRESH_SECS: u32 = 30;

/// `GET /review`.
pub(crate) async fn to_list() -> Response {
    hardened((StatusCode::SEE_OTHER, [(header::LOCATION, "/review/")]).into_response())
}

/// The one-line account of where a proposal's approvals stand.
fn quorum_line(p: &Proposal) -> String {
    if let Some(progress) = p.progress() {
        return legible::visible(&progress).into_owned();
    }
    match p.state {
        ProposalState::Pending => "needs one approval".into(),
        other => other.as_str().to_owned(),
    }
}

fn requester(p: &Proposal) -> String {
    match &p.client {
        Some(c) => format!("{} via {}", legible::text(&p.requester), legible::text(c)),
        None => legible::text(&p.requester).into_owned(),
    }
}

fn age(now_ms: i64, then_ms: i64) -> String {
    let secs = ((now_ms - then_ms) / 1000).max(0) as u64;
    humantime::format_duration(std::time::Duration::from_secs(secs)).to_string()
}

fn item(p: &Proposal, now_ms: i64, tasks: usize) -> Markup {
    html! {
        li data-role="proposal" data-id=(p.id) class=(format!("risk-{}", p.risk.as_str())) {
            a href=(format!("/review/p/{}", p.id)) data-action="open" {
                span class="tool" { (legible::text(&p.server)) "/" (legible::text(&p.tool)) }
                " "
                span class="risk" { (p.risk.as_str()) }
            }
            p class="sentence" { (legible::visible(&summary(p))) }
            p class="meta" {
                (p.id) " · " (requester(p)) " · " (legible::text(&p.tenant)) " · " (age(now_ms, p.created_ms)) " ago"
                @if p.looks_like.is_some() { " · " strong { "lookalike name" } }
                @if p.definition_change.is_some() { " · tool definition changed" }
                @if p.revises.is_some() { " · a revision (the same call resent with changes)" }
                @if p.beside.is_some() { " · another call by the same requester" }
                @if tasks == 1 { " · " span data-role="task" { "an agent waits for this as a task: it runs when approved" } }
                @if tasks > 1 { " · " span data-role="task" { (tasks) " agents wait for this as tasks: it runs when approved" } }
                " · " span data-role="quorum" { (quorum_line(p)) }
            }
        }
    }
}

async fn proposals(gw: &Gateway, reviewer: &Reviewer) -> Result<Vec<Proposal>, String> {
    let mut all = gw
        .pipeline()
        .book()
        .list()
        .await
        .map_err(|e| e.to_string())?;
    all.retain(|p| reviewer.covers(&p.tenant));
    all.sort_by_key(|p| std::cmp::Reverse(p.created_ms));
    Ok(all)
}

/// `GET /review/`: pending proposals of the reviewer's tenants, the one that
/// expires first first (the queue's order in the TUI and `pending` too).
pub(crate) async fn list(State(c): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let gw = &c.gw;
    let (r, s) = match signed_in(&c, &headers).await {
        Ok(x) => x,
        Err(resp) => return resp,
    };
    let now = gw.pipeline().clock().now_ms();
    let waiting = crate::front::tasks::waiting_by_proposal(gw).await;
    let pending_ttl =
        i64::try_from(gw.config().approvals.pending_ttl.as_millis()).unwrap_or(i64::MAX);
    let (items, status) = match proposals(gw, &r).await {
        Ok(all) => {
            let mut items: Vec<Proposal> = all
                .into_iter()
                .filter(|p| p.state == ProposalState::Pending)
                .collect();
            // The queue's order everywhere: the one that expires first.
            items.sort_by_key(|p| {
                crate::core::approval::queue_order(
                    p.created_ms.saturating_add(pending_ttl),
                    p.created_ms,
                    &p.id,
                )
            });
            (items, None)
        }
        Err(e) => (
            Vec::new(),
            Some(format!("the proposals could not be read: {e}")),
        ),
    };
    html(layout_refreshing(
        "Pending",
        Some((&r, &s.csrf)),
        status.as_deref(),
        Some(LIST_REFRESH_SECS),
        html! {
            h1 { "Waiting for you" }
            p class="hint" data-role="refresh" { "This list reloads itself every " (LIST_REFRESH_SECS) " seconds." }
            @if items.is_empty() {
                p class="empty" { "No proposals waiting. New ones appear here as agents ask." }
            } @else {
                ul class="proposals" { @for p in &items { (item(p, now, waiting.get(&p.id).copied().unwrap_or(0))) } }
            }
        },
    ))
}

/// `GET /review/history`: decided proposals, newest first.
pub(crate) async fn history(State(c): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let gw = &c.gw;
    let (r, s) = match signed_in(&c, &headers).await {
        Ok(x) => x,
        Err(resp) => return resp,
    };
    let now = gw.pipeline().clock().now_ms();
    let items: Vec<Proposal> = proposals(gw, &r)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.state != ProposalState::Pending)
        .collect();
    html(layout(
        "History",
        Some((&r, &s.csrf)),
        None,
        html! {
            h1 { "Decided" }
            @if items.is_empty() { p class="empty" { "Nothing decided yet." } }
            @else {
                table class="history" {
                    thead { tr { th { "Proposal" } th { "State" } th { "Requester" } th { "Tool" } th { "By" } th { "Reason" } th { "When" } } }
                    tbody {
                        @for p in &items {
                            tr data-role="proposal" data-id=(p.id) {
                                td { a href=(format!("/review/p/{}", p.id)) data-action="open" { (p.id) } }
                                td data-role="state" { (p.state.as_str()) }
                                td { (requester(p)) }
                                td { (legible::text(&p.server)) "/" (legible::text(&p.tool)) }
                                td data-role="by" { (deciders(p)) }
                                td data-role="reason" { (legible::visible(&settling_reason(p))) }
                                td { (moment(&rfc3339(p.updated_ms))) " (" (age(now, p.updated_ms)) " ago)" }
                            }
                        }
                    }
                }
            }
        },
    ))
}

/// A moment as the console shows it: UTC in the page, the reviewer's own
/// zone put beside it by the script (`data-role="time"`).
fn moment(iso: &str) -> Markup {
    html! { time datetime=(iso) data-role="time" { (legible::text(iso)) } }
}

/// Every decision given on a proposal, in the order signed: the
/// approvals, the denials and the statement that settled it, each once.
fn decisions(p: &Proposal) -> Vec<(&SignedDecision, &[String])> {
    let mut all: Vec<(&SignedDecision, &[String])> = p
        .approvals
        .iter()
        .chain(&p.denials)
        .map(|g| (&g.signed, g.groups.as_slice()))
        .collect();
    if let Some(d) = &p.decision {
        let same = |x: &SignedDecision| {
            x.statement.reviewer == d.statement.reviewer
                && x.statement.decision == d.statement.decision
                && x.statement.issued_at == d.statement.issued_at
        };
        if !all.iter().any(|(x, _)| same(x)) {
            all.push((d, &[]));
        }
    }
    all.sort_by(|a, b| a.0.statement.issued_at.cmp(&b.0.statement.issued_at));
    all
}

/// The decisions, as the page and the history list them.
fn decision_list(p: &Proposal) -> Markup {
    html! {
        ol class="decisions" data-role="decisions" {
            @for (d, groups) in decisions(p) {
                @let verdict = match d.statement.decision { Verdict::Approve => "approved", Verdict::Deny => "denied" };
                li data-role="decision" data-verdict=(verdict) data-reviewer=(d.statement.reviewer) {
                    strong { (legible::text(&d.statement.reviewer)) }
                    @if !groups.is_empty() { " (" (legible::text(&groups.join(", "))) ")" }
                    " " (verdict) " at " (moment(&d.statement.issued_at))
                    " with " (if d.key_kind() == "passkey" { "a passkey" } else { "an ed25519 key" })
                    @if !d.statement.reason.is_empty() {
                        ": " q data-role="reason" { (legible::visible(&d.statement.reason)) }
                    }
                }
            }
            @if let Some(c) = &p.confirmation {
                li data-role="decision" data-verdict="confirmed" {
                    "answered in the client by " strong { (legible::text(&c.principal)) }
                }
            }
        }
    }
}

/// Who decided, as the history lists them: `alice (approved), bob
/// (denied)`, or the person at the client.
fn deciders(p: &Proposal) -> String {
    if let Some(c) = &p.confirmation {
        return format!("{} (client)", legible::text(&c.principal));
    }
    let all: Vec<String> = decisions(p)
        .into_iter()
        .map(|(d, _)| {
            let verdict = match d.statement.decision {
                Verdict::Approve => "approved",
                Verdict::Deny => "denied",
            };
            format!("{} ({verdict})", legible::text(&d.statement.reviewer))
        })
        .collect();
    if all.is_empty() {
        "-".into()
    } else {
        all.join(", ")
    }
}

/// Why it ended: the settling reviewer's reason, or why it was voided or
/// expired.
fn settling_reason(p: &Proposal) -> String {
    p.decision
        .as_ref()
        .map(|d| d.statement.reason.clone())
        .filter(|r| !r.is_empty())
        .or_else(|| p.reason.clone())
        .unwrap_or_default()
}

/// What became of a decided proposal: whether its call ran, in a
/// reviewer's words (the ledger's record of the call that used it).
async fn outcome(gw: &Gateway, p: &Proposal, now_ms: i64) -> Option<String> {
    use crate::core::ledger::State;
    Some(match p.state {
        ProposalState::Pending => return None,
        ProposalState::Denied => "Denied: the call did not run.".to_owned(),
        ProposalState::Expired => "Expired unused: the call did not run.".to_owned(),
        ProposalState::Invalidated => format!(
            "Void ({}): the call did not run under it.",
            legible::visible(p.reason.as_deref().unwrap_or("replaced or no longer valid"))
        ),
        ProposalState::Approved => match p.expires_ms {
            Some(e) if e <= now_ms => "Expired unused: the call did not run.".to_owned(),
            Some(e) => format!(
                "Approved, not used yet: the call runs when the agent sends it again (or at once, if it waits as a task), until {}.",
                rfc3339(e)
            ),
            None => "Approved, not used yet.".to_owned(),
        },
        ProposalState::Consumed => {
            let key = p.consumed_by.as_deref().unwrap_or_default();
            match gw.pipeline().store().get(key).await {
                Ok(Some(r)) => match r.state {
                    State::Complete => format!(
                        "Ran once; its answer came at {}.",
                        r.answered_at.as_deref().unwrap_or("an unrecorded time")
                    ),
                    State::Unknown => {
                        "Sent once; its outcome is unknown (the answer was lost): check the server before anyone retries.".to_owned()
                    }
                    State::Dispatched => "Running now.".to_owned(),
                    State::Reserved => "About to run.".to_owned(),
                    State::NotDispatched => {
                        "Used, but the call was not sent (the server could not be reached).".to_owned()
                    }
                },
                Ok(None) => "Used by a call whose ledger record is gone (past its retention).".to_owned(),
                Err(e) => format!("Used by a call whose record cannot be read now ({e})."),
            }
        }
    })
}

/// Two separate calls side by side: no "before" and "now", no arrow.
fn compare(other: &str, list: &[Change]) -> Markup {
    let shown = |v: &Option<serde_json::Value>| match v {
        Some(v) => legible::value(v),
        None => "(absent)".into(),
    };
    html! {
        table class="changes" {
            thead { tr { th { "where" } th { (other) } th { "this call" } } }
            tbody {
                @for c in list {
                    tr { td { code { (legible::text(&c.pointer)) } } td { code { (shown(&c.before)) } } td { code { (shown(&c.after)) } } }
                }
            }
        }
    }
}

fn changes(list: &[Change]) -> Markup {
    let shown = |v: &Option<serde_json::Value>| match v {
        Some(v) => legible::value(v),
        None => "(absent)".into(),
    };
    html! {
        table class="changes" {
            thead { tr { th { "where" } th { "before" } th { "now" } } }
            tbody {
                @for c in list {
                    tr { td { code { (legible::text(&c.pointer)) } } td { code { (shown(&c.before)) } } td { code { (shown(&c.after)) } } }
                }
            }
        }
    }
}

/// `GET /review/p/{id}`: one proposal, in full, with the decision controls.
pub(crate) async fn proposal(
    State(c): State<Arc<Console>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let gw = &c.gw;
    let (r, s) = match signed_in(&c, &headers).await {
        Ok(x) => x,
        Err(resp) => return resp,
    };
    let p = match gw.pipeline().book().get(&id).await {
        Ok(Some(p)) if r.covers(&p.tenant) => p,
        Ok(_) => {
            return html_status(
                StatusCode::NOT_FOUND,
                layout(
                    "Not found",
                    Some((&r, &s.csrf)),
                    Some(&format!("no proposal `{}`", legible::text(&id))),
                    html! {},
                ),
            )
        }
        Err(e) => {
            return html_status(
                StatusCode::SERVICE_UNAVAILABLE,
                layout(
                    "Unavailable",
                    Some((&r, &s.csrf)),
                    Some(&e.to_string()),
                    html! {},
                ),
            )
        }
    };
    let now = gw.pipeline().clock().now_ms();
    let pending_until = p.created_ms.saturating_add(
        i64::try_from(gw.config().approvals.pending_ttl.as_millis()).unwrap_or(i64::MAX),
    );
    let mine = p.approvals.iter().any(|g| g.reviewer() == r.name);
    let happened = outcome(gw, &p, now).await;
    // Why a person is asked: each asking policy's `@reason`, or its id.
    let policies = gw.pipeline().policies();
    let why: Vec<String> = p
        .policies
        .iter()
        .map(|id| policies.reason_of(id).unwrap_or_else(|| id.clone()))
        .collect();
    let default_ttl = humantime::format_duration(c.default_ttl()).to_string();
    html(layout(
        &p.id,
        Some((&r, &s.csrf)),
        None,
        html! {
            article class="proposal" data-role="proposal" data-id=(p.id) {
                // What will happen, to what, for how much: first.
                h1 class="headline" data-role="headline" { (legible::visible(&summary(&p))) }
                p class="asks" {
                    strong { (requester(&p)) } " of " (legible::text(&p.tenant)) " asks to run "
                    code { (legible::text(&p.server)) "/" (legible::text(&p.tool)) } " "
                    span class=(format!("risk risk-{}", p.risk.as_str())) { (p.risk.as_str()) }
                }
                @if !why.is_empty() {
                    p class="why" data-role="why" { "You are asked because: " (legible::visible(&why.join("; "))) }
                }
                @for g in &p.guards {
                    p class="warning" data-role="guard" { (legible::visible(g)) }
                }
                @if let Some(l) = &p.looks_like {
                    p class="warning" { "This tool's name only looks like " code { (legible::text(l)) } ", another tool of this server. It is not that tool." }
                }
                @if let Some(h) = &happened {
                    p class=(format!("outcome state-{}", p.state.as_str())) data-role="outcome" { (h) }
                }
                @if !decisions(&p).is_empty() || p.confirmation.is_some() {
                    h2 { "Decisions" }
                    (decision_list(&p))
                }
                dl {
                    dt { "State" } dd data-role="state" { (p.state.as_str()) }
                    dt { "Approvals" } dd data-role="quorum" { (quorum_line(&p)) }
                    @match (p.state, p.expires_ms) {
                        (ProposalState::Approved, Some(e)) => { dt { "Approval usable until" } dd { (moment(&rfc3339(e))) } }
                        (ProposalState::Pending, _) => { dt { "Undecided until" } dd { (moment(&rfc3339(pending_until))) " (" (age(pending_until.max(now), now)) " left)" } }
                        _ => {}
                    }
                }
                h2 { "Arguments, as the server will receive them" }
                table class="arguments" {
                    tbody {
                        @if let Some(args) = p.arguments.as_object() {
                            @for (k, v) in args {
                                tr { th scope="row" { (legible::key(k)) } td { code { (legible::value(v)) } } }
                            }
                        }
                    }
                }
                @if let Some(rev) = &p.revises {
                    h2 { "Changed since proposal " (rev.proposal_id) }
                    p { "The same call (its idempotency key), sent again with other arguments: it replaces that proposal." }
                    (changes(&rev.changes))
                }
                @if let Some(b) = &p.beside {
                    details data-role="beside" {
                        summary { "Another call by the same requester: " (b.proposal_id) }
                        p { "A separate call with its own key, not a change of this one. Where the two differ:" }
                        (compare(&b.proposal_id, &b.changes))
                    }
                }
                @if let Some(d) = &p.definition_change {
                    h2 { "The tool's definition is not the pinned one" }
                    p { "Pinned: " code class="digest" { (d.pinned) } }
                    (changes(&d.changes))
                }
                @if p.state == ProposalState::Pending {
                    form class="decide" data-proposal=(p.id) {
                        label for="reason" { "Reason (recorded; a denial needs one)" }
                        textarea id="reason" name="reason" rows="2" {}
                        label for="ttl" { "Usable for (default " (default_ttl) ")" }
                        input id="ttl" name="ttl" type="text" inputmode="text" placeholder=(format!("{default_ttl} (default)"));
                        div class="buttons" {
                            button type="button" data-action="approve" class="approve" { "Approve with passkey" }
                            button type="button" data-action="deny" class="deny" { "Deny with passkey" }
                            @if mine {
                                button type="button" data-action="withdraw" { "Withdraw my approval" }
                            }
                        }
                    }
                }
                // What binds the approval, folded away: present, not in the way.
                details class="details" data-role="details" {
                    summary { "Details" }
                    dl {
                        dt { "Proposal" } dd { (p.id) }
                        dt { "Call digest" } dd { code class="digest" { (p.call_digest) } }
                        dt { "Tool definition" } dd { code class="digest" { (p.tool_definition.as_deref().unwrap_or("(not listed by the server)")) } }
                        @if let Some(v) = &p.resource_version { dt { "Resource version" } dd { (legible::text(v)) } }
                        @if !p.policies.is_empty() { dt { "Policies" } dd { (legible::text(&p.policies.join(", "))) } }
                        dt { "Asked at" } dd { (moment(&rfc3339(p.created_ms))) }
                    }
                }
            }
        },
    ))
}

/// The sign-in page.
pub(crate) fn sign_in(c: &Console) -> Markup {
    sign_in_with(c, None)
}

fn sign_in_with(_c: &Console, status: Option<&str>) -> Markup {
    layout(
        "Sign in",
        None,
        status,
        html! {
            h1 { "Sign in" }
            p { "Reviewers sign in with their passkey: the phone, laptop or security key that holds it will ask for a fingerprint, face or PIN." }
            button type="button" data-action="sign-in" class="primary" { "Sign in with a passkey" }
        },
    )
}

/// An enrolment page for `invite`; with `entry` once enrolled.
pub(crate) fn enrol(_c: &Console, invite: &Invite, entry: Option<&str>) -> Markup {
    layout(
        "Enrol",
        None,
        None,
        html! {
            h1 { "Make your reviewer passkey" }
            p { "You were invited as reviewer " strong { (invite.name) } " (groups " (invite.groups.join(", ")) "; tenants " (invite.tenants.join(", ")) ")." }
            p { "Your device makes a passkey for this console; its private key never leaves the device. It counts once an operator adds the entry below to " code { "reviewers.toml" } "." }
            button type="button" data-action="enrol" class="primary" { "Make a passkey" }
            pre data-role="reviewer-entry" { @if let Some(e) = entry { (e) } }
            p class="hint" { "Send this entry to the operator, or run " code { "countersign reviewer enrolled" } " on the gateway. A reviewer who has an entry already gets the " code { "passkeys" } " line added to it." }
        },
    )
}

/// An enrolment link that cannot be used.
pub(crate) fn enrol_refused(_c: &Console, why: &str) -> Markup {
    layout(
        "Enrol",
        None,
        Some(why),
        html! {
            h1 { "This enrolment link cannot be used" }
        },
    )
}
