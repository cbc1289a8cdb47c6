//! `countersign-review`: the reviewer terminal UI (DESIGN.md section 9).
//!
//! The workspace member exists so that the layout is fixed from the start; the
//! views, key handling and `/v1` client arrive with issue 7/7. Until then the
//! binary refuses to run rather than pretending to review anything.

fn main() -> std::process::ExitCode {
    eprintln!(
        "countersign-review: the reviewer UI is not built yet (issue 7/7); \
         use `countersign pending` / `countersign approve` once they land"
    );
    std::process::ExitCode::from(2)
}
