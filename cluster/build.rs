//! Compiles the cluster's protos with protox (pure Rust: no `protoc` on the machine).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/ferroflow_cluster.proto");
    let fds = protox::compile(["proto/ferroflow_cluster.proto"], ["proto"])?;
    // `bytes` fields as `bytes::Bytes`: a retried call re-sends its payload without a copy.
    tonic_prost_build::configure().bytes(".").compile_fds(fds)?;
    Ok(())
}
