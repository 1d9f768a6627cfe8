// Generates the protobuf types from the crate's own copy of the schema,
// proto/idemproxy/v1/idemproxy.proto: a byte-identical copy of the repository's
// proto/ (its one owner; `make proto-copies` at the top refreshes the copy and
// tests/packaging/test_proto_copies.py checks it), so the packaged crate builds alone.
// protoc comes from the protoc-bin-vendored crate unless PROTOC names another one.
fn main() -> std::io::Result<()> {
    let proto_dir = "proto";
    let proto = "proto/idemproxy/v1/idemproxy.proto";
    println!("cargo:rerun-if-changed={proto}");
    println!("cargo:rerun-if-env-changed=PROTOC");
    let protoc = match std::env::var_os("PROTOC") {
        Some(p) => p.into(),
        None => protoc_bin_vendored::protoc_bin_path().map_err(std::io::Error::other)?,
    };
    prost_build::Config::new().protoc_executable(protoc).compile_protos(&[proto], &[proto_dir])
}
