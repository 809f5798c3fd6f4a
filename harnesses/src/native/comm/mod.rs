//! In-process process groups for the native target: one thread per rank, real messages between
//! them, and collectives built from those messages the way NCCL and gloo build them (ring
//! all-reduce, ring reduce-scatter and all-gather, direct all-to-all), so summation order and
//! rounding are realistic and a collective that some ranks never enter is a real hang.
//!
//! Hangs are detected exactly: all mailboxes live in one shared state, and when every rank is either
//! finished or blocked on a message nobody can send any more, the blocked ranks fail at once with
//! [`CommError::Deadlock`]. A wall-clock timeout is the backstop.

mod collectives;
mod world;

pub use world::{Comm, CommError, Group, ReduceOp, StuckInfo, World, WorldOptions};
