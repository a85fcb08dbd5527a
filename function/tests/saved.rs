//! Graph files: a traced function saved and loaded back without its closure gives the same
//! values bit for bit (ops with attributes, constants, fused kernels, control flow, tapes
//! inside), reads and updates the caller's variables bound by name, and a damaged file or a
//! wrong variable is an error, never a panic.

use ferroflow::autodiff::GradientTape;
use ferroflow::function::{cond, while_loop, ConcreteFunction, Function, NodeKind};
use ferroflow::{random, Axes, DType, Error, Result, Tensor, Variable};
use proptest::prelude::*;
use std::path::PathBuf;

mod common;
use common::bits;

fn normal(shape: &[usize], seed: u64) -> Tensor {
    random::stateless_normal(shape, [seed, 5], 0.0, 1.0, DType::F32).unwrap()
}

/// A file in a fresh temporary folder, removed with it.
struct TempFile {
    dir: PathBuf,
    path: PathBuf,
}

impl TempFile {
    fn new(name: &str) -> TempFile {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ferroflow-saved-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        TempFile { dir, path }
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A dense layer's weights.
struct Dense {
    kernel: Variable,
    bias: Variable,
}

fn dense(name: &str, inputs: usize, units: usize, seed: u64) -> Dense {
    Dense {
        kernel: Variable::new(format!("{name}/kernel"), normal(&[inputs, units], seed)),
        bias: Variable::new(format!("{name}/bias"), normal(&[units], seed + 1)),
    }
}

/// An MLP training step: GELU from primitives (fused), softmax cross-entropy against
/// one-hot labels, gradients from a tape inside, an SGD update written to the variables.
fn train_step(layers: &[Dense], args: &[Tensor]) -> Result<Vec<Tensor>> {
    let (x, labels) = (&args[0], &args[1]);
    let tape = GradientTape::new();
    let mut h = x.clone();
    for (i, l) in layers.iter().enumerate() {
        h = h.matmul(&l.kernel.value())?.add(&l.bias.value())?;
        if i + 1 < layers.len() {
            // 0.5·h·(1 + tanh(√(2/π)·(h + 0.044715·h³)))
            let inner = h.add(&h.mul(&h)?.mul(&h)?.mul(&h.scalar_like(0.044715)?)?)?;
            let t = inner.mul(&h.scalar_like(0.797_884_6)?)?.tanh()?;
            h = h
                .mul(&t.add(&t.scalar_like(1.0)?)?)?
                .mul(&h.scalar_like(0.5)?)?;
        }
    }
    let log_p = h.sub(&h.reduce_logsumexp(Axes::List(vec![-1]), true)?)?;
    let loss = log_p
        .mul(labels)?
        .reduce_sum(Axes::All, false)?
        .neg()?
        .div(&log_p.scalar_like(x.shape()[0] as f64)?)?;
    let sources: Vec<_> = layers
        .iter()
        .flat_map(|l| [(&l.kernel).into(), (&l.bias).into()])
        .collect();
    let grads = tape.gradient(&loss, &sources)?;
    let vars = layers.iter().flat_map(|l| [&l.kernel, &l.bias]);
    for (v, g) in vars.zip(grads) {
        let g = g.ok_or_else(|| Error::invalid("test", "no gradient"))?;
        v.assign_sub(&g.mul(&g.scalar_like(0.1)?)?)?;
    }
    Ok(vec![loss, h])
}

fn batch(seed: u64) -> (Tensor, Tensor) {
    let x = normal(&[8, 6], seed);
    let classes = random::stateless_uniform(&[8], [seed, 9], 0.0, 3.0, DType::I32).unwrap();
    let labels = Tensor::one_hot(&classes, 3, 1.0, 0.0, DType::F32).unwrap();
    (x, labels)
}

#[test]
fn a_saved_training_step_trains_the_callers_variables_as_the_traced_one_does() {
    ferroflow::init();
    let file = TempFile::new("step.ffgraph");
    let (traced_layers, loaded_layers) = (
        [dense("dense", 6, 5, 1), dense("dense_1", 5, 3, 3)],
        [dense("dense", 6, 5, 1), dense("dense_1", 5, 3, 3)],
    );
    let f = {
        let layers: Vec<Dense> = traced_layers
            .iter()
            .map(|l| Dense {
                kernel: l.kernel.clone(),
                bias: l.bias.clone(),
            })
            .collect();
        Function::new(move |a: &[Tensor]| train_step(&layers, a))
    };
    let (x, labels) = batch(20);
    // Tracing is the first call: one step on the traced variables.
    let concrete = f
        .get_concrete_function(&[x.clone(), labels.clone()])
        .unwrap();
    assert!(
        concrete.stats().fused > 0,
        "the GELU is fused:\n{}",
        concrete.graph().listing()
    );
    concrete.save(&file.path).unwrap();
    let loaded_vars: Vec<Variable> = loaded_layers
        .iter()
        .flat_map(|l| [l.kernel.clone(), l.bias.clone()])
        .collect();
    let loaded = ConcreteFunction::load(&file.path, &loaded_vars).unwrap();
    assert_eq!(loaded.graph().listing(), concrete.graph().listing());
    assert_eq!(loaded.input_types(), concrete.input_types());
    loaded.call(&[x, labels]).unwrap();
    // Three steps each: the same losses, outputs and weights, bit for bit.
    for step in 0..3 {
        let (x, labels) = batch(30 + step);
        let want = f.call(&[x.clone(), labels.clone()]).unwrap();
        let got = loaded.call(&[x, labels]).unwrap();
        for (w, g) in want.iter().zip(&got) {
            assert_eq!(bits(w), bits(g), "step {step}");
        }
        for (a, b) in traced_layers.iter().zip(&loaded_layers) {
            assert_eq!(
                bits(&a.kernel.value()),
                bits(&b.kernel.value()),
                "step {step}"
            );
            assert_eq!(bits(&a.bias.value()), bits(&b.bias.value()), "step {step}");
        }
    }
    assert_eq!(f.tracing_count(), 1);
}

/// y = cond(sum(x) > 0, x·w, x²) then halved until its largest |value| is below 1.
fn control_flow(w: &Tensor, x: &Tensor) -> Result<Vec<Tensor>> {
    let total = x.reduce_sum(Axes::All, false)?;
    let y = cond(
        &total.greater(&total.scalar_like(0.0)?)?,
        || Ok(vec![x.mul(w)?]),
        || Ok(vec![x.square()?]),
    )?;
    let halvings = Tensor::scalar(0i32)?;
    while_loop(
        |v| {
            let big = v[0].abs()?.reduce_max(Axes::All, false)?;
            big.greater_equal(&big.scalar_like(1.0)?)
        },
        |v| {
            Ok(vec![
                v[0].mul(&v[0].scalar_like(0.5)?)?,
                v[1].add(&v[1].scalar_like(1.0)?)?,
            ])
        },
        &[y[0].clone(), halvings],
    )
}

#[test]
fn control_flow_and_outer_gradients_survive_a_round_trip() {
    ferroflow::init();
    let file = TempFile::new("control.ffgraph");
    let w = normal(&[4], 2)
        .mul(&Tensor::scalar(3.0f32).unwrap())
        .unwrap();
    let f = {
        let w = w.clone();
        Function::new(move |a: &[Tensor]| control_flow(&w, &a[0]))
    };
    let x = normal(&[4], 7);
    let concrete = f.get_concrete_function(std::slice::from_ref(&x)).unwrap();
    let kinds: Vec<&str> = concrete
        .graph()
        .nodes
        .iter()
        .filter_map(|n| match n.kind {
            NodeKind::Cond(_) => Some("cond"),
            NodeKind::While(_) => Some("while"),
            NodeKind::Captured(_) => Some("captured"),
            _ => None,
        })
        .collect();
    assert!(kinds.contains(&"cond") && kinds.contains(&"while") && kinds.contains(&"captured"));
    concrete.save(&file.path).unwrap();
    let loaded = ConcreteFunction::load(&file.path, &[]).unwrap();
    for seed in 0..6 {
        let scale = Tensor::scalar(if seed % 2 == 0 { 4.0f32 } else { -4.0 }).unwrap();
        let x = normal(&[4], 40 + seed).mul(&scale).unwrap();
        let eager = control_flow(&w, &x).unwrap();
        let (got, dx_loaded) = {
            let tape = GradientTape::new();
            tape.watch(&x);
            let y = loaded.call(std::slice::from_ref(&x)).unwrap();
            let loss = y[0].reduce_sum(Axes::All, false).unwrap();
            let g = tape.gradient(&loss, &[(&x).into()]).unwrap();
            (y, g[0].clone().unwrap())
        };
        let dx_eager = {
            let tape = GradientTape::new();
            tape.watch(&x);
            let y = control_flow(&w, &x).unwrap();
            let loss = y[0].reduce_sum(Axes::All, false).unwrap();
            tape.gradient(&loss, &[(&x).into()]).unwrap()[0]
                .clone()
                .unwrap()
        };
        for (e, g) in eager.iter().zip(&got) {
            assert_eq!(bits(e), bits(g), "seed {seed}");
        }
        assert_eq!(bits(&dx_eager), bits(&dx_loaded), "seed {seed}");
    }
}

fn scaled(v: &Variable) -> Function<'static> {
    let v = v.clone();
    Function::new(move |a: &[Tensor]| Ok(vec![a[0].mul(&v.value())?]))
}

#[test]
fn variables_are_bound_by_name_dtype_and_shape() {
    ferroflow::init();
    let file = TempFile::new("scaled.ffgraph");
    let v = Variable::new("scale", normal(&[3], 1));
    let x = normal(&[3], 2);
    scaled(&v)
        .get_concrete_function(std::slice::from_ref(&x))
        .unwrap()
        .save(&file.path)
        .unwrap();
    let message = |r: Result<ConcreteFunction>| r.unwrap_err().to_string();
    let missing = message(ConcreteFunction::load(&file.path, &[]));
    assert!(
        missing.contains("\"scale\"") && missing.contains("pass it"),
        "{missing}"
    );
    let wrong_shape = Variable::new("scale", normal(&[4], 1));
    let shape = message(ConcreteFunction::load(&file.path, &[wrong_shape]));
    assert!(shape.contains("[4]") && shape.contains("[3]"), "{shape}");
    let wrong_dtype = Variable::new("scale", normal(&[3], 1).cast(DType::F64).unwrap());
    let dtype = message(ConcreteFunction::load(&file.path, &[wrong_dtype]));
    assert!(
        dtype.contains("float64") && dtype.contains("float32"),
        "{dtype}"
    );
    let twice = [
        Variable::new("scale", normal(&[3], 1)),
        Variable::new("scale", normal(&[3], 1)),
    ];
    let ambiguous = message(ConcreteFunction::load(&file.path, &twice));
    assert!(ambiguous.contains("two of the variables"), "{ambiguous}");
    // Bound: the loaded graph reads the bound variable's current value on every call.
    let other = Variable::new("scale", normal(&[3], 5));
    let loaded = ConcreteFunction::load(&file.path, std::slice::from_ref(&other)).unwrap();
    let y = loaded.call(std::slice::from_ref(&x)).unwrap();
    assert_eq!(bits(&y[0]), bits(&x.mul(&other.value()).unwrap()));
    other.assign(&normal(&[3], 6)).unwrap();
    let y = loaded.call(std::slice::from_ref(&x)).unwrap();
    assert_eq!(bits(&y[0]), bits(&x.mul(&other.value()).unwrap()));
    // The traced signature is checked.
    let err = loaded.call(&[normal(&[4], 2)]).unwrap_err().to_string();
    assert!(
        err.contains("argument 0") && err.contains("[3]") && err.contains("[4]"),
        "{err}"
    );
}

#[test]
fn a_graph_with_two_variables_of_one_name_is_not_saved() {
    ferroflow::init();
    let file = TempFile::new("twins.ffgraph");
    let (a, b) = (
        Variable::new("twin", normal(&[2], 1)),
        Variable::new("twin", normal(&[2], 2)),
    );
    let f = Function::new(move |x: &[Tensor]| Ok(vec![x[0].mul(&a.value())?.add(&b.value())?]));
    let err = f
        .get_concrete_function(&[normal(&[2], 3)])
        .unwrap()
        .save(&file.path)
        .unwrap_err()
        .to_string();
    assert!(err.contains("two variables named \"twin\""), "{err}");
    assert!(!file.path.exists(), "nothing written");
}

#[test]
fn files_that_are_not_graphs_are_errors_that_say_why() {
    ferroflow::init();
    let file = TempFile::new("bad.ffgraph");
    let load = |bytes: &[u8]| {
        std::fs::write(&file.path, bytes).unwrap();
        ConcreteFunction::load(&file.path, &[])
            .unwrap_err()
            .to_string()
    };
    assert!(load(b"PK\x03\x04 a zip").contains("not a ferroflow graph file"));
    let mut future = b"FFGRAPH\0".to_vec();
    future.extend_from_slice(&7u32.to_le_bytes());
    future.extend_from_slice(&0u64.to_le_bytes());
    assert!(load(&future).contains("version 7"));
    let mut long = b"FFGRAPH\0".to_vec();
    long.extend_from_slice(&1u32.to_le_bytes());
    long.extend_from_slice(&u64::MAX.to_le_bytes());
    assert!(load(&long).contains("header claims"));
    let err = ConcreteFunction::load(file.dir.join("absent.ffgraph"), &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("absent.ffgraph"), "{err}");
}

/// The bytes of a saved graph with constants, a fused chain, a reduction and a cond.
fn saved_bytes() -> (Vec<u8>, Tensor) {
    let file = TempFile::new("source.ffgraph");
    let f = Function::new(|a: &[Tensor]| {
        let c = Tensor::from_vec(vec![0.5f32, -2.0, 3.0], &[3])?;
        let y = a[0].mul(&c)?.tanh()?.add(&a[0])?;
        let total = y.reduce_sum(Axes::All, false)?;
        cond(
            &total.greater(&total.scalar_like(0.0)?)?,
            || Ok(vec![y.exp()?]),
            || Ok(vec![y.neg()?]),
        )
    });
    let x = normal(&[3], 11);
    f.get_concrete_function(std::slice::from_ref(&x))
        .unwrap()
        .save(&file.path)
        .unwrap();
    (std::fs::read(&file.path).unwrap(), x)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Truncations and changed bytes anywhere in the file: loading and calling either work
    /// or give an error; nothing panics.
    #[test]
    fn damaged_files_never_panic(cut in 0usize..4096, at in 0usize..4096, byte in any::<u8>()) {
        ferroflow::init();
        let (bytes, x) = saved_bytes();
        let file = TempFile::new("damaged.ffgraph");
        let truncated = &bytes[..cut % bytes.len()];
        std::fs::write(&file.path, truncated).unwrap();
        prop_assert!(ConcreteFunction::load(&file.path, &[]).is_err());
        let mut changed = bytes.clone();
        let at = at % changed.len();
        changed[at] = byte;
        std::fs::write(&file.path, &changed).unwrap();
        if let Ok(f) = ConcreteFunction::load(&file.path, &[]) {
            let _ = f.call(std::slice::from_ref(&x));
        }
    }
}

#[test]
fn an_unchanged_file_loads_and_runs() {
    ferroflow::init();
    let (bytes, x) = saved_bytes();
    let file = TempFile::new("intact.ffgraph");
    std::fs::write(&file.path, &bytes).unwrap();
    let loaded = ConcreteFunction::load(&file.path, &[]).unwrap();
    let c = Tensor::from_vec(vec![0.5f32, -2.0, 3.0], &[3]).unwrap();
    let y = x.mul(&c).unwrap().tanh().unwrap().add(&x).unwrap();
    let total = y
        .reduce_sum(Axes::All, false)
        .unwrap()
        .item::<f32>()
        .unwrap();
    let want = if total > 0.0 {
        y.exp().unwrap()
    } else {
        y.neg().unwrap()
    };
    assert_eq!(bits(&loaded.call(&[x]).unwrap()[0]), bits(&want));
}
