//! Every integration test, in one binary with one module per theme: a
//! change relinks one test binary, not one per file. Run one theme with
//! `cargo test --test all approval::`, one test with its name.

mod common;

mod approval;
mod attack;
mod audit;
mod bad_input;
mod bridge;
mod canonical;
mod catalog;
mod chaos;
mod cli;
mod client_approval;
mod conformance;
mod console;
mod delegation;
mod demo;
mod drain;
mod first_hour;
mod guards;
mod instructions;
mod interop;
mod ledger;
mod metrics;
mod modern;
mod notify;
mod numbers;
mod oauth;
mod oidc;
mod peers;
mod pg_restart;
mod pipeline;
mod policy;
mod power;
mod quorum;
mod recovery;
mod regression;
mod relay;
mod shadow;
mod soak;
mod store;
mod tasks;
mod tls;
mod traces;
mod transparency;
