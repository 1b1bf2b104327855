//! Compiles the BPF programs under `bpf/` with Debian's `clang` (`-target bpf -O2 -g`, the
//! `libbpf-dev` headers) into `$OUT_DIR`, where `src/object.rs` embeds them.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let arch = match std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("aarch64") => "aarch64-linux-gnu",
        _ => "x86_64-linux-gnu",
    };
    // One object today; more programs (tc, iterators) would be more names here.
    let programs: &[&str] = &["sock_lb"];
    for name in programs {
        let src = format!("bpf/{name}.c");
        println!("cargo:rerun-if-changed={src}");
        let obj = out.join(format!("{name}.o"));
        let status = Command::new(&clang)
            .args(["-target", "bpf", "-O2", "-g", "-Wall", "-Werror"])
            .arg(format!("-I/usr/include/{arch}"))
            .arg("-c")
            .arg(&src)
            .arg("-o")
            .arg(&obj)
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => {
                panic!("{clang} failed on {src} ({s}); the BPF programs need clang and libbpf-dev")
            }
            Err(e) => panic!(
                "cannot run {clang} ({e}): the eBPF backend's programs are built by clang \
                 (apt-get install clang libbpf-dev)"
            ),
        }
    }
    println!("cargo:rerun-if-env-changed=CLANG");
}
