//! Mount lookups: which mount a path lives on, as seen by a process.

/// Whether `path` lies on a `noexec` mount, seen from `pid`'s mount
/// namespace, else from `fallback_pid`'s, else from ours. `None` when no
/// view could be read.
pub fn is_noexec(path: &str, pid: u32, fallback_pid: Option<u32>) -> Option<bool> {
    let candidates = [Some(pid), fallback_pid, None];
    for who in candidates.into_iter() {
        let proc_dir = match who {
            Some(p) => format!("/proc/{p}"),
            None => "/proc/self".to_string(),
        };
        let Ok(info) = std::fs::read_to_string(format!("{proc_dir}/mountinfo")) else {
            continue;
        };
        let Some(absolute) = absolute_in(path, &proc_dir) else {
            continue;
        };
        return mount_options_for(&info, &absolute)
            .map(|opts| opts.split(',').any(|o| o == "noexec"));
    }
    None
}

/// `path` made absolute against the cwd of the process at `proc_dir`
/// (`/proc/PID`): None when it is relative and that cwd is gone.
pub fn absolute_in(path: &str, proc_dir: &str) -> Option<String> {
    if path.starts_with('/') {
        return Some(path.to_string());
    }
    let cwd = std::fs::read_link(format!("{proc_dir}/cwd")).ok()?;
    Some(format!(
        "{}/{}",
        cwd.display().to_string().trim_end_matches('/'),
        path.trim_start_matches("./")
    ))
}

/// The per-mount options of the mount that holds `path` in a mountinfo text
/// (the longest matching mount point; the later one wins a tie, as it
/// covers the earlier).
pub fn mount_options_for(mountinfo: &str, path: &str) -> Option<String> {
    let mut best: Option<(usize, String)> = None;
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.len() < 6 {
            continue;
        }
        let mount_point = unescape(fields[4]);
        let inside = path == mount_point
            || mount_point == "/"
            || path
                .strip_prefix(&mount_point)
                .is_some_and(|rest| rest.starts_with('/'));
        if inside
            && best
                .as_ref()
                .is_none_or(|(len, _)| mount_point.len() >= *len)
        {
            best = Some((mount_point.len(), fields[5].to_string()));
        }
    }
    best.map(|(_, opts)| opts)
}

/// mountinfo escapes space, tab, newline and backslash as \ooo.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let oct: String = chars.by_ref().take(3).collect();
            if let Ok(v) = u8::from_str_radix(&oct, 8) {
                out.push(v as char);
                continue;
            }
            out.push('\\');
            out.push_str(&oct);
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:25 / /tmp rw,nosuid,nodev,noexec shared:2 - tmpfs tmpfs rw
31 30 0:26 / /tmp/exec rw,nosuid shared:3 - tmpfs tmpfs rw
32 22 0:27 / /mnt/my\\040dir ro,noexec - tmpfs tmpfs ro
";

    #[test]
    fn longest_mount_point_wins() {
        assert_eq!(
            mount_options_for(INFO, "/tmp/tool").as_deref(),
            Some("rw,nosuid,nodev,noexec")
        );
        assert_eq!(
            mount_options_for(INFO, "/tmp/exec/tool").as_deref(),
            Some("rw,nosuid")
        );
        assert_eq!(
            mount_options_for(INFO, "/tmpfoo/x").as_deref(),
            Some("rw,relatime")
        );
        assert_eq!(
            mount_options_for(INFO, "/mnt/my dir/x").as_deref(),
            Some("ro,noexec")
        );
    }
}
