//! With feature `mpi`: compiles the small C shim (`src/comm/mpi/shim.c`) that hands the MPI
//! backend the values of `mpi.h` macros rsmpi does not bind, with the MPI library's own
//! compiler wrapper (`mpicc`), found as rsmpi finds it. Without the feature: nothing.

fn main() {
    #[cfg(feature = "mpi")]
    mpi_shim();
}

#[cfg(feature = "mpi")]
fn mpi_shim() {
    println!("cargo:rerun-if-changed=src/comm/mpi/shim.c");
    let lib = match build_probe_mpi::probe() {
        Ok(lib) => lib,
        Err(errs) => {
            for e in &errs {
                println!("cargo:warning=MPI not found: {e}");
            }
            panic!("feature `mpi` needs an MPI library (Open MPI or MPICH, with mpicc): see docs/MPI.md");
        }
    };
    let mut build = cc::Build::new();
    build.file("src/comm/mpi/shim.c");
    match lib.mpicc {
        Some(mpicc) => {
            build.compiler(mpicc);
        }
        None => {
            for inc in &lib.include_paths {
                build.include(inc);
            }
        }
    }
    build.compile("xccl_mpi_shim");
}
