//! With the `mpi` feature: compiles `src/mpi_in_place.c` with the MPI library's own compiler
//! wrapper (found as rsmpi finds it), so the collectives can pass `MPI_IN_PLACE`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "mpi")]
    {
        println!("cargo:rerun-if-changed=src/mpi_in_place.c");
        let library = build_probe_mpi::probe().map_err(|errors| {
            let reasons: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            format!(
                "the `mpi` feature needs an MPI library with its mpicc (Open MPI or MPICH): {}",
                reasons.join("; ")
            )
        })?;
        let mut build = cc::Build::new();
        build.file("src/mpi_in_place.c");
        match library.mpicc {
            Some(mpicc) => {
                build.compiler(mpicc);
            }
            None => {
                build.includes(&library.include_paths);
            }
        }
        build.try_compile("ferroflow_mpi_in_place")?;
    }
    Ok(())
}
