//! The image server: a content-addressed SHA-512 object store, tar ingest, the image index
//! (in the store), and the MDB.

pub mod ingest;
pub mod objects;
