//! The file tools: write_file, read_file, list_dir and stat. Each runs the
//! file worker (`agent-bridge worker`) under the session's profile and the
//! probe, like any workload.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt as _;
use std::sync::Arc;

use rmcp::model::{ContentBlock, ResourceContents};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{IMAGE_CONTENT_MAX, MAX_READ, Reply, Session, small};
use crate::workload::{Output, Spec};
use contract::bytes::{sha256_hex, sniff_mime};
use contract::fault::{InterfaceFault, corrupt};
use contract::tools::{self, ArgError, arg_error};

/// sha256 on a blocking thread: 64 MiB takes ~65 ms, too long to hold the runtime.
async fn hash_off_runtime(data: Vec<u8>) -> (Vec<u8>, String) {
    tokio::task::spawn_blocking(move || {
        let sha = sha256_hex(&data);
        (data, sha)
    })
    .await
    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// The digest of the bytes read and the base64 of what is returned (the
/// same bytes unless an interface fault corrupts them), computed side by
/// side: hashing and encoding 64 MiB each take tens of milliseconds.
fn hash_and_encode(data: Vec<u8>, fault: Option<InterfaceFault>) -> (String, usize, String) {
    if fault.is_some() {
        let sha = sha256_hex(&data);
        let data = corrupt(fault, data);
        return (sha, data.len(), contract::bytes::base64_encode(&data));
    }
    std::thread::scope(|s| {
        let sha = s.spawn(|| sha256_hex(&data));
        let b64 = contract::bytes::base64_encode(&data);
        let sha = sha.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
        (sha, data.len(), b64)
    })
}

impl Session {
    /// A file worker, traced by the probe like any workload.
    pub(super) async fn worker(
        &self,
        what: &str,
        args: Vec<OsString>,
        stdin: Option<Arc<Vec<u8>>>,
        output: Output,
        cancel: CancellationToken,
    ) -> Result<(Vec<u8>, Vec<u8>, Value), Reply> {
        self.run_worker(what, args, stdin, output, cancel, None)
            .await
    }

    /// A worker; `untraced`: why the probe is not asked to trace it.
    pub(super) async fn run_worker(
        &self,
        what: &str,
        args: Vec<OsString>,
        stdin: Option<Arc<Vec<u8>>>,
        output: Output,
        cancel: CancellationToken,
        untraced: Option<&'static str>,
    ) -> Result<(Vec<u8>, Vec<u8>, Value), Reply> {
        let mut argv = vec![
            self.config.self_exe.clone().into_os_string(),
            "worker".into(),
        ];
        let shown = String::from_utf8_lossy(args[1].as_bytes()).into_owned();
        argv.extend(args);
        let spec = Spec {
            label: format!("{what}: {shown}"),
            argv,
            own_binary: true,
            untraced,
            ..Spec::default()
        };
        let f = self
            .run(spec, stdin, self.timeout(None), output, cancel, |_| {})
            .await?;
        if f.exit.success() {
            return Ok((f.stdout.data, f.stderr.data, f.kernel));
        }
        let reason = String::from_utf8_lossy(&f.stderr.data).trim().to_string();
        let mut msg = match (&f.exit.signal, reason.is_empty()) {
            (Some(s), _) => format!("{what} {shown}: the worker was killed by {s}"),
            (None, false) => format!("{what} {shown}: {reason}"),
            (None, true) => format!("{what} {shown}: failed ({})", f.exit.describe()),
        };
        if let Some(line) = crate::kernel::summary_line(&f.kernel) {
            msg.push_str(&format!("\n{line}"));
        }
        let errno = reason
            .split(':')
            .next()
            .filter(|e| e.starts_with('E'))
            .map(str::to_owned);
        Err(Reply::error(
            msg,
            json!({"path": shown, "errno": errno, "kernel": f.kernel}),
        ))
    }

    pub(super) async fn write_file(
        &self,
        args: Option<rmcp::model::JsonObject>,
        cancel: CancellationToken,
    ) -> Result<Reply, ArgError> {
        let a: tools::WriteFileArgs = tools::parse(args)?;
        let path = tools::path(&a.path, &a.path_base64)?;
        let data = tools::content(("content_base64", &a.content_base64), ("text", &a.text))?;
        // with a digest to check, or bytes about to be corrupted on purpose, hash
        // before writing; otherwise hash while the worker writes
        let hash_first = a.sha256.is_some() || self.config.fault.is_some();
        let (data, early_sha) = if hash_first {
            let (data, sha) = hash_off_runtime(data).await;
            (data, Some(sha))
        } else {
            (data, None)
        };
        if let (Some(want), Some(sha)) = (&a.sha256, &early_sha)
            && !want.eq_ignore_ascii_case(sha)
        {
            let what = if a.text.is_some() {
                "text"
            } else {
                "decoded content_base64"
            };
            return Err(arg_error(
                "sha256",
                format!(
                    "mismatch: the {what} ({} bytes) hashes to {sha}, not {want}; nothing was written",
                    data.len()
                ),
            ));
        }
        let mode = a.mode.as_ref().map(tools::Mode::bits).transpose()?;
        let mime = sniff_mime(&data, &path.to_string_lossy());
        let data = Arc::new(corrupt(self.config.fault, data));
        let written = data.len();
        let hashing = early_sha.is_none().then(|| {
            let data = data.clone();
            tokio::task::spawn_blocking(move || sha256_hex(&data))
        });
        let argv = vec![
            "write".into(),
            path.clone(),
            mode.map_or("-".into(), |m| m.to_string()).into(),
            if a.append == Some(true) {
                "append"
            } else {
                "replace"
            }
            .into(),
        ];
        let result = self
            .worker("write_file", argv, Some(data), small(), cancel)
            .await;
        let sha = match hashing {
            Some(task) => task
                .await
                .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())),
            None => early_sha.unwrap_or_default(),
        };
        Ok(match result {
            Ok((out, _, kernel)) => {
                let size = serde_json::from_slice::<Value>(&out)
                    .ok()
                    .and_then(|v| v["size"].as_u64());
                let shown = path.to_string_lossy();
                Reply::ok(
                    format!("wrote {written} bytes to {shown} (sha256 {sha})"),
                    json!({"path": shown, "size": size, "written": written, "sha256": sha, "mime": mime, "kernel": kernel}),
                )
            }
            Err(r) => r,
        })
    }

    pub(super) async fn read_file(
        &self,
        args: Option<rmcp::model::JsonObject>,
        cancel: CancellationToken,
    ) -> Result<Reply, ArgError> {
        let a: tools::ReadFileArgs = tools::parse(args)?;
        let path = tools::path(&a.path, &a.path_base64)?;
        let offset = a.offset.unwrap_or(0);
        let length = a.length.unwrap_or(MAX_READ).min(MAX_READ);
        let argv = vec![
            "read".into(),
            path.clone(),
            offset.to_string().into(),
            length.to_string().into(),
        ];
        // a size hint (the bridge's own view; the worker's is authoritative)
        let hint =
            std::fs::metadata(&path).map_or(0, |m| m.len().saturating_sub(offset).min(length));
        let output = Output {
            cap: length as usize,
            stdout_hint: hint as usize,
        };
        let (out, header, kernel) = match self.worker("read_file", argv, None, output, cancel).await
        {
            Ok(x) => x,
            Err(r) => return Ok(r),
        };
        let size = serde_json::from_slice::<Value>(&header)
            .ok()
            .and_then(|v| v["size"].as_u64())
            .unwrap_or(0);
        let shown = path.to_string_lossy().into_owned();
        let mime = sniff_mime(&out, &shown);
        let fault = self.config.fault;
        let (sha, returned, b64) = tokio::task::spawn_blocking(move || hash_and_encode(out, fault))
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        let returned = returned as u64;
        let truncated = offset + returned < size && a.length.is_none();
        let uri = format!("file://{}", shown);
        let mut content = vec![ContentBlock::text(format!(
            "{shown}: {returned} bytes of {size} from offset {offset}, {mime}, sha256 {sha}"
        ))];
        if mime.starts_with("image/") && returned <= IMAGE_CONTENT_MAX {
            content.push(ContentBlock::image(b64.clone(), mime));
        }
        content.push(ContentBlock::resource(
            ResourceContents::BlobResourceContents {
                uri,
                mime_type: Some(mime.into()),
                blob: b64,
                meta: None,
            },
        ));
        Ok(Reply {
            content,
            structured: json!({"path": shown, "size": size, "offset": offset, "bytes": returned,
                "sha256": sha, "mime": mime, "truncated": truncated, "kernel": kernel}),
            is_error: false,
        })
    }

    pub(super) async fn list_dir(
        &self,
        args: Option<rmcp::model::JsonObject>,
        cancel: CancellationToken,
    ) -> Result<Reply, ArgError> {
        let a: tools::ListDirArgs = tools::parse(args)?;
        let path = tools::path(&a.path, &a.path_base64)?;
        let mode = if a.recursive == Some(true) {
            "recursive"
        } else {
            "flat"
        };
        let argv = vec!["list".into(), path.clone(), mode.into()];
        Ok(
            match self
                .worker(
                    "list_dir",
                    argv,
                    None,
                    Output {
                        cap: 64 << 20,
                        stdout_hint: 0,
                    },
                    cancel,
                )
                .await
            {
                Ok((out, _, kernel)) => {
                    let mut v: Value = serde_json::from_slice(&out).unwrap_or(Value::Null);
                    let n = v["entries"].as_array().map_or(0, Vec::len);
                    let names: Vec<String> = v["entries"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .take(200)
                        .map(|e| {
                            format!(
                                "{} {}",
                                e["type"].as_str().unwrap_or("?"),
                                e["name"].as_str().unwrap_or("?")
                            )
                        })
                        .collect();
                    v["path"] = path.to_string_lossy().into();
                    v["kernel"] = kernel;
                    Reply::ok(format!("{n} entries\n{}", names.join("\n")), v)
                }
                Err(r) => r,
            },
        )
    }

    pub(super) async fn stat(
        &self,
        args: Option<rmcp::model::JsonObject>,
        cancel: CancellationToken,
    ) -> Result<Reply, ArgError> {
        let a: tools::PathArg = tools::parse(args)?;
        let path = tools::path(&a.path, &a.path_base64)?;
        let argv = vec!["stat".into(), path.clone()];
        Ok(
            match self.worker("stat", argv, None, small(), cancel).await {
                Ok((out, _, kernel)) => {
                    let mut v: Value = serde_json::from_slice(&out).unwrap_or(Value::Null);
                    v["path"] = path.to_string_lossy().into();
                    v["kernel"] = kernel;
                    Reply::ok(
                        format!(
                            "{}: {} of {} bytes, mode {}",
                            v["path"],
                            v["type"],
                            v["size"],
                            v["mode"].as_str().unwrap_or("?")
                        ),
                        v,
                    )
                }
                Err(r) => r,
            },
        )
    }
}
