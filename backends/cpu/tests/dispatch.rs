//! The dispatcher's contract: observers see every op with its inputs and outputs, thread
//! observers stay on their thread, re-entrant ops are not reported twice, and variable reads
//! are announced.

use ferroflow_tensor::{
    add_observer, push_thread_observer, Op, OpEvent, OpObserver, Tensor, TensorId, Variable,
};
use std::sync::{Arc, Mutex};

/// (op name, input ids, output ids)
type Seen = (String, Vec<TensorId>, Vec<TensorId>);

#[derive(Default)]
struct Recorder {
    ops: Mutex<Vec<Seen>>,
    reads: Mutex<Vec<String>>,
}

impl OpObserver for Recorder {
    fn on_op(&self, e: &OpEvent<'_>) {
        // An op run while notifying must not be reported again (no recursion).
        if let Some(y) = e.outputs.first() {
            let _ = y.add(y);
        }
        self.ops.lock().unwrap().push((
            e.op.name().to_string(),
            e.inputs.iter().map(|t| t.id()).collect(),
            e.outputs.iter().map(|t| t.id()).collect(),
        ));
    }
    fn on_variable_read(&self, v: &Variable, _: &Tensor) {
        self.reads.lock().unwrap().push(v.name().to_string());
    }
}

#[test]
fn thread_observer_sees_each_op_once_with_ids() {
    ferroflow_cpu::register();
    let x = Tensor::from_slice(&[1.0f32, 2.0]).unwrap();
    let rec = Arc::new(Recorder::default());
    let guard = push_thread_observer(rec.clone());
    let y = x.exp().unwrap();
    let z = y.matmul(
        &y.reshape(&[2, 1])
            .unwrap()
            .t()
            .unwrap()
            .t()
            .unwrap()
            .reshape(&[1, 2])
            .unwrap()
            .t()
            .unwrap()
            .reshape(&[2, 1])
            .unwrap()
            .t()
            .unwrap(),
    );
    assert!(z.is_err(), "[2] @ [1,2] needs rank 2");
    // Reading back to the host is an op too (a profiler sees transfers).
    assert_eq!(y.to_vec::<f32>().unwrap().len(), 2);
    let v = Variable::new("w", x.clone());
    let _ = v.value();
    // Another thread's ops are not seen by this thread's observer.
    std::thread::spawn(|| Tensor::from_slice(&[1.0f32]).unwrap().neg().unwrap())
        .join()
        .unwrap();
    drop(guard);
    let _ = x.neg().unwrap(); // after the guard: not recorded
    let ops = rec.ops.lock().unwrap();
    let names: Vec<&str> = ops.iter().map(|o| o.0.as_str()).collect();
    assert_eq!(names.first(), Some(&"exp"));
    assert_eq!(ops[0].1, vec![x.id()]);
    assert_eq!(ops[0].2, vec![y.id()]);
    assert!(!names.contains(&"add"), "re-entrant op reported: {names:?}");
    assert!(
        ops.iter()
            .any(|(n, i, o)| n == "to_host" && i == &vec![y.id()] && o.is_empty()),
        "the read to the host is not reported: {names:?}"
    );
    assert!(
        !names.contains(&"neg"),
        "other thread or post-guard op reported: {names:?}"
    );
    assert_eq!(*rec.reads.lock().unwrap(), vec!["w".to_string()]);
}

#[test]
fn global_observer_sees_other_threads_and_op_attributes() {
    ferroflow_cpu::register();
    let rec = Arc::new(Recorder::default());
    let seen = Arc::new(Mutex::new(Vec::new()));
    struct Attrs(Arc<Mutex<Vec<Op>>>);
    impl OpObserver for Attrs {
        fn on_op(&self, e: &OpEvent<'_>) {
            self.0.lock().unwrap().push(e.op.clone());
        }
    }
    let g1 = add_observer(rec.clone());
    let g2 = add_observer(Arc::new(Attrs(seen.clone())));
    std::thread::spawn(|| {
        let t = Tensor::from_vec(vec![1.0f32; 6], &[2, 3]).unwrap();
        t.reduce_sum(-1, true).unwrap()
    })
    .join()
    .unwrap();
    drop((g1, g2));
    let ops = seen.lock().unwrap();
    assert!(
        ops.iter()
            .any(|o| matches!(o, Op::Reduce { axes, keepdims: true, .. } if axes == &vec![1])),
        "{ops:?}"
    );
}

#[test]
fn live_tensor_bytes_return_to_baseline() {
    ferroflow_cpu::register();
    // Other tests in this binary run in parallel with small tensors (well under 1 MiB), so
    // compare with that much slack around one 4 MiB allocation.
    let slack = 1 << 20;
    let before = ferroflow_tensor::live_tensor_bytes();
    let t = Tensor::zeros(&[1 << 20], ferroflow_tensor::DType::F32).unwrap();
    assert!(ferroflow_tensor::live_tensor_bytes() + slack >= before + (4 << 20));
    let view = t.reshape(&[1024, 1024]).unwrap();
    assert!(
        view.shares_storage_with(&t),
        "reshape of dense data is a view"
    );
    drop(t);
    drop(view);
    assert!(ferroflow_tensor::live_tensor_bytes() < before + slack);
}

#[test]
fn device_strings_and_scopes() {
    ferroflow_cpu::register();
    let t = ferroflow_tensor::with_device("/job:localhost/replica:0/task:0/device:CPU:0", || {
        Tensor::scalar(1.0f32)
    })
    .unwrap()
    .unwrap();
    assert_eq!(t.device(), ferroflow_tensor::Device::CPU);
    let e = ferroflow_tensor::device_scope("/GPU:0")
        .err()
        .expect("no GPU backend in this build")
        .to_string();
    assert!(e.contains("GPU:0") && e.contains("feature"), "{e}");
    assert!(ferroflow_tensor::device_scope("/TPU:0").is_err());
    assert!(ferroflow_tensor::list_devices()
        .iter()
        .any(|(d, b)| *d == ferroflow_tensor::Device::CPU && b == "cpu"));
}
