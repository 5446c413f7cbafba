//! Introspection: the state machine, node lookup, auto-enrolment, processing hooks, rules,
//! and the Ironic-Inspector-v1-compatible HTTP API.

pub mod api;
pub mod hooks;
pub mod jsonpath;
pub mod lookup;
pub mod node;
pub mod patch;
pub mod processing;
pub mod py;
pub mod rules;
pub mod service;
pub mod state;
