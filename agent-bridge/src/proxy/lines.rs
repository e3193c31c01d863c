//! The server's stdout as lines, cheaply: reads of up to 1 MiB land
//! straight in the line's own buffer (no copy from a reader's buffer into a
//! growing line), and a long line is checked as it arrives ([`Scan`]), so
//! that when its last byte comes in, only its skeleton (the line without
//! the contents of its long strings) is left to parse for routing.
//!
//! The scan only ever speeds things up: a line it has any doubt about is
//! parsed whole, as a short one is, so every line gets the same head (or
//! the same error) as [`super::frame::child_head`] gives it.

use std::ops::Range;
use std::os::fd::{AsRawFd, OwnedFd};

/// Bytes asked of the pipe per read.
const READ: usize = 1 << 20;
/// A line still without its end after this many bytes is scanned.
const LONG: usize = 1 << 20;
/// Strings with at least this many bytes of contents are left out of the
/// skeleton.
const CUT: usize = 64 << 10;
/// Buffer reserved at once for a long line (within the limit): one big
/// block (reused from the last big line by `big_alloc`, its pages mapped),
/// instead of doubling through fresh ones.
const LONG_RESERVE: usize = 256 << 20;
/// Whether long lines are scanned: not by debug builds of the binary,
/// where the scan's loops run unoptimized, slower than the pipe (the whole
/// line is parsed then, as it always could be).
const SCAN: bool = cfg!(test) || !cfg!(debug_assertions);

/// One line, with its `\n` if it had one.
pub struct Line {
    pub bytes: Vec<u8>,
    /// For a long line that passed the scan: the byte ranges of the string
    /// contents that the head's parse may skip (checked already: UTF-8, no
    /// control characters, valid escapes). None: parse the whole line.
    pub cuts: Option<Vec<Range<usize>>>,
}

/// An incremental check of a JSON line's strings and nesting, resumed as
/// more of the line arrives.
#[derive(Default)]
struct Scan {
    /// The next byte to look at.
    pos: usize,
    /// Open objects and arrays.
    depth: u32,
    /// Inside a string: where its contents start.
    string: Option<usize>,
    cuts: Vec<Range<usize>>,
    /// Something the scan does not vouch for: the line is parsed whole.
    failed: bool,
}

/// The first `"`, `\` or control character in `s`.
fn special(s: &[u8]) -> Option<usize> {
    let is = |c: u8| c == b'"' || c == b'\\' || c < 0x20;
    let mut at = 0;
    // whole blocks first: a loop without an early exit is vectorized
    for block in s.chunks_exact(64) {
        if block.iter().fold(false, |hit, &c| hit | is(c)) {
            break;
        }
        at += 64;
    }
    s[at..].iter().position(|&c| is(c)).map(|i| at + i)
}

/// A plain search for `\n` (std's memchr, fast in debug builds too).
fn newline(s: &[u8]) -> Option<usize> {
    use std::io::BufRead as _;
    let mut rest = s;
    let n = rest.skip_until(b'\n').ok()?;
    (n > 0 && s[n - 1] == b'\n').then(|| n - 1)
}

impl Scan {
    /// Scans `buf` (the line so far) from where it stopped; the line's end
    /// (the index of its `\n`), once seen.
    fn advance(&mut self, buf: &[u8]) -> Option<usize> {
        while !self.failed && self.pos < buf.len() {
            let Some(start) = self.string else {
                match buf[self.pos] {
                    b'\n' => return Some(self.pos),
                    b'"' => self.string = Some(self.pos + 1),
                    b'{' | b'[' => self.depth += 1,
                    b'}' | b']' if self.depth > 0 => self.depth -= 1,
                    b'}' | b']' => {
                        self.failed = true;
                        break;
                    }
                    _ => {}
                }
                self.pos += 1;
                continue;
            };
            let rest = &buf[self.pos..];
            let Some(i) = special(rest) else {
                // all contents so far; a character cut by the read waits for its end
                match std::str::from_utf8(rest) {
                    Ok(_) => self.pos = buf.len(),
                    Err(e) if e.error_len().is_none() => self.pos += e.valid_up_to(),
                    Err(_) => self.failed = true,
                }
                return None;
            };
            if std::str::from_utf8(&rest[..i]).is_err() {
                self.failed = true;
                break;
            }
            self.pos += i;
            match buf[self.pos] {
                b'"' => {
                    // strings the head reads (ids, methods, keys of result) are shallower
                    if self.pos - start >= CUT && self.depth >= 3 {
                        self.cuts.push(start..self.pos);
                    }
                    self.string = None;
                    self.pos += 1;
                }
                b'\\' => {
                    // an escape cut by the read waits for its end
                    let &c = buf.get(self.pos + 1)?;
                    match c {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.pos += 2,
                        b'u' => {
                            let hex = buf.get(self.pos + 2..self.pos + 6)?;
                            let code = std::str::from_utf8(hex)
                                .ok()
                                .and_then(|h| u16::from_str_radix(h, 16).ok());
                            match code {
                                // surrogates: left to the parser
                                Some(c) if !(0xd800..0xe000).contains(&c) => self.pos += 6,
                                _ => self.failed = true,
                            }
                        }
                        _ => self.failed = true,
                    }
                }
                // a control character (a raw `\n` included) inside a string
                _ => self.failed = true,
            }
        }
        None
    }
}

/// Reads `input` until it ends or `on_line` returns false. Blank lines are
/// skipped; a line over `max` bytes is counted, not kept, and `on_over`
/// gets how many bytes it had (at least). A last line without `\n` counts.
pub fn read_lines(
    input: OwnedFd,
    max: usize,
    mut on_line: impl FnMut(Line) -> bool,
    mut on_over: impl FnMut(usize),
) {
    let mut buf: Vec<u8> = Vec::with_capacity(READ);
    // bytes of `buf` known to hold no `\n` (when not scanning)
    let mut searched = 0;
    let mut scan: Option<Scan> = None;
    // over the limit: the line's bytes so far, dropped as they come
    let mut skipping: Option<usize> = None;
    loop {
        // every line that is complete in the buffer
        loop {
            if let Some(seen) = skipping {
                match newline(&buf) {
                    Some(nl) => {
                        on_over(seen + nl + 1);
                        buf.drain(..=nl);
                        skipping = None;
                        continue;
                    }
                    None => {
                        skipping = Some(seen + buf.len());
                        buf.clear();
                        break;
                    }
                }
            }
            let end = match &mut scan {
                Some(s) if !s.failed => {
                    let end = s.advance(&buf);
                    if s.failed {
                        searched = s.pos; // no `\n` before where it stopped
                        newline(&buf[searched..]).map(|i| searched + i)
                    } else {
                        end
                    }
                }
                _ => newline(&buf[searched..]).map(|i| searched + i),
            };
            let Some(nl) = end else {
                if scan.as_ref().is_none_or(|s| s.failed) {
                    searched = buf.len();
                }
                if buf.len() > max {
                    skipping = Some(buf.len());
                    buf.clear();
                    (searched, scan) = (0, None);
                    continue;
                }
                if SCAN && scan.is_none() && buf.len() >= LONG {
                    let mut s = Scan::default();
                    // no `\n` in what was searched: this only checks it
                    let _ = s.advance(&buf);
                    scan = Some(s);
                }
                break;
            };
            if nl > max {
                // over the limit
                on_over(nl + 1);
                buf.drain(..=nl);
                (searched, scan) = (0, None);
                continue;
            }
            let cuts = scan.take().filter(|s| !s.failed).map(|s| s.cuts);
            searched = 0;
            let line = if nl + 1 >= LONG {
                // the line keeps the buffer; what follows it moves to a new one
                let mut rest = Vec::with_capacity(READ.max(buf.len() - nl - 1));
                rest.extend_from_slice(&buf[nl + 1..]);
                buf.truncate(nl + 1);
                std::mem::replace(&mut buf, rest)
            } else {
                let line = buf[..=nl].to_vec();
                buf.drain(..=nl);
                line
            };
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            if !on_line(Line { bytes: line, cuts }) {
                return;
            }
        }
        // room to read into: a long line gets one big block
        let spare = buf.capacity() - buf.len();
        if spare < READ / 4 {
            let want = if buf.len() >= LONG && skipping.is_none() {
                LONG_RESERVE.min(max.saturating_add(2)).max(buf.len() * 2) - buf.len()
            } else {
                READ
            };
            buf.reserve(want);
        }
        let room =
            (buf.capacity() - buf.len()).min(if buf.len() >= LONG { 8 * READ } else { READ });
        let n = loop {
            // SAFETY: `room` bytes of spare capacity after `len`, written by
            // the kernel; only the `n` bytes it wrote become part of `buf`.
            let n = unsafe {
                libc::read(
                    input.as_raw_fd(),
                    buf.as_mut_ptr().add(buf.len()).cast(),
                    room,
                )
            };
            if n >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                break n;
            }
        };
        if n <= 0 {
            // the end (or a broken pipe): a last line without `\n` still counts
            if let Some(seen) = skipping {
                on_over(seen);
            } else if !buf.is_empty()
                && !buf.iter().all(u8::is_ascii_whitespace)
                && buf.len() <= max
            {
                let cuts = scan.take().filter(|s| !s.failed).map(|s| s.cuts);
                on_line(Line { bytes: buf, cuts });
            }
            return;
        }
        // SAFETY: the kernel wrote `n` bytes (checked above: 0 < n <= room).
        unsafe { buf.set_len(buf.len() + n as usize) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    fn lines_of(input: Vec<u8>, max: usize) -> (Vec<Line>, Vec<usize>) {
        let (r, w) = std::io::pipe().unwrap();
        let writer = std::thread::spawn(move || {
            let mut w = w;
            let _ = w.write_all(&input);
        });
        let (mut lines, mut over) = (Vec::new(), Vec::new());
        read_lines(
            r.into(),
            max,
            |l| {
                lines.push(l);
                true
            },
            |n| over.push(n),
        );
        writer.join().unwrap();
        (lines, over)
    }

    #[test]
    fn short_long_blank_and_oversized_lines() {
        let big = "a".repeat(3 << 20);
        let long = format!(
            r#"{{"jsonrpc":"2.0","id":1,"result":{{"content":[{{"type":"text","text":"{big}\u00e9\n"}}],"isError":false}}}}"#
        );
        let mut input = b"{\"a\":1}\n\n  \n".to_vec();
        input.extend_from_slice(long.as_bytes());
        input.extend_from_slice(b"\n{\"b\":2}\r\n");
        input.extend_from_slice(&vec![b'x'; 5 << 20]);
        input.extend_from_slice(b"\n{\"c\":3}");
        let (lines, over) = lines_of(input, 4 << 20);
        let texts: Vec<&[u8]> = lines.iter().map(|l| &l.bytes[..]).collect();
        assert_eq!(texts[0], b"{\"a\":1}\n");
        assert_eq!(texts[1].len(), long.len() + 1);
        assert_eq!(texts[2], b"{\"b\":2}\r\n");
        assert_eq!(texts[3], b"{\"c\":3}");
        assert_eq!(lines.len(), 4);
        assert_eq!(over, vec![(5 << 20) + 1]);
        let cuts = lines[1].cuts.clone().expect("the long line was scanned");
        assert_eq!(cuts.len(), 1);
        let cut = &long.as_bytes()[cuts[0].clone()];
        assert!(cut.starts_with(b"aaa") && cut.ends_with(b"\\u00e9\\n"));
        assert!(lines[0].cuts.is_none());
    }

    #[test]
    fn doubtful_long_lines_are_parsed_whole() {
        let big = "a".repeat(2 << 20);
        for bad in ["\\ud800", "\\x", "\t", "\u{0}"] {
            let line = format!(r#"{{"result":{{"c":[{{"t":"{big}{bad}"}}]}}}}"#);
            let (lines, _) = lines_of(format!("{line}\n").into_bytes(), 8 << 20);
            assert_eq!(lines.len(), 1, "{bad}");
            assert!(lines[0].cuts.is_none(), "{bad}");
            assert_eq!(lines[0].bytes.len(), line.len() + 1);
        }
        // a raw newline in a long string ends the line there, as it always did
        let line = format!("{{\"result\":{{\"c\":[{{\"t\":\"{big}\n\"}}]}}}}\n");
        let (lines, _) = lines_of(line.into_bytes(), 8 << 20);
        assert_eq!(lines.len(), 2);
        assert!(lines[0].cuts.is_none());
    }
}
