//! The `weir` binary: parse flags, set up logging, bind, and hand over to `server::run`.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use tracing_subscriber::EnvFilter;
use weir::config::{Config, LogFormat};

/// mimalloc, not the system allocator: with 10 000 tenants under load, glibc's malloc held
/// about 3× the live heap (427 MB of RSS for 151 MB of heap, measured with heaptrack), as
/// each tenant's long-lived metric series sit between the short-lived buffers of requests and
/// scrapes. See the soak figures in docs/reliability.md.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let config = match Config::load_from(std::env::args_os()) {
        Ok(config) => config,
        Err(err) => match err.downcast::<clap::Error>() {
            Ok(clap_error) => clap_error.exit(), // --help, --version, usage errors
            Err(err) => {
                eprintln!("weir: {err:#}");
                return ExitCode::from(2);
            }
        },
    };
    init_logging(&config);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("weir: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(config)) {
        Ok(()) => ExitCode::SUCCESS,
        // Printed once, plainly: start-up errors are for the person at the terminal.
        Err(err) => {
            eprintln!("weir: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(config.http_addr)
        .await
        .with_context(|| {
            format!(
                "cannot listen on --http-addr {} (a second replica on one host needs its own \
                 --http-addr, --grpc-addr and --gossip-addr; see the README's two-replica \
                 try-out)",
                config.http_addr
            )
        })?;
    weir::server::run(config, listener, shutdown_signal()).await
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("installing a SIGTERM handler");
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}

fn init_logging(config: &Config) {
    // `Config::validate` refused a filter that does not parse.
    let filter = EnvFilter::try_new(&config.log_level).unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour only for a person at a terminal: a log file or a collector gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match config.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
