//! The collectives over MPI (cargo feature `mpi`): the `mpi` crate (rsmpi) on the MPI
//! library the system has (Open MPI, MPICH), for programs started by `mpirun`.
//!
//! MPI is initialised once per process, on the first group (thread level `Serialized`: every
//! call here holds [`CALLS`]), and finalised when the process exits (an `atexit` hook), as
//! `mpirun` requires of a process that ends well. MPI calls have no timeout: a rank that dies
//! ends the job through the launcher (Open MPI's `mpirun` stops every rank when one exits
//! without finalising or with a non-zero status), and the exit hook gives up finalising
//! after the collective timeout, so a rank never waits forever on one that erred.

use ferroflow_tensor::{Error, Result};
use mpi::collective::SystemOperation;
use mpi::datatype::Equivalence;
use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Root};
use std::os::raw::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Serialises this process's MPI calls (MPI is initialised at `MPI_THREAD_SERIALIZED`).
static CALLS: Mutex<()> = Mutex::new(());

/// The MPI environment, finalised by [`finalize_at_exit`].
struct Universe(mpi::environment::Universe);

// SAFETY: the universe is only touched under `UNIVERSE`'s lock, and MPI is initialised at
// `MPI_THREAD_SERIALIZED`, so finalising it from the exiting thread is allowed.
unsafe impl Send for Universe {}

static UNIVERSE: Mutex<Option<Universe>> = Mutex::new(None);

/// The longest collective timeout of this process's groups, in ms: how long the exit hook
/// waits for the other ranks to finalise.
static FINALIZE_LIMIT_MS: AtomicU64 = AtomicU64::new(0);

extern "C" {
    /// The MPI library's `MPI_IN_PLACE` (src/mpi_in_place.c, compiled by build.rs).
    fn ferroflow_mpi_in_place() -> *const std::ffi::c_void;
}

/// Elements per MPI call: counts are C `int`s.
const MAX_COUNT: usize = 1 << 30;

/// This process's rank and the world's size, MPI initialised on first use.
fn world_shape() -> Result<(usize, usize)> {
    static SHAPE: OnceLock<std::result::Result<(usize, usize), String>> = OnceLock::new();
    SHAPE
        .get_or_init(|| {
            let _calls = CALLS.lock().unwrap_or_else(|e| e.into_inner());
            if !mpi::environment::is_initialized() {
                if mpi::environment::is_finalized() {
                    return Err("MPI was already finalised in this process".to_string());
                }
                let (universe, _provided) =
                    mpi::initialize_with_threading(mpi::Threading::Serialized)
                        .ok_or_else(|| "MPI_Init_thread failed".to_string())?;
                *UNIVERSE.lock().unwrap_or_else(|e| e.into_inner()) = Some(Universe(universe));
                // SAFETY: registering a plain `extern "C"` function.
                if unsafe { libc::atexit(finalize_at_exit) } != 0 {
                    return Err("cannot register MPI_Finalize to run at exit".to_string());
                }
            }
            // Initialised by someone else (the program's own rsmpi): theirs to finalise.
            let world = SimpleCommunicator::world();
            Ok((world.rank() as usize, world.size() as usize))
        })
        .clone()
        .map_err(|msg| Error::Unavailable {
            op: "initialise MPI".into(),
            peer: "the MPI library".into(),
            msg,
        })
}

/// Finalises MPI as the process exits; gives up (exit status 1) when the other ranks do not
/// reach their own finalise within the collective timeout.
extern "C" fn finalize_at_exit() {
    let universe = UNIVERSE.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(universe) = universe {
        let limit = Duration::from_millis(FINALIZE_LIMIT_MS.load(Ordering::Relaxed).max(1000));
        std::thread::spawn(move || {
            std::thread::sleep(limit);
            eprintln!(
                "ferroflow: MPI_Finalize: the other ranks did not finish within {limit:?} \
                 (the collective timeout); exiting without them"
            );
            // SAFETY: ends the process at once, as a failed rank should.
            unsafe { libc::_exit(1) };
        });
        let _calls = CALLS.lock().unwrap_or_else(|e| e.into_inner());
        drop(universe.0); // MPI_Finalize
    }
}

/// The MPI world as a collective transport.
pub(crate) struct MpiTransport {
    rank: usize,
    world: usize,
}

impl MpiTransport {
    /// Joins the MPI world (initialising MPI on first use); `timeout` bounds the wait for the
    /// other ranks at exit.
    pub(crate) fn new(timeout: Duration) -> Result<MpiTransport> {
        let (rank, world) = world_shape()?;
        FINALIZE_LIMIT_MS.fetch_max(timeout.as_millis() as u64, Ordering::Relaxed);
        Ok(MpiTransport { rank, world })
    }

    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    pub(crate) fn world_size(&self) -> usize {
        self.world
    }

    /// Fails on every rank, together, when the ranks' `signature`s (sizes, dtypes) differ:
    /// MPI itself would mis-sum or wait forever on mismatched buffers.
    pub(crate) fn agree(&self, op: &'static str, signature: &[i64]) -> Result<()> {
        let both: Vec<i64> = signature
            .iter()
            .copied()
            .chain(signature.iter().map(|s| s.wrapping_neg()))
            .collect();
        let mut extremes = vec![0i64; both.len()];
        {
            let _calls = CALLS.lock().unwrap_or_else(|e| e.into_inner());
            SimpleCommunicator::world().all_reduce_into(
                &both[..],
                &mut extremes[..],
                SystemOperation::max(),
            );
        }
        let n = signature.len();
        if (0..n).any(|i| extremes[i] != extremes[n + i].wrapping_neg()) {
            return Err(Error::invalid(
                op,
                format!(
                    "the MPI ranks' tensors differ in shape or dtype (this rank {}: {signature:?})",
                    self.rank
                ),
            ));
        }
        Ok(())
    }

    /// Replaces `values` by their sum over the ranks, on every rank (`MPI_Allreduce` with
    /// `MPI_SUM` and `MPI_IN_PLACE`): MPI reduces in the caller's buffer. Given a separate
    /// send buffer, Open MPI copies it into the receive buffer itself first, and that copy
    /// measured up to twice as slow as the caller's own (`BENCHMARKS.md`, fortieth session).
    pub(crate) fn sum_in_place<T: Equivalence>(&self, values: &mut [T]) -> Result<()> {
        let _calls = CALLS.lock().unwrap_or_else(|e| e.into_inner());
        let world = SimpleCommunicator::world();
        for part in values.chunks_mut(MAX_COUNT) {
            // SAFETY: `part` is `part.len()` initialised values of `T`, whose MPI datatype
            // `T::equivalent_datatype()` describes, borrowed mutably for the call; the count
            // fits a C int (`MAX_COUNT`); `ferroflow_mpi_in_place` returns the library's own
            // `MPI_IN_PLACE` (src/mpi_in_place.c), which tells MPI to read and write `part`.
            let code = unsafe {
                mpi::ffi::MPI_Allreduce(
                    ferroflow_mpi_in_place(),
                    part.as_mut_ptr().cast(),
                    part.len() as c_int,
                    T::equivalent_datatype().as_raw(),
                    SystemOperation::sum().as_raw(),
                    world.as_raw(),
                )
            };
            if code != mpi::ffi::MPI_SUCCESS as c_int {
                return Err(Error::Unavailable {
                    op: "all_reduce".into(),
                    peer: "the MPI library".into(),
                    msg: format!("MPI_Allreduce returned error code {code}"),
                });
            }
        }
        Ok(())
    }

    /// Every rank's `bytes` (of one length) concatenated in rank order (`MPI_Allgather`).
    pub(crate) fn all_gather(&self, bytes: &[u8]) -> Vec<u8> {
        let _calls = CALLS.lock().unwrap_or_else(|e| e.into_inner());
        let world = SimpleCommunicator::world();
        let mut all = vec![0u8; bytes.len() * self.world];
        if bytes.len() <= MAX_COUNT {
            world.all_gather_into(bytes, &mut all[..]);
        } else {
            // Long blocks: gather part by part, then put each rank's parts together.
            let mut at = 0;
            for part in bytes.chunks(MAX_COUNT) {
                let mut gathered = vec![0u8; part.len() * self.world];
                world.all_gather_into(part, &mut gathered[..]);
                for (r, block) in gathered.chunks(part.len()).enumerate() {
                    let start = r * bytes.len() + at;
                    all[start..start + part.len()].copy_from_slice(block);
                }
                at += part.len();
            }
        }
        all
    }

    /// Rank `root`'s `bytes` on every rank (`MPI_Bcast`), in place.
    pub(crate) fn broadcast(&self, bytes: &mut [u8], root: usize) {
        let _calls = CALLS.lock().unwrap_or_else(|e| e.into_inner());
        let world = SimpleCommunicator::world();
        let root = world.process_at_rank(root as i32);
        for part in bytes.chunks_mut(MAX_COUNT) {
            root.broadcast_into(part);
        }
    }

    /// Waits until every rank has reached its barrier (`MPI_Barrier`).
    pub(crate) fn barrier(&self) {
        let _calls = CALLS.lock().unwrap_or_else(|e| e.into_inner());
        SimpleCommunicator::world().barrier();
    }
}
