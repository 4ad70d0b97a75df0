//! The EC2 actions the provider trait uses: for token buckets, metrics and errors.

use std::fmt;

/// One EC2 API action (its name is the `Action=` of the query API).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    /// `DescribeInstances`.
    DescribeInstances,
    /// `DescribeInstanceTypes`.
    DescribeInstanceTypes,
    /// `DescribeSubnets`.
    DescribeSubnets,
    /// `DescribeNetworkInterfaces`.
    DescribeNetworkInterfaces,
    /// `CreateNetworkInterface`.
    CreateNetworkInterface,
    /// `AttachNetworkInterface`.
    AttachNetworkInterface,
    /// `DetachNetworkInterface`.
    DetachNetworkInterface,
    /// `DeleteNetworkInterface`.
    DeleteNetworkInterface,
    /// `AssignPrivateIpAddresses`.
    AssignPrivateIpAddresses,
    /// `UnassignPrivateIpAddresses`.
    UnassignPrivateIpAddresses,
    /// `AssignIpv6Addresses`.
    AssignIpv6Addresses,
    /// `UnassignIpv6Addresses`.
    UnassignIpv6Addresses,
    /// `CreateTags`.
    CreateTags,
    /// `DeleteTags`.
    DeleteTags,
}

impl Action {
    /// Every action, in declaration order.
    pub const ALL: [Action; 14] = [
        Action::DescribeInstances,
        Action::DescribeInstanceTypes,
        Action::DescribeSubnets,
        Action::DescribeNetworkInterfaces,
        Action::CreateNetworkInterface,
        Action::AttachNetworkInterface,
        Action::DetachNetworkInterface,
        Action::DeleteNetworkInterface,
        Action::AssignPrivateIpAddresses,
        Action::UnassignPrivateIpAddresses,
        Action::AssignIpv6Addresses,
        Action::UnassignIpv6Addresses,
        Action::CreateTags,
        Action::DeleteTags,
    ];

    /// EC2's name of the action.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::DescribeInstances => "DescribeInstances",
            Action::DescribeInstanceTypes => "DescribeInstanceTypes",
            Action::DescribeSubnets => "DescribeSubnets",
            Action::DescribeNetworkInterfaces => "DescribeNetworkInterfaces",
            Action::CreateNetworkInterface => "CreateNetworkInterface",
            Action::AttachNetworkInterface => "AttachNetworkInterface",
            Action::DetachNetworkInterface => "DetachNetworkInterface",
            Action::DeleteNetworkInterface => "DeleteNetworkInterface",
            Action::AssignPrivateIpAddresses => "AssignPrivateIpAddresses",
            Action::UnassignPrivateIpAddresses => "UnassignPrivateIpAddresses",
            Action::AssignIpv6Addresses => "AssignIpv6Addresses",
            Action::UnassignIpv6Addresses => "UnassignIpv6Addresses",
            Action::CreateTags => "CreateTags",
            Action::DeleteTags => "DeleteTags",
        }
    }

    /// Whether the action changes anything (everything but the describes).
    pub fn is_mutating(self) -> bool {
        !matches!(
            self,
            Action::DescribeInstances
                | Action::DescribeInstanceTypes
                | Action::DescribeSubnets
                | Action::DescribeNetworkInterfaces
        )
    }

    /// Whether a repeat of the action after the first call was applied changes nothing and
    /// answers the same, so it is safe to repeat after an [ambiguous](crate::CloudError::is_ambiguous)
    /// error: the describes and the tag actions. The others are not, or not always:
    /// `CreateNetworkInterface` is with a client token (the caller knows), an assign by count
    /// assigns again, and attach, detach, delete and unassign answer an error (in use, not
    /// found, not assigned) when repeated after they were applied, which the caller must read
    /// as done: reconcile by describing instead.
    pub fn is_idempotent(self) -> bool {
        !self.is_mutating() || matches!(self, Action::CreateTags | Action::DeleteTags)
    }

    /// The position of the action in [`Action::ALL`], for per-action arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_in_index_order() {
        for (position, action) in Action::ALL.iter().enumerate() {
            assert_eq!(action.index(), position, "{action}");
        }
    }

    #[test]
    fn only_describes_and_tags_are_idempotent() {
        let idempotent: Vec<Action> = Action::ALL
            .into_iter()
            .filter(|a| a.is_idempotent())
            .collect();
        assert_eq!(
            idempotent,
            vec![
                Action::DescribeInstances,
                Action::DescribeInstanceTypes,
                Action::DescribeSubnets,
                Action::DescribeNetworkInterfaces,
                Action::CreateTags,
                Action::DeleteTags,
            ]
        );
    }
}
