//! Applying a profile to a workload: prepared in the parent, applied in the
//! child between fork and exec (after the probe attached it, so the probe
//! sees the setup), with nothing that allocates.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use seccompiler::BpfProgram;

use crate::profile::{Profile, RLIMITS, RlimitResource};

/// One mount in the workload's private mount namespace.
#[derive(Debug)]
struct Mount {
    /// What a failure reports, e.g. "mount /tmp read-only".
    step: String,
    source: CString,
    target: CString,
    fstype: Option<CString>,
    flags: libc::c_ulong,
    data: Option<CString>,
    /// Then remount the bind with these flags.
    remount: Option<libc::c_ulong>,
}

/// A profile made ready for the child.
#[derive(Debug, Default)]
pub struct Plan {
    mounts: Vec<Mount>,
    no_network: bool,
    rlimits: Vec<(RlimitResource, u64)>,
    ids: Option<(libc::uid_t, libc::gid_t)>,
    drop_caps: bool,
    filters: Vec<BpfProgram>,
    /// A seccomp rule names `execveat`: the file worker is then exec'd by
    /// path, not by fd (see `self_exec`), so the profile denies the
    /// workload's own execs, never the bridge's.
    pub denies_execveat: bool,
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::other("NUL in a path"))
}

impl Plan {
    /// Prepares `profile`; `disks` are the session's disk-limit tmpfs
    /// directories, one per `profile.disk_limit` entry.
    pub fn new(profile: &Profile, disks: &[PathBuf]) -> io::Result<Plan> {
        let bind = libc::MS_BIND | libc::MS_REC;
        let mut mounts = Vec::new();
        for (limit, source) in profile.disk_limit.iter().zip(disks) {
            std::fs::create_dir_all(&limit.path)?;
            mounts.push(Mount {
                step: format!("bind the session disk onto {}", limit.path.display()),
                source: cpath(source)?,
                target: cpath(&limit.path)?,
                fstype: None,
                flags: bind,
                data: None,
                remount: None,
            });
        }
        let tmpfs = |path: &Path, step: String, flags, data: &str| -> io::Result<Mount> {
            Ok(Mount {
                step,
                source: CString::new("tmpfs").unwrap(),
                target: cpath(path)?,
                fstype: Some(CString::new("tmpfs").unwrap()),
                flags: libc::MS_NOSUID | libc::MS_NODEV | flags,
                data: Some(CString::new(data).unwrap()),
                remount: None,
            })
        };
        for p in &profile.ephemeral {
            std::fs::create_dir_all(p)?;
            let step = format!("mount a fresh tmpfs on {}", p.display());
            mounts.push(tmpfs(p, step, 0, "size=256m,mode=1777")?);
        }
        for p in &profile.hidden {
            let step = format!("hide {} under an empty tmpfs", p.display());
            mounts.push(tmpfs(p, step, libc::MS_RDONLY, "size=4k,mode=0755")?);
        }
        let rebind = |path: &Path, step: String, flags| -> io::Result<Mount> {
            Ok(Mount {
                step,
                source: cpath(path)?,
                target: cpath(path)?,
                fstype: None,
                flags: bind,
                data: None,
                remount: Some(libc::MS_REMOUNT | libc::MS_BIND | flags),
            })
        };
        for p in &profile.read_only {
            let step = format!("mount {} read-only", p.display());
            mounts.push(rebind(p, step, libc::MS_RDONLY)?);
        }
        for p in &profile.noexec {
            let step = format!("mount {} noexec", p.display());
            mounts.push(rebind(p, step, libc::MS_NOEXEC | libc::MS_NOSUID)?);
        }
        let rlimits = profile
            .rlimits
            .iter()
            .map(|(name, v)| {
                let (_, res) = RLIMITS.iter().find(|(n, _)| n == name).expect("validated");
                (*res, *v)
            })
            .collect();
        let filters = profile
            .seccomp
            .iter()
            .map(|r| probe::fault::seccomp_filter(&r.action, &r.syscalls))
            .collect::<Result<_, _>>()
            .map_err(io::Error::other)?;
        Ok(Plan {
            mounts,
            no_network: profile.no_network,
            rlimits,
            ids: profile.uid.map(|u| (u, profile.gid.unwrap_or(u))),
            drop_caps: profile.drop_caps,
            filters,
            denies_execveat: profile
                .seccomp
                .iter()
                .any(|r| r.syscalls.iter().any(|s| s == "execveat")),
        })
    }

    /// Whether the workload sees the bridge's view of the files under the
    /// bridge's credentials: no mounts of its own, no other uid. Then the
    /// bridge can look a program up on PATH for it (see `workload`).
    pub fn sees_what_the_bridge_sees(&self) -> bool {
        self.mounts.is_empty() && self.ids.is_none()
    }

    /// Runs in the child, after fork, before exec. Async-signal-safe; on
    /// failure writes what failed to `report`. `cwd` is entered again after
    /// the mounts, so it resolves through them (the earlier chdir kept the
    /// directory beneath).
    pub fn apply(&self, report: RawFd, cwd: &CStr) -> io::Result<()> {
        let fail = |step: &str| {
            let err = io::Error::last_os_error();
            // SAFETY: write(2) of a valid buffer to an fd we own.
            unsafe { libc::write(report, step.as_ptr().cast(), step.len()) };
            err
        };
        // SAFETY (whole block): plain syscalls with valid pointers into
        // memory prepared before fork; nothing allocates.
        unsafe {
            if !self.mounts.is_empty() {
                if libc::unshare(libc::CLONE_NEWNS) != 0 {
                    return Err(fail("unshare a mount namespace"));
                }
                let root = c"/";
                if libc::mount(
                    std::ptr::null(),
                    root.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
                {
                    return Err(fail("make / private"));
                }
            }
            for m in &self.mounts {
                let opt = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
                if libc::mount(
                    m.source.as_ptr(),
                    m.target.as_ptr(),
                    opt(&m.fstype),
                    m.flags,
                    opt(&m.data).cast(),
                ) != 0
                {
                    return Err(fail(&m.step));
                }
                if let Some(flags) = m.remount {
                    // a bind takes its flags only from a remount of itself
                    if libc::mount(
                        std::ptr::null(),
                        m.target.as_ptr(),
                        std::ptr::null(),
                        flags,
                        std::ptr::null(),
                    ) != 0
                    {
                        return Err(fail(&m.step));
                    }
                }
            }
            if !self.mounts.is_empty() && libc::chdir(cwd.as_ptr()) != 0 {
                return Err(fail("enter the working directory after the mounts"));
            }
            if self.no_network {
                if libc::unshare(libc::CLONE_NEWNET) != 0 {
                    return Err(fail("unshare a network namespace"));
                }
                if !loopback_up() {
                    return Err(fail("bring loopback up"));
                }
            }
            for &(res, value) in &self.rlimits {
                let lim = libc::rlimit {
                    rlim_cur: value,
                    rlim_max: value,
                };
                if libc::setrlimit(res, &lim) != 0 {
                    return Err(fail("setrlimit"));
                }
            }
            if self.drop_caps {
                // an empty bounding set: exec cannot hand root its caps back
                let mut cap = 0;
                while libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) == 0 {
                    cap += 1;
                }
                libc::prctl(
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_CLEAR_ALL,
                    0,
                    0,
                    0,
                );
            }
            if let Some((uid, gid)) = self.ids {
                // the raw syscalls, for this task alone: the libc wrappers
                // change the ids of every thread of the process, and a
                // child cloned with CLONE_VM (see `launch`) still sees the
                // bridge's threads as its own
                if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0 {
                    return Err(fail("setgroups"));
                }
                if libc::syscall(libc::SYS_setgid, gid) != 0 {
                    return Err(fail("setgid"));
                }
                if libc::syscall(libc::SYS_setuid, uid) != 0 {
                    return Err(fail("setuid"));
                }
            }
            if self.drop_caps && !clear_capabilities() {
                return Err(fail("drop capabilities"));
            }
            for f in &self.filters {
                if seccompiler::apply_filter(f).is_err() {
                    return Err(fail("install the seccomp filter"));
                }
            }
        }
        Ok(())
    }
}

/// capset(2) with every set empty.
unsafe fn clear_capabilities() -> bool {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let header = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset with valid header and two data structs, as v3 wants.
    unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) == 0 }
}

/// Sets IFF_UP on `lo` in the current network namespace.
unsafe fn loopback_up() -> bool {
    // SAFETY: socket/ioctl/close on a zeroed ifreq naming "lo".
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return false;
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        req.ifr_name[0] = b'l' as libc::c_char;
        req.ifr_name[1] = b'o' as libc::c_char;
        let ok = libc::ioctl(fd, libc::SIOCGIFFLAGS as libc::Ioctl, &mut req) == 0 && {
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            libc::ioctl(fd, libc::SIOCSIFFLAGS as libc::Ioctl, &req) == 0
        };
        libc::close(fd);
        ok
    }
}
