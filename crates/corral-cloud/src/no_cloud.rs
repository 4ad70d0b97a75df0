//! [`NoCloud`]: the provider of an operator that manages no cloud. It has no values, so no
//! call can be made on it: the type says "no cloud" where a provider type is needed, instead of
//! a fake standing in for one.

use std::future::Future;

use crate::{
    CloudError, CloudProvider, CreateInterface, Instance, InstanceTypeInfo, InterfaceFilter,
    Ipv4Assign, Ipv4Set, Ipv6Assign, Ipv6Set, NetworkInterface, Subnet, SubnetFilter, Tags,
};

/// No cloud account: an uninhabited type, so an operator built with it has no cloud manager
/// and every call below is unreachable by construction.
#[derive(Debug, Clone, Copy)]
pub enum NoCloud {}

impl CloudProvider for NoCloud {
    fn describe_instance(
        &self,
        _: &str,
    ) -> impl Future<Output = Result<Instance, CloudError>> + Send {
        async move { match *self {} }
    }

    fn describe_instance_types(
        &self,
        _: &[String],
    ) -> impl Future<Output = Result<Vec<InstanceTypeInfo>, CloudError>> + Send {
        async move { match *self {} }
    }

    fn describe_subnets(
        &self,
        _: &SubnetFilter,
    ) -> impl Future<Output = Result<Vec<Subnet>, CloudError>> + Send {
        async move { match *self {} }
    }

    fn describe_interfaces(
        &self,
        _: &InterfaceFilter,
    ) -> impl Future<Output = Result<Vec<NetworkInterface>, CloudError>> + Send {
        async move { match *self {} }
    }

    fn create_interface(
        &self,
        _: &CreateInterface,
    ) -> impl Future<Output = Result<NetworkInterface, CloudError>> + Send {
        async move { match *self {} }
    }

    fn attach_interface(
        &self,
        _: &str,
        _: &str,
        _: u32,
    ) -> impl Future<Output = Result<String, CloudError>> + Send {
        async move { match *self {} }
    }

    fn detach_interface(
        &self,
        _: &str,
        _: bool,
    ) -> impl Future<Output = Result<(), CloudError>> + Send {
        async move { match *self {} }
    }

    fn delete_interface(&self, _: &str) -> impl Future<Output = Result<(), CloudError>> + Send {
        async move { match *self {} }
    }

    fn assign_ipv4(
        &self,
        _: &str,
        _: &Ipv4Assign,
    ) -> impl Future<Output = Result<Ipv4Set, CloudError>> + Send {
        async move { match *self {} }
    }

    fn unassign_ipv4(
        &self,
        _: &str,
        _: &Ipv4Set,
    ) -> impl Future<Output = Result<(), CloudError>> + Send {
        async move { match *self {} }
    }

    fn assign_ipv6(
        &self,
        _: &str,
        _: &Ipv6Assign,
    ) -> impl Future<Output = Result<Ipv6Set, CloudError>> + Send {
        async move { match *self {} }
    }

    fn unassign_ipv6(
        &self,
        _: &str,
        _: &Ipv6Set,
    ) -> impl Future<Output = Result<(), CloudError>> + Send {
        async move { match *self {} }
    }

    fn create_tags(
        &self,
        _: &[String],
        _: &Tags,
    ) -> impl Future<Output = Result<(), CloudError>> + Send {
        async move { match *self {} }
    }

    fn delete_tags(
        &self,
        _: &[String],
        _: &[String],
    ) -> impl Future<Output = Result<(), CloudError>> + Send {
        async move { match *self {} }
    }
}
