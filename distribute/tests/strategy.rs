//! The strategies in one process: MirroredStrategy over two logical CPU devices against no
//! strategy, distributed variables, the custom training loop of TF's tutorial.

use ferroflow::distribute::{
    get_strategy, has_strategy, AutoShardPolicy, CrossDeviceOps, InputOptions, MirroredStrategy,
    OneDeviceStrategy, ReduceOp, Strategy,
};
use ferroflow::keras::{layers::Dense, losses::MeanSquaredError, sequential, FitConfig, Model};
use ferroflow::optim::{Optimizer, Sgd};
use ferroflow::{
    DType, Device, DeviceKind, Tensor, Variable, VariableAggregation, VariableSynchronization,
};

fn setup() -> MirroredStrategy {
    ferroflow::init();
    ferroflow::config::set_logical_device_configuration(DeviceKind::Cpu, 2).unwrap();
    MirroredStrategy::new(&["/CPU:0", "/CPU:1"]).unwrap()
}

fn data(n: usize) -> (Tensor, Tensor) {
    let x: Vec<f32> = (0..n * 3)
        .map(|i| ((i * 37 % 101) as f32) / 50.0 - 1.0)
        .collect();
    let y: Vec<f32> = (0..n)
        .map(|i| x[3 * i] * 2.0 - x[3 * i + 1] + 0.5 * x[3 * i + 2] + 0.25)
        .collect();
    (
        Tensor::from_vec(x, &[n, 3]).unwrap(),
        Tensor::from_vec(y, &[n, 1]).unwrap(),
    )
}

fn model() -> Model {
    let mut m = Model::from(sequential![
        Dense::new(4).activation(ferroflow::keras::activations::Activation::Tanh),
        Dense::new(1)
    ]);
    m.compile(Sgd::new(0.1), MeanSquaredError::new(), &[])
        .unwrap();
    m
}

fn weights(m: &Model) -> Vec<Vec<f32>> {
    m.weights()
        .iter()
        .map(|v| v.peek().to_vec::<f32>().unwrap())
        .collect()
}

#[test]
fn mirrored_fit_matches_one_device_with_the_same_global_batch() {
    let strategy = setup();
    let (x, y) = data(69); // 4 batches of 16 and one of 5 (2 and 3 rows per replica)
    let mut single = model();
    let mut mirrored = {
        let _scope = strategy.scope();
        model()
    };
    assert!(mirrored.distribute_strategy().is_some());
    // Same starting weights: build both, copy single's into mirrored.
    single.evaluate(&x, &y, 16).unwrap();
    mirrored.evaluate(&x, &y, 16).unwrap();
    for (a, b) in single.weights().iter().zip(mirrored.weights()) {
        assert!(b.is_distributed(), "{} was created in the scope", b.name());
        b.assign(&a.peek()).unwrap();
    }
    let config = || {
        FitConfig::new()
            .epochs(3)
            .batch_size(16)
            .shuffle(false)
            .verbose(0)
    };
    let h1 = single.fit(&x, &y, config()).unwrap();
    let h2 = mirrored.fit(&x, &y, config()).unwrap();
    for (a, b) in weights(&single).iter().zip(weights(&mirrored)) {
        for (p, q) in a.iter().zip(&b) {
            assert!((p - q).abs() < 1e-5, "{p} vs {q}");
        }
    }
    let (l1, l2) = (h1.get("loss").unwrap(), h2.get("loss").unwrap());
    for (p, q) in l1.iter().zip(l2) {
        assert!((p - q).abs() < 1e-5 * p.abs().max(1.0), "loss {p} vs {q}");
    }
    // The model learned something (the test can fail).
    assert!(l2.last().unwrap() < &(l2[0] * 0.9), "{l2:?}");
    // The second replica read its own copy on /CPU:1 of every mirrored weight.
    let w = &mirrored.weights()[0];
    let on_1 = ferroflow::with_device("/CPU:1", || w.value()).unwrap();
    assert_eq!(on_1.device(), Device::new(DeviceKind::Cpu, 1));
    assert_eq!(
        on_1.to_vec::<f32>().unwrap(),
        w.peek().to_vec::<f32>().unwrap()
    );
}

#[test]
fn custom_training_loop_as_in_the_tutorial() {
    let strategy = setup();
    let (x, y) = data(64);
    let global_batch = 16;
    let ds = ferroflow::data::Dataset::from_tensor_slices((x.clone(), y.clone()))
        .unwrap()
        .batch(global_batch, false)
        .unwrap();
    let dist = strategy
        .experimental_distribute_dataset(&ds, InputOptions::default())
        .unwrap();
    let (mut net, mut opt) = {
        let _scope = strategy.scope();
        (sequential![Dense::new(1)], Sgd::new(0.1))
    };
    use ferroflow::keras::Layer;
    let mut first_losses = vec![];
    for epoch in 0..5 {
        let mut total = 0.0;
        for (step, batch) in dist.iter().enumerate() {
            let batch = batch.unwrap();
            assert_eq!(batch.len(), 2);
            let per_replica = strategy
                .run_with(&batch, |ctx, (bx, by)| {
                    assert_eq!(bx.device(), ctx.device());
                    let tape = ferroflow::prelude::GradientTape::new();
                    let pred = net.forward(bx, true)?;
                    let per_example = pred.sub(by)?.square()?.reduce_mean(-1isize, false)?;
                    let loss = ferroflow::distribute::compute_average_loss(
                        &per_example,
                        Some(global_batch),
                    )?;
                    let vars = net.trainable_weights();
                    let sources: Vec<ferroflow::prelude::Source> =
                        vars.iter().map(Into::into).collect();
                    let grads = tape.gradient(&loss, &sources)?;
                    opt.apply_gradients(grads.into_iter().zip(vars).collect(), true)?;
                    Ok(loss)
                })
                .unwrap();
            let loss = strategy.reduce(ReduceOp::Sum, &per_replica, None).unwrap();
            total += loss.item::<f32>().unwrap();
            if epoch == 0 && step == 0 {
                first_losses.push(loss.item::<f32>().unwrap());
            }
        }
        if epoch == 4 {
            assert!(
                total < first_losses[0] * 4.0 * 0.5,
                "loss fell: {total} vs {first_losses:?}"
            );
        }
    }
    assert_eq!(
        opt.iterations(),
        20,
        "one update per global batch, not per replica"
    );
}

#[test]
fn mirrored_variables_follow_their_aggregation() {
    let strategy = setup();
    let (none, sum, mean, on_read) = {
        let _scope = strategy.scope();
        assert!(has_strategy());
        assert_eq!(get_strategy().name(), "MirroredStrategy");
        let t = || Tensor::from_slice(&[1.0f32, 1.0]).unwrap();
        (
            Variable::new("none", t()),
            Variable::with_options(
                "sum",
                t(),
                false,
                VariableSynchronization::OnWrite,
                VariableAggregation::Sum,
            ),
            Variable::with_options(
                "mean",
                t(),
                false,
                VariableSynchronization::OnWrite,
                VariableAggregation::Mean,
            ),
            Variable::with_options(
                "count",
                t(),
                false,
                VariableSynchronization::OnRead,
                VariableAggregation::Sum,
            ),
        )
    };
    assert!(!has_strategy());
    let seen = strategy
        .run(|ctx| {
            let r = ctx.replica_id_in_sync_group() as f32;
            let v = Tensor::from_slice(&[r + 1.0, 10.0 * (r + 1.0)])?;
            let err = none.assign(&v).unwrap_err().to_string();
            assert!(err.contains("aggregation") && err.contains("none"), "{err}");
            // Both replicas read the value before the step's updates.
            let before = mean.value().to_vec::<f32>()?;
            sum.assign_add(&v)?;
            mean.assign(&v)?;
            on_read.assign_add(&v)?;
            Ok((before, on_read.value().to_vec::<f32>()?))
        })
        .unwrap();
    assert_eq!(seen.values()[0].0, vec![1.0, 1.0]);
    assert_eq!(seen.values()[1].0, vec![1.0, 1.0]);
    // Sum of the deltas (1+2, 10+20) added once; mean of the assigned values.
    assert_eq!(sum.peek().to_vec::<f32>().unwrap(), vec![4.0, 31.0]);
    assert_eq!(mean.peek().to_vec::<f32>().unwrap(), vec![1.5, 15.0]);
    // Sync on read: each replica saw its own value; read outside, the sum.
    assert_eq!(seen.values()[0].1, vec![2.0, 11.0]);
    assert_eq!(seen.values()[1].1, vec![3.0, 21.0]);
    assert_eq!(on_read.peek().to_vec::<f32>().unwrap(), vec![5.0, 32.0]);
}

#[test]
fn replica_context_and_reduce() {
    let strategy = setup();
    assert_eq!(strategy.num_replicas_in_sync(), 2);
    let per = strategy
        .run(|ctx| {
            let err = ctx
                .all_reduce(ReduceOp::Sum, &Tensor::scalar(1.0f32)?)
                .unwrap_err();
            assert!(err.to_string().contains("one after another"), "{err}");
            Tensor::from_vec(vec![ctx.replica_id_in_sync_group() as f32; 3], &[3])
        })
        .unwrap();
    assert_eq!(per.values()[1].device(), Device::new(DeviceKind::Cpu, 1));
    let sum = strategy.reduce(ReduceOp::Sum, &per, None).unwrap();
    assert_eq!(sum.to_vec::<f32>().unwrap(), vec![1.0; 3]);
    let mean_axis = strategy.reduce(ReduceOp::Mean, &per, Some(0)).unwrap();
    assert_eq!(mean_axis.item::<f32>().unwrap(), 0.5);
    // One device: all_reduce inside the step works.
    let one = OneDeviceStrategy::new("/CPU:1").unwrap();
    let r = one
        .run(|ctx| ctx.all_reduce(ReduceOp::Mean, &Tensor::scalar(4.0f32)?))
        .unwrap();
    assert_eq!(r.values()[0].item::<f32>().unwrap(), 4.0);
    assert!(MirroredStrategy::new(&["/CPU:0", "/CPU:0"]).is_err());
    let e = MirroredStrategy::new(&["/GPU:3"])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("GPU:3"), "{e}");
    let e = strategy
        .experimental_distribute_dataset(
            &ferroflow::data::Dataset::from_tensor_slices(
                Tensor::zeros(&[4, 1], DType::F32).unwrap(),
            )
            .unwrap(),
            InputOptions {
                auto_shard_policy: AutoShardPolicy::File,
            },
        )
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("distribute_datasets_from_function"), "{e}");
}

/// NCCL's all-reduce on devices whose backend offers no NCCL (the CPU's, here) is an error
/// naming them and the alternative, not a strategy that quietly reduces another way.
#[test]
fn nccl_all_reduce_on_host_devices_is_an_error_naming_them() {
    ferroflow::init();
    let e = MirroredStrategy::with_cross_device_ops(&["/CPU:0"], CrossDeviceOps::NcclAllReduce)
        .err()
        .expect("an error")
        .to_string();
    assert!(
        e.contains("NcclAllReduce") && e.contains("CPU:0") && e.contains("ReductionToOneDevice"),
        "{e}"
    );
}
