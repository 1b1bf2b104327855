//! Compiles the gRPC protocol with protox (pure Rust: no `protoc` on the build machine).
//!
//! - `proto/localv1.proto`: kpng-rs's protocol (KPNG localv1 plus our fields), server and client.
//! - `tests/kpng-original/localv1/api.proto`: KPNG's unmodified proto, into its own module
//!   (`$OUT_DIR/kpng_original/`), so the compatibility test decodes our stream with types that
//!   never saw our additions.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ours = "proto/localv1.proto";
    let original = "tests/kpng-original/localv1/api.proto";
    println!("cargo:rerun-if-changed={ours}");
    println!("cargo:rerun-if-changed={original}");

    tonic_prost_build::configure()
        .bytes(".localv1.Value.Bytes")
        .bytes(".localv1.KpngBundle.Zstd")
        .compile_fds(protox::compile([ours], ["proto"])?)?;

    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("kpng_original");
    std::fs::create_dir_all(&out)?;
    tonic_prost_build::configure()
        .build_server(false)
        .out_dir(out)
        .compile_fds(protox::compile([original], ["tests/kpng-original"])?)?;
    Ok(())
}
