//! The cloud call scheduler at issue 14's scale targets (CLUSTER-DESIGN section 8), side by
//! side with Cilium's client limiter and with no client-side limiting, on [`FakeEc2`] with
//! EC2's buckets and latencies under tokio's paused clock: every figure is VIRTUAL time (the
//! bench runs in seconds of wall time), every run has a fixed seed.
//!
//! The fleet: m5.large instances, each with a secondary interface already attached at device
//! index 1 (made before the clock starts, then 60 s idle so EC2's buckets are full again). The
//! job: 8 spare addresses on that interface for every node, by N concurrent workers pulling
//! nodes from one queue. Two call patterns:
//!
//! * `per-node`: what a real manager does per node (corral's operator does this):
//!   DescribeInstances, DescribeNetworkInterfaces (by instance), then AssignPrivateIpAddresses
//!   of 8 — 3 calls per node, 2 of them describes;
//! * `bulk`: Cilium's own pattern: one DescribeNetworkInterfaces of the whole account (its
//!   resync), then one AssignPrivateIpAddresses of 8 per node.
//!
//! A node whose call failed (after the client's own repeats) goes back to the end of the
//! queue, as a manager's next resync would retry it. Limiters:
//!
//! * `corral`: [`Scheduled`] with [`SchedulerConfig::default`]: per-action buckets mirroring
//!   EC2's (describes 100 burst / 20 per s, assign 100 / 5), adaptive rates, 10 sends per call;
//! * `cilium`: [`SchedulerConfig::shared`]: ONE bucket for every EC2 call, 4 per s, burst 20
//!   (Cilium's operator defaults `--limit-ipam-api-qps 4`, `--limit-ipam-api-burst 20`);
//! * `unlimited`: no client-side limiting, throttled calls repeated with an AWS SDK-like
//!   backoff (3 sends, 1 s doubling to 20 s, jittered), the node requeued when they run out:
//!   the picture of many VPC CNI ipamds (or an unlimited operator) on a throttled account.
//!
//! Scenarios: `scale-out` (1,000 nodes; bound: (1000 − 100) / 5 = 180 s, the assign bucket;
//! target ≤ 1.1 × 180 = 198 s and < 1 % RequestLimitExceeded; Cilium ≥ (1000 − 20) / 4 =
//! 245 s), `burst` (150 nodes; bound 100 at once + 50 at 5 per s = 10 s; target ≤ 15 s) and
//! `storm` (the 1,000-node scale-out while EC2 answers 50 % of all calls RequestLimitExceeded
//! for the first 60 s).
//!
//! Printed per row: virtual time to done, p50 over the seeds with min and max; calls EC2
//! received (p50); RequestLimitExceeded answers (p50) and their share of the calls; the peak
//! sent rate of AssignPrivateIpAddresses and DescribeNetworkInterfaces over any 10 s window
//! starting 30 s or later (when the bursts are spent), against EC2's refill of 5 and 20 per s.
//!
//! `cargo bench -p corral-cloud --bench scheduler` (set `SCHEDULER_BENCH_SEEDS` for another
//! number of seeds than 5).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corral_cloud::fake::{Counters, InstanceSpec, SubnetSpec};
use corral_cloud::{
    Action, Amount, AttachInterface, BucketLimit, CloudError, CloudProvider, CreateInterface,
    FakeEc2, InterfaceFilter, Ipv4Assign, RetryPolicy, Scheduled, SchedulerConfig,
};
use tokio::time::Instant;

/// Gives up on a run after this much virtual time (reported as not done).
const DEADLINE: Duration = Duration::from_secs(4 * 3600);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Limiter {
    Corral,
    Cilium,
    Unlimited,
}

impl Limiter {
    fn name(self) -> &'static str {
        match self {
            Limiter::Corral => "corral",
            Limiter::Cilium => "cilium",
            Limiter::Unlimited => "unlimited",
        }
    }

    fn config(self, seed: u64) -> SchedulerConfig {
        match self {
            Limiter::Corral => SchedulerConfig::default(),
            Limiter::Cilium => SchedulerConfig::default().shared(BucketLimit {
                burst: 20,
                per_second: 4,
            }),
            Limiter::Unlimited => {
                let mut config = SchedulerConfig::default().adapt(None).retry(RetryPolicy {
                    max_attempts: 3,
                    initial_backoff: Duration::from_secs(1),
                    max_backoff: Duration::from_secs(20),
                });
                config.buckets = [None; Action::ALL.len()];
                config
            }
        }
        .seed(seed)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Pattern {
    PerNode,
    Bulk,
}

impl Pattern {
    fn name(self) -> &'static str {
        match self {
            Pattern::PerNode => "per-node",
            Pattern::Bulk => "bulk",
        }
    }
}

struct Scenario {
    name: &'static str,
    nodes: usize,
    storm: bool,
    bound: &'static str,
}

/// One run's figures.
struct Run {
    /// Virtual time to done (`None`: not done by the deadline).
    elapsed: Option<Duration>,
    calls: u64,
    throttled: u64,
    /// Peak sent rate over 10 s windows from 30 s on: assign, describe interfaces.
    peak_assign: f64,
    peak_describe: f64,
    /// Nodes requeued after a failed call.
    requeued: u64,
}

/// The fleet: `nodes` m5.large instances, each with an interface attached at device index 1,
/// EC2's buckets full again. Returns the fake and each node's instance id.
async fn fleet(nodes: usize, seed: u64) -> (FakeEc2, Vec<String>) {
    let mut builder = FakeEc2::builder().seed(seed).subnet(SubnetSpec::new(
        "subnet-a",
        "vpc-1",
        "us-east-1a",
        "10.0.0.0/16".parse().unwrap(),
    ));
    for _ in 0..nodes {
        builder = builder.instance(InstanceSpec::new("m5.large", "subnet-a"));
    }
    let ec2 = builder.build().unwrap();
    let instances = ec2.instance_ids();
    // The secondary interfaces, through corral's scheduler so EC2 does not throttle the setup.
    let setup = Scheduled::new(ec2.clone(), SchedulerConfig::default()).unwrap();
    let queue = Arc::new(Mutex::new(instances.clone()));
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let setup = setup.clone();
        let queue = Arc::clone(&queue);
        tasks.push(tokio::spawn(async move {
            loop {
                let Some(instance) = queue.lock().unwrap().pop() else {
                    return;
                };
                let eni = setup
                    .create_interface(&CreateInterface {
                        subnet_id: "subnet-a".to_owned(),
                        ..CreateInterface::default()
                    })
                    .await
                    .unwrap();
                setup
                    .attach_interface(AttachInterface::new(&eni.id, &instance, 1))
                    .await
                    .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    // Attachments complete, describes catch up, every bucket refills.
    tokio::time::sleep(Duration::from_secs(60)).await;
    ec2.reset_counters();
    (ec2, instances)
}

/// Each node's interface at device index 1, as a bulk describe sees it.
async fn bulk_describe<P: CloudProvider>(
    provider: &P,
) -> Result<Vec<(String, String)>, CloudError> {
    let all = provider
        .describe_interfaces(&InterfaceFilter::default())
        .await?;
    Ok(all
        .into_iter()
        .filter_map(|ni| {
            let attachment = ni.attachment?;
            (attachment.device_index == 1).then_some((attachment.instance_id, ni.id))
        })
        .collect())
}

/// One node's work in the per-node pattern.
async fn per_node<P: CloudProvider>(provider: &P, instance: &str) -> Result<(), CloudError> {
    provider.describe_instance(instance).await?;
    let interfaces = provider
        .describe_interfaces(&InterfaceFilter::instance(instance))
        .await?;
    let Some(eni) = interfaces
        .iter()
        .find(|ni| ni.attachment.as_ref().is_some_and(|a| a.device_index == 1))
    else {
        return Err(CloudError::InvalidParameterValue {
            message: format!("{instance} has no interface at device index 1"),
        });
    };
    provider
        .assign_ipv4(&eni.id, &Ipv4Assign::Addresses(Amount::Count(8)))
        .await?;
    Ok(())
}

/// The peak sent rate of an action over 10 s windows starting 30 s or later, from per-second
/// samples of the fake's counters.
fn peak_rate(samples: &[Counters], action: Action) -> f64 {
    (30..samples.len().saturating_sub(10))
        .map(|t| (samples[t + 10].calls(action) - samples[t].calls(action)) as f64 / 10.0)
        .fold(0.0, f64::max)
}

async fn run(
    scenario: &Scenario,
    limiter: Limiter,
    pattern: Pattern,
    workers: usize,
    seed: u64,
) -> Run {
    let (ec2, instances) = fleet(scenario.nodes, seed).await;
    let scheduler = Scheduled::new(ec2.clone(), limiter.config(seed)).unwrap();
    let start = Instant::now();
    if scenario.storm {
        ec2.throttle_storm(0.5, Duration::from_secs(60));
    }
    // Per-second samples of what EC2 received.
    let samples = Arc::new(Mutex::new(vec![ec2.counters()]));
    let sampler = {
        let ec2 = ec2.clone();
        let samples = Arc::clone(&samples);
        tokio::spawn(async move {
            let mut tick =
                tokio::time::interval_at(start + Duration::from_secs(1), Duration::from_secs(1));
            loop {
                tick.tick().await;
                samples.lock().unwrap().push(ec2.counters());
            }
        })
    };
    let work = async {
        // The bulk pattern's resync: one describe of the account, repeated until it answers.
        let known: Vec<(String, String)> = match pattern {
            Pattern::PerNode => Vec::new(),
            Pattern::Bulk => loop {
                if let Ok(known) = bulk_describe(&scheduler).await {
                    break known;
                }
            },
        };
        let queue: VecDeque<(String, Option<String>)> = instances
            .iter()
            .map(|i| {
                let eni = known
                    .iter()
                    .find(|(inst, _)| inst == i)
                    .map(|(_, eni)| eni.clone());
                (i.clone(), eni)
            })
            .collect();
        let queue = Arc::new(Mutex::new(queue));
        let requeued = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..workers {
            let scheduler = scheduler.clone();
            let queue = Arc::clone(&queue);
            let requeued = Arc::clone(&requeued);
            tasks.push(tokio::spawn(async move {
                loop {
                    let Some((instance, eni)) = queue.lock().unwrap().pop_front() else {
                        return;
                    };
                    let result = match &eni {
                        Some(eni) => scheduler
                            .assign_ipv4(eni, &Ipv4Assign::Addresses(Amount::Count(8)))
                            .await
                            .map(drop),
                        None => per_node(&scheduler, &instance).await,
                    };
                    if result.is_err() {
                        requeued.fetch_add(1, Ordering::Relaxed);
                        queue.lock().unwrap().push_back((instance, eni));
                    }
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        requeued.load(Ordering::Relaxed)
    };
    let outcome = tokio::time::timeout(DEADLINE, work).await;
    let elapsed = start.elapsed();
    sampler.abort();
    scheduler.shutdown();
    let counters = ec2.counters();
    let samples = samples.lock().unwrap();
    Run {
        elapsed: outcome.is_ok().then_some(elapsed),
        calls: counters.total_calls(),
        throttled: counters.total_throttled(),
        peak_assign: peak_rate(&samples, Action::AssignPrivateIpAddresses),
        peak_describe: peak_rate(&samples, Action::DescribeNetworkInterfaces),
        requeued: outcome.unwrap_or(0),
    }
}

fn median<T: Copy + PartialOrd>(mut values: Vec<T>) -> T {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    values[values.len() / 2]
}

fn secs(d: Option<Duration>) -> String {
    d.map_or("not done".to_owned(), |d| format!("{:.1}", d.as_secs_f64()))
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument would be the only other one.
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let seeds: u64 = std::env::var("SCHEDULER_BENCH_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5)
        .max(1);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let scenarios = [
        Scenario {
            name: "scale-out",
            nodes: 1000,
            storm: false,
            bound: "bound 180 s, target <= 198 s, < 1% RLE; Cilium >= 245 s",
        },
        Scenario {
            name: "burst",
            nodes: 150,
            storm: false,
            bound: "bound 10 s, target <= 15 s",
        },
        Scenario {
            name: "storm",
            nodes: 1000,
            storm: true,
            bound: "50% RequestLimitExceeded for the first 60 s; refill: assign 5/s, describe 20/s",
        },
    ];
    let wall = std::time::Instant::now();
    println!(
        "cloud scheduler on FakeEc2 (EC2's buckets and latencies), m5.large, 8 addresses per node, virtual time, {seeds} seeds"
    );
    for scenario in &scenarios {
        if filter
            .as_deref()
            .is_some_and(|f| !scenario.name.contains(f))
        {
            continue;
        }
        println!();
        println!(
            "{} ({} nodes): {}",
            scenario.name, scenario.nodes, scenario.bound
        );
        println!(
            "{:<10} {:<9} {:>7} {:>8} {:>8} {:>8} {:>7} {:>7} {:>6} {:>8} {:>10} {:>9}",
            "limiter",
            "pattern",
            "workers",
            "p50 s",
            "min s",
            "max s",
            "calls",
            "RLE",
            "RLE %",
            "requeued",
            "assign/s",
            "descNI/s"
        );
        for pattern in [Pattern::PerNode, Pattern::Bulk] {
            for limiter in [Limiter::Corral, Limiter::Cilium, Limiter::Unlimited] {
                for workers in [16, 50] {
                    let runs: Vec<Run> = (0..seeds)
                        .map(|seed| {
                            runtime.block_on(run(scenario, limiter, pattern, workers, seed))
                        })
                        .collect();
                    let mut times: Vec<Option<Duration>> = runs.iter().map(|r| r.elapsed).collect();
                    // Not done sorts last.
                    times.sort_by_key(|t| t.unwrap_or(Duration::MAX));
                    let calls = median(runs.iter().map(|r| r.calls).collect());
                    let throttled = median(runs.iter().map(|r| r.throttled).collect());
                    let share = median(
                        runs.iter()
                            .map(|r| 100.0 * r.throttled as f64 / r.calls.max(1) as f64)
                            .collect(),
                    );
                    println!(
                        "{:<10} {:<9} {:>7} {:>8} {:>8} {:>8} {:>7} {:>7} {:>6.2} {:>8} {:>10.1} {:>9.1}",
                        limiter.name(),
                        pattern.name(),
                        workers,
                        secs(times[times.len() / 2]),
                        secs(times[0]),
                        secs(times[times.len() - 1]),
                        calls,
                        throttled,
                        share,
                        median(runs.iter().map(|r| r.requeued).collect()),
                        median(runs.iter().map(|r| r.peak_assign).collect()),
                        median(runs.iter().map(|r| r.peak_describe).collect()),
                    );
                }
            }
        }
    }
    println!();
    println!("wall time {:.1} s", wall.elapsed().as_secs_f64());
}
