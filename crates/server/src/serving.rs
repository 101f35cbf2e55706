//! Connections that slow or hostile clients cannot use to stall the server.
//!
//! The server accepts on its own loop instead of tonic's: it holds at most
//! `serving.max_connections` connections (by default the open-file limit minus
//! `serving.reserved_descriptors`, kept for the database and the metrics endpoint), and when
//! full, or when `accept` fails for want of descriptors, it closes the connections that do
//! nothing, those that never finished their handshake first, then backs off instead of
//! spinning. Each connection closes itself when it has not sent the HTTP/2 preface within
//! `serving.handshake_timeout_ms`, when it has had no call in flight for
//! `serving.idle_timeout_seconds`, and, once shutdown began, as soon as it has no call in
//! flight.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;
use futures::FutureExt;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tokio_stream::wrappers::ReceiverStream;

use crate::config::ServingConfig;
use crate::metrics::Metrics;

/// The HTTP/2 client preface: what a client sends first.
const PREFACE_BYTES: u64 = 24;
/// Idle connections closed at once when the server is full.
const EVICT_BATCH: usize = 16;
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Raises the soft open-file limit to the hard limit: (before, after).
#[cfg(unix)]
pub fn raise_open_file_limit() -> io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let before = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok((before, limit.rlim_cur))
}

/// The soft open-file limit, if known.
#[cfg(unix)]
fn open_file_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct passed.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0).then_some(limit.rlim_cur)
}

#[cfg(not(unix))]
fn open_file_limit() -> Option<u64> {
    None
}

/// How many connections the server holds at once.
pub(crate) fn connection_cap(config: &ServingConfig) -> usize {
    let by_descriptors = open_file_limit()
        .map(|limit| limit.saturating_sub(config.reserved_descriptors).max(1))
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(usize::MAX);
    match config.max_connections {
        0 => by_descriptors,
        n => n.min(by_descriptors),
    }
    .min(Semaphore::MAX_PERMITS)
}

/// What one connection shares with the registry and with the calls it carries.
#[derive(Debug)]
pub(crate) struct ConnectionState {
    id: u64,
    opened: Instant,
    handshaken: AtomicBool,
    /// Calls in flight.
    active: AtomicUsize,
    /// Milliseconds since `opened` when the last call ended (or the handshake completed).
    last_active_ms: AtomicU64,
    close: AtomicBool,
    waker: AtomicWaker,
}

impl ConnectionState {
    fn idle_since(&self) -> Instant {
        self.opened + Duration::from_millis(self.last_active_ms.load(Ordering::Acquire))
    }

    fn touch(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_active_ms.store(ms, Ordering::Release);
    }

    fn close(&self) {
        self.close.store(true, Ordering::Release);
        self.waker.wake();
    }
}

/// The open connections.
pub(crate) struct Registry {
    connections: Mutex<HashMap<u64, Arc<ConnectionState>>>,
    next_id: AtomicU64,
    shutting_down: AtomicBool,
    slots: Arc<Semaphore>,
    settings: Timeouts,
    metrics: Option<Arc<Metrics>>,
}

#[derive(Debug, Clone, Copy)]
struct Timeouts {
    handshake: Duration,
    idle: Duration,
}

impl Registry {
    pub(crate) fn new(config: &ServingConfig, metrics: Option<Arc<Metrics>>) -> Arc<Registry> {
        Arc::new(Registry {
            connections: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            shutting_down: AtomicBool::new(false),
            slots: Arc::new(Semaphore::new(connection_cap(config))),
            settings: Timeouts {
                handshake: Duration::from_millis(config.handshake_timeout_ms.max(1)),
                idle: Duration::from_secs(config.idle_timeout_seconds.max(1)),
            },
            metrics,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<ConnectionState>>> {
        // A poisoned lock only means another thread panicked mid-update; the map stays usable.
        self.connections.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Closes every connection that has no call in flight, and each other one as its last
    /// call ends.
    pub(crate) fn shut_down(&self) {
        self.shutting_down.store(true, Ordering::Release);
        for connection in self.lock().values() {
            connection.waker.wake();
        }
    }

    /// Closes up to `count` connections that carry no call: those that never finished their
    /// handshake first, oldest first, then the longest idle.
    fn evict_idle(&self, count: usize) -> usize {
        let mut idle: Vec<(bool, Instant, Arc<ConnectionState>)> = self
            .lock()
            .values()
            .filter(|c| c.active.load(Ordering::Acquire) == 0 && !c.close.load(Ordering::Acquire))
            .map(|c| {
                (
                    c.handshaken.load(Ordering::Acquire),
                    c.idle_since(),
                    c.clone(),
                )
            })
            .collect();
        idle.sort_by_key(|(handshaken, since, _)| (*handshaken, *since));
        let evicted = idle.len().min(count);
        for (_, _, connection) in idle.into_iter().take(count) {
            connection.close();
        }
        if let Some(metrics) = &self.metrics {
            metrics.connections_evicted(evicted as u64);
        }
        evicted
    }

    fn register(self: &Arc<Self>, stream: TcpStream, permit: OwnedSemaphorePermit) -> Connection {
        let state = Arc::new(ConnectionState {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            opened: Instant::now(),
            handshaken: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            last_active_ms: AtomicU64::new(0),
            close: AtomicBool::new(false),
            waker: AtomicWaker::new(),
        });
        self.lock().insert(state.id, state.clone());
        if let Some(metrics) = &self.metrics {
            metrics.connection_opened();
        }
        Connection {
            timer: Box::pin(tokio::time::sleep(self.settings.handshake)),
            stream,
            state,
            registry: self.clone(),
            read_bytes: 0,
            _permit: permit,
        }
    }
}

/// Accepts connections on `listener` for as long as the returned stream is read.
pub(crate) fn incoming(
    listener: TcpListener,
    registry: Arc<Registry>,
) -> ReceiverStream<io::Result<Connection>> {
    let (sender, receiver) = mpsc::channel(64);
    tokio::spawn(accept_loop(listener, registry, sender));
    ReceiverStream::new(receiver)
}

async fn accept_loop(
    listener: TcpListener,
    registry: Arc<Registry>,
    sender: mpsc::Sender<io::Result<Connection>>,
) {
    let mut backoff = Duration::from_millis(5);
    let mut last_warning: Option<Instant> = None;
    loop {
        let permit = match registry.slots.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                registry.evict_idle(EVICT_BATCH);
                tokio::select! {
                    permit = registry.slots.clone().acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => return,
                    },
                    _ = sender.closed() => return,
                }
            }
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = sender.closed() => return,
        };
        match accepted {
            Ok((stream, _)) => {
                backoff = Duration::from_millis(5);
                // Without TCP_NODELAY, Nagle's algorithm holds small responses back until the
                // client's delayed ACK (tens of ms per call).
                let _ = stream.set_nodelay(true);
                let connection = registry.register(stream, permit);
                if sender.send(Ok(connection)).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                drop(permit);
                if !out_of_resources(&e) {
                    // The peer gave up before we accepted (ECONNABORTED and the like).
                    continue;
                }
                if let Some(metrics) = &registry.metrics {
                    metrics.accept_failed();
                }
                if last_warning.is_none_or(|at| at.elapsed() > Duration::from_secs(10)) {
                    tracing::warn!(error = %e, backoff_ms = backoff.as_millis() as u64, "cannot accept connections: out of descriptors; closing idle connections and backing off");
                    last_warning = Some(Instant::now());
                }
                registry.evict_idle(EVICT_BATCH);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

fn out_of_resources(error: &io::Error) -> bool {
    #[cfg(unix)]
    {
        matches!(
            error.raw_os_error(),
            Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
        )
    }
    #[cfg(not(unix))]
    {
        let _ = error;
        false
    }
}

/// An accepted connection: a TCP stream that ends itself (reads end of file, which makes the
/// HTTP/2 server close it) when it times out, is evicted, or is idle at shutdown.
pub(crate) struct Connection {
    stream: TcpStream,
    state: Arc<ConnectionState>,
    registry: Arc<Registry>,
    timer: Pin<Box<Sleep>>,
    read_bytes: u64,
    _permit: OwnedSemaphorePermit,
}

impl Connection {
    /// Whether the connection should end now; if not, the timer is set to the next moment
    /// to look again.
    fn should_close(&mut self, cx: &mut Context<'_>) -> bool {
        let state = &self.state;
        if state.close.load(Ordering::Acquire) {
            return true;
        }
        let idle = state.active.load(Ordering::Acquire) == 0;
        if idle && self.registry.shutting_down.load(Ordering::Acquire) {
            return true;
        }
        let settings = self.registry.settings;
        loop {
            let deadline = if !state.handshaken.load(Ordering::Acquire) {
                state.opened + settings.handshake
            } else if idle {
                state.idle_since() + settings.idle
            } else {
                Instant::now() + settings.idle
            };
            if Instant::now() >= deadline {
                if let Some(metrics) = &self.registry.metrics {
                    metrics.connections_evicted(1);
                }
                return true;
            }
            self.timer.as_mut().reset(deadline.into());
            if self.timer.poll_unpin(cx).is_pending() {
                return false;
            }
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.state.id);
        if let Some(metrics) = &self.registry.metrics {
            metrics.connection_closed();
        }
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.state.waker.register(cx.waker());
        if self.should_close(cx) {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if polled.is_ready() && !self.state.handshaken.load(Ordering::Acquire) {
            self.read_bytes += (buf.filled().len() - before) as u64;
            if self.read_bytes >= PREFACE_BYTES {
                self.state.touch();
                self.state.handshaken.store(true, Ordering::Release);
            }
        }
        polled
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// What a call learns of its connection.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionInfo {
    state: Arc<ConnectionState>,
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        ConnectionInfo {
            state: self.state.clone(),
        }
    }
}

/// Counts a connection's calls in flight, so that idle connections can be told apart.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ActivityLayer;

impl<S> tower_layer::Layer<S> for ActivityLayer {
    type Service = Activity<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Activity { inner }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Activity<S> {
    inner: S,
}

/// One call in flight on a connection; the call ends when this is dropped (with the response
/// body, or with the call's future when it never answered).
struct InFlight(Arc<ConnectionState>);

impl InFlight {
    fn start(state: &Arc<ConnectionState>) -> InFlight {
        state.active.fetch_add(1, Ordering::AcqRel);
        InFlight(state.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.active.fetch_sub(1, Ordering::AcqRel);
        // The connection may now be idle past a shutdown.
        self.0.waker.wake();
    }
}

fn connection_of<B>(request: &http::Request<B>) -> Option<Arc<ConnectionState>> {
    let extensions = request.extensions();
    extensions
        .get::<ConnectionInfo>()
        .or_else(|| {
            extensions
                .get::<tonic::transport::server::TlsConnectInfo<ConnectionInfo>>()
                .map(|tls| tls.get_ref())
        })
        .map(|info| info.state.clone())
}

type Tracked<B, E> = Box<
    dyn FnOnce(Result<http::Response<B>, E>) -> Result<http::Response<TrackedBody<B>>, E> + Send,
>;

impl<S, ReqBody, ResBody> tower_service::Service<http::Request<ReqBody>> for Activity<S>
where
    S: tower_service::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    ResBody: Send + 'static,
    S::Error: 'static,
{
    type Response = http::Response<TrackedBody<ResBody>>;
    type Error = S::Error;
    type Future = futures::future::Map<S::Future, Tracked<ResBody, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let in_flight = connection_of(&request).map(|state| InFlight::start(&state));
        let track: Tracked<ResBody, S::Error> = Box::new(move |result| {
            result.map(|response| {
                response.map(|inner| TrackedBody {
                    inner,
                    _in_flight: in_flight,
                })
            })
        });
        self.inner.call(request).map(track)
    }
}

pin_project_lite::pin_project! {
    /// A response body that keeps its call counted as in flight until it is dropped.
    pub(crate) struct TrackedBody<B> {
        #[pin]
        inner: B,
        _in_flight: Option<InFlight>,
    }
}

impl<B: http_body::Body> http_body::Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
