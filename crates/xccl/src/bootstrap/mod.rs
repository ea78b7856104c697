//! Bootstrap: how ranks find and trust each other before any collective runs.
//!
//! A [`StoreServer`] (run by the launcher, or by rank 0) holds each rank's listening
//! address; every connection, to the store or between ranks, starts with the handshake of
//! [`auth`]; [`Rendezvous`] reads a rank's place in the job from the environment. Under
//! torchrun, ranks meet in the store of torchrun's agent instead, through PyTorch's own
//! protocol ([`c10d`]); any store with [`KeyValue`]'s three calls will do.

pub mod auth;
pub(crate) mod board;
pub mod c10d;
pub(crate) mod conn;
pub mod env;
pub mod group;
pub(crate) mod host;
pub(crate) mod keys;
pub(crate) mod mesh;
pub mod store;

pub use auth::Auth;
pub use c10d::C10dClient;
pub use env::Rendezvous;
pub use store::{KeyValue, StoreClient, StoreServer};

/// Removes the shared-memory files a job left in `/dev/shm`, for launchers to call once
/// every rank of the job has ended (a rank killed while building a communicator can leave
/// one behind).
pub use crate::transport::shm::remove_job_segments;
/// The file name prefix (in `/dev/shm`) of every shared-memory segment of a job.
pub use crate::transport::shm::segment_prefix;
