//! Reading a CPU tensor's elements in place. `Tensor::host_slice`: borrowed when they are
//! one dense row-major run of the requested type (rows sliced off the front or the back of a
//! matrix included), and `None` for every view that needs gathering, for another dtype, and
//! inside a trace; what it borrows always equals what `to_host` copies.
//! `Tensor::extend_le_bytes`: the bytes `to_host()?.to_le_bytes()` gives, for every view and
//! dtype, whether they come from the storage or a host copy.

use ferroflow_tensor::{DType, HostData, Tensor};
use proptest::prelude::*;

/// A `rows × cols` f32 matrix of distinct values.
fn matrix(rows: usize, cols: usize) -> Tensor {
    let values: Vec<f32> = (0..rows * cols).map(|i| i as f32 * 0.5 - 3.0).collect();
    Tensor::from_vec(values, &[rows, cols]).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn borrowed_values_are_the_tensors_values(
        rows in 1usize..9,
        cols in 1usize..9,
        first in 0usize..9,
        take in 0usize..9,
    ) {
        ferroflow_cpu::register();
        let x = matrix(rows, cols);
        let first = first % rows;
        let take = take.min(rows - first);
        // Dense: the whole tensor, a reshape of it, a run of whole rows at any offset.
        for dense in [
            x.clone(),
            x.reshape_to(&[rows * cols]).unwrap(),
            x.slice(&[first, 0], &[take as isize, -1]).unwrap(),
        ] {
            let borrowed = dense.host_slice::<f32>();
            prop_assert_eq!(borrowed, Some(&dense.to_vec::<f32>().unwrap()[..]));
        }
        // Another dtype: declined.
        prop_assert_eq!(x.host_slice::<f64>(), None);
        prop_assert_eq!(x.host_slice::<i32>(), None);
        // Views whose elements are not one run: declined.
        if rows > 1 && cols > 1 {
            let transposed = x.transpose(&[1, 0]).unwrap();
            prop_assert_eq!(transposed.host_slice::<f32>(), None);
        }
        if cols > 1 {
            let column = x.slice(&[0, 1], &[-1, 1]).unwrap();
            prop_assert_eq!(
                column.host_slice::<f32>().is_none(),
                rows > 1,
                "a column of {} rows", rows
            );
        }
        let wide = x.expand_dims(0).unwrap().broadcast_to(&[2, rows, cols]).unwrap();
        prop_assert_eq!(wide.host_slice::<f32>(), None);
    }

    #[test]
    fn appended_bytes_are_the_host_copys_bytes(
        rows in 1usize..7,
        cols in 1usize..7,
        first in 0usize..7,
        dtype in prop_oneof![
            Just(DType::F32),
            Just(DType::F16),
            Just(DType::I64),
            Just(DType::U8),
            Just(DType::Bool),
        ],
    ) {
        ferroflow_cpu::register();
        let x = matrix(rows, cols).cast(dtype).unwrap();
        let first = first % rows;
        for view in [
            x.clone(),
            x.slice(&[first, 0], &[-1, -1]).unwrap(),
            x.transpose(&[1, 0]).unwrap(),
            x.expand_dims(0).unwrap().broadcast_to(&[2, rows, cols]).unwrap(),
        ] {
            let mut out = vec![0xAB];
            view.extend_le_bytes(&mut out).unwrap();
            let mut want = vec![0xAB];
            want.extend(view.to_host().unwrap().to_le_bytes());
            prop_assert_eq!(&out, &want, "{:?} {:?}", dtype, view.shape());
            // And they read back as the values.
            let back = HostData::from_le_bytes(dtype, &out[1..]).unwrap();
            prop_assert_eq!(back, view.to_host().unwrap());
        }
    }
}

#[test]
fn other_dtypes_are_borrowed_as_their_own_type() {
    ferroflow_cpu::register();
    let x = matrix(3, 4).cast(DType::F64).unwrap();
    assert_eq!(x.host_slice::<f64>(), Some(&x.to_vec::<f64>().unwrap()[..]));
    assert_eq!(x.host_slice::<f32>(), None);
}

#[test]
fn nothing_is_borrowed_while_tracing() {
    ferroflow_cpu::register();
    let x = matrix(2, 3);
    let tracing = ferroflow_tensor::dispatch::enter_tracing();
    // A graph would keep this call's values: declined, as `to_host` refuses.
    assert_eq!(x.host_slice::<f32>(), None);
    drop(tracing);
    assert!(x.host_slice::<f32>().is_some());
}

#[test]
fn appending_bytes_while_tracing_is_the_host_reads_error() {
    ferroflow_cpu::register();
    let x = matrix(2, 3);
    let tracing = ferroflow_tensor::dispatch::enter_tracing();
    let mut out = vec![];
    let e = x.extend_le_bytes(&mut out).unwrap_err();
    drop(tracing);
    assert!(e.to_string().contains("to_host"), "{e}");
    assert!(out.is_empty());
}
