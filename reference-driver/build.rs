//! Compiles proto/pluginregistration.proto (the kubelet's plugin registration API) with protox,
//! a pure-Rust protobuf compiler, into prost messages and a tonic server and client, the way
//! csi-spec compiles the CSI proto.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/pluginregistration.proto");
    let descriptors = protox::compile(["proto/pluginregistration.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
