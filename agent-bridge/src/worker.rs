//! `agent-bridge worker …`: the file tools' hands. The bridge runs file
//! operations in a child process under the session's profile and the probe,
//! exactly like `exec`, so a read-only or ephemeral path behaves the same
//! for `write_file` as for a shell, and the kernel evidence covers it.
//!
//! Protocol: `read` writes the raw bytes on stdout and `{"size":N}` (the
//! file's size) on stderr; `write`, `list` and `stat` write one JSON object
//! on stdout. On failure: one line on stderr, `ENAME: message`, and exit
//! status 2.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read as _, Seek as _, SeekFrom, Write as _};
use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{
    FileTypeExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _,
};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{Value, json};

/// Entries `list` returns at most.
pub const LIST_LIMIT: usize = 10_000;

pub fn main(args: &[OsString]) -> ExitCode {
    // started as /proc/self/exe, the kernel names us `exe`: say who we are
    // SAFETY: PR_SET_NAME with a NUL-terminated string.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"agent-bridge".as_ptr()) };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let name = e
                .raw_os_error()
                .map(|n| format!("{:?}", nix::errno::Errno::from_raw(n)))
                .unwrap_or_else(|| "EIO".into());
            let msg = e.to_string();
            let msg = msg.split(" (os error").next().unwrap_or(&msg);
            eprintln!("{name}: {msg}");
            ExitCode::from(2)
        }
    }
}

fn arg(args: &[OsString], i: usize) -> io::Result<&OsStr> {
    args.get(i)
        .map(OsString::as_os_str)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "worker: missing argument"))
}

fn num(args: &[OsString], i: usize) -> io::Result<Option<u64>> {
    let s = arg(args, i)?.to_string_lossy();
    if s == "-" {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "worker: bad number"))
}

fn run(args: &[OsString]) -> io::Result<()> {
    let op = arg(args, 0)?.to_string_lossy().into_owned();
    let path = PathBuf::from(arg(args, 1)?);
    if op == "read" {
        return read(&path, num(args, 2)?.unwrap_or(0), num(args, 3)?);
    }
    let mut stdout = io::stdout().lock();
    match op.as_str() {
        "write" => {
            let mode = num(args, 2)?.map(|m| m as u32);
            let append = arg(args, 3)? == "append";
            let size = write(&path, mode, append, &mut io::stdin().lock())?;
            writeln!(stdout, "{}", json!({"size": size}))
        }
        "list" => {
            let recursive = arg(args, 2)? == "recursive";
            writeln!(stdout, "{}", list(&path, recursive)?)
        }
        "stat" => writeln!(stdout, "{}", stat(&path)?),
        // the environment as a workload sees it; PATH holds the command names
        "env" => {
            let opts = probe::env::collect::Options {
                extra_commands: args[2..]
                    .iter()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect(),
                ..Default::default()
            };
            let snapshot = probe::env::collect::snapshot(&opts, "agent-bridge sandbox_environment");
            writeln!(stdout, "{}", json!(snapshot))
        }
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "worker: unknown op",
        )),
    }
}

fn read(path: &Path, offset: u64, length: Option<u64>) -> io::Result<()> {
    let mut f = File::open(path)?;
    let meta = f.metadata()?;
    if meta.is_dir() {
        return Err(io::Error::from_raw_os_error(libc::EISDIR));
    }
    eprintln!("{}", json!({"size": meta.len()}));
    let length = length.unwrap_or(u64::MAX);
    let stdout = io::stdout();
    if meta.is_file() && send_file(&f, stdout.as_fd(), offset, length)? {
        return Ok(());
    }
    if offset > 0 {
        f.seek(SeekFrom::Start(offset))?;
    }
    let mut out = stdout.lock();
    io::copy(&mut f.take(length), &mut out)?;
    out.flush()
}

/// Sends a regular file's bytes from the page cache into the pipe to the
/// bridge (sendfile: no copy through this process, and a pipe's width per
/// wake-up where a read/write loop moves 8 KiB). False when this file
/// cannot be sent that way and nothing was sent.
fn send_file(f: &File, out: BorrowedFd<'_>, offset: u64, mut left: u64) -> io::Result<bool> {
    use nix::errno::Errno;
    let mut pos = i64::try_from(offset).map_err(|_| Errno::EINVAL)?;
    let mut sent_any = false;
    while left > 0 {
        let chunk = left.min(1 << 30) as usize;
        match nix::sys::sendfile::sendfile64(out, f, Some(&mut pos), chunk) {
            Ok(0) => break,
            Ok(n) => {
                left -= n as u64;
                sent_any = true;
            }
            Err(Errno::EINTR) => {}
            Err(Errno::EINVAL | Errno::ENOSYS) if !sent_any => return Ok(false),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

/// Copies `input` into `f` (a splice from the bridge's pipe) and starts the
/// disk's writeback after every stretch, so the sync that follows waits for
/// the last stretch only: on this VM's disk, 64 MiB then syncs in ~8 ms
/// instead of ~40 ms.
fn copy_with_writeback(input: &mut impl io::Read, f: &mut File) -> io::Result<u64> {
    const STRETCH: u64 = 8 << 20;
    // where the writes land: 0 for a new file, the end for an append
    let start = f.metadata()?.len();
    let mut done = 0;
    loop {
        let n = io::copy(&mut (&mut *input).take(STRETCH), f)?;
        if n == 0 {
            return Ok(done);
        }
        // SAFETY: a syscall on an open fd. It only starts writeback, so a
        // failure (a filesystem without it) costs the early start, nothing else.
        unsafe {
            libc::sync_file_range(
                f.as_raw_fd(),
                (start + done) as libc::off64_t,
                n as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        };
        done += n;
    }
}

/// Writes to a temporary file beside `path` and renames it over, so a
/// failed write never leaves a partial file; appends go straight in.
fn write(
    path: &Path,
    mode: Option<u32>,
    append: bool,
    input: &mut impl io::Read,
) -> io::Result<u64> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent)?;
    }
    if append {
        let mut f = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(mode.unwrap_or(0o644))
            .open(path)?;
        copy_with_writeback(input, &mut f)?;
        f.sync_data()?;
        return Ok(f.metadata()?.len());
    }
    let mut tmp_name = OsString::from(".");
    tmp_name.push(path.file_name().unwrap_or(OsStr::new("file")));
    tmp_name.push(format!(".agent-bridge-{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode.unwrap_or(0o644))
            .open(&tmp)?;
        copy_with_writeback(input, &mut f)?;
        if let Some(m) = mode {
            // the umask must not change what the caller asked for
            f.set_permissions(fs::Permissions::from_mode(m))?;
        }
        f.sync_data()?;
        let size = f.metadata()?.len();
        fs::rename(&tmp, path)?;
        // open the final name for writing once: the probe remembers paths
        // a session wrote by their open, and the rename alone says nothing
        OpenOptions::new().write(true).open(path)?;
        Ok(size)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn kind(t: fs::FileType) -> &'static str {
    if t.is_file() {
        "file"
    } else if t.is_dir() {
        "dir"
    } else if t.is_symlink() {
        "symlink"
    } else if t.is_fifo() {
        "fifo"
    } else if t.is_socket() {
        "socket"
    } else if t.is_block_device() || t.is_char_device() {
        "device"
    } else {
        "other"
    }
}

/// A name as JSON: always a display name, plus base64 when it is not UTF-8.
fn name_fields(name: &OsStr) -> Value {
    let bytes = name.as_bytes();
    match std::str::from_utf8(bytes) {
        Ok(s) => json!({"name": s}),
        Err(_) => json!({
            "name": String::from_utf8_lossy(bytes),
            "name_base64": contract::bytes::base64_encode(bytes),
        }),
    }
}

fn stat(path: &Path) -> io::Result<Value> {
    let m = fs::symlink_metadata(path)?;
    let mut v = json!({
        "type": kind(m.file_type()),
        "size": m.len(),
        "mode": format!("{:04o}", m.mode() & 0o7777),
        "uid": m.uid(),
        "gid": m.gid(),
        "mtime_ms": m.mtime() * 1000 + m.mtime_nsec() / 1_000_000,
    });
    if m.file_type().is_symlink() {
        let target = fs::read_link(path)?;
        v["target"] = name_fields(target.as_os_str())["name"].clone();
    }
    Ok(v)
}

fn list(root: &Path, recursive: bool) -> io::Result<Value> {
    let mut entries = Vec::new();
    let mut stack = vec![PathBuf::new()];
    let mut truncated = false;
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let mut names: Vec<_> = fs::read_dir(&dir)?.filter_map(Result::ok).collect();
        names.sort_by_key(|e| e.file_name());
        for e in names {
            if entries.len() >= LIST_LIMIT {
                truncated = true;
                break;
            }
            let rel_path = rel.join(e.file_name());
            let Ok(m) = e.metadata() else { continue };
            let mut v = name_fields(rel_path.as_os_str());
            v["type"] = kind(m.file_type()).into();
            v["size"] = m.len().into();
            v["mode"] = format!("{:04o}", m.mode() & 0o7777).into();
            if recursive && m.is_dir() {
                stack.push(rel_path);
            }
            entries.push(v);
        }
    }
    Ok(json!({"entries": entries, "truncated": truncated}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_is_atomic_and_append_appends() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/out.bin");
        assert_eq!(
            write(&p, Some(0o600), false, &mut &b"\0\xff"[..]).unwrap(),
            2
        );
        assert_eq!(fs::read(&p).unwrap(), b"\0\xff");
        assert_eq!(fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
        assert_eq!(write(&p, None, true, &mut &b"x"[..]).unwrap(), 3);
        // no temporary file is left behind
        assert_eq!(fs::read_dir(p.parent().unwrap()).unwrap().count(), 1);
    }

    #[test]
    fn non_utf8_names_are_listed_losslessly() {
        let dir = tempfile::tempdir().unwrap();
        let raw = OsStr::from_bytes(b"bad\xffname");
        fs::write(dir.path().join(raw), b"").unwrap();
        fs::create_dir(dir.path().join("d")).unwrap();
        fs::write(dir.path().join("d/inner"), b"12").unwrap();
        let v = list(dir.path(), true).unwrap();
        let entries = v["entries"].as_array().unwrap();
        assert_eq!(entries.len(), 3, "{v}");
        let bad = entries
            .iter()
            .find(|e| e.get("name_base64").is_some())
            .unwrap();
        assert_eq!(
            contract::bytes::base64_decode(bad["name_base64"].as_str().unwrap()).unwrap(),
            b"bad\xffname"
        );
        assert!(
            entries
                .iter()
                .any(|e| e["name"] == "d/inner" && e["size"] == 2)
        );
    }
}
