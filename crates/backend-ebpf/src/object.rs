//! The BPF object `build.rs` compiled, embedded 8-byte aligned (the ELF parser reads it in
//! place).

/// Bytes with the alignment of `u64`.
#[repr(C, align(8))]
pub struct Aligned<T: ?Sized>(pub T);

/// `bpf/sock_lb.c`, compiled.
pub static OBJECT: &Aligned<[u8]> =
    &Aligned(*include_bytes!(concat!(env!("OUT_DIR"), "/sock_lb.o")));
