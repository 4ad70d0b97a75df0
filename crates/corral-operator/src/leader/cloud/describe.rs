//! The cloud as the manager sees it: one node's instance and interfaces described
//! (`describe_node`, with the instance type's limits learnt once per type), and the views the
//! pure planner reads (`subnet_view`, `interface_views`: records and describes merged into
//! `corral_cluster::cloud::InterfaceView`s).
//!
//! Describes change nothing in the cloud or in etcd, so they may run before the manager's first
//! resync and while mutations wait. [`FullResync`] schedules the full describes (every interface
//! and subnet) that both the cloud node manager and the to-cloud delegations start from.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use corral_cloud::{
    CloudError, CloudProvider, InterfaceFilter, NetworkInterface, Subnet, SubnetFilter,
};
use corral_cluster::cloud::{InstanceLimits, InterfaceView, SubnetView};
use corral_cluster::{
    CloudAttachment, CloudEntry, CloudId, CloudInterfaceRecord, Family, IpNet, NodeName, Resync,
    RetryState,
};
use tokio::time::Instant;

use crate::leader::cloud::ctx::{Ctx, InstanceInfo, TAG_CLUSTER};
use crate::leader::runner::Runner;
use crate::state::Shared;

pub(super) struct Described {
    pub(super) instance: InstanceInfo,
    pub(super) limits: Option<InstanceLimits>,
    /// `None`: not described (the last full resync's are used).
    pub(super) interfaces: Option<Vec<NetworkInterface>>,
}

pub(super) async fn describe_node<K, P: CloudProvider>(
    ctx: &Ctx<K, P>,
    instance_id: &str,
    need_interfaces: bool,
    known: &BTreeMap<String, InstanceLimits>,
) -> Result<Described, CloudError> {
    let described = ctx.provider.describe_instance(instance_id).await?;
    let limits = if known.contains_key(&described.instance_type) {
        None
    } else {
        let types = ctx
            .provider
            .describe_instance_types(std::slice::from_ref(&described.instance_type))
            .await?;
        types.first().map(|t| InstanceLimits {
            max_interfaces: t.max_interfaces,
            ipv4_per_interface: t.ipv4_per_interface,
            ipv6_per_interface: t.ipv6_per_interface,
            prefix_delegation: t.prefix_delegation,
        })
    };
    let interfaces = if need_interfaces {
        Some(
            ctx.provider
                .describe_interfaces(&InterfaceFilter::instance(instance_id))
                .await?,
        )
    } else {
        None
    };
    Ok(Described {
        instance: InstanceInfo {
            instance_type: described.instance_type,
            state: described.state,
            zone: described.availability_zone,
            vpc_id: described.vpc_id,
            subnet_id: described.subnet_id,
        },
        limits,
        interfaces,
    })
}

pub(super) fn subnet_view(subnet: &Subnet, no_free_prefix: bool) -> SubnetView {
    let mut cidrs = vec![IpNet::V4(subnet.ipv4_cidr)];
    if let Some(v6) = subnet.ipv6_cidr {
        cidrs.push(IpNet::V6(v6));
    }
    SubnetView {
        id: subnet.id.clone(),
        zone: subnet.availability_zone.clone(),
        cidrs,
        free_ipv4: subnet.available_ipv4,
        tags: subnet.tags.clone(),
        no_free_prefix,
    }
}

pub(super) fn family_of(net: &IpNet) -> Family {
    match net {
        IpNet::V4(_) => Family::V4,
        IpNet::V6(_) => Family::V6,
    }
}

/// The node's interfaces as the decision sees them for one pool: recorded ones with the
/// addresses recorded (the agent serves exactly those; a describe may lag behind them), the
/// others as described. Interfaces of another pool, below the first interface index, or
/// corral's own without a record (an intent being replayed) are excluded.
pub(super) fn interface_views(
    records: &[(CloudId, CloudEntry<CloudInterfaceRecord>)],
    described: &[NetworkInterface],
    pool: &corral_cluster::PoolConfig,
    cloud: &corral_cluster::CloudPoolConfig,
    first_pool: bool,
    secondaries_only: &BTreeSet<String>,
    cluster: &str,
) -> Vec<InterfaceView> {
    let mut out = Vec::new();
    for (id, entry) in records {
        let Some(record) = &entry.record else {
            continue;
        };
        out.push(InterfaceView {
            id: id.clone(),
            device_index: record.device_index,
            subnet_id: record.subnet_id.clone(),
            managed: record.managed,
            excluded: record.pool != pool.name,
            attached: record.attachment == CloudAttachment::Attached,
            addresses: record.addresses.clone(),
            secondaries_only: secondaries_only.contains(id.as_str()),
        });
    }
    for ni in described {
        if records.iter().any(|(id, _)| id.as_str() == ni.id) {
            continue;
        }
        let Ok(id) = CloudId::new(&ni.id) else {
            continue;
        };
        let Some(attachment) = &ni.attachment else {
            continue;
        };
        let managed = ni.tags.get(TAG_CLUSTER).is_some_and(|c| c == cluster);
        let detaching = matches!(
            attachment.status,
            corral_cloud::AttachmentStatus::Detaching | corral_cloud::AttachmentStatus::Detached
        );
        out.push(InterfaceView {
            id,
            device_index: attachment.device_index,
            subnet_id: ni.subnet_id.clone(),
            managed,
            excluded: !first_pool
                || managed
                || detaching
                || attachment.device_index < cloud.first_interface_index,
            attached: attachment.status == corral_cloud::AttachmentStatus::Attached,
            addresses: ni.secondary_nets(),
            secondaries_only: secondaries_only.contains(&ni.id),
        });
    }
    out.sort_by_key(|i| i.device_index);
    out
}

/// Every interface and subnet of the cloud, as one full resync described them.
pub(crate) type CloudSnapshot = (Vec<NetworkInterface>, Vec<Subnet>);

/// A manager's full resync of its cloud view (every interface, then every subnet: two
/// describes): due at once, then every `resync` after a success and with nodeipam's backoff
/// after failures; one at a time.
pub(crate) struct FullResync {
    running: bool,
    started: Instant,
    at: Instant,
    backoff: RetryState,
}

impl FullResync {
    /// A resync due now.
    pub(crate) fn new() -> Self {
        FullResync {
            running: false,
            started: Instant::now(),
            at: Instant::now(),
            backoff: RetryState::default(),
        }
    }

    /// When the next one is due, unless one is running.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        (!self.running).then_some(self.at)
    }

    /// When the running (or last) one started.
    pub(crate) fn started(&self) -> Instant {
        self.started
    }

    /// Starts one if it is due by `now`: a task of `runner` whose result `done` wraps.
    pub(crate) fn start_if_due<D: Send + 'static, P: CloudProvider + 'static>(
        &mut self,
        now: Instant,
        runner: &mut Runner<NodeName, D>,
        provider: &Arc<P>,
        done: fn(Result<CloudSnapshot, CloudError>) -> D,
    ) {
        if self.running || self.at > now {
            return;
        }
        self.running = true;
        self.started = Instant::now();
        let provider = Arc::clone(provider);
        runner.spawn([], async move {
            let interfaces = provider
                .describe_interfaces(&InterfaceFilter::default())
                .await;
            let result = match interfaces {
                Ok(interfaces) => provider
                    .describe_subnets(&SubnetFilter::default())
                    .await
                    .map(|subnets| (interfaces, subnets)),
                Err(error) => Err(error),
            };
            done(result)
        });
    }

    /// The running one succeeded: the next comes after `timing`'s resync, `at_least` later.
    pub(crate) fn succeeded(&mut self, timing: &Resync, at_least: Duration) {
        self.running = false;
        self.at = Instant::now() + self.backoff.success(timing).max(at_least);
    }

    /// The running one failed (reported as `what`): the next comes after the backoff.
    pub(crate) fn failed(
        &mut self,
        shared: &Shared,
        what: &str,
        error: &CloudError,
        timing: &Resync,
    ) {
        self.running = false;
        // A problem until the next one succeeds (`CloudManager` resolves it).
        shared.raise("cloud", what, format!("{what}: {error}"));
        self.at = Instant::now() + self.backoff.error(timing);
    }

    /// The next one comes by `at` at the latest.
    pub(crate) fn come_back_by(&mut self, at: Instant) {
        self.at = self.at.min(at);
    }
}
