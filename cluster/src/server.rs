//! The gRPC server every task runs on its cluster address, and the client side of it.
//!
//! One [`TaskServer`] per process hosts the task's services on its own tokio runtime: the
//! [`Mailbox`] the collectives deliver their chunks to, and the methods upper crates
//! register ([`TaskServer::handle`]: the parameter servers' variables, the workers'
//! functions), each a name and a handler of bytes; [`Peer`]s are clients of other tasks'
//! servers ([`Peer::deliver`], [`Peer::call`]). Every call carries the cluster token when one is set
//! (`FERROFLOW_CLUSTER_TOKEN`): a server with a token refuses calls without it. Messages up
//! to [`MAX_MESSAGE_BYTES`] pass (gRPC's default is 4 MiB); every call has a deadline.

use bytes::Bytes;
use ferroflow_tensor::{Error, Result};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::transport::{Answer, Channel, RecvBody, Route, Settings};
use crate::wire;

/// The generated protobuf and gRPC code (`proto/ferroflow_cluster.proto`).
#[allow(missing_docs, clippy::all)]
pub(crate) mod pb {
    tonic::include_proto!("ferroflow.cluster");
}

/// The largest message a task sends or accepts (1 GiB).
pub const MAX_MESSAGE_BYTES: usize = 1 << 30;

/// HTTP/2 settings of both sides: frames up to 1 MiB, windows of 8 MiB per stream and
/// 16 MiB per connection, so large messages travel in few frames without waiting for
/// window updates (HTTP/2's defaults: 16 KiB frames, 64 KiB windows).
const SETTINGS: Settings = Settings {
    frame_bytes: 1 << 20,
    stream_window: 8 << 20,
    connection_window: 16 << 20,
};

/// Worker threads of a task's runtime (its server's and its peers' I/O; handlers that
/// block run on the runtime's blocking threads). One: each hop of a call between threads
/// of a runtime is a wake-up, and with two workers tokio wakes the idle one for every task
/// it schedules. Measured on a 2-vCPU VM over tonic's transport, a call between two
/// servers in one process: 174 → 145 µs with one worker, CPU per call 207 → 159 µs.
const RUNTIME_WORKERS: usize = 1;

/// The metadata key the cluster token travels under (gRPC metadata of every call).
pub const TOKEN_KEY: &str = "x-ferroflow-cluster-token";

/// A duration in seconds from the environment variable `name` (`"2.5"`), else `default`:
/// unset, not a number, not positive, or too long for a `Duration`.
///
/// ```
/// use std::time::Duration;
/// std::env::set_var("FERROFLOW_DOC_SECONDS", "1e40");
/// let d = ferroflow_cluster::seconds_from_env("FERROFLOW_DOC_SECONDS", Duration::from_secs(3));
/// assert_eq!(d, Duration::from_secs(3));
/// ```
pub fn seconds_from_env(name: &str, default: Duration) -> Duration {
    std::env::var(name)
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .unwrap_or(default)
}

/// The cluster's shared token from `FERROFLOW_CLUSTER_TOKEN` (unset or empty: none).
pub fn token_from_env() -> Option<String> {
    std::env::var("FERROFLOW_CLUSTER_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
}

/// Messages delivered to this task, by key, until taken.
#[derive(Default)]
pub struct Mailbox {
    slots: Mutex<HashMap<String, Bytes>>,
    arrived: Condvar,
}

impl Mailbox {
    fn put(&self, key: String, payload: Bytes) {
        self.slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, payload);
        self.arrived.notify_all();
    }

    /// Takes the message delivered under `key`, waiting up to `timeout` for it to arrive;
    /// `None` when it has not.
    pub fn take(&self, key: &str, timeout: Duration) -> Option<Bytes> {
        let end = Instant::now() + timeout;
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(p) = slots.remove(key) {
                return Some(p);
            }
            let left = end.checked_duration_since(Instant::now())?;
            slots = self
                .arrived
                .wait_timeout(slots, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

struct MailboxService {
    mailbox: Arc<Mailbox>,
}

#[tonic::async_trait]
impl pb::mailbox_server::Mailbox for MailboxService {
    async fn deliver(
        &self,
        request: tonic::Request<pb::DeliverRequest>,
    ) -> std::result::Result<tonic::Response<pb::DeliverReply>, tonic::Status> {
        let m = request.into_inner();
        self.mailbox.put(m.key, m.payload);
        Ok(tonic::Response::new(pb::DeliverReply {}))
    }
}

/// A method registered on a task's server: the request's payload in, the reply's out; an
/// error is sent back as the caller's [`Error::Remote`]. Handlers run on a blocking thread
/// of the server's runtime, several at a time.
pub type Handler = Arc<dyn Fn(Bytes) -> Result<Bytes> + Send + Sync>;

/// A method whose handler answers later, from another thread: it gets the request and a
/// [`Reply`] to send the answer through, and must return at once (it runs on the server's
/// runtime). For a service whose work runs on a thread of its own: the answer goes straight
/// back to the caller, with no blocking thread in between.
pub type DeferredHandler = Arc<dyn Fn(Bytes, Reply) + Send + Sync>;

/// Where a [`DeferredHandler`] sends its answer (an error is sent back as the caller's
/// [`Error::Remote`]); dropped unanswered, the caller gets an error saying so.
pub struct Reply(tokio::sync::oneshot::Sender<Result<Bytes>>);

impl Reply {
    /// Sends the answer.
    pub fn send(self, answer: Result<Bytes>) {
        let _ = self.0.send(answer);
    }
}

#[derive(Clone)]
enum Method {
    Blocking(Handler),
    Deferred(DeferredHandler),
}

type Handlers = Arc<std::sync::RwLock<HashMap<String, Method>>>;

struct TaskService {
    handlers: Handlers,
}

#[tonic::async_trait]
impl pb::task_server::Task for TaskService {
    async fn call(
        &self,
        request: tonic::Request<pb::CallRequest>,
    ) -> std::result::Result<tonic::Response<pb::CallReply>, tonic::Status> {
        let m = request.into_inner();
        run_method(&self.handlers, m.method, m.payload)
            .await
            .map(|payload| tonic::Response::new(pb::CallReply { payload }))
    }
}

/// Runs the handler registered for `method` on `payload`: its reply, or its error (or the
/// lack of such a method) as the status the caller gets.
async fn run_method(
    handlers: &Handlers,
    method: String,
    payload: Bytes,
) -> std::result::Result<Bytes, tonic::Status> {
    let handler = handlers
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&method)
        .cloned();
    let Some(handler) = handler else {
        return Err(tonic::Status::unimplemented(format!(
            "this task serves no method {method:?} (is it the right kind of task: ps, worker?)"
        )));
    };
    let answer = match handler {
        Method::Blocking(handler) => tokio::task::spawn_blocking(move || handler(payload))
            .await
            .map_err(|e| format!("the handler of {method:?} panicked: {e}")),
        Method::Deferred(handler) => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            handler(payload, Reply(tx));
            rx.await
                .map_err(|_| format!("the handler of {method:?} dropped its reply"))
        }
    };
    match answer {
        Ok(Ok(reply)) => Ok(reply),
        Ok(Err(e)) => Err(tonic::Status::aborted(e.to_string())),
        Err(msg) => Err(tonic::Status::aborted(msg)),
    }
}

/// The services of a task's server, as its transport routes calls to them: `Deliver` and
/// `Call` with uncompressed messages straight from the frames ([`crate::wire`]), anything
/// else through tonic's generated services.
#[derive(Clone)]
struct Services {
    mailbox: Arc<Mailbox>,
    handlers: Handlers,
    token: TokenCheck,
    mailbox_service: tonic::service::interceptor::InterceptedService<
        pb::mailbox_server::MailboxServer<MailboxService>,
        TokenCheck,
    >,
    task_service: tonic::service::interceptor::InterceptedService<
        pb::task_server::TaskServer<TaskService>,
        TokenCheck,
    >,
}

impl Route for Services {
    fn answer(
        &self,
        request: http::Request<RecvBody>,
        respond: h2::server::SendResponse<Bytes>,
    ) -> Answer {
        let path = request.uri().path();
        let compressed = request
            .headers()
            .get("grpc-encoding")
            .is_some_and(|e| e.as_bytes() != b"identity");
        if !compressed && (path == wire::DELIVER_PATH || path == wire::CALL_PATH) {
            return self.answer_plain(request, respond);
        }
        let service_is = |name: &str| {
            path.strip_prefix('/')
                .and_then(|p| p.strip_prefix(name))
                .is_some_and(|p| p.starts_with('/'))
        };
        if service_is(pb::task_server::SERVICE_NAME) {
            crate::transport::answer_with(self.task_service.clone(), request, respond)
        } else if service_is(pb::mailbox_server::SERVICE_NAME) {
            crate::transport::answer_with(self.mailbox_service.clone(), request, respond)
        } else {
            crate::transport::unimplemented(path, respond)
        }
    }
}

impl Services {
    /// The services of a server with `mailbox` and the methods in `handlers`, refusing calls
    /// without `token`.
    fn new(mailbox: Arc<Mailbox>, handlers: Handlers, token: TokenCheck) -> Services {
        Services {
            mailbox_service: tonic::service::interceptor::InterceptedService::new(
                pb::mailbox_server::MailboxServer::new(MailboxService {
                    mailbox: mailbox.clone(),
                })
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
                token.clone(),
            ),
            task_service: tonic::service::interceptor::InterceptedService::new(
                pb::task_server::TaskServer::new(TaskService {
                    handlers: handlers.clone(),
                })
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
                token.clone(),
            ),
            mailbox,
            handlers,
            token,
        }
    }

    /// Answers a `Deliver` or `Call` whose message is not compressed, reading the payload
    /// out of the frames it arrived in and sending the reply's from its own buffer.
    fn answer_plain(
        &self,
        request: http::Request<RecvBody>,
        respond: h2::server::SendResponse<Bytes>,
    ) -> Answer {
        let (mailbox, handlers) = (self.mailbox.clone(), self.handlers.clone());
        let checked = self.token.check(request.headers());
        Box::pin(async move {
            let deliver = request.uri().path() == wire::DELIVER_PATH;
            let reply = async {
                checked?;
                let mut body = request.into_body().into_stream();
                let message = wire::read_message(&mut body, MAX_MESSAGE_BYTES)
                    .await?
                    .ok_or_else(wire::no_message)?;
                let [name, payload] = wire::fields(message)?;
                let payload = payload.unwrap_or_default();
                if deliver {
                    mailbox.put(wire::text(name, "the key")?, payload);
                    Ok(wire::message(None, Bytes::new()))
                } else {
                    let method = wire::text(name, "the method")?;
                    let reply = run_method(&handlers, method, payload).await?;
                    wire::check_size(&reply, MAX_MESSAGE_BYTES)?;
                    Ok(wire::message(None, reply))
                }
            }
            .await;
            wire::respond(respond, reply);
        })
    }
}

/// Checks the cluster token on every call a server receives: a tonic interceptor for any
/// service of a task (the task server's own, the profiler server's), refusing a call whose
/// [`TOKEN_KEY`] metadata differs with `UNAUTHENTICATED`; `None` lets every call through.
///
/// ```
/// let check = ferroflow_cluster::TokenCheck::new(Some("secret"));
/// let _ = check; // tonic::service::interceptor::InterceptedService::new(service, check)
/// ```
#[derive(Clone)]
pub struct TokenCheck(Option<Arc<str>>);

impl TokenCheck {
    /// Checks for `token` (none: every call passes).
    pub fn new(token: Option<&str>) -> TokenCheck {
        TokenCheck(token.map(Arc::from))
    }
}

impl TokenCheck {
    /// Whether a call with these headers carries the token.
    fn check(&self, headers: &http::HeaderMap) -> std::result::Result<(), tonic::Status> {
        let Some(want) = &self.0 else {
            return Ok(());
        };
        match headers.get(TOKEN_KEY) {
            Some(got) if got.as_bytes() == want.as_bytes() => Ok(()),
            _ => Err(tonic::Status::unauthenticated(
                "this task requires the cluster token (FERROFLOW_CLUSTER_TOKEN)",
            )),
        }
    }
}

impl tonic::service::Interceptor for TokenCheck {
    fn call(
        &mut self,
        request: tonic::Request<()>,
    ) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        self.check(request.metadata().as_ref())?;
        Ok(request)
    }
}

/// The task's gRPC server, serving until dropped.
///
/// ```
/// use ferroflow_cluster::TaskServer;
/// use std::time::Duration;
/// let a = TaskServer::start("127.0.0.1:0", None)?;
/// let b = TaskServer::start("127.0.0.1:0", None)?;
/// let to_b = a.peer("/job:worker/task:1", &b.local_addr().to_string(), Duration::from_secs(5))?;
/// to_b.deliver("hello", b"payload".to_vec())?;
/// assert_eq!(b.mailbox().take("hello", Duration::from_secs(5)).as_deref(), Some(&b"payload"[..]));
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct TaskServer {
    runtime: Arc<tokio::runtime::Runtime>,
    addr: SocketAddr,
    mailbox: Arc<Mailbox>,
    handlers: Handlers,
    token: Option<Arc<str>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// Bound until [`serve`](TaskServer::serve), then serving (`None` once dropped).
    listening: Mutex<Option<Listening>>,
}

/// Where a [`TaskServer`]'s socket is in its life.
enum Listening {
    /// Bound, answering nothing yet: the socket and the stop signal the serving loop takes.
    Bound(tokio::net::TcpListener, tokio::sync::oneshot::Receiver<()>),
    /// Answering calls: the serving loop.
    Serving(tokio::task::JoinHandle<()>),
}

impl TaskServer {
    /// Binds `address` (`host:port`; port 0 lets the OS pick one) and serves on it, on a
    /// runtime of its own. `token`: the cluster token calls must carry (and that this task's
    /// [`Peer`]s send).
    pub fn start(address: &str, token: Option<&str>) -> Result<TaskServer> {
        let server = TaskServer::bind(address, token)?;
        server.serve();
        Ok(server)
    }

    /// Binds `address` as [`start`](TaskServer::start) does, without answering calls yet:
    /// those that arrive wait (connected) until [`serve`](TaskServer::serve). A task whose
    /// methods need its own address registers them in between, so no caller ever finds it
    /// up without them (a task restarted on its address is called at once by the peers that
    /// were retrying it).
    ///
    /// ```
    /// use ferroflow_cluster::TaskServer;
    /// use std::time::Duration;
    /// let server = TaskServer::bind("127.0.0.1:0", None)?;
    /// let address = server.local_addr().to_string();
    /// server.handle("whoami", move |_| Ok(address.clone().into()));
    /// server.serve();
    /// let client = TaskServer::start("127.0.0.1:0", None)?;
    /// let peer = client.peer("/job:worker/task:0", &server.local_addr().to_string(), Duration::from_secs(5))?;
    /// assert_eq!(peer.call("whoami", Default::default())?, server.local_addr().to_string());
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn bind(address: &str, token: Option<&str>) -> Result<TaskServer> {
        let unavailable = |msg: String| Error::Unavailable {
            op: "start the task server".into(),
            peer: address.to_string(),
            msg,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_WORKERS)
            .thread_name("ferroflow-cluster")
            .enable_all()
            .build()
            .map_err(|e| unavailable(format!("cannot start the runtime: {e}")))?;
        // The socket a launcher handed over for this address, else one bound here.
        let listener = crate::bind_listener(address)
            .and_then(|l| {
                let _entered = runtime.enter();
                tokio::net::TcpListener::from_std(l)
            })
            .map_err(|e| unavailable(format!("cannot listen: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| unavailable(e.to_string()))?;
        let token: Option<Arc<str>> = token.map(Arc::from);
        let mailbox = Arc::new(Mailbox::default());
        let handlers: Handlers = Arc::default();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        Ok(TaskServer {
            runtime: Arc::new(runtime),
            addr,
            mailbox,
            handlers,
            token,
            stop: Some(stop),
            listening: Mutex::new(Some(Listening::Bound(listener, stopped))),
        })
    }

    /// Starts answering calls (those waiting since [`bind`](TaskServer::bind) first), with
    /// the methods registered by then and any registered later. Serving twice is serving.
    pub fn serve(&self) {
        let mut listening = self.listening.lock().unwrap_or_else(|e| e.into_inner());
        *listening = match listening.take() {
            Some(Listening::Bound(listener, stopped)) => Some(Listening::Serving(
                self.runtime.spawn(crate::transport::serve(
                    listener,
                    Services::new(
                        self.mailbox.clone(),
                        self.handlers.clone(),
                        TokenCheck(self.token.clone()),
                    ),
                    SETTINGS,
                    stopped,
                )),
            )),
            serving => serving,
        };
    }

    /// The address the server listens on (with the port the OS picked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The messages delivered to this task.
    pub fn mailbox(&self) -> &Mailbox {
        &self.mailbox
    }

    /// Serves `method` with `handler` from now on (replacing an earlier handler of that
    /// name): other tasks reach it with [`Peer::call`].
    pub fn handle(
        &self,
        method: &str,
        handler: impl Fn(Bytes) -> Result<Bytes> + Send + Sync + 'static,
    ) {
        self.handlers
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(method.to_string(), Method::Blocking(Arc::new(handler)));
    }

    /// Serves `method` with a [`DeferredHandler`]: `handler` gets each request with the
    /// [`Reply`] to answer it through, later, from any thread.
    ///
    /// ```
    /// use ferroflow_cluster::TaskServer;
    /// use std::time::Duration;
    /// let server = TaskServer::start("127.0.0.1:0", None)?;
    /// server.handle_deferred("echo", |payload, reply| {
    ///     std::thread::spawn(move || reply.send(Ok(payload)));
    /// });
    /// let client = TaskServer::start("127.0.0.1:0", None)?;
    /// let peer = client.peer("/job:worker/task:0", &server.local_addr().to_string(), Duration::from_secs(5))?;
    /// assert_eq!(&peer.call("echo", b"hi".to_vec().into())?[..], b"hi");
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn handle_deferred(
        &self,
        method: &str,
        handler: impl Fn(Bytes, Reply) + Send + Sync + 'static,
    ) {
        self.handlers
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(method.to_string(), Method::Deferred(Arc::new(handler)));
    }

    /// A client of the task `name` (for errors: `/job:worker/task:1`) at `address`; every
    /// call gives up after `timeout`. Connects on first use.
    pub fn peer(&self, name: &str, address: &str, timeout: Duration) -> Result<Peer> {
        connect(&self.runtime, self.token.clone(), name, address, timeout)
    }

    /// A listener for direct connections ([`crate::DirectListener`]) on this server's IP
    /// address, at a port the OS picks; clients must present this server's cluster token.
    pub fn direct_listener(&self) -> Result<crate::DirectListener> {
        crate::DirectListener::bind(self.addr.ip(), self.token.clone())
    }

    /// A direct connection ([`crate::DirectClient`]) to the task `name` at `address`
    /// (`host:port`, the port its [`crate::DirectListener`] has), connected and greeted
    /// with this server's cluster token within `timeout`.
    pub fn connect_direct(
        &self,
        name: &str,
        address: &str,
        timeout: Duration,
    ) -> Result<crate::DirectClient> {
        crate::DirectClient::connect(name, address, self.token.as_deref(), timeout)
    }
}

/// Clients of task servers for a process that serves none (a data-service consumer, a
/// command-line tool): the runtime its [`Peer`]s run on and the cluster token they send.
///
/// ```
/// use ferroflow_cluster::{Connector, TaskServer};
/// use std::time::Duration;
/// let server = TaskServer::start("127.0.0.1:0", None)?;
/// server.handle("echo", |payload| Ok(payload));
/// let connector = Connector::new(None)?;
/// let peer = connector.peer("/job:worker/task:0", &server.local_addr().to_string(), Duration::from_secs(5))?;
/// assert_eq!(&peer.call("echo", b"hi".to_vec().into())?[..], b"hi");
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct Connector {
    runtime: Arc<tokio::runtime::Runtime>,
    token: Option<Arc<str>>,
}

impl Connector {
    /// A connector whose peers send `token` (the cluster token; `None`: no token).
    pub fn new(token: Option<&str>) -> Result<Connector> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_WORKERS)
            .thread_name("ferroflow-client")
            .enable_all()
            .build()
            .map_err(|e| Error::Unavailable {
                op: "start the client runtime".into(),
                peer: String::new(),
                msg: e.to_string(),
            })?;
        Ok(Connector {
            runtime: Arc::new(runtime),
            token: token.map(Arc::from),
        })
    }

    /// A client of the task `name` at `address`, as [`TaskServer::peer`].
    pub fn peer(&self, name: &str, address: &str, timeout: Duration) -> Result<Peer> {
        connect(&self.runtime, self.token.clone(), name, address, timeout)
    }
}

/// A [`Peer`] of the task `name` at `address`, its calls run on `runtime`.
fn connect(
    runtime: &Arc<tokio::runtime::Runtime>,
    token: Option<Arc<str>>,
    name: &str,
    address: &str,
    timeout: Duration,
) -> Result<Peer> {
    let channel = Channel::new(address, timeout, SETTINGS).map_err(|msg| Error::Unavailable {
        op: "connect".into(),
        peer: format!("{name} ({address})"),
        msg,
    })?;
    Ok(Peer {
        runtime: runtime.clone(),
        channel,
        name: format!("{name} ({address})"),
        token,
        timeout,
    })
}

impl Drop for TaskServer {
    /// Stops accepting calls and lets the ones in flight answer (up to 2 s): a task that
    /// leaves right after taking its last message must not cut off the reply its sender
    /// waits for.
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let listening = self.listening.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(Listening::Serving(serving)) = listening.take() {
            let _ = self
                .runtime
                .block_on(async { tokio::time::timeout(Duration::from_secs(2), serving).await });
        }
    }
}

/// A client of another task's server.
pub struct Peer {
    runtime: Arc<tokio::runtime::Runtime>,
    channel: Channel,
    name: String,
    token: Option<Arc<str>>,
    timeout: Duration,
}

impl Peer {
    /// The peer as errors name it: `/job:worker/task:1 (host:port)`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Delivers `payload` to the peer's mailbox under `key`. A peer that is not listening
    /// (yet: tasks start in any order) is tried again until the timeout; an error names the
    /// peer when it stays unreachable, refuses the token, or does not answer in time.
    pub fn deliver(&self, key: &str, payload: Vec<u8>) -> Result<()> {
        self.send(key, Bytes::from(payload)).wait()
    }

    /// [`Peer::deliver`] without waiting: the delivery goes on in the background, alongside
    /// others (each message under its own key, so their order does not matter), and
    /// [`Delivery::wait`] gives its outcome.
    pub fn send(&self, key: &str, payload: Bytes) -> Delivery {
        let channel = self.channel.clone();
        let key2 = key.to_string();
        self.spawn(self.attempts(format!("deliver {key}"), true, move |token| {
            let frames = wire::check_size(&payload, MAX_MESSAGE_BYTES)
                .map(|()| wire::message(Some(&key2), payload.clone()));
            let channel = channel.clone();
            async move {
                let metadata = token.map(|t| (TOKEN_KEY, t));
                wire::unary(
                    &channel,
                    wire::DELIVER_PATH,
                    metadata,
                    frames?,
                    MAX_MESSAGE_BYTES,
                )
                .await
                .map(|_| ())
            }
        }))
    }

    /// Calls `method` on the peer (a handler it registered with [`TaskServer::handle`]) and
    /// waits for the reply. A peer that is not listening (yet) is tried again until the
    /// timeout. Errors: [`Error::Unavailable`] naming the peer when it stays unreachable,
    /// refuses the token or does not answer in time; [`Error::Remote`] with the peer's
    /// error when its handler failed (or it serves no such method).
    pub fn call(&self, method: &str, payload: Bytes) -> Result<Bytes> {
        // Polled on this thread (not spawned and joined): one wake-up less per call.
        match self.call_future(method, payload, true) {
            Ok(call) => self.runtime.block_on(call),
            Err(e) => Err(e),
        }
    }

    /// [`Peer::call`] without waiting for the reply; `retry`: whether an unreachable peer is
    /// tried again until the timeout (false: the first failure to connect is the error, as a
    /// caller that watches for dead tasks wants).
    pub fn start_call(&self, method: &str, payload: Bytes, retry: bool) -> PendingCall {
        self.spawn(self.call_future(method, payload, retry))
    }

    /// [`Peer::start_call`] whose outcome goes through `then` the moment it arrives, on
    /// the runtime's thread (`then` must not block), before [`Pending::wait`] returns what
    /// `then` made of it: a reply a third thread waits for reaches it without waking the
    /// caller's thread in between.
    ///
    /// ```
    /// use ferroflow_cluster::TaskServer;
    /// use std::time::Duration;
    /// let server = TaskServer::start("127.0.0.1:0", None)?;
    /// server.handle("echo", Ok);
    /// let client = TaskServer::start("127.0.0.1:0", None)?;
    /// let peer = client.peer("/job:worker/task:0", &server.local_addr().to_string(), Duration::from_secs(5))?;
    /// let (tx, rx) = std::sync::mpsc::channel();
    /// let call = peer.start_call_then("echo", b"hi".to_vec().into(), true, move |reply| {
    ///     let _ = tx.send(reply.clone());
    ///     reply.map(|b| b.len())
    /// });
    /// assert_eq!(&rx.recv().unwrap()?[..], b"hi");
    /// assert_eq!(call.wait()?, 2);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn start_call_then<T: Send + 'static>(
        &self,
        method: &str,
        payload: Bytes,
        retry: bool,
        then: impl FnOnce(Result<Bytes>) -> Result<T> + Send + 'static,
    ) -> Pending<T> {
        self.spawn(
            self.call_future(method, payload, retry)
                .map(|call| async move { then(call.await) }),
        )
    }

    /// The call of `method` as a future, for [`Peer::call`] and [`Peer::start_call`].
    fn call_future(
        &self,
        method: &str,
        payload: Bytes,
        retry: bool,
    ) -> Result<impl std::future::Future<Output = Result<Bytes>> + Send + 'static> {
        let channel = self.channel.clone();
        let method2 = method.to_string();
        self.attempts(method.to_string(), retry, move |token| {
            let frames = wire::check_size(&payload, MAX_MESSAGE_BYTES)
                .map(|()| wire::message(Some(&method2), payload.clone()));
            let channel = channel.clone();
            async move {
                let metadata = token.map(|t| (TOKEN_KEY, t));
                let reply = wire::unary(
                    &channel,
                    wire::CALL_PATH,
                    metadata,
                    frames?,
                    MAX_MESSAGE_BYTES,
                )
                .await?;
                let [payload, _] = wire::fields(reply)?;
                Ok(payload.unwrap_or_default())
            }
        })
    }

    /// `attempt` as a future (run again after an `Unavailable` answer, with backoff, while
    /// `retry` and the timeout allow) whose failure is an error naming `op` and the peer;
    /// an error at once when the cluster token cannot travel.
    fn attempts<T, F, Fut>(
        &self,
        op: String,
        retry: bool,
        attempt: F,
    ) -> Result<impl std::future::Future<Output = Result<T>> + Send + 'static>
    where
        T: Send + 'static,
        F: Fn(Option<http::HeaderValue>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = std::result::Result<T, tonic::Status>> + Send,
    {
        let name = self.name.clone();
        let token = match &self.token {
            Some(t) => match http::HeaderValue::from_str(t) {
                Ok(v) => Some(v),
                Err(_) => {
                    return Err(Error::Unavailable {
                        op,
                        peer: name,
                        msg: "the cluster token is not valid ASCII".into(),
                    });
                }
            },
            None => None,
        };
        let timeout = self.timeout;
        Ok(async move {
            let end = Instant::now() + timeout;
            let mut wait = Duration::from_millis(10);
            loop {
                let left = end.saturating_duration_since(Instant::now());
                let answer = tokio::time::timeout(left, attempt(token.clone()))
                    .await
                    .unwrap_or_else(|_| {
                        Err(tonic::Status::deadline_exceeded(format!(
                            "no answer in {timeout:?}"
                        )))
                    });
                match answer {
                    Ok(v) => return Ok(v),
                    Err(s)
                        if retry
                            && s.code() == tonic::Code::Unavailable
                            && Instant::now() + wait < end =>
                    {
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(Duration::from_millis(500));
                    }
                    Err(s) => return Err(status_error(&op, &name, &s)),
                }
            }
        })
    }

    /// Runs `call` in the background on the runtime.
    fn spawn<T: Send + 'static>(
        &self,
        call: Result<impl std::future::Future<Output = Result<T>> + Send + 'static>,
    ) -> Pending<T> {
        let outcome = match call {
            Ok(call) => PendingOutcome::Running(self.runtime.spawn(call)),
            Err(e) => PendingOutcome::Failed(e),
        };
        Pending {
            runtime: self.runtime.clone(),
            outcome,
        }
    }
}

/// A gRPC failure as the error a caller sees: the peer's own error when it answered with
/// one, else [`Error::Unavailable`].
fn status_error(op: &str, peer: &str, s: &tonic::Status) -> Error {
    use tonic::Code;
    match s.code() {
        Code::Aborted | Code::Unimplemented => Error::Remote {
            op: op.to_string(),
            peer: peer.to_string(),
            msg: s.message().to_string(),
        },
        _ => Error::Unavailable {
            op: op.to_string(),
            peer: peer.to_string(),
            msg: describe(s),
        },
    }
}

/// A call or delivery going on in the background ([`Peer::send`], [`Peer::start_call`]).
pub struct Pending<T> {
    runtime: Arc<tokio::runtime::Runtime>,
    outcome: PendingOutcome<T>,
}

/// A delivery [`Peer::send`] started.
pub type Delivery = Pending<()>;

/// A call [`Peer::start_call`] started: its reply's payload.
pub type PendingCall = Pending<Bytes>;

enum PendingOutcome<T> {
    Running(tokio::task::JoinHandle<Result<T>>),
    Failed(Error),
}

impl<T> Pending<T> {
    /// Whether the peer has answered (or the call failed): [`Pending::wait`] would not
    /// block.
    pub fn is_finished(&self) -> bool {
        match &self.outcome {
            PendingOutcome::Failed(_) => true,
            PendingOutcome::Running(task) => task.is_finished(),
        }
    }

    /// Waits for the peer's answer: a delivery's `Ok` once the message is in its mailbox, a
    /// call's reply; else the error naming the peer.
    pub fn wait(self) -> Result<T> {
        match self.outcome {
            PendingOutcome::Failed(e) => Err(e),
            PendingOutcome::Running(task) => self.runtime.block_on(task).unwrap_or_else(|e| {
                Err(Error::Unavailable {
                    op: "call".into(),
                    peer: String::new(),
                    msg: format!("the background task ended abnormally: {e}"),
                })
            }),
        }
    }
}

/// A gRPC status as a sentence.
fn describe(status: &tonic::Status) -> String {
    use tonic::Code;
    let what = match status.code() {
        Code::Unavailable => "unreachable (is the task running?)",
        Code::DeadlineExceeded | Code::Cancelled => "no answer within the timeout",
        Code::Unauthenticated => "refused the call: the cluster tokens differ",
        _ => "the call failed",
    };
    format!("{what}: {}", status.message())
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(10);

    #[test]
    fn messages_reach_the_peers_mailbox_large_ones_too() {
        let a = TaskServer::start("127.0.0.1:0", None).unwrap();
        let b = TaskServer::start("127.0.0.1:0", None).unwrap();
        let to_b = a.peer("b", &b.local_addr().to_string(), T).unwrap();
        let big: Vec<u8> = (0..(64usize << 20)).map(|i| (i % 251) as u8).collect();
        to_b.deliver("big", big.clone()).unwrap();
        to_b.deliver("small", vec![1]).unwrap();
        assert_eq!(b.mailbox().take("small", T).as_deref(), Some(&[1u8][..]));
        assert_eq!(b.mailbox().take("big", T).as_deref(), Some(&big[..]));
        // Taken once: a second take waits and gives up.
        assert_eq!(b.mailbox().take("small", Duration::from_millis(50)), None);
    }

    /// The hand-framed `Deliver` and `Call` ([`crate::wire`]) and tonic's generated code
    /// understand each other both ways: tonic's clients against a task server, and a peer
    /// against tonic's generated services alone (with the token, an empty payload, a
    /// payload spanning several HTTP/2 frames, and a handler's error).
    #[test]
    fn hand_framed_calls_and_tonic_s_generated_code_speak_the_same_grpc() {
        let server = TaskServer::start("127.0.0.1:0", Some("tok")).unwrap();
        server.handle("twice", |p: Bytes| Ok([&p[..], &p[..]].concat().into()));
        server.handle("fail", |_| Err(Error::invalid("fail", "as asked")));
        let big = Bytes::from(
            (0..(3usize << 20))
                .map(|i| (i % 253) as u8)
                .collect::<Vec<u8>>(),
        );
        // tonic's clients, through this crate's channel, against the server.
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let channel = Channel::new(&server.local_addr().to_string(), T, SETTINGS).unwrap();
            fn token<M>(mut r: tonic::Request<M>) -> tonic::Request<M> {
                r.metadata_mut().insert(TOKEN_KEY, "tok".parse().unwrap());
                r
            }
            let mut mailbox = pb::mailbox_client::MailboxClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES);
            for (key, payload) in [("big", big.clone()), ("empty", Bytes::new())] {
                let request = tonic::Request::new(pb::DeliverRequest {
                    key: key.into(),
                    payload,
                });
                mailbox.deliver(token(request)).await.unwrap();
            }
            let refused = mailbox
                .deliver(tonic::Request::new(pb::DeliverRequest::default()))
                .await
                .unwrap_err();
            assert_eq!(refused.code(), tonic::Code::Unauthenticated);
            let mut tasks = pb::task_client::TaskClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES);
            let request = |method: &str, payload: Bytes| {
                token(tonic::Request::new(pb::CallRequest {
                    method: method.into(),
                    payload,
                }))
            };
            let reply = tasks.call(request("twice", big.clone())).await.unwrap();
            assert_eq!(reply.into_inner().payload, [&big[..], &big[..]].concat());
            let failed = tasks.call(request("fail", Bytes::new())).await.unwrap_err();
            assert_eq!(failed.code(), tonic::Code::Aborted);
            assert!(failed.message().contains("as asked"), "{failed:?}");
        });
        assert_eq!(server.mailbox().take("big", T), Some(big.clone()));
        assert_eq!(server.mailbox().take("empty", T), Some(Bytes::new()));

        // A peer against tonic's generated services alone.
        #[derive(Clone)]
        struct TonicOnly(Services);
        impl Route for TonicOnly {
            fn answer(
                &self,
                request: http::Request<RecvBody>,
                respond: h2::server::SendResponse<Bytes>,
            ) -> Answer {
                if request.uri().path() == wire::DELIVER_PATH {
                    crate::transport::answer_with(self.0.mailbox_service.clone(), request, respond)
                } else {
                    crate::transport::answer_with(self.0.task_service.clone(), request, respond)
                }
            }
        }
        let mailbox = Arc::new(Mailbox::default());
        let handlers: Handlers = Arc::default();
        handlers.write().unwrap().insert(
            "twice".into(),
            Method::Blocking(Arc::new(|p: Bytes| Ok([&p[..], &p[..]].concat().into()))),
        );
        let services = Services::new(mailbox.clone(), handlers, TokenCheck::new(Some("tok")));
        let client = TaskServer::start("127.0.0.1:0", Some("tok")).unwrap();
        let listener = client
            .runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let (_stop, stopped) = tokio::sync::oneshot::channel();
        client.runtime.spawn(crate::transport::serve(
            listener,
            TonicOnly(services),
            SETTINGS,
            stopped,
        ));
        let peer = client.peer("tonic", &address, T).unwrap();
        peer.deliver("big", big.to_vec()).unwrap();
        peer.deliver("empty", vec![]).unwrap();
        assert_eq!(mailbox.take("big", T), Some(big.clone()));
        assert_eq!(mailbox.take("empty", T), Some(Bytes::new()));
        let reply = peer.call("twice", big.clone()).unwrap();
        assert_eq!(reply, [&big[..], &big[..]].concat());
        let missing = peer.call("nothing", Bytes::new()).unwrap_err();
        assert!(missing.to_string().contains("no method"), "{missing}");
    }

    #[test]
    fn a_server_with_a_token_refuses_calls_without_it() {
        let server = TaskServer::start("127.0.0.1:0", Some("s3cret")).unwrap();
        let addr = server.local_addr().to_string();
        let stranger = TaskServer::start("127.0.0.1:0", None).unwrap();
        let e = stranger
            .peer("/job:worker/task:0", &addr, T)
            .unwrap()
            .deliver("k", vec![])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/job:worker/task:0") && e.contains("tokens differ"),
            "{e}"
        );
        let wrong = TaskServer::start("127.0.0.1:0", Some("guess")).unwrap();
        assert!(wrong
            .peer("w", &addr, T)
            .unwrap()
            .deliver("k", vec![])
            .is_err());
        let friend = TaskServer::start("127.0.0.1:0", Some("s3cret")).unwrap();
        friend
            .peer("w", &addr, T)
            .unwrap()
            .deliver("k", vec![7])
            .unwrap();
        assert_eq!(server.mailbox().take("k", T).as_deref(), Some(&[7u8][..]));
    }

    #[test]
    fn an_unreachable_peer_is_an_error_naming_it_within_the_timeout() {
        // A port with nothing listening: bind one, note it, close it.
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = free.local_addr().unwrap().to_string();
        drop(free);
        let me = TaskServer::start("127.0.0.1:0", None).unwrap();
        let start = Instant::now();
        let e = me
            .peer("/job:worker/task:3", &addr, Duration::from_secs(2))
            .unwrap()
            .deliver("all_reduce 0/0", vec![1, 2, 3])
            .unwrap_err();
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        let e = e.to_string();
        assert!(
            e.contains("/job:worker/task:3")
                && e.contains(&addr)
                && e.contains("deliver all_reduce 0/0"),
            "{e}"
        );
    }

    #[test]
    fn calls_reach_the_registered_handler_and_its_errors_come_back_naming_the_peer() {
        let server = TaskServer::start("127.0.0.1:0", Some("t")).unwrap();
        server.handle("echo.twice", |b: Bytes| {
            let mut v = b.to_vec();
            v.extend_from_slice(&b);
            Ok(Bytes::from(v))
        });
        server.handle("always.fails", |_| {
            Err(Error::invalid("always.fails", "no such variable \"w\""))
        });
        let addr = server.local_addr().to_string();
        let client = TaskServer::start("127.0.0.1:0", Some("t")).unwrap();
        let ps = client.peer("/job:ps/task:1", &addr, T).unwrap();
        assert_eq!(
            &ps.call("echo.twice", Bytes::from_static(b"ab")).unwrap()[..],
            b"abab"
        );
        // Several in flight at once.
        let pending: Vec<_> = (0..8u8)
            .map(|i| ps.start_call("echo.twice", Bytes::from(vec![i]), true))
            .collect();
        for (i, p) in pending.into_iter().enumerate() {
            assert_eq!(&p.wait().unwrap()[..], &[i as u8, i as u8]);
        }
        let e = ps.call("always.fails", Bytes::new()).unwrap_err();
        assert!(matches!(e, Error::Remote { .. }), "{e:?}");
        let e = e.to_string();
        assert!(
            e.contains("/job:ps/task:1") && e.contains("no such variable"),
            "{e}"
        );
        let e = ps
            .call("no.such.method", Bytes::new())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no.such.method") && e.contains("/job:ps/task:1"),
            "{e}"
        );
        // A wrong token is refused before any handler runs; the server keeps serving.
        let stranger = TaskServer::start("127.0.0.1:0", Some("x")).unwrap();
        let e = stranger
            .peer("/job:ps/task:1", &addr, T)
            .unwrap()
            .call("echo.twice", Bytes::from_static(b"a"))
            .unwrap_err();
        assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
        assert_eq!(
            &ps.call("echo.twice", Bytes::from_static(b"c")).unwrap()[..],
            b"cc"
        );
    }

    /// A call that reaches a server bound but not yet serving waits, and gets the answer
    /// of the method registered before `serve`: never "no such method".
    #[test]
    fn a_call_before_serve_waits_for_the_methods_registered_until_then() {
        let server = TaskServer::bind("127.0.0.1:0", None).unwrap();
        let client = TaskServer::start("127.0.0.1:0", None).unwrap();
        let peer = client
            .peer("/job:worker/task:0", &server.local_addr().to_string(), T)
            .unwrap();
        let pending = peer.start_call("echo", Bytes::from_static(b"early"), false);
        // The call is on its way (connected, its request sent) while the method is missing.
        std::thread::sleep(Duration::from_millis(300));
        assert!(!pending.is_finished(), "answered before serve");
        server.handle("echo", Ok);
        server.serve();
        assert_eq!(&pending.wait().unwrap()[..], b"early");
        server.serve(); // serving twice is serving
        assert_eq!(
            &peer.call("echo", Bytes::from_static(b"again")).unwrap()[..],
            b"again"
        );
    }

    #[test]
    fn a_stopping_server_answers_calls_in_flight_and_a_peer_reconnects_to_its_successor() {
        let server = TaskServer::start("127.0.0.1:0", None).unwrap();
        let addr = server.local_addr().to_string();
        let (arrived, has_arrived) = std::sync::mpsc::channel();
        server.handle_deferred("slow", move |payload, reply| {
            let _ = arrived.send(());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                reply.send(Ok(payload));
            });
        });
        let client = TaskServer::start("127.0.0.1:0", None).unwrap();
        let peer = client.peer("/job:worker/task:0", &addr, T).unwrap();
        let pending = peer.start_call("slow", Bytes::from_static(b"late"), true);
        has_arrived.recv_timeout(T).unwrap();
        let start = Instant::now();
        drop(server);
        let stopping = start.elapsed();
        assert!(stopping < Duration::from_secs(2), "{stopping:?}");
        assert_eq!(&pending.wait().unwrap()[..], b"late");
        // Gone: an error naming the peer, not a hang.
        let e = peer
            .start_call("slow", Bytes::new(), false)
            .wait()
            .unwrap_err();
        assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
        // A new server on the same address: the same peer connects to it.
        let successor = TaskServer::start(&addr, None).unwrap();
        successor.handle("echo", Ok);
        assert_eq!(
            &peer.call("echo", Bytes::from_static(b"again")).unwrap()[..],
            b"again"
        );
    }
}
