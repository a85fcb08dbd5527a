//! Order, determinism and exhaustion of every transformation; shuffle uniformity; errors as
//! items, never panics.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferroflow_data::{Cardinality, Dataset, PaddedBatch, Parallelism, AUTOTUNE};
use ferroflow_tensor::{DType, Error, Result, Tensor};
use proptest::prelude::*;

fn init() {
    ferroflow::init();
}

fn ints(ds: &Dataset<Tensor>) -> Vec<i64> {
    ds.iter()
        .map(|x| x.unwrap().item::<i64>().unwrap())
        .collect()
}

fn values<T: Send + 'static>(ds: &Dataset<T>) -> Vec<T> {
    ds.iter().collect::<Result<Vec<T>>>().unwrap()
}

/// Runs a pass to its end, then checks that the iterator stays exhausted.
fn assert_exhausts<T: Send + 'static>(ds: &Dataset<T>) {
    let mut it = ds.iter();
    for _ in it.by_ref() {}
    assert!(it.next().is_none());
    assert!(it.next().is_none());
}

fn counting_source(n: u64, pulls: Arc<AtomicUsize>) -> Dataset<u64> {
    Dataset::from_generator(move || {
        let pulls = pulls.clone();
        (0..n).inspect(move |_| {
            pulls.fetch_add(1, Ordering::SeqCst);
        })
    })
}

#[test]
fn range_matches_python_range() {
    init();
    assert_eq!(ints(&Dataset::range(0, 10, 3)), vec![0, 3, 6, 9]);
    assert_eq!(ints(&Dataset::range(5, 0, -2)), vec![5, 3, 1]);
    assert_eq!(ints(&Dataset::range(0, 0, 1)), Vec::<i64>::new());
    assert_eq!(ints(&Dataset::range(0, 5, -1)), Vec::<i64>::new());
    assert_eq!(
        Dataset::range(0, 10, 3).cardinality(),
        Cardinality::Finite(4)
    );
    let t = Dataset::range(0, 2, 1).iter().next().unwrap().unwrap();
    assert_eq!(t.dtype(), DType::I64);
    assert_eq!(t.rank(), 0);
    assert_exhausts(&Dataset::range(0, 3, 1));
}

#[test]
fn from_tensor_slices_slices_every_component_and_checks_shapes() {
    init();
    let x = Tensor::from_vec((0..12).map(|v| v as f32).collect(), &[3, 2, 2]).unwrap();
    let y = Tensor::from_slice(&[7i32, 8, 9]).unwrap();
    let mut m = BTreeMap::new();
    m.insert("x".to_string(), x.clone());
    m.insert("y".to_string(), y.clone());
    let ds = Dataset::from_tensor_slices(m).unwrap();
    assert_eq!(ds.cardinality(), Cardinality::Finite(3));
    let elems = values(&ds);
    assert_eq!(elems[2]["x"].shape(), &[2, 2]);
    assert_eq!(
        elems[2]["x"].to_vec::<f32>().unwrap(),
        vec![8.0, 9.0, 10.0, 11.0]
    );
    assert_eq!(elems[1]["y"].item::<i32>().unwrap(), 8);

    let bad = Dataset::from_tensor_slices((x, Tensor::from_slice(&[1i32, 2]).unwrap()));
    let msg = bad.unwrap_err().to_string();
    assert!(msg.contains("same first dimension"), "{msg}");
    let scalar = Dataset::from_tensor_slices(Tensor::scalar(1.0f32).unwrap());
    assert!(scalar.unwrap_err().to_string().contains("scalar"));
}

#[test]
fn from_tensors_is_one_element_and_repeat_counts_rounds() {
    init();
    let ds = Dataset::from_tensors(Tensor::from_slice(&[1i64, 2]).unwrap());
    assert_eq!(ds.cardinality(), Cardinality::Finite(1));
    let r = ds.repeat(Some(3));
    assert_eq!(r.cardinality(), Cardinality::Finite(3));
    let all: Vec<Vec<i64>> = r.iter().map(|t| t.unwrap().to_vec().unwrap()).collect();
    assert_eq!(all, vec![vec![1, 2]; 3]);
    assert_exhausts(&r);
    assert_eq!(ds.repeat(None).cardinality(), Cardinality::Infinite);
    assert_eq!(
        ints(&Dataset::range(0, 3, 1).repeat(None).take(7)),
        vec![0, 1, 2, 0, 1, 2, 0]
    );
    // An empty dataset repeated forever ends at once.
    assert_eq!(
        ints(&Dataset::range(0, 0, 1).repeat(None)),
        Vec::<i64>::new()
    );
    assert_eq!(
        ints(&Dataset::range(0, 3, 1).repeat(Some(0))),
        Vec::<i64>::new()
    );
}

#[test]
fn map_keeps_order_and_reports_errors_and_panics_as_items() {
    init();
    let ds = Dataset::from_generator(|| 0..6u32).map(|x| {
        if x == 2 {
            return Err(Error::InvalidArgument {
                op: "user",
                msg: "two is bad".into(),
            });
        }
        if x == 4 {
            panic!("four panics");
        }
        Ok(x * 10)
    });
    let items: Vec<_> = ds.iter().collect();
    assert_eq!(items.len(), 6, "iteration goes on after an error");
    assert_eq!(items[0], Ok(0));
    assert_eq!(items[5], Ok(50));
    match &items[2] {
        Err(Error::Pipeline {
            stage,
            index,
            source,
        }) => {
            assert_eq!((stage.as_str(), *index), ("map", 2));
            assert!(source.to_string().contains("two is bad"));
        }
        other => panic!("{other:?}"),
    }
    let msg = items[4].as_ref().unwrap_err().to_string();
    assert!(
        msg.contains("element 4") && msg.contains("four panics"),
        "{msg}"
    );
    assert_exhausts(&ds);
}

#[test]
fn parallel_map_keeps_order_when_deterministic() {
    init();
    for threads in [1usize, 2, 3, 8] {
        let ds = Dataset::from_generator(|| 0..200u64).map_parallel(
            |x| {
                // Uneven work so that later elements often finish first.
                if x % 7 == 0 {
                    std::thread::sleep(Duration::from_millis(2));
                }
                Ok(x * 3)
            },
            threads,
            true,
        );
        assert_eq!(values(&ds), (0..200u64).map(|x| x * 3).collect::<Vec<_>>());
        assert_exhausts(&ds);
    }
}

#[test]
fn parallel_map_unordered_yields_every_element_once() {
    init();
    let ds = Dataset::from_generator(|| 0..300u64).map_parallel(
        |x| {
            if x % 5 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(x)
        },
        4,
        false,
    );
    let mut got = values(&ds);
    got.sort();
    assert_eq!(got, (0..300u64).collect::<Vec<_>>());
}

#[test]
fn parallel_map_runs_calls_concurrently_up_to_its_thread_count() {
    init();
    let active = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (a, p) = (active.clone(), peak.clone());
    let ds = Dataset::from_generator(|| 0..24u32).map_parallel(
        move |x| {
            let now = a.fetch_add(1, Ordering::SeqCst) + 1;
            p.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(15));
            a.fetch_sub(1, Ordering::SeqCst);
            Ok(x)
        },
        Parallelism::Fixed(4),
        true,
    );
    assert_eq!(values(&ds).len(), 24);
    let peak = peak.load(Ordering::SeqCst);
    assert!((2..=4).contains(&peak), "peak concurrency {peak}");
}

#[test]
fn parallel_map_errors_carry_the_element_index() {
    init();
    let ds = Dataset::from_generator(|| 0..50u32).map_parallel(
        |x| {
            if x % 10 == 3 {
                panic!("bad {x}");
            }
            Ok(x)
        },
        AUTOTUNE,
        true,
    );
    let items: Vec<_> = ds.iter().collect();
    assert_eq!(items.len(), 50);
    for (i, r) in items.iter().enumerate() {
        if i % 10 == 3 {
            let msg = r.as_ref().unwrap_err().to_string();
            assert!(
                msg.contains(&format!("element {i}")) && msg.contains(&format!("bad {i}")),
                "{msg}"
            );
        } else {
            assert_eq!(*r.as_ref().unwrap(), i as u32);
        }
    }
}

#[test]
fn parallel_map_and_prefetch_stop_their_threads_when_dropped_early() {
    init();
    let pulls = Arc::new(AtomicUsize::new(0));
    let ds = counting_source(u64::MAX, pulls.clone())
        .map_parallel(Ok, 2, true)
        .prefetch(4);
    let first: Vec<u64> = ds.iter().take(5).map(|x| x.unwrap()).collect();
    assert_eq!(first, vec![0, 1, 2, 3, 4]);
    std::thread::sleep(Duration::from_millis(50));
    let after_drop = pulls.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        pulls.load(Ordering::SeqCst),
        after_drop,
        "workers kept pulling after the drop"
    );
    assert!(after_drop < 40, "bounded buffers: {after_drop} pulls");
}

/// A parallel map takes at most `2·threads` elements from its input ahead of its consumer
/// (TF's bound on a map's in-flight elements), however fast the workers are.
#[test]
fn parallel_map_runs_a_bounded_distance_ahead_of_its_consumer() {
    init();
    for threads in [1, 3] {
        let pulls = Arc::new(AtomicUsize::new(0));
        let ds = counting_source(u64::MAX, pulls.clone()).map_parallel(Ok, threads, true);
        let mut it = ds.iter();
        for want in 0..2u64 {
            assert_eq!(it.next().unwrap().unwrap(), want);
        }
        std::thread::sleep(Duration::from_millis(100));
        let pulled = pulls.load(Ordering::SeqCst);
        assert!(
            (2..=2 + 2 * threads + 1).contains(&pulled),
            "{threads} threads pulled {pulled} elements for 2 consumed"
        );
        drop(it);
    }
}

#[test]
fn prefetch_runs_ahead_of_the_consumer_and_keeps_order() {
    init();
    let pulls = Arc::new(AtomicUsize::new(0));
    let ds = counting_source(100, pulls.clone()).prefetch(8);
    let mut it = ds.iter();
    assert_eq!(it.next().unwrap().unwrap(), 0);
    std::thread::sleep(Duration::from_millis(50));
    let ahead = pulls.load(Ordering::SeqCst);
    assert!(
        (5..=10).contains(&ahead),
        "pulled {ahead} with a buffer of 8"
    );
    let rest: Vec<u64> = it.map(|x| x.unwrap()).collect();
    assert_eq!(rest, (1..100).collect::<Vec<_>>());
    let auto = counting_source(1000, Arc::default()).prefetch(AUTOTUNE);
    assert_eq!(values(&auto), (0..1000).collect::<Vec<_>>());
    assert_exhausts(&auto);
}

#[test]
fn a_panicking_source_behind_prefetch_is_an_error_item() {
    init();
    let ds = Dataset::from_generator(|| {
        (0..10u32).inspect(|&x| {
            if x == 3 {
                panic!("generator broke");
            }
        })
    })
    .prefetch(2);
    let items: Vec<_> = ds.iter().collect();
    assert_eq!(items.len(), 4);
    let msg = items[3].as_ref().unwrap_err().to_string();
    assert!(
        msg.contains("generator broke") && msg.contains("element 3"),
        "{msg}"
    );
}

#[test]
fn filter_take_skip_and_ignore_errors() {
    init();
    let ds = Dataset::range(0, 20, 1);
    let even = ds.filter(|x| Ok(x.item::<i64>()? % 2 == 0));
    assert_eq!(ints(&even), (0..20).step_by(2).collect::<Vec<_>>());
    assert_eq!(even.cardinality(), Cardinality::Unknown);
    assert_eq!(ints(&ds.take(3)), vec![0, 1, 2]);
    assert_eq!(ints(&ds.skip(17)), vec![17, 18, 19]);
    assert_eq!(ds.skip(30).cardinality(), Cardinality::Finite(0));
    assert_eq!(ds.take(30).cardinality(), Cardinality::Finite(20));
    assert_exhausts(&ds.take(3));
    assert_exhausts(&even);

    let pulls = Arc::new(AtomicUsize::new(0));
    let taken = counting_source(100, pulls.clone()).take(3);
    assert_eq!(values(&taken), vec![0, 1, 2]);
    assert_eq!(
        pulls.load(Ordering::SeqCst),
        3,
        "take pulls no element beyond its count"
    );

    let flaky = Dataset::from_generator(|| 0..6u32).map(|x| {
        if x % 2 == 1 {
            Err(Error::InvalidArgument {
                op: "user",
                msg: "odd".into(),
            })
        } else {
            Ok(x)
        }
    });
    assert_eq!(values(&flaky.ignore_errors()), vec![0, 2, 4]);
    let failing_filter = Dataset::range(0, 3, 1).filter(|x| {
        if x.item::<i64>()? == 1 {
            Err(Error::InvalidArgument {
                op: "user",
                msg: "no".into(),
            })
        } else {
            Ok(true)
        }
    });
    let items: Vec<_> = failing_filter.iter().collect();
    assert_eq!(items.len(), 3);
    assert!(items[1]
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("filter: element 1"));
}

#[test]
fn enumerate_zip_concatenate_and_apply() {
    init();
    let ds = Dataset::range(10, 13, 1);
    let e: Vec<(i64, i64)> = ds
        .enumerate(5)
        .iter()
        .map(|r| {
            let (i, x) = r.unwrap();
            (i.item::<i64>().unwrap(), x.item::<i64>().unwrap())
        })
        .collect();
    assert_eq!(e, vec![(5, 10), (6, 11), (7, 12)]);
    let z = ds.zip(&Dataset::range(0, 100, 1));
    assert_eq!(z.cardinality(), Cardinality::Finite(3));
    let pairs: Vec<(i64, i64)> = z
        .iter()
        .map(|r| {
            let (a, b) = r.unwrap();
            (a.item::<i64>().unwrap(), b.item::<i64>().unwrap())
        })
        .collect();
    assert_eq!(pairs, vec![(10, 0), (11, 1), (12, 2)]);
    let c = ds.concatenate(&Dataset::range(0, 2, 1));
    assert_eq!(c.cardinality(), Cardinality::Finite(5));
    assert_eq!(ints(&c), vec![10, 11, 12, 0, 1]);
    assert_exhausts(&c);
    assert_exhausts(&z);
    let doubled = ds.apply(|d| d.repeat(Some(2)));
    assert_eq!(ints(&doubled), vec![10, 11, 12, 10, 11, 12]);
}

#[test]
fn shard_partitions_the_input() {
    init();
    let ds = Dataset::range(0, 11, 1);
    let mut all = Vec::new();
    for i in 0..3 {
        let s = ds.shard(3, i).unwrap();
        let v = ints(&s);
        assert_eq!(s.cardinality(), Cardinality::Finite(v.len() as u64));
        assert!(v.iter().all(|x| x % 3 == i as i64));
        all.extend(v);
    }
    all.sort();
    assert_eq!(all, (0..11).collect::<Vec<_>>());
    assert!(ds
        .shard(3, 3)
        .unwrap_err()
        .to_string()
        .contains("index must be in [0, num_shards)"));
    assert!(ds.shard(0, 0).is_err());
}

#[test]
fn batch_stacks_structures_and_respects_drop_remainder() {
    init();
    let x = Tensor::from_vec((0..10).map(|v| v as f32).collect(), &[5, 2]).unwrap();
    let y = Tensor::from_slice(&[0i64, 1, 2, 3, 4]).unwrap();
    let ds = Dataset::from_tensor_slices((x, y)).unwrap();
    let b = ds.batch(2, false).unwrap();
    assert_eq!(b.cardinality(), Cardinality::Finite(3));
    let batches = values(&b);
    assert_eq!(batches.len(), 3);
    assert_eq!(batches[0].0.shape(), &[2, 2]);
    assert_eq!(
        batches[0].0.to_vec::<f32>().unwrap(),
        vec![0.0, 1.0, 2.0, 3.0]
    );
    assert_eq!(batches[2].0.shape(), &[1, 2]);
    assert_eq!(batches[2].1.to_vec::<i64>().unwrap(), vec![4]);
    let dropped = ds.batch(2, true).unwrap();
    assert_eq!(dropped.cardinality(), Cardinality::Finite(2));
    assert_eq!(values(&dropped).len(), 2);
    assert_exhausts(&dropped);
    assert!(ds.batch(0, false).is_err());

    // Unequal shapes: a clear error pointing to padded_batch, then iteration goes on.
    let ragged = Dataset::from_generator(|| {
        [1usize, 2, 2, 2]
            .into_iter()
            .map(|n| Tensor::zeros(&[n], DType::F32).unwrap())
    })
    .batch(2, false)
    .unwrap();
    let items: Vec<_> = ragged.iter().collect();
    let msg = items[0].as_ref().unwrap_err().to_string();
    assert!(
        msg.contains("padded_batch") && msg.contains("batch: element 0"),
        "{msg}"
    );
    assert_eq!(items[1].as_ref().unwrap().shape(), &[2, 2]);
}

#[test]
fn padded_batch_pads_to_the_longest_or_to_fixed_shapes() {
    init();
    let seqs = Dataset::range(1, 5, 1).map(|n: Tensor| {
        let n = n.item::<i64>()?;
        Tensor::fill(&[n as usize], n as f64, DType::I32)
    });
    let b = seqs.padded_batch(2, false, PaddedBatch::default()).unwrap();
    let got: Vec<(Vec<usize>, Vec<i32>)> = values(&b)
        .into_iter()
        .map(|t| (t.shape().to_vec(), t.to_vec::<i32>().unwrap()))
        .collect();
    assert_eq!(
        got,
        vec![
            (vec![2, 2], vec![1, 0, 2, 2]),
            (vec![2, 4], vec![3, 3, 3, 0, 4, 4, 4, 4]),
        ]
    );
    let fixed = seqs
        .padded_batch(
            4,
            false,
            PaddedBatch {
                padded_shapes: vec![vec![Some(5)]],
                padding_value: -1.0,
            },
        )
        .unwrap();
    let t = values(&fixed).remove(0);
    assert_eq!(t.shape(), &[4, 5]);
    assert_eq!(&t.to_vec::<i32>().unwrap()[..5], &[1, -1, -1, -1, -1]);
    let too_small = seqs
        .padded_batch(
            4,
            false,
            PaddedBatch {
                padded_shapes: vec![vec![Some(2)]],
                padding_value: 0.0,
            },
        )
        .unwrap();
    let msg = too_small.iter().next().unwrap().unwrap_err().to_string();
    assert!(msg.contains("larger than its padded size 2"), "{msg}");
}

#[test]
fn unbatch_inverts_batch_and_checks_first_dimensions() {
    init();
    let x = Tensor::from_vec((0..12).map(|v| v as f32).collect(), &[6, 2]).unwrap();
    let ds = Dataset::from_tensor_slices(x.clone()).unwrap();
    let back = ds.batch(4, false).unwrap().unbatch();
    let rows: Vec<Vec<f32>> = back.iter().map(|t| t.unwrap().to_vec().unwrap()).collect();
    let want: Vec<Vec<f32>> = ds.iter().map(|t| t.unwrap().to_vec().unwrap()).collect();
    assert_eq!(rows, want);
    assert_exhausts(&back);
    let bad = Dataset::from_tensors((
        Tensor::zeros(&[2], DType::F32).unwrap(),
        Tensor::zeros(&[3], DType::F32).unwrap(),
    ))
    .unbatch();
    let msg = bad.iter().next().unwrap().unwrap_err().to_string();
    assert!(msg.contains("same first dimension"), "{msg}");
}

#[test]
fn shuffle_is_a_seeded_permutation_that_reshuffles_each_pass() {
    init();
    let ds = Dataset::from_generator(|| 0..100u32);
    let s = ds.shuffle(100, Some(42), true).unwrap();
    let a = values(&s);
    let b = values(&s);
    assert_ne!(a, b, "a new order every pass");
    let mut sorted = a.clone();
    sorted.sort();
    assert_eq!(sorted, (0..100).collect::<Vec<_>>());
    assert_ne!(a, sorted);
    // Same seed, new dataset: the same sequence of orders.
    let s2 = ds.shuffle(100, Some(42), true).unwrap();
    assert_eq!(values(&s2), a);
    assert_eq!(values(&s2), b);
    let fixed = ds.shuffle(100, Some(42), false).unwrap();
    assert_eq!(values(&fixed), values(&fixed));
    // The global seed decides when the op seed is absent (TF's rule).
    let globally_seeded = || values(&ds.shuffle(10, None, true).unwrap());
    let g1 = ferroflow_tensor::testing::seeded(3, globally_seeded);
    let g2 = ferroflow_tensor::testing::seeded(3, globally_seeded);
    assert_eq!(g1, g2);
    // A small buffer only moves elements a bounded distance forward.
    let local = values(&ds.shuffle(4, Some(1), true).unwrap());
    for (pos, &x) in local.iter().enumerate() {
        assert!(
            (x as usize) <= pos + 3,
            "{x} came out at {pos} with a buffer of 4"
        );
    }
    assert!(ds.shuffle(0, None, true).is_err());
    assert_exhausts(&s);
}

#[test]
fn shuffle_with_a_full_buffer_draws_permutations_uniformly() {
    init();
    let ds = Dataset::from_generator(|| 0..5u8)
        .shuffle(5, Some(7), true)
        .unwrap();
    let runs = 12_000;
    let mut counts: HashMap<Vec<u8>, usize> = HashMap::new();
    for _ in 0..runs {
        *counts.entry(values(&ds)).or_default() += 1;
    }
    assert_eq!(counts.len(), 120, "every permutation of 5 appears");
    let expected = runs as f64 / 120.0;
    let chi2: f64 = counts
        .values()
        .map(|&c| (c as f64 - expected).powi(2) / expected)
        .sum();
    // 119 degrees of freedom: P(chi2 > 180) < 0.0003 for a uniform shuffle.
    assert!(chi2 < 180.0, "chi-square {chi2:.1} over 120 permutations");
}

#[test]
fn interleave_follows_tensorflows_documented_order() {
    init();
    // tf.data.Dataset.range(1, 6).interleave(
    //     lambda x: Dataset.from_tensors(x).repeat(6), cycle_length=2, block_length=4)
    let ds = Dataset::range(1, 6, 1)
        .interleave(|x| Ok(Dataset::from_tensors(x).repeat(Some(6))), 2, 4)
        .unwrap();
    assert_eq!(
        ints(&ds),
        vec![
            1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 3, 3, 4, 4, 5, 5, 5, 5, 5,
            5
        ]
    );
    assert_exhausts(&ds);
    assert!(Dataset::range(0, 1, 1)
        .interleave(|x| Ok(Dataset::from_tensors(x)), 0, 1)
        .is_err());
    let failing = Dataset::range(0, 3, 1)
        .interleave(
            |x: Tensor| {
                if x.item::<i64>()? == 1 {
                    Err(Error::InvalidArgument {
                        op: "user",
                        msg: "no dataset".into(),
                    })
                } else {
                    Ok(Dataset::from_tensors(x))
                }
            },
            1,
            1,
        )
        .unwrap();
    let items: Vec<_> = failing.iter().collect();
    assert_eq!(items.len(), 3);
    assert!(items[1]
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("interleave: element 1"));
}

#[test]
fn memory_cache_computes_once_and_only_after_a_complete_pass() {
    init();
    let pulls = Arc::new(AtomicUsize::new(0));
    let ds = counting_source(10, pulls.clone()).cache();
    assert_eq!(ds.iter().take(3).count(), 3);
    assert_eq!(values(&ds), (0..10).collect::<Vec<_>>());
    let after_full = pulls.load(Ordering::SeqCst);
    assert_eq!(after_full, 13, "a partial pass caches nothing");
    assert_eq!(values(&ds), (0..10).collect::<Vec<_>>());
    assert_eq!(values(&ds.repeat(Some(2))).len(), 20);
    assert_eq!(
        pulls.load(Ordering::SeqCst),
        after_full,
        "later passes read the cache"
    );
}

#[test]
fn the_issues_seed_example_runs() {
    init();
    let x = ferroflow_tensor::random::normal(&[1000, 1024], 0.0, 1.0, DType::F32, Some(5)).unwrap();
    let ds = Dataset::from_tensor_slices(x.clone())
        .unwrap()
        .map(|row: Tensor| row.clip_by_value(&row.scalar_like(-1.0)?, &row.scalar_like(1.0)?))
        .batch(100, false)
        .unwrap();
    assert_eq!(ds.cardinality(), Cardinality::Finite(10));
    let batches = values(&ds);
    assert_eq!(batches.len(), 10);
    let want: Vec<f32> = x
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.clamp(-1.0, 1.0))
        .collect();
    let got: Vec<f32> = batches
        .iter()
        .flat_map(|b| b.to_vec::<f32>().unwrap())
        .collect();
    assert_eq!(got, want);
}

#[test]
fn every_transformation_is_deterministic_and_stays_exhausted() {
    init();
    let base = Dataset::range(0, 23, 1);
    let pairs = base.zip(&Dataset::range(100, 200, 1));
    let seqs =
        base.map(|n: Tensor| Tensor::fill(&[(n.item::<i64>()? % 4) as usize], 1.0, DType::F32));
    let cases: Vec<(&str, Dataset<Tensor>)> = vec![
        ("map", base.map(|x: Tensor| x.add(&x))),
        (
            "map_parallel",
            base.map_parallel(|x: Tensor| x.add(&x), 3, true),
        ),
        ("filter", base.filter(|x| Ok(x.item::<i64>()? % 3 == 0))),
        ("batch", base.batch(5, false).unwrap()),
        ("batch drop", base.batch(5, true).unwrap()),
        (
            "padded_batch",
            seqs.padded_batch(3, false, PaddedBatch::default()).unwrap(),
        ),
        ("unbatch", base.batch(4, false).unwrap().unbatch()),
        ("shuffle", base.shuffle(7, Some(3), false).unwrap()),
        ("repeat", base.repeat(Some(2))),
        ("take", base.take(4)),
        ("skip", base.skip(20)),
        (
            "enumerate",
            base.enumerate(0).map(|(i, x): (Tensor, Tensor)| i.add(&x)),
        ),
        ("zip", pairs.map(|(a, b): (Tensor, Tensor)| a.add(&b))),
        ("concatenate", base.concatenate(&base)),
        ("shard", base.shard(4, 1).unwrap()),
        (
            "interleave",
            base.take(3)
                .interleave(|x| Ok(Dataset::from_tensors(x).repeat(Some(2))), 2, 1)
                .unwrap(),
        ),
        ("cache", base.cache()),
        ("prefetch", base.prefetch(3)),
        ("ignore_errors", base.ignore_errors()),
        ("apply", base.apply(|d| d.skip(1))),
    ];
    for (name, ds) in cases {
        let first: Vec<Vec<f64>> = ds
            .iter()
            .map(|t| t.unwrap().to_f64_vec().unwrap())
            .collect();
        let second: Vec<Vec<f64>> = ds
            .iter()
            .map(|t| t.unwrap().to_f64_vec().unwrap())
            .collect();
        assert_eq!(first, second, "{name}: two passes differ");
        assert!(!first.is_empty(), "{name}: empty");
        if let Cardinality::Finite(n) = ds.cardinality() {
            assert_eq!(n as usize, first.len(), "{name}: cardinality");
        }
        assert_exhausts(&ds);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn batch_then_unbatch_is_the_identity(n in 0usize..40, width in 1usize..4, bs in 1usize..9) {
        init();
        let x = Tensor::from_vec((0..n * width).map(|v| v as f32).collect(), &[n, width]).unwrap();
        let y = Tensor::from_vec((0..n as i64).collect(), &[n]).unwrap();
        let ds = Dataset::from_tensor_slices((x, y)).unwrap();
        let batched = ds.batch(bs, false).unwrap();
        prop_assert_eq!(batched.cardinality(), Cardinality::Finite(n.div_ceil(bs) as u64));
        let round: Vec<(Vec<f32>, i64)> = batched.unbatch().iter()
            .map(|r| { let (a, b) = r.unwrap(); (a.to_vec().unwrap(), b.item().unwrap()) }).collect();
        let orig: Vec<(Vec<f32>, i64)> = ds.iter()
            .map(|r| { let (a, b) = r.unwrap(); (a.to_vec().unwrap(), b.item().unwrap()) }).collect();
        prop_assert_eq!(round, orig);
    }

    #[test]
    fn take_and_skip_split_the_stream(n in 0i64..50, k in 0u64..60) {
        init();
        let ds = Dataset::range(0, n, 1);
        let mut joined = ints(&ds.take(k));
        joined.extend(ints(&ds.skip(k)));
        prop_assert_eq!(joined, (0..n).collect::<Vec<_>>());
    }

    #[test]
    fn shuffle_is_a_permutation_for_any_buffer(n in 0u32..200, buffer in 1usize..300, seed in any::<u64>()) {
        init();
        let s = Dataset::from_generator(move || 0..n).shuffle(buffer, Some(seed), true).unwrap();
        let mut v = values(&s);
        v.sort();
        prop_assert_eq!(v, (0..n).collect::<Vec<_>>());
    }

    #[test]
    fn parallel_map_equals_sequential_map(n in 0u64..300, threads in 1usize..6) {
        init();
        let src = Dataset::from_generator(move || 0..n);
        let f = |x: u64| Ok(x.wrapping_mul(0x9E37_79B9).rotate_left(7));
        prop_assert_eq!(values(&src.map_parallel(f, threads, true)), values(&src.map(f)));
    }
}
