//! The backend conformance suite: one set of tests every backend runs.
//!
//! Each family checks ops against a plain f64 reference ([`reference`]) with proptest: random
//! shapes (including zero-sized axes and scalars), broadcasting, non-contiguous views
//! (transposed, reversed, strided, offset), every dtype the op takes, with tolerances per
//! dtype. A backend crate stamps the whole suite into its tests with one macro line:
//!
//! ```text
//! ferroflow_tensor::conformance_tests!(ferroflow_cpu::register(), ferroflow_tensor::Device::CPU);
//! ```
//!
//! `FERROFLOW_CONFORMANCE_CASES` sets the cases per property (default 256). The form
//! `conformance_tests!(observed: device, observer)` runs every case with an op observer on
//! its thread (graph functions check that each op's replay equals the eager op this way).

pub mod elementwise;
pub mod harness;
pub mod reference;

pub mod complex;
pub mod creation;
pub mod fused;
pub mod index;
pub mod linalg;
pub mod nn;
pub mod reduce;
pub mod robustness;
pub mod shape;
pub mod sort;

/// Expands to one `#[test]` per conformance family, each running `$setup` first and then the
/// family's checks on `$device`.
#[macro_export]
macro_rules! conformance_tests {
    ($setup:expr, $device:expr) => {
        $crate::conformance_tests!(optional: {
            $setup;
            Some($device)
        });
    };
    // A device that may be absent: `$device` is an `Option<Device>`, `None` skips every test
    // (the caller prints why).
    (optional: $device:expr) => {
        $crate::conformance_tests!(@families $device, {});
    };
    // Every case with `$observer` (an `Arc<dyn OpObserver>`, made once per test) watching
    // the ops it dispatches on its thread: graph functions check each op's replay this way.
    (observed: $device:expr, $observer:expr) => {
        $crate::conformance_tests!(@families $device, { $observer });
    };
    (@families $device:expr, $observer:tt) => {
        $crate::conformance_tests!(@each_optional $device, $observer,
            unary_float_ops => elementwise::unary_float_ops,
            unary_int_ops => elementwise::unary_int_ops,
            binary_float_ops => elementwise::binary_float_ops,
            binary_int_ops => elementwise::binary_int_ops,
            binary_logical_ops => elementwise::binary_logical_ops,
            cast_all_pairs => elementwise::cast_all_pairs,
            select => elementwise::select,
            clip_scalar => elementwise::clip_scalar,
            reductions => reduce::reductions,
            mean_and_logsumexp => reduce::mean_and_logsumexp,
            arg_reductions => reduce::arg_reductions,
            long_arg_reductions => reduce::long_arg_reductions,
            matmul => linalg::matmul,
            fused_matmul => linalg::fused_matmul,
            fused_matmul_reduce => linalg::fused_matmul_reduce,
            reshape_transpose_reverse => shape::reshape_transpose_reverse,
            strided_slice => shape::strided_slice,
            concat_split_stack => shape::concat_split_stack,
            pad_and_tile => shape::pad_and_tile,
            broadcast_expand_squeeze => shape::broadcast_expand_squeeze,
            gather_scatter => index::gather_scatter,
            many_index_scatter_adds => index::many_index_scatter_adds,
            gather_group => index::gather_group,
            nd_and_one_hot => index::nd_and_one_hot,
            scans => sort::scans,
            sorting => sort::sorting,
            long_sorts => sort::long_sorts,
            long_scans => sort::long_scans,
            conv2d => nn::conv2d,
            fused_conv2d => nn::fused_conv2d,
            bias_activation_grad => nn::bias_activation_grad,
            pooling => nn::pooling,
            softmax => nn::softmax,
            sparse_softmax_cross_entropy => nn::sparse_softmax_cross_entropy,
            wide_softmax_cross_entropy => nn::wide_softmax_cross_entropy,
            creation_and_round_trip => creation::creation_and_round_trip,
            random_statistics => creation::random_statistics,
            variables => creation::variables,
            optimizer_update => fused::optimizer_update,
            optimizer_update_group => fused::optimizer_update_group,
            complex_unary_ops => complex::complex_unary_ops,
            complex_binary_ops => complex::complex_binary_ops,
            complex_parts_and_casts => complex::complex_parts_and_casts,
            complex_reductions_and_scans => complex::complex_reductions_and_scans,
            complex_matmul => complex::complex_matmul,
            complex_fft => complex::complex_fft,
            declared_fused_kernels => fused::declared_fused_kernels,
            elementwise_program => fused::elementwise_program,
            never_panics => robustness::never_panics,
            hostile_arguments => robustness::hostile_arguments,
        );
    };
    (@observe {}) => {
        ()
    };
    (@observe { $observer:expr }) => {
        $crate::push_thread_observer($observer)
    };
    (@each_optional $device:expr, $observer:tt,
        $($name:ident => $($path:ident)::+),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                let device: Option<$crate::Device> = $device;
                if let Some(device) = device {
                    let _observer = $crate::conformance_tests!(@observe $observer);
                    // Under the device's scope: what a case creates without naming a device
                    // lands on the device under test, and no other backend is needed.
                    $crate::with_device(&device.to_string(), || {
                        $crate::conformance::$($path)::+(&device)
                    })
                    .expect("the device under test is registered");
                }
            }
        )*
    };
}
