//! The two transformations that run on background threads: parallel `map` and `prefetch`.
//!
//! Both stop their threads when the consumer drops its iterator (the threads finish the
//! element they hold, then exit), and both turn a panic on a background thread into an `Err`
//! item for the consumer.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use ferroflow_tensor::{Error, Result};

use crate::dataset::{at_element, call_guarded, num_cores, ElementIter, Parallelism};

/// The function of a parallel map.
pub(crate) type MapFn<T, U> = dyn Fn(T) -> Result<U> + Send + Sync;

fn lock<S>(m: &Mutex<S>) -> MutexGuard<'_, S> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct MapInput<T> {
    iter: ElementIter<T>,
    next_index: u64,
    done: bool,
}

struct MapState<U> {
    /// Finished elements by input position.
    ready: BTreeMap<u64, Result<U>>,
    /// Elements taken from the input and not yet handed to the consumer.
    in_flight: usize,
    next_out: u64,
    workers_alive: usize,
    stopped: bool,
}

struct MapShared<T, U> {
    input: Mutex<MapInput<T>>,
    state: Mutex<MapState<U>>,
    /// Workers wait here for room in the buffer.
    room: Condvar,
    /// The consumer waits here for a result.
    result: Condvar,
    max_in_flight: usize,
    deterministic: bool,
}

/// `f` over `input` on `threads` workers.
pub(crate) fn parallel_map<T: Send + 'static, U: Send + 'static>(
    input: ElementIter<T>,
    f: Arc<MapFn<T, U>>,
    threads: usize,
    deterministic: bool,
) -> ElementIter<U> {
    let shared = Arc::new(MapShared {
        input: Mutex::new(MapInput {
            iter: input,
            next_index: 0,
            done: false,
        }),
        state: Mutex::new(MapState {
            ready: BTreeMap::new(),
            in_flight: 0,
            next_out: 0,
            workers_alive: 0,
            stopped: false,
        }),
        room: Condvar::new(),
        result: Condvar::new(),
        max_in_flight: 2 * threads,
        deterministic,
    });
    let (mut spawn_error, mut started) = (None, 0);
    for w in 0..threads {
        let s = shared.clone();
        let f = f.clone();
        lock(&shared.state).workers_alive += 1;
        let spawned = std::thread::Builder::new()
            .name(format!("ferroflow-map-{w}"))
            .spawn(move || map_worker(&s, &*f));
        if let Err(e) = spawned {
            lock(&shared.state).workers_alive -= 1;
            spawn_error = Some(e);
            break;
        }
        started += 1;
    }
    // (Not `workers_alive`: on a short input every worker may already have finished.)
    if started == 0 {
        let msg = spawn_error.map(|e| e.to_string()).unwrap_or_default();
        return Box::new(std::iter::once(Err(Error::Backend {
            backend: "data",
            msg: format!("map: could not start a worker thread: {msg}"),
        })));
    }
    Box::new(ParallelMapIter { shared })
}

fn map_worker<T, U>(s: &MapShared<T, U>, f: &MapFn<T, U>) {
    loop {
        {
            let mut st = lock(&s.state);
            while st.in_flight >= s.max_in_flight && !st.stopped {
                st = s.room.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.stopped {
                break;
            }
            st.in_flight += 1;
        }
        let taken = {
            let mut input = lock(&s.input);
            if input.done {
                None
            } else {
                let i = input.next_index;
                match call_guarded("map input", || Ok(input.iter.next())) {
                    Ok(Some(x)) => {
                        input.next_index += 1;
                        Some((i, x))
                    }
                    Ok(None) => {
                        input.done = true;
                        None
                    }
                    Err(e) => {
                        input.done = true;
                        Some((i, Err(at_element("map", i, e))))
                    }
                }
            }
        };
        let Some((i, x)) = taken else {
            lock(&s.state).in_flight -= 1;
            break;
        };
        let out = {
            let _span = ferroflow_tensor::trace::TraceMe::new("ParallelMapProduce");
            x.and_then(|x| call_guarded("map", || f(x)).map_err(|e| at_element("map", i, e)))
        };
        let mut st = lock(&s.state);
        st.ready.insert(i, out);
        s.result.notify_all();
    }
    let mut st = lock(&s.state);
    st.workers_alive -= 1;
    s.result.notify_all();
}

struct ParallelMapIter<T, U> {
    shared: Arc<MapShared<T, U>>,
}

impl<T, U> Iterator for ParallelMapIter<T, U> {
    type Item = Result<U>;
    fn next(&mut self) -> Option<Result<U>> {
        let s = &*self.shared;
        let mut st = lock(&s.state);
        loop {
            let key = if s.deterministic {
                let k = st.next_out;
                st.ready.contains_key(&k).then_some(k)
            } else {
                st.ready.keys().next().copied()
            };
            if let Some(k) = key {
                let r = st.ready.remove(&k).expect("the key was just found");
                st.next_out += 1;
                st.in_flight -= 1;
                s.room.notify_one();
                return Some(r);
            }
            if st.workers_alive == 0 {
                return None;
            }
            st = s.result.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl<T, U> Drop for ParallelMapIter<T, U> {
    fn drop(&mut self) {
        lock(&self.shared.state).stopped = true;
        self.shared.room.notify_all();
    }
}

struct PrefetchState<T> {
    queue: VecDeque<Result<T>>,
    capacity: usize,
    producer_done: bool,
    consumer_gone: bool,
}

struct PrefetchShared<T> {
    state: Mutex<PrefetchState<T>>,
    not_full: Condvar,
    not_empty: Condvar,
    autotune_max: Option<usize>,
}

/// Elements of `input` produced on a background thread into a bounded buffer.
pub(crate) fn prefetch<T: Send + 'static>(
    mut input: ElementIter<T>,
    buffer: Parallelism,
) -> ElementIter<T> {
    let (capacity, autotune_max) = match buffer {
        Parallelism::Fixed(n) => (n.max(1), None),
        Parallelism::Autotune => (2, Some(64.max(2 * num_cores()))),
    };
    let shared = Arc::new(PrefetchShared {
        state: Mutex::new(PrefetchState {
            queue: VecDeque::new(),
            capacity,
            producer_done: false,
            consumer_gone: false,
        }),
        not_full: Condvar::new(),
        not_empty: Condvar::new(),
        autotune_max,
    });
    let s = shared.clone();
    let spawned = std::thread::Builder::new()
        .name("ferroflow-prefetch".into())
        .spawn(move || {
            let mut index = 0u64;
            loop {
                let span = ferroflow_tensor::trace::TraceMe::new("PrefetchProduce");
                let produced = call_guarded("prefetch input", || Ok(input.next()));
                drop(span);
                let (item, panicked) = match produced {
                    Ok(item) => (item, false),
                    Err(e) => (Some(Err(at_element("prefetch", index, e))), true),
                };
                index += 1;
                let mut st = lock(&s.state);
                let Some(item) = item else {
                    break;
                };
                while st.queue.len() >= st.capacity && !st.consumer_gone {
                    st = s.not_full.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                if st.consumer_gone {
                    return;
                }
                st.queue.push_back(item);
                s.not_empty.notify_one();
                if panicked {
                    break; // an input that panicked cannot be trusted to continue
                }
            }
            lock(&s.state).producer_done = true;
            s.not_empty.notify_all();
        });
    if let Err(e) = spawned {
        return Box::new(std::iter::once(Err(Error::Backend {
            backend: "data",
            msg: format!("prefetch: could not start its thread: {e}"),
        })));
    }
    Box::new(PrefetchIter { shared })
}

struct PrefetchIter<T> {
    shared: Arc<PrefetchShared<T>>,
}

impl<T> Iterator for PrefetchIter<T> {
    type Item = Result<T>;
    fn next(&mut self) -> Option<Result<T>> {
        let s = &*self.shared;
        let mut st = lock(&s.state);
        let mut waited = false;
        loop {
            if let Some(x) = st.queue.pop_front() {
                if waited {
                    if let Some(max) = s.autotune_max {
                        // The consumer went hungry: let the producer run further ahead.
                        st.capacity = (st.capacity + 1).min(max);
                    }
                }
                s.not_full.notify_one();
                return Some(x);
            }
            if st.producer_done {
                return None;
            }
            waited = true;
            st = s.not_empty.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl<T> Drop for PrefetchIter<T> {
    fn drop(&mut self) {
        let mut st = lock(&self.shared.state);
        st.consumer_gone = true;
        st.queue.clear();
        self.shared.not_full.notify_all();
    }
}
