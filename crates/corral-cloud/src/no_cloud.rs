//! [`NoCloud`]: the provider of an operator that manages no cloud. It has no values, so no
//! call can be made on it: the type says "no cloud" where a provider type is needed, instead of
//! a fake standing in for one.

use crate::{
    AttachInterface, CloudError, CloudProvider, CreateInterface, Instance, InstanceTypeInfo,
    InterfaceFilter, Ipv4Assign, Ipv4Set, Ipv6Assign, Ipv6Set, NetworkInterface, Subnet,
    SubnetFilter, Tags,
};

/// No cloud account: an uninhabited type, so an operator built with it has no cloud manager
/// and every call below is unreachable by construction.
#[derive(Debug, Clone, Copy)]
pub enum NoCloud {}

impl CloudProvider for NoCloud {
    async fn describe_instance(&self, _: &str) -> Result<Instance, CloudError> {
        match *self {}
    }

    async fn describe_instance_types(
        &self,
        _: &[String],
    ) -> Result<Vec<InstanceTypeInfo>, CloudError> {
        match *self {}
    }

    async fn describe_subnets(&self, _: &SubnetFilter) -> Result<Vec<Subnet>, CloudError> {
        match *self {}
    }

    async fn describe_interfaces(
        &self,
        _: &InterfaceFilter,
    ) -> Result<Vec<NetworkInterface>, CloudError> {
        match *self {}
    }

    async fn create_interface(&self, _: &CreateInterface) -> Result<NetworkInterface, CloudError> {
        match *self {}
    }

    async fn attach_interface(&self, _: AttachInterface<'_>) -> Result<String, CloudError> {
        match *self {}
    }

    async fn detach_interface(&self, _: &str, _: bool) -> Result<(), CloudError> {
        match *self {}
    }

    async fn delete_interface(&self, _: &str) -> Result<(), CloudError> {
        match *self {}
    }

    async fn assign_ipv4(&self, _: &str, _: &Ipv4Assign) -> Result<Ipv4Set, CloudError> {
        match *self {}
    }

    async fn unassign_ipv4(&self, _: &str, _: &Ipv4Set) -> Result<(), CloudError> {
        match *self {}
    }

    async fn assign_ipv6(&self, _: &str, _: &Ipv6Assign) -> Result<Ipv6Set, CloudError> {
        match *self {}
    }

    async fn unassign_ipv6(&self, _: &str, _: &Ipv6Set) -> Result<(), CloudError> {
        match *self {}
    }

    async fn create_tags(&self, _: &[String], _: &Tags) -> Result<(), CloudError> {
        match *self {}
    }

    async fn delete_tags(&self, _: &[String], _: &[String]) -> Result<(), CloudError> {
        match *self {}
    }
}
