//! The integration tests against peers nobody here wrote: the Python and
//! TypeScript SDKs as clients and servers, server-everything, the
//! conformance suite, an OpenID provider, Chromium for the review console.
//! `.ci/setup-peers` installs them under `.ci/cache/`.

mod common;

mod attack;
mod canonical;
mod client_approval;
mod conformance;
mod console;
mod delegation;
mod interop;
mod numbers;
mod oidc;
mod peers;
mod tasks;
mod traces;
mod walkthroughs;
