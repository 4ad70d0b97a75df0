//! etcd's users and roles, as corral makes them (`corral cluster rbac`, `corral node
//! credentials`): a role is made with exactly the permissions asked (missing ones granted,
//! others revoked), a user is made once with its role (an existing user keeps its password),
//! and auth is enabled once a `root` user exists (etcd refuses it before). Every call is
//! idempotent. These are the only calls outside `corral_kv::Kv`; they need etcd's root role
//! once auth is on.

use etcd_client::{Client, Permission, PermissionType, UserAddOptions};

use crate::{EtcdKv, map_error, prefix_end};
use corral_kv::KvError;

/// What a role may do on a key or a prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    /// Read only.
    Read,
    /// Write only.
    Write,
    /// Read and write.
    ReadWrite,
}

impl Access {
    /// The name etcdctl shows.
    pub fn name(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
            Access::ReadWrite => "readwrite",
        }
    }
}

/// One permission of a role: one exact key, or every key under a prefix.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Grant {
    /// What the role may do.
    pub access: Access,
    /// The key, or the prefix.
    pub key: Vec<u8>,
    /// Whether `key` is a prefix (the range [key, the first key after the prefix)).
    pub prefix: bool,
}

impl Grant {
    /// `access` on exactly `key`.
    pub fn key(access: Access, key: impl Into<Vec<u8>>) -> Grant {
        Grant {
            access,
            key: key.into(),
            prefix: false,
        }
    }

    /// `access` on every key that starts with `prefix`.
    pub fn prefix(access: Access, prefix: impl Into<Vec<u8>>) -> Grant {
        Grant {
            access,
            key: prefix.into(),
            prefix: true,
        }
    }

    /// The range's end as etcd stores it (empty for one key).
    fn range_end(&self) -> Vec<u8> {
        if self.prefix {
            prefix_end(&self.key)
        } else {
            Vec::new()
        }
    }

    fn permission(&self) -> Permission {
        let kind = match self.access {
            Access::Read => PermissionType::Read,
            Access::Write => PermissionType::Write,
            Access::ReadWrite => PermissionType::Readwrite,
        };
        let permission = Permission::new(kind, self.key.clone());
        if self.prefix {
            permission.with_range_end(self.range_end())
        } else {
            permission
        }
    }
}

impl std::fmt::Display for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let key = String::from_utf8_lossy(&self.key)
            .escape_debug()
            .to_string();
        let star = if self.prefix { "*" } else { "" };
        write!(f, "{} {key}{star}", self.access.name())
    }
}

/// What an idempotent call found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Made {
    /// It was made now.
    Created,
    /// It was there and is now as asked.
    Updated,
    /// It was there already, as asked.
    Unchanged,
}

/// The keys every corral client reads outside the cluster's prefix: `EtcdKv`'s header read and
/// compaction probe (`\0corral/...`, keys nobody writes).
pub fn client_probe_grant() -> Grant {
    Grant::prefix(Access::Read, &b"\0corral/"[..])
}

impl EtcdKv {
    /// One member's client, the current one, authenticated.
    async fn admin(&self) -> Result<Client, KvError> {
        // The call authenticates the member's connection before handing its client over.
        self.call("auth", true, |client: Client| async move {
            Ok::<Client, etcd_client::Error>(client)
        })
        .await
        .map_err(|error| map_error(error, None))
    }

    /// Makes role `name` hold exactly `grants`.
    pub async fn ensure_role(&self, name: &str, grants: &[Grant]) -> Result<Made, KvError> {
        let client = self.admin().await?;
        let mut auth = client.auth_client();
        let existing = match auth.role_get(name).await {
            Ok(role) => Some(role.permissions()),
            Err(etcd_client::Error::GRpcStatus(status))
                if status.message().contains("role name not found") =>
            {
                None
            }
            Err(error) => return Err(map_error(error, None)),
        };
        let created = existing.is_none();
        if created {
            auth.role_add(name)
                .await
                .map_err(|error| map_error(error, None))?;
        }
        let existing = existing.unwrap_or_default();
        let mut changed = false;
        for grant in grants {
            let wanted = grant.permission();
            let present = existing.iter().any(|p| {
                p.key() == wanted.key()
                    && p.range_end() == wanted.range_end()
                    && p.get_type() == wanted.get_type()
            });
            if !present {
                auth.role_grant_permission(name, wanted)
                    .await
                    .map_err(|error| map_error(error, None))?;
                changed = true;
            }
        }
        for permission in &existing {
            let asked = grants
                .iter()
                .any(|g| g.key == permission.key() && g.range_end() == permission.range_end());
            if !asked {
                let mut options = etcd_client::RoleRevokePermissionOptions::new();
                if !permission.range_end().is_empty() {
                    options = options.with_range_end(permission.range_end());
                }
                auth.role_revoke_permission(name, permission.key(), Some(options))
                    .await
                    .map_err(|error| map_error(error, None))?;
                changed = true;
            }
        }
        Ok(match (created, changed) {
            (true, _) => Made::Created,
            (false, true) => Made::Updated,
            (false, false) => Made::Unchanged,
        })
    }

    /// Whether user `name` exists.
    pub async fn user_exists(&self, name: &str) -> Result<bool, KvError> {
        let client = self.admin().await?;
        match client.auth_client().user_get(name).await {
            Ok(_) => Ok(true),
            Err(etcd_client::Error::GRpcStatus(status))
                if status.message().contains("user name not found") =>
            {
                Ok(false)
            }
            Err(error) => Err(map_error(error, None)),
        }
    }

    /// Makes user `name` with `password` if it does not exist (an existing user keeps its
    /// password), and gives it `role`.
    pub async fn ensure_user(
        &self,
        name: &str,
        password: &str,
        role: &str,
    ) -> Result<Made, KvError> {
        let exists = self.user_exists(name).await?;
        let client = self.admin().await?;
        let mut auth = client.auth_client();
        if !exists {
            auth.user_add(name, password, Some(UserAddOptions::new()))
                .await
                .map_err(|error| map_error(error, None))?;
        }
        let roles = auth
            .user_get(name)
            .await
            .map_err(|error| map_error(error, None))?
            .roles()
            .to_vec();
        let has_role = roles.iter().any(|r| r == role);
        if !has_role {
            auth.user_grant_role(name, role)
                .await
                .map_err(|error| map_error(error, None))?;
        }
        Ok(match (exists, has_role) {
            (false, _) => Made::Created,
            (true, false) => Made::Updated,
            (true, true) => Made::Unchanged,
        })
    }

    /// Enables auth (nothing if it is on already). etcd refuses it without a `root` user
    /// that has the root role.
    pub async fn enable_auth(&self) -> Result<(), KvError> {
        let client = self.admin().await?;
        client
            .auth_client()
            .auth_enable()
            .await
            .map_err(|error| map_error(error, None))?;
        Ok(())
    }
}
