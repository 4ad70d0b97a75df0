//! Prometheus metrics (text exposition format at `/metrics`), with `prometheus-client`.
//!
//! - `corral_allocation_attempts_total{outcome}` and `corral_release_attempts_total{outcome}`:
//!   every allocate / release request (API and CNI), by outcome (`ok` or the error code);
//! - `corral_request_duration_seconds{operation}`: request latency, durable answer included;
//! - `corral_addresses{scope,pool,family,state}`: `used`, `free`, `excluded`, `cooling`, read
//!   from the engines when scraped;
//! - `corral_leases_expired_total`;
//! - `corral_pool_allocations_total{pool,outcome}`: CNI ADDs on a node pool, by outcome
//!   (`ok`, `waited_ok`: after waiting for a grant, `timeout`: the wait ran out, `exhausted`,
//!   `error`);
//! - `corral_pool_available_addresses{pool,family}`: free addresses of the node scope's pools;
//! - `corral_demand_writes_total`, `corral_release_handshakes_total{outcome}` (`ready`,
//!   `refused`), `corral_surrendered_blocks`: the cluster link's block mode;
//! - `corral_cloud_frozen_addresses`, `corral_cloud_bad_records`,
//!   `corral_cloud_surrendered_addresses`: the cluster link's cloud pools;
//! - `corral_interfaces{pool}`: interfaces of each interface-backed pool;
//!   `corral_interface_addresses{pool,interface,device,state}`: an interface's addresses by
//!   state (`assigned`, `free`, `cooling`), read from the tables when scraped;
//!   `corral_interface_operations_total{pool,operation,outcome}`: `assign` (`ok`,
//!   `existing`, `exhausted`, `error`) and `unassign` (`ok`, `error`), counted by the node state;
//! - `corral_store_sync_failed`: 1 once a sync of the state's log has failed (the agent then
//!   refuses every change until it is restarted; `/healthz` answers 503), else 0.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::node;
pub use crate::node::InterfaceOutcome;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    pub outcome: String,
}

/// The cluster link's counters (registered with the agent's metrics).
#[derive(Clone, Debug, Default)]
pub struct ClusterMetrics {
    /// `demand/` writes.
    pub demand_writes: Counter,
    /// Release handshakes answered, by outcome (`ready`, `refused`).
    pub handshakes: Family<Outcome, Counter>,
    /// Blocks surrendered and not yet released by the cluster.
    pub surrendered: Gauge,
    /// Cloud addresses gone from their interface record while in use (frozen).
    pub cloud_frozen: Gauge,
    /// Cloud interface records the agent could not apply.
    pub cloud_bad_records: Gauge,
    /// Cloud addresses surrendered in a release handshake, not yet off their record.
    pub cloud_surrendered: Gauge,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Operation {
    pub operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolOutcome {
    pub pool: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolFamily {
    pub pool: String,
    pub family: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    pub pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InterfaceState {
    pub pool: String,
    pub interface: String,
    pub device: String,
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolState {
    pub scope: String,
    pub pool: String,
    pub family: String,
    pub state: String,
}

/// Every metric of the agent.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub allocations: Family<Outcome, Counter>,
    pub releases: Family<Outcome, Counter>,
    pub latency: Family<Operation, Histogram>,
    pub addresses: Family<PoolState, Gauge<f64, AtomicU64>>,
    pub leases_expired: Counter,
    pub sync_failed: Gauge,
    /// 1 while the cluster link cannot reach etcd (the agent serves from what it holds).
    pub cluster_degraded: Gauge,
    /// 1 while the node is registered in its cluster.
    pub cluster_registered: Gauge,
    /// CNI ADDs on a node pool by pool and outcome.
    pub pool_allocations: Family<PoolOutcome, Counter>,
    /// Free addresses of the node scope's pools.
    pub pool_available: Family<PoolFamily, Gauge<f64, AtomicU64>>,
    /// The cluster link's block-mode counters.
    pub cluster: ClusterMetrics,
    /// Interfaces per interface-backed pool.
    pub interfaces: Family<PoolLabel, Gauge>,
    /// Addresses per interface by state.
    pub interface_addresses: Family<InterfaceState, Gauge<f64, AtomicU64>>,
    /// Assign and unassign outcomes, counted by the node state.
    pub interface_counters: node::InterfaceCounters,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let allocations = Family::<Outcome, Counter>::default();
        let releases = Family::<Outcome, Counter>::default();
        let latency = Family::<Operation, Histogram>::new_with_constructor(|| {
            // 50 µs to ~1.6 s.
            Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
        });
        let addresses = Family::<PoolState, Gauge<f64, AtomicU64>>::default();
        let leases_expired = Counter::default();
        registry.register(
            "corral_allocation_attempts",
            "Allocation requests by outcome",
            allocations.clone(),
        );
        registry.register(
            "corral_release_attempts",
            "Release requests by outcome",
            releases.clone(),
        );
        registry.register(
            "corral_request_duration_seconds",
            "Time from request to durable answer",
            latency.clone(),
        );
        registry.register(
            "corral_addresses",
            "Addresses per scope, pool, family and state",
            addresses.clone(),
        );
        registry.register(
            "corral_leases_expired",
            "Allocations released because their lease expired",
            leases_expired.clone(),
        );
        let sync_failed = Gauge::default();
        registry.register(
            "corral_store_sync_failed",
            "1 once a sync of the state's log failed: changes are refused until a restart",
            sync_failed.clone(),
        );
        let cluster_degraded = Gauge::default();
        registry.register(
            "corral_cluster_degraded",
            "1 while the agent cannot reach etcd and serves from the grants it holds",
            cluster_degraded.clone(),
        );
        let cluster_registered = Gauge::default();
        registry.register(
            "corral_cluster_registered",
            "1 while the node is registered in its cluster (agents run with --etcd)",
            cluster_registered.clone(),
        );
        let pool_allocations = Family::<PoolOutcome, Counter>::default();
        registry.register(
            "corral_pool_allocations",
            "CNI ADDs on a pool of the node scope by pool and outcome (ok, waited_ok, timeout, \
             exhausted, error)",
            pool_allocations.clone(),
        );
        let pool_available = Family::<PoolFamily, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "corral_pool_available_addresses",
            "Free addresses of the node scope's pools by pool and family",
            pool_available.clone(),
        );
        let cluster = ClusterMetrics::default();
        registry.register(
            "corral_demand_writes",
            "Writes of the node's demand of block pools to the cluster store",
            cluster.demand_writes.clone(),
        );
        registry.register(
            "corral_release_handshakes",
            "Release handshakes of blocks answered, by outcome (ready, refused)",
            cluster.handshakes.clone(),
        );
        registry.register(
            "corral_surrendered_blocks",
            "Blocks surrendered in a release handshake whose grant the cluster has not yet deleted",
            cluster.surrendered.clone(),
        );
        registry.register(
            "corral_cloud_frozen_addresses",
            "Cloud addresses gone from their interface record while still in use: nothing new is \
             handed out from them, and they leave once free",
            cluster.cloud_frozen.clone(),
        );
        registry.register(
            "corral_cloud_bad_records",
            "Cloud interface records of the node the agent could not apply (see status problems)",
            cluster.cloud_bad_records.clone(),
        );
        registry.register(
            "corral_cloud_surrendered_addresses",
            "Cloud addresses and prefixes surrendered in a release handshake and still on their record",
            cluster.cloud_surrendered.clone(),
        );
        let interfaces = Family::<PoolLabel, Gauge>::default();
        registry.register(
            "corral_interfaces",
            "Interfaces of each interface-backed pool of the node",
            interfaces.clone(),
        );
        let interface_addresses = Family::<InterfaceState, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "corral_interface_addresses",
            "Addresses of each interface by state (assigned, free, cooling)",
            interface_addresses.clone(),
        );
        let interface_counters = node::InterfaceCounters::default();
        registry.register(
            "corral_interface_operations",
            "Assigns and unassigns on interface-backed pools by pool, operation and outcome",
            interface_counters.outcomes.clone(),
        );
        Metrics {
            registry,
            interfaces,
            interface_addresses,
            interface_counters,
            pool_allocations,
            pool_available,
            cluster,
            allocations,
            releases,
            latency,
            addresses,
            leases_expired,
            sync_failed,
            cluster_degraded,
            cluster_registered,
        }
    }
}

impl Metrics {
    /// The exposition text, with the address gauges set from `gauges`.
    pub fn render(&self, gauges: &[node::Gauge]) -> String {
        self.render_with(gauges, &[])
    }

    /// The exposition text, with the address gauges set from `gauges` and the interface
    /// gauges from `interfaces`.
    pub fn render_with(
        &self,
        gauges: &[node::Gauge],
        interfaces: &[node::InterfaceGauge],
    ) -> String {
        self.interfaces.clear();
        self.interface_addresses.clear();
        for g in interfaces {
            match &g.interface {
                None => {
                    self.interfaces
                        .get_or_create(&PoolLabel {
                            pool: g.pool.clone(),
                        })
                        .set(g.interfaces as i64);
                }
                Some((id, device)) => {
                    for (state, value) in [
                        ("assigned", g.assigned),
                        ("free", g.free),
                        ("cooling", g.cooling),
                    ] {
                        self.interface_addresses
                            .get_or_create(&InterfaceState {
                                pool: g.pool.clone(),
                                interface: id.clone(),
                                device: device.to_string(),
                                state: state.to_owned(),
                            })
                            .set(value);
                    }
                }
            }
        }
        self.addresses.clear();
        self.pool_available.clear();
        for g in gauges.iter().filter(|g| g.scope == corral_api::NODE_SCOPE) {
            self.pool_available
                .get_or_create(&PoolFamily {
                    pool: g.pool.clone(),
                    family: g.family.to_owned(),
                })
                .set(g.free);
        }
        for g in gauges {
            for (state, value) in [
                ("used", g.used),
                ("free", g.free),
                ("excluded", g.excluded),
                ("cooling", g.cooling),
            ] {
                self.addresses
                    .get_or_create(&PoolState {
                        scope: g.scope.clone(),
                        pool: g.pool.clone(),
                        family: g.family.to_owned(),
                        state: state.to_owned(),
                    })
                    .set(value);
            }
        }
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}
