// Generates the protobuf types from the repository's proto/ (never a copied schema).
// protoc comes from the protoc-bin-vendored crate unless PROTOC names another one.
fn main() -> std::io::Result<()> {
    let proto_dir = "../../proto";
    let proto = "../../proto/idemproxy/v1/idemproxy.proto";
    println!("cargo:rerun-if-changed={proto}");
    println!("cargo:rerun-if-env-changed=PROTOC");
    let protoc = match std::env::var_os("PROTOC") {
        Some(p) => p.into(),
        None => protoc_bin_vendored::protoc_bin_path().map_err(std::io::Error::other)?,
    };
    prost_build::Config::new().protoc_executable(protoc).compile_protos(&[proto], &[proto_dir])
}
