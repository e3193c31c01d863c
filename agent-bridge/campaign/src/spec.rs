//! The campaign's test format: one JSON file per test. `campaign schema`
//! prints its JSON Schema (derived from these types, so it cannot drift).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The ten domains a campaign covers.
pub const DOMAINS: [&str; 10] = [
    "files",
    "encoding",
    "process",
    "memory",
    "persistence",
    "packages",
    "network",
    "compute",
    "documents",
    "browser",
];

/// One test: a sequence of MCP tool calls, each with its expectations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TestSpec {
    /// Unique within a suite, e.g. `files-0042`; also the file name (`files-0042.json`).
    pub id: String,
    /// One of the ten domains.
    pub domain: String,
    pub title: String,
    /// What the test depends on being installed (e.g. `chromium`); informative.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requires: Vec<String>,
    pub steps: Vec<Step>,
}

/// One tool call and what must hold of its result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// A step of the vocabulary: exec, run_code, write_file, read_file,
    /// list_dir, stat, the background process tools, and the browser's:
    /// browser_open, browser_text, browser_eval, browser_screenshot,
    /// browser_click, browser_fill, browser_tabs, browser_new_tab,
    /// browser_close_tab, browser_pdf, browser_download (see docs/ADAPTERS.md).
    pub tool: String,
    /// The tool's arguments, as sent.
    pub arguments: BTreeMap<String, Value>,
    #[serde(default)]
    pub expect: Expect,
}

/// Expectations of one step; every one given must hold.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// The result is a tool error (default: it is not).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
    /// exec/run_code: the exit code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// exec/run_code: the signal that killed it (e.g. `SIGTERM`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// exec/run_code: stdout is exactly this text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_equals: Option<String>,
    /// exec/run_code: stdout contains this text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_contains: Option<String>,
    /// exec/run_code: stderr contains this text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_contains: Option<String>,
    /// exec/run_code: stdout is exactly these bytes (standard base64), for
    /// binary output; a mismatch is compared with known corruptions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_base64: Option<String>,
    /// exec/run_code: sha256 (hex) of stdout's exact bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_sha256: Option<String>,
    /// read_file, browser_screenshot/pdf/download: sha256 of the bytes
    /// returned; write_file: sha256 the bridge reports for the bytes it
    /// wrote. Use the sha256 of what was sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// read_file/write_file/stat, browser_download: `size` in the result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// stat/read_file: the path exists (true) or is absent (false: an ENOENT tool error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exists: Option<bool>,
    /// read_file: the bytes returned hash to the sha256 the workload itself
    /// printed in step N's stdout (the first 64-hex-digit word there), for
    /// files the workload made (a screenshot, a PDF) whose hash no one knows
    /// in advance. N counts from 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256_from_step: Option<usize>,
    /// read_file, browser_screenshot: the bytes are a PNG (signature,
    /// IHDR) of this size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub png: Option<ImageSize>,
    /// read_file, browser_screenshot: the bytes are a JPEG (SOI, then a
    /// start-of-frame marker) of this size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jpeg: Option<ImageSize>,
    /// read_file, browser_pdf, browser_download: the bytes are a PDF
    /// (`%PDF-` header) with this many pages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pdf_pages: Option<u32>,
    /// browser steps: the page's text (or the tab list's, for
    /// `browser_tabs`) contains this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_contains: Option<String>,
    /// browser steps: the page's (or the tab list's) text does not contain this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_lacks: Option<String>,
    /// browser_open: the page's title is exactly this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// browser_eval: the script's value, as JSON (`42`, `"Page 3"`, `[1,2]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_json: Option<Value>,
    /// The call takes at most this long, end to end. Longer is not a
    /// failure: a test that passes but ran past it is `degraded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_duration_ms: Option<u64>,
}

/// An image's width and height in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageSize {
    pub width: u32,
    pub height: u32,
}

/// The JSON Schema of a test file.
pub fn schema() -> Value {
    serde_json::to_value(schemars::schema_for!(TestSpec)).expect("a schema is JSON")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_schema_in_docs_is_current() {
        let committed: serde_json::Value =
            serde_json::from_str(include_str!("../../../docs/campaign-test.schema.json")).unwrap();
        assert_eq!(
            committed,
            super::schema(),
            "docs/campaign-test.schema.json is stale: agent-bridge campaign schema > docs/campaign-test.schema.json"
        );
    }
}
