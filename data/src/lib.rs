//! ferroflow-data: input pipelines and the file formats they read (`tf.data`).
//!
//! So far: the IDX format of MNIST ([`idx`]), gzip-compressed or plain.
//!
//! ```no_run
//! ferroflow::init();
//! let images = ferroflow_data::idx::read("datasets/mnist/t10k-images-idx3-ubyte.gz")?;
//! assert_eq!(images.shape(), &[10000, 28, 28]);
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```

#![warn(missing_docs)]

pub mod idx;
