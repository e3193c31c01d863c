//! `campaign shrink`: the smallest input that still breaks the same way.
//!
//! A step whose bytes did not survive is re-run with smaller and simpler
//! payloads through the same target (and adapter) until the smallest one
//! that still comes back mangled the same way (the same [`mangle`] kind)
//! is found: first the length is bisected, then, when one byte is to
//! blame, every byte value is tried on its own. The finding reads as a
//! person would say it: "one byte 0x00 is enough", "any byte ≥ 0x80
//! fails alone", "any 65,537 bytes fail: cut after 65,536".
//!
//! Two channels carry bytes: a command's stdout (an exec or run_code step
//! that expects exact output; candidates are printed with `printf`), and a
//! file written and read back (a read_file step that expects the bytes an
//! earlier write_file sent).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde::Serialize;
use serde_json::{Value, json};

use super::adapter::Adapter;
use super::mangle::{self, Mangle, count, escaped};
use super::spec::{Step, TestSpec};
use super::target::{Connection, Target};
use contract::bytes::{base64_decode, base64_encode, sha256_hex};

/// Longest candidate printed with `printf` (its octal escapes must fit in
/// one argument of `sh -c`, at most 128 KiB).
const PRINTF_MAX: usize = 16 << 10;

/// Where the bytes travel.
#[derive(Debug, Clone)]
pub enum Channel {
    /// A command's stdout; `original` is the exec's command line, used to
    /// rebuild prefixes too long for printf (`{ CMD ; } | head -c N`).
    Stdout { original: Option<String> },
    /// write_file to `path` (text when `as_text` and the bytes are UTF-8),
    /// then read_file.
    File { path: String, as_text: bool },
}

/// What was found.
#[derive(Debug, Serialize)]
pub struct Finding {
    pub test_id: String,
    pub step: usize,
    pub channel: &'static str,
    pub kind: String,
    /// The finding in words.
    pub cause: String,
    pub original_bytes: usize,
    #[serde(serialize_with = "as_escaped")]
    pub minimal: Vec<u8>,
    #[serde(serialize_with = "as_escaped")]
    pub came_back: Vec<u8>,
    /// Byte values that fail on their own, when one byte is enough.
    pub failing_bytes: Vec<u8>,
    pub calls: usize,
}

fn as_escaped<S: serde::Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&b.escape_ascii().to_string())
}

/// The bytes a step carries, and the channel they travel on.
#[derive(Debug, Clone)]
pub struct StepBytes {
    pub channel: Channel,
    pub bytes: Vec<u8>,
}

/// The bytes a step carries and where, from the test's steps.
pub fn channel_of(test: &TestSpec, step: usize) -> anyhow::Result<StepBytes> {
    let s = test
        .steps
        .get(step)
        .with_context(|| format!("{} has no step {step}", test.id))?;
    let e = &s.expect;
    if matches!(s.tool.as_str(), "exec" | "run_code") {
        let want = match (&e.stdout_base64, &e.stdout_equals) {
            (Some(b), _) => base64_decode(b).map_err(anyhow::Error::msg)?,
            (None, Some(t)) => t.as_bytes().to_vec(),
            _ => bail!(
                "step {step} ({}) expects no exact stdout: there are no bytes to shrink",
                s.tool
            ),
        };
        let original = (s.tool == "exec")
            .then(|| s.arguments.get("command").and_then(Value::as_str))
            .flatten()
            .map(String::from);
        return Ok(StepBytes {
            channel: Channel::Stdout { original },
            bytes: want,
        });
    }
    // a write whose bytes came back wrong: the read of the same file that follows
    if s.tool == "write_file"
        && let Some(path) = s.arguments.get("path")
        && let Some(read) = test.steps[step..].iter().position(|r| {
            r.tool == "read_file"
                && r.arguments.get("path") == Some(path)
                && r.expect.sha256.is_some()
        })
    {
        return channel_of(test, step + read);
    }
    if s.tool == "read_file"
        && let Some(want) = &e.sha256
    {
        for w in test.steps[..step].iter().filter(|w| w.tool == "write_file") {
            let (bytes, as_text) =
                match (w.arguments.get("text"), w.arguments.get("content_base64")) {
                    (Some(Value::String(t)), _) => (t.as_bytes().to_vec(), true),
                    (_, Some(Value::String(b))) => {
                        (base64_decode(b).map_err(anyhow::Error::msg)?, false)
                    }
                    _ => continue,
                };
            if sha256_hex(&bytes).eq_ignore_ascii_case(want) {
                let path = w
                    .arguments
                    .get("path")
                    .and_then(Value::as_str)
                    .with_context(|| {
                        format!("step {step}: the write_file that sent the bytes has no text path")
                    })?;
                return Ok(StepBytes {
                    channel: Channel::File {
                        path: path.to_string(),
                        as_text,
                    },
                    bytes,
                });
            }
        }
        bail!("step {step} reads bytes no earlier write_file of the test sent: nothing to shrink");
    }
    bail!(
        "step {step} ({}) carries no bytes to shrink: only a command's stdout (exec, run_code) or a file written and read back",
        s.tool
    )
}

/// Where candidate `n` is written: beside the original, with its
/// extension (a server may treat `.pdf` or `.png` files apart).
fn shrink_path(path: &str, n: usize) -> String {
    let p = std::path::Path::new(path);
    match (p.file_stem(), p.extension()) {
        (Some(stem), Some(ext)) => p
            .with_file_name(format!(
                "{}.shrink-{n}.{}",
                stem.to_string_lossy(),
                ext.to_string_lossy()
            ))
            .to_string_lossy()
            .into_owned(),
        _ => format!("{path}.shrink-{n}"),
    }
}

/// `printf` arguments that print exactly `data` (octal escapes but for
/// letters and digits).
fn printf_command(data: &[u8]) -> String {
    let mut f = String::with_capacity(data.len() * 4 + 10);
    f.push_str("printf '");
    for &b in data {
        if b.is_ascii_alphanumeric() {
            f.push(b as char);
        } else {
            f.push_str(&format!("\\{b:03o}"));
        }
    }
    f.push('\'');
    f
}

/// One session with the target, for many candidate payloads.
pub struct Oracle<'a> {
    target: &'a Target,
    adapter: Option<&'a Adapter>,
    channel: Channel,
    conn: Option<Connection>,
    pub calls: usize,
    max_calls: usize,
    /// Candidates already tried (prefix bisection and sweeps overlap).
    seen: BTreeMap<Vec<u8>, (Option<Mangle>, Vec<u8>)>,
}

impl<'a> Oracle<'a> {
    pub fn new(
        target: &'a Target,
        adapter: Option<&'a Adapter>,
        channel: Channel,
        max_calls: usize,
    ) -> Self {
        Oracle {
            target,
            adapter,
            channel,
            conn: None,
            calls: 0,
            max_calls,
            seen: BTreeMap::new(),
        }
    }

    /// The steps that carry `data` through the channel.
    fn steps(&self, data: &[u8], prefix_of: Option<usize>) -> anyhow::Result<Vec<Step>> {
        let step = |tool: &str, args: Value| Step {
            tool: tool.into(),
            arguments: serde_json::from_value(args).expect("an object"),
            expect: Default::default(),
        };
        Ok(match &self.channel {
            Channel::Stdout { original } => {
                let command = match (prefix_of, original) {
                    (_, _) if data.len() <= PRINTF_MAX => printf_command(data),
                    // one byte value over and over: made, not spelled out
                    _ if data.iter().all(|&b| b == data[0]) => format!(
                        "head -c {} /dev/zero | tr '\\0' '\\{:03o}'",
                        data.len(),
                        data[0]
                    ),
                    (Some(n), Some(cmd)) => format!("{{ {cmd} ; }} | head -c {n}"),
                    _ => bail!(
                        "a {}-byte candidate is too long to print with printf, and the step has no command line to cut",
                        count(data.len())
                    ),
                };
                vec![step(
                    "exec",
                    json!({"command": command, "timeout_ms": 30000}),
                )]
            }
            Channel::File { path, as_text } => {
                // a file of its own per candidate: what a server remembers
                // of a file (that it looked binary) must not carry over
                let path = shrink_path(path, self.calls);
                let content = match std::str::from_utf8(data) {
                    Ok(t) if *as_text => json!({"path": path, "text": t}),
                    _ => json!({"path": path, "content_base64": base64_encode(data)}),
                };
                vec![
                    step("write_file", content),
                    step("read_file", json!({"path": path})),
                ]
            }
        })
    }

    /// Sends one step, through the adapter if any; the result in the
    /// bridge's shape.
    async fn send(&mut self, step: &Step) -> anyhow::Result<Value> {
        if self.conn.is_none() {
            self.conn = Some(self.target.connect().await?);
        }
        let conn = self.conn.as_ref().expect("connected");
        let wait = Duration::from_secs(60);
        let answer = match self.adapter {
            Some(a) => {
                let p = a.prepare(step).map_err(|u| {
                    anyhow::anyhow!("the target cannot express the candidate: {}", u.0)
                })?;
                super::run::send_adapted(conn, a, step, (p.tool, p.arguments), wait, None).await
            }
            None => {
                let args = step.arguments.clone().into_iter().collect();
                conn.call(&step.tool, args, wait, None)
                    .await
                    .map(|r| serde_json::to_value(r).unwrap_or(Value::Null))
            }
        };
        match answer {
            Ok(r) => Ok(r),
            Err(e) => {
                // the next candidate gets a new session
                if let Some(c) = self.conn.take() {
                    c.close().await;
                }
                bail!("{e}")
            }
        }
    }

    /// What came back for `data`, and how it differs from `data`.
    pub async fn attempt(
        &mut self,
        data: &[u8],
        prefix_of: Option<usize>,
    ) -> anyhow::Result<(Option<Mangle>, Vec<u8>)> {
        if let Some(known) = self.seen.get(data) {
            return Ok(known.clone());
        }
        if self.calls >= self.max_calls {
            bail!("gave up after {} calls (--max-calls)", self.calls);
        }
        self.calls += 1;
        let mut got = Vec::new();
        let mut refused = None;
        for step in self.steps(data, prefix_of)? {
            let r = match self.send(&step).await {
                Ok(r) => r,
                // a candidate the target cannot take (bytes that are not
                // UTF-8 for a text-only tool) does not fail the same way
                Err(e) if e.to_string().contains("cannot express the candidate") => {
                    let nothing = (None, Vec::new());
                    self.seen.insert(data.to_vec(), nothing.clone());
                    return Ok(nothing);
                }
                Err(e) => return Err(e),
            };
            // a refusal is a way of failing too: "Cannot read binary file"
            if let Some(why) = r["structuredContent"]["refused"].as_str() {
                refused = Some(why.to_string());
                break;
            }
            if r["isError"] == Value::Bool(true) {
                bail!(
                    "the target answered {} with an error: {}",
                    step.tool,
                    r["structuredContent"]["error"]["message"]
                );
            }
            got = returned_bytes(&step.tool, &r)
                .with_context(|| format!("{}: no bytes in the result", step.tool))?;
        }
        let m = match refused {
            // the refusal's first words are its kind: a write refused is
            // not the read refusal being shrunk
            Some(why) => Some(Mangle {
                kind: format!(
                    "refused: {}",
                    why.split_whitespace().take(4).collect::<Vec<_>>().join(" ")
                ),
                description: format!("the server refused: {why}"),
            }),
            None => mangle::describe(data, &got),
        };
        self.seen.insert(data.to_vec(), (m.clone(), got.clone()));
        Ok((m, got))
    }

    /// `data` comes back mangled as `kind`. A candidate mangled some other
    /// way is tried twice more: a server that sometimes loses output (a
    /// race) must not make a byte look harmless.
    async fn fails(
        &mut self,
        data: &[u8],
        kind: &str,
        prefix_of: Option<usize>,
    ) -> anyhow::Result<bool> {
        for _ in 0..3 {
            match self.attempt(data, prefix_of).await?.0 {
                Some(m) if m.kind == kind => return Ok(true),
                Some(_) => {
                    self.seen.remove(data);
                }
                None => return Ok(false),
            }
        }
        Ok(false)
    }

    pub async fn close(self) {
        if let Some(c) = self.conn {
            c.close().await;
        }
    }
}

/// The bytes a result carries: stdout's payload, or read_file's blob.
fn returned_bytes(tool: &str, r: &Value) -> Option<Vec<u8>> {
    if tool == "read_file" {
        let blob = r["content"]
            .as_array()?
            .iter()
            .find_map(|b| b["resource"]["blob"].as_str())?;
        return base64_decode(blob).ok();
    }
    if tool == "write_file" {
        return Some(Vec::new());
    }
    let p = &r["structuredContent"]["stdout"];
    match (&p["text"], &p["base64"]) {
        (Value::String(t), _) => Some(t.as_bytes().to_vec()),
        (_, Value::String(b)) => base64_decode(b).ok(),
        _ => None,
    }
}

/// Byte values as ranges: `0x00`, `0x80–0xff`.
fn ranges(bytes: &[u8]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let mut j = i;
        while j + 1 < bytes.len() && bytes[j + 1] == bytes[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            format!("0x{:02x}", bytes[i])
        } else {
            format!("0x{:02x}–0x{:02x}", bytes[i], bytes[j])
        });
        i = j + 1;
    }
    out.join(", ")
}

/// Shrinks `original` on `oracle`'s channel.
pub async fn shrink(
    oracle: &mut Oracle<'_>,
    test_id: &str,
    step: usize,
    original: &[u8],
) -> anyhow::Result<Finding> {
    let channel = match oracle.channel {
        Channel::Stdout { .. } => "stdout",
        Channel::File { .. } => "file",
    };
    let (m, _) = oracle.attempt(original, Some(original.len())).await?;
    let Some(m) = m else {
        bail!(
            "the {}-byte payload of step {step} came back intact this time: the failure does not reproduce",
            count(original.len())
        );
    };
    let kind = m.kind.clone();
    // 1. the shortest prefix that still fails (an empty one cannot)
    let (mut lo, mut hi) = (0, original.len());
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if oracle.fails(&original[..mid], &kind, Some(mid)).await? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let prefix = original[..hi].to_vec();
    let finding =
        |minimal: Vec<u8>, came_back: Vec<u8>, cause: String, failing: Vec<u8>, calls| Finding {
            test_id: test_id.into(),
            step,
            channel,
            kind: kind.clone(),
            cause,
            original_bytes: original.len(),
            minimal,
            came_back,
            failing_bytes: failing,
            calls,
        };
    // 2. any bytes of that length: a length limit
    if hi > 8 {
        let plain = vec![b'a'; hi];
        if let (Some(pm), back) = oracle.attempt(&plain, None).await?
            && pm.kind == kind
        {
            let cause = format!("any {} bytes fail: {}", count(hi), pm.description);
            return Ok(finding(plain, back, cause, Vec::new(), oracle.calls));
        }
    }
    // 3. the last byte of the prefix is to blame: alone, or amid letters?
    let last = prefix[hi - 1];
    for context in [
        (&b""[..], &b""[..]),
        (&b"a"[..], &b"a"[..]),
        (&b"a"[..], &b""[..]),
    ] {
        let with = |b: u8| [context.0, &[b][..], context.1].concat();
        if !oracle.fails(&with(last), &kind, None).await? {
            continue;
        }
        let mut failing = Vec::new();
        for b in 0..=255u8 {
            if oracle.fails(&with(b), &kind, None).await? {
                failing.push(b);
            }
        }
        let (m, back) = oracle.attempt(&with(last), None).await?;
        let what = m.map(|m| m.description).unwrap_or_default();
        let cause = match failing.as_slice() {
            [b] => format!("one byte 0x{b:02x} is enough: {what}"),
            all if all == (0x80..=0xff).collect::<Vec<u8>>() => {
                format!("any byte ≥ 0x80 fails alone: {what}")
            }
            all => format!("bytes {} fail alone: {what}", ranges(all)),
        };
        return Ok(finding(with(last), back, cause, failing, oracle.calls));
    }
    // 4. several bytes together: the shortest suffix of the prefix that fails
    let (mut lo, mut hi2) = (0, hi - 1);
    while hi2 > lo {
        let mid = lo + (hi2 - lo).div_ceil(2);
        if oracle.fails(&prefix[mid..], &kind, None).await? {
            lo = mid;
        } else {
            hi2 = mid - 1;
        }
    }
    let minimal = prefix[lo..].to_vec();
    let (m, back) = oracle.attempt(&minimal, None).await?;
    let cause = format!(
        "the {} bytes {} are enough: {}",
        minimal.len(),
        escaped(&minimal),
        m.map(|m| m.description).unwrap_or_default()
    );
    Ok(finding(minimal, back, cause, Vec::new(), oracle.calls))
}

/// Stores a finding (replacing an earlier one of the same step).
pub fn store(conn: &rusqlite::Connection, run: &str, f: &Finding) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT OR REPLACE INTO campaign_shrinks (run, test_id, step, channel, kind, cause, minimal, came_back, calls, created_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        rusqlite::params![
            run,
            f.test_id,
            f.step as i64,
            f.channel,
            f.kind,
            f.cause,
            f.minimal,
            f.came_back,
            f.calls as i64,
            probe::clock::now_ms() as i64
        ],
    )?;
    Ok(())
}

/// The finding for people.
pub fn text(f: &Finding) -> String {
    format!(
        "{} step {} ({}): {}\n  smallest input: {} ({} bytes, from {})\n  came back:      {}\n  {} calls to the target\n",
        f.test_id,
        f.step,
        f.channel,
        f.cause,
        escaped(&f.minimal),
        count(f.minimal.len()),
        count(f.original_bytes),
        escaped(&f.came_back),
        f.calls
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printf_prints_every_byte_value() {
        let all: Vec<u8> = (0..=255u8).collect();
        let out = std::process::Command::new("sh")
            .args(["-c", &printf_command(&all)])
            .output()
            .unwrap();
        assert_eq!(out.stdout, all);
    }

    #[test]
    fn long_runs_of_one_byte_are_made_not_spelled_out() {
        let target: Target = "stdio:true".parse().unwrap();
        let o = Oracle::new(&target, None, Channel::Stdout { original: None }, 1);
        let data = vec![b'a'; 100_000];
        let step = &o.steps(&data, None).unwrap()[0];
        let cmd = step.arguments["command"].as_str().unwrap();
        let out = std::process::Command::new("sh")
            .args(["-c", cmd])
            .output()
            .unwrap();
        assert_eq!(out.stdout, data, "{cmd}");
        assert!(o.steps(&[b'a', b'b'].repeat(10_000), None).is_err());
    }

    #[test]
    fn byte_ranges_read_as_people_write_them() {
        assert_eq!(ranges(&[0]), "0x00");
        assert_eq!(ranges(&[0x0d, 0x80, 0x81, 0x82]), "0x0d, 0x80–0x82");
    }
}
