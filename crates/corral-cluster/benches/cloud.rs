//! Criterion benchmarks of the cloud node manager's pure decisions at issue 14's targets
//! (CLUSTER-DESIGN section 8, "watermark math": one node recompute < 1 µs; a full resync of
//! 5,000 nodes < 10 ms), beside Cilium's arithmetic on the same nodes.
//!
//! The node: an m5.large (3 interfaces of 10 IPv4 addresses, the primary at device index 0
//! not used for pods), interfaces 1 and 2 attached, holding 9 and 4 secondary addresses, the
//! agent's demand present (10 used, 3 free): it needs 5 more, and the plan is an assign of 5
//! on interface 2.
//!
//! * `plan_node/watermarks`: [`plan_node`] with Cilium's watermarks (pre-allocate 8);
//! * `plan_node/warm_targets`: [`plan_node`] with AWS VPC CNI's targets (WARM_IP_TARGET 8,
//!   MINIMUM_IP_TARGET 10);
//! * `resync_5000/corral`: one decision pass of the leader over 5,000 nodes from prepared views
//!   (per node its `interfaces/` records as the view keeps them, its demand and its open
//!   release handshakes): each node's [`InterfaceView`]s built from the records (ids, subnet
//!   and addresses copied, as the operator does), [`NodeCloudInput`], [`plan_node`], then
//!   [`serve_order`] over every node's need and excess. The nodes are a seeded mix: in need,
//!   satisfied, in excess (some with addresses marked or surrendered), at capacity;
//! * `resync_5000/cilium_arithmetic`: Cilium's per-node recompute on the same views
//!   (`calculateNeededIPs` and v1.15's `calculateExcessIPs` over the addresses counted on
//!   the node's interfaces) and its sort (`GetNodesByIPWatermarkLocked`): a lower bound of
//!   Cilium's resync, which also checks no capacity, placement or handshake.
//!
//! `cargo bench -p corral-cluster --bench cloud`

use std::collections::BTreeMap;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use corral_cluster::blocks;
use corral_cluster::cloud::{
    CloudAction, InstanceLimits, InterfaceView, NodeCloudInput, Releasing, ServeKey, SubnetView,
    plan_node, serve_order,
};
use corral_cluster::{
    CloudAttachment, CloudId, CloudInterfaceRecord, CloudPoolConfig, Family, FamilyDemand, IpNet,
    PoolName, ReleaseState, WarmTargets, Watermarks,
};
use criterion::{Criterion, criterion_group};

const NODES: usize = 5000;
const NOW_MS: u64 = 10_000_000;
const RELEASE_DELAY_MS: u64 = 180_000;

fn m5_large() -> InstanceLimits {
    InstanceLimits {
        max_interfaces: 3,
        ipv4_per_interface: 10,
        ipv6_per_interface: 10,
        prefix_delegation: true,
    }
}

fn watermarks() -> Watermarks {
    Watermarks {
        pre_allocate: 8,
        ..Watermarks::default()
    }
}

fn warm_config() -> CloudPoolConfig {
    CloudPoolConfig {
        warm: Some(WarmTargets {
            warm_ip: Some(8),
            minimum_ip: Some(10),
            ..WarmTargets::default()
        }),
        ..CloudPoolConfig::default()
    }
}

fn subnets() -> Vec<SubnetView> {
    vec![SubnetView {
        id: "subnet-a".to_owned(),
        zone: "us-east-1a".to_owned(),
        cidrs: vec!["10.0.0.0/16".parse().unwrap()],
        free_ipv4: 40_000,
        tags: BTreeMap::new(),
        no_free_prefix: false,
    }]
}

/// Address `k` of interface `device` of node `node`: 10.x.y.z, distinct per node.
fn address(node: usize, device: u32, k: u32) -> IpNet {
    let n = node as u32 * 32 + device * 10 + k;
    IpNet::from(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | n)))
}

fn record(node: usize, device: u32, held: u32) -> (CloudId, CloudInterfaceRecord) {
    let id = CloudId::new(&format!("eni-{node:08x}{device:09x}")).unwrap();
    let record = CloudInterfaceRecord {
        pool: PoolName::new("eni").unwrap(),
        instance_id: format!("i-{node:017x}"),
        device_index: device,
        subnet_id: "subnet-a".to_owned(),
        subnets: vec!["10.0.0.0/16".parse().unwrap()],
        mac: format!(
            "02:00:00:{:02x}:{:02x}:{device:02x}",
            node >> 8 & 0xff,
            node & 0xff
        ),
        primary_ipv4: None,
        addresses: (0..held).map(|k| address(node, device, k)).collect(),
        assigned_ms: Default::default(),
        attachment: CloudAttachment::Attached,
        managed: true,
        prefixes_refused_ms: None,
    };
    (id, record)
}

/// One node as the leader's view holds it.
struct Prepared {
    interfaces: Vec<(CloudId, CloudInterfaceRecord)>,
    demand: FamilyDemand,
    releasing: Vec<Releasing>,
    excess_since_ms: Option<u64>,
}

/// The worked node: interfaces 1 and 2 with 9 and 4 addresses, 10 used.
fn worked_node() -> Prepared {
    Prepared {
        interfaces: vec![record(0, 1, 9), record(0, 2, 4)],
        demand: FamilyDemand {
            used: 10,
            free: 3,
            ..FamilyDemand::default()
        },
        releasing: Vec::new(),
        excess_since_ms: None,
    }
}

/// splitmix64: a fixed, dependency-free mix for the seeded fleet.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The seeded fleet: 5,000 nodes in every state a resync meets.
fn fleet() -> Vec<Prepared> {
    (0..NODES)
        .map(|node| {
            let r = mix(node as u64);
            let one = (r % 10) as u32;
            let two = ((r >> 8) % 10) as u32;
            let mut interfaces = vec![record(node, 1, one.max(1))];
            if two > 0 {
                interfaces.push(record(node, 2, two));
            }
            let held: u64 = interfaces
                .iter()
                .map(|(_, r)| r.addresses.len() as u64)
                .sum();
            let used = (r >> 16) % (held + 1);
            // A third of the nodes with excess since long ago have handshakes open.
            let mut releasing = Vec::new();
            let mut empty = Vec::new();
            if held - used > 8 {
                let free: Vec<IpNet> = interfaces
                    .iter()
                    .flat_map(|(_, r)| r.addresses.iter().copied())
                    .rev()
                    .take((held - used) as usize)
                    .collect();
                empty = free.iter().copied().take(FamilyDemand::MAX_EMPTY).collect();
                if (r >> 24).is_multiple_of(3) {
                    releasing.push(Releasing {
                        address: free[0],
                        state: if (r >> 26).is_multiple_of(2) {
                            ReleaseState::Marked
                        } else {
                            ReleaseState::Ready
                        },
                        marked_ms: NOW_MS - 60_000,
                    });
                }
            }
            Prepared {
                interfaces,
                demand: FamilyDemand {
                    used,
                    free: held - used,
                    pending: (r >> 32) % 3,
                    empty,
                    ..FamilyDemand::default()
                },
                releasing,
                excess_since_ms: Some(NOW_MS - (r >> 40) % 400_000),
            }
        })
        .collect()
}

/// The operator's conversion of a node's records into views.
fn views(node: &Prepared, pool: &PoolName) -> Vec<InterfaceView> {
    node.interfaces
        .iter()
        .map(|(id, record)| InterfaceView {
            id: id.clone(),
            device_index: record.device_index,
            subnet_id: record.subnet_id.clone(),
            managed: record.managed,
            excluded: record.pool != *pool,
            attached: record.attachment == CloudAttachment::Attached,
            addresses: record.addresses.clone(),
            secondaries_only: false,
        })
        .collect()
}

fn input<'a>(
    node: &'a Prepared,
    interfaces: &'a [InterfaceView],
    cloud: &'a CloudPoolConfig,
    subnets: &'a [SubnetView],
) -> NodeCloudInput<'a> {
    NodeCloudInput {
        family: Family::V4,
        watermarks: watermarks(),
        cloud,
        limits: m5_large(),
        zone: "us-east-1a",
        node_subnet: "subnet-a",
        interfaces,
        subnets,
        occupied_indexes: &[0],
        demand: Some(&node.demand),
        releasing: &node.releasing,
        excess_since_ms: node.excess_since_ms,
        now_ms: NOW_MS,
        release_delay_ms: RELEASE_DELAY_MS,
    }
}

/// corral's pass: views, inputs, plans, serve order.
fn resync_corral(
    fleet: &[Prepared],
    pool: &PoolName,
    cloud: &CloudPoolConfig,
    subnets: &[SubnetView],
) -> Vec<usize> {
    let keys: Vec<ServeKey> = fleet
        .iter()
        .map(|node| {
            let interfaces = views(node, pool);
            let plan = plan_node(&input(node, &interfaces, cloud, subnets));
            ServeKey::from((plan.stats.needed, plan.stats.excess))
        })
        .collect();
    serve_order(&keys)
}

/// Cilium's arithmetic on the same views, and its sort.
fn resync_cilium(fleet: &[Prepared]) -> Vec<usize> {
    let w = watermarks();
    let mut keys: Vec<(usize, u64, u64)> = fleet
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let available = node
                .interfaces
                .iter()
                .map(|(_, r)| r.addresses.len() as u64)
                .sum();
            let used = node.demand.used;
            (
                i,
                blocks::needed(&w, available, used),
                blocks::excess_cilium_v1_15(&w, available, used),
            )
        })
        .collect();
    // GetNodesByIPWatermarkLocked: needed first, largest need first, then largest excess.
    keys.sort_unstable_by(|a, b| {
        if a.1 != 0 || b.1 != 0 {
            b.1.cmp(&a.1)
        } else {
            b.2.cmp(&a.2)
        }
    });
    keys.into_iter().map(|k| k.0).collect()
}

fn groups(c: &mut Criterion) {
    let pool = PoolName::new("eni").unwrap();
    let subnets = subnets();
    let watermark_cloud = CloudPoolConfig::default();
    let warm_cloud = warm_config();

    let node = worked_node();
    let interfaces = views(&node, &pool);
    let mut group = c.benchmark_group("plan_node");
    for (name, cloud) in [
        ("watermarks", &watermark_cloud),
        ("warm_targets", &warm_cloud),
    ] {
        let node_input = input(&node, &interfaces, cloud, &subnets);
        let plan = plan_node(&node_input);
        assert!(plan.action.is_cloud_call(), "{name}: {plan:?}");
        group.bench_function(name, |b| b.iter(|| plan_node(black_box(&node_input))));
    }
    group.finish();

    let fleet = fleet();
    // What the pass decides, for the record.
    let (mut need, mut excess, mut capacity) = (0, 0, 0);
    let mut actions = BTreeMap::new();
    for node in &fleet {
        let interfaces = views(node, &pool);
        let plan = plan_node(&input(node, &interfaces, &watermark_cloud, &subnets));
        need += usize::from(plan.stats.needed > 0);
        excess += usize::from(plan.stats.excess > 0);
        capacity += usize::from(plan.at_capacity);
        let kind = match plan.action {
            CloudAction::Nothing => "nothing",
            CloudAction::Assign { .. } => "assign",
            CloudAction::Create { .. } => "create",
            CloudAction::Mark { .. } => "mark",
            CloudAction::Unassign { .. } => "unassign",
        };
        *actions.entry(kind).or_insert(0usize) += 1;
    }
    println!(
        "resync fleet ({NODES} nodes, watermarks): {need} in need, {excess} in excess, {capacity} at capacity; actions {actions:?}"
    );
    let mut group = c.benchmark_group("resync_5000");
    group.sample_size(30);
    group.bench_function("corral", |b| {
        b.iter(|| resync_corral(black_box(&fleet), &pool, &watermark_cloud, &subnets))
    });
    group.bench_function("corral_warm_targets", |b| {
        b.iter(|| resync_corral(black_box(&fleet), &pool, &warm_cloud, &subnets))
    });
    group.bench_function("cilium_arithmetic", |b| {
        b.iter(|| resync_cilium(black_box(&fleet)))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(1000))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50);
    targets = groups
}
criterion::criterion_main!(benches);
