//! The console's assets, compiled into the binary: the script (WebAuthn
//! ceremonies only), the style sheet and the icon (also served as
//! `/favicon.ico`, which browsers ask for whatever a page links).

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::reply::hardened;

const SCRIPT: &str = include_str!("assets/console.js");
const STYLE: &str = include_str!("assets/console.css");
const ICON: &str = include_str!("assets/icon.svg");

/// `GET /review/assets/{file}`.
pub(crate) async fn serve(Path(file): Path<String>) -> Response {
    let (body, kind) = match file.as_str() {
        "console.js" => (SCRIPT, "text/javascript; charset=utf-8"),
        "console.css" => (STYLE, "text/css; charset=utf-8"),
        "icon.svg" => (ICON, "image/svg+xml"),
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

/// `GET /favicon.ico`: the icon (an SVG; browsers read it by its type).
pub(crate) async fn favicon() -> Response {
    serve(Path("icon.svg".to_owned())).await
}
