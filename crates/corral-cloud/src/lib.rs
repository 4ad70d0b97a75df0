//! The cloud provider as corral sees it: EC2's calls on instances, subnets and elastic network
//! interfaces (ENIs) behind one async trait, [`CloudProvider`], with typed requests, answers and
//! errors; [`Scheduled`], the call scheduler the operator's workers share (per-action token
//! buckets mirroring EC2's, retries that never raise the sent rate above the refill, a shutdown
//! for a deposed leader); and [`NoCloud`], the provider of an operator without a cloud.
//!
//! Behind features, for tests and demos only: `fake` adds `FakeEc2`, a realistic in-process
//! EC2 on tokio's clock with a seed (`corral operator --cloud fake`); `testing` adds it and
//! `contract`, the behaviour every implementation must show, run against the fake here and
//! against moto's server by `corral-aws`.
//!
//! This crate links no AWS SDK and does no network I/O: the adapter on `aws-sdk-ec2` lives in
//! `corral-aws`, which nothing else links (its build is slow).
//!
//! Every method is async and may be dropped: a dropped call, or one that answered
//! [`CloudError::Timeout`], may or may not have been applied, as with any network request.
//!
//! ```
//! use corral_cloud::fake::{InstanceSpec, SubnetSpec};
//! use corral_cloud::{Amount, AttachInterface, CloudProvider, CreateInterface, FakeEc2, Ipv4Assign};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let ec2 = FakeEc2::builder()
//!     .seed(7)
//!     .subnet(SubnetSpec::new("subnet-a", "vpc-1", "us-east-1a", "10.0.0.0/24".parse().unwrap()))
//!     .instance(InstanceSpec::new("m5.large", "subnet-a").id("i-1"))
//!     .build()
//!     .unwrap();
//! let eni = ec2
//!     .create_interface(&CreateInterface {
//!         subnet_id: "subnet-a".to_owned(),
//!         ..CreateInterface::default()
//!     })
//!     .await
//!     .unwrap();
//! ec2.attach_interface(AttachInterface::new(&eni.id, "i-1", 1)).await.unwrap();
//! let added = ec2
//!     .assign_ipv4(&eni.id, &Ipv4Assign::Addresses(Amount::Count(9)))
//!     .await
//!     .unwrap();
//! assert_eq!(added.addresses.len(), 9);
//! // m5.large: 10 addresses per interface, the primary included.
//! let refused = ec2
//!     .assign_ipv4(&eni.id, &Ipv4Assign::Addresses(Amount::Count(1)))
//!     .await
//!     .unwrap_err();
//! assert_eq!(refused.code(), "PrivateIpAddressLimitExceeded");
//! # }
//! ```

#![warn(missing_docs)]

use std::future::Future;

mod action;
mod bucket;
#[cfg(feature = "testing")]
pub mod contract;
mod error;
#[cfg(feature = "fake")]
pub mod fake;
mod no_cloud;
mod scheduler;
mod types;

pub use action::Action;
pub use bucket::BucketLimit;
pub use error::CloudError;
#[cfg(feature = "fake")]
pub use fake::FakeEc2;
pub use no_cloud::NoCloud;
pub use scheduler::{
    ActionStats, AdaptPolicy, RetryPolicy, Scheduled, SchedulerConfig, SchedulerStats,
};
pub use types::*;

/// One cloud account in one region, as EC2 presents it to a node or to the operator.
///
/// Implementations: `FakeEc2` (in-process, virtual time, seeded; feature `fake`),
/// `corral_aws::Ec2` (the official SDK), and [`NoCloud`] for no cloud at all. Methods are declared returning `impl Future + Send`, so an implementation
/// writes plain `async fn`s and callers can spawn the futures on a multi-threaded runtime.
///
/// Describe calls are eventually consistent, as EC2's are: a resource just created may be not
/// found for a while, and a change may not show yet. Mutating calls are not retried by the
/// implementation; the caller decides with [`CloudError::can_repeat`]: a throttled call can be
/// repeated, one that may have been applied ([`CloudError::is_ambiguous`]: a timeout, a 5xx)
/// only if it is idempotent, otherwise reconcile by describing first.
pub trait CloudProvider: Send + Sync {
    /// DescribeInstances for one instance: its type, state, placement and attached interfaces.
    fn describe_instance(
        &self,
        instance_id: &str,
    ) -> impl Future<Output = Result<Instance, CloudError>> + Send;

    /// DescribeInstanceTypes: the interface and address limits of each named type, in the order
    /// asked. An unknown type is `InvalidParameterValue`.
    fn describe_instance_types(
        &self,
        instance_types: &[String],
    ) -> impl Future<Output = Result<Vec<InstanceTypeInfo>, CloudError>> + Send;

    /// DescribeSubnets matching every given criterion (an empty filter matches all). Asking for
    /// an id that does not exist is `InvalidSubnetID.NotFound`, as in EC2.
    fn describe_subnets(
        &self,
        filter: &SubnetFilter,
    ) -> impl Future<Output = Result<Vec<Subnet>, CloudError>> + Send;

    /// DescribeNetworkInterfaces matching every given criterion. Asking by id for an interface
    /// that does not exist (or is not visible yet) is `InvalidNetworkInterfaceID.NotFound`;
    /// other filters simply match fewer interfaces.
    fn describe_interfaces(
        &self,
        filter: &InterfaceFilter,
    ) -> impl Future<Output = Result<Vec<NetworkInterface>, CloudError>> + Send;

    /// CreateNetworkInterface in a subnet. With a client token, a repeated request (same token,
    /// same parameters) returns the interface the first one created instead of a second one.
    fn create_interface(
        &self,
        request: &CreateInterface,
    ) -> impl Future<Output = Result<NetworkInterface, CloudError>> + Send;

    /// AttachNetworkInterface at a device index; returns the attachment id. The attachment is
    /// `attaching` for a while after the call returns.
    fn attach_interface(
        &self,
        request: AttachInterface<'_>,
    ) -> impl Future<Output = Result<String, CloudError>> + Send;

    /// DetachNetworkInterface by attachment id (`force` as EC2's `Force`). The interface is
    /// `detaching`, then `available`.
    fn detach_interface(
        &self,
        attachment_id: &str,
        force: bool,
    ) -> impl Future<Output = Result<(), CloudError>> + Send;

    /// DeleteNetworkInterface; an attached interface is `InvalidNetworkInterface.InUse`.
    fn delete_interface(
        &self,
        interface_id: &str,
    ) -> impl Future<Output = Result<(), CloudError>> + Send;

    /// AssignPrivateIpAddresses: secondary IPv4 addresses or /28 prefixes, by count or explicit.
    /// Returns what was assigned.
    fn assign_ipv4(
        &self,
        interface_id: &str,
        request: &Ipv4Assign,
    ) -> impl Future<Output = Result<Ipv4Set, CloudError>> + Send;

    /// UnassignPrivateIpAddresses: the given secondary IPv4 addresses and prefixes.
    fn unassign_ipv4(
        &self,
        interface_id: &str,
        release: &Ipv4Set,
    ) -> impl Future<Output = Result<(), CloudError>> + Send;

    /// AssignIpv6Addresses: IPv6 addresses or /80 prefixes, by count or explicit. Returns what
    /// was assigned.
    fn assign_ipv6(
        &self,
        interface_id: &str,
        request: &Ipv6Assign,
    ) -> impl Future<Output = Result<Ipv6Set, CloudError>> + Send;

    /// UnassignIpv6Addresses: the given IPv6 addresses and prefixes.
    fn unassign_ipv6(
        &self,
        interface_id: &str,
        release: &Ipv6Set,
    ) -> impl Future<Output = Result<(), CloudError>> + Send;

    /// CreateTags: sets (adds or overwrites) the tags on each resource.
    fn create_tags(
        &self,
        resource_ids: &[String],
        tags: &Tags,
    ) -> impl Future<Output = Result<(), CloudError>> + Send;

    /// DeleteTags: removes the tags with these keys from each resource (absent keys are fine).
    fn delete_tags(
        &self,
        resource_ids: &[String],
        keys: &[String],
    ) -> impl Future<Output = Result<(), CloudError>> + Send;

    /// The prefix length of a range the provider can delegate to an interface, per family
    /// (`ipv6` false: IPv4), or `None` if it takes no range of that family: the node CIDRs a
    /// `to-cloud` pool delegates must have this length. EC2's (the default, so the fake, the
    /// SDK adapter and wrappers share it): an IPv4 /28 (`Ipv4Prefixes`), an IPv6 /80
    /// (`Ipv6Prefixes`). Answered locally, no call.
    fn delegable_prefix_len(&self, ipv6: bool) -> Option<u8> {
        Some(if ipv6 { 80 } else { 28 })
    }
}

/// A shared provider is a provider: many node tasks hold one `Arc` of the same account.
impl<P: CloudProvider + ?Sized> CloudProvider for std::sync::Arc<P> {
    fn describe_instance(
        &self,
        instance_id: &str,
    ) -> impl Future<Output = Result<Instance, CloudError>> + Send {
        (**self).describe_instance(instance_id)
    }
    fn describe_instance_types(
        &self,
        instance_types: &[String],
    ) -> impl Future<Output = Result<Vec<InstanceTypeInfo>, CloudError>> + Send {
        (**self).describe_instance_types(instance_types)
    }
    fn describe_subnets(
        &self,
        filter: &SubnetFilter,
    ) -> impl Future<Output = Result<Vec<Subnet>, CloudError>> + Send {
        (**self).describe_subnets(filter)
    }
    fn describe_interfaces(
        &self,
        filter: &InterfaceFilter,
    ) -> impl Future<Output = Result<Vec<NetworkInterface>, CloudError>> + Send {
        (**self).describe_interfaces(filter)
    }
    fn create_interface(
        &self,
        request: &CreateInterface,
    ) -> impl Future<Output = Result<NetworkInterface, CloudError>> + Send {
        (**self).create_interface(request)
    }
    fn attach_interface(
        &self,
        request: AttachInterface<'_>,
    ) -> impl Future<Output = Result<String, CloudError>> + Send {
        (**self).attach_interface(request)
    }
    fn detach_interface(
        &self,
        attachment_id: &str,
        force: bool,
    ) -> impl Future<Output = Result<(), CloudError>> + Send {
        (**self).detach_interface(attachment_id, force)
    }
    fn delete_interface(
        &self,
        interface_id: &str,
    ) -> impl Future<Output = Result<(), CloudError>> + Send {
        (**self).delete_interface(interface_id)
    }
    fn assign_ipv4(
        &self,
        interface_id: &str,
        request: &Ipv4Assign,
    ) -> impl Future<Output = Result<Ipv4Set, CloudError>> + Send {
        (**self).assign_ipv4(interface_id, request)
    }
    fn unassign_ipv4(
        &self,
        interface_id: &str,
        release: &Ipv4Set,
    ) -> impl Future<Output = Result<(), CloudError>> + Send {
        (**self).unassign_ipv4(interface_id, release)
    }
    fn assign_ipv6(
        &self,
        interface_id: &str,
        request: &Ipv6Assign,
    ) -> impl Future<Output = Result<Ipv6Set, CloudError>> + Send {
        (**self).assign_ipv6(interface_id, request)
    }
    fn unassign_ipv6(
        &self,
        interface_id: &str,
        release: &Ipv6Set,
    ) -> impl Future<Output = Result<(), CloudError>> + Send {
        (**self).unassign_ipv6(interface_id, release)
    }
    fn create_tags(
        &self,
        resource_ids: &[String],
        tags: &Tags,
    ) -> impl Future<Output = Result<(), CloudError>> + Send {
        (**self).create_tags(resource_ids, tags)
    }
    fn delete_tags(
        &self,
        resource_ids: &[String],
        keys: &[String],
    ) -> impl Future<Output = Result<(), CloudError>> + Send {
        (**self).delete_tags(resource_ids, keys)
    }
    fn delegable_prefix_len(&self, ipv6: bool) -> Option<u8> {
        (**self).delegable_prefix_len(ipv6)
    }
}
