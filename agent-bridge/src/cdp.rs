//! The Chrome DevTools Protocol over a pipe (`--remote-debugging-pipe`):
//! JSON messages separated by NUL bytes, Chromium reading fd 3 and writing
//! fd 4. The browser is a workload like any other, so its fds 3 and 4 are
//! its stdin and stdout pipes (`exec 3<&0 4>&1`): no port, no network
//! namespace to reach into.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

/// How long one command may take before the browser counts as not answering
/// (a tab whose renderer died answers nothing).
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Value, String>>>>>;

/// A connection to one browser.
pub struct Cdp {
    writer: tokio::sync::Mutex<pipe::Sender>,
    pending: Pending,
    next: AtomicU64,
    /// Targets whose renderer crashed (`Inspector.targetCrashed`), by session id.
    crashed: Arc<Mutex<Vec<String>>>,
}

impl Cdp {
    /// Speaks CDP on `to` (the browser's fd 3) and `from` (its fd 4).
    pub fn new(to: pipe::Sender, from: pipe::Receiver) -> Cdp {
        let pending: Pending = Arc::default();
        let crashed: Arc<Mutex<Vec<String>>> = Arc::default();
        tokio::spawn(read_loop(from, pending.clone(), crashed.clone()));
        Cdp {
            writer: tokio::sync::Mutex::new(to),
            pending,
            next: AtomicU64::new(1),
            crashed,
        }
    }

    /// Sends `method` (to the page of `session`, or the browser) and waits
    /// for its result; the protocol's error message, or why none came.
    pub async fn call(
        &self,
        method: &str,
        params: Value,
        session: Option<&str>,
    ) -> Result<Value, String> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            message["sessionId"] = s.into();
        }
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, tx);
        let mut bytes = serde_json::to_vec(&message).expect("JSON");
        bytes.push(0);
        let sent = self.writer.lock().await.write_all(&bytes).await;
        let answer = match sent {
            Err(e) => Err(format!("the browser's pipe is closed: {e}")),
            Ok(()) => match tokio::time::timeout(COMMAND_TIMEOUT, rx).await {
                Err(_) => Err(format!(
                    "the browser did not answer {method} within {} s",
                    COMMAND_TIMEOUT.as_secs()
                )),
                Ok(Err(_)) => Err("the browser exited".to_string()),
                Ok(Ok(a)) => a,
            },
        };
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        answer
    }

    /// The page of `session` crashed (its renderer died).
    pub fn crashed(&self, session: &str) -> bool {
        self.crashed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|s| s == session)
    }
}

async fn read_loop(mut from: pipe::Receiver, pending: Pending, crashed: Arc<Mutex<Vec<String>>>) {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 256 * 1024];
    while let Ok(n @ 1..) = from.read(&mut chunk).await {
        buf.extend_from_slice(&chunk[..n]);
        while let Some(end) = buf.iter().position(|&b| b == 0) {
            let message: Vec<u8> = buf.drain(..=end).collect();
            let Ok(v) = serde_json::from_slice::<Value>(&message[..end]) else {
                continue;
            };
            match v["id"].as_u64() {
                Some(id) => {
                    let answer = match v.get("error") {
                        Some(e) => Err(e["message"].as_str().unwrap_or("error").to_string()),
                        None => Ok(v["result"].clone()),
                    };
                    let tx = pending
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&id);
                    if let Some(tx) = tx {
                        let _ = tx.send(answer);
                    }
                }
                None if v["method"] == "Inspector.targetCrashed" => {
                    if let Some(s) = v["sessionId"].as_str() {
                        crashed
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(s.to_string());
                    }
                }
                None => {}
            }
        }
    }
    // the browser is gone: nobody answers the rest
    pending.lock().unwrap_or_else(|p| p.into_inner()).clear();
}
