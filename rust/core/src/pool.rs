//! rayon's global pool, with the thread that loads gradloop as one of its workers.
//!
//! An eager op that splits its work over the pool is called from Python's main thread. Outside
//! the pool that thread hands the job to a worker and sleeps until it is done: two threads
//! woken per op, and on a machine with as many workers as cores a third thread competing for
//! them. As worker 0 the calling thread runs its share of the job itself and the others steal
//! the rest.

/// Builds the global pool with the calling thread as its worker 0, unless a pool exists
/// already; true when it did. Call it only from a thread that lives as long as the process
/// (Python's main thread): a pool's worker that exits leaves the pool a thread short.
pub fn adopt_current_thread() -> bool {
    rayon::ThreadPoolBuilder::new()
        .use_current_thread()
        .build_global()
        .is_ok()
}
