//! The bridge's global allocator: the system's, except for buffers of 8 MiB
//! and more, which are mapped here and, once freed, kept mapped for a short
//! while so the next big buffer reuses their pages.
//!
//! Why: a 64 MiB transfer passes through four or five fresh buffers of
//! 64–87 MB (the request line, the parsed string, the decoded bytes, the
//! base64 answer, its JSON), and on this VM the first touch of fresh pages
//! costs about 0.6 ns a byte (fault and zeroing) where writing pages
//! already mapped costs 0.05: ~50 ms of every 87 MB buffer. glibc maps such
//! buffers itself but unmaps them on free, so every transfer paid it again.
//!
//! Bounds: at most [`KEEP`] blocks and [`KEEP_BYTES`] are kept, each for at
//! most [`KEEP_FOR`] ([`spawn_release_thread`] checks every second), so an
//! idle bridge returns to its small size. Growing a big buffer moves its
//! pages with `mremap`, as glibc does, instead of copying them.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Allocations from this size on are mapped (and kept) here.
pub const BIG: usize = 8 << 20;
/// Freed blocks kept for reuse, at most.
pub const KEEP: usize = 2;
/// Bytes kept for reuse, at most.
pub const KEEP_BYTES: usize = 256 << 20;
/// How long a freed block is kept.
pub const KEEP_FOR: Duration = Duration::from_secs(1);
/// The block's first page holds its mapped length; the buffer starts after
/// it, so it is page-aligned.
const PAGE: usize = 4096;

/// A mapping: its address (as a number, so the cache is `Send`) and length.
#[derive(Clone, Copy)]
struct Block {
    map: usize,
    len: usize,
    freed: Instant,
}

static KEPT: Mutex<[Option<Block>; KEEP]> = Mutex::new([None; KEEP]);

/// The global allocator (set in `main.rs`).
pub struct BigReuse;

fn is_big(layout: &Layout) -> bool {
    layout.size() >= BIG && layout.align() <= PAGE
}

/// Mapped length for a buffer of `size` bytes: the header page, rounded up.
fn mapped_len(size: usize) -> Option<usize> {
    size.checked_add(2 * PAGE - 1).map(|n| n & !(PAGE - 1))
}

fn unmap(b: Block) {
    // SAFETY: `b` is a whole mapping made by `map_fresh` or `remap`, no
    // longer in use.
    unsafe { libc::munmap(b.map as *mut libc::c_void, b.len) };
}

fn map_fresh(len: usize) -> Option<usize> {
    // SAFETY: an anonymous private mapping; no memory is aliased.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as usize)
}

/// Grows (or moves) mapping `b` to `len` bytes, keeping its pages.
fn remap(b: Block, len: usize) -> Option<usize> {
    // SAFETY: `b` is a whole mapping of ours; MREMAP_MAYMOVE lets the kernel
    // move it, and nothing refers to the old address afterwards.
    let p = unsafe { libc::mremap(b.map as *mut libc::c_void, b.len, len, libc::MREMAP_MAYMOVE) };
    (p != libc::MAP_FAILED).then_some(p as usize)
}

/// Drops the blocks freed longer than `age` ago.
fn expire(kept: &mut [Option<Block>; KEEP], age: Duration) {
    for slot in kept.iter_mut() {
        if slot.is_some_and(|b| b.freed.elapsed() >= age) {
            unmap(slot.take().expect("checked"));
        }
    }
}

/// A mapping of at least `len` bytes: a kept one (the smallest that fits,
/// else the largest, grown), or a fresh one (`true`: all zeros).
fn take(len: usize) -> Option<(Block, bool)> {
    let reused = {
        let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
        expire(&mut kept, KEEP_FOR);
        let fits = kept
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.filter(|b| b.len >= len).map(|b| (b.len, i)))
            .min();
        let largest = kept
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.map(|b| (b.len, i)))
            .max();
        fits.or(largest).and_then(|(_, i)| kept[i].take())
    };
    let fresh = |len| {
        map_fresh(len).map(|map| {
            let b = Block {
                map,
                len,
                freed: Instant::now(),
            };
            (b, true)
        })
    };
    match reused {
        Some(b) if b.len >= len => Some((b, false)),
        Some(b) => match remap(b, len) {
            Some(map) => Some((Block { map, len, ..b }, false)),
            None => {
                unmap(b);
                fresh(len)
            }
        },
        None => fresh(len),
    }
}

/// Keeps `b` for reuse if there is room, replacing a smaller kept block;
/// unmaps whatever is not kept.
fn give_back(b: Block) {
    let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    expire(&mut kept, KEEP_FOR);
    let others: usize = kept.iter().flatten().map(|k| k.len).sum();
    if b.len > KEEP_BYTES {
        unmap(b);
        return;
    }
    let slot = kept.iter().position(Option::is_none).or_else(|| {
        kept.iter()
            .enumerate()
            .filter_map(|(i, k)| k.filter(|k| k.len < b.len).map(|k| (k.len, i)))
            .min()
            .map(|(_, i)| i)
    });
    match slot {
        Some(i) => {
            let replaced = kept[i].take();
            let freed = replaced.map_or(0, |r| r.len);
            if others - freed + b.len > KEEP_BYTES {
                if let Some(r) = replaced {
                    kept[i] = Some(r);
                }
                unmap(b);
                return;
            }
            if let Some(r) = replaced {
                unmap(r);
            }
            kept[i] = Some(Block {
                freed: Instant::now(),
                ..b
            });
        }
        None => unmap(b),
    }
}

/// Unmaps the kept blocks freed more than `age` ago.
pub fn release_idle(age: Duration) {
    expire(&mut KEPT.lock().unwrap_or_else(|e| e.into_inner()), age);
}

/// Starts the thread that unmaps kept blocks once they have been idle for
/// [`KEEP_FOR`] (for long-running commands: `serve`, `campaign run`).
pub fn spawn_release_thread() -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("release-idle".into())
        .spawn(|| {
            loop {
                std::thread::sleep(KEEP_FOR);
                release_idle(KEEP_FOR);
            }
        })
        .map(drop)
}

/// Bytes kept mapped for reuse right now.
pub fn kept_bytes() -> usize {
    KEPT.lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .flatten()
        .map(|b| b.len)
        .sum()
}

/// The buffer of block `b`, with its length written in the header page.
fn buffer(b: Block) -> *mut u8 {
    // SAFETY: the header page is the block's first page, ours to write.
    unsafe { (b.map as *mut usize).write(b.len) };
    (b.map + PAGE) as *mut u8
}

/// The block a buffer from [`buffer`] belongs to.
///
/// # Safety
/// `ptr` must come from [`buffer`] and still be live.
unsafe fn block_of(ptr: *mut u8) -> Block {
    let map = ptr as usize - PAGE;
    // SAFETY: the header page written by `buffer`.
    let len = unsafe { (map as *const usize).read() };
    Block {
        map,
        len,
        freed: Instant::now(),
    }
}

unsafe impl GlobalAlloc for BigReuse {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !is_big(&layout) {
            // SAFETY: forwarded with the caller's guarantees.
            return unsafe { System.alloc(layout) };
        }
        mapped_len(layout.size())
            .and_then(take)
            .map_or(std::ptr::null_mut(), |(b, _)| buffer(b))
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !is_big(&layout) {
            // SAFETY: forwarded with the caller's guarantees.
            return unsafe { System.alloc_zeroed(layout) };
        }
        let Some((b, zeros)) = mapped_len(layout.size()).and_then(take) else {
            return std::ptr::null_mut();
        };
        let p = buffer(b);
        if !zeros {
            // SAFETY: the buffer is `layout.size()` bytes of ours; a reused
            // block holds old bytes (on mapped pages: this is cheap).
            unsafe { std::ptr::write_bytes(p, 0, layout.size()) };
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !is_big(&layout) {
            // SAFETY: forwarded with the caller's guarantees.
            return unsafe { System.dealloc(ptr, layout) };
        }
        // SAFETY: a big layout's buffer came from `alloc`.
        give_back(unsafe { block_of(ptr) });
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's guarantees (valid layout, nonzero new size).
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (is_big(&layout), is_big(&new)) {
            (false, false) => unsafe { System.realloc(ptr, layout, new_size) },
            (true, true) => {
                let b = unsafe { block_of(ptr) };
                let Some(len) = mapped_len(new_size) else {
                    return std::ptr::null_mut();
                };
                if len <= b.len {
                    return ptr; // shrinking in place: the mapping stays as it is
                }
                remap(b, len).map_or(std::ptr::null_mut(), |map| {
                    buffer(Block {
                        map,
                        len,
                        freed: b.freed,
                    })
                })
            }
            // across the threshold: to the other allocator, by copy
            _ => unsafe {
                let p = self.alloc(new);
                if !p.is_null() {
                    std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
                    self.dealloc(ptr, layout);
                }
                p
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test, since the kept blocks are process-wide.
    #[test]
    fn big_buffers_are_reused_grown_in_place_and_released() {
        let a = BigReuse;
        let big = Layout::from_size_align(BIG + 123, 8).unwrap();
        unsafe {
            release_idle(Duration::ZERO);
            let p = a.alloc(big);
            assert!(!p.is_null() && (p as usize).is_multiple_of(PAGE));
            std::ptr::write_bytes(p, 0xab, big.size());
            a.dealloc(p, big);
            assert!(kept_bytes() >= big.size(), "a freed block is kept");

            // the same pages again, and zeroed when asked
            let q = a.alloc_zeroed(big);
            assert_eq!(q, p, "the kept block is reused");
            assert!(
                std::slice::from_raw_parts(q, big.size())
                    .iter()
                    .all(|&b| b == 0)
            );
            assert_eq!(kept_bytes(), 0);

            // growth keeps the contents (mremap), shrinking keeps the buffer
            *q = 7;
            *q.add(big.size() - 1) = 9;
            let grown = a.realloc(q, big, 4 * BIG);
            let grown_layout = Layout::from_size_align(4 * BIG, 8).unwrap();
            assert_eq!((*grown, *grown.add(big.size() - 1)), (7, 9));
            *grown.add(4 * BIG - 1) = 5;
            let same = a.realloc(grown, grown_layout, BIG);
            assert_eq!(same, grown);

            // across the threshold, both ways, by copy
            let small = a.realloc(same, Layout::from_size_align(BIG, 8).unwrap(), 100);
            assert_eq!(*small, 7);
            let small_layout = Layout::from_size_align(100, 8).unwrap();
            let back = a.realloc(small, small_layout, 2 * BIG);
            assert_eq!(*back, 7);
            let back_layout = Layout::from_size_align(2 * BIG, 8).unwrap();

            // two blocks are kept; a third, smaller one is not, and
            // displaces neither
            let other = a.alloc(grown_layout);
            let third = a.alloc(big);
            a.dealloc(other, grown_layout);
            a.dealloc(back, back_layout);
            let kept = kept_bytes();
            assert!((6 * BIG..=KEEP_BYTES).contains(&kept), "{kept}");
            a.dealloc(third, big);
            assert_eq!(kept_bytes(), kept);

            // an oversized block is never kept
            let huge = Layout::from_size_align(KEEP_BYTES + 1, 8).unwrap();
            let h = a.alloc(huge);
            *h.add(KEEP_BYTES) = 1;
            a.dealloc(h, huge);
            assert!(kept_bytes() <= KEEP_BYTES);

            // idle blocks are unmapped
            release_idle(Duration::ZERO);
            assert_eq!(kept_bytes(), 0);
        }
    }
}
