//! `kpng`: a Kubernetes service proxy.
//!
//! `kpng <source> [flags] <sink> [backend] [flags]`: a source turns cluster state into the
//! node-local model, a sink consumes it. See `kpng --help`.

mod brain;
mod cli;
mod conntrack;
mod http;
mod run;

use std::io::IsTerminal;

/// jemalloc instead of glibc's allocator: loading a large cluster allocates and frees many
/// small objects from several threads, and glibc keeps that memory in fragmented per-thread
/// arenas (measured at 30k Services: glibc peaks at 565 MB, and `MALLOC_ARENA_MAX=1` alone
/// brings it to 475 MB); jemalloc returns it.
#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&cli.global.log_level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match run::main(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("kpng: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
