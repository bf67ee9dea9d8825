//! `CacheAligned`: the process's allocator in the Python extension. Buffers of `ALIGNED_FROM`
//! bytes or more start on a 64-byte boundary, so that IREE's runtime can take a tensor's
//! memory as a compiled function's input without copying it (its CPU kernels assume 64-byte
//! aligned bindings: an unaligned import crashed them). Smaller ones are the system's.

use std::alloc::{GlobalAlloc, Layout, System};

/// The alignment large buffers get: a cache line, and what IREE's CPU kernels assume.
pub const ALIGNMENT: usize = 64;

/// Allocations from this size up are aligned to `ALIGNMENT`.
pub const ALIGNED_FROM: usize = 4096;

/// The system allocator with large buffers aligned to `ALIGNMENT`.
pub struct CacheAligned;

/// The layout `layout` is allocated with: a function of the layout alone, so that `dealloc`
/// and `realloc`, given the caller's layout, find the one the block was allocated with.
fn adjusted(layout: Layout) -> Layout {
    if layout.size() >= ALIGNED_FROM && layout.align() < ALIGNMENT {
        Layout::from_size_align(layout.size(), ALIGNMENT).unwrap_or(layout)
    } else {
        layout
    }
}

#[allow(unsafe_code, reason = "a global allocator is an unsafe trait")]
// SAFETY: every block is allocated and freed by `System` with the same adjusted layout (a
// function of the caller's layout), whose alignment is at least the caller's.
unsafe impl GlobalAlloc for CacheAligned {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the adjusted layout has the caller's nonzero size.
        unsafe { System.alloc(adjusted(layout)) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        unsafe { System.alloc_zeroed(adjusted(layout)) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated with `adjusted(layout)` (the caller passes the layout
        // it allocated with).
        unsafe { System.dealloc(ptr, adjusted(layout)) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = adjusted(layout);
        // A size the caller asked for is a valid layout with the caller's alignment.
        let Ok(asked) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        let new = adjusted(asked);
        if new.align() == old.align() {
            // SAFETY: `ptr` was allocated with `old`; System keeps its alignment.
            return unsafe { System.realloc(ptr, old, new_size) };
        }
        // SAFETY: `new` has a nonzero size; the copy stays within both blocks.
        unsafe {
            let moved = System.alloc(new);
            if !moved.is_null() {
                std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                System.dealloc(ptr, old);
            }
            moved
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_blocks_are_aligned_and_keep_their_bytes_through_realloc() {
        let a = CacheAligned;
        let small = Layout::from_size_align(100, 4).unwrap();
        #[allow(unsafe_code, reason = "the allocator's own test")]
        // SAFETY: each block is used within its size and freed with the layout it has.
        unsafe {
            let p = a.alloc(small);
            assert!(!p.is_null());
            for i in 0..100 {
                *p.add(i) = i as u8;
            }
            // growing past ALIGNED_FROM moves the block to an aligned one
            let q = a.realloc(p, small, 3 * ALIGNED_FROM);
            assert_eq!(q as usize % ALIGNMENT, 0);
            assert!((0..100).all(|i| *q.add(i) == i as u8));
            let large = Layout::from_size_align(3 * ALIGNED_FROM, 4).unwrap();
            let r = a.realloc(q, large, 50);
            assert!((0..50).all(|i| *r.add(i) == i as u8));
            a.dealloc(r, Layout::from_size_align(50, 4).unwrap());
            let z = a.alloc_zeroed(large);
            assert_eq!(z as usize % ALIGNMENT, 0);
            assert!((0..large.size()).all(|i| *z.add(i) == 0));
            a.dealloc(z, large);
        }
    }
}
