//! agent-bridge: the MCP server that exposes the sandbox to coding agents,
//! and the campaign runner. Not built yet: this crate reserves its place in
//! the workspace the design card fixes.
