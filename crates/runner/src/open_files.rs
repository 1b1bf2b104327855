//! What to say when kpng runs out of file descriptors.
//!
//! Why: with a low open-files limit (`ulimit -n 32`, a container runtime's or init system's
//! setting) the failures only said `Too many open files`: the health server's `accepting a
//! connection: Too many open files`, the eBPF backend's `bpf_link_create failed: Too many
//! open files` at every sync. Those messages now name the fix. kpng raises its soft limit to
//! the hard one at start (as Go's runtime does for kube-proxy), so what is left is a hard
//! limit set too low.

/// The advice added to a message that says the process is out of file descriptors.
pub const RAISE_THE_LIMIT: &str =
    "raise the open-files limit (ulimit -n; the eBPF backend needs about 50 descriptors)";

/// The advice added to a message that says the node's table of open files is full.
pub const NODE_TABLE_FULL: &str =
    "the node's table of open files is full (sysctl fs.file-max; see fs.file-nr)";

/// `message` with the advice for running out of descriptors, when it says so (`EMFILE`,
/// "Too many open files", or the node-wide `ENFILE`, "Too many open files in system");
/// unchanged otherwise.
pub fn with_advice(message: String) -> String {
    let advice = if message.contains("Too many open files in system") {
        NODE_TABLE_FULL
    } else if message.contains("Too many open files") {
        RAISE_THE_LIMIT
    } else {
        return message;
    };
    if message.contains(advice) {
        return message;
    }
    format!("{message}; {advice}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_out_of_descriptors_says_what_to_raise() {
        let cases = [
            (
                "attaching kpng_connect4: bpf_link_create failed: Too many open files",
                "attaching kpng_connect4: bpf_link_create failed: Too many open files; raise the \
                 open-files limit (ulimit -n; the eBPF backend needs about 50 descriptors)",
            ),
            (
                "Too many open files (os error 24)",
                "Too many open files (os error 24); raise the open-files limit (ulimit -n; the \
                 eBPF backend needs about 50 descriptors)",
            ),
            (
                "Too many open files in system (os error 23)",
                "Too many open files in system (os error 23); the node's table of open files is \
                 full (sysctl fs.file-max; see fs.file-nr)",
            ),
            ("injected failure", "injected failure"),
            // Said once, however often it is passed through.
            (
                "Too many open files; raise the open-files limit (ulimit -n; the eBPF backend \
                 needs about 50 descriptors)",
                "Too many open files; raise the open-files limit (ulimit -n; the eBPF backend \
                 needs about 50 descriptors)",
            ),
        ];
        for (message, want) in cases {
            assert_eq!(with_advice(message.to_string()), want, "{message}");
        }
    }
}
