//! BackupAndRestore: a fit stopped by a failure mid-training and run again resumes from
//! the epoch after the last backup and ends with the weights of a run never interrupted.

use ferroflow::keras::activations::Activation;
use ferroflow::keras::callbacks::{BackupAndRestore, Callback};
use ferroflow::keras::{layers::Dense, losses::MeanSquaredError, sequential, FitConfig, Model};
use ferroflow::optim::Adam;
use ferroflow::{Error, Result, Tensor};

fn data() -> (Tensor, Tensor) {
    let n = 64;
    let x: Vec<f32> = (0..n * 2)
        .map(|i| ((i * 29 % 61) as f32) / 30.0 - 1.0)
        .collect();
    let y: Vec<f32> = (0..n).map(|i| x[2 * i] * x[2 * i + 1] + 0.3).collect();
    (
        Tensor::from_vec(x, &[n, 2]).unwrap(),
        Tensor::from_vec(y, &[n, 1]).unwrap(),
    )
}

/// A model built from `seed` (the tests of this file run in parallel and share the global
/// generator: seeding and building happen in one seeded run).
fn model(seed: u64) -> Model {
    let mut m = ferroflow::testing::seeded(seed, || {
        let mut m = Model::from(sequential![
            Dense::new(8).activation(Activation::Tanh),
            Dense::new(1)
        ]);
        m.build(&[2]).unwrap();
        m
    });
    m.compile(Adam::new(0.05), MeanSquaredError::new(), &[])
        .unwrap();
    m
}

fn weights(m: &Model) -> Vec<u32> {
    m.weights()
        .iter()
        .flat_map(|v| v.peek().to_vec::<f32>().unwrap())
        .map(f32::to_bits)
        .collect()
}

/// Fails at the start of epoch `at`, as a lost worker would end the run.
struct FailAt(usize);
impl Callback for FailAt {
    fn on_epoch_begin(&mut self, epoch: usize, _: &mut Model) -> Result<()> {
        if epoch == self.0 {
            return Err(Error::invalid("test", "the worker was lost"));
        }
        Ok(())
    }
}

fn config() -> FitConfig {
    FitConfig::new()
        .epochs(5)
        .batch_size(16)
        .shuffle(false)
        .verbose(0)
}

#[test]
fn a_run_stopped_mid_training_resumes_after_the_last_backup() {
    ferroflow::init();
    let (x, y) = data();
    let dir = tempfile::tempdir().unwrap();
    let backup = dir.path().join("backup");

    let mut uninterrupted = model(11);
    uninterrupted.fit(&x, &y, config()).unwrap();

    let mut first = model(11);
    let err = first
        .fit(
            &x,
            &y,
            config()
                .callback(BackupAndRestore::new(&backup))
                .callback(FailAt(3)),
        )
        .unwrap_err();
    assert!(err.to_string().contains("lost"), "{err}");
    assert!(
        backup.join("checkpoint.json").exists(),
        "epochs 0-2 were backed up"
    );
    // Only the last backup's files remain.
    let files = std::fs::read_dir(&backup).unwrap().count();
    assert_eq!(
        files, 3,
        "checkpoint.json and one generation of weights and optimizer"
    );

    // Restarted with other initial weights: the backup replaces them.
    let mut restarted = model(99);
    let h = restarted
        .fit(&x, &y, config().callback(BackupAndRestore::new(&backup)))
        .unwrap();
    assert_eq!(
        h.epoch,
        vec![3, 4],
        "resumed after the last completed epoch"
    );
    assert_eq!(
        weights(&restarted),
        weights(&uninterrupted),
        "the resumed run ends with the uninterrupted run's weights (optimizer state restored)"
    );
    assert!(
        !backup.exists(),
        "the backup is deleted when training finishes"
    );

    // A run without a backup starts at epoch 0.
    let h = model(11)
        .fit(&x, &y, config().callback(BackupAndRestore::new(&backup)))
        .unwrap();
    assert_eq!(h.epoch, vec![0, 1, 2, 3, 4]);
}

#[test]
fn an_unreadable_backup_is_an_error_naming_it() {
    ferroflow::init();
    let (x, y) = data();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("checkpoint.json"),
        b"{\"epoch\": 1, \"weights_file\": \"../x\"}",
    )
    .unwrap();
    let err = model(1)
        .fit(&x, &y, config().callback(BackupAndRestore::new(dir.path())))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("checkpoint.json") && err.contains("not a file name"),
        "{err}"
    );
}
