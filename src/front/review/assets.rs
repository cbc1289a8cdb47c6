//! The console's two assets, compiled into the binary: the script (WebAuthn
//! ceremonies only) and the style sheet.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::reply::hardened;

const SCRIPT: &str = include_str!("assets/console.js");
const STYLE: &str = include_str!("assets/console.css");

/// `GET /review/assets/{file}`.
pub(crate) async fn serve(Path(file): Path<String>) -> Response {
    let (body, kind) = match file.as_str() {
        "console.js" => (SCRIPT, "text/javascript; charset=utf-8"),
        "console.css" => (STYLE, "text/css; charset=utf-8"),
        _ => return (StatusCode::NOT_FOUND, "no such asset\n").into_response(),
    };
    let mut r = hardened((StatusCode::OK, [(header::CONTENT_TYPE, kind)], body).into_response());
    // Assets hold nothing private: a browser may keep them a while.
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("max-age=300"),
    );
    r
}
