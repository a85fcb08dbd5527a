//! [`Dataset`]: a recipe for a stream of elements (`tf.data.Dataset`). Building one runs
//! nothing; every [`iter`](Dataset::iter) runs the recipe again from the start, so `repeat`,
//! `shuffle` (a new order each time) and epochs in `fit` work as in TensorFlow.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use ferroflow_tensor::{Error, Result, Tensor};

use crate::structure::Structure;

/// The iterator a dataset node produces: elements or the errors that replaced them.
pub type ElementIter<T> = Box<dyn Iterator<Item = Result<T>> + Send>;

/// How many elements a dataset yields, when that is known without running it
/// (`Dataset.cardinality()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cardinality {
    /// Exactly this many.
    Finite(u64),
    /// Never ends (`repeat()` without a count).
    Infinite,
    /// Depends on the data (`filter`, `from_generator`, file readers).
    Unknown,
}

impl Cardinality {
    pub(crate) fn map(self, f: impl FnOnce(u64) -> u64) -> Cardinality {
        match self {
            Cardinality::Finite(n) => Cardinality::Finite(f(n)),
            other => other,
        }
    }
}

/// How many worker threads (parallel `map`) or buffered elements (`prefetch`) to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parallelism {
    /// Exactly this many (at least 1).
    Fixed(usize),
    /// Chosen at run time (`tf.data.AUTOTUNE`): one map worker per core; a prefetch buffer
    /// that grows while the consumer finds it empty.
    Autotune,
}

/// `tf.data.AUTOTUNE`.
pub const AUTOTUNE: Parallelism = Parallelism::Autotune;

impl From<usize> for Parallelism {
    fn from(n: usize) -> Self {
        Parallelism::Fixed(n)
    }
}

/// The number of cores this process may use.
pub(crate) fn num_cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

type IterFn<T> = dyn Fn() -> ElementIter<T> + Send + Sync;
type FingerprintFn = dyn Fn() -> Result<String> + Send + Sync;

/// A recipe for a stream of elements of type `T` (`tf.data.Dataset`).
///
/// Elements are any `Send` Rust value; the transformations that take elements apart
/// (`batch`, `unbatch`, `padded_batch`, `cache_file`, `snapshot`) need a [`Structure`]: a
/// tensor, or tuples, `Vec`s and string-keyed maps of them. Cloning a dataset is cheap (it
/// shares the recipe). Iteration yields `Result<T>`: an error in a map function or a reader
/// arrives as an `Err` naming the stage and the element's position, never as a panic.
///
/// ```
/// ferroflow::init();
/// use ferroflow_data::Dataset;
/// use ferroflow_tensor::Tensor;
/// let ds = Dataset::range(0, 10, 1)
///     .map(|x: Tensor| x.mul(&x.scalar_like(2.0)?))
///     .filter(|x: &Tensor| Ok(x.item::<i64>()? % 3 != 0))
///     .batch(3, false)?;
/// let batches: Vec<Vec<i64>> = ds
///     .iter()
///     .map(|b| b?.to_vec::<i64>())
///     .collect::<Result<_, _>>()?;
/// assert_eq!(batches, vec![vec![2, 4, 8], vec![10, 14, 16]]);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct Dataset<T> {
    iter: Arc<IterFn<T>>,
    cardinality: Cardinality,
    fingerprint: Arc<FingerprintFn>,
    /// The registered pipeline this dataset is (`service::pipeline`): what the tf.data
    /// service sends its workers instead of the closures.
    #[cfg(feature = "service")]
    pub(crate) pipeline: Option<Arc<crate::service::protocol::DatasetDef>>,
}

impl<T> Clone for Dataset<T> {
    fn clone(&self) -> Self {
        Dataset {
            iter: self.iter.clone(),
            cardinality: self.cardinality,
            fingerprint: self.fingerprint.clone(),
            #[cfg(feature = "service")]
            pipeline: self.pipeline.clone(),
        }
    }
}

impl<T> std::fmt::Debug for Dataset<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataset")
            .field("element", &std::any::type_name::<T>())
            .field("cardinality", &self.cardinality)
            .finish()
    }
}

/// A numbered source's cardinality: its `n` elements, or unknown when it reads the splits of
/// a distributed epoch (its share is decided as the pass goes).
pub(crate) fn split_cardinality(
    n: u64,
    splits: &Option<Arc<dyn crate::split::SplitProvider>>,
) -> Cardinality {
    match splits {
        None => Cardinality::Finite(n),
        Some(_) => Cardinality::Unknown,
    }
}

/// Marks an error with the stage and element position, once: an error that already carries
/// a pipeline position (it came from upstream) passes through unchanged.
pub(crate) fn at_element(stage: &str, index: u64, err: Error) -> Error {
    match err {
        e @ Error::Pipeline { .. } => e,
        e => Error::Pipeline {
            stage: stage.to_string(),
            index,
            source: Box::new(e),
        },
    }
}

/// Runs `f`, turning a panic into an error that quotes the panic message.
pub(crate) fn call_guarded<R>(stage: &'static str, f: impl FnOnce() -> Result<R>) -> Result<R> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string panic payload".into());
        Err(Error::InvalidArgument {
            op: stage,
            msg: format!("the function panicked: {msg}"),
        })
    })
}

fn invalid(op: &'static str, msg: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op,
        msg: msg.into(),
    }
}

/// A 64-bit FNV-1a hash in hex: stable across processes and Rust versions (fingerprints name
/// snapshot directories).
pub(crate) fn stable_hash(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// What identifies this program's code (its executable's path, size and modification time):
/// part of the fingerprint of every Rust function in a pipeline, so a rebuilt program never
/// reads a snapshot its older functions wrote.
pub(crate) fn program_identity() -> String {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| match std::env::current_exe() {
        Ok(exe) => file_stamp(&exe),
        Err(_) => String::new(),
    })
    .clone()
}

/// `path:size:modification-nanoseconds` of a file (zeros when it cannot be read): what
/// fingerprints use to notice that a file changed.
pub(crate) fn file_stamp(path: &std::path::Path) -> String {
    let meta = std::fs::metadata(path).ok();
    let mtime = meta
        .as_ref()
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{}:{}:{mtime}",
        path.display(),
        meta.map(|m| m.len()).unwrap_or(0)
    )
}

/// The fingerprint piece of a Rust function value: its type name plus the program identity.
pub(crate) fn function_identity<F>() -> String {
    format!("{}@{}", std::any::type_name::<F>(), program_identity())
}

impl<T: Send + 'static> Dataset<T> {
    /// A dataset from its parts: `iter` starts a fresh pass, `fingerprint` describes the
    /// recipe for [`snapshot`](Self::snapshot) (sources hash their data or files).
    pub(crate) fn from_parts(
        cardinality: Cardinality,
        fingerprint: impl Fn() -> Result<String> + Send + Sync + 'static,
        iter: impl Fn() -> ElementIter<T> + Send + Sync + 'static,
    ) -> Dataset<T> {
        Dataset {
            iter: Arc::new(iter),
            cardinality,
            fingerprint: Arc::new(fingerprint),
            #[cfg(feature = "service")]
            pipeline: None,
        }
    }

    /// A derived dataset whose fingerprint is `label` followed by this one's.
    pub(crate) fn derive<U: Send + 'static>(
        &self,
        cardinality: Cardinality,
        label: String,
        iter: impl Fn(ElementIter<T>) -> ElementIter<U> + Send + Sync + 'static,
    ) -> Dataset<U> {
        let parent = self.clone();
        let parent_fp = self.fingerprint.clone();
        Dataset::from_parts(
            cardinality,
            move || Ok(format!("{label}<-{}", parent_fp()?)),
            move || iter(parent.iter_boxed()),
        )
    }

    /// Starts a pass over the elements.
    pub fn iter(&self) -> DatasetIter<T> {
        DatasetIter {
            inner: self.iter_boxed(),
        }
    }

    pub(crate) fn iter_boxed(&self) -> ElementIter<T> {
        (self.iter)()
    }

    /// How many elements a pass yields, when known without running it.
    pub fn cardinality(&self) -> Cardinality {
        self.cardinality
    }

    /// A description of the recipe that changes whenever its data, files, parameters or the
    /// program's functions change: [`snapshot`](Self::snapshot) keys its files by a hash of it.
    /// Sources over tensors hash their contents (one read of the data).
    pub fn fingerprint(&self) -> Result<String> {
        Ok(stable_hash(
            format!("{}|{}", (self.fingerprint)()?, std::any::type_name::<T>()).as_bytes(),
        ))
    }

    // ---------------------------------------------------------------- sources

    /// Elements from a Rust iterator factory, called once per pass (`from_generator`).
    ///
    /// ```
    /// ferroflow::init();
    /// let ds = ferroflow_data::Dataset::from_generator(|| (0..3).map(|i| i * 10));
    /// let v: Vec<i32> = ds.iter().collect::<Result<_, _>>()?;
    /// assert_eq!(v, vec![0, 10, 20]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn from_generator<I, F>(generator: F) -> Dataset<T>
    where
        F: Fn() -> I + Send + Sync + 'static,
        I: IntoIterator<Item = T>,
        I::IntoIter: Send + 'static,
    {
        let id = function_identity::<F>();
        Dataset::from_parts(
            Cardinality::Unknown,
            move || Ok(format!("from_generator({id})")),
            move || Box::new(generator().into_iter().map(Ok)),
        )
    }

    /// Like [`from_generator`](Self::from_generator) for iterators that can fail: an `Err`
    /// item is passed on marked with its position.
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::Dataset;
    /// use ferroflow_tensor::Error;
    /// let ds = Dataset::from_fallible_generator(|| vec![Ok(1), Err(Error::format("source", "bad")), Ok(3)]);
    /// let items: Vec<_> = ds.iter().collect();
    /// assert!(items[1].as_ref().unwrap_err().to_string().contains("from_generator: element 1"));
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn from_fallible_generator<I, F>(generator: F) -> Dataset<T>
    where
        F: Fn() -> I + Send + Sync + 'static,
        I: IntoIterator<Item = Result<T>>,
        I::IntoIter: Send + 'static,
    {
        let id = function_identity::<F>();
        Dataset::from_parts(
            Cardinality::Unknown,
            move || Ok(format!("from_generator({id})")),
            move || {
                Box::new(
                    generator()
                        .into_iter()
                        .enumerate()
                        .map(|(i, r)| r.map_err(|e| at_element("from_generator", i as u64, e))),
                )
            },
        )
    }

    // ---------------------------------------------------------------- transformations

    /// `f` applied to every element, in order, on the iterating thread (`map`). An error or
    /// a panic in `f` becomes an `Err` item naming the element; iteration goes on after it.
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::Dataset;
    /// let squares = Dataset::from_generator(|| 1..4).map(|x: i32| Ok(x * x));
    /// assert_eq!(squares.iter().collect::<Result<Vec<_>, _>>()?, vec![1, 4, 9]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn map<U, F>(&self, f: F) -> Dataset<U>
    where
        U: Send + 'static,
        F: Fn(T) -> Result<U> + Send + Sync + 'static,
    {
        let id = function_identity::<F>();
        let f = Arc::new(f);
        self.derive(self.cardinality, format!("map({id})"), move |input| {
            let f = f.clone();
            Box::new(input.enumerate().map(move |(i, r)| {
                r.and_then(|x| call_guarded("map", || f(x)))
                    .map_err(|e| at_element("map", i as u64, e))
            }))
        })
    }

    /// `f` applied on `num_parallel_calls` worker threads (`map(f, num_parallel_calls,
    /// deterministic)`). With `deterministic` the output keeps the input order; without it
    /// elements come as soon as they are ready. At most twice `num_parallel_calls` elements
    /// are in flight.
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::{Dataset, AUTOTUNE};
    /// let ds = Dataset::from_generator(|| 0..100u64).map_parallel(|x| Ok(x * x), AUTOTUNE, true);
    /// let v: Vec<u64> = ds.iter().collect::<Result<_, _>>()?;
    /// assert_eq!(v, (0..100u64).map(|x| x * x).collect::<Vec<_>>());
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn map_parallel<U, F>(
        &self,
        f: F,
        num_parallel_calls: impl Into<Parallelism>,
        deterministic: bool,
    ) -> Dataset<U>
    where
        U: Send + 'static,
        F: Fn(T) -> Result<U> + Send + Sync + 'static,
    {
        let threads = match num_parallel_calls.into() {
            Parallelism::Fixed(n) => n.max(1),
            Parallelism::Autotune => num_cores(),
        };
        let id = function_identity::<F>();
        let f: Arc<crate::parallel::MapFn<T, U>> = Arc::new(f);
        self.derive(self.cardinality, format!("map({id})"), move |input| {
            crate::parallel::parallel_map(input, f.clone(), threads, deterministic)
        })
    }

    /// The elements for which `predicate` holds (`filter`).
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::Dataset;
    /// let odd = Dataset::from_generator(|| 0..6).filter(|x: &i32| Ok(x % 2 == 1));
    /// assert_eq!(odd.iter().collect::<Result<Vec<_>, _>>()?, vec![1, 3, 5]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn filter<F>(&self, predicate: F) -> Dataset<T>
    where
        F: Fn(&T) -> Result<bool> + Send + Sync + 'static,
    {
        let id = function_identity::<F>();
        let predicate = Arc::new(predicate);
        self.derive(
            Cardinality::Unknown,
            format!("filter({id})"),
            move |input| {
                let p = predicate.clone();
                Box::new(input.enumerate().filter_map(move |(i, r)| match r {
                    Err(e) => Some(Err(e)),
                    Ok(x) => match call_guarded("filter", || p(&x)) {
                        Ok(true) => Some(Ok(x)),
                        Ok(false) => None,
                        Err(e) => Some(Err(at_element("filter", i as u64, e))),
                    },
                }))
            },
        )
    }

    /// Drops the `Err` items (`tf.data.experimental.ignore_errors`).
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::Dataset;
    /// use ferroflow_tensor::Error;
    /// let parsed = Dataset::from_generator(|| ["1", "x", "3"])
    ///     .map(|s: &str| s.parse::<i32>().map_err(|e| Error::format("number", e.to_string())));
    /// assert_eq!(parsed.ignore_errors().iter().collect::<Result<Vec<_>, _>>()?, vec![1, 3]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn ignore_errors(&self) -> Dataset<T> {
        self.derive(Cardinality::Unknown, "ignore_errors".into(), |input| {
            Box::new(input.filter(|r| r.is_ok()))
        })
    }

    /// The first `count` elements (`take`); pulls no element beyond them.
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::Dataset;
    /// let ints = |d: &Dataset<ferroflow_tensor::Tensor>| -> Vec<i64> { d.iter().map(|x| x.unwrap().item::<i64>().unwrap()).collect() };
    /// assert_eq!(ints(&Dataset::range(0, 10, 1).take(3)), vec![0, 1, 2]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn take(&self, count: u64) -> Dataset<T> {
        let card = match self.cardinality {
            Cardinality::Finite(n) => Cardinality::Finite(n.min(count)),
            Cardinality::Infinite => Cardinality::Finite(count),
            Cardinality::Unknown => Cardinality::Unknown,
        };
        self.derive(card, format!("take({count})"), move |input| {
            Box::new(input.take(count as usize))
        })
    }

    /// Everything after the first `count` elements (`skip`).
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::Dataset;
    /// let ints = |d: &Dataset<ferroflow_tensor::Tensor>| -> Vec<i64> { d.iter().map(|x| x.unwrap().item::<i64>().unwrap()).collect() };
    /// assert_eq!(ints(&Dataset::range(0, 10, 1).skip(7)), vec![7, 8, 9]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn skip(&self, count: u64) -> Dataset<T> {
        let card = self.cardinality.map(|n| n.saturating_sub(count));
        self.derive(card, format!("skip({count})"), move |input| {
            Box::new(input.skip(count as usize))
        })
    }

    /// The elements `count` times over (`repeat`); `None` repeats forever. Each round is a new
    /// pass (a shuffle upstream reshuffles). An empty dataset repeated stays empty.
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::Dataset;
    /// let ints = |d: &Dataset<ferroflow_tensor::Tensor>| -> Vec<i64> { d.iter().map(|x| x.unwrap().item::<i64>().unwrap()).collect() };
    /// assert_eq!(ints(&Dataset::range(0, 2, 1).repeat(Some(3))), vec![0, 1, 0, 1, 0, 1]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn repeat(&self, count: Option<u64>) -> Dataset<T> {
        let card = match (count, self.cardinality) {
            (_, Cardinality::Finite(0)) => Cardinality::Finite(0),
            (Some(c), Cardinality::Finite(n)) => Cardinality::Finite(n.saturating_mul(c)),
            (Some(0), _) => Cardinality::Finite(0),
            (None, _) => Cardinality::Infinite,
            (Some(_), other) => other,
        };
        let parent = self.clone();
        let fp = self.fingerprint.clone();
        Dataset::from_parts(
            card,
            move || Ok(format!("repeat({count:?})<-{}", fp()?)),
            move || Box::new(Repeat::new(parent.clone(), count)),
        )
    }

    /// `(position, element)` pairs, the position an `i64` scalar tensor counting from
    /// `start` (`enumerate`).
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::Dataset;
    /// let (i, x) = Dataset::range(10, 13, 1).enumerate(0).iter().last().unwrap()?;
    /// assert_eq!((i.item::<i64>()?, x.item::<i64>()?), (2, 12));
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn enumerate(&self, start: i64) -> Dataset<(Tensor, T)> {
        self.derive(
            self.cardinality,
            format!("enumerate({start})"),
            move |input| {
                Box::new(input.enumerate().map(move |(i, r)| {
                    let x = r?;
                    Ok((Tensor::scalar(start + i as i64)?, x))
                }))
            },
        )
    }

    /// Pairs of this dataset's and `other`'s elements, ending with the shorter (`zip`).
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::Dataset;
    /// let pairs = Dataset::from_generator(|| 0..5).zip(&Dataset::from_generator(|| ["a", "b"]));
    /// assert_eq!(pairs.iter().collect::<Result<Vec<_>, _>>()?, vec![(0, "a"), (1, "b")]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn zip<U: Send + 'static>(&self, other: &Dataset<U>) -> Dataset<(T, U)> {
        let card = match (self.cardinality, other.cardinality) {
            (Cardinality::Finite(a), Cardinality::Finite(b)) => Cardinality::Finite(a.min(b)),
            (Cardinality::Infinite, c) | (c, Cardinality::Infinite) => c,
            _ => Cardinality::Unknown,
        };
        let (a, b) = (self.clone(), other.clone());
        let (fa, fb) = (self.fingerprint.clone(), other.fingerprint.clone());
        Dataset::from_parts(
            card,
            move || Ok(format!("zip({},{})", fa()?, fb()?)),
            move || {
                Box::new(
                    a.iter_boxed()
                        .zip(b.iter_boxed())
                        .map(|(x, y)| Ok((x?, y?))),
                )
            },
        )
    }

    /// This dataset's elements, then `other`'s (`concatenate`).
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::Dataset;
    /// let ints = |d: &Dataset<ferroflow_tensor::Tensor>| -> Vec<i64> { d.iter().map(|x| x.unwrap().item::<i64>().unwrap()).collect() };
    /// assert_eq!(ints(&Dataset::range(0, 2, 1).concatenate(&Dataset::range(5, 7, 1))), vec![0, 1, 5, 6]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn concatenate(&self, other: &Dataset<T>) -> Dataset<T> {
        let card = match (self.cardinality, other.cardinality) {
            (Cardinality::Finite(a), Cardinality::Finite(b)) => Cardinality::Finite(a + b),
            (Cardinality::Infinite, _) | (_, Cardinality::Infinite) => Cardinality::Infinite,
            _ => Cardinality::Unknown,
        };
        let (a, b) = (self.clone(), other.clone());
        let (fa, fb) = (self.fingerprint.clone(), other.fingerprint.clone());
        Dataset::from_parts(
            card,
            move || Ok(format!("concatenate({},{})", fa()?, fb()?)),
            move || {
                let b = b.clone();
                Box::new(
                    a.iter_boxed()
                        .chain(std::iter::once(()).flat_map(move |_| b.iter_boxed())),
                )
            },
        )
    }

    /// `f(self)`: a reusable chain of transformations (`apply`).
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::Dataset;
    /// let ints = |d: &Dataset<ferroflow_tensor::Tensor>| -> Vec<i64> { d.iter().map(|x| x.unwrap().item::<i64>().unwrap()).collect() };
    /// let every_other = |d: &Dataset<ferroflow_tensor::Tensor>| d.shard(2, 0);
    /// assert_eq!(ints(&Dataset::range(0, 6, 1).apply(every_other)?), vec![0, 2, 4]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn apply<U>(&self, f: impl FnOnce(&Dataset<T>) -> U) -> U {
        f(self)
    }

    /// Every `num_shards`-th element starting at `index` (`shard`): one worker's part of the
    /// input in distributed training. An error when `index >= num_shards`.
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::Dataset;
    /// let ints = |d: &Dataset<ferroflow_tensor::Tensor>| -> Vec<i64> { d.iter().map(|x| x.unwrap().item::<i64>().unwrap()).collect() };
    /// assert_eq!(ints(&Dataset::range(0, 10, 1).shard(3, 1)?), vec![1, 4, 7]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn shard(&self, num_shards: u64, index: u64) -> Result<Dataset<T>> {
        if num_shards == 0 || index >= num_shards {
            return Err(invalid(
                "shard",
                format!(
                    "index must be in [0, num_shards), got index {index}, num_shards {num_shards}"
                ),
            ));
        }
        let card = self
            .cardinality
            .map(|n| n / num_shards + u64::from(n % num_shards > index));
        Ok(
            self.derive(card, format!("shard({num_shards},{index})"), move |input| {
                Box::new(
                    input
                        .enumerate()
                        .filter(move |(i, _)| *i as u64 % num_shards == index)
                        .map(|(_, r)| r),
                )
            }),
        )
    }

    /// Elements drawn at random from a buffer of `buffer_size` (`shuffle`): a uniform
    /// permutation when the buffer holds the whole dataset. With `seed` the order is
    /// reproducible; without one it follows the global seed
    /// ([`ferroflow_tensor::random::set_seed`]) or fresh entropy, as in TF. With
    /// `reshuffle_each_iteration` every pass has a new order.
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::Dataset;
    /// let ds = Dataset::from_generator(|| 0..10).shuffle(10, Some(42), true)?;
    /// let mut order: Vec<i32> = ds.iter().collect::<Result<_, _>>()?;
    /// assert_ne!(order, (0..10).collect::<Vec<_>>());
    /// order.sort();
    /// assert_eq!(order, (0..10).collect::<Vec<_>>());
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn shuffle(
        &self,
        buffer_size: usize,
        seed: Option<u64>,
        reshuffle_each_iteration: bool,
    ) -> Result<Dataset<T>> {
        if buffer_size == 0 {
            return Err(invalid("shuffle", "buffer_size must be at least 1, got 0"));
        }
        let key = ferroflow_tensor::random::get_seed(seed);
        let pass = Arc::new(Mutex::new(0u64));
        let label = format!("shuffle({buffer_size},{seed:?},{reshuffle_each_iteration})");
        Ok(self.derive(self.cardinality, label, move |input| {
            let n = {
                let mut p = pass.lock().unwrap_or_else(|e| e.into_inner());
                let n = *p;
                if reshuffle_each_iteration {
                    *p += 1;
                }
                n
            };
            let rng = ferroflow_tensor::random::Philox::new([
                key[0],
                key[1] ^ n.wrapping_mul(0xD1B5_4A32_D192_ED03),
            ]);
            Box::new(Shuffle {
                input: Some(input),
                buffer: Vec::with_capacity(buffer_size.min(1 << 16)),
                buffer_size,
                rng,
            })
        }))
    }

    /// One dataset per input element, made by `f`, their elements interleaved
    /// (`interleave(f, cycle_length, block_length)`): `cycle_length` of them are open at once,
    /// `block_length` consecutive elements are taken from each in turn; an exhausted one is
    /// replaced by the next input element's dataset.
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::Dataset;
    /// let ints = |d: &Dataset<ferroflow_tensor::Tensor>| -> Vec<i64> { d.iter().map(|x| x.unwrap().item::<i64>().unwrap()).collect() };
    /// // Each element x becomes "x, x, x"; two at a time, one element from each in turn.
    /// let ds = Dataset::range(1, 4, 1)
    ///     .interleave(|x| Ok(Dataset::from_tensors(x).repeat(Some(3))), 2, 1)?;
    /// assert_eq!(ints(&ds), vec![1, 2, 1, 2, 1, 2, 3, 3, 3]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn interleave<U, F>(
        &self,
        f: F,
        cycle_length: usize,
        block_length: usize,
    ) -> Result<Dataset<U>>
    where
        U: Send + 'static,
        F: Fn(T) -> Result<Dataset<U>> + Send + Sync + 'static,
    {
        if cycle_length == 0 || block_length == 0 {
            return Err(invalid(
                "interleave",
                format!(
                    "cycle_length and block_length must be at least 1, got {cycle_length} and {block_length}"
                ),
            ));
        }
        let id = function_identity::<F>();
        let f = Arc::new(f);
        Ok(self.derive(
            Cardinality::Unknown,
            format!("interleave({id},{cycle_length},{block_length})"),
            move |input| {
                Box::new(Interleave {
                    input,
                    input_index: 0,
                    input_done: false,
                    f: f.clone(),
                    slots: (0..cycle_length).map(|_| None).collect(),
                    open: 0,
                    cycle: 0,
                    block: 0,
                    block_length,
                })
            },
        ))
    }

    /// Keeps the elements in memory after the first complete pass (`cache()`): later passes
    /// read them from there. A pass that stops early or meets an error caches nothing.
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::Dataset;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// static CALLS: AtomicUsize = AtomicUsize::new(0);
    /// let ds = Dataset::from_generator(|| 0..3)
    ///     .map(|x: i32| { CALLS.fetch_add(1, Ordering::SeqCst); Ok(x) })
    ///     .cache();
    /// assert_eq!(ds.iter().count(), 3);
    /// assert_eq!(ds.iter().count(), 3);
    /// assert_eq!(CALLS.load(Ordering::SeqCst), 3); // the second pass read the cache
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn cache(&self) -> Dataset<T>
    where
        T: Clone + Sync,
    {
        let store: Arc<Mutex<Option<Arc<Vec<T>>>>> = Arc::new(Mutex::new(None));
        self.derive(self.cardinality, "cache(memory)".into(), move |input| {
            let cached = store.lock().unwrap_or_else(|e| e.into_inner()).clone();
            match cached {
                Some(all) => Box::new((0..all.len()).map(move |i| Ok(all[i].clone()))),
                None => Box::new(CacheFill {
                    input,
                    seen: Vec::new(),
                    failed: false,
                    store: store.clone(),
                }),
            }
        })
    }

    /// Fills a background buffer of up to `buffer_size` elements on its own thread
    /// (`prefetch`), so producing the next elements overlaps with consuming this one.
    /// [`AUTOTUNE`] starts with a small buffer and grows it while the consumer finds it empty.
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::{Dataset, AUTOTUNE};
    /// let ds = Dataset::from_generator(|| 0..100).map(|x: i32| Ok(x + 1)).prefetch(AUTOTUNE);
    /// assert_eq!(ds.iter().map(|x| x.unwrap()).sum::<i32>(), 5050);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn prefetch(&self, buffer_size: impl Into<Parallelism>) -> Dataset<T> {
        let buffer = buffer_size.into();
        self.derive(self.cardinality, "prefetch".into(), move |input| {
            crate::parallel::prefetch(input, buffer)
        })
    }
}

impl<T: Structure> Dataset<T> {
    /// One element per slice along the first axis of every tensor in `structure`
    /// (`from_tensor_slices`): all must have the same first dimension. Slices are views
    /// (no copy).
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::Dataset;
    /// use ferroflow_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    /// let y = Tensor::from_slice(&[0i64, 1])?;
    /// let ds = Dataset::from_tensor_slices((x, y))?;
    /// let (x1, y1) = ds.iter().nth(1).unwrap()?;
    /// assert_eq!(x1.to_vec::<f32>()?, vec![3.0, 4.0]);
    /// assert_eq!(y1.item::<i64>()?, 1);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn from_tensor_slices(structure: T) -> Result<Dataset<T>> {
        let parts = structure.flatten();
        let n = match parts.first() {
            None => {
                return Err(invalid(
                    "from_tensor_slices",
                    "the structure holds no tensor",
                ))
            }
            Some(t) if t.rank() == 0 => {
                return Err(invalid(
                    "from_tensor_slices",
                    "cannot slice a scalar: every tensor needs a first axis",
                ))
            }
            Some(t) => t.shape()[0],
        };
        if let Some(t) = parts.iter().find(|t| t.rank() == 0 || t.shape()[0] != n) {
            return Err(invalid(
                "from_tensor_slices",
                format!(
                    "every tensor must have the same first dimension, got shapes {:?} and {:?}",
                    parts[0].shape(),
                    t.shape()
                ),
            ));
        }
        let spec = structure.spec();
        let parts = Arc::new(parts);
        let fp_parts = parts.clone();
        let splits = crate::split::claim();
        Ok(Dataset::from_parts(
            split_cardinality(n as u64, &splits),
            move || content_fingerprint("from_tensor_slices", &fp_parts),
            move || {
                let (parts, spec) = (parts.clone(), spec.clone());
                crate::split::source_iter(n as u64, splits.clone(), move |i| {
                    let slices = parts
                        .iter()
                        .map(|t| {
                            let mut spec = vec![ferroflow_tensor::SliceSpec::ALL; t.rank()];
                            spec[0] = ferroflow_tensor::SliceSpec::Index(i as isize);
                            t.strided_slice(&spec)
                        })
                        .collect::<Result<Vec<_>>>()?;
                    T::from_parts(&spec, &mut slices.into_iter())
                })
            },
        ))
    }

    /// A dataset of one element, `structure` itself (`from_tensors`).
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::Dataset;
    /// let ds = Dataset::from_tensors(ferroflow_tensor::Tensor::from_slice(&[1.0f32, 2.0])?);
    /// assert_eq!(ds.iter().next().unwrap()?.shape(), &[2]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn from_tensors(structure: T) -> Dataset<T>
    where
        T: Clone + Sync,
    {
        let parts = Arc::new(structure.flatten());
        let structure = Arc::new(structure);
        Dataset::from_parts(
            Cardinality::Finite(1),
            move || content_fingerprint("from_tensors", &parts),
            move || Box::new(std::iter::once(Ok((*structure).clone()))),
        )
    }

    /// Consecutive elements stacked along a new first axis (`batch`); the last batch may be
    /// smaller unless `drop_remainder`. Components must have equal shapes within a batch
    /// (else an error that points to `padded_batch`).
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::Dataset;
    /// let ints = |d: &Dataset<ferroflow_tensor::Tensor>| -> Vec<i64> { d.iter().map(|x| x.unwrap().item::<i64>().unwrap()).collect() };
    /// let b = Dataset::range(0, 5, 1).batch(2, false)?;
    /// let shapes: Vec<Vec<usize>> = b.iter().map(|t| t.unwrap().shape().to_vec()).collect();
    /// assert_eq!(shapes, vec![vec![2], vec![2], vec![1]]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn batch(&self, batch_size: usize, drop_remainder: bool) -> Result<Dataset<T>> {
        self.padded_or_plain_batch("batch", batch_size, drop_remainder, None)
    }

    /// Like [`batch`](Self::batch), padding every component to a common shape first
    /// (`padded_batch`): the largest in the batch along each axis, or the fixed sizes in
    /// `options.padded_shapes`, filled with `options.padding_value`.
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::{Dataset, PaddedBatch};
    /// use ferroflow_tensor::{DType, Tensor};
    /// let seqs = Dataset::from_generator(|| [1usize, 3]).map(|n| Tensor::ones(&[n], DType::I32));
    /// let b = seqs.padded_batch(2, false, PaddedBatch::default())?.iter().next().unwrap()?;
    /// assert_eq!(b.to_vec::<i32>()?, vec![1, 0, 0, 1, 1, 1]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn padded_batch(
        &self,
        batch_size: usize,
        drop_remainder: bool,
        options: PaddedBatch,
    ) -> Result<Dataset<T>> {
        self.padded_or_plain_batch("padded_batch", batch_size, drop_remainder, Some(options))
    }

    fn padded_or_plain_batch(
        &self,
        stage: &'static str,
        batch_size: usize,
        drop_remainder: bool,
        padding: Option<PaddedBatch>,
    ) -> Result<Dataset<T>> {
        if batch_size == 0 {
            return Err(invalid(stage, "batch_size must be at least 1, got 0"));
        }
        let b = batch_size as u64;
        let card = self
            .cardinality
            .map(|n| if drop_remainder { n / b } else { n.div_ceil(b) });
        let padding = Arc::new(padding);
        let label = format!("{stage}({batch_size},{drop_remainder},{:?})", padding);
        Ok(self.derive(card, label, move |input| {
            let padding = padding.clone();
            Box::new(
                Batches {
                    input,
                    batch_size,
                    drop_remainder,
                    index: 0,
                }
                .map(move |(i, r)| {
                    r.and_then(|elements| {
                        crate::batching::stack(&elements, padding.as_ref().as_ref())
                            .map_err(|e| at_element(stage, i, e))
                    })
                }),
            )
        }))
    }

    /// Every element split along its first axis into elements (`unbatch`).
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::Dataset;
    /// let ints = |d: &Dataset<ferroflow_tensor::Tensor>| -> Vec<i64> { d.iter().map(|x| x.unwrap().item::<i64>().unwrap()).collect() };
    /// let rows = Dataset::range(0, 5, 1).batch(2, false)?.unbatch();
    /// assert_eq!(ints(&rows), vec![0, 1, 2, 3, 4]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn unbatch(&self) -> Dataset<T> {
        self.derive(Cardinality::Unknown, "unbatch".into(), |input| {
            Box::new(input.enumerate().flat_map(|(i, r)| {
                let items: Vec<Result<T>> = match r.and_then(|x| {
                    crate::batching::unstack(&x).map_err(|e| at_element("unbatch", i as u64, e))
                }) {
                    Ok(v) => v.into_iter().map(Ok).collect(),
                    Err(e) => vec![Err(e)],
                };
                items
            }))
        })
    }
}

/// Options of [`Dataset::padded_batch`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PaddedBatch {
    /// Per flattened component, its padded shape: `None` sizes pad to the batch's largest.
    /// Empty: every component pads to the batch's largest along every axis.
    pub padded_shapes: Vec<Vec<Option<usize>>>,
    /// The fill value (0 by default), converted to each component's dtype.
    pub padding_value: f64,
}

fn content_fingerprint(label: &str, parts: &[Tensor]) -> Result<String> {
    let mut bytes = Vec::new();
    for t in parts {
        bytes.extend_from_slice(format!("{}{:?}", t.dtype(), t.shape()).as_bytes());
        t.extend_le_bytes(&mut bytes)?;
    }
    Ok(format!("{label}({})", stable_hash(&bytes)))
}

/// Groups of up to `batch_size` elements with their batch index; an upstream error replaces
/// the batch it falls in.
struct Batches<T> {
    input: ElementIter<T>,
    batch_size: usize,
    drop_remainder: bool,
    index: u64,
}

impl<T> Iterator for Batches<T> {
    type Item = (u64, Result<Vec<T>>);
    fn next(&mut self) -> Option<Self::Item> {
        let mut batch = Vec::with_capacity(self.batch_size);
        let mut error = None;
        while batch.len() < self.batch_size {
            match self.input.next() {
                None => break,
                Some(Ok(x)) => batch.push(x),
                Some(Err(e)) => {
                    error = Some(e);
                    break;
                }
            }
        }
        let i = self.index;
        if let Some(e) = error {
            self.index += 1;
            return Some((i, Err(e)));
        }
        if batch.is_empty() || (self.drop_remainder && batch.len() < self.batch_size) {
            return None;
        }
        self.index += 1;
        Some((i, Ok(batch)))
    }
}

struct Repeat<T> {
    dataset: Dataset<T>,
    remaining: Option<u64>,
    current: Option<ElementIter<T>>,
    yielded_this_round: bool,
}

impl<T: Send + 'static> Repeat<T> {
    fn new(dataset: Dataset<T>, count: Option<u64>) -> Self {
        Repeat {
            dataset,
            remaining: count,
            current: None,
            yielded_this_round: false,
        }
    }
}

impl<T: Send + 'static> Iterator for Repeat<T> {
    type Item = Result<T>;
    fn next(&mut self) -> Option<Result<T>> {
        loop {
            if let Some(it) = &mut self.current {
                if let Some(x) = it.next() {
                    self.yielded_this_round = true;
                    return Some(x);
                }
                self.current = None;
                if !self.yielded_this_round {
                    return None; // an empty round: repeating it forever yields nothing
                }
            }
            match &mut self.remaining {
                Some(0) => return None,
                Some(n) => *n -= 1,
                None => {}
            }
            self.current = Some(self.dataset.iter_boxed());
            self.yielded_this_round = false;
        }
    }
}

struct Shuffle<T> {
    input: Option<ElementIter<T>>,
    buffer: Vec<Result<T>>,
    buffer_size: usize,
    rng: ferroflow_tensor::random::Philox,
}

impl<T> Iterator for Shuffle<T> {
    type Item = Result<T>;
    fn next(&mut self) -> Option<Result<T>> {
        while self.buffer.len() < self.buffer_size {
            match self.input.as_mut().and_then(|it| it.next()) {
                Some(x) => self.buffer.push(x),
                None => {
                    self.input = None;
                    break;
                }
            }
        }
        if self.buffer.is_empty() {
            return None;
        }
        let r = ((self.rng.next_u32() as u64) << 32) | self.rng.next_u32() as u64;
        let i = ((r as u128 * self.buffer.len() as u128) >> 64) as usize;
        Some(self.buffer.swap_remove(i))
    }
}

type InterleaveFn<T, U> = dyn Fn(T) -> Result<Dataset<U>> + Send + Sync;

struct Interleave<T, U> {
    input: ElementIter<T>,
    input_index: u64,
    input_done: bool,
    f: Arc<InterleaveFn<T, U>>,
    slots: Vec<Option<ElementIter<U>>>,
    open: usize,
    cycle: usize,
    block: usize,
    block_length: usize,
}

impl<T: Send + 'static, U: Send + 'static> Iterator for Interleave<T, U> {
    type Item = Result<U>;
    fn next(&mut self) -> Option<Result<U>> {
        let n = self.slots.len();
        while !self.input_done || self.open > 0 {
            if let Some(it) = &mut self.slots[self.cycle] {
                if let Some(x) = it.next() {
                    self.block += 1;
                    if self.block == self.block_length {
                        self.block = 0;
                        self.cycle = (self.cycle + 1) % n;
                    }
                    return Some(x);
                }
                self.slots[self.cycle] = None;
                self.open -= 1;
                self.block = 0;
                self.cycle = (self.cycle + 1) % n;
            } else if !self.input_done {
                match self.input.next() {
                    None => self.input_done = true,
                    Some(r) => {
                        let i = self.input_index;
                        self.input_index += 1;
                        let f = &self.f;
                        match r.and_then(|x| call_guarded("interleave", || f(x))) {
                            Ok(ds) => {
                                self.slots[self.cycle] = Some(ds.iter_boxed());
                                self.open += 1;
                            }
                            Err(e) => return Some(Err(at_element("interleave", i, e))),
                        }
                    }
                }
            } else {
                self.block = 0;
                self.cycle = (self.cycle + 1) % n;
            }
        }
        None
    }
}

struct CacheFill<T> {
    input: ElementIter<T>,
    seen: Vec<T>,
    failed: bool,
    store: Arc<Mutex<Option<Arc<Vec<T>>>>>,
}

impl<T: Clone> Iterator for CacheFill<T> {
    type Item = Result<T>;
    fn next(&mut self) -> Option<Result<T>> {
        match self.input.next() {
            Some(Ok(x)) => {
                if !self.failed {
                    self.seen.push(x.clone());
                }
                Some(Ok(x))
            }
            Some(Err(e)) => {
                self.failed = true;
                self.seen = Vec::new();
                Some(Err(e))
            }
            None => {
                if !self.failed {
                    let all = std::mem::take(&mut self.seen);
                    let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
                    if store.is_none() {
                        *store = Some(Arc::new(all));
                    }
                    self.failed = true; // store once
                }
                None
            }
        }
    }
}

/// One pass over a dataset (a Rust `Iterator` of `Result<T>`).
pub struct DatasetIter<T> {
    inner: ElementIter<T>,
}

impl<T> Iterator for DatasetIter<T> {
    type Item = Result<T>;
    fn next(&mut self) -> Option<Result<T>> {
        // What the profiler counts as input time (TF's `IteratorGetNext`).
        let _span = ferroflow_tensor::trace::TraceMe::new(ferroflow_tensor::trace::INPUT_SPAN);
        self.inner.next()
    }
}

impl<T: Send + 'static> IntoIterator for &Dataset<T> {
    type Item = Result<T>;
    type IntoIter = DatasetIter<T>;
    fn into_iter(self) -> DatasetIter<T> {
        self.iter()
    }
}

impl Dataset<Tensor> {
    /// `start, start + step, ...` up to `stop` (exclusive) as `i64` scalars (`range`); an
    /// empty dataset when `step` is 0 or points away from `stop`.
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::Dataset;
    /// let ints = |d: &Dataset<ferroflow_tensor::Tensor>| -> Vec<i64> { d.iter().map(|x| x.unwrap().item::<i64>().unwrap()).collect() };
    /// assert_eq!(ints(&Dataset::range(0, 10, 4)), vec![0, 4, 8]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn range(start: i64, stop: i64, step: i64) -> Dataset<Tensor> {
        let n = if step > 0 && stop > start {
            ((stop - start) as u64).div_ceil(step as u64)
        } else if step < 0 && stop < start {
            ((start - stop) as u64).div_ceil(step.unsigned_abs())
        } else {
            0
        };
        let splits = crate::split::claim();
        Dataset::from_parts(
            split_cardinality(n, &splits),
            move || Ok(format!("range({start},{stop},{step})")),
            move || {
                crate::split::source_iter(n, splits.clone(), move |i| {
                    Tensor::scalar(start + i as i64 * step)
                })
            },
        )
    }
}
