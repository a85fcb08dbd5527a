//! `fit`, `evaluate` and `predict` on ferroflow-data pipelines (Keras' `fit(dataset)`).

mod common;
use common::blobs;
use ferroflow_data::Dataset;
use ferroflow_keras::activations::Activation;
use ferroflow_keras::layers::Dense;
use ferroflow_keras::losses::SparseCategoricalCrossentropy;
use ferroflow_keras::{sequential, FitConfig, Model};
use ferroflow_optim::Adam;
use ferroflow_tensor::{Error, Tensor};

fn compiled() -> Model {
    ferroflow::init();
    let mut m = Model::from(sequential![
        Dense::new(16).activation(Activation::Relu),
        Dense::new(3),
    ]);
    m.compile(
        Adam::new(0.05),
        SparseCategoricalCrossentropy::new(true),
        &["accuracy"],
    )
    .unwrap();
    m
}

fn pipeline(n: usize, seed: u64, batch: usize) -> Dataset<(Tensor, Tensor)> {
    let (x, y) = blobs(n, seed);
    Dataset::from_tensor_slices((x, y))
        .unwrap()
        .shuffle(n, Some(seed), true)
        .unwrap()
        .batch(batch, false)
        .unwrap()
        .prefetch(2)
}

#[test]
fn fit_on_a_dataset_learns_and_validates_on_a_dataset() {
    let mut m = compiled();
    let train = pipeline(600, 1, 32);
    let val = pipeline(200, 2, 50);
    let h = m
        .fit_dataset(
            &train,
            FitConfig::new()
                .epochs(4)
                .verbose(0)
                .validation_dataset(&val),
        )
        .unwrap();
    assert_eq!(h.epoch, vec![0, 1, 2, 3]);
    let keys: Vec<&str> = h.history.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["loss", "accuracy", "val_loss", "val_accuracy"]);
    assert!(h.get("val_accuracy").unwrap()[3] > 0.9, "{:?}", h.history);
    // evaluate on the dataset agrees with evaluate on the same arrays batched alike.
    let (xv, yv) = blobs(200, 2);
    let unshuffled = Dataset::from_tensor_slices((xv.clone(), yv.clone()))
        .unwrap()
        .batch(50, false)
        .unwrap();
    let a = m.evaluate_dataset(&unshuffled).unwrap();
    let b = m.evaluate(&xv, &yv, 50).unwrap();
    assert!((a.get("loss").unwrap() - b.get("loss").unwrap()).abs() < 1e-6);
    assert_eq!(a.get("accuracy"), b.get("accuracy"));
    // predict on inputs alone, and on (x, y) batches ignoring y.
    let xs = Dataset::from_tensor_slices(xv.clone())
        .unwrap()
        .batch(64, false)
        .unwrap();
    let p1 = m.predict_dataset(&xs).unwrap();
    let p2 = m.predict_dataset(&unshuffled).unwrap();
    let p3 = m.predict(&xv, 64).unwrap();
    assert_eq!(p1.shape(), &[200, 3]);
    assert_eq!(p1.to_vec::<f32>().unwrap(), p3.to_vec::<f32>().unwrap());
    assert_eq!(p2.to_vec::<f32>().unwrap(), p3.to_vec::<f32>().unwrap());
}

#[test]
fn an_endless_dataset_needs_steps_per_epoch_and_continues_across_epochs() {
    let mut m = compiled();
    let endless = pipeline(96, 3, 32).repeat(None);
    let err = m
        .fit_dataset(&endless, FitConfig::new().verbose(0))
        .unwrap_err();
    assert!(err.to_string().contains("steps_per_epoch"), "{err}");
    let h = m
        .fit_dataset(
            &endless,
            FitConfig::new().epochs(3).steps_per_epoch(5).verbose(0),
        )
        .unwrap();
    assert_eq!(h.epoch.len(), 3);
    // A finite dataset with steps_per_epoch: 3 batches, 2 per epoch: the second epoch runs
    // out after one step and training stops there.
    let short = pipeline(96, 4, 32);
    let h = m
        .fit_dataset(
            &short,
            FitConfig::new().epochs(5).steps_per_epoch(2).verbose(0),
        )
        .unwrap();
    assert_eq!(h.epoch, vec![0, 1]);
}

#[test]
fn unknown_cardinality_and_errors_in_the_pipeline() {
    let mut m = compiled();
    let (x, y) = blobs(200, 5);
    // A filter makes the length unknown; fit still runs whole passes.
    let filtered = Dataset::from_tensor_slices((x.clone(), y.clone()))
        .unwrap()
        .filter(|(_, y): &(Tensor, Tensor)| Ok(y.item::<i64>()? != 2))
        .batch(25, false)
        .unwrap();
    let h = m
        .fit_dataset(&filtered, FitConfig::new().epochs(2).verbose(2))
        .unwrap();
    assert_eq!(h.epoch.len(), 2);
    // A failing map surfaces as fit's error, naming the element.
    let broken = Dataset::from_tensor_slices((x, y))
        .unwrap()
        .map(|(x, y): (Tensor, Tensor)| {
            if y.item::<i64>()? == 1 {
                return Err(Error::InvalidArgument {
                    op: "augment",
                    msg: "bad sample".into(),
                });
            }
            Ok((x, y))
        })
        .batch(20, false)
        .unwrap();
    let err = m
        .fit_dataset(&broken, FitConfig::new().epochs(1).verbose(0))
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("map: element") && msg.contains("bad sample"),
        "{msg}"
    );
    let inputs_only = Dataset::from_tensor_slices(blobs(10, 6).0)
        .unwrap()
        .batch(5, false)
        .unwrap();
    let err = m
        .fit_dataset(&inputs_only, FitConfig::new().verbose(0))
        .unwrap_err();
    assert!(err.to_string().contains("(x, y) batches"), "{err}");
    let empty = pipeline(10, 7, 5).take(0);
    assert!(m.fit_dataset(&empty, FitConfig::new().verbose(0)).is_err());
}
