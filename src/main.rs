//! The `countersign` command. Everything lives in the library's `cli`
//! module; this file only hands over.

/// mimalloc instead of the system allocator: a relayed call makes many small
/// allocations (parsed JSON, headers, audit entries), and glibc's malloc
/// was a large item of the gateway's CPU per call (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    countersign::cli::main()
}
