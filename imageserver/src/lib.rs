//! The image server: a content-addressed SHA-512 object store ([`objects`]), streaming tar
//! ingest ([`ingest`]), the image index kept in the store ([`images`]), the MDB ([`mdb`]),
//! their HTTP routes ([`api`]), and replication of objects between hosts ([`replicate`]).

pub mod api;
pub mod images;
pub mod ingest;
pub mod mdb;
pub mod objects;
pub mod replicate;
