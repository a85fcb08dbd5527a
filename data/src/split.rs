//! Splittable sources: how a `DistributedEpoch` job of the tf.data service divides one pass
//! of a pipeline's source among its workers.
//!
//! The sources whose elements are numbered (`from_tensor_slices`, `range`, `list_files`)
//! read the index ranges a [`SplitProvider`] hands out instead of all of `0..n`, when one is
//! in scope while the dataset is built (the service's worker builds a registered pipeline
//! inside [`with_split_provider`]). Outside such a scope nothing changes.

use ferroflow_tensor::Result;
use std::cell::RefCell;
use std::ops::Range;
use std::sync::Arc;

use crate::dataset::ElementIter;

/// Hands out the ranges of a source's element indices one worker reads.
pub(crate) trait SplitProvider: Send + Sync {
    /// The next range of indices to read out of `0..num_elements`; `None` when the pass's
    /// ranges are all handed out.
    fn next_split(&self, num_elements: u64) -> Result<Option<Range<u64>>>;
    /// One element of a split was read (the source's position, for the lost-element count).
    fn element_read(&self) {}
}

thread_local! {
    static IN_SCOPE: RefCell<Option<Claims>> = const { RefCell::new(None) };
}

struct Claims {
    provider: Arc<dyn SplitProvider>,
    claimed: usize,
}

/// Runs `build` with `provider` in scope: the splittable sources built in it read the splits
/// `provider` hands out. Also returns how many sources claimed it (a pipeline for a
/// distributed epoch needs exactly one).
#[cfg_attr(not(any(feature = "service", test)), allow(dead_code))]
pub(crate) fn with_split_provider<R>(
    provider: Arc<dyn SplitProvider>,
    build: impl FnOnce() -> R,
) -> (R, usize) {
    let outer = IN_SCOPE.with(|s| {
        s.borrow_mut().replace(Claims {
            provider,
            claimed: 0,
        })
    });
    let r = build();
    let claimed = IN_SCOPE.with(|s| {
        let mut s = s.borrow_mut();
        let claimed = s.as_ref().map_or(0, |c| c.claimed);
        *s = outer;
        claimed
    });
    (r, claimed)
}

/// Called by a splittable source as it is built: the provider in scope, if any (claimed).
pub(crate) fn claim() -> Option<Arc<dyn SplitProvider>> {
    IN_SCOPE.with(|s| {
        s.borrow_mut().as_mut().map(|c| {
            c.claimed += 1;
            c.provider.clone()
        })
    })
}

/// One pass of a numbered source of `n` elements, `element(i)` for each index it reads: all
/// of `0..n` without a provider, else the ranges `provider` hands out.
pub(crate) fn source_iter<T: Send + 'static>(
    n: u64,
    provider: Option<Arc<dyn SplitProvider>>,
    element: impl Fn(u64) -> Result<T> + Send + 'static,
) -> ElementIter<T> {
    match provider {
        None => Box::new((0..n).map(element)),
        Some(provider) => {
            let mut current = 0..0;
            let mut done = false;
            Box::new(std::iter::from_fn(move || loop {
                if done {
                    return None;
                }
                if let Some(i) = current.next() {
                    provider.element_read();
                    return Some(element(i));
                }
                match provider.next_split(n) {
                    Ok(Some(r)) => current = r.start.min(n)..r.end.min(n),
                    Ok(None) => done = true,
                    Err(e) => {
                        done = true;
                        return Some(Err(e));
                    }
                }
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    struct Halves(Mutex<Vec<Range<u64>>>);
    impl SplitProvider for Halves {
        fn next_split(&self, n: u64) -> Result<Option<Range<u64>>> {
            assert_eq!(n, 10);
            Ok(self.0.lock().unwrap().pop())
        }
    }

    #[test]
    fn a_source_built_under_a_provider_reads_only_its_splits() {
        let provider: Arc<dyn SplitProvider> = Arc::new(Halves(Mutex::new(vec![7..9, 2..4])));
        let (claimed_here, claimed) = with_split_provider(provider, claim);
        assert_eq!(claimed, 1);
        let got: Vec<u64> = source_iter(10, claimed_here, Ok)
            .map(|x| x.unwrap())
            .collect();
        assert_eq!(got, vec![2, 3, 7, 8]);
        // Outside the scope a source reads everything, and nothing is claimed.
        assert!(claim().is_none());
        assert_eq!(source_iter(10, None, Ok).count(), 10);
    }
}
