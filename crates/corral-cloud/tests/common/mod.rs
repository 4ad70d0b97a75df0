//! What corral-cloud's tests share: subnets in one line, and the fake the contract suite runs
//! against (directly, and through the scheduler).

use corral_cloud::FakeEc2;
use corral_cloud::contract::Fixture;
use corral_cloud::fake::{InstanceSpec, SubnetSpec};

/// Subnet `id` of `vpc` in `zone`, IPv4 `cidr`.
pub fn subnet(id: &str, vpc: &str, zone: &str, cidr: &str) -> SubnetSpec {
    SubnetSpec::new(id, vpc, zone, cidr.parse().unwrap())
}

/// The contract suite's account (seed 13): `subnet-a` (10.0.0.0/24) and `subnet-b`
/// (10.0.1.0/24) of `vpc-1` in two zones, the m5.large instance `i-node1` in `subnet-a`.
pub fn contract_fake() -> (FakeEc2, Fixture) {
    let fake = FakeEc2::builder()
        .seed(13)
        .subnet(subnet("subnet-a", "vpc-1", "us-east-1a", "10.0.0.0/24"))
        .subnet(subnet("subnet-b", "vpc-1", "us-east-1b", "10.0.1.0/24"))
        .instance(InstanceSpec::new("m5.large", "subnet-a").id("i-node1"))
        .build()
        .unwrap();
    (fake, Fixture::new("i-node1", "subnet-a"))
}
