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
//!
//! Blocks of `ALIGNED_FROM_BYTES` or more start on a 64-byte boundary (`is_wide`). XLA's CPU
//! client reads an argument in place only when it is so aligned, and copies it otherwise: a
//! tensor's buffer handed to `backend="xla"` is then read where it lies.

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

/// Blocks this large or larger are aligned to `WIDE_ALIGN` bytes.
const ALIGNED_FROM_BYTES: usize = 4096;

/// A cache line, and what XLA's CPU client asks of a buffer it reads in place.
pub const WIDE_ALIGN: usize = 64;

/// What the system's `malloc` aligns every block to.
const SYSTEM_ALIGN: usize = 16;

/// Whether a block of `layout` is wide: placed at a `WIDE_ALIGN` boundary inside a system block
/// `WIDE_ALIGN` bytes larger (`raw_layout`), the distance back to the system block's start kept
/// in the word before it. A function of the caller's layout alone, so that `dealloc` and
/// `realloc`, given the layout back, know how the block was made.
///
/// Why not `posix_memalign`: the system's `calloc` and `realloc` keep their speed (pages zeroed
/// lazily, large blocks grown in place by `mremap`), which aligned allocation gives up.
fn is_wide(layout: Layout) -> bool {
    layout.size() >= ALIGNED_FROM_BYTES && layout.align() <= SYSTEM_ALIGN
}

/// The system block that holds a wide block of `size` bytes; None past the address range.
fn raw_layout(size: usize) -> Option<Layout> {
    let size = size.checked_add(WIDE_ALIGN)?;
    Layout::from_size_align(size, SYSTEM_ALIGN).ok()
}

/// The wide block inside the system block at `raw` (null stays null), its offset noted.
///
/// # Safety
/// `raw` must be null or a live system block of `raw_layout(_)`.
unsafe fn placed(raw: *mut u8) -> *mut u8 {
    if raw.is_null() {
        return raw;
    }
    // `raw` is `SYSTEM_ALIGN`-aligned, so the offset is in SYSTEM_ALIGN..=WIDE_ALIGN: room for
    // the word before the block, and the block's end within the system block.
    let offset = offset_in(raw);
    // SAFETY: `offset <= WIDE_ALIGN`, inside the system block; the word before the wide block
    // lies after `raw` (offset >= 16) and is 8-aligned (the block is 64-aligned).
    unsafe {
        let wide = raw.add(offset);
        wide.cast::<usize>().sub(1).write(offset);
        wide
    }
}

/// How far past `raw` the first `WIDE_ALIGN` boundary after it lies (1..=WIDE_ALIGN).
fn offset_in(raw: *mut u8) -> usize {
    WIDE_ALIGN - (raw as usize) % WIDE_ALIGN
}

/// The start of the system block that holds the wide block at `wide`, and its offset.
///
/// # Safety
/// `wide` must be a live wide block made by `placed`.
unsafe fn raw_of(wide: *mut u8) -> (*mut u8, usize) {
    // SAFETY: `placed` wrote the offset in the word before the block.
    unsafe {
        let offset = wide.cast::<usize>().sub(1).read();
        (wide.sub(offset), offset)
    }
}

/// The system's allocator with a reserve, large blocks aligned (see the module's comment).
pub struct ReserveAllocator;

impl ReserveAllocator {
    /// `System.alloc` or `System.alloc_zeroed` of `layout`, retried once with the reserve; a
    /// shortage reports the `asked` bytes (the caller's, not the system block's).
    fn system(layout: Layout, zeroed: bool, asked: usize) -> *mut u8 {
        let attempt = || {
            // SAFETY: a valid layout of non-zero size (the caller's, or one larger).
            unsafe {
                if zeroed {
                    System.alloc_zeroed(layout)
                } else {
                    System.alloc(layout)
                }
            }
        };
        let p = attempt();
        if p.is_null() {
            return RESERVE.after_refusal(asked, attempt);
        }
        p
    }

    fn allocate(layout: Layout, zeroed: bool) -> *mut u8 {
        if !is_wide(layout) {
            return Self::system(layout, zeroed, layout.size());
        }
        match raw_layout(layout.size()) {
            // SAFETY: a system block of `raw_layout`, or null.
            Some(raw) => unsafe { placed(Self::system(raw, zeroed, layout.size())) },
            None => std::ptr::null_mut(),
        }
    }

    /// `ptr`'s block of `old` moved into a new block of `new` (its contents up to the smaller
    /// size), `ptr` freed; null, `ptr` untouched, when the new block is refused.
    ///
    /// # Safety
    /// `ptr` must be a live block allocated by this allocator with layout `old`.
    unsafe fn moved(&self, ptr: *mut u8, old: Layout, new: Layout) -> *mut u8 {
        let p = Self::allocate(new, false);
        if !p.is_null() {
            // SAFETY: both blocks are live, distinct and at least this many bytes long; the
            // old one is freed once, with its own layout.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, p, old.size().min(new.size()));
                self.dealloc(ptr, old);
            }
        }
        p
    }

    /// A wide block grown or shrunk by the system's `realloc` of the block that holds it.
    ///
    /// # Safety
    /// `ptr` must be a live wide block of `old` bytes made by this allocator.
    unsafe fn rewidened(ptr: *mut u8, old: usize, new: usize) -> *mut u8 {
        let (Some(old_raw), Some(new_raw)) = (raw_layout(old), raw_layout(new)) else {
            return std::ptr::null_mut();
        };
        // SAFETY: the system block that holds `ptr`, with the layout it was allocated with.
        let (raw, offset) = unsafe { raw_of(ptr) };
        // SAFETY: `raw` is a live system block of `old_raw`, resized to a valid size.
        let attempt = || unsafe { System.realloc(raw, old_raw, new_raw.size()) };
        let mut moved = attempt();
        if moved.is_null() {
            // A refused `realloc` leaves the block as it was, so it can be tried again.
            moved = RESERVE.after_refusal(new, attempt);
            if moved.is_null() {
                return moved;
            }
        }
        let to = offset_in(moved);
        if to != offset {
            // A block the system moved can sit at another offset from a boundary: its
            // contents move with it, before the offset's word (which they may cover) is written.
            // SAFETY: both ranges lie in the new system block (offsets <= WIDE_ALIGN).
            unsafe { std::ptr::copy(moved.add(offset), moved.add(to), old.min(new)) };
        }
        // SAFETY: a live system block of `new_raw`.
        unsafe { placed(moved) }
    }
}

// SAFETY: narrow blocks are `System`'s, with the caller's layout; a wide block lies inside a
// `System` block of `raw_layout`, found again from the offset written before it; the reserve is
// a block of `System`'s own, freed with the layout it was allocated with.
unsafe impl GlobalAlloc for ReserveAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::allocate(layout, false)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::allocate(layout, true)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Ok(new) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        match (is_wide(layout), is_wide(new)) {
            // SAFETY: the caller's wide block of `layout`.
            (true, true) => unsafe { Self::rewidened(ptr, layout.size(), new_size) },
            // SAFETY: the caller's block of `layout` crosses `ALIGNED_FROM_BYTES`.
            (true, false) | (false, true) => unsafe { self.moved(ptr, layout, new) },
            (false, false) => {
                // SAFETY: the caller's block, layout and size, as `GlobalAlloc::realloc`
                // requires of them; a refused `realloc` leaves the block as it was.
                let attempt = || unsafe { System.realloc(ptr, layout, new_size) };
                let p = attempt();
                if p.is_null() {
                    return RESERVE.after_refusal(new_size, attempt);
                }
                p
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !is_wide(layout) {
            // SAFETY: the caller's block, allocated by `System` with this layout.
            return unsafe { System.dealloc(ptr, layout) };
        }
        if let Some(raw_layout) = raw_layout(layout.size()) {
            // SAFETY: the caller's wide block, inside a `System` block of `raw_layout`.
            unsafe { System.dealloc(raw_of(ptr).0, raw_layout) }
        }
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

    fn wide(p: *const f32) -> bool {
        (p as usize).is_multiple_of(WIDE_ALIGN)
    }

    #[test]
    fn large_blocks_start_on_a_cache_line_and_keep_their_contents_as_they_grow_and_shrink() {
        let mut v: Vec<f32> = (0..100).map(|i| i as f32).collect();
        for n in [1_000, 1_023, 1_024, 5_000, 300_000] {
            // 4 bytes a float: grown across `ALIGNED_FROM_BYTES` (1,024 floats) and far past it
            v.extend((v.len()..n).map(|i| i as f32));
            assert!(v.iter().enumerate().all(|(i, &x)| x == i as f32), "at {n}");
            if n * 4 >= ALIGNED_FROM_BYTES {
                assert!(
                    wide(v.as_ptr()),
                    "a block of {n} floats is not 64-byte aligned"
                );
            }
        }
        for n in [5_000, 1_000, 10] {
            v.truncate(n);
            v.shrink_to_fit(); // back across the threshold: a `realloc` to a narrower layout
            assert!(v.iter().enumerate().all(|(i, &x)| x == i as f32), "at {n}");
        }
        let zeroed = vec![0.0f32; 4096];
        assert!(wide(zeroed.as_ptr()) && zeroed.iter().all(|&x| x == 0.0));
    }
}
