//! The background-process tools: start_process, poll_process, write_stdin
//! and kill_process (the process registry is [`crate::process`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;

use super::{Reply, Session, label};
use crate::process::Background;
use crate::workload::Spec;
use contract::tools::{self, ArgError, arg_error};

impl Session {
    pub(super) async fn start_process(
        &self,
        args: Option<rmcp::model::JsonObject>,
    ) -> Result<Reply, ArgError> {
        let a: tools::StartProcessArgs = tools::parse(args)?;
        let argv = tools::command_line(&a.argv, &a.command)?;
        let command = probe::tee::command_line(&argv);
        let spec = Spec {
            label: label("process", &argv),
            argv,
            cwd: self.cwd(&a.cwd)?,
            env: tools::environment(&a.env)?,
            stdin_pipe: true,
            own_binary: false,
            untraced: None,
        };
        let running = match self.ctx.start(spec, self.next_call()).await {
            Ok(r) => r,
            Err(e) => return Ok(Reply::error(e.0, json!({}))),
        };
        let id = self.next_process.fetch_add(1, Ordering::Relaxed);
        let pid = running.pid;
        let bg = Background::spawn(running, command);
        self.processes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, bg);
        Ok(Reply::ok(
            format!("started process {id} (pid {pid})"),
            json!({"id": id, "pid": pid}),
        ))
    }

    fn process(&self, id: u64) -> Result<Arc<Background>, ArgError> {
        self.processes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
            .ok_or_else(|| arg_error("id", format!("no process {id} in this session")))
    }

    pub(super) async fn poll_process(
        &self,
        args: Option<rmcp::model::JsonObject>,
    ) -> Result<Reply, ArgError> {
        let a: tools::PollProcessArgs = tools::parse(args)?;
        let p = self.process(a.id)?;
        let wait = Duration::from_millis(a.wait_ms.unwrap_or(0).min(30_000));
        let cursors = (a.stdout_cursor.unwrap_or(0), a.stderr_cursor.unwrap_or(0));
        let snap = p.poll(cursors, wait).await;
        let mut v = json!({"id": a.id, "pid": p.pid, "running": snap.ended.is_none()});
        for (name, (data, cursor, truncated)) in [("stdout", snap.stdout), ("stderr", snap.stderr)]
        {
            let mut payload = serde_json::to_value(self.payload(data, 0)).unwrap_or_default();
            payload["cursor"] = cursor.into();
            payload["buffer_full"] = truncated.into();
            v[name] = payload;
        }
        let summary = match &snap.ended {
            Some(end) => {
                v["exit_code"] = json!(end.exit.code);
                v["signal"] = json!(end.exit.signal);
                v["duration_ms"] = json!(end.duration.as_secs_f64() * 1000.0);
                v["kernel"] = end.kernel.clone();
                format!("process {} {}", a.id, end.exit.describe())
            }
            None => format!("process {} is running", a.id),
        };
        Ok(Reply::ok(summary, v))
    }

    pub(super) async fn write_stdin(
        &self,
        args: Option<rmcp::model::JsonObject>,
    ) -> Result<Reply, ArgError> {
        let a: tools::WriteStdinArgs = tools::parse(args)?;
        let p = self.process(a.id)?;
        let data = if a.data_base64.is_none() && a.text.is_none() {
            Vec::new()
        } else {
            tools::content(("data_base64", &a.data_base64), ("text", &a.text))?
        };
        Ok(match p.write_stdin(&data, a.close == Some(true)).await {
            Ok(()) => Reply::ok(
                format!("wrote {} bytes", data.len()),
                json!({"id": a.id, "written": data.len(), "closed": a.close == Some(true)}),
            ),
            Err(e) => Reply::error(format!("process {}: {e}", a.id), json!({"id": a.id})),
        })
    }

    pub(super) async fn kill_process(
        &self,
        args: Option<rmcp::model::JsonObject>,
    ) -> Result<Reply, ArgError> {
        let a: tools::KillProcessArgs = tools::parse(args)?;
        let p = self.process(a.id)?;
        let name = a.signal.as_deref().unwrap_or("SIGKILL");
        let full = if name.starts_with("SIG") {
            name.to_string()
        } else {
            format!("SIG{name}")
        };
        let sig: nix::sys::signal::Signal = full.parse().map_err(|_| {
            arg_error(
                "signal",
                format!("`{name}` is not a signal name (e.g. SIGTERM)"),
            )
        })?;
        p.signal(sig).await;
        Ok(Reply::ok(
            format!("sent {full} to process {}", a.id),
            json!({"id": a.id, "signal": full}),
        ))
    }
}
