//! The `countersign` command. Everything lives in the library's `cli`
//! module; this file only hands over.

fn main() -> std::process::ExitCode {
    countersign::cli::main()
}
