//! The process's allocator: the system's, with a reserve that turns memory running out inside a
//! kernel into a `ResourceExhausted` error instead of an abort.
//!
//! Large results are asked for before a kernel runs (`tensor::check_allocation`), and stacks
//! and tapes check their headroom as they grow. What is left are the many small allocations a
//! kernel, the executor or the tape make on their own: Rust aborts the process when one fails.
//! So the allocator holds a reserve of address space. When the system refuses an allocation,
//! the reserve is given back, the allocation is tried again (it then succeeds unless it alone
//! is larger than the reserve), and a shortage is noted. The op that was running finishes, and
//! `take_shortage` at its end turns the note into an error: its results are dropped before
//! anything records them, and the reserve is taken again for the next shortage.
//!
//! The reserve is address space, not memory: its pages are never touched, so it costs nothing
//! until the system is out of both.

#![allow(
    unsafe_code,
    reason = "a global allocator is an unsafe trait over raw pointers"
)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

use crate::error::{Error, ErrorKind, Result};

/// Larger than glibc's largest threshold for serving an allocation from `mmap` (32 MiB), so
/// that giving the reserve back returns its address space to the system at once.
const RESERVE_BYTES: usize = 64 << 20;

fn reserve_layout() -> Layout {
    // A power of two and a page's alignment: a valid layout by construction.
    Layout::from_size_align(RESERVE_BYTES, 4096).unwrap_or_else(|_| Layout::new::<u8>())
}

/// A reserve of address space and the note of a shortage.
struct Reserve {
    block: AtomicPtr<u8>,
    shortage: AtomicBool,
    /// The size of the allocation that was refused.
    asked: AtomicUsize,
}

impl Reserve {
    const fn new() -> Reserve {
        Reserve {
            block: AtomicPtr::new(std::ptr::null_mut()),
            shortage: AtomicBool::new(false),
            asked: AtomicUsize::new(0),
        }
    }

    /// Gives the reserve back and retries `attempt` once, noting the shortage when the retry
    /// succeeds; null when there was no reserve left or the retry failed too.
    fn after_refusal(&self, size: usize, attempt: impl FnOnce() -> *mut u8) -> *mut u8 {
        if ASKING.try_with(Cell::get).unwrap_or(false) {
            return std::ptr::null_mut(); // a fallible request: its caller reports the refusal
        }
        let block = self.block.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if block.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: `block` came from `System.alloc(reserve_layout())` in `arm`, and the swap
        // above made this the only place that frees it.
        unsafe { System.dealloc(block, reserve_layout()) };
        let p = attempt();
        if !p.is_null() {
            self.asked.store(size, Ordering::Relaxed);
            self.shortage.store(true, Ordering::Release);
        }
        // Else the caller aborts, or it asked fallibly (`try_reserve`) and reports the refusal
        // itself: no shortage to report (the reserve is taken again at the next op).
        p
    }

    fn arm(&self) -> bool {
        if !self.block.load(Ordering::Acquire).is_null() {
            return true;
        }
        // SAFETY: a valid, non-zero-sized layout.
        let block = unsafe { System.alloc(reserve_layout()) };
        if block.is_null() {
            return false;
        }
        if self
            .block
            .compare_exchange(
                std::ptr::null_mut(),
                block,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            // Another thread armed it first.
            // SAFETY: `block` was allocated just above with this layout and never shared.
            unsafe { System.dealloc(block, reserve_layout()) };
        }
        true
    }

    #[cfg(test)]
    fn armed(&self) -> bool {
        !self.block.load(Ordering::Acquire).is_null()
    }

    fn take_shortage(&self, op: &str) -> Result<()> {
        if !self.shortage.load(Ordering::Relaxed) {
            if self.block.load(Ordering::Relaxed).is_null() {
                // Memory was short when the last shortage was reported: try again now.
                self.arm();
            }
            return Ok(());
        }
        if !self.shortage.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        self.arm();
        Err(Error::new(
            ErrorKind::ResourceExhausted,
            op.to_owned(),
            format!(
                "the machine refused an allocation of {} bytes while it ran (memory set aside \
                 was given back to finish it); its results were dropped",
                self.asked.load(Ordering::Relaxed)
            ),
        ))
    }
}

static RESERVE: Reserve = Reserve::new();

thread_local! {
    /// Set while this thread makes a fallible request (`fallibly`).
    static ASKING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, whose allocations are fallible requests (`try_reserve`, a probe of whether the
/// machine could give a size): a refusal is theirs to report, so the reserve is not spent on
/// them.
pub fn fallibly<T>(f: impl FnOnce() -> T) -> T {
    let before = ASKING.with(|a| a.replace(true));
    let out = f();
    ASKING.with(|a| a.set(before));
    out
}

/// The system's allocator with a reserve (see the module's comment).
pub struct ReserveAllocator;

// SAFETY: every method forwards to `System` with the caller's arguments; the reserve is a
// block of `System`'s own, freed with the layout it was allocated with.
unsafe impl GlobalAlloc for ReserveAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires of it.
        let p = unsafe { System.alloc(layout) };
        if p.is_null() {
            // SAFETY: as above.
            return RESERVE.after_refusal(layout.size(), || unsafe { System.alloc(layout) });
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc_zeroed` requires of it.
        let p = unsafe { System.alloc_zeroed(layout) };
        if p.is_null() {
            // SAFETY: as above.
            return RESERVE.after_refusal(layout.size(), || unsafe { System.alloc_zeroed(layout) });
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's block, layout and size, as `GlobalAlloc::realloc` requires of
        // them; a refused `realloc` leaves the block as it was, so it can be tried again.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            // SAFETY: as above.
            return RESERVE.after_refusal(new_size, || unsafe {
                System.realloc(ptr, layout, new_size)
            });
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's block, allocated by `System` through this allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: ReserveAllocator = ReserveAllocator;

/// Takes the reserve if none is held; false when the system refuses it. Called once when the
/// library loads, and again after each shortage.
pub fn arm() -> bool {
    RESERVE.arm()
}

/// The error for a shortage noted since the last call, naming `op` (what was running when the
/// system refused memory); `Ok` when there was none. Takes the reserve again (or tries to,
/// until the system gives it). Two atomic loads when there was none: ops call it after each
/// kernel.
pub fn take_shortage(op: &str) -> Result<()> {
    RESERVE.take_shortage(op)
}

/// `result`, or the shortage's error when one was noted while it was computed (the result is
/// then dropped).
pub fn checked<T>(op: &str, result: Result<T>) -> Result<T> {
    let value = result?;
    take_shortage(op)?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shortage_is_reported_once_and_the_reserve_taken_again() {
        let reserve = Reserve::new();
        assert!(reserve.arm());
        assert!(reserve.take_shortage("op").is_ok());
        // A refusal as the allocator meets it: the reserve is given back and the retry runs.
        let layout = Layout::new::<u64>();
        // SAFETY: a valid layout; freed below.
        let p = reserve.after_refusal(8, || unsafe { System.alloc(layout) });
        assert!(!p.is_null());
        // SAFETY: allocated just above with this layout.
        unsafe { System.dealloc(p, layout) };
        assert!(!reserve.armed());
        // No reserve left: the next refusal is not retried.
        assert!(reserve.after_refusal(8, || unreachable!()).is_null());
        let e = reserve.take_shortage("sin").unwrap_err();
        assert_eq!(e.kind, ErrorKind::ResourceExhausted);
        assert!(e.to_string().contains("sin"), "{e}");
        assert!(e.to_string().contains("8 bytes"), "{e}");
        assert!(reserve.armed());
        assert!(reserve.take_shortage("sin").is_ok());
        // A refusal the retry cannot serve either (a fallible request too large for any
        // reserve) notes nothing; the reserve is taken again at the next op.
        assert!(reserve.after_refusal(1 << 50, std::ptr::null_mut).is_null());
        assert!(!reserve.armed());
        assert!(reserve.take_shortage("cos").is_ok());
        assert!(reserve.armed());
    }
}
