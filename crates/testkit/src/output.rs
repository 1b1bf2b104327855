//! Reading a child process's output while it runs.

use std::io::Read;
use std::process::Output;
use std::sync::{Arc, Mutex};

/// Collects everything `from` produces (a child's stdout or stderr) into a shared string, on a
/// thread of its own, so a test can read what a long-running process has said so far without
/// blocking and without the pipe filling up.
pub fn collect_output(mut from: impl Read + Send + 'static) -> Arc<Mutex<String>> {
    let text = Arc::new(Mutex::new(String::new()));
    let sink = text.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    text
}

/// A finished program's exit status, standard output and standard error, each named (an empty
/// one said to be empty), for the message of an assertion on it.
///
/// Why: a test that looks at one stream, or only at the status, fails with nothing to go on
/// when the program says why on the other (`kpng cleanup` failing under load printed only its
/// empty standard output).
pub fn describe_output(output: &Output) -> String {
    let stream = |name: &str, bytes: &[u8]| {
        let text = String::from_utf8_lossy(bytes);
        if text.trim().is_empty() {
            format!("--- {name}: empty ---")
        } else {
            format!("--- {name} ---\n{}", text.trim_end())
        }
    };
    format!(
        "{}\n{}\n{}",
        output.status,
        stream("stdout", &output.stdout),
        stream("stderr", &output.stderr)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn an_output_is_described_with_its_status_and_both_streams() {
        let output = Output {
            status: std::process::ExitStatus::from_raw(1 << 8),
            stdout: Vec::new(),
            stderr: b"kpng: removing kube-proxy's iptables chains: busy\n".to_vec(),
        };
        assert_eq!(
            describe_output(&output),
            "exit status: 1\n--- stdout: empty ---\n--- stderr ---\n\
             kpng: removing kube-proxy's iptables chains: busy"
        );
    }
}
