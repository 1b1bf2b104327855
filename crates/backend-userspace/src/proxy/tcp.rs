//! TCP: accept, pick an endpoint, connect, relay.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, warn};

use super::{PortShared, ProxySettings};
use crate::routing::Scope;

/// At most this many endpoints are tried for one connection.
const MAX_ATTEMPTS: usize = 3;

/// Pause after a failed `accept` (e.g. out of file descriptors), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Accepts connections until the task is aborted (the listener is dropped with it).
pub async fn serve(
    listener: TcpListener,
    shared: Arc<PortShared>,
    scope: Scope,
    settings: ProxySettings,
) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                shared.metrics.tcp_accepted.inc();
                tokio::spawn(relay(stream, peer, shared.clone(), scope, settings));
            }
            Err(e) => {
                warn!(port = %shared.name, "accept failed: {e}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

/// Counts one relayed connection for as long as it lives.
struct Active(Gauge);

impl Active {
    fn new(gauge: &Gauge) -> Active {
        gauge.inc();
        Active(gauge.clone())
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// One client connection: connects to an endpoint and copies both ways until both sides are
/// done. Not tied to the listener: it outlives endpoint and Service removals (drain).
async fn relay(
    mut client: TcpStream,
    peer: SocketAddr,
    shared: Arc<PortShared>,
    scope: Scope,
    settings: ProxySettings,
) {
    let Some(mut upstream) = connect(&shared, scope, peer.ip(), settings).await else {
        shared.metrics.unserved.inc();
        // Reset rather than close: the client learns at once that nothing serves it.
        let _ = client.set_zero_linger();
        return;
    };
    let _active = Active::new(&shared.metrics.tcp_active);
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
        debug!(port = %shared.name, %peer, "connection ended: {e}");
    }
}

/// Connects to an endpoint, trying the next one when a connect fails or times out.
async fn connect(
    shared: &PortShared,
    scope: Scope,
    who: IpAddr,
    settings: ProxySettings,
) -> Option<TcpStream> {
    let attempts = shared.candidates(scope).min(MAX_ATTEMPTS);
    for _ in 0..attempts {
        let endpoint = shared.pick(scope, who)?;
        match tokio::time::timeout(settings.connect_timeout, TcpStream::connect(endpoint)).await {
            Ok(Ok(stream)) => return Some(stream),
            Ok(Err(e)) => debug!(port = %shared.name, %endpoint, "connect failed: {e}"),
            Err(_) => debug!(port = %shared.name, %endpoint, "connect timed out"),
        }
        shared.failed(scope, who, endpoint);
    }
    None
}
