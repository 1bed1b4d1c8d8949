//! Compiles RocketMQ 5's `.proto` files (in `proto/`) into Rust with protox, a protobuf compiler
//! written in Rust, so a build needs no `protoc`; tonic generates the service trait from them,
//! and the client that `weir bench rocketmq` calls the service with.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/apache/rocketmq/v2/definition.proto", "proto/apache/rocketmq/v2/service.proto"];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Bodies as `Bytes`: a received body is a slice of the request and a delivered one of
        // the stored record, neither copied on its way through.
        .bytes(".apache.rocketmq.v2.Message.body")
        .compile_fds(descriptors)?;
    Ok(())
}
