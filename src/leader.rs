//! Lease-based leader election on coordination.k8s.io/v1, interoperable with client-go's
//! (so a Go csi-provisioner and this one can hand the Lease to each other during a rollout).
//!
//! Decisions are pure functions (`decide`, `released_record`, `health`); `Elector` is the
//! thin IO loop. As in client-go, expiry is judged by *our* clock: a Lease held by another
//! replica is free once its record has not changed for `leaseDurationSeconds` since we
//! first saw that record, so clock skew between nodes does not matter.
//!
//! Deliberate difference: when `run`'s stop future resolves while leading, the Lease is
//! released (holder cleared, `leaseDurationSeconds=1`, like client-go's ReleaseOnCancel), so
//! another replica takes over within about a second. Upstream does that only with the
//! ReleaseLeaderElectionOnExit gate.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until, timeout, timeout_at};

use crate::config::LeaderArgs;
use crate::controller::events::{EventType, core_event};
use crate::fence::LeaseFence;
use crate::metrics::Metrics;

/// Where a pod finds its namespace when POD_NAMESPACE is not set.
pub const SERVICE_ACCOUNT_NAMESPACE_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// How long past the lease duration a leader may go without renewing before
/// `/healthz/leader-election` fails (csi-lib-utils' default health-check timeout).
pub const HEALTH_TOLERANCE: Duration = Duration::from_secs(20);

/// Reason of the events on the Lease when this replica starts and stops leading (client-go's).
pub const LEADER_ELECTION_REASON: &str = "LeaderElection";

/// How long the "stopped leading" event may hold up the exit.
const STOPPED_EVENT_TIMEOUT: Duration = Duration::from_secs(2);
/// What the log says when the "stopped leading" event did not make it in time (tests read it).
pub const STOPPED_EVENT_NOT_SENT: &str =
    "the LeaderElection event \"stopped leading\" was not sent in time";

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("cannot determine the hostname for the leader-election identity: {0}")]
    Hostname(#[source] std::io::Error),
}

/// Replaces every character outside `[a-zA-Z0-9-]` by `-` and appends `X` if the result
/// ends with `-` (or is empty), as csi-lib-utils does for Lease names and identities.
pub fn sanitize_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if out.is_empty() || out.ends_with('-') {
        out.push('X');
    }
    out
}

/// The Lease name for a CSI driver name, e.g. `hostpath.csi.k8s.io` → `hostpath-csi-k8s-io`.
pub fn lease_name(driver_name: &str) -> String {
    sanitize_name(&driver_name.replace('/', "-"))
}

/// `--leader-election-namespace`, else env POD_NAMESPACE, else the service-account
/// namespace file, else `default`.
pub fn resolve_namespace(flag: &str, pod_namespace: Option<&str>, sa_file: Option<&str>) -> String {
    [Some(flag), pod_namespace, sa_file.map(str::trim)]
        .into_iter()
        .flatten()
        .find(|ns| !ns.is_empty())
        .unwrap_or("default")
        .to_owned()
}

/// Everything the elector needs, resolved from flags and environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderConfig {
    pub lease_name: String,
    pub namespace: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    /// Put on the Lease whenever this replica writes it.
    pub labels: BTreeMap<String, String>,
    /// Source component of the LeaderElection events (see [`event_component`]).
    pub event_component: String,
}

/// csi-lib-utils' source component of the LeaderElection events: the driver name with `/`
/// → `-` (nothing else sanitised, unlike the Lease name) and the raw hostname.
pub fn event_component(driver_name: &str, hostname: &str) -> String {
    format!("{}/{hostname}", driver_name.replace('/', "-"))
}

impl LeaderConfig {
    /// Reads the hostname, env POD_NAMESPACE and the service-account namespace file.
    pub fn from_args(args: &LeaderArgs, driver_name: &str) -> Result<Self, LeaderError> {
        let host = hostname::get().map_err(LeaderError::Hostname)?;
        let pod_namespace = std::env::var("POD_NAMESPACE").ok();
        let sa_namespace = std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE_FILE).ok();
        Ok(Self {
            lease_name: lease_name(driver_name),
            namespace: resolve_namespace(
                &args.leader_election_namespace,
                pod_namespace.as_deref(),
                sa_namespace.as_deref(),
            ),
            identity: sanitize_name(&host.to_string_lossy()),
            lease_duration: args.leader_election_lease_duration,
            renew_deadline: args.leader_election_renew_deadline,
            retry_period: args.leader_election_retry_period,
            labels: args.labels(),
            event_component: event_component(driver_name, &host.to_string_lossy()),
        })
    }

    /// Whole seconds, as client-go writes it (validation guarantees at least 1 s).
    fn lease_duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }
}

/// The leader-election fields of a Lease.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseRecord {
    /// Empty when nobody holds the Lease.
    pub holder: String,
    pub lease_duration_seconds: i32,
    pub acquire_time: Option<Timestamp>,
    pub renew_time: Option<Timestamp>,
    pub transitions: i32,
}

impl LeaseRecord {
    pub fn of(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        Self {
            holder: spec.holder_identity.unwrap_or_default(),
            lease_duration_seconds: spec.lease_duration_seconds.unwrap_or(0),
            acquire_time: spec.acquire_time.map(|t| t.0),
            renew_time: spec.renew_time.map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or(0),
        }
    }

    /// The record of a first acquisition (the Lease did not exist).
    pub fn initial(me: &str, wall: Timestamp, lease_duration_seconds: i32) -> Self {
        Self {
            holder: me.to_owned(),
            lease_duration_seconds,
            acquire_time: Some(wall),
            renew_time: Some(wall),
            transitions: 0,
        }
    }
}

/// A record and the local time we first saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub record: LeaseRecord,
    pub at: Instant,
}

impl Observed {
    /// Keeps the first-seen time while the record is unchanged.
    pub fn update(prev: Option<Observed>, record: LeaseRecord, now: Instant) -> Observed {
        match prev {
            Some(prev) if prev.record == record => prev,
            _ => Observed { record, at: now },
        }
    }

    /// Whether the holder's claim is still good at `now` by our clock.
    pub fn valid_at(&self, now: Instant) -> bool {
        let duration =
            Duration::from_secs(u64::try_from(self.record.lease_duration_seconds).unwrap_or(0));
        // An absurd duration from the API that overflows the clock never expires.
        self.at.checked_add(duration).is_none_or(|end| end > now)
    }
}

/// What to do with a Lease we just read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Another replica holds a valid claim.
    Wait { holder: String },
    /// Write this record (acquire, take over or renew).
    Take(LeaseRecord),
}

/// client-go's rule: take the Lease when it is free, expired by our clock, or ours;
/// keep acquire time and transition count when renewing our own claim.
pub fn decide(
    observed: &Observed,
    now: Instant,
    wall: Timestamp,
    me: &str,
    lease_duration_seconds: i32,
) -> Decision {
    let old = &observed.record;
    let ours = old.holder == me;
    if !old.holder.is_empty() && !ours && observed.valid_at(now) {
        return Decision::Wait {
            holder: old.holder.clone(),
        };
    }
    Decision::Take(LeaseRecord {
        holder: me.to_owned(),
        lease_duration_seconds,
        acquire_time: if ours { old.acquire_time } else { Some(wall) },
        renew_time: Some(wall),
        transitions: if ours {
            old.transitions
        } else {
            old.transitions.saturating_add(1)
        },
    })
}

/// The record written on release: no holder, 1 s duration, so candidates take over at once.
pub fn released_record(old: &LeaseRecord, wall: Timestamp) -> LeaseRecord {
    LeaseRecord {
        holder: String::new(),
        lease_duration_seconds: 1,
        acquire_time: Some(wall),
        renew_time: Some(wall),
        transitions: old.transitions,
    }
}

/// Writes `record` into the Lease spec and merges `labels` into its labels (other spec
/// fields and labels are kept).
pub fn apply_record(lease: &mut Lease, record: &LeaseRecord, labels: &BTreeMap<String, String>) {
    let spec = lease.spec.get_or_insert_with(Default::default);
    spec.holder_identity = Some(record.holder.clone());
    spec.lease_duration_seconds = Some(record.lease_duration_seconds);
    spec.acquire_time = record.acquire_time.map(MicroTime);
    spec.renew_time = record.renew_time.map(MicroTime);
    spec.lease_transitions = Some(record.transitions);
    if !labels.is_empty() {
        lease
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
}

/// `/healthz/leader-election`: fails only while we lead and have not renewed for longer
/// than the lease duration plus `tolerance`; a non-leader is always healthy.
pub fn health(
    last_renew_while_leading: Option<Instant>,
    now: Instant,
    lease_duration: Duration,
    tolerance: Duration,
    lease: &str,
) -> Result<(), String> {
    match last_renew_while_leading {
        Some(t) if now.saturating_duration_since(t) > lease_duration + tolerance => Err(format!(
            "leader has not renewed lease {lease} for {:?}",
            now.saturating_duration_since(t)
        )),
        _ => Ok(()),
    }
}

/// Read side of the election: leadership changes and renewal times.
#[derive(Debug, Clone)]
pub struct LeaderWatch {
    leading: watch::Receiver<bool>,
    /// `Some(last renewal)` while leading.
    renewed: watch::Receiver<Option<Instant>>,
    lease_duration: Duration,
    renew_deadline: Duration,
    lease: String,
}

impl LeaderWatch {
    /// Turns true when this replica becomes leader and false when it stops.
    pub fn leading(&self) -> watch::Receiver<bool> {
        self.leading.clone()
    }

    pub fn is_leading(&self) -> bool {
        *self.leading.borrow()
    }

    /// The last successful renewal while leading.
    pub fn last_renew(&self) -> Option<Instant> {
        *self.renewed.borrow()
    }

    /// The fence storage calls check: open while the last renewal is younger than the renew
    /// deadline (see `crate::fence`).
    pub fn fence(&self) -> LeaseFence {
        LeaseFence::new(self.renewed.clone(), self.renew_deadline)
    }

    /// The check behind `/healthz/leader-election`.
    pub fn health_check(&self, now: Instant) -> Result<(), String> {
        health(
            self.last_renew(),
            now,
            self.lease_duration,
            HEALTH_TOLERANCE,
            &self.lease,
        )
    }
}

/// How `Elector::run` ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Stopped while campaigning.
    StoppedBeforeLeading,
    /// Stopped while leading; the Lease was released.
    Released,
    /// Stopped while leading; the release did not happen (the Lease then expires normally).
    NotReleased(String),
    /// Renewal failed for the whole renew deadline: main must exit 1 ("Stopped leading").
    Lost,
}

/// The IO loop of one candidate.
pub struct Elector {
    api: Api<Lease>,
    cfg: LeaderConfig,
    observed: Option<Observed>,
    /// The Lease as we last wrote it: its resourceVersion lets renewals skip the GET.
    written: Option<Lease>,
    /// The resourceVersion of the Lease when we last found it held by another replica.
    seen_version: Option<String>,
    leading: watch::Sender<bool>,
    renewed: watch::Sender<Option<Instant>>,
    metrics: Arc<Metrics>,
}

impl Elector {
    /// Creates the leader-election series of `metrics` (client-go creates them with its
    /// elector).
    pub fn new(client: Client, cfg: LeaderConfig, metrics: Arc<Metrics>) -> (Self, LeaderWatch) {
        metrics.leader_election_started();
        let (leading, leading_rx) = watch::channel(false);
        let (renewed, renewed_rx) = watch::channel(None);
        let view = LeaderWatch {
            leading: leading_rx,
            renewed: renewed_rx,
            lease_duration: cfg.lease_duration,
            renew_deadline: cfg.renew_deadline,
            lease: format!("{}/{}", cfg.namespace, cfg.lease_name),
        };
        let elector = Self {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            observed: None,
            written: None,
            seen_version: None,
            leading,
            renewed,
            metrics,
        };
        (elector, view)
    }

    /// Campaigns, then leads until `stop` resolves or renewal fails past the renew deadline.
    /// `stop` should resolve only after in-flight work has finished: the Lease is renewed
    /// until then and released afterwards.
    pub async fn run(mut self, stop: impl Future<Output = ()>) -> Outcome {
        tokio::pin!(stop);
        let lease = format!("{}/{}", self.cfg.namespace, self.cfg.lease_name);
        let retry = self.cfg.retry_period;

        tracing::info!(%lease, identity = %self.cfg.identity, "attempting to acquire leader lease");
        let mut acquired_at;
        loop {
            acquired_at = Instant::now();
            let attempt = timeout(self.cfg.renew_deadline, self.try_acquire_or_renew());
            let result = tokio::select! {
                biased;
                () = &mut stop => return Outcome::StoppedBeforeLeading,
                r = attempt => r,
            };
            match result {
                Ok(Ok(true)) => break,
                Ok(Ok(false)) => tracing::debug!(%lease, "lease is held by another replica"),
                Ok(Err(e)) => tracing::warn!(%lease, error = %e, "cannot acquire lease"),
                Err(_) => tracing::warn!(%lease, "acquiring the lease timed out"),
            }
            tokio::select! {
                biased;
                () = &mut stop => return Outcome::StoppedBeforeLeading,
                () = self.wait_for_new_holder(retry) => {}
            }
        }
        tracing::info!(%lease, identity = %self.cfg.identity, "became leader");
        self.renewed.send_replace(Some(acquired_at));
        self.set_leading(true);
        // Not awaited: leading must not wait for an event.
        tokio::spawn(self.leader_event("became leader"));

        loop {
            tokio::select! {
                biased;
                () = &mut stop => return self.step_down(&lease).await,
                () = sleep(retry) => {}
            }
            // One renewal cycle: retry every retry period until the renew deadline.
            let deadline = Instant::now() + self.cfg.renew_deadline;
            loop {
                // When the renewal is sent: never later than when the API server stores it.
                let sent = Instant::now();
                let result = tokio::select! {
                    biased;
                    () = &mut stop => return self.step_down(&lease).await,
                    r = timeout_at(deadline, self.try_acquire_or_renew()) => r,
                };
                match result {
                    Ok(Ok(true)) => {
                        self.renewed.send_replace(Some(sent));
                        break;
                    }
                    Ok(Ok(false)) => tracing::warn!(%lease, "lease renewal refused; retrying"),
                    Ok(Err(e)) => {
                        tracing::warn!(%lease, error = %e, "lease renewal failed; retrying")
                    }
                    Err(_) => {
                        self.stop_leading().await;
                        tracing::error!(
                            %lease,
                            renew_deadline = ?self.cfg.renew_deadline,
                            "Stopped leading: lease not renewed within the renew deadline"
                        );
                        return Outcome::Lost;
                    }
                }
                tokio::select! {
                    biased;
                    () = &mut stop => return self.step_down(&lease).await,
                    () = sleep_until(deadline.min(Instant::now() + retry)) => {}
                }
            }
        }
    }

    async fn step_down(&mut self, lease: &str) -> Outcome {
        self.stop_leading().await;
        match timeout(self.cfg.renew_deadline, self.release()).await {
            Ok(Ok(true)) => {
                tracing::info!(%lease, "released leader lease");
                Outcome::Released
            }
            Ok(Ok(false)) => Outcome::NotReleased("the lease is no longer ours".into()),
            Ok(Err(e)) => {
                tracing::warn!(%lease, error = %e, "cannot release leader lease");
                Outcome::NotReleased(e.to_string())
            }
            Err(_) => Outcome::NotReleased("release timed out".into()),
        }
    }

    fn set_leading(&self, leading: bool) {
        self.leading.send_replace(leading);
        self.metrics.set_leading(leading);
    }

    /// Leading ends (the Lease lost, or a stop): the controllers are told first, then the
    /// event is written, bounded so that a lost API server cannot hold up the exit.
    async fn stop_leading(&mut self) {
        self.set_leading(false);
        self.renewed.send_replace(None);
        if timeout(STOPPED_EVENT_TIMEOUT, self.leader_event("stopped leading"))
            .await
            .is_err()
        {
            tracing::warn!(
                timeout = ?STOPPED_EVENT_TIMEOUT,
                "{STOPPED_EVENT_NOT_SENT}; going on without it"
            );
        }
    }

    /// client-go's LeaderElection event on the Lease as we last wrote it: "<identity>
    /// <what>", in the Lease's namespace, from [`LeaderConfig::event_component`].
    fn leader_event(&self, what: &str) -> impl Future<Output = ()> + Send + 'static {
        let meta = self.written.as_ref().map(|lease| &lease.metadata);
        let regarding = ObjectReference {
            api_version: Some("coordination.k8s.io/v1".to_owned()),
            kind: Some("Lease".to_owned()),
            name: Some(self.cfg.lease_name.clone()),
            namespace: Some(self.cfg.namespace.clone()),
            uid: meta.and_then(|m| m.uid.clone()),
            resource_version: meta.and_then(|m| m.resource_version.clone()),
            ..ObjectReference::default()
        };
        let event = core_event(
            &regarding,
            EventType::Normal,
            LEADER_ELECTION_REASON,
            &format!("{} {what}", self.cfg.identity),
            Timestamp::now(),
            &EventSource {
                component: Some(self.cfg.event_component.clone()),
                host: None,
            },
        );
        let api: Api<Event> = Api::namespaced(self.api.clone().into_client(), &self.cfg.namespace);
        async move {
            if let Err(error) = api.create(&PostParams::default(), &event).await {
                tracing::warn!(%error, reason = LEADER_ELECTION_REASON, "failed to record event");
            }
        }
    }

    fn is_holder(&self) -> bool {
        self.observed
            .as_ref()
            .is_some_and(|o| o.record.holder == self.cfg.identity)
    }

    fn remember(&mut self, written: Lease, now: Instant) {
        // Use the server's copy: it truncates timestamps to microseconds, and comparing
        // against our nanosecond copy would make every later read look like a change.
        self.observed = Some(Observed::update(
            self.observed.take(),
            LeaseRecord::of(&written),
            now,
        ));
        self.written = Some(written);
    }

    /// One client-go `tryAcquireOrRenew`: `Ok(true)` when we hold the Lease afterwards.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let (now, wall) = (Instant::now(), Timestamp::now());
        let name = self.cfg.lease_name.clone();
        let pp = PostParams::default();
        let seconds = self.cfg.lease_duration_seconds();

        // Fast path: we hold a valid claim and know the resourceVersion we wrote.
        if let (Some(observed), Some(written)) = (&self.observed, &self.written)
            && self.is_holder()
            && observed.valid_at(now)
            && let Decision::Take(record) = decide(observed, now, wall, &self.cfg.identity, seconds)
        {
            let mut lease = written.clone();
            apply_record(&mut lease, &record, &self.cfg.labels);
            match self.api.replace(&name, &pp, &lease).await {
                Ok(written) => {
                    self.remember(written, now);
                    return Ok(true);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "optimistic lease renewal failed; re-reading")
                }
            }
        }

        let Some(mut current) = self.api.get_opt(&name).await? else {
            let record = LeaseRecord::initial(&self.cfg.identity, wall, seconds);
            let mut lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(self.cfg.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: None,
            };
            apply_record(&mut lease, &record, &self.cfg.labels);
            return match self.api.create(&pp, &lease).await {
                Ok(written) => {
                    self.remember(written, now);
                    Ok(true)
                }
                Err(e) if is_conflict(&e) => Ok(false),
                Err(e) => Err(e),
            };
        };

        let observed = Observed::update(self.observed.take(), LeaseRecord::of(&current), now);
        let decision = decide(&observed, now, wall, &self.cfg.identity, seconds);
        self.observed = Some(observed);
        match decision {
            Decision::Wait { holder } => {
                tracing::trace!(%holder, "lease held by another replica");
                self.seen_version = current.metadata.resource_version.clone();
                Ok(false)
            }
            Decision::Take(record) => {
                if self.is_holder() {
                    // Our own Lease, renewed after a fresh read: client-go's slow path.
                    self.metrics.leader_slowpath();
                }
                // `current` carries its resourceVersion: a concurrent writer makes this a 409.
                apply_record(&mut current, &record, &self.cfg.labels);
                match self.api.replace(&name, &pp, &current).await {
                    Ok(written) => {
                        self.remember(written, now);
                        Ok(true)
                    }
                    Err(e) if is_conflict(&e) => Ok(false),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Waits up to `period`, returning early when the Lease gets released or changes hands.
    /// client-go only polls, so a released Lease waits for the standby's next poll; watching
    /// makes the takeover immediate. Renewals by the same holder do not wake us, and without
    /// a watch (no RBAC `watch` verb, a failed request) this is a plain sleep.
    async fn wait_for_new_holder(&self, period: Duration) {
        let deadline = Instant::now() + period;
        let holder = self.observed.as_ref().map(|o| o.record.holder.clone());
        if let (Some(version), Some(holder)) = (&self.seen_version, holder) {
            let params = WatchParams::default()
                .fields(&format!("metadata.name={}", self.cfg.lease_name))
                .timeout(u32::try_from(period.as_secs().max(1)).unwrap_or(u32::MAX));
            let changed_hands = async {
                let Ok(events) = self.api.watch(&params, version).await else {
                    return std::future::pending().await;
                };
                let mut events = std::pin::pin!(events);
                while let Ok(Some(event)) = events.try_next().await {
                    match event {
                        WatchEvent::Modified(lease) if LeaseRecord::of(&lease).holder == holder => {
                        }
                        WatchEvent::Bookmark(_) => {}
                        // A new holder, a release, a deletion or an expired watch: look now.
                        _ => return,
                    }
                }
                std::future::pending().await
            };
            if timeout_at(deadline, changed_hands).await.is_ok() {
                return;
            }
        }
        sleep_until(deadline).await;
    }

    /// Clears the holder if we still hold the Lease; `Ok(false)` if it is not ours.
    async fn release(&mut self) -> Result<bool, kube::Error> {
        let name = self.cfg.lease_name.clone();
        let pp = PostParams::default();
        let mut lease = match self.written.clone() {
            Some(lease) if self.is_holder() => lease,
            _ => return Ok(false),
        };
        for attempt in 0..2 {
            let record = released_record(&LeaseRecord::of(&lease), Timestamp::now());
            apply_record(&mut lease, &record, &self.cfg.labels);
            match self.api.replace(&name, &pp, &lease).await {
                Ok(written) => {
                    self.remember(written, Instant::now());
                    return Ok(true);
                }
                // Our copy is stale (e.g. a fast-path renewal raced): re-read once.
                Err(e) if is_conflict(&e) && attempt == 0 => match self.api.get_opt(&name).await? {
                    Some(fresh) if LeaseRecord::of(&fresh).holder == self.cfg.identity => {
                        lease = fresh;
                    }
                    _ => return Ok(false),
                },
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

#[cfg(test)]
mod tests;
