//! The `writable` facet: the places a workload writes to (cwd, home, /tmp,
//! caches), the mount each lives on, its flags and free space, and
//! whether this user may write there — asked of the kernel with
//! access(2), never by writing.

use std::path::Path;

use serde_json::json;

use super::util::{env_nonempty, errno_name, home};
use crate::env::Facet;

/// tmpfs's statfs magic, for when mountinfo cannot be read.
const TMPFS_MAGIC: i64 = 0x0102_1994;

pub fn facet() -> Facet {
    let mut f = Facet::new(
        "Each place's mount from /proc/self/mountinfo, its flags and free space from \
         statvfs, and faccessat(W_OK, AT_EACCESS) for this user.",
    );
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo");
    if let Err(e) = &mountinfo {
        f.cannot(
            "mountinfo",
            super::util::why(Path::new("/proc/self/mountinfo"), e),
        );
    }
    let mountinfo = mountinfo.unwrap_or_default();
    for (place, path) in places() {
        match path {
            Ok(path) => f.set(place, describe(&path, &mountinfo)),
            Err(why) => f.cannot(place, why),
        }
    }
    f
}

/// The places, each a path or why it has none.
fn places() -> Vec<(&'static str, Result<String, String>)> {
    let home = home();
    let mut out = vec![
        (
            "cwd",
            std::env::current_dir()
                .map(|p| p.display().to_string())
                .map_err(|e| format!("getcwd: {}", super::util::io_name(&e))),
        ),
        (
            "home",
            home.clone()
                .ok_or_else(|| "no $HOME and no passwd entry".into()),
        ),
        ("tmp", Ok("/tmp".into())),
    ];
    if let Some(t) = env_nonempty("TMPDIR").filter(|t| t.trim_end_matches('/') != "/tmp") {
        out.push(("tmpdir", Ok(t)));
    }
    out.push(("var_tmp", Ok("/var/tmp".into())));
    let cache = env_nonempty("XDG_CACHE_HOME")
        .or_else(|| home.map(|h| format!("{}/.cache", h.trim_end_matches('/'))));
    out.push((
        "cache",
        cache.ok_or_else(|| "no $XDG_CACHE_HOME and no home".into()),
    ));
    out
}

/// One place's value.
fn describe(path: &str, mountinfo: &str) -> serde_json::Value {
    let real = match std::fs::canonicalize(path) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return json!({"path": path, "exists": false});
        }
        Err(e) => {
            return json!({"path": path, "error": super::util::io_name(&e)});
        }
    };
    let mut v = json!({"path": path});
    let mount = mount_of(mountinfo, &real.display().to_string());
    if let Some(m) = &mount {
        v["mount"] = json!(m.mount_point);
        v["fstype"] = json!(m.fstype);
    }
    match nix::sys::statvfs::statvfs(&real) {
        Ok(s) => {
            use nix::sys::statvfs::FsFlags;
            let flags = s.flags();
            v["read_only"] = json!(flags.contains(FsFlags::ST_RDONLY));
            v["noexec"] = json!(flags.contains(FsFlags::ST_NOEXEC));
            v["nosuid"] = json!(flags.contains(FsFlags::ST_NOSUID));
            // (the widths of these differ by libc and target)
            #[allow(clippy::unnecessary_cast)]
            let (blocks, size, inodes) = (
                s.blocks_available() as u64,
                s.fragment_size() as u64,
                s.files_available() as u64,
            );
            v["free_bytes"] = json!(blocks.saturating_mul(size));
            v["free_inodes"] = json!(inodes);
        }
        Err(e) => v["statvfs"] = json!(errno_name(e as i32)),
    }
    let tmpfs = match &mount {
        Some(m) => m.fstype == "tmpfs",
        // (f_type's width differs by libc and target)
        #[allow(clippy::unnecessary_cast)]
        None => nix::sys::statfs::statfs(&real)
            .is_ok_and(|s| s.filesystem_type().0 as i64 == TMPFS_MAGIC),
    };
    v["tmpfs"] = json!(tmpfs);
    v["writable"] = json!(writable(&real));
    v
}

/// `ok` or the errno access(2) gives for writing as this process's
/// effective user (EROFS on a read-only mount, whatever the mode says).
fn writable(path: &Path) -> String {
    use nix::fcntl::AtFlags;
    use nix::unistd::{AccessFlags, faccessat};
    match faccessat(
        nix::fcntl::AT_FDCWD,
        path,
        AccessFlags::W_OK,
        AtFlags::AT_EACCESS,
    ) {
        Ok(()) => "ok".into(),
        Err(e) => errno_name(e as i32),
    }
}

/// One mount as mountinfo describes it.
#[derive(Debug, PartialEq)]
pub struct Mount {
    pub mount_point: String,
    pub fstype: String,
}

/// The mount holding `path` (absolute, symlinks resolved): the longest
/// matching mount point; the later one wins a tie, as it covers the
/// earlier.
pub fn mount_of(mountinfo: &str, path: &str) -> Option<Mount> {
    let mut best: Option<Mount> = None;
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(mp) = left.split(' ').nth(4).map(unescape) else {
            continue;
        };
        let inside = path == mp
            || mp == "/"
            || path
                .strip_prefix(&mp)
                .is_some_and(|rest| rest.starts_with('/'));
        if inside
            && best
                .as_ref()
                .is_none_or(|b| mp.len() >= b.mount_point.len())
        {
            best = Some(Mount {
                mount_point: mp,
                fstype: right.split(' ').next().unwrap_or("").to_string(),
            });
        }
    }
    best
}

/// mountinfo escapes space, tab, newline and backslash as \ooo.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = |j: usize| b.get(j).is_some_and(|c| (b'0'..=b'7').contains(c));
        if b[i] == b'\\' && octal(i + 1) && octal(i + 2) && octal(i + 3) {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:25 / /tmp rw,nosuid,nodev shared:2 - tmpfs tmpfs rw
31 30 0:26 / /tmp/exec rw,nosuid shared:3 - tmpfs tmpfs rw
32 22 0:27 / /mnt/my\\040dir ro,noexec - overlay overlay ro
33 22 0:28 / /tmp rw - 9p none rw
";

    #[test]
    fn places_find_their_mount() {
        let m = |p| mount_of(INFO, p).map(|m| (m.mount_point, m.fstype));
        // the later /tmp mount covers the earlier one
        assert_eq!(m("/tmp/x"), Some(("/tmp".into(), "9p".into())));
        assert_eq!(m("/tmp/exec/y"), Some(("/tmp/exec".into(), "tmpfs".into())));
        assert_eq!(m("/tmpfoo"), Some(("/".into(), "ext4".into())));
        assert_eq!(
            m("/mnt/my dir/z"),
            Some(("/mnt/my dir".into(), "overlay".into()))
        );
        assert_eq!(mount_of("", "/x"), None);
    }

    #[test]
    fn tmp_is_described() {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let v = describe("/tmp", &info);
        assert_eq!(v["path"], "/tmp");
        assert!(v["writable"].is_string(), "{v}");
        assert!(v["free_bytes"].is_u64(), "{v}");
        let gone = describe("/no/such/place/xyz", &info);
        assert_eq!(gone["exists"], false);
    }

    #[test]
    fn every_place_is_there() {
        let f = facet();
        for key in ["cwd", "tmp", "var_tmp"] {
            assert!(
                f.items.contains_key(key) || f.unreadable.contains_key(key),
                "{key}"
            );
        }
    }
}
