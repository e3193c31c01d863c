//! One MCP session: its probe session, its profile plan, its background
//! processes and session-long disks; tool dispatch, and the tools that run
//! commands. The browser tools are in [`browser`], the file tools in
//! [`files`], the background-process tools in [`processes`].

mod browser;
pub use browser::remove_orphan_profiles;
mod files;
mod processes;

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::ContentBlock;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::cgroup::Limits;
use crate::kernel::Kernel;
use crate::process::Background;
use crate::profile::Profile;
use crate::sandbox::Plan;
use crate::workload::{Context, Finished, Output, Spec, Stops};
use contract::bytes::Payload;
use contract::fault::{InterfaceFault, corrupt};
use contract::tools::{self, ArgError, arg_error};

/// What every session of one bridge shares.
pub struct Config {
    pub profile: Profile,
    /// None: `--no-probe`.
    pub probe_socket: Option<PathBuf>,
    pub fault: Option<InterfaceFault>,
    pub workdir: PathBuf,
    pub results_db: Option<PathBuf>,
    /// This binary, for the file-tool worker.
    pub self_exe: PathBuf,
    pub default_timeout: Duration,
    /// Where session-long disks (profile `disk_limit`) are mounted.
    pub run_dir: PathBuf,
}

pub const DEFAULT_OUTPUT_CAP: u64 = 16 << 20;
pub const MAX_OUTPUT_CAP: u64 = 128 << 20;
pub const MAX_READ: u64 = 128 << 20;
/// Images up to this size are also returned as image content.
const IMAGE_CONTENT_MAX: u64 = 16 << 20;

/// A tool's answer.
pub struct Reply {
    pub content: Vec<ContentBlock>,
    pub structured: Value,
    pub is_error: bool,
}

impl Reply {
    fn ok(summary: String, structured: Value) -> Reply {
        Reply {
            content: vec![ContentBlock::text(summary)],
            structured,
            is_error: false,
        }
    }

    fn error(message: String, mut structured: Value) -> Reply {
        structured["error"] = json!({"message": message});
        Reply {
            content: vec![ContentBlock::text(message)],
            structured,
            is_error: true,
        }
    }

    pub fn bad_argument(e: ArgError) -> Reply {
        Reply {
            content: vec![ContentBlock::text(e.to_string())],
            structured: json!({"error": {"argument": e.argument, "message": e.message}}),
            is_error: true,
        }
    }
}

/// A tmpfs that lasts for the session (profile `disk_limit`), unmounted on drop.
pub struct SessionDisk(PathBuf);

impl SessionDisk {
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

/// The tmpfs disks of a profile's `disk_limit` entries, mounted under
/// `run_dir` as `ID-diskN` (unmounted and removed on drop).
pub fn session_disks(
    profile: &crate::profile::Profile,
    run_dir: &std::path::Path,
    id: &str,
) -> std::io::Result<Vec<SessionDisk>> {
    let mut disks = Vec::new();
    for (i, limit) in profile.disk_limit.iter().enumerate() {
        let dir = run_dir.join(format!("{id}-disk{i}"));
        std::fs::create_dir_all(&dir)?;
        let disk = SessionDisk(dir.clone());
        nix::mount::mount(
            Some("tmpfs"),
            &dir,
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some(format!("size={},mode=1777", limit.size.0).as_str()),
        )
        .map_err(|e| {
            std::io::Error::other(format!(
                "mount the session disk for {}: {e}",
                limit.path.display()
            ))
        })?;
        disks.push(disk);
    }
    Ok(disks)
}

impl Drop for SessionDisk {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir(&self.0);
    }
}

static SESSIONS: AtomicU64 = AtomicU64::new(0);

pub struct Session {
    config: Arc<Config>,
    ctx: Context,
    calls: AtomicU64,
    next_process: AtomicU64,
    processes: Mutex<HashMap<u64, Arc<Background>>>,
    /// The session's browser, started by the first browser tool.
    browser: tokio::sync::Mutex<Option<browser::Browser>>,
    _disks: Vec<SessionDisk>,
}

impl Session {
    pub fn new(config: Arc<Config>) -> std::io::Result<Session> {
        let n = SESSIONS.fetch_add(1, Ordering::Relaxed);
        let id = format!("mcp-{}-{}-{n}", std::process::id(), probe::clock::now_ms());
        let disks = session_disks(&config.profile, &config.run_dir, &id)?;
        let paths: Vec<PathBuf> = disks.iter().map(|d| d.0.clone()).collect();
        let plan = Plan::new(&config.profile, &paths)?;
        let profile = &config.profile;
        let ctx = Context {
            plan: Arc::new(plan),
            limits: Limits {
                memory_bytes: profile.memory_limit.map(|s| s.0),
                pids: profile.pids_limit,
            },
            profile_env: profile
                .env
                .iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            kernel: Arc::new(Kernel::new(config.probe_socket.clone(), id.clone())),
            workdir: config.workdir.clone(),
            call_prefix: id,
            spare: Default::default(),
        };
        Ok(Session {
            config,
            ctx,
            calls: AtomicU64::new(0),
            next_process: AtomicU64::new(1),
            processes: Mutex::new(HashMap::new()),
            browser: tokio::sync::Mutex::new(None),
            _disks: disks,
        })
    }

    pub fn id(&self) -> &str {
        self.ctx.kernel.session()
    }

    fn next_call(&self) -> u64 {
        self.calls.fetch_add(1, Ordering::Relaxed)
    }

    fn timeout(&self, asked: Option<u64>) -> Duration {
        let t = asked.map_or(self.config.default_timeout, Duration::from_millis);
        match self.config.profile.max_timeout_ms {
            Some(max) => t.min(Duration::from_millis(max)),
            None => t,
        }
    }

    fn payload(&self, data: Vec<u8>, total: u64) -> Payload {
        let total = total.max(data.len() as u64);
        let data = corrupt(self.config.fault, data);
        Payload::new(&data, total)
    }

    /// Labels results while an interface fault is on.
    fn mark(&self, mut v: Value) -> Value {
        if let Some(f) = self.config.fault {
            v["interface_fault"] = f.name().into();
        }
        v
    }

    /// Dispatches one tool call.
    pub async fn call(
        &self,
        name: &str,
        args: Option<rmcp::model::JsonObject>,
        cancel: CancellationToken,
        tick: impl FnMut(Duration) + Send,
    ) -> Option<Reply> {
        let reply = match name {
            "exec" => self.exec(args, cancel, tick).await,
            "run_code" => self.run_code(args, cancel, tick).await,
            "write_file" => self.write_file(args, cancel).await,
            "read_file" => self.read_file(args, cancel).await,
            "list_dir" => self.list_dir(args, cancel).await,
            "stat" => self.stat(args, cancel).await,
            "start_process" => self.start_process(args).await,
            "poll_process" => self.poll_process(args).await,
            "write_stdin" => self.write_stdin(args).await,
            "kill_process" => self.kill_process(args).await,
            "kernel_evidence" => self.kernel_evidence(args).await,
            "record_result" => self.record_result(args).await,
            "sandbox_info" => Ok(self.sandbox_info().await),
            "sandbox_environment" => self.sandbox_environment(args, cancel).await,
            _ => self.browser_tool(name, args).await?,
        };
        Some(match reply {
            Ok(mut r) => {
                r.structured = self.mark(r.structured);
                r
            }
            Err(e) => Reply::bad_argument(e),
        })
    }

    async fn run(
        &self,
        spec: Spec,
        stdin: Option<std::sync::Arc<Vec<u8>>>,
        timeout: Duration,
        output: Output,
        cancel: CancellationToken,
        tick: impl FnMut(Duration) + Send,
    ) -> Result<Finished, Reply> {
        let spec = Spec {
            stdin_pipe: stdin.is_some(),
            ..spec
        };
        let command = probe::tee::command_line(&spec.argv);
        let running = self
            .ctx
            .start(spec, self.next_call())
            .await
            .map_err(|e| Reply::error(e.0, json!({})))?;
        Ok(running
            .run_to_end(stdin, output, Stops { timeout, cancel }, tick, command)
            .await)
    }

    /// exec and run_code: runs the command and describes how it ended.
    async fn run_command(
        &self,
        spec: Spec,
        stdin: Option<Vec<u8>>,
        timeout: Duration,
        cap: u64,
        cancel: CancellationToken,
        tick: impl FnMut(Duration) + Send,
    ) -> Reply {
        let output = Output {
            cap: cap as usize,
            stdout_hint: 0,
        };
        let stdin = stdin.map(std::sync::Arc::new);
        match self.run(spec, stdin, timeout, output, cancel, tick).await {
            Ok(f) => self.exec_reply(f),
            Err(r) => r,
        }
    }

    fn exec_reply(&self, f: Finished) -> Reply {
        let stdout = self.payload(f.stdout.data, f.stdout.total);
        let stderr = self.payload(f.stderr.data, f.stderr.total);
        let mut summary = match (&f.exit.code, &f.exit.signal) {
            _ if f.timed_out => format!("timeout: killed after {} ms", f.duration.as_millis()),
            _ if f.cancelled => "cancelled: the workload was killed".to_string(),
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(s)) => format!("killed by {s}"),
            (None, None) => "ended with an unknown status".into(),
        };
        if let Some(line) = crate::kernel::summary_line(&f.kernel) {
            summary.push_str(&format!("\n{line}"));
        }
        for (name, p) in [("stdout", &stdout), ("stderr", &stderr)] {
            match &p.text {
                Some(t) if p.bytes <= 64 * 1024 && !t.is_empty() => {
                    summary.push_str(&format!("\n--- {name} ---\n{t}"))
                }
                _ if p.bytes > 0 => summary.push_str(&format!(
                    "\n--- {name}: {} bytes (binary or large), see structuredContent.{name} ---",
                    p.bytes
                )),
                _ => {}
            }
        }
        let structured = json!({
            "exit_code": f.exit.code,
            "signal": f.exit.signal,
            "duration_ms": f.duration.as_secs_f64() * 1000.0,
            "timed_out": f.timed_out,
            "cancelled": f.cancelled,
            "stdout": stdout,
            "stderr": stderr,
            "kernel": f.kernel,
        });
        Reply {
            content: vec![ContentBlock::text(summary)],
            structured,
            is_error: f.timed_out || f.cancelled,
        }
    }

    async fn exec(
        &self,
        args: Option<rmcp::model::JsonObject>,
        cancel: CancellationToken,
        tick: impl FnMut(Duration) + Send,
    ) -> Result<Reply, ArgError> {
        let a: tools::ExecArgs = tools::parse(args)?;
        let argv = tools::command_line(&a.argv, &a.command)?;
        let stdin = match &a.stdin_base64 {
            Some(b) => {
                Some(contract::bytes::base64_decode(b).map_err(|e| arg_error("stdin_base64", e))?)
            }
            None => None,
        };
        let spec = Spec {
            label: label("exec", &argv),
            argv,
            cwd: self.cwd(&a.cwd)?,
            env: tools::environment(&a.env)?,
            stdin_pipe: false,
            own_binary: false,
            untraced: None,
        };
        let cap = output_cap(a.max_output_bytes)?;
        let timeout = self.timeout(a.timeout_ms);
        Ok(self
            .run_command(spec, stdin, timeout, cap, cancel, tick)
            .await)
    }

    async fn run_code(
        &self,
        args: Option<rmcp::model::JsonObject>,
        cancel: CancellationToken,
        tick: impl FnMut(Duration) + Send,
    ) -> Result<Reply, ArgError> {
        let a: tools::RunCodeArgs = tools::parse(args)?;
        let interpreter: &[&str] = match a.language.to_ascii_lowercase().as_str() {
            "python" | "python3" | "py" => &["python3", "-"],
            "sh" | "shell" => &["sh", "-s"],
            "bash" => &["bash", "-s"],
            "node" | "javascript" | "js" => &["node", "-"],
            "perl" => &["perl", "-"],
            other => {
                return Err(arg_error(
                    "language",
                    format!("`{other}` is not supported (python, sh, bash, node, perl)"),
                ));
            }
        };
        let argv: Vec<OsString> = interpreter.iter().map(OsString::from).collect();
        let spec = Spec {
            label: format!("run_code: {}", a.language),
            argv,
            ..Spec::default()
        };
        let cap = output_cap(a.max_output_bytes)?;
        let stdin = Some(a.code.into_bytes());
        let timeout = self.timeout(a.timeout_ms);
        Ok(self
            .run_command(spec, stdin, timeout, cap, cancel, tick)
            .await)
    }

    fn cwd(&self, cwd: &Option<String>) -> Result<Option<PathBuf>, ArgError> {
        match cwd {
            Some(c) => {
                contract::bytes::check_no_nul("cwd", c.as_bytes())
                    .map_err(|e| arg_error("cwd", e))?;
                Ok(Some(c.into()))
            }
            None => Ok(None),
        }
    }

    /// Runs the file worker under the profile and the probe. Ok: its stdout.
    /// Err: a reply naming the failure, with the kernel's attribution.
    async fn kernel_evidence(
        &self,
        args: Option<rmcp::model::JsonObject>,
    ) -> Result<Reply, ArgError> {
        let a: tools::KernelEvidenceArgs = tools::parse(args)?;
        let kernel = self.ctx.kernel.clone();
        let v = tokio::task::spawn_blocking(move || kernel.evidence(a.span, a.session.as_deref()))
            .await
            .unwrap_or(Value::Null);
        if v["available"] == Value::Bool(false) {
            return Ok(Reply::error(
                format!(
                    "no kernel evidence: {}",
                    v["reason"].as_str().unwrap_or("?")
                ),
                json!({"kernel": v}),
            ));
        }
        let n = v["spans"].as_array().map_or(1, Vec::len);
        Ok(Reply::ok(format!("{n} span(s) of kernel evidence"), v))
    }

    async fn record_result(
        &self,
        args: Option<rmcp::model::JsonObject>,
    ) -> Result<Reply, ArgError> {
        let a: tools::RecordResultArgs = tools::parse(args)?;
        crate::results::check(&a)?;
        let Some(db) = self.config.results_db.clone() else {
            return Ok(Reply::error(
                "no results database: start the bridge with --results-db FILE".into(),
                json!({}),
            ));
        };
        let session = self.id().to_owned();
        let run = a.run.clone().unwrap_or_else(|| session.clone());
        let res =
            tokio::task::spawn_blocking(move || crate::results::record(&db, &run, &session, &a))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r);
        Ok(match res {
            Ok(v) => Reply::ok(format!("recorded {}", v["test_id"]), v),
            Err(e) => Reply::error(format!("cannot record the result: {e}"), json!({})),
        })
    }

    /// The snapshot, taken by the file worker run as a workload: under the
    /// profile, in the sandbox's namespaces, as the workloads' user.
    async fn sandbox_environment(
        &self,
        args: Option<rmcp::model::JsonObject>,
        cancel: CancellationToken,
    ) -> Result<Reply, ArgError> {
        let a: tools::EnvironmentArgs = tools::parse(args)?;
        let mut argv: Vec<OsString> = vec!["env".into(), "snapshot".into()];
        let names = a.commands.unwrap_or_default();
        if names.len() > tools::MAX_COMMAND_NAMES {
            return Err(arg_error(
                "commands",
                format!("at most {} names", tools::MAX_COMMAND_NAMES),
            ));
        }
        for name in names {
            tools::command_name(&name).map_err(|e| arg_error("commands", e))?;
            argv.push(name.into());
        }
        let output = Output {
            cap: 8 << 20,
            stdout_hint: 0,
        };
        // its trials fail on purpose and its lookups of absent tools are
        // its measurements: tens of thousands of failed calls in a second
        // that are no workload's evidence, and would crowd out (or, in a
        // burst, make the ring buffer drop) the evidence of calls beside it
        let untraced = Some("the snapshot is the bridge's own measurement: not traced");
        let (stdout, _, _) = match self
            .run_worker("environment", argv, None, output, cancel, untraced)
            .await
        {
            Ok(r) => r,
            Err(reply) => return Ok(reply),
        };
        let snapshot: Value = match serde_json::from_slice(&stdout) {
            Ok(v) => v,
            Err(e) => {
                return Ok(Reply::error(
                    format!("sandbox_environment: the worker's snapshot is not JSON: {e}"),
                    json!({}),
                ));
            }
        };
        let facets = snapshot["facets"].as_object().map_or(0, |f| f.len());
        let took = snapshot["took_ms"].as_u64().unwrap_or(0);
        Ok(Reply::ok(
            format!("environment: {facets} facets in {took} ms (structuredContent.snapshot)"),
            json!({"snapshot": snapshot}),
        ))
    }

    async fn sandbox_info(&self) -> Reply {
        let kernel = self.ctx.kernel.clone();
        let probe = tokio::task::spawn_blocking(move || kernel.status())
            .await
            .unwrap_or_else(|e| Err(e.to_string()));
        let p = &self.config.profile;
        let v = json!({
            "session": self.id(),
            "profile": p,
            "interface_fault": self.config.fault.map(InterfaceFault::name),
            "workdir": self.config.workdir,
            "default_timeout_ms": self.config.default_timeout.as_millis() as u64,
            "probe": match probe {
                Ok(s) => json!({"available": true, "status": s}),
                Err(reason) => crate::kernel::unavailable(&reason),
            },
        });
        Reply::ok(format!("profile {}: {}", p.name, p.description), v)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // background processes and the browser die with their session
        if let Ok(b) = self.browser.try_lock()
            && let Some(b) = b.as_ref()
        {
            b.kill_now();
        }
        for p in self
            .processes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            p.kill_now();
        }
    }
}

fn label(tool: &str, argv: &[OsString]) -> String {
    let words: Vec<String> = argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut s = format!("{tool}: {}", words.join(" "));
    if s.len() > 200 {
        let mut end = 200;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

/// Output bounds for a worker that answers one small JSON object.
fn small() -> Output {
    Output {
        cap: 1 << 20,
        stdout_hint: 0,
    }
}

fn output_cap(asked: Option<u64>) -> Result<u64, ArgError> {
    match asked {
        Some(n) if n > MAX_OUTPUT_CAP => Err(arg_error(
            "max_output_bytes",
            format!("{n} is above the bridge's limit of {MAX_OUTPUT_CAP}"),
        )),
        Some(n) => Ok(n),
        None => Ok(DEFAULT_OUTPUT_CAP),
    }
}
