//! Stop signals from the operating system: the one wait for SIGINT or
//! SIGTERM that the pipeline runner ([`crate::pipeline::Pipeline::run_until_signal`])
//! and the `spate` binary (its process runner, `demo`, `broker` and the
//! second-signal exit) share.
//!
//! What a signal means is the caller's: the first asks for a drain
//! ([`Shutdown::trigger`], D5); the binary exits at once on a second.

use crate::pipeline::Shutdown;

/// Resolves at the next SIGINT or SIGTERM (at the next SIGINT only where
/// there are no Unix signals, or when SIGTERM's handler cannot be
/// installed).
pub async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Starts a thread, `spate-signals`, that triggers `shutdown` at the first
/// SIGINT or SIGTERM and logs `message` at INFO when it does.
///
/// # Errors
/// The thread's runtime or the thread itself could not start.
pub fn trigger_on_signal(shutdown: Shutdown, message: &'static str) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("spate-signals".into())
        .spawn(move || {
            rt.block_on(wait_for_signal());
            tracing::info!("{message}");
            shutdown.trigger();
        })
        .map(drop)
}
