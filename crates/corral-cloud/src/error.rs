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
    /// Not sent: the [call scheduler](crate::Scheduled) was shut down (the operator lost the
    /// lead or is stopping) before the call got its token or before its repeat. Certainly not
    /// applied by this call; not retryable (the scheduler stays shut down).
    #[error("{action} not sent: the cloud call scheduler is shut down")]
    Cancelled {
        /// The action that was not sent.
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
    /// EC2's error code (`RequestLimitExceeded`, `InvalidNetworkInterfaceID.NotFound`,
    /// `InvalidIPAddress.InUse`, ...), for `Other` the code EC2 sent; `Timeout` for a call that
    /// got no answer. For logs and for matching; see [`CloudError::kind`] for a metric label.
    pub fn code(&self) -> &str {
        match self {
            CloudError::Other { code, .. } => code,
            other => other.kind(),
        }
    }

    /// The variant's code: EC2's code for the listed variants, `Timeout`, and `Other` for every
    /// code not listed. A bounded set of `'static` names, for metric labels (whose cardinality
    /// must not grow with whatever codes a server sends).
    pub fn kind(&self) -> &'static str {
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
            CloudError::Cancelled { .. } => "Cancelled",
            CloudError::Other { .. } => "Other",
        }
    }

    /// Whether the error is EC2 throttling the call (the account's bucket for the action is
    /// empty): `RequestLimitExceeded`, and `Other` codes `Throttling`, `ThrottlingException`,
    /// `RequestThrottled`. Retryable; the call scheduler also slows the action down on it.
    pub fn is_throttling(&self) -> bool {
        match self {
            CloudError::RequestLimitExceeded { .. } => true,
            CloudError::Other { code, .. } => matches!(
                code.as_str(),
                "Throttling" | "ThrottlingException" | "RequestThrottled"
            ),
            _ => false,
        }
    }

    /// Whether the same call can simply be repeated later: EC2 certainly did not apply it (it
    /// refused it before doing anything), and a later attempt may succeed without anything else
    /// changing. Per variant:
    /// - `RequestLimitExceeded` (and `Other` codes `Throttling`, `ThrottlingException`,
    ///   `RequestThrottled`): refused at the door by the token bucket; back off and repeat;
    /// - `IncorrectInstanceState`: refused by a state check (an instance still `pending`);
    /// - `Timeout`, `InternalError`, `ServiceUnavailable`, `Unavailable`, `InternalFailure`: not
    ///   retryable but [ambiguous](CloudError::is_ambiguous): the call may have been applied;
    /// - everything else (not found, limits, full subnet, bad parameters, in use,
    ///   unauthorized): repeating gives the same answer until something else changes.
    pub fn is_retryable(&self) -> bool {
        self.is_throttling() || matches!(self, CloudError::IncorrectInstanceState { .. })
    }

    /// Whether the call may have been applied although it failed: reconcile by describing
    /// before repeating it. A blind repeat of `AssignPrivateIpAddresses` by count after an
    /// applied-but-timed-out call assigns twice as many addresses, and of
    /// `CreateNetworkInterface` without a client token makes a second interface; a repeat of an
    /// idempotent call (a describe, tags, a create with the same client token) is safe, see
    /// [`CloudError::can_repeat`].
    /// - `Timeout`: no answer in time (or none at all): the request may have reached EC2;
    /// - `InternalError`, and `Other` codes `ServiceUnavailable`, `Unavailable`,
    ///   `InternalFailure`: a server-side failure (HTTP 5xx) says nothing certain about whether
    ///   the change was committed; the adapters also map an unreadable answer (which may be a
    ///   success) and a code-less 5xx from a proxy here. EC2 asks to retry them: retry after
    ///   reconciling, or with an idempotent call.
    pub fn is_ambiguous(&self) -> bool {
        match self {
            CloudError::Timeout { .. } | CloudError::InternalError { .. } => true,
            CloudError::Other { code, .. } => matches!(
                code.as_str(),
                "ServiceUnavailable" | "Unavailable" | "InternalFailure"
            ),
            _ => false,
        }
    }

    /// Whether repeating the call that failed with this error is safe and may succeed: a
    /// [retryable](CloudError::is_retryable) error, or an [ambiguous](CloudError::is_ambiguous)
    /// one when the call is `idempotent` (a repeat after the first was applied changes nothing
    /// and answers the same: describes and tags, see [`Action::is_idempotent`], and a create
    /// with a client token).
    pub fn can_repeat(&self, idempotent: bool) -> bool {
        self.is_retryable() || (idempotent && self.is_ambiguous())
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
        assert!(
            !CloudError::InterfaceInUse {
                message: message.into()
            }
            .is_retryable()
        );
    }

    /// Regression (review): `code()` answered "Other" for every unlisted code, losing EC2's.
    #[test]
    fn unlisted_codes_keep_ec2s_code_and_a_bounded_kind() {
        let in_use = CloudError::from_code(
            Action::AssignPrivateIpAddresses,
            "InvalidIPAddress.InUse",
            "Address 10.0.0.9 is in use",
        );
        assert_eq!(in_use.code(), "InvalidIPAddress.InUse");
        assert_eq!(in_use.kind(), "Other");
        assert_eq!(
            CloudError::from_code(
                Action::CreateTags,
                in_use.code(),
                "Address 10.0.0.9 is in use"
            ),
            in_use
        );
        let listed = CloudError::InterfaceNotFound {
            message: "m".into(),
        };
        assert_eq!(listed.code(), listed.kind());
        let timeout = CloudError::Timeout {
            action: Action::CreateTags,
        };
        assert_eq!((timeout.code(), timeout.kind()), ("Timeout", "Timeout"));
    }

    fn other(code: &str) -> CloudError {
        CloudError::from_code(Action::AssignPrivateIpAddresses, code, "m")
    }

    /// Regression (review): `Timeout` was retryable, so a blind retry of an applied
    /// `AssignPrivateIpAddresses(Count n)` assigned 2n.
    #[test]
    fn a_call_that_may_have_been_applied_is_ambiguous_not_retryable() {
        let message = || "m".to_owned();
        // Each class: [is_ambiguous, is_retryable, can_repeat(false), can_repeat(true)].
        let ambiguous = [true, false, false, true];
        let retryable = [false, true, true, true];
        let final_answer = [false, false, false, false];
        let cases = [
            (
                CloudError::Timeout {
                    action: Action::AssignPrivateIpAddresses,
                },
                ambiguous,
            ),
            (CloudError::InternalError { message: message() }, ambiguous),
            (other("ServiceUnavailable"), ambiguous),
            (other("Unavailable"), ambiguous),
            (other("InternalFailure"), ambiguous),
            (
                CloudError::RequestLimitExceeded {
                    action: Action::AssignPrivateIpAddresses,
                },
                retryable,
            ),
            (
                CloudError::IncorrectInstanceState { message: message() },
                retryable,
            ),
            (other("Throttling"), retryable),
            (other("ThrottlingException"), retryable),
            (other("RequestThrottled"), retryable),
            (
                CloudError::InsufficientFreeAddressesInSubnet { message: message() },
                final_answer,
            ),
            (
                CloudError::PrivateIpAddressLimitExceeded { message: message() },
                final_answer,
            ),
            (
                CloudError::InterfaceNotFound { message: message() },
                final_answer,
            ),
            (
                CloudError::InvalidParameterValue { message: message() },
                final_answer,
            ),
            (
                CloudError::UnauthorizedOperation { message: message() },
                final_answer,
            ),
            (other("InvalidIPAddress.InUse"), final_answer),
        ];
        for (error, class) in &cases {
            let seen = [
                error.is_ambiguous(),
                error.is_retryable(),
                error.can_repeat(false),
                error.can_repeat(true),
            ];
            assert_eq!(
                &seen, class,
                "{error:?}: ambiguous, retryable, repeated blindly, on an idempotent call"
            );
        }
    }
}
