//! A workload that attaches itself between fork and exec: it joins the
//! call's cgroups and asks the probe daemon for its span, naming its own
//! pid, over the bridge's connection. The bridge then neither waits for the
//! child's pid nor releases it afterwards, and no thread is spawned to run
//! the fork beside the attach: one wake-up per step instead of three.
//!
//! Everything here runs in the child, where only async-signal-safe calls
//! are allowed and nothing may allocate: the paths and the request are
//! prepared before fork.

use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;

use probe::client::PidRequest;

/// What the child does before the profile is applied.
pub struct SelfAttach {
    /// `cgroup.procs` of the call's cgroup v2, joined unless the child
    /// started there (see `launch`).
    pub join: Option<CString>,
    /// `cgroup.procs` of each of the call's other (v1) cgroups.
    pub procs: Vec<CString>,
    /// The daemon's socket and the `begin_span` request; None without a
    /// probe (then the workload runs untraced, and says why).
    pub begin: Option<(RawFd, PidRequest)>,
    /// Where the child puts the daemon's answer line for the bridge.
    pub answer: RawFd,
}

/// The longest answer line the child forwards (an error's message included).
const ANSWER_MAX: usize = 4096;

impl SelfAttach {
    /// In the child, before exec. A cgroup that cannot be joined stops the
    /// workload (a limit would not hold); a daemon that cannot be reached
    /// does not (the bridge reports the probe unavailable for the call).
    /// `placed`: the child started in the v2 cgroup.
    pub fn run(&self, report: RawFd, placed: bool) -> io::Result<()> {
        let join = self.join.as_ref().filter(|_| !placed);
        for procs in join.into_iter().chain(&self.procs) {
            // "0": the writer itself
            if !write_file(procs, b"0") {
                let err = io::Error::last_os_error();
                write_all(report, b"cannot place the workload in its cgroup");
                return Err(err);
            }
        }
        if let Some((socket, request)) = &self.begin {
            let mut digits = [0u8; 10];
            // SAFETY: getpid(2) has no preconditions.
            let pid = decimal(unsafe { libc::getpid() } as u32, &mut digits);
            let mut answer = [0u8; ANSWER_MAX];
            // one write where the line fits the buffer: the daemon then
            // wakes once for it, not once per piece
            let mut line = [0u8; LINE_MAX];
            let parts = [request.head.as_slice(), pid, PidRequest::TAIL];
            let sent = match join_into(&mut line, &parts) {
                Some(n) => write_all(*socket, &line[..n]),
                None => parts.iter().all(|p| write_all(*socket, p)),
            };
            if sent && let Some(n) = read_line(*socket, &mut answer) {
                write_all(self.answer, &answer[..n]);
            }
        }
        Ok(())
    }
}

/// The longest request line the child sends in one write.
const LINE_MAX: usize = 8192;

/// `parts` one after another in `buf`; their length, or None when they do
/// not fit.
fn join_into(buf: &mut [u8], parts: &[&[u8]]) -> Option<usize> {
    let mut n = 0;
    for p in parts {
        buf.get_mut(n..n + p.len())?.copy_from_slice(p);
        n += p.len();
    }
    Some(n)
}

/// `v` in decimal, in `out`.
fn decimal(mut v: u32, out: &mut [u8; 10]) -> &[u8] {
    let mut i = out.len();
    loop {
        i -= 1;
        out[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return &out[i..];
        }
    }
}

/// Opens `path` for writing, writes `data`, closes it.
fn write_file(path: &CString, data: &[u8]) -> bool {
    // SAFETY: open/write/close with a valid C string and buffer.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return false;
        }
        let ok = libc::write(fd, data.as_ptr().cast(), data.len()) == data.len() as isize;
        libc::close(fd);
        ok
    }
}

fn write_all(fd: RawFd, mut data: &[u8]) -> bool {
    while !data.is_empty() {
        // SAFETY: write(2) of a valid buffer.
        let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        if n <= 0 {
            return false;
        }
        data = &data[n as usize..];
    }
    true
}

/// Reads from `fd` up to and including the first newline; its length, or
/// None when the line is cut short or longer than `buf`. The daemon answers
/// one line per request, so nothing past it is consumed.
fn read_line(fd: RawFd, buf: &mut [u8]) -> Option<usize> {
    let mut n = 0;
    while n < buf.len() {
        // SAFETY: read(2) into the unfilled rest of `buf`.
        let got = unsafe { libc::read(fd, buf[n..].as_mut_ptr().cast(), buf.len() - n) };
        if got < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        if got <= 0 {
            return None;
        }
        let start = n;
        n += got as usize;
        if buf[start..n].contains(&b'\n') {
            return Some(n);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd as _;

    #[test]
    fn join_into_fills_the_buffer_or_refuses() {
        let mut buf = [0u8; 9];
        assert_eq!(join_into(&mut buf, &[b"{\"a\":", b"12", b"}\n"]), Some(9));
        assert_eq!(&buf, b"{\"a\":12}\n");
        assert_eq!(join_into(&mut buf, &[b"{\"a\":", b"123", b"}\n"]), None);
    }

    #[test]
    fn decimal_writes_every_digit() {
        let mut out = [0u8; 10];
        for v in [0, 7, 10, 4242, u32::MAX] {
            assert_eq!(decimal(v, &mut out), v.to_string().as_bytes());
        }
    }

    #[test]
    fn read_line_stops_at_the_newline_and_refuses_a_cut_or_long_line() {
        use std::io::Write as _;
        use std::os::unix::net::UnixStream;
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(b"{\"id\":1}\n").unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(read_line(b.as_raw_fd(), &mut buf), Some(9));
        a.write_all(&[b'x'; 80]).unwrap();
        assert_eq!(
            read_line(b.as_raw_fd(), &mut buf),
            None,
            "longer than the buffer"
        );
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(b"{\"id\"").unwrap();
        drop(a);
        assert_eq!(read_line(b.as_raw_fd(), &mut buf), None, "cut short");
    }
}
