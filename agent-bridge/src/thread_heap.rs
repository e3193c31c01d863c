//! Tests only: the lib's unit tests run on an allocator that counts, per
//! thread, the bytes allocated there and not yet freed, so a test can show
//! that work done on its own thread leaves nothing on the heap. (Counting
//! per thread keeps the other tests, running beside it, out of its count.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

struct Counting;

#[global_allocator]
static COUNTING: Counting = Counting;

fn add(bytes: isize) {
    // after the thread's locals are gone (its exit), nothing is counted
    let _ = LIVE.try_with(|c| c.set(c.get() + bytes));
}

// SAFETY: every call is passed to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            add(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            add(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        add(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            add(new_size as isize - layout.size() as isize);
        }
        p
    }
}

/// Bytes allocated on this thread and not freed since it started.
pub fn live() -> isize {
    LIVE.try_with(Cell::get).unwrap_or(0)
}
