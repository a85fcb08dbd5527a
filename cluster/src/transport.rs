//! gRPC's HTTP/2 transport for task servers and their peers, driven straight on `h2`.
//!
//! The services, messages and gRPC framing are tonic's (the generated clients and servers
//! of `proto/ferroflow_cluster.proto`, its codec, status codes and interceptors); this
//! module only carries their HTTP/2 requests, in place of tonic's own transport
//! (`tonic::transport`: hyper behind a tower buffer). That transport moves every call
//! through two extra tasks on the client (the buffer's worker and hyper's dispatcher) and
//! one more per stream on the server: on a 2-vCPU VM a call between two servers took
//! 135 µs (170 µs of CPU) with it and takes 82–88 µs (about 100 µs of CPU) on plain `h2`
//! (BENCHMARKS.md, thirty-sixth session). Here a call writes its frames from the caller's
//! task into the connection, and the reply is read by the task that waits for it.
//!
//! On the wire nothing changes: gRPC over HTTP/2 (`content-type: application/grpc`,
//! length-prefixed protobuf messages, the status in trailers), so any gRPC client or
//! server speaks to these. The two hot methods, `Mailbox.Deliver` and `Task.Call`, skip
//! tonic's codec (it copies every payload twice) and are framed by [`crate::wire`] on
//! [`Channel::start`]'s streams.

use bytes::Bytes;
use http_body::{Body, Frame};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tonic::codegen::Service;

/// HTTP/2 settings both sides use: large frames and windows, so large messages travel in
/// few frames and without waiting for window updates (HTTP/2's defaults are 16 KiB frames
/// and 64 KiB windows).
#[derive(Clone, Copy)]
pub(crate) struct Settings {
    /// The largest frame either side accepts.
    pub frame_bytes: u32,
    /// Each stream's receive window.
    pub stream_window: u32,
    /// The connection's receive window.
    pub connection_window: u32,
}

/// A request or response body as HTTP/2 received it, for tonic's codec: the data frames
/// (their flow-control capacity given back as they are read), then the trailers.
pub(crate) struct RecvBody {
    stream: h2::RecvStream,
    data_done: bool,
}

impl RecvBody {
    fn new(stream: h2::RecvStream) -> RecvBody {
        RecvBody {
            stream,
            data_done: false,
        }
    }

    /// The HTTP/2 stream, for a reader of its own ([`crate::wire::read_message`]).
    pub(crate) fn into_stream(self) -> h2::RecvStream {
        self.stream
    }
}

impl Body for RecvBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        if !self.data_done {
            match self.stream.poll_data(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(data))) => {
                    // Reading it frees its room in the window; an error here means the
                    // stream is gone, which the next poll reports.
                    let _ = self.stream.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(h2_status(&e)))),
                Poll::Ready(None) => self.data_done = true,
            }
        }
        match self.stream.poll_trailers(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(Some(trailers))) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Poll::Ready(Ok(None)) => Poll::Ready(None),
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(h2_status(&e)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.stream.is_end_stream()
    }
}

/// An HTTP/2 failure as the gRPC status a caller sees: a connection that broke, went away
/// or refused the stream is `UNAVAILABLE` (a caller that retries tries again), a cancelled
/// stream `CANCELLED`, anything else `INTERNAL`.
pub(crate) fn h2_status(e: &h2::Error) -> tonic::Status {
    if e.is_io() || e.is_go_away() || e.reason() == Some(h2::Reason::REFUSED_STREAM) {
        tonic::Status::unavailable(format!("the connection failed: {e}"))
    } else if e.reason() == Some(h2::Reason::CANCEL) {
        tonic::Status::cancelled(format!("the call was cancelled: {e}"))
    } else {
        tonic::Status::internal(format!("HTTP/2 error: {e}"))
    }
}

/// Sends `body`'s frames on `send` until it ends (its trailers end the stream when it has
/// any); a failing body resets the stream.
async fn send_body<B>(body: B, send: &mut h2::SendStream<Bytes>) -> Result<(), tonic::Status>
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    let mut body = std::pin::pin!(body);
    loop {
        let frame = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await;
        let sent = match frame {
            None => send.send_data(Bytes::new(), true),
            Some(Ok(frame)) => match frame.into_data() {
                // Buffered by h2 and written as the peer's window allows (the message is
                // in memory already: no copy).
                Ok(data) => {
                    if let Err(e) = send.send_data(data, false) {
                        return Err(h2_status(&e));
                    }
                    continue;
                }
                Err(frame) => match frame.into_trailers() {
                    Ok(trailers) => send.send_trailers(trailers),
                    Err(_) => continue,
                },
            },
            Some(Err(e)) => {
                send.send_reset(h2::Reason::INTERNAL_ERROR);
                return Err(tonic::Status::internal(format!(
                    "the message could not be encoded: {e}"
                )));
            }
        };
        return sent.map_err(|e| h2_status(&e));
    }
}

/// The client half: one HTTP/2 connection to a task's server, opened on the first call and
/// again after it broke; calls share it as streams. Cloning shares the connection.
#[derive(Clone)]
pub(crate) struct Channel {
    inner: Arc<ChannelInner>,
}

struct ChannelInner {
    address: String,
    authority: http::uri::Authority,
    connect_timeout: Duration,
    settings: Settings,
    /// The open connection's request handle and its number (a connection that ends
    /// clears only its own).
    open: Mutex<Option<(u64, h2::client::SendRequest<Bytes>)>>,
    /// Held while connecting: concurrent first calls open one connection.
    connecting: tokio::sync::Mutex<u64>,
}

impl ChannelInner {
    /// Forgets connection `id` (ended, or refusing new streams) unless a newer one
    /// replaced it already: the next call connects again.
    fn forget(&self, id: u64) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.as_ref().is_some_and(|(open_id, _)| *open_id == id) {
            *open = None;
        }
    }
}

impl Channel {
    /// A channel to `address` (`host:port`); nothing connects until the first call.
    pub(crate) fn new(
        address: &str,
        connect_timeout: Duration,
        settings: Settings,
    ) -> Result<Channel, String> {
        let authority = address
            .parse::<http::uri::Authority>()
            .map_err(|e| format!("{address:?} is not host:port: {e}"))?;
        Ok(Channel {
            inner: Arc::new(ChannelInner {
                address: address.to_string(),
                authority,
                connect_timeout,
                settings,
                open: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(0),
            }),
        })
    }

    fn open(&self) -> Option<(u64, h2::client::SendRequest<Bytes>)> {
        let open = self.inner.open.lock().unwrap_or_else(|e| e.into_inner());
        open.clone()
    }

    /// The open connection's number and request handle, connecting first when there is
    /// none.
    async fn connection(&self) -> Result<(u64, h2::client::SendRequest<Bytes>), tonic::Status> {
        if let Some(open) = self.open() {
            return Ok(open);
        }
        let mut count = self.inner.connecting.lock().await;
        if let Some(open) = self.open() {
            return Ok(open);
        }
        let inner = &self.inner;
        let unavailable = |what: String| tonic::Status::unavailable(what);
        let socket = tokio::time::timeout(
            inner.connect_timeout,
            tokio::net::TcpStream::connect(&inner.address),
        )
        .await
        .map_err(|_| unavailable(format!("no connection within {:?}", inner.connect_timeout)))?
        .map_err(|e| unavailable(format!("cannot connect: {e}")))?;
        socket
            .set_nodelay(true)
            .map_err(|e| unavailable(format!("cannot set TCP_NODELAY: {e}")))?;
        let (send, mut connection) = h2::client::Builder::new()
            .max_frame_size(inner.settings.frame_bytes)
            .initial_window_size(inner.settings.stream_window)
            .initial_connection_window_size(inner.settings.connection_window)
            .handshake::<_, Bytes>(socket)
            .await
            .map_err(|e| unavailable(format!("the HTTP/2 handshake failed: {e}")))?;
        *count += 1;
        let id = *count;
        *inner.open.lock().unwrap_or_else(|e| e.into_inner()) = Some((id, send.clone()));
        // The connection runs until it breaks, every handle to it is gone, or the server
        // stops answering pings; then the next call connects again.
        let weak = Arc::downgrade(&self.inner);
        let pings = connection.ping_pong();
        tokio::spawn(async move {
            tokio::select! {
                _ = &mut connection => {}
                // Dropping the connection fails the calls on it: `UNAVAILABLE`.
                () = keepalive(pings, keepalive_interval()) => {}
            }
            if let Some(inner) = weak.upgrade() {
                inner.forget(id);
            }
        });
        Ok((id, send))
    }

    /// Opens a stream for `request` (its path on this channel's server; `end`: no body
    /// follows): the response to wait for and the stream to send the body on.
    pub(crate) async fn start(
        &self,
        request: http::Request<()>,
        end: bool,
    ) -> Result<(h2::client::ResponseFuture, h2::SendStream<Bytes>), tonic::Status> {
        let (id, send) = self.connection().await?;
        let mut send = match send.ready().await {
            Ok(send) => send,
            Err(e) => {
                self.inner.forget(id);
                return Err(h2_status(&e));
            }
        };
        let (mut parts, ()) = request.into_parts();
        let mut uri = http::uri::Parts::default();
        uri.scheme = Some(http::uri::Scheme::HTTP);
        uri.authority = Some(self.inner.authority.clone());
        uri.path_and_query = parts.uri.path_and_query().cloned();
        parts.uri = http::Uri::from_parts(uri)
            .map_err(|e| tonic::Status::internal(format!("bad request URI: {e}")))?;
        send.send_request(http::Request::from_parts(parts, ()), end)
            .map_err(|e| h2_status(&e))
    }

    async fn request(
        self,
        request: http::Request<tonic::body::Body>,
    ) -> Result<http::Response<RecvBody>, tonic::Status> {
        let (parts, body) = request.into_parts();
        let end = body.is_end_stream();
        let (response, mut stream) = self
            .start(http::Request::from_parts(parts, ()), end)
            .await?;
        if !end {
            send_body(body, &mut stream).await?;
        }
        let response = response.await.map_err(|e| h2_status(&e))?;
        Ok(response.map(RecvBody::new))
    }
}

/// How often a client pings its server, and how long it waits for the answer
/// (`FERROFLOW_KEEPALIVE_SECONDS`, 10 by default): a server whose host vanished or whose
/// process hangs sends no TCP reset, and without pings its calls would wait for their
/// deadlines (a scheduled function's is 10 minutes). Whoever waits for an answer on a
/// [`crate::DirectClient`] asks its task whether it is alive as often.
///
/// ```
/// assert!(ferroflow_cluster::keepalive_interval() > std::time::Duration::ZERO);
/// ```
pub fn keepalive_interval() -> Duration {
    crate::seconds_from_env("FERROFLOW_KEEPALIVE_SECONDS", Duration::from_secs(10))
}

/// Pings the server every `interval`; returns when a ping goes unanswered for `interval`
/// (HTTP/2 PING frames, answered by the server's connection itself: a live process answers
/// at once, busy or not). Never returns without `pings` (taken already) or once the
/// connection fails (its own task notices that).
async fn keepalive(pings: Option<h2::PingPong>, interval: Duration) {
    let Some(mut pings) = pings else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(interval).await;
        match tokio::time::timeout(interval, pings.ping(h2::Ping::opaque())).await {
            Ok(Ok(_pong)) => {}
            Ok(Err(_)) => return std::future::pending().await,
            Err(_) => return,
        }
    }
}

impl Service<http::Request<tonic::body::Body>> for Channel {
    type Response = http::Response<RecvBody>;
    type Error = tonic::Status;
    type Future =
        Pin<Box<dyn Future<Output = Result<http::Response<RecvBody>, tonic::Status>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), tonic::Status>> {
        // Streams are opened (and the connection with them) when a call starts.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.clone().request(request))
    }
}

/// An answer being sent: a stream's task.
pub(crate) type Answer = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The server half: the gRPC services one task serves, chosen by the path prefix of their
/// methods (`/package.Service/`).
pub(crate) trait Route: Clone + Send + 'static {
    /// Answers `request` through `respond` ([`answer_with`] the service that serves its
    /// path, [`unimplemented`] when none does).
    fn answer(
        &self,
        request: http::Request<RecvBody>,
        respond: h2::server::SendResponse<Bytes>,
    ) -> Answer;
}

/// Answers a request with `service` (a tonic-generated server, with its interceptor).
pub(crate) fn answer_with<S, B>(
    mut service: S,
    request: http::Request<RecvBody>,
    mut respond: h2::server::SendResponse<Bytes>,
) -> Answer
where
    S: Service<
            http::Request<RecvBody>,
            Response = http::Response<B>,
            Error = std::convert::Infallible,
        > + Send
        + 'static,
    S::Future: Send,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: std::fmt::Display,
{
    Box::pin(async move {
        let response = match service.call(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        };
        let (parts, body) = response.into_parts();
        let end = body.is_end_stream();
        match respond.send_response(http::Response::from_parts(parts, ()), end) {
            // A failure here means the caller is gone: nobody to tell.
            Ok(mut stream) if !end => {
                let _ = send_body(body, &mut stream).await;
            }
            _ => {}
        }
    })
}

/// Answers a request no service serves: gRPC's `UNIMPLEMENTED`, in the headers.
pub(crate) fn unimplemented(path: &str, mut respond: h2::server::SendResponse<Bytes>) -> Answer {
    let status = tonic::Status::unimplemented(format!("this task serves no service for {path}"));
    let mut response = http::Response::new(());
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    if status.add_header(response.headers_mut()).is_ok() {
        let _ = respond.send_response(response, true);
    } else {
        respond.send_reset(h2::Reason::INTERNAL_ERROR);
    }
    Box::pin(std::future::ready(()))
}

/// Serves `route` on `listener` until `stop` fires; then stops accepting, lets the calls in
/// flight answer and returns.
pub(crate) async fn serve<R: Route>(
    listener: tokio::net::TcpListener,
    route: R,
    settings: Settings,
    stop: tokio::sync::oneshot::Receiver<()>,
) {
    let (stopping, stopped) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let mut stop = stop;
    loop {
        tokio::select! {
            _ = &mut stop => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => {
                    connections.spawn(serve_connection(socket, route.clone(), settings, stopped.clone()));
                }
                // Out of file descriptors and the like: pause instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
        }
    }
    let _ = stopping.send(true);
    while connections.join_next().await.is_some() {}
}

/// Serves one connection's streams, each on a task of its own, until the peer closes it or
/// the server stops (then in-flight streams finish first: HTTP/2's graceful shutdown).
async fn serve_connection<R: Route>(
    socket: tokio::net::TcpStream,
    route: R,
    settings: Settings,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let _ = socket.set_nodelay(true);
    let Ok(mut connection) = h2::server::Builder::new()
        .max_frame_size(settings.frame_bytes)
        .initial_window_size(settings.stream_window)
        .initial_connection_window_size(settings.connection_window)
        .handshake::<_, Bytes>(socket)
        .await
    else {
        return;
    };
    let mut stopping = false;
    loop {
        let accepted = tokio::select! {
            accepted = connection.accept() => accepted,
            changed = stopped.changed(), if !stopping => {
                stopping = true;
                if changed.is_ok() {
                    connection.graceful_shutdown();
                }
                continue;
            }
        };
        match accepted {
            Some(Ok((request, respond))) => {
                tokio::spawn(route.answer(request.map(RecvBody::new), respond));
            }
            Some(Err(_)) | None => return,
        }
    }
}
