//! Subnormal floats flushed to zero, on request (`set_flush_subnormals`).
//!
//! By default gradloop computes with IEEE subnormals eagerly and in graph mode, as numpy does
//! (compiled modules flush them, as IREE's and XLA's CPU code runs). Intel cores take a
//! microcode assist, about a hundred cycles, for each vector instruction that meets one, and a
//! loop gradient meets many: a cotangent that shrinks through hundreds of steps passes through
//! the subnormal range. XLA runs its CPU code with them flushed (FTZ: a subnormal result becomes
//! zero; DAZ: a subnormal input reads as zero), and so does TensorFlow; flushing here gives JAX's
//! numerics and speed. It is a per-thread mode of the CPU, so it is set on every thread of
//! rayon's pool, which runs gradloop's parallel work, and on the calling thread.

use crate::error::{Error, Result};

/// Flushes subnormals to zero (`on`), or keeps them, on the calling thread and every thread of
/// rayon's global pool. False, with nothing changed, where the CPU has no such mode here. An
/// error, with nothing changed, from a thread that cannot reach the pool's adopted worker 0
/// (`pool::every_worker_reachable`): the thread that loaded gradloop sets it.
pub fn set_flush_subnormals(on: bool) -> Result<bool> {
    if !SUPPORTED {
        return Ok(false);
    }
    if !crate::pool::every_worker_reachable() {
        return Err(Error::invalid(
            "set_flush_subnormals",
            "the mode is set from the thread that imported gradloop (its main thread): one of \
             gradloop's worker threads is that thread, and only it can set its own mode",
        ));
    }
    rayon::broadcast(|_| set_on_this_thread(on));
    set_on_this_thread(on);
    Ok(true)
}

/// Whether the calling thread flushes subnormals to zero.
pub fn flushes_subnormals() -> bool {
    SUPPORTED && control_register() & FLUSH_BITS == FLUSH_BITS
}

/// Whether this target has the mode.
const SUPPORTED: bool = cfg!(target_arch = "x86_64");

/// The SSE control register's flush-to-zero and denormals-are-zero bits.
#[cfg(target_arch = "x86_64")]
const FLUSH_BITS: u32 = 0x8040;
#[cfg(not(target_arch = "x86_64"))]
const FLUSH_BITS: u32 = 0;

/// Sets or clears the mode on the calling thread (`set_flush_subnormals`'s unit).
pub(crate) fn set_on_this_thread(on: bool) {
    let csr = control_register();
    let bits = if on {
        csr | FLUSH_BITS
    } else {
        csr & !FLUSH_BITS
    };
    if bits != csr {
        set_control_register(bits);
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(
    unsafe_code,
    reason = "the SSE control register is read and written with stmxcsr and ldmxcsr"
)]
fn control_register() -> u32 {
    let mut csr: u32 = 0;
    // SAFETY: stmxcsr stores this thread's 32-bit control register at the address given, a
    // live local.
    unsafe {
        std::arch::asm!(
            "stmxcsr [{}]",
            in(reg) std::ptr::addr_of_mut!(csr),
            options(nostack, preserves_flags)
        );
    }
    csr
}

#[cfg(target_arch = "x86_64")]
#[allow(
    unsafe_code,
    reason = "the SSE control register is read and written with stmxcsr and ldmxcsr"
)]
fn set_control_register(csr: u32) {
    // SAFETY: ldmxcsr loads this thread's control register from a live local; the value is the
    // register as read, with only the FTZ and DAZ bits changed, so no reserved bit is set.
    unsafe {
        std::arch::asm!(
            "ldmxcsr [{}]",
            in(reg) std::ptr::addr_of!(csr),
            options(nostack, preserves_flags, readonly)
        );
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn control_register() -> u32 {
    0
}

#[cfg(not(target_arch = "x86_64"))]
fn set_control_register(_: u32) {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hint::black_box;

    /// A product whose exact value, 1e-40, is subnormal in f32.
    fn subnormal_product() -> f32 {
        black_box(1e-30f32) * black_box(1e-10f32)
    }

    #[test]
    fn the_mode_flushes_on_this_thread_and_on_a_pools_threads_and_clears() {
        if !SUPPORTED {
            assert!(!set_flush_subnormals(true).expect("no mode to set"));
            return;
        }
        // A private pool: the global one serves the other tests running beside this one.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .expect("a pool of two threads");
        assert!(subnormal_product() > 0.0, "IEEE subnormals by default");
        set_on_this_thread(true);
        pool.broadcast(|_| set_on_this_thread(true));
        assert!(flushes_subnormals());
        assert_eq!(subnormal_product(), 0.0);
        let there = pool.broadcast(|_| (flushes_subnormals(), subnormal_product()));
        assert!(there.iter().all(|&(on, p)| on && p == 0.0), "{there:?}");
        // A subnormal input reads as zero too (DAZ): 1e-40 * 1e10 would be 1e-30.
        assert_eq!(black_box(1e-40f32) * black_box(1e10f32), 0.0);
        set_on_this_thread(false);
        pool.broadcast(|_| set_on_this_thread(false));
        assert!(!flushes_subnormals());
        assert!(subnormal_product() > 0.0);
        let there = pool.broadcast(|_| subnormal_product());
        assert!(there.iter().all(|&p| p > 0.0), "{there:?}");
    }
}
