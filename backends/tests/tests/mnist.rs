//! End to end: the MNIST MLP trained with `fit` on the wgpu device follows the CPU run's
//! loss curve (same seed, same data order, same initial weights).

mod common;

use ferroflow_keras::{applications, losses::SparseCategoricalCrossentropy, FitConfig, Model};
use ferroflow_optim::Adam;
use ferroflow_tensor::{random, with_device, Device, Result, Tensor};

/// Per-epoch (loss, accuracy) of the MLP trained on `device`.
fn train(device: Device, x: &Tensor, y: &Tensor, epochs: usize) -> Result<Vec<(f64, f64)>> {
    random::set_seed(7);
    with_device(&device.to_string(), || -> Result<Vec<(f64, f64)>> {
        let mut model = Model::from(applications::mnist_mlp());
        model.build(&[28, 28, 1])?;
        assert_eq!(model.device(), device);
        model.compile(
            Adam::new(1e-3),
            SparseCategoricalCrossentropy::new(true),
            &["accuracy"],
        )?;
        let h = model.fit(
            x,
            y,
            FitConfig::new()
                .epochs(epochs)
                .batch_size(64)
                .shuffle(false)
                .verbose(0),
        )?;
        let loss = h.get("loss").map(<[f64]>::to_vec).unwrap_or_default();
        let acc = h.get("accuracy").map(<[f64]>::to_vec).unwrap_or_default();
        Ok(loss.into_iter().zip(acc).collect())
    })?
}

#[test]
fn mnist_mlp_on_wgpu_follows_the_cpu_loss_curve() {
    let Some(gpu) = common::wgpu_device() else {
        return;
    };
    // 30 batches of 64 per epoch, 10 epochs: 300 steps.
    let (x, y) = common::mnist(1920).expect("MNIST from datasets/mnist");
    let cpu = train(Device::CPU, &x, &y, 10).expect("CPU run");
    let wgpu = train(gpu, &x, &y, 10).expect("wgpu run");
    println!("epoch  cpu loss  wgpu loss  cpu acc  wgpu acc");
    for (e, (c, g)) in cpu.iter().zip(&wgpu).enumerate() {
        println!("{e:5}  {:8.5}  {:9.5}  {:7.4}  {:8.4}", c.0, g.0, c.1, g.1);
    }
    assert_eq!(cpu.len(), 10);
    for (c, g) in cpu.iter().zip(&wgpu) {
        assert!(
            (c.0 - g.0).abs() <= 0.01 + 0.02 * c.0,
            "loss diverged: cpu {} wgpu {}",
            c.0,
            g.0
        );
        assert!(
            (c.1 - g.1).abs() <= 0.02,
            "accuracy: cpu {} wgpu {}",
            c.1,
            g.1
        );
    }
    // It learned: the last epoch's loss is a fraction of the first's.
    let (first, last) = (wgpu[0].0, wgpu[9].0);
    assert!(last < 0.3 * first, "loss {first} -> {last}");
}
