//! [`FakeEc2`]: a realistic in-process EC2 for tests and simulations, on tokio's clock (run
//! under `#[tokio::test(start_paused = true)]`, its latencies cost no wall time) and a seed
//! (latencies, delays and faults are reproducible).
//!
//! What it models, with EC2's numbers as defaults:
//! - instance types with their real interface and address limits ([`instance_types`]);
//!   `AttachmentLimitExceeded` and `PrivateIpAddressLimitExceeded` enforced, a /28 prefix taking
//!   one address slot, no prefixes on Xen;
//! - subnets handing out free /32s and free aligned /28s (AWS reserves the first four addresses
//!   and the last), optionally fragmented so that a /28 fails with `InsufficientCidrBlocks`
//!   while /32s remain; `InsufficientFreeAddressesInSubnet` when full;
//! - EC2's per-action token buckets, shared by every handle of the account (clones of one
//!   `FakeEc2`): describes 100 burst / 20 per s; create, delete, assign, unassign and tags
//!   100 / 5; attach and detach 50 / 5; an empty bucket answers `RequestLimitExceeded` and
//!   consumes nothing;
//! - lognormal latencies per action (create ~350 ms median, others tens of ms); attachments
//!   that complete 1–8 s after the call returns (`attaching` until then), detachments 1–5 s;
//! - eventual consistency: each change to an interface shows in describe calls after
//!   Exp(mean 500 ms), capped at 5 s, never before an earlier change;
//! - faults: a probability of `InternalError` and of "applied but timed out" per action, and
//!   scripted faults ([`FakeEc2::fail_next`], [`FakeEc2::time_out_next`],
//!   [`FakeEc2::throttle_storm`]);
//! - counters of calls, throttled calls and injected faults per action ([`Counters`]).
//!
//! One `FakeEc2` is one account in one region; clones share it.

mod catalog;
mod model;
mod pool;
mod state;
mod wall;

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ipnet::{Ipv4Net, Ipv6Net};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, LogNormal};
use tokio::time::Instant;

pub use crate::bucket::BucketLimit;
pub use catalog::instance_types;

use self::model::{FakeInstance, FakeSubnet, Lag, Model, Span};
use self::pool::{Ipv4Pool, Ipv6Pool};
use self::state::StateFile;
pub use self::wall::MAX_DELAY;
use crate::bucket::TokenBucket;
use crate::{
    Action, Amount, AttachInterface, CloudError, CloudProvider, CreateInterface, Instance,
    InstanceState, InstanceTypeInfo, InterfaceFilter, Ipv4Assign, Ipv4Set, Ipv6Assign, Ipv6Set,
    NetworkInterface, Subnet, SubnetFilter, Tags,
};

const ACTIONS: usize = Action::ALL.len();

/// A probability as the runtime setters take it: NaN is 0, the rest clamped to 0..=1.
fn clamp_probability(p: f64) -> f64 {
    if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) }
}

/// Refuses a probability outside 0..=1 (NaN included).
fn check_probability(what: &str, p: f64) -> Result<(), CloudError> {
    if (0.0..=1.0).contains(&p) {
        Ok(())
    } else {
        Err(CloudError::InvalidParameterValue {
            message: format!("{what} is a probability from 0 to 1, got {p}"),
        })
    }
}

/// Refuses a delay above [`MAX_DELAY`].
fn check_delay(what: &str, delay: Duration) -> Result<(), CloudError> {
    if delay <= MAX_DELAY {
        Ok(())
    } else {
        Err(CloudError::InvalidParameterValue {
            message: format!(
                "{what} of {delay:?} is above the fake's longest delay, {MAX_DELAY:?}"
            ),
        })
    }
}

/// A lognormal latency given by its median and its 99th percentile.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Latency {
    /// Half the calls take less.
    pub median: Duration,
    /// 99 % of the calls take less.
    pub p99: Duration,
}

impl Latency {
    /// A latency of `median_ms` median and `p99_ms` 99th percentile, in milliseconds.
    pub const fn millis(median_ms: u64, p99_ms: u64) -> Latency {
        Latency {
            median: Duration::from_millis(median_ms),
            p99: Duration::from_millis(p99_ms),
        }
    }

    /// No latency at all.
    pub const ZERO: Latency = Latency::millis(0, 0);

    fn distribution(&self) -> Option<LogNormal<f64>> {
        if self.median.is_zero() {
            return None;
        }
        // The 99th percentile of a standard normal is 2.326 standard deviations.
        let sigma = (self.p99.as_secs_f64() / self.median.as_secs_f64())
            .ln()
            .max(0.0)
            / 2.326_348;
        LogNormal::new(self.median.as_secs_f64().ln(), sigma).ok()
    }

    /// EC2's latency for an action as the fake assumes it.
    pub fn default_for(action: Action) -> Latency {
        match action {
            Action::DescribeInstances
            | Action::DescribeInstanceTypes
            | Action::DescribeSubnets
            | Action::DescribeNetworkInterfaces => Latency::millis(50, 300),
            Action::CreateNetworkInterface => Latency::millis(350, 2000),
            Action::AttachNetworkInterface
            | Action::DetachNetworkInterface
            | Action::DeleteNetworkInterface => Latency::millis(60, 400),
            Action::AssignPrivateIpAddresses
            | Action::UnassignPrivateIpAddresses
            | Action::AssignIpv6Addresses
            | Action::UnassignIpv6Addresses => Latency::millis(80, 500),
            Action::CreateTags | Action::DeleteTags => Latency::millis(40, 250),
        }
    }
}

/// A fault scripted for the next call of an action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The call fails with this error and changes nothing.
    Fail(CloudError),
    /// The call is applied, and the caller gets [`CloudError::Timeout`].
    AppliedButTimedOut,
}

/// Calls seen by the fake, per action.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    calls: [u64; ACTIONS],
    throttled: [u64; ACTIONS],
    faults: [u64; ACTIONS],
}

impl Counters {
    /// Calls of the action (throttled and failed ones included).
    pub fn calls(&self, action: Action) -> u64 {
        self.calls[action.index()]
    }

    /// Calls of the action answered `RequestLimitExceeded` (bucket or storm).
    pub fn throttled(&self, action: Action) -> u64 {
        self.throttled[action.index()]
    }

    /// Calls of the action given an injected fault (scripted or random).
    pub fn faults(&self, action: Action) -> u64 {
        self.faults[action.index()]
    }

    /// Calls of every action.
    pub fn total_calls(&self) -> u64 {
        self.calls.iter().sum()
    }

    /// Throttled calls of every action.
    pub fn total_throttled(&self) -> u64 {
        self.throttled.iter().sum()
    }
}

/// A subnet for [`FakeEc2Builder::subnet`].
#[derive(Clone, Debug, PartialEq)]
pub struct SubnetSpec {
    id: String,
    vpc_id: String,
    zone: String,
    ipv4: Ipv4Net,
    ipv6: Option<Ipv6Net>,
    tags: Tags,
    fragment: f64,
}

impl SubnetSpec {
    /// `subnet-a` of `vpc-1` in `us-east-1a`, `10.0.0.0/24`: the subnet of this crate's unit
    /// tests.
    #[cfg(test)]
    pub(crate) fn subnet_a() -> SubnetSpec {
        SubnetSpec::new(
            "subnet-a",
            "vpc-1",
            "us-east-1a",
            "10.0.0.0/24".parse().unwrap(),
        )
    }

    /// A subnet `id` of `vpc_id` in `zone` with this IPv4 CIDR (/16 to /28, as AWS allows).
    pub fn new(id: &str, vpc_id: &str, zone: &str, ipv4: Ipv4Net) -> SubnetSpec {
        SubnetSpec {
            id: id.to_owned(),
            vpc_id: vpc_id.to_owned(),
            zone: zone.to_owned(),
            ipv4,
            ipv6: None,
            tags: Tags::new(),
            fragment: 0.0,
        }
    }

    /// With an IPv6 CIDR (a /64).
    pub fn ipv6(mut self, cidr: Ipv6Net) -> SubnetSpec {
        self.ipv6 = Some(cidr);
        self
    }

    /// With a tag.
    pub fn tag(mut self, key: &str, value: &str) -> SubnetSpec {
        self.tags.insert(key.to_owned(), value.to_owned());
        self
    }

    /// Fragmented: in this fraction of its /28 blocks, one address (chosen by the seed) is used
    /// by someone else. With 1.0, no /28 prefix can be delegated while most /32s remain.
    pub fn fragmented(mut self, fraction: f64) -> SubnetSpec {
        self.fragment = fraction;
        self
    }
}

/// An instance for [`FakeEc2Builder::instance`] and [`FakeEc2::launch_instance`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceSpec {
    id: Option<String>,
    instance_type: String,
    subnet_id: String,
    state: InstanceState,
}

impl InstanceSpec {
    /// A running instance of this type whose primary interface is in this subnet (the
    /// instance's zone and VPC are the subnet's).
    pub fn new(instance_type: &str, subnet_id: &str) -> InstanceSpec {
        InstanceSpec {
            id: None,
            instance_type: instance_type.to_owned(),
            subnet_id: subnet_id.to_owned(),
            state: InstanceState::Running,
        }
    }

    /// With this id (default: generated, `i-` and 17 hex digits).
    pub fn id(mut self, id: &str) -> InstanceSpec {
        self.id = Some(id.to_owned());
        self
    }

    /// In this state (default running).
    pub fn state(mut self, state: InstanceState) -> InstanceSpec {
        self.state = state;
        self
    }
}

/// Builds a [`FakeEc2`]; every knob defaults to EC2's behaviour. [`FakeEc2Builder::build`]
/// refuses a probability outside 0..=1 (NaN included), a delay above [`MAX_DELAY`] and a delay
/// whose minimum is above its maximum.
#[derive(Clone, Debug)]
pub struct FakeEc2Builder {
    seed: u64,
    types: Vec<InstanceTypeInfo>,
    subnets: Vec<SubnetSpec>,
    instances: Vec<InstanceSpec>,
    buckets: [Option<BucketLimit>; ACTIONS],
    latencies: [Latency; ACTIONS],
    internal_error_rate: [f64; ACTIONS],
    timeout_rate: [f64; ACTIONS],
    attach_delay: Span,
    detach_delay: Span,
    lag: Lag,
    timeout_after: Duration,
    throttle_latency: Duration,
}

impl Default for FakeEc2Builder {
    fn default() -> FakeEc2Builder {
        FakeEc2Builder {
            seed: 0,
            types: instance_types(),
            subnets: Vec::new(),
            instances: Vec::new(),
            buckets: Action::ALL.map(|a| Some(BucketLimit::default_for(a))),
            latencies: Action::ALL.map(Latency::default_for),
            internal_error_rate: [0.0; ACTIONS],
            timeout_rate: [0.0; ACTIONS],
            attach_delay: Span {
                min: Duration::from_secs(1),
                max: Duration::from_secs(8),
            },
            detach_delay: Span {
                min: Duration::from_secs(1),
                max: Duration::from_secs(5),
            },
            lag: Lag {
                mean: Duration::from_millis(500),
                max: Duration::from_secs(5),
            },
            timeout_after: Duration::from_secs(5),
            throttle_latency: Duration::from_millis(10),
        }
    }
}

impl FakeEc2Builder {
    /// The seed of every random choice (latencies, delays, lags, faults, fragmentation).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Adds (or replaces) an instance type.
    pub fn instance_type(mut self, info: InstanceTypeInfo) -> Self {
        self.types.retain(|t| t.instance_type != info.instance_type);
        self.types.push(info);
        self
    }

    /// Adds a subnet.
    pub fn subnet(mut self, subnet: SubnetSpec) -> Self {
        self.subnets.push(subnet);
        self
    }

    /// Adds an instance (its primary interface is created at device index 0, delete on
    /// termination, attached and visible at once).
    pub fn instance(mut self, instance: InstanceSpec) -> Self {
        self.instances.push(instance);
        self
    }

    /// Sets an action's token bucket (`None`: never throttled).
    pub fn bucket(mut self, action: Action, limit: Option<BucketLimit>) -> Self {
        self.buckets[action.index()] = limit;
        self
    }

    /// No throttling at all.
    pub fn unthrottled(mut self) -> Self {
        self.buckets = [None; ACTIONS];
        self
    }

    /// Sets an action's latency.
    pub fn latency(mut self, action: Action, latency: Latency) -> Self {
        self.latencies[action.index()] = latency;
        self
    }

    /// Every call answers at once, attachments and detachments complete at once.
    pub fn no_latency(mut self) -> Self {
        self.latencies = [Latency::ZERO; ACTIONS];
        self.attach_delay = Span {
            min: Duration::ZERO,
            max: Duration::ZERO,
        };
        self.detach_delay = self.attach_delay;
        self.throttle_latency = Duration::ZERO;
        self
    }

    /// An attachment completes uniformly between these delays after the call (default 1–8 s).
    pub fn attach_delay(mut self, min: Duration, max: Duration) -> Self {
        self.attach_delay = Span { min, max };
        self
    }

    /// A detachment completes uniformly between these delays after the call (default 1–5 s).
    pub fn detach_delay(mut self, min: Duration, max: Duration) -> Self {
        self.detach_delay = Span { min, max };
        self
    }

    /// Changes show in describe calls after Exp(`mean`), capped at `max` (default 500 ms, 5 s).
    pub fn consistency_lag(mut self, mean: Duration, max: Duration) -> Self {
        self.lag = Lag { mean, max };
        self
    }

    /// Describe calls see every change at once.
    pub fn strongly_consistent(self) -> Self {
        self.consistency_lag(Duration::ZERO, Duration::ZERO)
    }

    /// The probability that a call of the action fails with `InternalError` (not applied).
    pub fn internal_error_rate(mut self, action: Action, probability: f64) -> Self {
        self.internal_error_rate[action.index()] = probability;
        self
    }

    /// The probability that a call of the action is applied but answers `Timeout`.
    pub fn timeout_rate(mut self, action: Action, probability: f64) -> Self {
        self.timeout_rate[action.index()] = probability;
        self
    }

    /// How long a timed-out call waits before answering `Timeout` (default 5 s, virtual).
    pub fn timeout_after(mut self, delay: Duration) -> Self {
        self.timeout_after = delay;
        self
    }

    /// Checks every knob: probabilities within 0..=1 (not NaN), delays at most [`MAX_DELAY`],
    /// a delay's minimum not above its maximum.
    fn validate(&self) -> Result<(), CloudError> {
        for action in Action::ALL {
            let index = action.index();
            check_probability(
                &format!("the internal error rate of {action}"),
                self.internal_error_rate[index],
            )?;
            check_probability(
                &format!("the timeout rate of {action}"),
                self.timeout_rate[index],
            )?;
            let latency = self.latencies[index];
            check_delay(&format!("the median latency of {action}"), latency.median)?;
            check_delay(&format!("the p99 latency of {action}"), latency.p99)?;
        }
        for (what, span) in [
            ("the attach delay", self.attach_delay),
            ("the detach delay", self.detach_delay),
        ] {
            check_delay(what, span.max)?;
            if span.min > span.max {
                return Err(CloudError::InvalidParameterValue {
                    message: format!(
                        "{what}: minimum {:?} above maximum {:?}",
                        span.min, span.max
                    ),
                });
            }
        }
        check_delay("the mean consistency lag", self.lag.mean)?;
        check_delay("the maximum consistency lag", self.lag.max)?;
        check_delay("the timeout", self.timeout_after)?;
        check_delay("the latency of a throttled call", self.throttle_latency)?;
        for subnet in &self.subnets {
            check_probability(
                &format!("the fragmentation of subnet {}", subnet.id),
                subnet.fragment,
            )?;
        }
        Ok(())
    }

    /// Builds the fake; an unknown subnet or type, a duplicate id, or a knob out of range
    /// (see the setters) is refused with `InvalidParameterValue`.
    pub fn build(self) -> Result<FakeEc2, CloudError> {
        self.validate()?;
        let now = Instant::now();
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let mut model = Model::new(self.types);
        model.lag = self.lag;
        model.attach_delay = self.attach_delay;
        model.detach_delay = self.detach_delay;
        for spec in self.subnets {
            if model.subnets.contains_key(&spec.id) {
                return Err(CloudError::InvalidParameterValue {
                    message: format!("subnet {} defined twice", spec.id),
                });
            }
            let len = spec.ipv4.prefix_len();
            if !(16..=28).contains(&len) {
                return Err(CloudError::InvalidParameterValue {
                    message: format!("subnet {}: an IPv4 subnet is /16 to /28", spec.id),
                });
            }
            if spec.ipv6.is_some_and(|net| net.prefix_len() != 64) {
                return Err(CloudError::InvalidParameterValue {
                    message: format!("subnet {}: an IPv6 subnet is a /64", spec.id),
                });
            }
            let ipv6 = spec.ipv6.map(|net| net.trunc());
            if let Some(other) = model.subnets.values().find(|other| {
                other.vpc_id == spec.vpc_id
                    && (other.ipv4_cidr.contains(&spec.ipv4.trunc())
                        || spec.ipv4.trunc().contains(&other.ipv4_cidr)
                        || ipv6.is_some_and(|net| {
                            other.ipv6.as_ref().is_some_and(|o| o.cidr() == net)
                        }))
            }) {
                return Err(CloudError::InvalidParameterValue {
                    message: format!(
                        "subnet {}: its CIDR overlaps subnet {} of {}",
                        spec.id, other.id, spec.vpc_id
                    ),
                });
            }
            let mut ipv4 = Ipv4Pool::new(spec.ipv4);
            if spec.fragment > 0.0 {
                ipv4.fragment(spec.fragment, &mut rng);
            }
            model.subnets.insert(
                spec.id.clone(),
                FakeSubnet {
                    id: spec.id,
                    vpc_id: spec.vpc_id,
                    zone: spec.zone,
                    ipv4,
                    ipv4_cidr: spec.ipv4.trunc(),
                    ipv6: spec.ipv6.map(Ipv6Pool::new),
                    tags: spec.tags,
                },
            );
        }
        for spec in self.instances {
            let id = model.launch(spec.id, &spec.instance_type, &spec.subnet_id, now)?;
            model.set_state(&id, spec.state)?;
        }
        let inner = Inner {
            model,
            rng,
            buckets: self
                .buckets
                .map(|limit| limit.map(|l| TokenBucket::new(l, now))),
            latencies: self.latencies.map(|l| l.distribution()),
            internal_error_rate: self.internal_error_rate,
            timeout_rate: self.timeout_rate,
            scripted: Default::default(),
            storm: None,
            counters: Counters::default(),
            timeout_after: self.timeout_after,
            throttle_latency: self.throttle_latency,
            state: None,
        };
        Ok(FakeEc2 {
            inner: Arc::new(Mutex::new(inner)),
        })
    }
}

struct Inner {
    model: Model,
    rng: ChaCha8Rng,
    buckets: [Option<TokenBucket>; ACTIONS],
    latencies: [Option<LogNormal<f64>>; ACTIONS],
    internal_error_rate: [f64; ACTIONS],
    timeout_rate: [f64; ACTIONS],
    /// Scripted faults per action, each with how many calls it still applies to.
    scripted: [VecDeque<(Fault, usize)>; ACTIONS],
    storm: Option<(Instant, f64)>,
    counters: Counters,
    timeout_after: Duration,
    throttle_latency: Duration,
    /// The state file shared with the other processes of this fake cloud, if any.
    state: Option<StateFile>,
}

/// What the fake decided when a call arrived.
enum Admission {
    /// Answer this error after this delay; nothing is applied.
    Refuse(Duration, CloudError),
    /// Apply after this latency; then answer, or time out.
    Proceed {
        latency: Duration,
        fail: Option<CloudError>,
        time_out: bool,
    },
}

impl Inner {
    /// Runs `f` on the model; with a state file, under its lock, on the file's state, writing
    /// it back after `f` if `save` and `f` succeeded (a refused call changes nothing).
    fn synced<T>(
        &mut self,
        save: bool,
        f: impl FnOnce(&mut Model, &mut ChaCha8Rng) -> Result<T, CloudError>,
    ) -> Result<T, CloudError> {
        let Inner {
            state, model, rng, ..
        } = self;
        let Some(state) = state.as_mut() else {
            return f(model, rng);
        };
        state.with_lock(|state| {
            state.load(model)?;
            let result = f(model, rng)?;
            if save {
                state.save(model)?;
            }
            Ok(result)
        })
    }

    /// Uses the first scripted fault of an action once.
    fn take_scripted(&mut self, index: usize) {
        let queue = &mut self.scripted[index];
        if let Some((_, left)) = queue.front_mut() {
            *left -= 1;
            if *left == 0 {
                queue.pop_front();
            }
        }
    }

    fn admit(&mut self, action: Action, now: Instant) -> Admission {
        let index = action.index();
        self.counters.calls[index] += 1;
        let throttled = |inner: &mut Inner| {
            inner.counters.throttled[index] += 1;
            Admission::Refuse(
                inner.throttle_latency,
                CloudError::RequestLimitExceeded { action },
            )
        };
        if let Some((until, fraction)) = self.storm {
            if now >= until {
                self.storm = None;
            } else if self.rng.random_bool(fraction) {
                return throttled(self);
            }
        }
        let latency = self.latencies[index]
            .map(|d| {
                Duration::try_from_secs_f64(d.sample(&mut self.rng).min(600.0)).unwrap_or_default()
            })
            .unwrap_or_default();
        if let Some((Fault::Fail(error), _)) = self.scripted[index].front() {
            let error = error.clone();
            self.take_scripted(index);
            self.counters.faults[index] += 1;
            return Admission::Refuse(latency, error);
        }
        if let Some(bucket) = self.buckets[index].as_mut()
            && !bucket.try_take(now)
        {
            return throttled(self);
        }
        let mut fail = None;
        let mut time_out = false;
        if let Some((Fault::AppliedButTimedOut, _)) = self.scripted[index].front() {
            self.take_scripted(index);
            time_out = true;
        } else {
            let internal = self.internal_error_rate[index];
            let timeout = self.timeout_rate[index];
            if internal > 0.0 && self.rng.random_bool(internal.min(1.0)) {
                fail = Some(CloudError::InternalError {
                    message: "An internal error has occurred".to_owned(),
                });
            } else if timeout > 0.0 && self.rng.random_bool(timeout.min(1.0)) {
                time_out = true;
            }
        }
        if fail.is_some() || time_out {
            self.counters.faults[index] += 1;
        }
        Admission::Proceed {
            latency,
            fail,
            time_out,
        }
    }
}

/// The realistic in-process fake EC2 (see the module documentation). Cheap to clone; clones
/// share the account, its resources, buckets and counters.
#[derive(Clone)]
pub struct FakeEc2 {
    inner: Arc<Mutex<Inner>>,
}

impl fmt::Debug for FakeEc2 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.lock();
        f.debug_struct("FakeEc2")
            .field("subnets", &inner.model.subnets.len())
            .field("instances", &inner.model.instances.len())
            .field("counters", &inner.counters)
            .finish_non_exhaustive()
    }
}

async fn sleep(delay: Duration) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}

impl FakeEc2 {
    /// A builder with EC2's defaults and no resources.
    pub fn builder() -> FakeEc2Builder {
        FakeEc2Builder::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent state (every operation plans before
        // it changes anything), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the model (with a state file, as the file has it now; if the file cannot be
    /// read, as this process last saw it).
    fn read<T>(&self, f: impl FnOnce(&Model) -> T) -> T {
        let mut inner = self.lock();
        let _ = inner.synced(false, |_, _| Ok(()));
        f(&inner.model)
    }

    /// Changes the model outside a call (a test or seeding helper), saved to the state file.
    fn change<T>(
        &self,
        f: impl FnOnce(&mut Model, &mut ChaCha8Rng, Instant) -> Result<T, CloudError>,
    ) -> Result<T, CloudError> {
        let now = Instant::now();
        self.lock().synced(true, |model, rng| f(model, rng, now))
    }

    /// Keeps this fake's resources in the file `path`, shared with every other `FakeEc2` that
    /// keeps them there, in this process or another: one cloud for all of them, which outlives
    /// each (a `corral operator --cloud fake` replica killed takes nothing of it along, and its
    /// successor finds the interfaces and addresses it made). If the file exists, its
    /// resources replace this fake's own (they must have been made from the same
    /// `fingerprint`, e.g. the seed's text: else the file is refused, naming it); else this
    /// fake's resources are written to it.
    ///
    /// Each call then runs under an exclusive lock of `PATH.lock`, on the file's resources,
    /// and a mutating call that succeeded writes them back. What stays each process's own:
    /// the token buckets, counters, scripted faults and the random source (latencies, delays
    /// and the lag of each change are drawn by the process that makes it; times are stored as
    /// wall-clock time, so every process sees a change at the same moment).
    pub fn shared_state(
        self,
        path: &std::path::Path,
        fingerprint: &str,
    ) -> Result<FakeEc2, CloudError> {
        {
            let mut inner = self.lock();
            let inner = &mut *inner;
            let mut state = StateFile::open(path, fingerprint)?;
            let model = &mut inner.model;
            state.with_lock(|state| {
                if !state.load(model)? {
                    state.save(model)?;
                }
                Ok(())
            })?;
            inner.state = Some(state);
        }
        Ok(self)
    }

    /// One call: admission (counters, faults, bucket) on arrival, the latency, then the change
    /// at the time it lands.
    async fn call<T>(
        &self,
        action: Action,
        apply: impl FnOnce(&mut Model, &mut ChaCha8Rng, Instant) -> Result<T, CloudError>,
    ) -> Result<T, CloudError> {
        let admission = self.lock().admit(action, Instant::now());
        match admission {
            Admission::Refuse(delay, error) => {
                sleep(delay).await;
                Err(error)
            }
            Admission::Proceed {
                latency,
                fail,
                time_out,
            } => {
                sleep(latency).await;
                if let Some(error) = fail {
                    return Err(error);
                }
                let (result, timeout_after) = {
                    let mut inner = self.lock();
                    let now = Instant::now();
                    let result = inner.synced(action.is_mutating(), |model, rng| {
                        model.prune(now);
                        apply(model, rng, now)
                    });
                    (result, inner.timeout_after)
                };
                if time_out {
                    sleep(timeout_after).await;
                    return Err(CloudError::Timeout { action });
                }
                result
            }
        }
    }

    /// The counters so far.
    pub fn counters(&self) -> Counters {
        self.lock().counters.clone()
    }

    /// Resets the counters to zero.
    pub fn reset_counters(&self) {
        self.lock().counters = Counters::default();
    }

    /// The tokens left in an action's bucket now (`None`: unthrottled).
    pub fn bucket_tokens(&self, action: Action) -> Option<f64> {
        self.lock().buckets[action.index()]
            .as_mut()
            .map(|b| b.tokens(Instant::now()))
    }

    /// The next `n` calls of `action` fail with `error` and change nothing.
    pub fn fail_next(&self, action: Action, n: usize, error: CloudError) {
        if n > 0 {
            self.lock().scripted[action.index()].push_back((Fault::Fail(error), n));
        }
    }

    /// The next `n` admitted calls of `action` are applied and answer `Timeout`.
    pub fn time_out_next(&self, action: Action, n: usize) {
        if n > 0 {
            self.lock().scripted[action.index()].push_back((Fault::AppliedButTimedOut, n));
        }
    }

    /// For `duration` from now (`Duration::MAX`: for good), each call of any action is
    /// throttled with probability `fraction` (consuming no token), as when other tenants of the
    /// account drain the buckets. The fraction is clamped to 0..=1, NaN taken as 0.
    pub fn throttle_storm(&self, fraction: f64, duration: Duration) {
        let now = Instant::now();
        // A duration past what the clock can hold: a storm that outlasts any run.
        let until = now
            .checked_add(duration)
            .unwrap_or_else(|| now + 1000 * MAX_DELAY);
        self.lock().storm = Some((until, clamp_probability(fraction)));
    }

    /// Changes the random fault rates of an action (clamped to 0..=1, NaN taken as 0).
    pub fn set_fault_rates(&self, action: Action, internal_error: f64, timeout: f64) {
        let mut inner = self.lock();
        inner.internal_error_rate[action.index()] = clamp_probability(internal_error);
        inner.timeout_rate[action.index()] = clamp_probability(timeout);
    }

    /// Changes the consistency lag of describe calls from now on (each clamped to
    /// [`MAX_DELAY`]).
    pub fn set_consistency_lag(&self, mean: Duration, max: Duration) {
        self.lock().model.lag = Lag {
            mean: mean.min(MAX_DELAY),
            max: max.min(MAX_DELAY),
        };
    }

    /// Launches an instance (a test helper: no call is counted); returns its id.
    pub fn launch_instance(&self, spec: InstanceSpec) -> Result<String, CloudError> {
        self.change(|model, _, now| {
            let id = model.launch(spec.id, &spec.instance_type, &spec.subnet_id, now)?;
            model.set_state(&id, spec.state)?;
            Ok(id)
        })
    }

    /// Delegates prefixes to an instance's primary interface (device index 0) as
    /// AssignPrivateIpAddresses and AssignIpv6Addresses with prefix counts would (a seeding
    /// helper: no call is counted and no bucket drawn; describes see it after their lag like any
    /// change). IPv6 prefixes need the subnet's IPv6 CIDR.
    pub fn delegate_to_primary(
        &self,
        instance_id: &str,
        ipv4_prefixes: u32,
        ipv6_prefixes: u32,
    ) -> Result<(Ipv4Set, Ipv6Set), CloudError> {
        self.change(|model, rng, now| {
            Self::delegate(model, rng, now, instance_id, ipv4_prefixes, ipv6_prefixes)
        })
    }

    fn delegate(
        model: &mut Model,
        rng: &mut ChaCha8Rng,
        now: Instant,
        instance_id: &str,
        ipv4_prefixes: u32,
        ipv6_prefixes: u32,
    ) -> Result<(Ipv4Set, Ipv6Set), CloudError> {
        let primary = model
            .inspect_all(now)
            .into_iter()
            .find(|ni| {
                ni.attachment
                    .as_ref()
                    .is_some_and(|a| a.instance_id == instance_id && a.device_index == 0)
            })
            .ok_or_else(|| CloudError::InstanceNotFound {
                message: format!("the instance ID '{instance_id}' has no primary interface"),
            })?;
        let mut v4 = Ipv4Set::default();
        let mut v6 = Ipv6Set::default();
        if ipv4_prefixes > 0 {
            v4 = model.assign_ipv4(
                &primary.id,
                &Ipv4Assign::Prefixes(Amount::Count(ipv4_prefixes)),
                now,
                rng,
            )?;
        }
        if ipv6_prefixes > 0 {
            v6 = model.assign_ipv6(
                &primary.id,
                &Ipv6Assign::Prefixes(Amount::Count(ipv6_prefixes)),
                now,
                rng,
            )?;
        }
        Ok((v4, v6))
    }

    /// Sets an instance's state (pending, stopped, ...) with no other effect.
    pub fn set_instance_state(
        &self,
        instance_id: &str,
        state: InstanceState,
    ) -> Result<(), CloudError> {
        self.change(|model, _, _| model.set_state(instance_id, state))
    }

    /// Terminates an instance (a test helper): its delete-on-termination interfaces are
    /// deleted and their addresses freed; its other interfaces are detached, `available`.
    pub fn terminate_instance(&self, instance_id: &str) -> Result<(), CloudError> {
        self.change(|model, rng, now| model.terminate(instance_id, now, rng))
    }

    /// An interface's true state now (no lag, not counted), or `None` if it does not exist.
    pub fn interface(&self, interface_id: &str) -> Option<NetworkInterface> {
        self.read(|model| model.inspect(interface_id, Instant::now()))
    }

    /// Every existing interface's true state now.
    pub fn interfaces(&self) -> Vec<NetworkInterface> {
        self.read(|model| model.inspect_all(Instant::now()))
    }

    /// How many interfaces the fake keeps records of: the existing ones, and deleted ones until
    /// every describe call sees the deletion (then they are forgotten at the next call).
    pub fn interface_records(&self) -> usize {
        self.read(Model::records)
    }

    /// Free IPv4 addresses of a subnet now.
    pub fn subnet_free_ipv4(&self, subnet_id: &str) -> Option<u32> {
        self.read(|model| model.subnets.get(subnet_id).map(|s| s.ipv4.free()))
    }

    /// The ids of every instance.
    pub fn instance_ids(&self) -> Vec<String> {
        self.read(|model| model.instances.keys().cloned().collect())
    }

    /// An instance's state now.
    pub fn instance_state(&self, instance_id: &str) -> Option<InstanceState> {
        self.read(|model| {
            model
                .instances
                .get(instance_id)
                .map(|i: &FakeInstance| i.state)
        })
    }

    /// Whether an address of a subnet is free now (not handed out, reserved or taken by
    /// fragmentation); `None` for an unknown subnet.
    pub fn subnet_address_is_free(&self, subnet_id: &str, addr: Ipv4Addr) -> Option<bool> {
        self.read(|model| {
            let subnet = model.subnets.get(subnet_id)?;
            let mut probe = subnet.ipv4.clone();
            Some(probe.take(addr).is_ok())
        })
    }
}

impl CloudProvider for FakeEc2 {
    async fn describe_instance(&self, instance_id: &str) -> Result<Instance, CloudError> {
        self.call(Action::DescribeInstances, |model, _, now| {
            model.describe_instance(instance_id, now)
        })
        .await
    }

    async fn describe_instance_types(
        &self,
        instance_types: &[String],
    ) -> Result<Vec<InstanceTypeInfo>, CloudError> {
        self.call(Action::DescribeInstanceTypes, |model, _, _| {
            model.describe_instance_types(instance_types)
        })
        .await
    }

    async fn describe_subnets(&self, filter: &SubnetFilter) -> Result<Vec<Subnet>, CloudError> {
        self.call(Action::DescribeSubnets, |model, _, _| {
            model.describe_subnets(filter)
        })
        .await
    }

    async fn describe_interfaces(
        &self,
        filter: &InterfaceFilter,
    ) -> Result<Vec<NetworkInterface>, CloudError> {
        self.call(Action::DescribeNetworkInterfaces, |model, _, now| {
            model.describe_interfaces(filter, now)
        })
        .await
    }

    async fn create_interface(
        &self,
        request: &CreateInterface,
    ) -> Result<NetworkInterface, CloudError> {
        self.call(Action::CreateNetworkInterface, |model, rng, now| {
            model.create_interface(request, now, rng)
        })
        .await
    }

    async fn attach_interface(&self, request: AttachInterface<'_>) -> Result<String, CloudError> {
        self.call(Action::AttachNetworkInterface, |model, rng, now| {
            model.attach(request, now, rng)
        })
        .await
    }

    async fn detach_interface(&self, attachment_id: &str, force: bool) -> Result<(), CloudError> {
        self.call(Action::DetachNetworkInterface, |model, rng, now| {
            model.detach(attachment_id, force, now, rng)
        })
        .await
    }

    async fn delete_interface(&self, interface_id: &str) -> Result<(), CloudError> {
        self.call(Action::DeleteNetworkInterface, |model, rng, now| {
            model.delete(interface_id, now, rng)
        })
        .await
    }

    async fn assign_ipv4(
        &self,
        interface_id: &str,
        request: &Ipv4Assign,
    ) -> Result<Ipv4Set, CloudError> {
        self.call(Action::AssignPrivateIpAddresses, |model, rng, now| {
            model.assign_ipv4(interface_id, request, now, rng)
        })
        .await
    }

    async fn unassign_ipv4(&self, interface_id: &str, release: &Ipv4Set) -> Result<(), CloudError> {
        self.call(Action::UnassignPrivateIpAddresses, |model, rng, now| {
            model.unassign_ipv4(interface_id, release, now, rng)
        })
        .await
    }

    async fn assign_ipv6(
        &self,
        interface_id: &str,
        request: &Ipv6Assign,
    ) -> Result<Ipv6Set, CloudError> {
        self.call(Action::AssignIpv6Addresses, |model, rng, now| {
            model.assign_ipv6(interface_id, request, now, rng)
        })
        .await
    }

    async fn unassign_ipv6(&self, interface_id: &str, release: &Ipv6Set) -> Result<(), CloudError> {
        self.call(Action::UnassignIpv6Addresses, |model, rng, now| {
            model.unassign_ipv6(interface_id, release, now, rng)
        })
        .await
    }

    async fn create_tags(&self, resource_ids: &[String], tags: &Tags) -> Result<(), CloudError> {
        self.call(Action::CreateTags, |model, rng, now| {
            model.change_tags(
                resource_ids,
                &|have: &mut Tags| have.extend(tags.iter().map(|(k, v)| (k.clone(), v.clone()))),
                now,
                rng,
            )
        })
        .await
    }

    async fn delete_tags(
        &self,
        resource_ids: &[String],
        keys: &[String],
    ) -> Result<(), CloudError> {
        self.call(Action::DeleteTags, |model, rng, now| {
            model.change_tags(
                resource_ids,
                &|have: &mut Tags| have.retain(|k, _| !keys.contains(k)),
                now,
                rng,
            )
        })
        .await
    }
}

/// Keeps the trait's futures `Send` for the fake (a compile-time check).
#[allow(dead_code)]
fn assert_send(fake: &FakeEc2) -> impl Future<Output = Result<Instance, CloudError>> + Send + '_ {
    fake.describe_instance("i-0")
}
