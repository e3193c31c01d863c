//! The browser tools (browser_open, browser_text, browser_eval,
//! browser_screenshot, browser_click, browser_fill, browser_tabs,
//! browser_new_tab, browser_close_tab, browser_pdf, browser_download): one
//! Chromium per session, started
//! on first use as a workload under the session's profile (its own call
//! cgroup, memory limit included), driven over the DevTools protocol
//! ([`crate::cdp`]). Each call's kernel evidence is a span over the
//! browser's cgroup for the call's duration: a tab the OOM killer took
//! while the call "succeeded" is in it.

use std::ffi::OsString;
use std::sync::Arc;
use std::time::{Duration, Instant};

use probe::attribution::ExitStatus;
use rmcp::model::{ContentBlock, ResourceContents};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt as _;

use super::{Reply, Session};
use crate::cdp::Cdp;
use crate::cgroup::CallCgroups;
use crate::kernel::Span;
use crate::workload::{Live, Running, Spec};
use contract::bytes::{base64_decode, base64_encode, sha256_hex};
use contract::tools::{self, ArgError, arg_error};

/// How long a page may take to load, and a download to finish.
const LOAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Chromium as agents run it: headless at 1280x720, no sandbox of its own
/// (the profile is the sandbox), nothing of Google's, and no host name
/// resolves (pages are reached by address: nothing leaves the machine).
const CHROMIUM_FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--no-pings",
    "--disable-breakpad",
    "--window-size=1280,720",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.*",
    "--remote-debugging-pipe",
];

/// Where the browser's downloads land (inside its user data directory).
const DOWNLOADS: &str = "downloads";

struct Tab {
    target: String,
    session: String,
}

/// A session's browser.
pub(super) struct Browser {
    pid: u32,
    tree: Arc<CallCgroups>,
    cdp: Cdp,
    /// The user data directory; downloads go to its `downloads/`.
    user_data: std::path::PathBuf,
    tabs: Vec<Tab>,
    current: usize,
    exited: tokio::sync::watch::Receiver<bool>,
    /// The span over the browser's tree since its last call was answered:
    /// a tab the OOM killer takes while nobody asks is the next call's
    /// `before_call`.
    between: Option<Span>,
    _live: Live,
}

impl Browser {
    fn gone(&self) -> bool {
        *self.exited.borrow()
    }

    pub(super) fn kill_now(&self) {
        let (tree, pid) = (self.tree.clone(), self.pid);
        Running::kill_tree(&tree, pid);
    }

    fn tab(&self) -> Result<&Tab, String> {
        self.tabs
            .get(self.current)
            .ok_or_else(|| "no tab is open: open one with browser_open or browser_new_tab".into())
    }

    /// `script` (an expression) evaluated in the current tab: its value.
    async fn evaluate(&self, expression: &str) -> Result<Value, String> {
        let tab = self.tab()?;
        if self.cdp.crashed(&tab.session) {
            return Err("the tab crashed (its renderer died)".into());
        }
        let r = self
            .cdp
            .call(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
                Some(&tab.session),
            )
            .await
            .map_err(|e| self.crash_or(e))?;
        if let Some(ex) = r.get("exceptionDetails") {
            let what = ex["exception"]["description"]
                .as_str()
                .or(ex["text"].as_str())
                .unwrap_or("an exception");
            return Err(format!("the script threw: {what}"));
        }
        Ok(r["result"]["value"].clone())
    }

    /// The bytes a page method of the current tab returns as base64 `data`
    /// (a screenshot, a PDF).
    async fn tab_data(&self, method: &str, params: Value) -> Result<Vec<u8>, String> {
        let tab = self.tab()?;
        let r = self
            .cdp
            .call(method, params, Some(&tab.session))
            .await
            .map_err(|e| self.crash_or(e))?;
        base64_decode(r["data"].as_str().unwrap_or_default()).map_err(|e| e.to_string())
    }

    /// A failure in a tab whose renderer died says so.
    fn crash_or(&self, e: String) -> String {
        match self.tab() {
            Ok(t) if self.cdp.crashed(&t.session) => {
                format!("the tab crashed (its renderer died): {e}")
            }
            _ => e,
        }
    }

    async fn attach(&self, target: &str) -> Result<Tab, String> {
        let r = self
            .cdp
            .call(
                "Target.attachToTarget",
                json!({"targetId": target, "flatten": true}),
                None,
            )
            .await?;
        let session = r["sessionId"].as_str().unwrap_or_default().to_string();
        // crash notices come through the Inspector domain
        self.cdp
            .call("Inspector.enable", json!({}), Some(&session))
            .await?;
        // the viewport itself 1280x720 (a window of that size has less room)
        self.cdp
            .call(
                "Emulation.setDeviceMetricsOverride",
                json!({"width": 1280, "height": 720, "deviceScaleFactor": 1, "mobile": false}),
                Some(&session),
            )
            .await?;
        Ok(Tab {
            target: target.to_string(),
            session,
        })
    }

    async fn navigate(&self, url: &str) -> Result<(), String> {
        let tab = self.tab()?;
        let r = self
            .cdp
            .call("Page.navigate", json!({"url": url}), Some(&tab.session))
            .await
            .map_err(|e| self.crash_or(e))?;
        if let Some(e) = r["errorText"].as_str().filter(|e| !e.is_empty()) {
            return Err(format!("{e} at {url}"));
        }
        self.wait_loaded().await
    }

    async fn wait_loaded(&self) -> Result<(), String> {
        let started = Instant::now();
        loop {
            if self.evaluate("document.readyState").await? == "complete" {
                return Ok(());
            }
            if started.elapsed() > LOAD_TIMEOUT {
                return Err(format!(
                    "the page did not finish loading within {} s",
                    LOAD_TIMEOUT.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The current tab's title, url and text.
    async fn page(&self) -> Result<Value, String> {
        let v = self
            .evaluate(
                "({title: document.title, url: location.href, \
                  page_text: document.body ? document.body.innerText : ''})",
            )
            .await?;
        Ok(v)
    }

    async fn tab_list(&self) -> Result<String, String> {
        let r = self.cdp.call("Target.getTargets", json!({}), None).await?;
        let infos = r["targetInfos"].as_array().cloned().unwrap_or_default();
        let mut lines = Vec::new();
        for (i, t) in self.tabs.iter().enumerate() {
            let info = infos.iter().find(|x| x["targetId"] == t.target.as_str());
            let title = info.and_then(|x| x["title"].as_str()).unwrap_or("");
            let url = info.and_then(|x| x["url"].as_str()).unwrap_or("");
            let current = if i == self.current { " (current)" } else { "" };
            lines.push(format!("- {i}:{current} [{title}]({url})"));
        }
        Ok(lines.join("\n"))
    }
}

impl Session {
    /// Dispatches a browser tool; `None` for a name that is not one.
    pub(super) async fn browser_tool(
        &self,
        name: &str,
        args: Option<rmcp::model::JsonObject>,
    ) -> Option<Result<Reply, ArgError>> {
        let op = match name {
            "browser_open" => Op::Open(tools::parse::<tools::BrowserUrlArgs>(args).map(|a| a.url)),
            "browser_text" => Op::Text(tools::parse::<tools::NoArgs>(args).map(drop)),
            "browser_eval" => {
                Op::Eval(tools::parse::<tools::BrowserEvalArgs>(args).map(|a| a.script))
            }
            "browser_screenshot" => Op::Screenshot(
                tools::parse::<tools::BrowserScreenshotArgs>(args).and_then(|a| {
                    match a.format.as_deref().unwrap_or("png") {
                        f @ ("png" | "jpeg") => Ok(f.to_string()),
                        other => Err(arg_error("format", format!("`{other}`: png or jpeg"))),
                    }
                }),
            ),
            "browser_click" => {
                Op::Click(tools::parse::<tools::BrowserSelectorArgs>(args).map(|a| a.selector))
            }
            "browser_fill" => {
                Op::Fill(tools::parse::<tools::BrowserFillArgs>(args).map(|a| (a.selector, a.text)))
            }
            "browser_tabs" => Op::Tabs(tools::parse::<tools::NoArgs>(args).map(drop)),
            "browser_new_tab" => {
                Op::NewTab(tools::parse::<tools::BrowserUrlArgs>(args).map(|a| a.url))
            }
            "browser_close_tab" => {
                Op::CloseTab(tools::parse::<tools::BrowserTabArgs>(args).map(|a| a.index))
            }
            "browser_pdf" => Op::Pdf(tools::parse::<tools::NoArgs>(args).map(drop)),
            "browser_download" => {
                Op::Download(tools::parse::<tools::BrowserSelectorArgs>(args).map(|a| a.selector))
            }
            _ => return None,
        };
        Some(match op.checked() {
            Err(e) => Err(e),
            Ok(op) => Ok(self.browse(name, op).await),
        })
    }

    async fn browse(&self, name: &str, op: Checked) -> Reply {
        let mut slot = self.browser.lock().await;
        if slot.as_ref().is_some_and(Browser::gone) {
            *slot = None;
        }
        // what died since the last call, if the browser lives on
        // (a span that cannot be read is not one where nothing died)
        let before = match slot.as_mut().and_then(|b| b.between.take()) {
            Some(between) => self.ctx.kernel.end_between(&between).await,
            None => None,
        };
        // the launch is the first call's: its span covers the start
        let (span, started_now) = match slot.as_ref() {
            Some(b) => (
                self.ctx
                    .kernel
                    .begin_tree(&format!("{name} (browser)"), b.pid, b.tree.v2_dir(), None)
                    .await,
                false,
            ),
            None => match self.start_browser().await {
                Ok((b, span)) => {
                    *slot = Some(b);
                    (span, true)
                }
                Err(e) => return Reply::error(e, json!({})),
            },
        };
        let b = slot.as_mut().expect("a browser");
        let started = Instant::now();
        let result = if started_now && b.tabs.is_empty() {
            Err("the browser started but opened no page".to_string())
        } else {
            op.run(b).await
        };
        let exit = ExitStatus {
            code: Some(i32::from(result.is_err())),
            signal: None,
        };
        // what went wrong, in the browser's words: a witness for the probe
        let said = result.as_ref().err().map(|e| e.as_bytes());
        let words = probe::attribution::Words::new(Some(name.to_string()), said);
        let mut kernel = self
            .ctx
            .kernel
            .end_with_words(&span, Some(&exit), None, result.is_err(), &words)
            .await;
        let took = started.elapsed().as_secs_f64() * 1000.0;
        crate::kernel::attach_before_call(&mut kernel, before);
        if !b.gone() {
            b.between = Some(self.ctx.kernel.begin_between(b.pid, b.tree.v2_dir()).await);
        }
        match result {
            Ok(mut done) => {
                done.structured["kernel"] = kernel;
                done.structured["duration_ms"] = took.into();
                Reply {
                    content: done.content,
                    structured: done.structured,
                    is_error: false,
                }
            }
            Err(e) => Reply::error(e, json!({"kernel": kernel, "duration_ms": took})),
        }
    }

    /// Starts Chromium under the profile, with its first tab attached; the
    /// span of the call that started it.
    async fn start_browser(&self) -> Result<(Browser, Span), String> {
        let user_data = std::env::temp_dir().join(format!(
            "agent-bridge-browser-{}-{}",
            self.id(),
            self.next_call()
        ));
        let mut argv: Vec<OsString> = [
            "sh",
            "-c",
            "exec 3<&0 4>&1 >/dev/null \"$@\"",
            "sh",
            "chromium",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        argv.extend(CHROMIUM_FLAGS.iter().map(OsString::from));
        argv.push(format!("--user-data-dir={}", user_data.display()).into());
        argv.push("about:blank".into());
        let spec = Spec {
            label: "browser: chromium".into(),
            argv,
            cwd: None,
            env: Vec::new(),
            stdin_pipe: true,
            own_binary: false,
            untraced: None,
        };
        let running = self
            .ctx
            .start(spec, self.next_call())
            .await
            .map_err(|e| format!("the browser did not start: {}", e.0))?;
        let Running {
            pid,
            stdin,
            stdout,
            mut stderr,
            waiter,
            tree,
            span,
            live,
            ..
        } = running;
        let stdin = stdin.ok_or("the browser has no stdin pipe")?;
        let (tx, exited) = tokio::sync::watch::channel(false);
        let stderr_tail = Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let tail = stderr_tail.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 16 * 1024];
            while let Ok(n @ 1..) = stderr.read(&mut buf).await {
                let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
                t.extend_from_slice(&buf[..n]);
                let over = t.len().saturating_sub(4096);
                t.drain(..over);
            }
        });
        let (watch_tree, dir) = (tree.clone(), user_data.clone());
        tokio::spawn(async move {
            let _ = waiter.await;
            let _ = tx.send(true);
            let _ = tokio::task::spawn_blocking(move || {
                Running::kill_tree(&watch_tree, pid);
                let _ = std::fs::remove_dir_all(dir);
            })
            .await;
        });
        let mut b = Browser {
            pid,
            tree,
            cdp: Cdp::new(stdin, stdout),
            user_data,
            tabs: Vec::new(),
            current: 0,
            exited,
            between: None,
            _live: live,
        };
        let first = async {
            let r = b.cdp.call("Target.getTargets", json!({}), None).await?;
            let page = r["targetInfos"]
                .as_array()
                .and_then(|t| t.iter().find(|t| t["type"] == "page"))
                .and_then(|t| t["targetId"].as_str())
                .map(String::from)
                .ok_or("the browser has no page")?;
            b.attach(&page).await
        };
        match first.await {
            Ok(tab) => b.tabs.push(tab),
            Err(e) => {
                b.kill_now();
                let tail = stderr_tail
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                return Err(format!(
                    "the browser did not start: {e}; its stderr ended: {}",
                    String::from_utf8_lossy(&tail).trim()
                ));
            }
        }
        Ok((b, span))
    }
}

/// A browser tool's arguments, parsed.
enum Op {
    Open(Result<String, ArgError>),
    Text(Result<(), ArgError>),
    Eval(Result<String, ArgError>),
    Screenshot(Result<String, ArgError>),
    Click(Result<String, ArgError>),
    Fill(Result<(String, String), ArgError>),
    Tabs(Result<(), ArgError>),
    NewTab(Result<String, ArgError>),
    CloseTab(Result<usize, ArgError>),
    Pdf(Result<(), ArgError>),
    Download(Result<String, ArgError>),
}

/// [`Op`] with its arguments known to be good.
enum Checked {
    Open(String),
    Text,
    Eval(String),
    Screenshot(String),
    Click(String),
    Fill(String, String),
    Tabs,
    NewTab(String),
    CloseTab(usize),
    Pdf,
    Download(String),
}

impl Op {
    fn checked(self) -> Result<Checked, ArgError> {
        Ok(match self {
            Op::Open(a) => Checked::Open(a?),
            Op::Text(a) => Checked::Text.after(a)?,
            Op::Eval(a) => Checked::Eval(a?),
            Op::Screenshot(a) => Checked::Screenshot(a?),
            Op::Click(a) => Checked::Click(a?),
            Op::Fill(a) => {
                let (s, t) = a?;
                Checked::Fill(s, t)
            }
            Op::Tabs(a) => Checked::Tabs.after(a)?,
            Op::NewTab(a) => Checked::NewTab(a?),
            Op::CloseTab(a) => Checked::CloseTab(a?),
            Op::Pdf(a) => Checked::Pdf.after(a)?,
            Op::Download(a) => Checked::Download(a?),
        })
    }
}

/// What an operation answers, before its kernel evidence is added.
struct Done {
    content: Vec<ContentBlock>,
    structured: Value,
}

impl Done {
    fn text(summary: String, structured: Value) -> Done {
        Done {
            content: vec![ContentBlock::text(summary)],
            structured,
        }
    }

    /// Bytes the browser made (a screenshot, a PDF, a download): a line
    /// that names them, an image block for images, and always the exact
    /// bytes as an embedded resource blob with their size and digest.
    fn bytes(what: &str, uri: String, mime: &str, bytes: &[u8], mut structured: Value) -> Done {
        let b64 = base64_encode(bytes);
        let sha = sha256_hex(bytes);
        let mut content = vec![ContentBlock::text(format!(
            "{what}: {} bytes, {mime}, sha256 {sha}",
            bytes.len()
        ))];
        if mime.starts_with("image/") {
            content.push(ContentBlock::image(b64.clone(), mime.to_string()));
        }
        content.push(ContentBlock::resource(
            ResourceContents::BlobResourceContents {
                uri,
                mime_type: Some(mime.to_string()),
                blob: b64,
                meta: None,
            },
        ));
        structured["bytes"] = bytes.len().into();
        structured["size"] = bytes.len().into();
        structured["sha256"] = sha.into();
        structured["mime"] = mime.into();
        Done {
            content,
            structured,
        }
    }
}

/// A JavaScript string literal of `s` (JSON's is one).
fn js(s: &str) -> String {
    serde_json::to_string(s).expect("a string is JSON")
}

impl Checked {
    fn after(self, parsed: Result<(), ArgError>) -> Result<Checked, ArgError> {
        parsed.map(|()| self)
    }

    async fn run(self, b: &mut Browser) -> Result<Done, String> {
        match self {
            Checked::Open(url) => {
                b.navigate(&url).await?;
                page_done(b).await
            }
            Checked::Text => page_done(b).await,
            Checked::Eval(script) => {
                let v = b.evaluate(&format!("({script})()")).await?;
                let text = serde_json::to_string(&v).expect("JSON");
                Ok(Done::text(text.clone(), json!({"value": text})))
            }
            Checked::Screenshot(format) => {
                let bytes = b
                    .tab_data("Page.captureScreenshot", json!({"format": format}))
                    .await
                    .map_err(|e| format!("the screenshot: {e}"))?;
                Ok(Done::bytes(
                    "screenshot",
                    "browser://screenshot".into(),
                    &format!("image/{format}"),
                    &bytes,
                    json!({}),
                ))
            }
            Checked::Pdf => {
                let bytes = b
                    .tab_data("Page.printToPDF", json!({"printBackground": true}))
                    .await
                    .map_err(|e| format!("the PDF: {e}"))?;
                Ok(Done::bytes(
                    "pdf",
                    "browser://page.pdf".into(),
                    "application/pdf",
                    &bytes,
                    json!({}),
                ))
            }
            Checked::Download(selector) => {
                let (name, bytes) = download(b, &selector).await?;
                Ok(Done::bytes(
                    &format!("downloaded {name}"),
                    format!("browser://downloads/{name}"),
                    "application/octet-stream",
                    &bytes,
                    json!({"name": name}),
                ))
            }
            Checked::Click(selector) => {
                let sel = js(&selector);
                b.evaluate(&format!(
                    "(() => {{ const e = document.querySelector({sel}); \
                     if (!e) throw new Error('no element matches ' + {sel}); e.click(); return true; }})()"
                ))
                .await?;
                Ok(Done::text(format!("clicked {selector}"), json!({})))
            }
            Checked::Fill(selector, text) => {
                let (sel, value) = (js(&selector), js(&text));
                b.evaluate(&format!(
                    "(() => {{ const e = document.querySelector({sel}); \
                     if (!e) throw new Error('no element matches ' + {sel}); e.focus(); e.value = {value}; \
                     e.dispatchEvent(new Event('input', {{bubbles: true}})); \
                     e.dispatchEvent(new Event('change', {{bubbles: true}})); return true; }})()"
                ))
                .await?;
                Ok(Done::text(format!("filled {selector}"), json!({})))
            }
            Checked::Tabs => {
                let list = b.tab_list().await?;
                Ok(Done::text(
                    list.clone(),
                    json!({"page_text": list, "tabs": b.tabs.len()}),
                ))
            }
            Checked::NewTab(url) => {
                let r = b
                    .cdp
                    .call("Target.createTarget", json!({"url": "about:blank"}), None)
                    .await?;
                let target = r["targetId"].as_str().unwrap_or_default().to_string();
                let tab = b.attach(&target).await?;
                b.tabs.push(tab);
                b.current = b.tabs.len() - 1;
                b.navigate(&url).await?;
                page_done(b).await
            }
            Checked::CloseTab(index) => {
                let Some(tab) = b.tabs.get(index) else {
                    return Err(format!("no tab {index}: {} are open", b.tabs.len()));
                };
                b.cdp
                    .call("Target.closeTarget", json!({"targetId": tab.target}), None)
                    .await?;
                b.tabs.remove(index);
                b.current = b.tabs.len().saturating_sub(1);
                let list = b.tab_list().await?;
                Ok(Done::text(
                    list.clone(),
                    json!({"page_text": list, "tabs": b.tabs.len()}),
                ))
            }
        }
    }
}

/// Clicks `selector` and waits for the download it starts to finish:
/// Chromium writes `NAME.crdownload` and renames it to NAME when done.
/// The file is taken out of the directory, so the next download is new.
async fn download(b: &Browser, selector: &str) -> Result<(String, Vec<u8>), String> {
    let dir = b.user_data.join(DOWNLOADS);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    b.cdp
        .call(
            "Browser.setDownloadBehavior",
            json!({"behavior": "allow", "downloadPath": dir}),
            None,
        )
        .await?;
    let sel = js(selector);
    b.evaluate(&format!(
        "(() => {{ const e = document.querySelector({sel}); \
         if (!e) throw new Error('no element matches ' + {sel}); e.click(); return true; }})()"
    ))
    .await?;
    let started = Instant::now();
    // Chromium reserves the final name with an empty file before it
    // writes NAME.crdownload: an empty file is the download only once no
    // .crdownload is left and it stayed empty a while
    let mut empty_since: Option<Instant> = None;
    loop {
        let files: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .collect();
        let partial = |p: &std::path::PathBuf| p.extension().is_some_and(|x| x == "crdownload");
        let in_progress = files.iter().any(partial);
        let done = files
            .into_iter()
            .find(|p| !partial(p))
            .filter(|_| !in_progress)
            .filter(|p| {
                let empty = std::fs::metadata(p).is_ok_and(|m| m.len() == 0);
                if !empty {
                    return true;
                }
                empty_since.get_or_insert_with(Instant::now).elapsed() >= EMPTY_DOWNLOAD_SETTLE
            });
        if done.is_none() && in_progress {
            empty_since = None;
        }
        if let Some(path) = done {
            let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let _ = std::fs::remove_file(&path);
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            return Ok((name, bytes));
        }
        if started.elapsed() > LOAD_TIMEOUT {
            return Err(format!(
                "clicking {selector} started no download that finished within {} s",
                LOAD_TIMEOUT.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How long an empty downloaded file must stay empty, with no
/// `.crdownload` beside it, to be taken for an empty download.
const EMPTY_DOWNLOAD_SETTLE: Duration = Duration::from_secs(1);

async fn page_done(b: &Browser) -> Result<Done, String> {
    let p = b.page().await?;
    let summary = format!(
        "{} ({})\n{}",
        p["title"].as_str().unwrap_or(""),
        p["url"].as_str().unwrap_or(""),
        p["page_text"].as_str().unwrap_or("")
    );
    Ok(Done::text(summary, p))
}
/// The name a browser's profile directory starts with (in the temp dir):
/// `agent-bridge-browser-mcp-PID-…`, PID the bridge's.
const PROFILE_PREFIX: &str = "agent-bridge-browser-mcp-";

/// Removes the browser profiles in `dir` of bridges that are gone: one
/// killed (or stopped before its browser exited) cannot remove its own.
/// Only in the host's PID namespace, where the pids in the names are ones
/// this process can look up. Answers how many went.
pub fn remove_orphan_profiles(dir: &std::path::Path) -> usize {
    if !matches!(probe::loader::PidNamespace::current(), Ok(None)) {
        return 0;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let owner = name
            .strip_prefix(PROFILE_PREFIX)
            .and_then(|r| r.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok());
        let Some(owner) = owner else { continue };
        if std::path::Path::new("/proc")
            .join(owner.to_string())
            .exists()
        {
            continue;
        }
        if std::fs::remove_dir_all(e.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_of_bridges_that_are_gone_are_removed_and_others_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let gone_pid = gone.id();
        gone.wait().unwrap();
        let profile = |pid: u32| {
            dir.path()
                .join(format!("{PROFILE_PREFIX}{pid}-1796480254094-0-0"))
        };
        for pid in [gone_pid, std::process::id()] {
            std::fs::create_dir_all(profile(pid).join("Default")).unwrap();
        }
        let unrelated = dir.path().join("agent-bridge-browser-someone-else");
        std::fs::create_dir(&unrelated).unwrap();
        assert_eq!(remove_orphan_profiles(dir.path()), 1);
        assert!(!profile(gone_pid).exists());
        assert!(
            profile(std::process::id()).exists(),
            "a live bridge's is kept"
        );
        assert!(unrelated.exists());
    }
}
