//! The Kubernetes client: configuration from `--kubeconfig` / `--master` / env KUBECONFIG /
//! in-cluster (as upstream), and a client-side token bucket (`--kube-api-qps`,
//! `--kube-api-burst`) applied as a tower layer to every API request the client sends,
//! events and watches included (a watch counts as one request).

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use kube::Client;
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::time::{Instant, Sleep, sleep_until};
use tower::{Layer, Service};

use crate::config::{CapacityArgs, ClientArgs};

pub mod protobuf;
pub mod protobuf_watch;

/// client-go's defaults for a zero `--kube-api-qps` / `--kube-api-burst`.
const DEFAULT_QPS: f64 = 5.0;
const DEFAULT_BURST: u32 = 10;
/// Upper bound of a single throttling wait, so an absurdly small QPS cannot overflow timers.
const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);
/// How often [`RateLimitLayer::yield_since`] looks at the bucket.
const SPARE_POLL: Duration = Duration::from_millis(20);
/// Longest low-priority traffic (the events that are not news, see `controller::events`; the
/// journal's removals) yields to the requests that make progress before it takes its turn like
/// any request. It outlasts a long backlog: 1,000
/// claims take 200 s at the default QPS, and with a 30 s bound the events and journal
/// removals of the first claims took turns among the PV creates for most of it.
const MAX_YIELD: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum KubeClientError {
    #[error("cannot load kubeconfig {path:?}: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("invalid --master URL {url:?}: {source}")]
    Master {
        url: String,
        #[source]
        source: http::uri::InvalidUri,
    },
    #[error(
        "not running in a cluster and neither --kubeconfig, --master nor KUBECONFIG is set: {0}"
    )]
    InCluster(#[source] kube::config::InClusterError),
    #[error("cannot build the Kubernetes client: {0}")]
    Build(#[source] kube::Error),
}

/// Where the client configuration comes from (decided from flags and env, then loaded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    InCluster,
    /// Out of cluster: a kubeconfig file and/or an API server URL overriding its server.
    Explicit {
        kubeconfig: Option<PathBuf>,
        master: Option<String>,
    },
}

impl ConfigSource {
    /// Upstream's rule: env KUBECONFIG (non-empty) replaces `--kubeconfig`; with either a
    /// kubeconfig or `--master` the config is built from them, otherwise in-cluster.
    pub fn decide(kubeconfig_flag: &str, master: &str, kubeconfig_env: Option<&str>) -> Self {
        let kubeconfig = kubeconfig_env
            .filter(|e| !e.is_empty())
            .unwrap_or(kubeconfig_flag);
        if kubeconfig.is_empty() && master.is_empty() {
            return ConfigSource::InCluster;
        }
        ConfigSource::Explicit {
            kubeconfig: (!kubeconfig.is_empty()).then(|| PathBuf::from(kubeconfig)),
            master: (!master.is_empty()).then(|| master.to_owned()),
        }
    }

    pub async fn load(&self) -> Result<kube::Config, KubeClientError> {
        match self {
            ConfigSource::InCluster => {
                kube::Config::incluster().map_err(KubeClientError::InCluster)
            }
            ConfigSource::Explicit { kubeconfig, master } => {
                let master = master
                    .as_deref()
                    .map(|url| {
                        url.parse::<http::Uri>()
                            .map_err(|source| KubeClientError::Master {
                                url: url.to_owned(),
                                source,
                            })
                    })
                    .transpose()?;
                let mut config = match (kubeconfig, &master) {
                    (Some(path), _) => {
                        let err = |source| KubeClientError::Kubeconfig {
                            path: path.clone(),
                            source,
                        };
                        let file = Kubeconfig::read_from(path).map_err(err)?;
                        kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                            .await
                            .map_err(err)?
                    }
                    // Only a URL: no credentials, as with client-go's BuildConfigFromFlags.
                    (None, Some(url)) => kube::Config::new(url.clone()),
                    (None, None) => {
                        return kube::Config::incluster().map_err(KubeClientError::InCluster);
                    }
                };
                if let Some(url) = master {
                    config.cluster_url = url;
                }
                Ok(config)
            }
        }
    }
}

/// Builds the client for the flags in `args` (all API traffic goes through the limiter),
/// and the limiter's handle for callers that can wait for spare capacity.
/// With `capacity` (`--enable-capacity`), also the capacity client with its own limiter
/// (`--kube-api-capacity-qps`, `--kube-api-capacity-burst`).
pub async fn client_from_args(
    args: &ClientArgs,
    capacity: Option<&CapacityArgs>,
) -> Result<ApiClients, KubeClientError> {
    let env = std::env::var("KUBECONFIG").ok();
    let source = ConfigSource::decide(&args.kubeconfig, &args.master, env.as_deref());
    let config = source.load().await?;
    let limits = Limits::from_flags(args, capacity);
    let rate_limit = limits.main;
    let capacity = limits
        .capacity
        .map(|limit| build_client(config.clone(), limit))
        .transpose()?;
    Ok(ApiClients {
        capacity,
        client: build_client(config.clone(), rate_limit.clone())?,
        prepaid: build_client(config, RateLimitLayer::unlimited())?,
        rate_limit,
    })
}

/// The limiters of [`client_from_args`], apart so that a test can see which flags feed which.
struct Limits {
    /// `--kube-api-qps`, `--kube-api-burst`: every client but the capacity one.
    main: RateLimitLayer,
    /// `--kube-api-capacity-qps`, `--kube-api-capacity-burst`, with `--enable-capacity`.
    capacity: Option<RateLimitLayer>,
}

impl Limits {
    fn from_flags(args: &ClientArgs, capacity: Option<&CapacityArgs>) -> Self {
        Limits {
            main: RateLimitLayer::from_flags(args.kube_api_qps, args.kube_api_burst),
            capacity: capacity.map(|capacity| {
                RateLimitLayer::from_flags(
                    f64::from(capacity.kube_api_capacity_qps),
                    capacity.kube_api_capacity_burst,
                )
            }),
        }
    }
}

/// The sidecar's clients of one API server; together they send at most
/// `--kube-api-qps`/`--kube-api-burst`.
#[derive(Clone)]
pub struct ApiClients {
    /// Every request waits for a token of `rate_limit`.
    pub client: Client,
    /// No limiter of its own: for a writer that takes its token with
    /// [`RateLimitLayer::acquire`] before it assembles the request (the journal), so that the
    /// changes arriving while it waits still join that request.
    pub prepaid: Client,
    pub rate_limit: RateLimitLayer,
    /// With `--enable-capacity`: the CSIStorageCapacity writes, their watch and the owner
    /// lookup, limited apart from the rest as upstream's capacity client.
    pub capacity: Option<Client>,
}

/// kube's default stack (auth, retries on 429/503/504, tracing) wrapped in `limit`.
pub fn build_client(
    config: kube::Config,
    limit: RateLimitLayer,
) -> Result<Client, KubeClientError> {
    let builder = ClientBuilder::try_from(config).map_err(KubeClientError::Build)?;
    Ok(builder.with_layer(&limit).build())
}

/// A token bucket like golang.org/x/time/rate as client-go uses it: starts full with
/// `burst` tokens, refills at `qps` per second; a request that finds it empty reserves a
/// token and waits until it would be available.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// `qps` must be positive and finite (see `RateLimitLayer::from_flags`), `burst` ≥ 1.
    pub fn new(qps: f64, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes one token at `now`: `None` = go ahead, `Some(wait)` = a token is reserved,
    /// send the request after `wait`.
    pub fn take(&mut self, now: Instant) -> Option<Duration> {
        self.refill(now);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            return None;
        }
        let wait = Duration::try_from_secs_f64(-self.tokens / self.qps).unwrap_or(MAX_WAIT);
        Some(wait.min(MAX_WAIT))
    }

    /// Whether the bucket has capacity to spare at `now`: it is full, every token spent has
    /// been earned back. A request sent then takes nothing that a burst of requests making
    /// progress could use (a whole token merely being available is not enough: when claims
    /// arrive in a burst, events sent with the first of them took 4 of the 10 burst tokens
    /// their PV creates needed, 0.8 s at the default QPS).
    pub fn has_spare(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.tokens >= self.burst
    }

    fn refill(&mut self, now: Instant) {
        if now > self.last {
            let refill = now.duration_since(self.last).as_secs_f64() * self.qps;
            self.tokens = (self.tokens + refill).min(self.burst);
            self.last = now;
        }
    }
}

/// Tower layer throttling requests with a shared `TokenBucket`; services made from one layer
/// share one bucket. Throttling happens in `poll_ready`, like tower's own rate limiter,
/// so a caller (kube's buffer) only sends once the token is there.
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    bucket: Option<Arc<Mutex<TokenBucket>>>,
}

impl RateLimitLayer {
    /// client-go semantics: qps 0 → 5, burst 0 → 10, negative (or non-finite) qps → no limit.
    pub fn from_flags(qps: f64, burst: i32) -> Self {
        let qps = if qps == 0.0 { DEFAULT_QPS } else { qps };
        if qps < 0.0 || !qps.is_finite() {
            return Self::unlimited();
        }
        let burst = u32::try_from(burst)
            .ok()
            .filter(|b| *b > 0)
            .unwrap_or(DEFAULT_BURST);
        Self {
            bucket: Some(Arc::new(Mutex::new(TokenBucket::new(
                qps,
                burst,
                Instant::now(),
            )))),
        }
    }

    pub fn unlimited() -> Self {
        Self { bucket: None }
    }

    /// Takes a token as a throttled request would, waiting until it is due, for a request
    /// sent through [`ApiClients::prepaid`].
    pub async fn acquire(&self) {
        let Some(bucket) = &self.bucket else {
            return;
        };
        let now = Instant::now();
        if let Some(wait) = take(bucket, now) {
            sleep_until(now + wait).await;
        }
    }

    /// Waits until [`Self::has_spare`], or until [`MAX_YIELD`] after `since`: low-priority
    /// traffic (events, the journal's lazy flushes) yields this way to the requests that make
    /// progress.
    pub async fn yield_since(&self, since: Instant) {
        let deadline = since + MAX_YIELD;
        while !self.has_spare() && Instant::now() < deadline {
            tokio::time::sleep(SPARE_POLL).await;
        }
    }

    /// How long the bucket takes to earn one token (`1 / qps`); `None` without a limit.
    pub fn token_interval(&self) -> Option<Duration> {
        let bucket = self.bucket.as_ref()?;
        let qps = bucket.lock().unwrap_or_else(PoisonError::into_inner).qps;
        Some(Duration::try_from_secs_f64(1.0 / qps).map_or(MAX_WAIT, |d| d.min(MAX_WAIT)))
    }

    /// See [`TokenBucket::has_spare`]; always true without a limit. Lets low-priority traffic
    /// (events) yield to the requests that make progress (PV creates), as both share one budget.
    pub fn has_spare(&self) -> bool {
        self.bucket.as_ref().is_none_or(|bucket| {
            bucket
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .has_spare(Instant::now())
        })
    }
}

/// [`TokenBucket::take`] on a shared bucket.
fn take(bucket: &Mutex<TokenBucket>, now: Instant) -> Option<Duration> {
    // The bucket holds plain numbers, so a poisoned lock is still consistent.
    bucket
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take(now)
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            bucket: self.bucket.clone(),
            state: State::Idle,
        }
    }
}

#[derive(Debug)]
enum State {
    /// No token held.
    Idle,
    /// A token is reserved and becomes usable when the sleep ends.
    Waiting(Pin<Box<Sleep>>),
    /// A token is held for the next `call`.
    Ready,
}

/// The service made by `RateLimitLayer`.
#[derive(Debug)]
pub struct RateLimit<S> {
    inner: S,
    bucket: Option<Arc<Mutex<TokenBucket>>>,
    state: State,
}

impl<S: Clone> Clone for RateLimit<S> {
    fn clone(&self) -> Self {
        // A held token belongs to the original, not to the clone.
        Self {
            inner: self.inner.clone(),
            bucket: self.bucket.clone(),
            state: State::Idle,
        }
    }
}

impl<S, R> Service<R> for RateLimit<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        loop {
            match &mut self.state {
                State::Ready => return self.inner.poll_ready(cx),
                State::Waiting(sleep) => {
                    ready!(sleep.as_mut().poll(cx));
                    self.state = State::Ready;
                }
                State::Idle => {
                    let Some(bucket) = &self.bucket else {
                        self.state = State::Ready;
                        continue;
                    };
                    let now = Instant::now();
                    self.state = match take(bucket, now) {
                        None => State::Ready,
                        Some(wait) => {
                            if wait >= Duration::from_secs(1) {
                                tracing::info!(?wait, "client-side throttling of API requests");
                            } else {
                                tracing::debug!(?wait, "client-side throttling of API requests");
                            }
                            State::Waiting(Box::pin(sleep_until(now + wait)))
                        }
                    };
                }
            }
        }
    }

    fn call(&mut self, req: R) -> Self::Future {
        self.state = State::Idle;
        self.inner.call(req)
    }
}

/// An error's text as upstream's Go client prints it: an API error is its Status message alone
/// (kube's text adds the reason and the whole Status), e.g.
/// `volumeattributesclasses.storage.k8s.io "gold" not found`.
pub fn go_error_text(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status.message.clone(),
        _ => error.to_string(),
    }
}

#[cfg(test)]
mod tests;
