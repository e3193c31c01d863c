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

type Kept = [Option<Block>; KEEP];

static KEPT: Mutex<Kept> = Mutex::new([None; KEEP]);

/// The global allocator (set in `main.rs`).
///
/// Two constraints come with it: a big buffer must never be handed to C's
/// `free` (nor a `malloc`'d one be freed here), and a child between fork and
/// exec must not allocate (it never does: the cache's lock may be held by a
/// thread that does not exist in the child).
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

/// Blocks taken out of the cache under its lock, unmapped after it (an
/// unmap of 100 MB takes a while; other threads need not wait for it).
#[derive(Default)]
struct Unmap([Option<Block>; KEEP + 1]);

impl Unmap {
    fn push(&mut self, b: Block) {
        if let Some(slot) = self.0.iter_mut().find(|s| s.is_none()) {
            *slot = Some(b);
        } else {
            unmap(b); // cannot happen: at most KEEP expire, plus one
        }
    }
}

impl Drop for Unmap {
    fn drop(&mut self) {
        self.0.iter_mut().filter_map(Option::take).for_each(unmap);
    }
}

fn lock() -> std::sync::MutexGuard<'static, Kept> {
    KEPT.lock().unwrap_or_else(|e| e.into_inner())
}

/// Moves the blocks freed longer than `age` ago into `out`.
fn expire(kept: &mut Kept, age: Duration, out: &mut Unmap) {
    for slot in kept.iter_mut() {
        if slot.is_some_and(|b| b.freed.elapsed() >= age) {
            out.push(slot.take().expect("checked"));
        }
    }
}

/// A mapping of at least `len` bytes (`true`: fresh, all zeros): the
/// smallest kept block that fits, else the largest kept one, grown with its
/// pages, else a fresh one. A block much bigger than asked is still handed
/// out: its pages are resident anyway, and a buffer that starts small and
/// doubles (serde_json's output) then grows into them instead of faulting
/// fresh ones (measured: 4.0× a 64 MiB payload at peak when such blocks
/// sat idle, 3.0× with this).
fn take(len: usize) -> Option<(Block, bool)> {
    let mut out = Unmap::default();
    let reused = {
        let mut kept = lock();
        expire(&mut kept, KEEP_FOR, &mut out);
        let pick = |want: &dyn Fn(usize) -> bool, smallest: bool| {
            let sizes = kept
                .iter()
                .enumerate()
                .filter_map(|(i, b)| b.filter(|b| want(b.len)).map(|b| (b.len, i)));
            if smallest { sizes.min() } else { sizes.max() }
        };
        let fits = pick(&|l| l >= len, true);
        let grows = pick(&|l| l < len, false);
        fits.or(grows).and_then(|(_, i)| kept[i].take())
    };
    drop(out);
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

/// Keeps `b` for reuse if there is room, in a free slot or in place of a
/// smaller kept block; unmaps whatever is not kept.
fn give_back(b: Block) {
    let mut out = Unmap::default();
    let mut kept = lock();
    expire(&mut kept, KEEP_FOR, &mut out);
    let slot = kept.iter().position(Option::is_none).or_else(|| {
        kept.iter()
            .enumerate()
            .filter_map(|(i, k)| k.filter(|k| k.len < b.len).map(|k| (k.len, i)))
            .min()
            .map(|(_, i)| i)
    });
    let others: usize = kept.iter().flatten().map(|k| k.len).sum();
    match slot {
        Some(i) if others - kept[i].map_or(0, |r| r.len) + b.len <= KEEP_BYTES => {
            if let Some(replaced) = kept[i].take() {
                out.push(replaced);
            }
            kept[i] = Some(Block {
                freed: Instant::now(),
                ..b
            });
        }
        _ => out.push(b),
    }
    drop(kept); // before `out` unmaps
}

/// Unmaps the kept blocks freed more than `age` ago.
pub fn release_idle(age: Duration) {
    let mut out = Unmap::default();
    expire(&mut lock(), age, &mut out);
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
    lock().iter().flatten().map(|b| b.len).sum()
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
                if len <= b.len && len > b.len / 2 {
                    return ptr; // a little smaller: the mapping stays as it is
                }
                // grown (pages kept, maybe moved), or shrunk to half or less
                // (the tail's pages go back; shrinking never moves)
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
        let layout = |size| Layout::from_size_align(size, 8).unwrap();
        let mapped = |size| mapped_len(size).unwrap();
        let some = |p: *mut u8| {
            assert!(!p.is_null(), "out of memory");
            p
        };
        let big = layout(BIG + 123);
        unsafe {
            release_idle(Duration::ZERO);
            let p = some(a.alloc(big));
            assert!((p as usize).is_multiple_of(PAGE));
            std::ptr::write_bytes(p, 0xab, big.size());
            a.dealloc(p, big);
            assert_eq!(kept_bytes(), mapped(big.size()), "a freed block is kept");

            // the same pages again, and zeroed when asked
            let q = some(a.alloc_zeroed(big));
            assert_eq!(q, p, "the kept block is reused");
            let bytes = std::slice::from_raw_parts(q, big.size());
            assert!(bytes.iter().all(|&b| b == 0));
            assert_eq!(kept_bytes(), 0);

            // growth keeps the contents (mremap)
            *q = 7;
            *q.add(big.size() - 1) = 9;
            let grown = some(a.realloc(q, big, 4 * BIG));
            assert_eq!((*grown, *grown.add(big.size() - 1)), (7, 9));
            *grown.add(4 * BIG - 1) = 5;

            // shrinking to half or less gives the tail back, in place
            let shrunk = some(a.realloc(grown, layout(4 * BIG), BIG));
            assert_eq!((shrunk, *shrunk), (grown, 7));

            // across the threshold, both ways, by copy
            let small = some(a.realloc(shrunk, layout(BIG), 100));
            assert_eq!(*small, 7);
            assert_eq!(kept_bytes(), mapped(BIG), "kept, at its shrunk size");
            let back = some(a.realloc(small, layout(100), 2 * BIG));
            assert_eq!(*back, 7);
            assert_eq!(kept_bytes(), 0, "the smaller kept block was grown");

            // a kept block is used however much bigger it is
            let other = some(a.alloc(layout(4 * BIG)));
            let extra = some(a.alloc(big));
            a.dealloc(other, layout(4 * BIG));
            let reused = some(a.alloc(big));
            assert_eq!(reused, other, "a kept block 4× the size is used");
            a.dealloc(reused, big);

            // of two, the smallest that fits
            a.dealloc(back, layout(2 * BIG));
            let kept = mapped(4 * BIG) + mapped(2 * BIG);
            assert_eq!(kept_bytes(), kept);
            let smallest = some(a.alloc(big));
            assert_eq!(smallest, back);
            a.dealloc(smallest, big);

            // two blocks are kept; a third, smaller one displaces neither
            a.dealloc(extra, big);
            assert_eq!(kept_bytes(), kept);

            // idle blocks are unmapped
            release_idle(Duration::ZERO);
            assert_eq!(kept_bytes(), 0);

            // an oversized block is never kept
            let huge = layout(KEEP_BYTES + 1);
            let h = some(a.alloc(huge));
            *h.add(KEEP_BYTES) = 1;
            a.dealloc(h, huge);
            assert_eq!(kept_bytes(), 0);
        }
    }
}
