//! agent-bridge's wire contract: what the server, the proxy and the campaign
//! agree on, and nothing else.
//!
//! Layout: [`bytes`] describes every payload exactly (text or base64, with
//! its length and sha256); [`tools`] names the tools, their arguments with
//! JSON Schemas, and the checks that say which argument is wrong; [`fault`]
//! is the interface faults a server can inject on purpose so a campaign can
//! prove it places them in the interface layer; [`units`] reads sizes and
//! durations as people write them (flags and profile files alike).

pub mod bytes;
pub mod fault;
pub mod tools;
pub mod units;
