//! rayon's global pool, with the thread that loads gradloop as one of its workers.
//!
//! An eager op that splits its work over the pool is called from Python's main thread. Outside
//! the pool that thread hands the job to a worker and sleeps until it is done: two threads
//! woken per op, and on a machine with as many workers as cores a third thread competing for
//! them. As worker 0 the calling thread runs its share of the job itself and the others steal
//! the rest.

use std::sync::atomic::{AtomicBool, Ordering};

/// Whether a thread of the process outside rayon's is the pool's worker 0.
static ADOPTED: AtomicBool = AtomicBool::new(false);

/// Builds the global pool with the calling thread as its worker 0, unless a pool exists
/// already; true when it did. Call it only from a thread that lives as long as the process
/// (Python's main thread): a pool's worker that exits leaves the pool a thread short.
pub fn adopt_current_thread() -> bool {
    let adopted = rayon::ThreadPoolBuilder::new()
        .use_current_thread()
        .build_global()
        .is_ok();
    if adopted {
        ADOPTED.store(true, Ordering::Relaxed);
    }
    adopted
}

/// Whether work sent to every thread of the pool (`rayon::broadcast`) can finish when the
/// calling thread sends it: the adopted worker 0 runs pool work only while it waits on the
/// pool itself, so from another thread such work would wait for it, maybe for ever.
pub fn every_worker_reachable() -> bool {
    !ADOPTED.load(Ordering::Relaxed) || rayon::current_thread_index().is_some()
}
