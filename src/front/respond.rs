//! How the HTTP front answers: a JSON-RPC message as JSON, a rejection
//! with the HTTP status it gets (the words come from
//! [`crate::enforce::answer::Rejection`]), and the headers of an SSE stream.

use axum::body::Body as HttpBody;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::Value;

use crate::enforce::answer::Rejection;
use crate::wire::jsonrpc::Message;

pub(super) fn rpc(status: StatusCode, msg: &Message) -> Response {
    // Built as it is sent: a body of bytes answered through `IntoResponse`
    // is typed `application/octet-stream` first, then retyped, each header
    // value checked as text again.
    let mut r = Response::new(HttpBody::from(msg.to_bytes()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// A refusal, with the status HTTP gives it; the words come from
/// [`answer::Rejection`].
pub(super) fn reject(rejection: Rejection, id: Value) -> Response {
    let status = match &rejection {
        Rejection::Origin => StatusCode::FORBIDDEN,
        Rejection::Token | Rejection::BadToken(_) => StatusCode::UNAUTHORIZED,
        Rejection::Forbidden(_) => StatusCode::FORBIDDEN,
        Rejection::UnknownServer { .. } | Rejection::NoSuchSession => StatusCode::NOT_FOUND,
        Rejection::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        Rejection::BodyUnreadable(_) => StatusCode::BAD_REQUEST,
        Rejection::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
        Rejection::StreamTaken => StatusCode::CONFLICT,
        Rejection::LastEventId(_) => StatusCode::BAD_REQUEST,
        Rejection::NoAnswer | Rejection::BatchNotRelayed(_) | Rejection::NoMessage { .. } => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
        Rejection::LineTooLong { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        Rejection::RateLimited { .. } | Rejection::TooManySessions { .. } => {
            StatusCode::TOO_MANY_REQUESTS
        }
        Rejection::Parse(_)
        | Rejection::SessionVersion(_)
        | Rejection::BatchVersion(_)
        | Rejection::NoSession
        | Rejection::AlreadyInitialized
        | Rejection::InitializeInBatch
        | Rejection::BatchTooLarge { .. }
        | Rejection::Header(_)
        | Rejection::Unrelayable(_)
        | Rejection::LegacyUpstream { .. } => StatusCode::BAD_REQUEST,
    };
    let mut r = rpc(status, &rejection.message(id));
    if let Rejection::RateLimited { retry_after, .. } = &rejection {
        let secs = retry_after.as_secs_f64().ceil().max(1.0) as u64;
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"countersign\""),
        );
    }
    r
}

pub(super) fn sse_response(body: HttpBody) -> Response {
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}
