//! [`CloudError`]: the errors EC2 answers that real code meets, each with EC2's error code and
//! whether retrying the same call can succeed.

use crate::Action;

/// The message EC2 puts in `InvalidParameterValue` when the device index is taken.
pub(crate) const DEVICE_INDEX_IN_USE: &str = "already has an interface attached at device index";

/// An error of a cloud call. Messages are EC2's own where it sent one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CloudError {
    /// The account's token bucket for this action is empty (HTTP 503); nothing was done.
    #[error("request limit exceeded for {action}")]
    RequestLimitExceeded {
        /// The throttled action.
        action: Action,
    },
    /// The subnet has no free address left.
    #[error("insufficient free addresses in subnet: {message}")]
    InsufficientFreeAddressesInSubnet {
        /// EC2's message.
        message: String,
    },
    /// The subnet has no free aligned block of the prefix's size (fragmentation), though it
    /// may still have single addresses.
    #[error("insufficient cidr blocks: {message}")]
    InsufficientCidrBlocks {
        /// EC2's message.
        message: String,
    },
    /// The instance has as many interfaces as its type allows.
    #[error("attachment limit exceeded: {message}")]
    AttachmentLimitExceeded {
        /// EC2's message.
        message: String,
    },
    /// The interface has as many addresses (prefixes included) as its instance type allows.
    #[error("private ip address limit exceeded: {message}")]
    PrivateIpAddressLimitExceeded {
        /// EC2's message.
        message: String,
    },
    /// The instance already has an interface at that device index (EC2 says
    /// `InvalidParameterValue`; told apart by its message).
    #[error("device index in use: {message}")]
    DeviceIndexInUse {
        /// EC2's message.
        message: String,
    },
    /// The instance is not in a state that allows the call (attach needs `running`).
    #[error("incorrect instance state: {message}")]
    IncorrectInstanceState {
        /// EC2's message.
        message: String,
    },
    /// EC2 failed internally (HTTP 500); retrying may succeed.
    #[error("internal error: {message}")]
    InternalError {
        /// EC2's message.
        message: String,
    },
    /// No such interface (or not visible yet: describes are eventually consistent).
    #[error("interface not found: {message}")]
    InterfaceNotFound {
        /// EC2's message.
        message: String,
    },
    /// No such instance.
    #[error("instance not found: {message}")]
    InstanceNotFound {
        /// EC2's message.
        message: String,
    },
    /// No such subnet.
    #[error("subnet not found: {message}")]
    SubnetNotFound {
        /// EC2's message.
        message: String,
    },
    /// No such attachment.
    #[error("attachment not found: {message}")]
    AttachmentNotFound {
        /// EC2's message.
        message: String,
    },
    /// The interface is attached, so it cannot be deleted.
    #[error("interface in use: {message}")]
    InterfaceInUse {
        /// EC2's message.
        message: String,
    },
    /// A parameter is invalid (other than an occupied device index).
    #[error("invalid parameter value: {message}")]
    InvalidParameterValue {
        /// EC2's message.
        message: String,
    },
    /// The credentials do not allow the action.
    #[error("unauthorized operation: {message}")]
    UnauthorizedOperation {
        /// EC2's message.
        message: String,
    },
    /// No answer in time: the call may or may not have been applied. Reconcile (describe)
    /// before repeating a call that has no client token.
    #[error("{action} timed out; it may or may not have been applied")]
    Timeout {
        /// The action that timed out.
        action: Action,
    },
    /// Any other EC2 error.
    #[error("{code}: {message}")]
    Other {
        /// EC2's error code.
        code: String,
        /// EC2's message.
        message: String,
    },
}

impl CloudError {
    /// EC2's error code (`RequestLimitExceeded`, `InvalidNetworkInterfaceID.NotFound`, ...);
    /// `Timeout` for a call that got no answer, and `Other` for codes not listed here (the code
    /// itself is in the variant).
    pub fn code(&self) -> &'static str {
        match self {
            CloudError::RequestLimitExceeded { .. } => "RequestLimitExceeded",
            CloudError::InsufficientFreeAddressesInSubnet { .. } => {
                "InsufficientFreeAddressesInSubnet"
            }
            CloudError::InsufficientCidrBlocks { .. } => "InsufficientCidrBlocks",
            CloudError::AttachmentLimitExceeded { .. } => "AttachmentLimitExceeded",
            CloudError::PrivateIpAddressLimitExceeded { .. } => "PrivateIpAddressLimitExceeded",
            CloudError::DeviceIndexInUse { .. } | CloudError::InvalidParameterValue { .. } => {
                "InvalidParameterValue"
            }
            CloudError::IncorrectInstanceState { .. } => "IncorrectInstanceState",
            CloudError::InternalError { .. } => "InternalError",
            CloudError::InterfaceNotFound { .. } => "InvalidNetworkInterfaceID.NotFound",
            CloudError::InstanceNotFound { .. } => "InvalidInstanceID.NotFound",
            CloudError::SubnetNotFound { .. } => "InvalidSubnetID.NotFound",
            CloudError::AttachmentNotFound { .. } => "InvalidAttachmentID.NotFound",
            CloudError::InterfaceInUse { .. } => "InvalidNetworkInterface.InUse",
            CloudError::UnauthorizedOperation { .. } => "UnauthorizedOperation",
            CloudError::Timeout { .. } => "Timeout",
            CloudError::Other { .. } => "Other",
        }
    }

    /// Whether the same call, repeated later, can succeed without anything else changing:
    /// throttling, internal errors, timeouts (after reconciling: the first call may have been
    /// applied) and an instance still `pending`.
    pub fn is_retryable(&self) -> bool {
        match self {
            CloudError::RequestLimitExceeded { .. }
            | CloudError::InternalError { .. }
            | CloudError::Timeout { .. }
            | CloudError::IncorrectInstanceState { .. } => true,
            CloudError::Other { code, .. } => matches!(
                code.as_str(),
                "ServiceUnavailable" | "Unavailable" | "InternalFailure" | "Throttling"
            ),
            _ => false,
        }
    }

    /// Whether the error says a resource does not exist (or is not visible yet).
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            CloudError::InterfaceNotFound { .. }
                | CloudError::InstanceNotFound { .. }
                | CloudError::SubnetNotFound { .. }
                | CloudError::AttachmentNotFound { .. }
        )
    }

    /// The error for an EC2 error code and message, as an adapter receives them from `action`:
    /// the one place that maps EC2's codes to variants (unknown codes become `Other`).
    pub fn from_code(action: Action, code: &str, message: impl Into<String>) -> CloudError {
        let message = message.into();
        match code {
            "RequestLimitExceeded" => CloudError::RequestLimitExceeded { action },
            "InsufficientFreeAddressesInSubnet" => {
                CloudError::InsufficientFreeAddressesInSubnet { message }
            }
            "InsufficientCidrBlocks" => CloudError::InsufficientCidrBlocks { message },
            "AttachmentLimitExceeded" => CloudError::AttachmentLimitExceeded { message },
            "PrivateIpAddressLimitExceeded" => {
                CloudError::PrivateIpAddressLimitExceeded { message }
            }
            "InvalidParameterValue" if message.contains(DEVICE_INDEX_IN_USE) => {
                CloudError::DeviceIndexInUse { message }
            }
            "InvalidParameterValue" => CloudError::InvalidParameterValue { message },
            "IncorrectInstanceState" => CloudError::IncorrectInstanceState { message },
            "InternalError" => CloudError::InternalError { message },
            "InvalidNetworkInterfaceID.NotFound" => CloudError::InterfaceNotFound { message },
            "InvalidInstanceID.NotFound" => CloudError::InstanceNotFound { message },
            "InvalidSubnetID.NotFound" => CloudError::SubnetNotFound { message },
            "InvalidAttachmentID.NotFound" => CloudError::AttachmentNotFound { message },
            "InvalidNetworkInterface.InUse" => CloudError::InterfaceInUse { message },
            "UnauthorizedOperation" => CloudError::UnauthorizedOperation { message },
            _ => CloudError::Other {
                code: code.to_owned(),
                message,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_back_to_their_variant() {
        let message = "m";
        let errors = [
            CloudError::RequestLimitExceeded {
                action: Action::CreateTags,
            },
            CloudError::InsufficientFreeAddressesInSubnet {
                message: message.into(),
            },
            CloudError::InsufficientCidrBlocks {
                message: message.into(),
            },
            CloudError::AttachmentLimitExceeded {
                message: message.into(),
            },
            CloudError::PrivateIpAddressLimitExceeded {
                message: message.into(),
            },
            CloudError::InvalidParameterValue {
                message: message.into(),
            },
            CloudError::IncorrectInstanceState {
                message: message.into(),
            },
            CloudError::InternalError {
                message: message.into(),
            },
            CloudError::InterfaceNotFound {
                message: message.into(),
            },
            CloudError::InstanceNotFound {
                message: message.into(),
            },
            CloudError::SubnetNotFound {
                message: message.into(),
            },
            CloudError::AttachmentNotFound {
                message: message.into(),
            },
            CloudError::InterfaceInUse {
                message: message.into(),
            },
            CloudError::UnauthorizedOperation {
                message: message.into(),
            },
        ];
        for error in errors {
            assert_eq!(
                CloudError::from_code(Action::CreateTags, error.code(), message),
                error
            );
        }
        let occupied = format!("Instance 'i-1' {DEVICE_INDEX_IN_USE} '1'");
        assert_eq!(
            CloudError::from_code(
                Action::AttachNetworkInterface,
                "InvalidParameterValue",
                &occupied
            ),
            CloudError::DeviceIndexInUse { message: occupied }
        );
        let other = CloudError::from_code(Action::CreateTags, "ServiceUnavailable", "busy");
        assert_eq!(other.code(), "Other");
        assert!(other.is_retryable());
        assert!(
            !CloudError::InterfaceInUse {
                message: message.into()
            }
            .is_retryable()
        );
    }
}
