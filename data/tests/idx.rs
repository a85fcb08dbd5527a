//! IDX: the MNIST copy in the repository reads back with the counts its README states, and
//! random tensors round-trip through write/read for every IDX type.

use ferroflow_data::idx;
use ferroflow_tensor::{DType, Error, Tensor};
use proptest::prelude::*;

fn mnist(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../datasets/mnist")
        .join(name)
}

#[test]
fn mnist_test_split_matches_its_readme() {
    ferroflow::init();
    let images = idx::read(mnist("t10k-images-idx3-ubyte.gz")).unwrap();
    assert_eq!(images.shape(), &[10000, 28, 28]);
    assert_eq!(images.dtype(), DType::U8);
    let labels = idx::read(mnist("t10k-labels-idx1-ubyte.gz"))
        .unwrap()
        .to_vec::<u8>()
        .unwrap();
    assert_eq!(&labels[..5], &[7, 2, 1, 0, 4]);
    let mut counts = [0usize; 10];
    for &l in &labels {
        counts[l as usize] += 1;
    }
    assert_eq!(
        counts,
        [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    );
    // Pixels span the whole byte range: background 0 and full ink 255 both occur.
    let px = images.to_vec::<u8>().unwrap();
    assert_eq!(px.iter().min(), Some(&0));
    assert_eq!(px.iter().max(), Some(&255));
}

#[test]
fn malformed_files_are_errors_naming_the_problem() {
    ferroflow::init();
    let scratch = tempfile::Builder::new()
        .prefix("ferroflow-idx-")
        .tempdir()
        .unwrap();
    let dir = scratch.path();
    let cases: [(&str, Vec<u8>, &str); 4] = [
        ("magic", vec![1, 0, 8, 1, 0, 0, 0, 1, 7], "two zero bytes"),
        ("header", vec![0, 0, 8, 3, 0, 0], "truncated"),
        ("type", vec![0, 0, 0x42, 1, 0, 0, 0, 1, 7], "type code 0x42"),
        ("short", vec![0, 0, 8, 1, 0, 0, 0, 3, 7], "3 data bytes"),
    ];
    for (name, bytes, needle) in cases {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        match idx::read(&p) {
            Err(Error::Format { msg, .. }) => assert!(msg.contains(needle), "{name}: {msg}"),
            other => panic!("{name}: expected a format error, got {other:?}"),
        }
    }
    let gz = dir.join("bad.gz");
    std::fs::write(&gz, [0x1f, 0x8b, 8, 0, 1, 2, 3]).unwrap();
    assert!(matches!(idx::read(&gz), Err(Error::Format { .. })));
    assert!(matches!(
        idx::read(dir.join("missing")),
        Err(Error::Io { .. })
    ));
    let bad_dtype = Tensor::from_vec(vec![1i64], &[1]).unwrap();
    assert!(matches!(
        idx::write(dir.join("i64"), &bad_dtype),
        Err(Error::UnsupportedDType { .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn write_then_read_round_trips(
        shape in prop::collection::vec(0usize..5, 0..4),
        kind in 0usize..6,
        seed in any::<u64>(),
    ) {
        ferroflow::init();
        let n: usize = shape.iter().product();
        let mut s = seed;
        let mut next = || { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (s >> 33) as u32 };
        let t = match kind {
            0 => Tensor::from_vec((0..n).map(|_| next() as u8).collect::<Vec<_>>(), &shape),
            1 => Tensor::from_vec((0..n).map(|_| next() as i8).collect::<Vec<_>>(), &shape),
            2 => Tensor::from_vec((0..n).map(|_| next() as i32).collect::<Vec<_>>(), &shape),
            3 => Tensor::from_vec((0..n).map(|_| f32::from_bits(next() & 0x7f7f_ffff)).collect::<Vec<_>>(), &shape),
            4 => Tensor::from_vec((0..n).map(|_| next() as i16).collect::<Vec<_>>(), &shape),
            _ => Tensor::from_vec((0..n).map(|_| next() as f64 / 7.0 - 1e5).collect::<Vec<_>>(), &shape),
        }.unwrap();
        let file = tempfile::Builder::new().prefix("ferroflow-idx-rt-").tempfile().unwrap();
        let p = file.path();
        idx::write(p, &t).unwrap();
        let back = idx::read(p).unwrap();
        prop_assert_eq!(back.shape(), t.shape());
        prop_assert_eq!(back.dtype(), t.dtype());
        prop_assert_eq!(back.to_host().unwrap(), t.to_host().unwrap());
    }
}
