//! ferroflow-data: input pipelines (`tf.data`) and the file formats they read.
//!
//! A [`Dataset`] is a recipe for a stream of elements: sources ([`Dataset::from_tensor_slices`],
//! [`Dataset::range`], [`Dataset::from_generator`], [`Dataset::list_files`], readers for
//! [TFRecord](tfrecord), [CSV](csv), [`.npy`](npy) and [IDX](idx)), transformations (`map`
//! sequential or on worker threads, `filter`, `batch`, `padded_batch`, `unbatch`, `shuffle`,
//! `repeat`, `take`, `skip`, `zip`, `concatenate`, `interleave`, `shard`, `enumerate`,
//! `apply`, `prefetch`, `cache`, `cache_file`) and [`snapshot`](Dataset::snapshot).
//! Iterating is a Rust `Iterator` of `Result<T>`.
//!
//! # Overview
//! - [`Dataset<T>`](Dataset): the recipe; each transformation wraps the one before it, and
//!   [`Dataset::iter`] builds the chain of iterators (worker threads for parallel `map` and
//!   `prefetch` live in the iterator, and stop when it is dropped).
//! - [`Structure`]: what an element may be (a tensor, tuples and vectors of them: `tf.nest`);
//!   `batch`, `unbatch`, `padded_batch`, `cache_file` and `snapshot` work through it, and
//!   [`encode_element`] / [`decode_element`] are its byte form on disk.
//! - Readers and writers of files: [`tfrecord`], [`csv`], [`npy`], [`idx`]; every writer
//!   is crash-safe (`ferroflow_tensor::fs`), every reader treats sizes in a file as claims.
//! - Errors of one element are `Error::Pipeline { stage, index, source }`: the pipeline
//!   goes on or stops as `tf.data` does (`ignore_errors` skips them).
//!
//! The seed example of the issue: 1000 rows of 1024 normal values, clipped, in batches of 100.
//!
//! ```
//! ferroflow::init();
//! use ferroflow_data::{Dataset, AUTOTUNE};
//! use ferroflow_tensor::{random, DType, Tensor};
//! let x = random::normal(&[1000, 1024], 0.0, 1.0, DType::F32, Some(1))?;
//! let ds = Dataset::from_tensor_slices(x)?
//!     .map(|row: Tensor| row.clip_by_value(&row.scalar_like(-1.0)?, &row.scalar_like(1.0)?))
//!     .batch(100, false)?
//!     .prefetch(AUTOTUNE);
//! let mut batches = 0;
//! for batch in &ds {
//!     let batch = batch?;
//!     assert_eq!(batch.shape(), &[100, 1024]);
//!     assert!(batch.to_vec::<f32>()?.iter().all(|v| v.abs() <= 1.0));
//!     batches += 1;
//! }
//! assert_eq!(batches, 10);
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```

#![warn(missing_docs)]

mod batching;
pub mod csv;
mod dataset;
mod files;
pub mod idx;
pub mod npy;
mod parallel;
#[cfg(feature = "service")]
pub mod service;
mod snapshot;
mod split;
mod structure;
pub mod tfrecord;

pub use dataset::{
    Cardinality, Dataset, DatasetIter, ElementIter, PaddedBatch, Parallelism, AUTOTUNE,
};
pub use snapshot::SnapshotOptions;
pub use structure::{decode_element, encode_element, Spec, Structure};
