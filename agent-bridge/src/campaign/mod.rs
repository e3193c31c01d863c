//! The campaign: generated tests across ten domains, run against a bridge.
//!
//! - [`spec`]: the test format (one JSON file per test) and its schema.
//! - [`validate`]: loading test files, with every problem explained.
//! - [`generate`]: the deterministic default suite.

pub mod generate;
pub mod spec;
pub mod validate;
