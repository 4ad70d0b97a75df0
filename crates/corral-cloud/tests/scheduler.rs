//! The cloud call scheduler (`Scheduled`) on `FakeEc2` under tokio's paused clock: alone in the
//! account it is never throttled and as fast as the buckets allow; under a throttling storm or
//! beside another tenant its sent rate stays within the refill rates; ambiguous errors are
//! repeated only for idempotent calls; waiters are served in arrival order; a shutdown releases
//! them at once.

use crate::common;

use common::{contract_fake, subnet};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use corral_cloud::fake::{InstanceSpec, SubnetSpec};
use corral_cloud::{
    Action, Amount, BucketLimit, CloudError, CloudProvider, CreateInterface, FakeEc2, Ipv4Assign,
    RetryPolicy, Scheduled, SchedulerConfig, SubnetFilter,
};
use tokio::task::JoinSet;
use tokio::time::Instant;

fn big_subnet() -> SubnetSpec {
    subnet("subnet-big", "vpc-1", "us-east-1a", "10.1.0.0/16")
}

/// A fake with EC2's buckets and latencies and `nodes` m5.large instances; returns it and the
/// primary interface of each instance.
fn account(seed: u64, nodes: usize) -> (FakeEc2, Vec<String>) {
    let fake = FakeEc2::builder()
        .seed(seed)
        .subnet(big_subnet())
        .build()
        .unwrap();
    for _ in 0..nodes {
        fake.launch_instance(InstanceSpec::new("m5.large", "subnet-big"))
            .unwrap();
    }
    let interfaces = fake.interfaces().into_iter().map(|i| i.id).collect();
    (fake, interfaces)
}

/// A fake with no latency and no buckets of its own (the scheduler's are the only limit).
fn quiet() -> FakeEc2 {
    FakeEc2::builder()
        .seed(1)
        .no_latency()
        .strongly_consistent()
        .unthrottled()
        .subnet(big_subnet())
        .instance(InstanceSpec::new("m5.large", "subnet-big").id("i-1"))
        .build()
        .unwrap()
}

/// A [`quiet`] fake behind a scheduler that makes up to three attempts of a call.
fn quiet_with_three_attempts() -> (FakeEc2, Scheduled<FakeEc2>) {
    let fake = quiet();
    let config = SchedulerConfig::default().retry(RetryPolicy {
        max_attempts: 3,
        ..RetryPolicy::default()
    });
    let scheduled = Scheduled::new(fake.clone(), config).unwrap();
    (fake, scheduled)
}

fn one_secondary() -> Ipv4Assign {
    Ipv4Assign::Addresses(Amount::Count(1))
}

/// Assigns one secondary to each interface through the scheduler, from `workers` tasks;
/// returns the errors.
async fn assign_each(
    scheduled: &Scheduled<FakeEc2>,
    interfaces: &[String],
    workers: usize,
) -> Vec<CloudError> {
    let queue = Arc::new(Mutex::new(interfaces.to_vec()));
    let mut tasks = JoinSet::new();
    for _ in 0..workers {
        let scheduled = scheduled.clone();
        let queue = Arc::clone(&queue);
        tasks.spawn(async move {
            let mut errors = Vec::new();
            loop {
                let Some(interface) = queue.lock().unwrap().pop() else {
                    return errors;
                };
                if let Err(error) = scheduled.assign_ipv4(&interface, &one_secondary()).await {
                    errors.push(error);
                }
            }
        });
    }
    let mut errors = Vec::new();
    while let Some(result) = tasks.join_next().await {
        errors.extend(result.unwrap());
    }
    errors
}

/// Samples the fake's calls of each action once a second (virtual) from now, until aborted.
fn sample_calls(
    fake: &FakeEc2,
    samples: Arc<Mutex<Vec<[u64; 14]>>>,
) -> tokio::task::JoinHandle<()> {
    let fake = fake.clone();
    tokio::spawn(async move {
        let start = Instant::now();
        let mut second = 0u32;
        loop {
            let counters = fake.counters();
            samples
                .lock()
                .unwrap()
                .push(Action::ALL.map(|action| counters.calls(action)));
            second += 1;
            tokio::time::sleep_until(start + Duration::from_secs(u64::from(second))).await;
        }
    })
}

/// The most calls of `action` the samples show in any window of whole seconds, beyond what a
/// bucket of this size allows (`burst + per_second × seconds`); 0 when the bucket was obeyed.
/// A window between samples a and b holds the calls of the closed interval of time from a to
/// b at most, so the bound holds for any order of same-instant events.
fn worst_excess(samples: &[[u64; 14]], action: Action, limit: BucketLimit) -> i64 {
    let mut worst = i64::MIN;
    for a in 0..samples.len() {
        for b in a + 1..samples.len() {
            let sent = (samples[b][action.index()] - samples[a][action.index()]) as i64;
            let allowed = i64::from(limit.burst) + i64::from(limit.per_second) * (b - a) as i64;
            worst = worst.max(sent - allowed);
        }
    }
    worst
}

/// Issue 14: 1,000 assigns from 50 workers to 1,000 interfaces, alone in the account. The
/// scheduler's buckets are EC2's, so EC2 never throttles, and the run takes what the assign
/// bucket allows: (1000 − 100) / 5 = 180 s at least, and at most 1.1 × that.
#[tokio::test(start_paused = true)]
async fn alone_in_the_account_a_thousand_assigns_are_never_throttled_and_take_the_bucket_bound() {
    let (fake, interfaces) = account(14, 1000);
    assert_eq!(interfaces.len(), 1000);
    let scheduled = Scheduled::new(fake.clone(), SchedulerConfig::default()).unwrap();
    let started = Instant::now();
    let errors = assign_each(&scheduled, &interfaces, 50).await;
    let took = started.elapsed();
    assert_eq!(errors, Vec::new());
    let counters = fake.counters();
    assert_eq!(counters.total_throttled(), 0);
    assert_eq!(counters.calls(Action::AssignPrivateIpAddresses), 1000);
    assert!(
        fake.interfaces()
            .iter()
            .all(|i| i.secondary_ipv4.len() == 1),
        "every interface got its secondary"
    );
    assert!(
        took >= Duration::from_secs(180) && took <= Duration::from_secs(198),
        "{took:?} against the bound of 180 s"
    );
    let stats = scheduled.stats();
    let assign = stats.action(Action::AssignPrivateIpAddresses);
    assert_eq!((assign.sent, assign.ok, assign.throttled), (1000, 1000, 0));
    assert_eq!(assign.retries, 0);
    // The first 100 had the burst; the other 900 waited for the refill.
    assert!(assign.waits >= 900, "{assign:?}");
    assert_eq!(assign.rate, Some(5.0));
    println!("alone: 1000 assigns in {took:?} virtual; {assign:?}");
}

/// Issue 14: a throttling storm (50 % of calls refused for 60 s, as when other tenants drain the
/// buckets): every call completes, and the calls sent per action never exceed what the bucket
/// allows in any window (burst + refill × seconds): repeats take tokens too, so no retry
/// amplification. With fixed rates the bound is tight (the scheduler sends at the refill
/// rate); with the default adaptation it sends less.
#[tokio::test(start_paused = true)]
async fn a_throttling_storm_never_raises_the_sent_rate_above_the_refill_and_every_call_completes() {
    storm_run(SchedulerConfig::default().adapt(None), "fixed").await;
    storm_run(SchedulerConfig::default(), "adaptive").await;
}

async fn storm_run(config: SchedulerConfig, name: &str) {
    let (fake, interfaces) = account(15, 500);
    let config = config.retry(RetryPolicy {
        max_attempts: 40,
        ..RetryPolicy::default()
    });
    let scheduled = Scheduled::new(fake.clone(), config).unwrap();
    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = sample_calls(&fake, Arc::clone(&samples));
    fake.throttle_storm(0.5, Duration::from_secs(60));
    let started = Instant::now();
    // Each worker describes the subnets, then assigns: two actions, two buckets (100 / 20 and
    // 100 / 5).
    let queue = Arc::new(Mutex::new(interfaces.clone()));
    let mut tasks = JoinSet::new();
    for _ in 0..50 {
        let scheduled = scheduled.clone();
        let queue = Arc::clone(&queue);
        tasks.spawn(async move {
            loop {
                let Some(interface) = queue.lock().unwrap().pop() else {
                    return;
                };
                scheduled
                    .describe_subnets(&SubnetFilter::default())
                    .await
                    .unwrap();
                scheduled
                    .assign_ipv4(&interface, &one_secondary())
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(result) = tasks.join_next().await {
        result.unwrap();
    }
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    sampler.abort();
    let samples = samples.lock().unwrap().clone();
    assert!(
        fake.interfaces()
            .iter()
            .all(|i| i.secondary_ipv4.len() == 1)
    );
    let counters = fake.counters();
    let stats = scheduled.stats();
    for action in [Action::DescribeSubnets, Action::AssignPrivateIpAddresses] {
        let excess = worst_excess(&samples, action, BucketLimit::default_for(action));
        assert!(
            excess <= 0,
            "{name}, {action}: {excess} calls above the bucket"
        );
        let ours = stats.action(action);
        assert_eq!(ours.sent, counters.calls(action), "{action}");
        assert_eq!(ours.throttled, counters.throttled(action), "{action}");
        assert_eq!(ours.ok, 500, "{action}");
        assert!(
            ours.throttled > 0 && ours.retries == ours.throttled,
            "{ours:?}"
        );
    }
    let assign = stats.action(Action::AssignPrivateIpAddresses);
    println!(
        "storm, {name}: 500 describes + 500 assigns in {took:?}; assign: {} sent, {} throttled",
        assign.sent, assign.throttled
    );
}

/// Issue 14: another tenant of the account takes 2 of the assign bucket's 5 tokens a second.
/// The scheduler cannot see it, but its throttle answers cut its rate: after the burst the
/// account's total sent rate (the tenant's calls and ours, throttled calls included) stays
/// within the refill rate but for the few throttled calls that end each climb of the adapted
/// rate (at most 3 % above it; a fixed rate is 39 % above it, see the next test).
#[tokio::test(start_paused = true)]
async fn beside_another_tenant_the_scheduler_adapts_and_the_total_stays_within_the_refill() {
    let (total, ours_throttled, ours_sent) = tenant_run(SchedulerConfig::default()).await;
    println!("adaptive: {total:?}, ours {ours_sent} sent {ours_throttled} throttled");
    assert!(total.sent * 100 <= total.allowed * 103, "{total:?}");
    assert!(
        ours_throttled * 100 <= ours_sent * 3,
        "{ours_throttled} of {ours_sent} throttled"
    );
}

/// The same without adaptation (fixed rates, a throttle answer only drains the bucket): the
/// scheduler keeps sending at the full refill rate, so the total is far above it (the
/// assertion above can fail).
#[tokio::test(start_paused = true)]
async fn without_adaptation_the_total_beside_another_tenant_exceeds_the_refill() {
    let (total, ours_throttled, ours_sent) =
        tenant_run(SchedulerConfig::default().adapt(None)).await;
    println!("fixed: {total:?}, ours {ours_sent} sent {ours_throttled} throttled");
    assert!(total.sent * 100 > total.allowed * 120, "{total:?}");
    assert!(ours_throttled * 100 > ours_sent * 10);
}

#[derive(Debug)]
struct Total {
    /// Assign calls the account received from 20 s to the end (ours and the tenant's).
    sent: u64,
    /// The refill over that time.
    allowed: u64,
}

async fn tenant_run(config: SchedulerConfig) -> (Total, u64, u64) {
    let (fake, interfaces) = account(16, 600);
    let scheduled = Scheduled::new(fake.clone(), config).unwrap();
    let tenant = {
        let fake = fake.clone();
        tokio::spawn(async move {
            // Calls on an interface that does not exist still take a token, as in EC2.
            let mut next = Instant::now();
            loop {
                let _ = fake.assign_ipv4("eni-tenant", &one_secondary()).await;
                next += Duration::from_millis(500);
                tokio::time::sleep_until(next).await;
            }
        })
    };
    let started = Instant::now();
    let watcher = {
        let fake = fake.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(20)).await;
            fake.counters().calls(Action::AssignPrivateIpAddresses)
        })
    };
    let errors = assign_each(&scheduled, &interfaces, 50).await;
    let end = started.elapsed();
    tenant.abort();
    let sent_by_end = fake.counters().calls(Action::AssignPrivateIpAddresses);
    assert_eq!(errors, Vec::new());
    assert!(end > Duration::from_secs(20), "{end:?}");
    let sent = sent_by_end - watcher.await.unwrap();
    let allowed = 5 * (end - Duration::from_secs(20)).as_secs();
    let stats = scheduled.stats();
    let assign = stats.action(Action::AssignPrivateIpAddresses);
    (Total { sent, allowed }, assign.throttled, assign.sent)
}

/// An ambiguous answer (applied, then timed out) to a create with a client token is repeated,
/// and the repeat returns the interface the first call made: exactly one interface.
#[tokio::test(start_paused = true)]
async fn an_ambiguous_create_with_a_client_token_is_repeated_and_makes_one_interface() {
    let fake = quiet();
    let scheduled = Scheduled::new(fake.clone(), SchedulerConfig::default()).unwrap();
    fake.time_out_next(Action::CreateNetworkInterface, 1);
    let request = CreateInterface {
        subnet_id: "subnet-big".to_owned(),
        client_token: Some("corral-node-1-eni-1".to_owned()),
        ..CreateInterface::default()
    };
    let created = scheduled.create_interface(&request).await.unwrap();
    let made: Vec<String> = fake
        .interfaces()
        .into_iter()
        .filter(|i| i.attachment.is_none())
        .map(|i| i.id)
        .collect();
    assert_eq!(made, vec![created.id]);
    assert_eq!(fake.counters().calls(Action::CreateNetworkInterface), 2);
    let create = scheduled
        .stats()
        .action(Action::CreateNetworkInterface)
        .clone();
    assert_eq!((create.sent, create.retries, create.ok), (2, 1, 1));
    assert_eq!(create.errors.get("Timeout"), Some(&1));
}

/// An ambiguous answer to an assign by count (or a create without a client token) goes back
/// to the caller: a blind repeat would assign twice (or make a second interface).
#[tokio::test(start_paused = true)]
async fn an_ambiguous_assign_by_count_or_create_without_a_token_is_returned_not_repeated() {
    let fake = quiet();
    let scheduled = Scheduled::new(fake.clone(), SchedulerConfig::default()).unwrap();
    let primary = fake.interfaces()[0].id.clone();
    fake.time_out_next(Action::AssignPrivateIpAddresses, 1);
    let error = scheduled
        .assign_ipv4(&primary, &Ipv4Assign::Addresses(Amount::Count(3)))
        .await
        .unwrap_err();
    assert!(matches!(error, CloudError::Timeout { .. }), "{error:?}");
    assert_eq!(fake.counters().calls(Action::AssignPrivateIpAddresses), 1);
    // It was applied: the caller reconciles by describing, and finds 3, not 6.
    assert_eq!(fake.interface(&primary).unwrap().secondary_ipv4.len(), 3);

    fake.time_out_next(Action::CreateNetworkInterface, 1);
    let error = scheduled
        .create_interface(&CreateInterface {
            subnet_id: "subnet-big".to_owned(),
            ..CreateInterface::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(error, CloudError::Timeout { .. }), "{error:?}");
    assert_eq!(fake.counters().calls(Action::CreateNetworkInterface), 1);
    let stats = scheduled.stats();
    assert_eq!(stats.total_retries(), 0);
}

/// Retryable and ambiguous answers to describes are repeated up to the attempt limit; final
/// answers are not repeated at all.
#[tokio::test(start_paused = true)]
async fn describes_are_repeated_after_5xx_up_to_the_limit_and_final_answers_never() {
    let (fake, scheduled) = quiet_with_three_attempts();
    let internal = CloudError::InternalError {
        message: "An internal error has occurred".to_owned(),
    };
    fake.fail_next(Action::DescribeSubnets, 2, internal.clone());
    assert!(
        scheduled
            .describe_subnets(&SubnetFilter::default())
            .await
            .is_ok()
    );
    assert_eq!(fake.counters().calls(Action::DescribeSubnets), 3);

    fake.fail_next(Action::DescribeSubnets, 3, internal.clone());
    assert_eq!(
        scheduled.describe_subnets(&SubnetFilter::default()).await,
        Err(internal)
    );
    assert_eq!(fake.counters().calls(Action::DescribeSubnets), 6);

    let full = fake.interfaces()[0].id.clone();
    scheduled
        .assign_ipv4(&full, &Ipv4Assign::Addresses(Amount::Count(9)))
        .await
        .unwrap();
    let error = scheduled
        .assign_ipv4(&full, &one_secondary())
        .await
        .unwrap_err();
    assert_eq!(error.code(), "PrivateIpAddressLimitExceeded");
    assert_eq!(fake.counters().calls(Action::AssignPrivateIpAddresses), 2);
    let assign = scheduled
        .stats()
        .action(Action::AssignPrivateIpAddresses)
        .clone();
    assert_eq!(assign.errors.get("PrivateIpAddressLimitExceeded"), Some(&1));
    assert_eq!(assign.failed(), 1);
}

/// The backoff doubles from 250 ms with jitter in its upper half, capped at 20 s.
#[tokio::test(start_paused = true)]
async fn repeats_back_off_exponentially_with_jitter_and_a_cap() {
    let fake = quiet();
    let scheduled = Scheduled::new(fake.clone(), SchedulerConfig::default()).unwrap();
    let throttled = CloudError::RequestLimitExceeded {
        action: Action::DescribeSubnets,
    };
    fake.fail_next(Action::DescribeSubnets, 9, throttled);
    let started = Instant::now();
    scheduled
        .describe_subnets(&SubnetFilter::default())
        .await
        .unwrap();
    let took = started.elapsed();
    // Backoffs 0.25, 0.5, 1, 2, 4, 8, 16, 20, 20 s (sum 71.75 s), each drawn from its upper
    // half; the drained bucket's refill waits hide under them.
    assert!(
        took >= Duration::from_millis(71_750 / 2) && took <= Duration::from_millis(71_750 + 1000),
        "{took:?}"
    );
    let describe = scheduled.stats().action(Action::DescribeSubnets).clone();
    assert_eq!(
        (describe.sent, describe.throttled, describe.retries),
        (10, 9, 9)
    );
}

/// Waiting callers are served in the order they arrived, whatever the action's traffic.
#[tokio::test(start_paused = true)]
async fn waiters_are_served_in_arrival_order() {
    let (_fake, scheduled) = one_describe_a_second();
    let served = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = JoinSet::new();
    for n in 0..20 {
        let scheduled = scheduled.clone();
        let served = Arc::clone(&served);
        tasks.spawn(async move {
            scheduled
                .describe_subnets(&SubnetFilter::default())
                .await
                .unwrap();
            served.lock().unwrap().push(n);
        });
        // Let it arrive and queue before the next one is spawned.
        tokio::task::yield_now().await;
    }
    let started = Instant::now();
    while let Some(result) = tasks.join_next().await {
        result.unwrap();
    }
    assert_eq!(*served.lock().unwrap(), (0..20).collect::<Vec<_>>());
    // One a second: 19 s for the 19 that waited.
    assert_eq!(started.elapsed(), Duration::from_secs(19));
    let describe = scheduled.stats().action(Action::DescribeSubnets).clone();
    assert_eq!(describe.waits, 19);
    assert_eq!(describe.waited, Duration::from_secs((1..20).sum()));
}

/// A quiet fake behind a scheduler that lets one `DescribeSubnets` a second through, no burst.
fn one_describe_a_second() -> (FakeEc2, Scheduled<FakeEc2>) {
    let fake = quiet();
    let config = SchedulerConfig::default().bucket(
        Action::DescribeSubnets,
        Some(BucketLimit {
            burst: 1,
            per_second: 1,
        }),
    );
    let scheduled = Scheduled::new(fake.clone(), config).unwrap();
    (fake, scheduled)
}

/// A caller that gives up waiting (its future dropped, as by a timeout) leaves the queue; the
/// others are served as before and no token is lost.
#[tokio::test(start_paused = true)]
async fn a_waiter_that_gives_up_leaves_the_queue() {
    let (fake, scheduled) = one_describe_a_second();
    let filter = SubnetFilter::default();
    scheduled.describe_subnets(&filter).await.unwrap();
    let started = Instant::now();
    let impatient = tokio::time::timeout(
        Duration::from_millis(500),
        scheduled.describe_subnets(&filter),
    )
    .await;
    assert!(impatient.is_err(), "gave up before its token");
    scheduled.describe_subnets(&filter).await.unwrap();
    // The next token came at 1 s, as if the impatient caller had never queued.
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert_eq!(fake.counters().calls(Action::DescribeSubnets), 2);
}

/// A shutdown releases every waiter at once with `Cancelled`, and later calls are not sent.
#[tokio::test(start_paused = true)]
async fn shutdown_releases_waiters_at_once_and_sends_nothing_more() {
    let (fake, scheduled) = one_describe_a_second();
    // One waiter in a backoff too: an idempotent call whose first answer was ambiguous
    // returns that answer (the caller must reconcile), a throttled one `Cancelled`.
    fake.fail_next(
        Action::CreateTags,
        1,
        CloudError::RequestLimitExceeded {
            action: Action::CreateTags,
        },
    );
    fake.fail_next(
        Action::DeleteTags,
        1,
        CloudError::InternalError {
            message: "m".to_owned(),
        },
    );
    let mut tasks = JoinSet::new();
    for _ in 0..10 {
        let scheduled = scheduled.clone();
        tasks.spawn(async move {
            scheduled
                .describe_subnets(&SubnetFilter::default())
                .await
                .map(|_| ())
        });
    }
    {
        let scheduled = scheduled.clone();
        tasks.spawn(async move {
            scheduled
                .create_tags(&["subnet-big".to_owned()], &Default::default())
                .await
        });
    }
    {
        let scheduled = scheduled.clone();
        tasks.spawn(async move {
            scheduled
                .delete_tags(&["subnet-big".to_owned()], &["k".to_owned()])
                .await
        });
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stopped_at = Instant::now();
    scheduled.shutdown();
    let mut results = Vec::new();
    while let Some(result) = tasks.join_next().await {
        results.push(result.unwrap());
    }
    assert_eq!(stopped_at.elapsed(), Duration::ZERO, "released at once");
    let cancelled = |action| Err(CloudError::Cancelled { action });
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
    assert_eq!(
        results
            .iter()
            .filter(|r| **r == cancelled(Action::DescribeSubnets))
            .count(),
        9
    );
    assert!(results.contains(&cancelled(Action::CreateTags)));
    assert!(results.contains(&Err(CloudError::InternalError {
        message: "m".to_owned()
    })));
    let calls = fake.counters().total_calls();
    assert_eq!(calls, 3);
    // After the shutdown nothing is sent, even with tokens to spare.
    assert_eq!(
        scheduled.describe_instance("i-1").await,
        Err(CloudError::Cancelled {
            action: Action::DescribeInstances
        })
    );
    assert_eq!(fake.counters().total_calls(), calls);
    let stats = scheduled.stats();
    assert_eq!(stats.action(Action::DescribeSubnets).cancelled, 9);
    assert_eq!(stats.action(Action::DescribeInstances).cancelled, 1);
    // The throttled create-tags was cancelled in its backoff: no repeat was sent.
    let tags = stats.action(Action::CreateTags);
    assert_eq!((tags.sent, tags.retries, tags.cancelled), (1, 0, 1));
}

/// A session (one leadership term) shares the buckets and counters; its shutdown stops only
/// it, the process-wide handle's shutdown stops every session.
#[tokio::test(start_paused = true)]
async fn a_session_stops_alone_and_with_its_parent() {
    let fake = quiet();
    let root = Scheduled::new(fake.clone(), SchedulerConfig::default()).unwrap();
    let term = root.session();
    term.describe_instance("i-1").await.unwrap();
    term.shutdown();
    assert!(term.is_shut_down() && !root.is_shut_down());
    assert!(term.describe_instance("i-1").await.is_err());
    root.describe_instance("i-1").await.unwrap();
    let next_term = root.session();
    next_term.describe_instance("i-1").await.unwrap();
    assert_eq!(root.stats().action(Action::DescribeInstances).sent, 3);
    root.shutdown();
    assert!(next_term.is_shut_down());
    assert_eq!(
        next_term.describe_instance("i-1").await,
        Err(CloudError::Cancelled {
            action: Action::DescribeInstances
        })
    );
}

/// One shared bucket for the whole API (Cilium's 4 per s, burst 20), for comparisons: 40
/// describes and 40 assigns take (80 − 20) / 4 = 15 s.
#[tokio::test(start_paused = true)]
async fn one_shared_bucket_limits_every_action_together() {
    let fake = quiet();
    let config = SchedulerConfig::default().shared(BucketLimit {
        burst: 20,
        per_second: 4,
    });
    let scheduled = Scheduled::new(fake.clone(), config).unwrap();
    let primary = fake.interfaces()[0].id.clone();
    let started = Instant::now();
    for _ in 0..40 {
        scheduled
            .describe_subnets(&SubnetFilter::default())
            .await
            .unwrap();
        scheduled
            .create_tags(std::slice::from_ref(&primary), &Default::default())
            .await
            .unwrap();
    }
    assert_eq!(started.elapsed(), Duration::from_secs(15));
}

/// A configuration out of range is a typed error.
#[test]
fn a_bad_configuration_is_refused() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let fake = quiet();
        let bad = [
            SchedulerConfig::default().bucket(
                Action::CreateTags,
                Some(BucketLimit {
                    burst: 0,
                    per_second: 5,
                }),
            ),
            SchedulerConfig::default().shared(BucketLimit {
                burst: 5,
                per_second: 0,
            }),
            SchedulerConfig::default().retry(RetryPolicy {
                max_attempts: 0,
                ..RetryPolicy::default()
            }),
            SchedulerConfig::default().retry(RetryPolicy {
                initial_backoff: Duration::from_secs(30),
                ..RetryPolicy::default()
            }),
            SchedulerConfig::default().adapt(Some(corral_cloud::AdaptPolicy {
                decrease: 1.0,
                ..Default::default()
            })),
            SchedulerConfig::default().adapt(Some(corral_cloud::AdaptPolicy {
                recovery: Duration::ZERO,
                ..Default::default()
            })),
            SchedulerConfig::default().adapt(Some(corral_cloud::AdaptPolicy {
                floor: f64::NAN,
                ..Default::default()
            })),
        ];
        for config in bad {
            let refused = Scheduled::new(fake.clone(), config.clone()).unwrap_err();
            assert!(
                matches!(refused, CloudError::InvalidParameterValue { .. }),
                "{config:?}: {refused:?}"
            );
        }
    });
}

/// The scheduler is a faithful provider: the whole contract suite passes through it, under a
/// throttling storm, and every throttle answer it met was repeated (the suite's own repeats
/// see few of them).
#[tokio::test(start_paused = true)]
async fn the_contract_suite_passes_through_the_scheduler_in_a_storm() {
    use corral_cloud::contract;
    let (fake, fixture) = contract_fake();
    let scheduled = Scheduled::new(fake.clone(), SchedulerConfig::default()).unwrap();
    fake.throttle_storm(0.3, Duration::from_secs(120));
    contract::every_check(&scheduled, &fixture).await;
    assert_eq!(fake.interfaces().len(), 1, "only the primary is left");
    let stats = scheduled.stats();
    let counters = fake.counters();
    assert!(stats.total_throttled() > 0);
    assert_eq!(stats.total_throttled(), counters.total_throttled());
    assert_eq!(stats.total_sent(), counters.total_calls());
}

/// A create with a client token that was applied but timed out, then throttled on every
/// repeat: the caller gets the ambiguous answer (it must reconcile: the interface exists), not
/// the last attempt's throttle answer, nor `Cancelled` when a shutdown ends the repeats.
#[tokio::test(start_paused = true)]
async fn an_applied_attempt_stays_ambiguous_whatever_the_later_repeats_answer() {
    let (fake, scheduled) = quiet_with_three_attempts();
    let throttled = CloudError::RequestLimitExceeded {
        action: Action::CreateNetworkInterface,
    };
    let request = CreateInterface {
        subnet_id: "subnet-big".to_owned(),
        client_token: Some("corral-node-1-eni-1".to_owned()),
        ..CreateInterface::default()
    };
    let unattached = |fake: &FakeEc2| {
        fake.interfaces()
            .into_iter()
            .filter(|i| i.attachment.is_none())
            .count()
    };
    fake.time_out_next(Action::CreateNetworkInterface, 1);
    fake.fail_next(Action::CreateNetworkInterface, 2, throttled.clone());
    let error = scheduled.create_interface(&request).await.unwrap_err();
    assert_eq!(fake.counters().calls(Action::CreateNetworkInterface), 3);
    assert_eq!(unattached(&fake), 1, "the first attempt made it");
    assert!(error.is_ambiguous(), "{error:?}");

    // The same ended by a shutdown during the backoff after a throttle answer.
    let request = CreateInterface {
        client_token: Some("corral-node-1-eni-2".to_owned()),
        ..request
    };
    fake.time_out_next(Action::CreateNetworkInterface, 1);
    fake.fail_next(Action::CreateNetworkInterface, 1, throttled);
    let call = {
        let scheduled = scheduled.clone();
        tokio::spawn(async move { scheduled.create_interface(&request).await })
    };
    // Both attempts are answered (no latency) and the call sits in its second backoff.
    while fake.counters().calls(Action::CreateNetworkInterface) < 5 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    scheduled.shutdown();
    let error = call.await.unwrap().unwrap_err();
    assert_eq!(unattached(&fake), 2, "the first attempt made it");
    assert!(error.is_ambiguous(), "{error:?}");
}

/// On the real clock, calls that find a token at once are not counted as waits (time passes
/// between arriving and taking the token, but nobody waited for it).
#[tokio::test]
async fn a_call_with_a_token_at_hand_is_no_wait_on_the_real_clock() {
    let fake = quiet();
    let scheduled = Scheduled::new(fake, SchedulerConfig::default()).unwrap();
    for _ in 0..20 {
        scheduled
            .describe_subnets(&SubnetFilter::default())
            .await
            .unwrap();
    }
    let describe = scheduled.stats().action(Action::DescribeSubnets).clone();
    assert_eq!(describe.sent, 20);
    assert_eq!((describe.waits, describe.waited), (0, Duration::ZERO));
}

/// A describe changes nothing, so an earlier ambiguous answer does not stick to it: a 5xx
/// then "not found" is "not found" (the caller reads it as gone).
#[tokio::test(start_paused = true)]
async fn a_describe_answers_its_last_attempt_after_an_earlier_5xx() {
    let fake = quiet();
    let scheduled = Scheduled::new(fake.clone(), SchedulerConfig::default()).unwrap();
    fake.fail_next(
        Action::DescribeNetworkInterfaces,
        1,
        CloudError::InternalError {
            message: "m".to_owned(),
        },
    );
    let error = scheduled
        .describe_interfaces(&corral_cloud::InterfaceFilter::id("eni-gone"))
        .await;
    assert_eq!(fake.counters().calls(Action::DescribeNetworkInterfaces), 2);
    match error {
        Err(error) => assert!(error.is_not_found(), "{error:?}"),
        Ok(found) => assert!(found.is_empty(), "{found:?}"),
    }
}
