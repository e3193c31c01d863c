//! The adapter file's TOML schema: what a user writes, deserialized.

use super::*;

/// The campaign's step vocabulary, with the arguments each step may have.
pub const STEPS: &[(&str, &[&str])] = &[
    (
        "exec",
        &[
            "argv",
            "command",
            "stdin_base64",
            "cwd",
            "env",
            "timeout_ms",
            "max_output_bytes",
        ],
    ),
    (
        "run_code",
        &["language", "code", "timeout_ms", "max_output_bytes"],
    ),
    (
        "write_file",
        &[
            "path",
            "path_base64",
            "content_base64",
            "text",
            "sha256",
            "mode",
            "append",
            "content",
        ],
    ),
    ("read_file", &["path", "path_base64", "offset", "length"]),
    ("list_dir", &["path", "path_base64", "recursive"]),
    ("stat", &["path", "path_base64"]),
    ("start_process", &["argv", "command", "cwd", "env"]),
    (
        "poll_process",
        &["id", "stdout_cursor", "stderr_cursor", "wait_ms"],
    ),
    ("write_stdin", &["id", "text", "data_base64", "close"]),
    ("kill_process", &["id", "signal"]),
    // the browser's steps: one browser per session, its tabs kept between steps
    ("browser_open", &["url"]),
    ("browser_text", &[]),
    ("browser_eval", &["script"]),
    ("browser_screenshot", &["format"]),
    ("browser_click", &["selector"]),
    ("browser_fill", &["selector", "text"]),
    ("browser_tabs", &[]),
    ("browser_new_tab", &["url"]),
    ("browser_close_tab", &["index"]),
    ("browser_pdf", &[]),
    ("browser_download", &["selector"]),
];

/// Values a result reader can produce, and what each is for.
pub(super) const FIELDS: &[&str] = &[
    "stdout",    // bytes: a command's standard output
    "stderr",    // bytes
    "exit_code", // integer
    "signal",    // text, e.g. SIGKILL
    "bytes",     // bytes: what read_file returned
    "size",      // integer
    "sha256",    // text: the digest the target reports
    "written",   // integer: bytes the target says it wrote
    "errno",     // text, e.g. ENOENT
    "error",     // the call failed (the text that says so) though isError is false
    "id",        // integer: a background process's id
    "refused", // the target refused the call for a reason of its own (e.g. "cannot read binary files")
    "page_text", // text: a page's text, or a browser's list of tabs
    "title",   // text: a page's title
    "value",   // JSON text: the value a script in the page returned
];

/// An adapter file, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct File {
    pub(super) name: String,
    #[serde(default)]
    pub(super) description: String,
    /// The server (and version) the adapter was written for.
    #[serde(default)]
    pub(super) server: String,
    /// What the target cannot do, in words, for reports.
    #[serde(default)]
    pub(super) limits: Vec<String>,
    pub(super) steps: BTreeMap<String, StepFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StepFile {
    pub(super) tool: String,
    #[serde(default)]
    pub(super) arguments: toml::Table,
    /// Step arguments the target has no use for, which are not a reason
    /// to call the step unsupported (e.g. the bridge's own `sha256` check).
    #[serde(default)]
    pub(super) ignore: Vec<String>,
    /// Step argument values the target can express (others: unsupported),
    /// e.g. `accept = { append = [false] }` for a server that cannot append.
    #[serde(default)]
    pub(super) accept: BTreeMap<String, Vec<toml::Value>>,
    #[serde(default)]
    pub(super) result: BTreeMap<String, OneOrMany>,
    /// Calls made after the first, in order (a server that starts a
    /// process in one tool and reports its exit in another). Their
    /// templates may also use the fields read from the calls before.
    #[serde(default)]
    pub(super) then: Vec<FollowFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FollowFile {
    pub(super) tool: String,
    #[serde(default)]
    pub(super) arguments: toml::Table,
    /// Call again (every 100 ms, within the step's time) until the text
    /// matches: a server whose process tool answers before the process ends.
    #[serde(default)]
    pub(super) until: Option<UntilFile>,
    #[serde(default)]
    pub(super) result: BTreeMap<String, OneOrMany>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct UntilFile {
    pub(super) pattern: String,
    pub(super) example: String,
}

/// One reader, or several tried in order (the first that finds the value wins).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum OneOrMany {
    One(ReaderFile),
    Many(Vec<ReaderFile>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReaderFile {
    pub(super) from: String,
    /// JSON pointer into structuredContent (`from = "structured"`).
    #[serde(default)]
    pub(super) path: Option<String>,
    /// A regex over the source text; the value is group 1 (or the whole match).
    #[serde(default)]
    pub(super) pattern: Option<String>,
    /// Text the pattern must match: it proves the pattern, and shows a reader what the server says.
    #[serde(default)]
    pub(super) example: Option<String>,
    /// `base64` (the value is base64 text), `payload` (an agent-bridge
    /// {text|base64} payload) or `file` (the value is the absolute path of
    /// a file the server wrote on this machine: its bytes are read there).
    #[serde(default)]
    pub(super) decode: Option<String>,
    /// When the pattern matches, the value is this text (e.g. `ENOENT` for "[NOT_FOUND] …").
    #[serde(default)]
    pub(super) value: Option<String>,
}

/// Where a value is found in a result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Source {
    /// Every text content block, joined by newlines (what an agent reads).
    Text,
    Structured,
    /// The first embedded resource's blob (base64) or text.
    Resource,
    /// The first image content block's data.
    Image,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Decode {
    None,
    Base64,
    Payload,
    File,
}
