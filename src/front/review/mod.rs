//! The reviewer web console (DESIGN.md section 21): `/review/` on the
//! gateway's listener, at the console's origin, where a reviewer signs in
//! with a passkey and decides proposals with it.
//!
//! Every decision is a WebAuthn assertion whose challenge is the approval
//! statement's digest, checked by the approval book exactly as an ed25519
//! statement is (`enforce::book::Proof::Passkey`). The console adds the
//! ways in:
//! - [`enrol`]: one-time enrolment links (`countersign reviewer invite`)
//!   that make a passkey and show the `[[reviewers]]` entry to add;
//! - [`sign_in`]: a passkey sign-in and the session it opens;
//! - [`decide`]: approve, deny and withdraw;
//! - [`session`]: the `__Host-` cookie, the CSRF token, the Origin check;
//! - [`pages`]: the server-rendered pages (maud);
//! - [`console`]: the console's state (the state of its routes);
//! - [`invite`]: invitations and finished enrolments, as files;
//! - [`throttle`]: failed sign-ins per credential and per address;
//! - [`reply`]: the hardened headers every answer carries;
//! - [`assets`]: the one script (WebAuthn only) and the style sheet,
//!   compiled into the binary.
//!
//! The reviewers file stays the trust root: a passkey signs nothing that
//! counts until its entry is in `reviewers.toml`, and a session ends when
//! its reviewer's entry (or that passkey) leaves the file.

pub(crate) mod assets;
pub(crate) mod console;
pub(crate) mod decide;
pub(crate) mod enrol;
pub(crate) mod invite;
pub(crate) mod pages;
pub(crate) mod reply;
pub(crate) mod session;
pub(crate) mod sign_in;
pub(crate) mod throttle;

use std::sync::Arc;

use axum::http::StatusCode;
use axum::routing::{any, get, post};
use axum::Router;

pub(crate) use console::Console;

/// The console's routes, when it is on; while it is off, `/review/...`
/// answers 404 saying so.
pub(crate) fn router(console: Option<Arc<Console>>) -> Router {
    let Some(console) = console else {
        let off = || async {
            (
                StatusCode::NOT_FOUND,
                "the review console is off ([review] enabled = false)\n",
            )
        };
        return Router::new()
            .route("/review", any(off))
            .route("/review/", any(off))
            .route("/review/{*rest}", any(off));
    };
    Router::new()
        .route("/review", get(pages::to_list))
        .route("/review/", get(pages::list))
        .route("/review/history", get(pages::history))
        .route("/review/p/{id}", get(pages::proposal))
        .route("/review/p/{id}/statement", post(decide::statement))
        .route("/review/p/{id}/decide", post(decide::decide))
        .route("/review/p/{id}/withdraw", post(decide::withdraw))
        .route("/review/sign-in", get(sign_in::page).post(sign_in::finish))
        .route("/review/sign-in/options", post(sign_in::options))
        .route("/review/sign-out", post(sign_in::sign_out))
        .route(
            "/review/enrol/{token}",
            get(enrol::page).post(enrol::finish),
        )
        .route("/review/enrol/{token}/options", post(enrol::options))
        .route("/review/assets/{file}", get(assets::serve))
        .route("/favicon.ico", get(assets::favicon))
        .with_state(console)
}
