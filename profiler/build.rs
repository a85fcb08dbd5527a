//! Compiles TensorFlow's XSpace, event and profiler-service protos with protox (pure Rust:
//! no `protoc`); the service's gRPC code with tonic.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["proto/xplane.proto", "proto/event.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(fds)?;
    let service = protox::compile(["proto/profiler_service.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .bytes(".")
        .compile_fds(service)?;
    Ok(())
}
