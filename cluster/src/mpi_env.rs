//! [`MpiLaunch`]: recognising a process that `mpirun` (or `mpiexec`, or srun with PMI)
//! started, from the variables the MPI launcher sets, without linking MPI.

use ferroflow_tensor::{Error, Result};

/// This process's place in a job an MPI launcher started: read from `OMPI_COMM_WORLD_RANK`
/// and `OMPI_COMM_WORLD_SIZE` (Open MPI's `mpirun`), else `PMI_RANK` and `PMI_SIZE` (MPICH's
/// and Intel MPI's `mpiexec`, srun with PMI).
///
/// ```
/// use ferroflow_cluster::MpiLaunch;
/// let env = [("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "4")];
/// let launch = MpiLaunch::from_vars(|k| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))?;
/// assert_eq!(launch, Some(MpiLaunch { rank: 1, size: 4, launcher: "Open MPI" }));
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MpiLaunch {
    /// This process's rank (`MPI_Comm_rank` of the world).
    pub rank: usize,
    /// How many processes the launcher started.
    pub size: usize,
    /// Whose variables said so (`"Open MPI"`, `"PMI"`).
    pub launcher: &'static str,
}

impl MpiLaunch {
    /// The launch this process's environment describes, if an MPI launcher started it.
    pub fn from_env() -> Result<Option<MpiLaunch>> {
        MpiLaunch::from_vars(|k| std::env::var(k).ok())
    }

    /// The launch the variables `var` looks up describe; a rank or size that is not a
    /// number, or a rank outside the size, is an error naming the variable.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<MpiLaunch>> {
        for (launcher, rank_var, size_var) in [
            ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
            ("PMI", "PMI_RANK", "PMI_SIZE"),
        ] {
            let (Some(rank), Some(size)) = (var(rank_var), var(size_var)) else {
                continue;
            };
            let number = |name: &str, text: &str| {
                text.trim().parse::<usize>().map_err(|_| {
                    Error::format(name, format!("{text:?} is not a process count or rank"))
                })
            };
            let (rank, size) = (number(rank_var, &rank)?, number(size_var, &size)?);
            if size == 0 || rank >= size {
                return Err(Error::format(
                    rank_var,
                    format!("rank {rank} is outside a job of {size} ({size_var})"),
                ));
            }
            return Ok(Some(MpiLaunch {
                rank,
                size,
                launcher,
            }));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(vars: &[(&str, &str)]) -> Result<Option<MpiLaunch>> {
        MpiLaunch::from_vars(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn open_mpi_and_pmi_variables_are_recognised_and_bad_ones_named() {
        assert_eq!(launch(&[]).unwrap(), None);
        assert_eq!(launch(&[("OMPI_COMM_WORLD_RANK", "0")]).unwrap(), None);
        assert_eq!(
            launch(&[("PMI_RANK", "2"), ("PMI_SIZE", "3")]).unwrap(),
            Some(MpiLaunch {
                rank: 2,
                size: 3,
                launcher: "PMI"
            })
        );
        let e = launch(&[("OMPI_COMM_WORLD_RANK", "4"), ("OMPI_COMM_WORLD_SIZE", "4")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("OMPI_COMM_WORLD_RANK") && e.contains("rank 4"),
            "{e}"
        );
        let e = launch(&[("PMI_RANK", "x"), ("PMI_SIZE", "2")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("PMI_RANK") && e.contains("\"x\""), "{e}");
    }
}
