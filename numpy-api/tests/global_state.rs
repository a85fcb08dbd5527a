//! Process-global NumPy state (the `prefer_float32` switch and the `numpy.random`
//! generator), tested in a binary of its own so no other test changes it meanwhile.

use ferroflow_numpy::{self as np, DType};

fn init() {
    ferroflow::init();
}

fn prefer_float32_switches_the_default_float() {
    init();
    np::set_prefer_float32(true);
    let a = np::asarray([1.0, 2.0]).unwrap();
    let l = np::linspace(0.0, 1.0, 3).unwrap();
    let m = np::mean(np::asarray([1i64, 2]).unwrap()).unwrap();
    let d = np::true_divide(np::asarray([1i64, 2]).unwrap(), 2).unwrap();
    np::set_prefer_float32(false);
    assert_eq!(
        (a.dtype(), l.dtype(), m.dtype(), d.dtype()),
        (DType::F32, DType::F32, DType::F32, DType::F32)
    );
}

fn random_numbers_have_the_right_distribution_and_seeding() {
    init();
    np::random::seed(11);
    let u = np::random::uniform(-2.0, 4.0, &[20000]).unwrap();
    let v = u.to_vec::<f64>().unwrap();
    assert!(v.iter().all(|x| (-2.0..4.0).contains(x)));
    let mean: f64 = v.iter().sum::<f64>() / v.len() as f64;
    assert!((mean - 1.0).abs() < 0.05, "uniform mean {mean}");
    let n = np::random::standard_normal(&[20000]).unwrap();
    let (m, s) = (
        np::mean(&n).unwrap().item::<f64>().unwrap(),
        np::std(&n).unwrap().item::<f64>().unwrap(),
    );
    assert!(
        m.abs() < 0.03 && (s - 1.0).abs() < 0.03,
        "normal mean {m} std {s}"
    );
    let r = np::random::randn(&[3, 2]).unwrap();
    assert_eq!((r.shape(), r.dtype()), (&[3usize, 2][..], DType::F64));
    let k = np::random::randint(-3, 3, &[6000], DType::I32).unwrap();
    let counts = np::unique_all(&k).unwrap().counts.to_vec::<i64>().unwrap();
    assert_eq!(counts.len(), 6);
    assert!(counts.iter().all(|c| (800..1200).contains(c)), "{counts:?}");
    np::random::seed(5);
    let a = np::random::rand(&[4]).unwrap().to_vec::<f64>().unwrap();
    let b = np::random::random(&[4]).unwrap().to_vec::<f64>().unwrap();
    np::random::seed(5);
    assert_eq!(np::random::rand(&[4]).unwrap().to_vec::<f64>().unwrap(), a);
    assert_ne!(a, b);
    assert!(np::random::randint(3, 3, &[1], None).is_err());
}

/// One test, so the two never run at the same time.
#[test]
fn global_switch_and_generator() {
    prefer_float32_switches_the_default_float();
    random_numbers_have_the_right_distribution_and_seeding();
}
