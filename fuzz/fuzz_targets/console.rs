//! The review console's routes and the enrolment routes, as anyone on the
//! network may call them before signing in: a method and route, headers
//! (origin, cookie, content type) and a body, all from the input, sent to
//! the gateway's real router in process. Never a panic, never a 5xx, and
//! nothing signs in or enrols: each needs a challenge the fuzzer never saw.
#![no_main]

use std::sync::OnceLock;

use axum::body::Body;
use countersign::cli::fuzzing::Routes;
use libfuzzer_sys::fuzz_target;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

fn routes() -> &'static Routes {
    // Kept for the process's life: the gateway's data dir (a static, so
    // that the leak checker sees it reachable).
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    static ROUTES: OnceLock<Routes> = OnceLock::new();
    ROUTES.get_or_init(|| {
        let dir = DIR.get_or_init(|| tempfile::tempdir().expect("a temp dir"));
        runtime()
            .block_on(Routes::new(dir.path()))
            .expect("the gateway's routes")
    })
}

fuzz_target!(|data: &[u8]| {
    let [route, variant, rest @ ..] = data else {
        return;
    };
    let routes = routes();
    // A made-up token or id: the input's first bytes, as a path segment.
    let made_up: String = rest
        .iter()
        .take(48)
        .map(|b| char::from(b'a' + b % 26))
        .collect();
    let (method, path, what) = match route % 11 {
        0 => ("POST", "/review/sign-in".to_owned(), "sign-in"),
        1 => ("POST", "/review/sign-in/options".to_owned(), ""),
        2 => ("POST", routes.enrol_path.clone(), "enrol"),
        3 => ("POST", format!("{}/options", routes.enrol_path), ""),
        4 => ("POST", format!("/review/enrol/{made_up}"), "enrol"),
        5 => ("GET", format!("/review/enrol/{made_up}"), ""),
        6 => ("POST", "/review/p/p-0000000000000001/statement".to_owned(), ""),
        7 => ("POST", "/review/p/p-0000000000000001/decide".to_owned(), ""),
        8 => ("POST", "/review/p/p-0000000000000001/withdraw".to_owned(), ""),
        9 => ("POST", "/review/sign-out".to_owned(), ""),
        _ => ("GET", format!("/review/p/{made_up}"), ""),
    };
    let mut request = http::Request::builder().method(method).uri(&path);
    if variant & 1 == 0 {
        request = request.header("origin", "http://localhost:9");
    } else if variant & 2 == 0 {
        request = request.header("origin", "http://evil.example");
    }
    if variant & 4 != 0 {
        request = request.header("cookie", format!("countersign_review={made_up}"));
    }
    request = request.header(
        "content-type",
        if variant & 8 == 0 {
            "application/json"
        } else {
            "application/x-www-form-urlencoded"
        },
    );
    let Ok(request) = request.body(Body::from(rest.to_vec())) else {
        return;
    };
    let (status, body) = runtime().block_on(routes.send(request));
    assert!(
        status < 500,
        "{method} {path}: {status} {}",
        String::from_utf8_lossy(&body)
    );
    if !what.is_empty() {
        assert!(
            !(200..300).contains(&status),
            "{what} succeeded without a challenge: {status} {}",
            String::from_utf8_lossy(&body)
        );
    }
});
