//! Small helpers the facets share: errno names and reasons for what could
//! not be read.

use std::path::Path;

/// `EPERM`, `ENOSYS`, …: the name a person looks up (`errno 200` for one
/// this probe does not know).
pub fn errno_name(errno: i32) -> String {
    let e = nix::errno::Errno::from_raw(errno);
    if e == nix::errno::Errno::UnknownErrno {
        format!("errno {errno}")
    } else {
        format!("{e:?}")
    }
}

/// The errno name of an I/O error, or its text when it has none.
pub fn io_name(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => errno_name(n),
        None if e.kind() == std::io::ErrorKind::TimedOut => "timeout".into(),
        None => e.to_string(),
    }
}

/// Why a read failed, for `unreadable`: `ENOENT reading /proc/x`.
pub fn why(path: &Path, e: &std::io::Error) -> String {
    format!("{} reading {}", io_name(e), path.display())
}

/// A small text file (a /proc or /sys entry), or why it could not be read.
pub fn read_text(path: impl AsRef<Path>) -> Result<String, String> {
    let path = path.as_ref();
    std::fs::read_to_string(path).map_err(|e| why(path, &e))
}

/// A one-value /proc or /sys file, trimmed.
pub fn read_value(path: impl AsRef<Path>) -> Result<String, String> {
    read_text(path).map(|s| s.trim().to_string())
}

/// At most `max` characters of `s` (on a character boundary).
pub fn cut(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

/// An environment variable when set and not empty.
pub fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// A user's line of /etc/passwd, read from the file itself: NSS could
/// ask a directory server over the network.
pub struct Passwd {
    pub name: String,
    pub dir: String,
    pub shell: String,
}

pub fn passwd(uid: u32) -> Option<Passwd> {
    let text = std::fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.len() >= 7 && f[2].parse() == Ok(uid)).then(|| Passwd {
            name: f[0].to_string(),
            dir: f[5].to_string(),
            shell: f[6].to_string(),
        })
    })
}

/// The home directory: $HOME, else the passwd entry's.
pub fn home() -> Option<String> {
    env_nonempty("HOME").or_else(|| passwd(nix::unistd::geteuid().as_raw()).map(|u| u.dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_names_are_symbolic() {
        assert_eq!(errno_name(libc::EPERM), "EPERM");
        assert_eq!(errno_name(libc::EROFS), "EROFS");
        assert_eq!(errno_name(4000), "errno 4000");
        assert_eq!(cut("héllo", 2), "hé");
    }
}
