//! Real-packet end-to-end tests of `kpng … to-local ebpf`: the shared suite in `e2e/` (node1
//! and its pods are in the programs' cgroup, every other namespace outside it), plus what only
//! socket-level load balancing does.

mod e2e;

e2e::suite!(e2e::Backend::Ebpf);
