//! The integration tests that need only Rust: the gateway, the example
//! server and the CLI, real processes on `127.0.0.1:0`. A machine with
//! nothing else installed runs them: `cargo test --test core`. One binary
//! for the whole theme: a change relinks it once.

mod common;

mod approval;
mod audit;
mod bad_input;
mod bridge;
mod catalog;
mod cli;
mod demo;
mod drain;
mod first_hour;
mod ledger;
mod metrics;
mod modern;
mod oauth;
mod pipeline;
mod policy;
mod recovery;
mod regression;
mod relay;
mod shadow;
mod soak;
mod tls;
mod transparency;
