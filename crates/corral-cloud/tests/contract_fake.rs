//! The contract suite against `FakeEc2` with EC2's defaults (latencies, attachment delays,
//! eventual consistency, token buckets), on tokio's paused clock: every check, one test each.

use crate::common;

use common::contract_fake;

use corral_cloud::contract::{self, Capabilities};

#[test]
fn the_fake_has_every_capability() {
    assert_eq!(Capabilities::EC2.checks_not_run(), Vec::<&str>::new());
}

#[tokio::test(start_paused = true)]
async fn describe_instance_and_type() {
    let (fake, fixture) = contract_fake();
    contract::describe_instance_and_type(&fake, &fixture).await;
}

#[tokio::test(start_paused = true)]
async fn describe_subnets() {
    let (fake, fixture) = contract_fake();
    contract::describe_subnets(&fake, &fixture).await;
}

#[tokio::test(start_paused = true)]
async fn interface_lifecycle() {
    let (fake, fixture) = contract_fake();
    contract::interface_lifecycle(&fake, &fixture).await;
    assert_eq!(fake.interfaces().len(), 1, "only the primary is left");
}

#[tokio::test(start_paused = true)]
async fn secondary_addresses() {
    let (fake, fixture) = contract_fake();
    contract::secondary_addresses(&fake, &fixture).await;
}

#[tokio::test(start_paused = true)]
async fn tags() {
    let (fake, fixture) = contract_fake();
    contract::tags(&fake, &fixture).await;
}

#[tokio::test(start_paused = true)]
async fn not_found_errors() {
    let (fake, fixture) = contract_fake();
    contract::not_found_errors(&fake, &fixture).await;
}

#[tokio::test(start_paused = true)]
async fn client_token_idempotent_create() {
    let (fake, fixture) = contract_fake();
    contract::client_token_idempotent_create(&fake, &fixture).await;
}

#[tokio::test(start_paused = true)]
async fn occupied_device_index_refused() {
    let (fake, fixture) = contract_fake();
    contract::occupied_device_index_refused(&fake, &fixture).await;
}

#[tokio::test(start_paused = true)]
async fn delete_attached_refused() {
    let (fake, fixture) = contract_fake();
    contract::delete_attached_refused(&fake, &fixture).await;
}

#[tokio::test(start_paused = true)]
async fn limits_attachment() {
    let (fake, fixture) = contract_fake();
    contract::limits_attachment(&fake, &fixture).await;
}

#[tokio::test(start_paused = true)]
async fn limits_addresses() {
    let (fake, fixture) = contract_fake();
    contract::limits_addresses(&fake, &fixture).await;
}

#[tokio::test(start_paused = true)]
async fn prefix_delegation_ipv4() {
    let (fake, fixture) = contract_fake();
    contract::prefix_delegation_ipv4(&fake, &fixture).await;
}

/// The suite on a fake whose describe calls lag by up to 5 s on every change, throttled hard:
/// the checks still pass because they poll and retry as real code must.
#[tokio::test(start_paused = true)]
async fn lifecycle_under_long_lag_and_a_throttle_storm() {
    let (fake, fixture) = contract_fake();
    fake.set_consistency_lag(
        std::time::Duration::from_secs(3),
        std::time::Duration::from_secs(5),
    );
    fake.throttle_storm(0.5, std::time::Duration::from_secs(30));
    contract::interface_lifecycle(&fake, &fixture).await;
    contract::secondary_addresses(&fake, &fixture).await;
    assert!(fake.counters().total_throttled() > 0);
}
