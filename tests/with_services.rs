//! The integration tests that need a service of the machine: PostgreSQL
//! (the shared ledger, several gateways, restarts), valgrind (instructions
//! per call) or strace (every file made durably). `.ci/run` starts or
//! installs them. The tests that restart PostgreSQL are binaries of their
//! own (`tests/pg_restart.rs`, `tests/chaos.rs`): run beside the others,
//! they would cut their connections.

mod common;

mod guards;
mod instructions;
mod notify;
mod power;
mod quorum;
mod store;
