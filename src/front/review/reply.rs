//! How the console answers: every answer hardened (a strict CSP, no
//! caching, no framing), JSON answers and refusals for its script.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// The headers every console answer carries: a strict Content-Security-
/// Policy (the one script is a file of the console's own; no inline
/// script, no frames), no caching (a proposal page is not kept anywhere),
/// and no referrer.
pub(crate) fn hardened(mut r: Response) -> Response {
    let h = r.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    r
}

/// A JSON answer of the console, hardened.
pub(crate) fn json_answer(status: StatusCode, body: serde_json::Value) -> Response {
    hardened(
        (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response(),
    )
}

/// A refusal as JSON: `{error: {code, message}}`, the message for the
/// status line of the page (`data-role="status"`).
pub(crate) fn refusal(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    json_answer(
        status,
        serde_json::json!({ "error": { "code": code, "message": message.into() } }),
    )
}
