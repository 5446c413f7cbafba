//! The Paddock appliance as a library: configuration, boot scripts, node records, the HTTP
//! face and the `serve` wiring. `main.rs` is only the command line.

pub mod access;
pub mod agent_tokens;
pub mod assets;
pub mod at_rest;
pub mod audit;
pub mod boot;
pub mod browser;
pub mod census;
pub mod certs_cli;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod console;
pub mod console_access;
pub mod dhcp;
pub mod dns;
pub mod dns_cli;
pub mod dns_zones;
pub mod dominator;
pub mod http;
pub mod images;
pub mod inspection;
pub mod leader;
pub mod metrics;
pub mod power;
pub mod provisioning;
pub mod pxe_filter;
pub mod roles;
pub mod roles_cli;
pub mod roles_page;
pub mod rollouts;
pub mod rollouts_cli;
pub mod runtime;
pub mod security;
pub mod serve;
