//! `countersign serve`: run the gateway until SIGINT/SIGTERM. The gateway's
//! life itself (what starts, and in which order it stops) is
//! [`super::running`]'s.

use crate::core::config::Config;
use crate::front::gateway::Gateway;

/// Run the gateway with a loaded config.
pub(crate) async fn serve(config: Config) -> anyhow::Result<()> {
    let running = Gateway::start(config).await?;
    // Tests and scripts wait for this exact line on stderr.
    eprintln!("countersign: listening on {}", running.local_addr());
    shutdown_signal().await;
    tracing::info!("shutting down");
    let stopped = running.shutdown().await;
    if !stopped.panicked.is_empty() {
        anyhow::bail!(
            "{} background task(s) panicked while the gateway ran: {}",
            stopped.panicked.len(),
            stopped.panicked.join("; ")
        );
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
