//! Complex gradients against TensorFlow's own: `fixtures/tf_complex.json` holds, per op, fixed
//! inputs, TF's output and `tf.GradientTape`'s gradient of the real loss
//! L = Σ re(y)·w + im(y)·w' (written by `fixtures/tf_complex.py`). The same op and loss here
//! must give the same output and gradients: TF's convention for complex gradients
//! (∂L/∂x + i·∂L/∂y), its FFT scaling and rfft/irfft's Hermitian handling.

use ferroflow::autodiff::{GradientTape, Source};
use ferroflow::{Axes, Complex32, Complex64, DType, HostData, Tensor};
use serde_json::Value;

fn numbers(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("numbers")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

/// An encoded tensor (complex when it has imaginary parts) in single or double precision.
fn decode(v: &Value, single: bool) -> Tensor {
    let shape: Vec<usize> = numbers(&v["shape"]).iter().map(|&d| d as usize).collect();
    let re = numbers(&v["re"]);
    let data = match (v.get("im").map(numbers), single) {
        (Some(im), true) => HostData::C64(
            re.iter()
                .zip(&im)
                .map(|(&a, &b)| Complex32::new(a as f32, b as f32))
                .collect(),
        ),
        (Some(im), false) => HostData::C128(
            re.iter()
                .zip(&im)
                .map(|(&a, &b)| Complex64::new(a, b))
                .collect(),
        ),
        (None, true) => HostData::F32(re.iter().map(|&a| a as f32).collect()),
        (None, false) => HostData::F64(re),
    };
    Tensor::from_host(data, &shape).expect("upload")
}

/// The fixture's weights: w[i] = ((37i mod 11) - 5)/4 + 0.1, w'[i] = ((13i mod 7) - 3)/5 - 0.2.
fn loss(y: &Tensor) -> ferroflow::Result<Tensor> {
    let n = y.num_elements();
    let part = y.dtype().real_dtype();
    let w = |f: fn(usize) -> f64| -> ferroflow::Result<Tensor> {
        let v: Vec<f64> = (0..n).map(f).collect();
        Tensor::from_host(HostData::from_f64_slice(part, &v), y.shape())
    };
    let w1 = w(|i| ((i * 37 % 11) as f64 - 5.0) / 4.0 + 0.1)?;
    let w2 = w(|i| ((i * 13 % 7) as f64 - 3.0) / 5.0 - 0.2)?;
    y.real()?
        .mul(&w1)?
        .add(&y.imag()?.mul(&w2)?)?
        .reduce_sum(Axes::All, false)
}

fn apply(op: &str, x: &[Tensor]) -> ferroflow::Result<Tensor> {
    let z = &x[0];
    match op {
        "exp" => z.exp(),
        "log" => z.log(),
        "sqrt" => z.sqrt(),
        "tanh" => z.tanh(),
        "sin" => z.sin(),
        "reciprocal" => z.reciprocal(),
        "square" => z.square(),
        "sigmoid" => z.sigmoid(),
        "abs" => z.abs(),
        "angle" => z.angle(),
        "real" => z.real(),
        "imag" => z.imag(),
        "conj" => z.conj(),
        "mul" => z.mul(&x[1]),
        "div" => z.div(&x[1]),
        "pow" => z.pow(&x[1]),
        "matmul" => z.matmul(&x[1]),
        "reduce_sum" => z.reduce_sum(1, false),
        "reduce_prod" => z.reduce_prod(1, false),
        "cumsum" => z.cumsum(1, false, false),
        "cumprod" => z.cumprod(1, false, false),
        "complex" => Tensor::complex(z, &x[1]),
        "cast" => z.cast(DType::F64),
        "fft" => z.fft(),
        "ifft" => z.ifft(),
        "rfft" => z.rfft(None),
        "irfft" if z.shape()[1] == 4 => z.irfft(Some(7)),
        "irfft" => z.irfft(None),
        other => panic!("the fixture has an op this test does not know: {other}"),
    }
}

/// Element-wise closeness of two tensors' real and imaginary parts.
fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f64) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    for (part, f) in [
        ("re", Tensor::real as fn(&Tensor) -> _),
        ("im", Tensor::imag),
    ] {
        let g = f(got).unwrap().to_f64_vec().unwrap();
        let w = f(want).unwrap().to_f64_vec().unwrap();
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            assert!(
                (a - b).abs() <= tol * (1.0 + b.abs()),
                "{what} {part}[{i}]: ours {a}, TensorFlow {b}"
            );
        }
    }
}

#[test]
fn complex_outputs_and_gradients_match_tensorflow() {
    ferroflow::init();
    let doc: Value = serde_json::from_str(include_str!("fixtures/tf_complex.json")).unwrap();
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 30, "the fixture has {} cases", cases.len());
    for case in cases {
        let op = case["op"].as_str().unwrap();
        let single = case["dtype"] == "single";
        // cumprod: central differences of TF's forward op (its gradient lacks a conjugate)
        let tol = if single {
            2e-5
        } else if case.get("tf_grads").is_some() {
            1e-8
        } else {
            1e-12
        };
        let xs: Vec<Tensor> = case["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| decode(v, single))
            .collect();
        let tape = GradientTape::new();
        for x in &xs {
            tape.watch(x);
        }
        let y = apply(op, &xs).unwrap_or_else(|e| panic!("{op}: {e}"));
        assert_close(
            &format!("{op} output"),
            &y,
            &decode(&case["output"], single),
            tol,
        );
        let l = loss(&y).unwrap();
        let sources: Vec<Source> = xs.iter().map(Source::from).collect();
        let grads = tape.gradient(&l, &sources).unwrap();
        for (k, (g, want)) in grads
            .iter()
            .zip(case["grads"].as_array().unwrap())
            .enumerate()
        {
            let g = g
                .clone()
                .unwrap_or_else(|| panic!("{op}: no gradient for input {k}"));
            assert_close(
                &format!("{op} gradient {k}"),
                &g,
                &decode(want, single),
                tol,
            );
        }
    }
}
