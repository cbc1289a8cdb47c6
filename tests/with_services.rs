//! The integration tests that need a service of the machine: PostgreSQL
//! (the shared ledger, several gateways, restarts), valgrind (instructions
//! per call) or strace (every file made durably). `.ci/run` starts or
//! installs them.

mod common;

mod chaos;
mod guards;
mod instructions;
mod notify;
mod pg_restart;
mod power;
mod quorum;
mod store;
