//! Roles: the role spec (`spec`: TOML, parsed and validated whole, every error
//! naming file, line and field) and the pure planning engine (`engine`: `plan(spec,
//! census) → Plan`) that keeps the appliance at minimum-viable or optimal capacity, after
//! BlacKnight's documented intent. No I/O, no clock, no async: the appliance's leader loop
//! (`appliance/src/roles.rs`) is the shell.

pub mod engine;
mod model;
pub mod scale;
pub mod spec;

pub use engine::{
    Action, Census, CommandError, Host, Instance, Kind, Metric, Outcome, Plan, RoleCount, Why,
    applied, decide, hook_argv, minimums, plan, plan_with, round_plan,
};
pub use scale::{Decision, Scale, ScaleState, desired};
pub use spec::{
    DnsPort, Hook, NameError, Role, Selector, Spec, SpecError, SpecErrors, check_name, check_word,
};
