//! The kernels' one door to rayon. A kernel hands its work on one piece as a `&dyn Fn`, so
//! rayon's machinery (jobs, joins, splitting, unwinding) is compiled once per element type,
//! not once per kernel, dtype and call site: inlined at each of those, it was a third of the
//! crate's machine code and of its build time. The call through the pointer is one per piece
//! of thousands of elements; the loop inside each piece is the kernel's own, compiled as before.

use rayon::prelude::*;

/// Work on one piece of a slice and the same piece of its source, if any.
pub type PieceFn<'a, T> = dyn Fn(&mut [T], Option<&[T]>) + Sync + 'a;

/// `f(piece, its source)` over `xs` and `from` (of `xs`'s length, when given) in `chunk`-element
/// pieces, in parallel from `threshold` elements, else once over the whole.
pub fn map_pieces<T: Send + Sync>(
    xs: &mut [T],
    from: Option<&[T]>,
    chunk: usize,
    threshold: usize,
    f: &PieceFn<'_, T>,
) {
    if xs.len() < threshold {
        return f(xs, from);
    }
    chunks_mut(xs, chunk, &|k, piece| {
        let n = piece.len();
        f(piece, from.map(|from| &from[k * chunk..][..n]))
    });
}

/// `f(k, piece)` for each `chunk`-element piece of `xs` (the `k`-th; the last may be shorter),
/// in parallel.
pub fn chunks_mut<T: Send>(xs: &mut [T], chunk: usize, f: &(dyn Fn(usize, &mut [T]) + Sync)) {
    xs.par_chunks_mut(chunk)
        .enumerate()
        .for_each(|(k, piece)| f(k, piece));
}

/// `f(piece)` for each `chunk`-element piece of `xs`, in parallel: the results in order.
pub fn map_chunks<T: Sync, R: Send>(
    xs: &[T],
    chunk: usize,
    f: &(dyn Fn(&[T]) -> R + Sync),
) -> Vec<R> {
    xs.par_chunks(chunk).map(f).collect()
}

/// `f(i)` for each `i` in `0..n`, in parallel: the results in order.
pub fn map_indices<R: Send>(n: usize, f: &(dyn Fn(usize) -> R + Sync)) -> Vec<R> {
    (0..n).into_par_iter().map(f).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_slice_in_order() {
        let mut xs: Vec<usize> = vec![0; 10_007];
        chunks_mut(&mut xs, 1000, &|k, piece| {
            for (i, x) in piece.iter_mut().enumerate() {
                *x = k * 1000 + i;
            }
        });
        assert!(xs.iter().enumerate().all(|(i, &x)| i == x));
        let sums = map_chunks(&xs, 1000, &|piece| piece.len());
        assert_eq!(sums.len(), 11);
        assert_eq!(sums.iter().sum::<usize>(), xs.len());
        assert_eq!(map_indices(5, &|i| i * i), vec![0, 1, 4, 9, 16]);
    }
}
