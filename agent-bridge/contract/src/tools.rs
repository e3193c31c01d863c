//! The tools' contract: names, arguments (with their JSON Schemas) and the
//! argument checks that name what is wrong. Implementations are in
//! the server's `session` module.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt as _;
use std::sync::Arc;

use rmcp::model::{JsonObject, Tool};
use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::bytes::{base64_decode, check_no_nul};

/// A tool's argument error: which argument, and what is wrong with it.
#[derive(Debug, Clone, PartialEq)]
pub struct ArgError {
    pub argument: String,
    pub message: String,
}

impl std::fmt::Display for ArgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.argument.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "argument `{}`: {}", self.argument, self.message)
        }
    }
}

pub fn arg_error(argument: &str, message: impl Into<String>) -> ArgError {
    ArgError {
        argument: argument.into(),
        message: message.into(),
    }
}

/// Deserializes a tool's arguments, naming the argument that is wrong.
pub fn parse<T: DeserializeOwned>(args: Option<JsonObject>) -> Result<T, ArgError> {
    let value = serde_json::Value::Object(args.unwrap_or_default());
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let message = e.into_inner().to_string();
        ArgError {
            argument: if path == "." { String::new() } else { path },
            message,
        }
    })
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecArgs {
    /// Program and arguments, run without a shell. Give this or `command`.
    pub argv: Option<Vec<String>>,
    /// A shell command line, run by `/bin/sh -c`. Give this or `argv`.
    pub command: Option<String>,
    /// Bytes for the program's stdin, base64.
    pub stdin_base64: Option<String>,
    /// Working directory (default: the bridge's workdir).
    pub cwd: Option<String>,
    /// Extra environment variables.
    pub env: Option<BTreeMap<String, String>>,
    /// Kill the whole process tree after this many milliseconds (default 60000).
    pub timeout_ms: Option<u64>,
    /// Keep at most this many bytes of stdout and of stderr (default 16 MiB); more sets `truncated`.
    pub max_output_bytes: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCodeArgs {
    /// python, sh, bash, node or perl.
    pub language: String,
    /// The program text, fed to the interpreter on stdin.
    pub code: String,
    pub timeout_ms: Option<u64>,
    pub max_output_bytes: Option<u64>,
}

/// A path as UTF-8 text, or as base64 bytes for names that are not UTF-8.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PathArg {
    pub path: Option<String>,
    /// The path's raw bytes, base64 (for names that are not UTF-8).
    pub path_base64: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    pub path: Option<String>,
    pub path_base64: Option<String>,
    /// The bytes to write, base64. Give this or `text`.
    pub content_base64: Option<String>,
    /// The content as UTF-8 text. Give this or `content_base64`.
    pub text: Option<String>,
    /// Expected sha256 (hex) of the decoded bytes; a mismatch writes nothing.
    pub sha256: Option<String>,
    /// Permission bits, e.g. "0755" or 493.
    pub mode: Option<Mode>,
    /// Append instead of replacing (replacing is atomic: temp file + rename).
    pub append: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Mode {
    Bits(u32),
    Octal(String),
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    pub path: Option<String>,
    pub path_base64: Option<String>,
    /// Start at this byte.
    pub offset: Option<u64>,
    /// Read at most this many bytes (default: to the end, up to 128 MiB).
    pub length: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListDirArgs {
    pub path: Option<String>,
    pub path_base64: Option<String>,
    pub recursive: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartProcessArgs {
    pub argv: Option<Vec<String>>,
    pub command: Option<String>,
    pub cwd: Option<String>,
    pub env: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PollProcessArgs {
    /// The id start_process returned.
    pub id: u64,
    /// Return stdout from this byte on (the previous poll's `stdout.cursor`).
    pub stdout_cursor: Option<u64>,
    pub stderr_cursor: Option<u64>,
    /// Wait up to this long for new output or the exit (max 30000).
    pub wait_ms: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteStdinArgs {
    pub id: u64,
    pub data_base64: Option<String>,
    pub text: Option<String>,
    /// Close stdin after writing (EOF for the process).
    pub close: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KillProcessArgs {
    pub id: u64,
    /// Signal name (default SIGKILL, which kills the whole tree).
    pub signal: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserUrlArgs {
    /// The page to open (http, https, data: or file: URL).
    pub url: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserEvalArgs {
    /// A JavaScript function, e.g. `() => document.title`; it may return a
    /// promise, which is awaited. Its value comes back as JSON.
    pub script: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserScreenshotArgs {
    /// `png` (default) or `jpeg`.
    pub format: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserSelectorArgs {
    /// A CSS selector; the first element it matches.
    pub selector: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserFillArgs {
    /// A CSS selector of an input or textarea.
    pub selector: String,
    pub text: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserTabArgs {
    /// The tab's index in `browser_tabs`, from 0.
    pub index: usize,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KernelEvidenceArgs {
    /// One span in full, with every stored event.
    pub span: Option<u64>,
    /// A probe session's spans (default: this MCP session's).
    pub session: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecordResultArgs {
    pub test_id: String,
    pub domain: String,
    /// pass, fail, error or skip.
    pub status: String,
    /// interface, sandbox or test.
    pub layer: Option<String>,
    /// A primitive of the taxonomy, e.g. fs.readonly.
    pub primitive: Option<String>,
    pub notes: Option<String>,
    /// Groups results; default: this MCP session.
    pub run: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentArgs {
    /// Command names to look up besides the default set (the programs a
    /// suite runs): each one's path, version, ELF machine and missing libraries.
    pub commands: Option<Vec<String>>,
}

fn tool<T: JsonSchema + 'static>(name: &'static str, description: &'static str) -> Tool {
    let schema: Arc<JsonObject> = rmcp::handler::server::common::schema_for_type::<T>();
    Tool::new(name, description, schema)
}

/// Every tool, in the order `tools/list` gives them: built once, since a
/// sessionless HTTP request builds a server (twice: rmcp checks the call's
/// `Mcp-Param-*` headers against the tool's schema on another).
pub fn all() -> Arc<Vec<Tool>> {
    static ALL: std::sync::OnceLock<Arc<Vec<Tool>>> = std::sync::OnceLock::new();
    ALL.get_or_init(|| Arc::new(build_all())).clone()
}

fn build_all() -> Vec<Tool> {
    vec![
        tool::<ExecArgs>(
            "exec",
            "Run a program (argv) or a shell command line and wait for it. Returns exit_code, signal, duration_ms, stdout and stderr as exact bytes with sha256, and `kernel`: the probe's attribution of why it failed.",
        ),
        tool::<RunCodeArgs>(
            "run_code",
            "Run a snippet of code with an interpreter (python, sh, bash, node, perl). Same result as exec.",
        ),
        tool::<WriteFileArgs>(
            "write_file",
            "Write bytes (base64) or text to a file, atomically; checks `sha256` of the decoded bytes when given.",
        ),
        tool::<ReadFileArgs>(
            "read_file",
            "Read a file's bytes exactly: an embedded resource blob (and image content for images), with size, sha256 and mime.",
        ),
        tool::<ListDirArgs>(
            "list_dir",
            "List a directory (optionally recursively). Names that are not UTF-8 come with `name_base64`.",
        ),
        tool::<PathArg>("stat", "Type, size, mode, owner and mtime of a path."),
        tool::<StartProcessArgs>(
            "start_process",
            "Start a background process; returns its id. Read its output with poll_process.",
        ),
        tool::<PollProcessArgs>(
            "poll_process",
            "New output of a background process since the cursors, whether it runs, and its exit and kernel attribution once it ended.",
        ),
        tool::<WriteStdinArgs>("write_stdin", "Write to a background process's stdin."),
        tool::<KillProcessArgs>(
            "kill_process",
            "Signal a background process; SIGKILL (the default) kills its whole tree.",
        ),
        tool::<KernelEvidenceArgs>(
            "kernel_evidence",
            "The probe's stored evidence: one span with all its events, or the spans of a session.",
        ),
        tool::<RecordResultArgs>(
            "record_result",
            "Record a test outcome into the campaign results database (--results-db).",
        ),
        tool::<BrowserUrlArgs>(
            "browser_open",
            "Open a URL in the session's browser (Chromium, started on first use under the session's profile) in the current tab; waits for the load. Returns title, url and page_text, and `kernel` for the browser's processes during the call.",
        ),
        tool::<NoArgs>(
            "browser_text",
            "The current tab's text (document.body.innerText), title and url.",
        ),
        tool::<BrowserEvalArgs>(
            "browser_eval",
            "Run a JavaScript function in the current tab; `value` is what it returned, as JSON text.",
        ),
        tool::<BrowserScreenshotArgs>(
            "browser_screenshot",
            "Screenshot the current tab (1280x720): an embedded resource blob and image content, with size and sha256.",
        ),
        tool::<BrowserSelectorArgs>(
            "browser_click",
            "Click the first element a CSS selector matches in the current tab.",
        ),
        tool::<BrowserFillArgs>(
            "browser_fill",
            "Set an input's value to `text` (with input and change events) in the current tab.",
        ),
        tool::<NoArgs>(
            "browser_tabs",
            "The open tabs: `- INDEX: [TITLE](URL)`, the current one marked.",
        ),
        tool::<BrowserUrlArgs>(
            "browser_new_tab",
            "Open a URL in a new tab, which becomes the current one.",
        ),
        tool::<BrowserTabArgs>(
            "browser_close_tab",
            "Close a tab by its index in `browser_tabs`.",
        ),
        tool::<NoArgs>(
            "browser_pdf",
            "Print the current tab to PDF (A4-like Letter, backgrounds on): an embedded resource blob, with size and sha256.",
        ),
        tool::<BrowserSelectorArgs>(
            "browser_download",
            "Click the first element a CSS selector matches and wait for the download it starts: the downloaded file as an embedded resource blob, with its name, size and sha256.",
        ),
        tool::<NoArgs>(
            "sandbox_info",
            "The profile applied to workloads, the interface fault (if any), limits, and the probe's status.",
        ),
        tool::<EnvironmentArgs>(
            "sandbox_environment",
            "A snapshot of the environment workloads run in, taken by a workload under the profile (as `probe env --json`): commands, browser, packages, where it can write, limits, syscall surface, runtime, network, identity; environment variables by name and hash only.",
        ),
    ]
}

/// At most this many command names in one `sandbox_environment` call.
pub const MAX_COMMAND_NAMES: usize = 4096;

/// A command name to look up on PATH: a file name, not a path.
pub fn command_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 255 || name.contains(['/', '\0']) || name.starts_with('-') {
        return Err(format!(
            "{name:?} is not a command name (1 to 255 bytes, no `/`, no NUL, not starting with `-`)"
        ));
    }
    Ok(())
}

/// Exactly one of two optional arguments.
pub fn one_of<'a, A, B>(
    a: (&str, &'a Option<A>),
    b: (&str, &'a Option<B>),
) -> Result<Result<&'a A, &'a B>, ArgError> {
    match (a.1, b.1) {
        (Some(x), None) => Ok(Ok(x)),
        (None, Some(y)) => Ok(Err(y)),
        (Some(_), Some(_)) => Err(arg_error(
            a.0,
            format!("give `{}` or `{}`, not both", a.0, b.0),
        )),
        (None, None) => Err(arg_error(a.0, format!("give `{}` or `{}`", a.0, b.0))),
    }
}

/// A path argument (text or base64 bytes), checked for NUL.
pub fn path(path: &Option<String>, path_base64: &Option<String>) -> Result<OsString, ArgError> {
    let bytes = match one_of(("path", path), ("path_base64", path_base64))? {
        Ok(p) => p.clone().into_bytes(),
        Err(b) => base64_decode(b).map_err(|e| arg_error("path_base64", e))?,
    };
    let which = if path.is_some() {
        "path"
    } else {
        "path_base64"
    };
    if bytes.is_empty() {
        return Err(arg_error(which, "is empty"));
    }
    check_no_nul(which, &bytes).map_err(|e| arg_error(which, e))?;
    Ok(OsString::from_vec(bytes))
}

/// argv or `sh -c command`, every element checked for NUL.
pub fn command_line(
    argv: &Option<Vec<String>>,
    command: &Option<String>,
) -> Result<Vec<OsString>, ArgError> {
    let argv = match one_of(("argv", argv), ("command", command))? {
        Ok(argv) => {
            if argv.is_empty() {
                return Err(arg_error("argv", "is empty; it needs at least the program"));
            }
            for (i, a) in argv.iter().enumerate() {
                let name = format!("argv[{i}]");
                check_no_nul(&name, a.as_bytes()).map_err(|e| arg_error(&name, e))?;
            }
            argv.clone()
        }
        Err(cmd) => {
            check_no_nul("command", cmd.as_bytes()).map_err(|e| arg_error("command", e))?;
            vec!["/bin/sh".into(), "-c".into(), cmd.clone()]
        }
    };
    Ok(argv.into_iter().map(OsString::from).collect())
}

/// Environment variables, checked for NUL and `=` in names.
pub fn environment(
    env: &Option<BTreeMap<String, String>>,
) -> Result<Vec<(OsString, OsString)>, ArgError> {
    let mut out = Vec::new();
    for (k, v) in env.iter().flatten() {
        let name = format!("env.{k}");
        if k.is_empty() || k.contains('=') {
            return Err(arg_error(
                &name,
                "a variable name may not be empty or contain `=`",
            ));
        }
        check_no_nul(&name, k.as_bytes()).map_err(|e| arg_error(&name, e))?;
        check_no_nul(&name, v.as_bytes()).map_err(|e| arg_error(&name, e))?;
        out.push((k.into(), v.into()));
    }
    Ok(out)
}

/// The bytes of a `*_base64` / `text` pair.
pub fn content(
    b64: (&str, &Option<String>),
    text: (&str, &Option<String>),
) -> Result<Vec<u8>, ArgError> {
    match one_of(b64, text)? {
        Ok(b) => base64_decode(b).map_err(|e| arg_error(b64.0, e)),
        Err(t) => Ok(t.clone().into_bytes()),
    }
}

impl Mode {
    pub fn bits(&self) -> Result<u32, ArgError> {
        let bits = match self {
            Mode::Bits(b) => *b,
            Mode::Octal(s) => u32::from_str_radix(s.trim_start_matches("0o"), 8).map_err(|_| {
                arg_error("mode", format!("`{s}` is not an octal mode like \"0644\""))
            })?,
        };
        if bits > 0o7777 {
            return Err(arg_error(
                "mode",
                format!("{bits:#o} has bits beyond 07777"),
            ));
        }
        Ok(bits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: serde_json::Value) -> Option<JsonObject> {
        v.as_object().cloned()
    }

    #[test]
    fn wrong_types_and_unknown_fields_name_the_argument() {
        let e = parse::<ExecArgs>(obj(json!({"argv": ["x"], "timeout_ms": "soon"}))).unwrap_err();
        assert_eq!(e.argument, "timeout_ms");
        let e = parse::<ExecArgs>(obj(json!({"argv": ["x"], "bogus": 1}))).unwrap_err();
        assert!(e.message.contains("bogus"), "{e}");
        let e = parse::<PollProcessArgs>(obj(json!({}))).unwrap_err();
        assert!(e.to_string().contains("id"), "{e}");
        let e = parse::<ExecArgs>(obj(json!({"argv": ["a", 3]}))).unwrap_err();
        assert_eq!(e.argument, "argv[1]");
    }

    #[test]
    fn nul_bytes_are_refused_with_their_place() {
        let e = command_line(&Some(vec!["echo".into(), "a\0b".into()]), &None).unwrap_err();
        assert_eq!(e.argument, "argv[1]");
        assert!(e.message.contains("offset 1"), "{e}");
        let e = path(&Some("/tmp/a\0b".into()), &None).unwrap_err();
        assert_eq!(e.argument, "path");
        let mut env = BTreeMap::new();
        env.insert("K".to_string(), "v\0".to_string());
        assert_eq!(environment(&Some(env)).unwrap_err().argument, "env.K");
        assert!(
            command_line(&None, &None)
                .unwrap_err()
                .message
                .contains("give `argv` or `command`")
        );
    }

    #[test]
    fn modes() {
        assert_eq!(Mode::Octal("0755".into()).bits().unwrap(), 0o755);
        assert_eq!(Mode::Bits(420).bits().unwrap(), 0o644);
        assert!(Mode::Octal("rwx".into()).bits().is_err());
        assert!(Mode::Bits(0o17777).bits().is_err());
    }

    #[test]
    fn every_tool_has_an_object_schema() {
        for t in all().iter() {
            assert_eq!(
                t.input_schema.get("type"),
                Some(&json!("object")),
                "{}",
                t.name
            );
        }
    }
}
