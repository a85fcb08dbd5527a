//! The default steps as traced graphs against the same steps run eagerly: the same weights,
//! metrics and losses after several steps (bit for bit), for layers with state (batch
//! normalization's moving statistics), randomness (dropout) and regularizers.

mod common;
use common::blobs;

use ferroflow_keras::activations::Activation;
use ferroflow_keras::layers::{BatchNormalization, Dense, Dropout, Flatten};
use ferroflow_keras::losses::SparseCategoricalCrossentropy;
use ferroflow_keras::{sequential, FitConfig, Model};
use ferroflow_optim::Adam;
use ferroflow_tensor::random;

/// The model, seeded with 3. Both tests run whole inside a seeded run
/// (`testing::seeded`): they seed again and draw (dropout) while they train.
fn model(run_eagerly: bool) -> Model {
    ferroflow::init();
    random::set_seed(3);
    let mut m = Model::from(sequential![
        Flatten::new(),
        Dense::new(16).activation(Activation::Relu),
        BatchNormalization::new(),
        Dropout::new(0.3),
        Dense::new(3)
    ]);
    m.compile(
        Adam::new(0.01),
        SparseCategoricalCrossentropy::new(true),
        &["accuracy"],
    )
    .unwrap();
    m.set_run_eagerly(run_eagerly);
    m
}

fn weights(m: &Model) -> Vec<Vec<u32>> {
    m.get_weights()
        .unwrap()
        .iter()
        .map(|w| {
            w.to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        })
        .collect()
}

#[test]
fn train_steps_as_graphs_equal_eager_steps() {
    ferroflow_tensor::testing::seeded(3, || {
        let (x, y) = blobs(96, 5);
        let mut runs = vec![];
        for eager in [true, false] {
            let mut m = model(eager);
            let mut logs = vec![];
            for step in 0..4 {
                let rows = if step == 3 { 16 } else { 32 }; // a new batch shape: a second trace
                let bx = x.slice(&[step * 32 % 64, 0], &[rows as isize, 2]).unwrap();
                let by = y.slice(&[step * 32 % 64], &[rows as isize]).unwrap();
                random::set_seed(100 + step as u64);
                let l = m.train_step(&[bx], &[by]).unwrap();
                logs.push(format!("{l:?}"));
            }
            let eval = m.evaluate(&x, &y, 32).unwrap();
            // Eagerly nothing is traced; as graphs: the first step builds the model eagerly,
            // then one graph per batch shape (32 rows, then 16), the second 32-row step
            // replayed; evaluate traces its test step once.
            let expected = if eager { (0, 0) } else { (2, 1) };
            assert_eq!(m.step_tracing_counts(), expected);
            runs.push((weights(&m), logs, format!("{eval:?}")));
        }
        assert_eq!(runs[0].1, runs[1].1);
        assert_eq!(runs[0].2, runs[1].2);
        assert!(
            runs[0].0 == runs[1].0,
            "weights differ between eager and graph steps"
        );
    });
}

#[test]
fn fit_runs_graphs_by_default_and_learns() {
    ferroflow_tensor::testing::seeded(3, || {
        let (x, y) = blobs(300, 9);
        let mut m = model(false);
        assert!(!m.run_eagerly());
        let h = m
            .fit(&x, &y, FitConfig::new().epochs(4).batch_size(32).verbose(0))
            .unwrap();
        let acc = h.get("accuracy").unwrap();
        assert!(acc[3] > 0.85, "{acc:?}");
    });
}
