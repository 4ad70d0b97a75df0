//! [`Scheduled`]: the cloud call scheduler. Every call of the operator's workers goes through
//! one shared instance, which is itself a [`CloudProvider`]: per-action token buckets mirroring
//! EC2's (a call waits for a token instead of being sent to be throttled), waiting callers served
//! in arrival order, retries that take a token again (so the sent rate never exceeds the refill
//! rate, however hard EC2 throttles), a rate that adapts when other tenants drain the account's
//! buckets, counters for metrics, and a shutdown that releases every waiter at once.
//!
//! The rules, per action (or per bucket, with [`SchedulerConfig::shared`]):
//! - **Tokens**: a call is sent only with a token of its action's local bucket (EC2's sizes by
//!   default, [`BucketLimit::default_for`]); without one it sleeps (tokio's clock) until the
//!   refill. Waiters queue first come, first served (a fair `tokio::sync::Mutex` per bucket), so
//!   none starves. Alone in the account, the local bucket is the account's: EC2 never throttles.
//! - **Retries**: an answer that [`CloudError::can_repeat`] allows (throttling and other
//!   [retryable](CloudError::is_retryable) errors; [ambiguous](CloudError::is_ambiguous) ones only
//!   for an idempotent call: describes, tags, a create with a client token) is repeated after an
//!   exponential, jittered, capped backoff ([`RetryPolicy`]), at most `max_attempts` sends in
//!   all; each repeat queues for a token again. Other errors, and ambiguous errors of a call
//!   that is not idempotent (an assign by count, a create without a client token, attach,
//!   detach, delete, unassign), go back to the caller, who reconciles by describing. Once an
//!   attempt of a mutating call was answered ambiguously the call stays ambiguous: if its repeats
//!   end in a definite error (throttled to the last attempt) or a shutdown, the caller gets that
//!   ambiguous answer.
//! - **Throttle answers** (other tenants share the account's buckets): the local bucket is
//!   drained (every worker waits a full refill period, not just the throttled one) and, with
//!   [`AdaptPolicy`] (the default), its refill rate is cut by `decrease` (at most once per
//!   `hold`, never below `floor` of the configured rate), then climbs back linearly to the
//!   configured rate over `recovery` (additive increase, multiplicative decrease, as the AWS
//!   SDKs' "adaptive" retry mode in a simpler form); while cut, the bucket holds at most one
//!   second of its rate. The sent rate settles near the share the other tenants leave.
//! - **Shutdown** ([`Scheduled::shutdown`], or the parent's for a [`Scheduled::session`]):
//!   calls not yet sent and calls waiting for a token or a backoff return
//!   [`CloudError::Cancelled`] at once (or the ambiguous answer of an earlier attempt, which the
//!   caller must reconcile); a call already sent is answered as usual.
//!
//! ```
//! use corral_cloud::fake::{InstanceSpec, SubnetSpec};
//! use corral_cloud::{Action, CloudError, CloudProvider, FakeEc2, Scheduled, SchedulerConfig};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let ec2 = FakeEc2::builder()
//!     .subnet(SubnetSpec::new("subnet-a", "vpc-1", "us-east-1a", "10.0.0.0/24".parse().unwrap()))
//!     .instance(InstanceSpec::new("m5.large", "subnet-a").id("i-1"))
//!     .build()
//!     .unwrap();
//! // One scheduler for the process; one session per leadership term.
//! let scheduler = Scheduled::new(ec2, SchedulerConfig::default()).unwrap();
//! let term = scheduler.session();
//! let instance = term.describe_instance("i-1").await.unwrap();
//! assert_eq!(instance.instance_type, "m5.large");
//! term.shutdown(); // the lead is lost: nothing more is sent
//! assert_eq!(
//!     term.describe_instance("i-1").await,
//!     Err(CloudError::Cancelled { action: Action::DescribeInstances })
//! );
//! let stats = scheduler.stats();
//! assert_eq!(stats.action(Action::DescribeInstances).sent, 1);
//! assert_eq!(stats.action(Action::DescribeInstances).cancelled, 1);
//! # }
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::bucket::TokenBucket;
use crate::{
    Action, AttachInterface, BucketLimit, CloudError, CloudProvider, CreateInterface, Instance,
    InstanceTypeInfo, InterfaceFilter, Ipv4Assign, Ipv4Set, Ipv6Assign, Ipv6Set, NetworkInterface,
    Subnet, SubnetFilter, Tags,
};

const ACTIONS: usize = Action::ALL.len();

/// The longest backoff, recovery or hold the configuration takes (a day), so no `Instant + Duration`
/// can overflow.
const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

/// How failed calls are repeated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Sends of one call at most, the first included (1: never repeated).
    pub max_attempts: u32,
    /// The backoff before the first repeat; it doubles for each further one.
    pub initial_backoff: Duration,
    /// The backoff never exceeds this.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// 10 sends, 250 ms doubling to 20 s (36 to 72 s of backoff in all before giving up).
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(250),
            max_backoff: Duration::from_secs(20),
        }
    }
}

impl RetryPolicy {
    /// The backoff range before repeat number `repeat` (1 for the first repeat): the capped
    /// exponential `d` and the jitter's lower end `d / 2` (the delay is uniform in between, so
    /// workers throttled together do not come back together).
    fn backoff(&self, repeat: u32) -> (Duration, Duration) {
        let doubling = 1u32 << repeat.saturating_sub(1).min(31);
        let full = self
            .initial_backoff
            .saturating_mul(doubling)
            .min(self.max_backoff);
        (full / 2, full)
    }
}

/// How a bucket's refill rate follows throttle answers (see the module documentation): a cut
/// by `decrease` on a throttle answer, then a linear climb back to the configured rate. Each
/// climb ends in one throttle answer when it passes the share the other tenants leave, so a
/// slower climb means fewer throttled calls; a faster one, a quicker return to the full rate
/// when they are gone.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdaptPolicy {
    /// The rate is multiplied by this on a throttle answer (0 < decrease < 1).
    pub decrease: f64,
    /// The rate never goes below this fraction of the configured rate (0 < floor <= 1).
    pub floor: f64,
    /// The rate climbs from zero to the configured rate in this time, linearly (above zero).
    pub recovery: Duration,
    /// At most one cut per this time: the calls in flight when the bucket ran dry are all
    /// throttled together, and that is one signal, not many.
    pub hold: Duration,
}

impl Default for AdaptPolicy {
    /// Halve on a throttle answer, at most once a second, down to a tenth; climb back in 30 s
    /// (15 s from a halving).
    fn default() -> AdaptPolicy {
        AdaptPolicy {
            decrease: 0.5,
            floor: 0.1,
            recovery: Duration::from_secs(30),
            hold: Duration::from_secs(1),
        }
    }
}

/// The scheduler's configuration; [`SchedulerConfig::default`] is EC2's buckets, the default
/// retries and adaptation, seed 0.
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerConfig {
    /// Each action's local bucket, by [`Action::index`] (`None`: sent without waiting).
    pub buckets: [Option<BucketLimit>; ACTIONS],
    /// If set, every action draws from this one bucket instead of its own (one limiter for the
    /// whole API, as Cilium's 4 per s, burst 20): for comparisons, not for production.
    pub shared: Option<BucketLimit>,
    /// How failed calls are repeated.
    pub retry: RetryPolicy,
    /// How the rates follow throttle answers (`None`: fixed rates; a throttle answer still
    /// drains the bucket).
    pub adapt: Option<AdaptPolicy>,
    /// The seed of the backoff jitter.
    pub seed: u64,
}

impl Default for SchedulerConfig {
    fn default() -> SchedulerConfig {
        SchedulerConfig {
            buckets: Action::ALL.map(|action| Some(BucketLimit::default_for(action))),
            shared: None,
            retry: RetryPolicy::default(),
            adapt: Some(AdaptPolicy::default()),
            seed: 0,
        }
    }
}

impl SchedulerConfig {
    /// With this bucket for an action (`None`: not limited locally).
    pub fn bucket(mut self, action: Action, limit: Option<BucketLimit>) -> SchedulerConfig {
        self.buckets[action.index()] = limit;
        self
    }

    /// With one bucket for every action (see [`SchedulerConfig::shared`]).
    pub fn shared(mut self, limit: BucketLimit) -> SchedulerConfig {
        self.shared = Some(limit);
        self
    }

    /// With this retry policy.
    pub fn retry(mut self, retry: RetryPolicy) -> SchedulerConfig {
        self.retry = retry;
        self
    }

    /// With this adaptation (`None`: fixed rates).
    pub fn adapt(mut self, adapt: Option<AdaptPolicy>) -> SchedulerConfig {
        self.adapt = adapt;
        self
    }

    /// With this jitter seed.
    pub fn seed(mut self, seed: u64) -> SchedulerConfig {
        self.seed = seed;
        self
    }

    /// Refuses a bucket with no burst or no refill, no attempts, a backoff whose start is
    /// above its cap or a duration above a day, and an adaptation out of range.
    fn validate(&self) -> Result<(), CloudError> {
        let invalid = |message: String| Err(CloudError::InvalidParameterValue { message });
        let limits = Action::ALL
            .iter()
            .map(|action| (action.as_str(), self.buckets[action.index()]))
            .chain([("the shared bucket", self.shared)]);
        for (name, limit) in limits {
            if let Some(limit) = limit
                && (limit.burst == 0 || limit.per_second == 0)
            {
                return invalid(format!(
                    "the bucket of {name} needs a burst and a refill of at least 1, got {limit:?}"
                ));
            }
        }
        let retry = &self.retry;
        if retry.max_attempts == 0 {
            return invalid("a call is sent at least once: max_attempts is at least 1".into());
        }
        if retry.max_backoff > MAX_DURATION || retry.initial_backoff > retry.max_backoff {
            return invalid(format!(
                "the backoff goes from {:?} up to {:?}: the start at most the cap, the cap at most {MAX_DURATION:?}",
                retry.initial_backoff, retry.max_backoff
            ));
        }
        if let Some(adapt) = &self.adapt {
            let in_range = adapt.decrease > 0.0
                && adapt.decrease < 1.0
                && adapt.floor > 0.0
                && adapt.floor <= 1.0
                && !adapt.recovery.is_zero()
                && adapt.recovery <= MAX_DURATION
                && adapt.hold <= MAX_DURATION;
            if !in_range {
                return invalid(format!(
                    "adaptation {adapt:?}: decrease in (0, 1), floor in (0, 1], recovery above zero, durations at most {MAX_DURATION:?}"
                ));
            }
        }
        Ok(())
    }
}

/// What one action's calls did, for metrics ([`Scheduled::stats`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ActionStats {
    /// Calls sent to the provider (every attempt, repeats included).
    pub sent: u64,
    /// Attempts answered with success.
    pub ok: u64,
    /// Attempts answered with throttling ([`CloudError::is_throttling`]).
    pub throttled: u64,
    /// Attempts answered with another error, by [`CloudError::kind`] (a bounded set of labels).
    pub errors: BTreeMap<&'static str, u64>,
    /// Repeats sent (attempts after the first; one cancelled in its backoff is not counted).
    pub retries: u64,
    /// Attempts that had to wait for their token.
    pub waits: u64,
    /// The total time attempts waited for their token (backoffs not included).
    pub waited: Duration,
    /// Calls ended by a shutdown before they were sent or repeated.
    pub cancelled: u64,
    /// The bucket's refill rate now, in tokens per second (below the configured rate after
    /// throttling); `None` for an action not limited locally.
    pub rate: Option<f64>,
    /// The tokens in the bucket now; `None` for an action not limited locally.
    pub tokens: Option<f64>,
}

impl ActionStats {
    /// Attempts answered with an error other than throttling.
    pub fn failed(&self) -> u64 {
        self.errors.values().sum()
    }
}

/// A snapshot of the scheduler's counters, per action.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SchedulerStats {
    /// Per action, by [`Action::index`].
    pub actions: [ActionStats; ACTIONS],
}

impl SchedulerStats {
    /// One action's counters.
    pub fn action(&self, action: Action) -> &ActionStats {
        &self.actions[action.index()]
    }

    /// Each action with its counters, in [`Action::ALL`]'s order.
    pub fn iter(&self) -> impl Iterator<Item = (Action, &ActionStats)> {
        Action::ALL.into_iter().zip(self.actions.iter())
    }

    /// Calls sent, every action.
    pub fn total_sent(&self) -> u64 {
        self.actions.iter().map(|a| a.sent).sum()
    }

    /// Throttle answers, every action.
    pub fn total_throttled(&self) -> u64 {
        self.actions.iter().map(|a| a.throttled).sum()
    }

    /// Repeats, every action.
    pub fn total_retries(&self) -> u64 {
        self.actions.iter().map(|a| a.retries).sum()
    }
}

/// A cut of a bucket's rate.
#[derive(Clone, Copy, Debug)]
struct Cut {
    at: Instant,
    /// The rate it was cut to, as a fraction of the configured rate.
    to: f64,
}

/// One local bucket and its adaptation.
#[derive(Debug)]
struct Lane {
    bucket: TokenBucket,
    /// The configured rate, in thousandths of a token per second.
    full_millis: u64,
    cut: Option<Cut>,
}

impl Lane {
    fn new(limit: BucketLimit, now: Instant) -> Lane {
        Lane {
            bucket: TokenBucket::new(limit, now),
            full_millis: u64::from(limit.per_second) * 1000,
            cut: None,
        }
    }

    /// The adapted rate at `now` as a fraction of the configured one: the cut's, climbing
    /// linearly, at most 1.
    fn fraction_at(&self, now: Instant, adapt: Option<&AdaptPolicy>) -> f64 {
        let (Some(cut), Some(adapt)) = (self.cut, adapt) else {
            return 1.0;
        };
        let climbed =
            now.saturating_duration_since(cut.at).as_secs_f64() / adapt.recovery.as_secs_f64();
        (cut.to + climbed).min(1.0)
    }

    fn millis(&self, fraction: f64) -> u64 {
        ((self.full_millis as f64 * fraction).round() as u64).clamp(1, self.full_millis)
    }

    /// Brings the bucket's rate up to date.
    fn update_rate(&mut self, now: Instant, adapt: Option<&AdaptPolicy>) {
        let fraction = self.fraction_at(now, adapt);
        if fraction >= 1.0 {
            self.cut = None;
        }
        let rate = self.millis(fraction);
        self.bucket.set_rate_millis(now, rate);
        self.cap_burst(now, rate);
    }

    /// While cut, the bucket holds one second of its rate at most, so that workers coming back
    /// from their backoffs together do not spend a full burst into a bucket others drain.
    fn cap_burst(&mut self, now: Instant, rate_millis: u64) {
        let cap = if self.cut.is_some() {
            rate_millis
        } else {
            u64::MAX
        };
        self.bucket.set_cap_millis(now, cap);
    }

    /// A throttle answer: drain, and cut the rate (at most once per hold).
    fn throttled(&mut self, now: Instant, adapt: Option<&AdaptPolicy>) {
        self.update_rate(now, adapt);
        self.bucket.drain(now);
        let Some(adapt) = adapt else { return };
        if self
            .cut
            .is_some_and(|cut| now.saturating_duration_since(cut.at) < adapt.hold)
        {
            return;
        }
        let to = (self.fraction_at(now, Some(adapt)) * adapt.decrease).max(adapt.floor);
        self.cut = Some(Cut { at: now, to });
        let rate = self.millis(to);
        self.bucket.set_rate_millis(now, rate);
        self.cap_burst(now, rate);
    }

    fn rate(&self, now: Instant, adapt: Option<&AdaptPolicy>) -> f64 {
        self.millis(self.fraction_at(now, adapt)) as f64 / 1000.0
    }
}

#[derive(Debug)]
struct State {
    lanes: Vec<Lane>,
    stats: [ActionStats; ACTIONS],
    rng: ChaCha8Rng,
}

struct Shared<P> {
    provider: P,
    config: SchedulerConfig,
    /// Each action's lane, by [`Action::index`].
    lane_of: [Option<usize>; ACTIONS],
    /// One first-come-first-served queue per lane: the holder waits for the next token.
    queues: Vec<tokio::sync::Mutex<()>>,
    state: Mutex<State>,
}

impl<P> Shared<P> {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update under the lock is a few integer steps that leave the state consistent,
        // so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The cloud call scheduler over a provider (see the module documentation). Cheap to clone;
/// clones share the buckets, the counters and the shutdown.
pub struct Scheduled<P> {
    shared: Arc<Shared<P>>,
    cancel: CancellationToken,
}

impl<P> Clone for Scheduled<P> {
    fn clone(&self) -> Scheduled<P> {
        Scheduled {
            shared: Arc::clone(&self.shared),
            cancel: self.cancel.clone(),
        }
    }
}

impl<P> fmt::Debug for Scheduled<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scheduled")
            .field("config", &self.shared.config)
            .field("shut_down", &self.cancel.is_cancelled())
            .finish_non_exhaustive()
    }
}

/// Why a call stopped waiting.
struct Stopped;

impl<P: CloudProvider> Scheduled<P> {
    /// A scheduler over `provider` with full buckets; a configuration out of range (see the
    /// fields) is `InvalidParameterValue`.
    pub fn new(provider: P, config: SchedulerConfig) -> Result<Scheduled<P>, CloudError> {
        config.validate()?;
        let now = Instant::now();
        let mut lanes = Vec::new();
        let mut lane_of = [None; ACTIONS];
        if let Some(limit) = config.shared {
            lanes.push(Lane::new(limit, now));
            lane_of = [Some(0); ACTIONS];
        } else {
            for action in Action::ALL {
                if let Some(limit) = config.buckets[action.index()] {
                    lane_of[action.index()] = Some(lanes.len());
                    lanes.push(Lane::new(limit, now));
                }
            }
        }
        let queues = lanes.iter().map(|_| tokio::sync::Mutex::new(())).collect();
        let state = State {
            lanes,
            stats: Default::default(),
            rng: ChaCha8Rng::seed_from_u64(config.seed),
        };
        Ok(Scheduled {
            shared: Arc::new(Shared {
                provider,
                config,
                lane_of,
                queues,
                state: Mutex::new(state),
            }),
            cancel: CancellationToken::new(),
        })
    }
}

impl<P> Scheduled<P> {
    /// The provider calls go to (for calls that must bypass the scheduler: none in corral).
    pub fn provider(&self) -> &P {
        &self.shared.provider
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.shared.config
    }

    /// Stops this handle, its clones and its sessions: waiting calls return
    /// [`CloudError::Cancelled`] at once, and so do later ones. Calls already sent are answered.
    pub fn shutdown(&self) {
        self.cancel.cancel();
    }

    /// Whether [`Scheduled::shutdown`] was called on this handle (or a parent).
    pub fn is_shut_down(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// A handle on the same buckets and counters with its own shutdown, also shut down when
    /// this one is: the operator keeps one scheduler for the process (its buckets know what the
    /// account was sent, its counters feed the metrics) and takes a session per leadership
    /// term, shut down when it loses the lead.
    pub fn session(&self) -> Scheduled<P> {
        Scheduled {
            shared: Arc::clone(&self.shared),
            cancel: self.cancel.child_token(),
        }
    }

    /// A snapshot of the counters, with each bucket's rate and tokens now.
    pub fn stats(&self) -> SchedulerStats {
        let now = Instant::now();
        let adapt = self.shared.config.adapt;
        let mut state = self.shared.lock();
        let mut actions = state.stats.clone();
        for action in Action::ALL {
            if let Some(lane) = self.shared.lane_of[action.index()] {
                let lane = &mut state.lanes[lane];
                lane.update_rate(now, adapt.as_ref());
                let stats = &mut actions[action.index()];
                stats.rate = Some(lane.rate(now, adapt.as_ref()));
                stats.tokens = Some(lane.bucket.tokens(now));
            }
        }
        SchedulerStats { actions }
    }

    /// Waits for a token of the action's bucket, in arrival order.
    async fn acquire(&self, action: Action) -> Result<(), Stopped> {
        if self.cancel.is_cancelled() {
            return Err(Stopped);
        }
        let Some(lane) = self.shared.lane_of[action.index()] else {
            return Ok(());
        };
        let arrived = Instant::now();
        // Whether the call had to wait (in the queue or for the refill): on the real clock
        // some time always passes between arriving and taking a token, so the elapsed time
        // alone cannot tell.
        let mut waited = false;
        let queue = &self.shared.queues[lane];
        // The fair mutex's `try_lock` fails while others queue: no overtaking.
        let _turn = match queue.try_lock() {
            Ok(turn) => turn,
            Err(_) => {
                waited = true;
                let Some(turn) = self.cancel.run_until_cancelled(queue.lock()).await else {
                    return Err(Stopped);
                };
                turn
            }
        };
        let adapt = self.shared.config.adapt;
        loop {
            // Winning the queue (or waking from the sleep) at the moment of a shutdown counts
            // as stopped: nothing is sent once it was called.
            if self.cancel.is_cancelled() {
                return Err(Stopped);
            }
            let wait = {
                let mut state = self.shared.lock();
                let now = Instant::now();
                let lane = &mut state.lanes[lane];
                lane.update_rate(now, adapt.as_ref());
                if lane.bucket.try_take(now) {
                    None
                } else {
                    // The rate is never zero (validated, and the floor is above zero).
                    Some(
                        lane.bucket
                            .time_to_token(now)
                            .unwrap_or(Duration::from_secs(1)),
                    )
                }
            };
            let Some(wait) = wait else { break };
            waited = true;
            if self
                .cancel
                .run_until_cancelled(tokio::time::sleep(wait))
                .await
                .is_none()
            {
                return Err(Stopped);
            }
        }
        if waited {
            let mut state = self.shared.lock();
            let stats = &mut state.stats[action.index()];
            stats.waits += 1;
            stats.waited += arrived.elapsed();
        }
        Ok(())
    }

    /// The error for a call stopped by a shutdown: the ambiguous answer of an earlier attempt
    /// if there was one (it may have been applied: the caller must reconcile), else
    /// `Cancelled`.
    fn stopped(&self, action: Action, ambiguous: Option<CloudError>) -> CloudError {
        self.shared.lock().stats[action.index()].cancelled += 1;
        ambiguous.unwrap_or(CloudError::Cancelled { action })
    }

    /// One call through the scheduler: token, send (`call` on the provider), and repeats as the
    /// rules allow. The call is idempotent if its action is ([`Action::is_idempotent`]) or it
    /// carries a client token.
    async fn run<'a, T, F, Fut>(
        &'a self,
        action: Action,
        client_token: bool,
        mut call: F,
    ) -> Result<T, CloudError>
    where
        F: FnMut(&'a P) -> Fut,
        Fut: Future<Output = Result<T, CloudError>>,
    {
        let idempotent = client_token || action.is_idempotent();
        let retry = self.shared.config.retry;
        let adapt = self.shared.config.adapt;
        // The last ambiguous answer: once an attempt may have been applied, the call's outcome
        // stays ambiguous whatever later repeats answer (a throttled repeat of an applied
        // create says nothing about the first), so the caller reconciles instead of taking a
        // definite error (or `Cancelled`) for "not applied".
        let mut ambiguous: Option<CloudError> = None;
        let mut attempt = 1;
        loop {
            if self.acquire(action).await.is_err() {
                return Err(self.stopped(action, ambiguous));
            }
            {
                let mut state = self.shared.lock();
                let stats = &mut state.stats[action.index()];
                stats.sent += 1;
                if attempt > 1 {
                    stats.retries += 1;
                }
            }
            let result = call(&self.shared.provider).await;
            // (A describe changes nothing: its last answer stands.)
            if let Err(error) = &result
                && error.is_ambiguous()
                && action.is_mutating()
            {
                ambiguous = Some(error.clone());
            }
            let backoff = {
                let mut state = self.shared.lock();
                let state = &mut *state;
                let now = Instant::now();
                let stats = &mut state.stats[action.index()];
                match &result {
                    Ok(_) => stats.ok += 1,
                    Err(error) if error.is_throttling() => {
                        stats.throttled += 1;
                        if let Some(lane) = self.shared.lane_of[action.index()] {
                            state.lanes[lane].throttled(now, adapt.as_ref());
                        }
                    }
                    Err(error) => *stats.errors.entry(error.kind()).or_default() += 1,
                }
                match &result {
                    Err(error) if attempt < retry.max_attempts && error.can_repeat(idempotent) => {
                        let (low, high) = retry.backoff(attempt);
                        Some(state.rng.random_range(low..=high))
                    }
                    _ => None,
                }
            };
            let Some(backoff) = backoff else {
                return match (result, ambiguous) {
                    (Err(error), Some(earlier)) if !error.is_ambiguous() => Err(earlier),
                    (result, _) => result,
                };
            };
            if self
                .cancel
                .run_until_cancelled(tokio::time::sleep(backoff))
                .await
                .is_none()
            {
                return Err(self.stopped(action, ambiguous));
            }
            attempt += 1;
        }
    }
}

impl<P: CloudProvider> CloudProvider for Scheduled<P> {
    fn delegable_prefix_len(&self, ipv6: bool) -> Option<u8> {
        self.shared.provider.delegable_prefix_len(ipv6)
    }

    async fn describe_instance(&self, instance_id: &str) -> Result<Instance, CloudError> {
        self.run(Action::DescribeInstances, false, |provider| {
            provider.describe_instance(instance_id)
        })
        .await
    }

    async fn describe_instance_types(
        &self,
        instance_types: &[String],
    ) -> Result<Vec<InstanceTypeInfo>, CloudError> {
        self.run(Action::DescribeInstanceTypes, false, |provider| {
            provider.describe_instance_types(instance_types)
        })
        .await
    }

    async fn describe_subnets(&self, filter: &SubnetFilter) -> Result<Vec<Subnet>, CloudError> {
        self.run(Action::DescribeSubnets, false, |provider| {
            provider.describe_subnets(filter)
        })
        .await
    }

    async fn describe_interfaces(
        &self,
        filter: &InterfaceFilter,
    ) -> Result<Vec<NetworkInterface>, CloudError> {
        self.run(Action::DescribeNetworkInterfaces, false, |provider| {
            provider.describe_interfaces(filter)
        })
        .await
    }

    async fn create_interface(
        &self,
        request: &CreateInterface,
    ) -> Result<NetworkInterface, CloudError> {
        // With a client token a repeat returns the first call's interface: idempotent.
        let client_token = request.client_token.is_some();
        self.run(Action::CreateNetworkInterface, client_token, |provider| {
            provider.create_interface(request)
        })
        .await
    }

    async fn attach_interface(&self, request: AttachInterface<'_>) -> Result<String, CloudError> {
        self.run(Action::AttachNetworkInterface, false, |provider| {
            provider.attach_interface(request)
        })
        .await
    }

    async fn detach_interface(&self, attachment_id: &str, force: bool) -> Result<(), CloudError> {
        self.run(Action::DetachNetworkInterface, false, |provider| {
            provider.detach_interface(attachment_id, force)
        })
        .await
    }

    async fn delete_interface(&self, interface_id: &str) -> Result<(), CloudError> {
        self.run(Action::DeleteNetworkInterface, false, |provider| {
            provider.delete_interface(interface_id)
        })
        .await
    }

    async fn assign_ipv4(
        &self,
        interface_id: &str,
        request: &Ipv4Assign,
    ) -> Result<Ipv4Set, CloudError> {
        self.run(Action::AssignPrivateIpAddresses, false, |provider| {
            provider.assign_ipv4(interface_id, request)
        })
        .await
    }

    async fn unassign_ipv4(&self, interface_id: &str, release: &Ipv4Set) -> Result<(), CloudError> {
        self.run(Action::UnassignPrivateIpAddresses, false, |provider| {
            provider.unassign_ipv4(interface_id, release)
        })
        .await
    }

    async fn assign_ipv6(
        &self,
        interface_id: &str,
        request: &Ipv6Assign,
    ) -> Result<Ipv6Set, CloudError> {
        self.run(Action::AssignIpv6Addresses, false, |provider| {
            provider.assign_ipv6(interface_id, request)
        })
        .await
    }

    async fn unassign_ipv6(&self, interface_id: &str, release: &Ipv6Set) -> Result<(), CloudError> {
        self.run(Action::UnassignIpv6Addresses, false, |provider| {
            provider.unassign_ipv6(interface_id, release)
        })
        .await
    }

    async fn create_tags(&self, resource_ids: &[String], tags: &Tags) -> Result<(), CloudError> {
        self.run(Action::CreateTags, false, |provider| {
            provider.create_tags(resource_ids, tags)
        })
        .await
    }

    async fn delete_tags(
        &self,
        resource_ids: &[String],
        keys: &[String],
    ) -> Result<(), CloudError> {
        self.run(Action::DeleteTags, false, |provider| {
            provider.delete_tags(resource_ids, keys)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane() -> (Lane, Instant) {
        let now = Instant::now();
        let limit = BucketLimit {
            burst: 100,
            per_second: 5,
        };
        (Lane::new(limit, now), now)
    }

    #[test]
    fn a_throttle_drains_halves_once_per_hold_and_the_rate_climbs_back() {
        let adapt = AdaptPolicy::default();
        let (mut lane, start) = lane();
        lane.throttled(start, Some(&adapt));
        assert_eq!(lane.bucket.tokens(start), 0.0);
        assert_eq!(lane.rate(start, Some(&adapt)), 2.5);
        // Within the hold: drained again, not cut again.
        let soon = start + Duration::from_millis(500);
        lane.throttled(soon, Some(&adapt));
        assert_eq!(lane.bucket.tokens(soon), 0.0);
        // 2.5 + 5 × 0.5 / 30 tokens a second, in whole thousandths.
        assert_eq!(lane.rate(soon, Some(&adapt)), 2.583);
        // Climbs a thirtieth of the full rate per second: full again 15 s after the cut.
        let later = start + Duration::from_secs(6);
        assert_eq!(lane.rate(later, Some(&adapt)), 3.5);
        lane.update_rate(start + Duration::from_secs(15), Some(&adapt));
        assert!(lane.cut.is_none());
        assert_eq!(
            lane.rate(start + Duration::from_secs(15), Some(&adapt)),
            5.0
        );
    }

    #[test]
    fn cuts_stop_at_the_floor_and_a_cut_bucket_holds_one_second() {
        let adapt = AdaptPolicy {
            recovery: MAX_DURATION,
            ..AdaptPolicy::default()
        };
        let (mut lane, start) = lane();
        for second in 0..10 {
            lane.throttled(start + Duration::from_secs(second), Some(&adapt));
        }
        let now = start + Duration::from_secs(10);
        let rate = lane.rate(now, Some(&adapt));
        assert!((0.5..0.51).contains(&rate), "{rate}");
        // An idle minute refills one second of the rate, at least one token: not the burst.
        let idle = now + Duration::from_secs(60);
        lane.update_rate(idle, Some(&adapt));
        assert_eq!(lane.bucket.tokens(idle), 1.0);
    }

    #[test]
    fn without_adaptation_a_throttle_only_drains() {
        let (mut lane, start) = lane();
        lane.throttled(start, None);
        assert_eq!(lane.bucket.tokens(start), 0.0);
        assert_eq!(lane.rate(start, None), 5.0);
        assert_eq!(
            lane.bucket.time_to_token(start),
            Some(Duration::from_millis(200))
        );
    }

    /// A waiter handed the queue by a holder that left on the shutdown, with a token there,
    /// sends nothing: the queue's lock is won before the cancellation is seen (tokio-util
    /// favours the completed future), so the shutdown is checked again before taking a token.
    #[tokio::test(start_paused = true)]
    async fn a_waiter_handed_the_queue_after_a_shutdown_sends_nothing() {
        use crate::SubnetFilter;
        use crate::fake::{InstanceSpec, SubnetSpec};
        let fake = crate::FakeEc2::builder()
            .no_latency()
            .unthrottled()
            .subnet(SubnetSpec::subnet_a())
            .instance(InstanceSpec::new("m5.large", "subnet-a"))
            .build()
            .unwrap();
        let scheduled = Scheduled::new(fake.clone(), SchedulerConfig::default()).unwrap();
        let lane = scheduled.shared.lane_of[Action::DescribeSubnets.index()].unwrap();
        // The test holds the queue, as a caller sleeping for a token would.
        let holder = scheduled.shared.queues[lane].lock().await;
        let waiter = {
            let scheduled = scheduled.clone();
            tokio::spawn(async move { scheduled.describe_subnets(&SubnetFilter::default()).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "queued behind the holder");
        // The shutdown, then the holder leaves, before the waiter runs again.
        scheduled.shutdown();
        drop(holder);
        assert_eq!(
            waiter.await.unwrap(),
            Err(CloudError::Cancelled {
                action: Action::DescribeSubnets
            })
        );
        assert_eq!(fake.counters().total_calls(), 0);
    }

    #[test]
    fn backoff_doubles_to_the_cap() {
        let retry = RetryPolicy::default();
        let full: Vec<Duration> = (1..=10).map(|n| retry.backoff(n).1).collect();
        let millis = [250, 500, 1000, 2000, 4000, 8000, 16000, 20000, 20000, 20000];
        assert_eq!(full, millis.map(Duration::from_millis).to_vec());
        assert_eq!(retry.backoff(1).0, Duration::from_millis(125));
        assert_eq!(retry.backoff(u32::MAX).1, Duration::from_secs(20));
    }
}
