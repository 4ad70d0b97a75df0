//! etcd's users and roles for a cluster: `corral cluster rbac` (the operator's and the
//! read-only role, and with `--enable-auth` the root user and auth itself) and `corral node
//! credentials NAME` (one node's role and user). Each role is named `corral-<cluster>-<what>`,
//! as is its user; a new user's password is a random one written to `<dir>/<user>.password`
//! (mode 0600), or the one already in that file; an existing user keeps its password. Every
//! run is idempotent and prints what it made.
//!
//! What a node may do (`node_grants`): write exactly its own keys — `nodes/<node>`,
//! `live/<node>`, `holdings/<node>` (single keys: node-1's do not cover node-10's) and every
//! key under `demand/<node>/` and `release/<node>/` — and read what its agent reads: those,
//! `owned/<node>/`, `interfaces/<node>/`, `nodeids/node/<node>`, `removals/<node>`, `config`,
//! `reassert` and `election/`. The agent reads single keys as prefixes, so node-1 may read
//! node-10's registration; it may write nothing of another node's.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use corral_cluster::{Keys, NodeName};
use corral_etcd::EtcdKv;
use corral_etcd::auth::{Access, Grant, Made, client_probe_grant};

use crate::exit::{Failure, Outcome};

/// The role (and user) name of `what` in cluster `keys`.
pub fn role_name(keys: &Keys, what: &str) -> String {
    format!("corral-{}-{what}", keys.cluster())
}

/// The operator's role: everything under the cluster's prefix.
pub fn operator_grants(keys: &Keys) -> Vec<Grant> {
    vec![
        Grant::prefix(Access::ReadWrite, keys.prefix()),
        client_probe_grant(),
    ]
}

/// The read-only role (`cluster status|check`, `node list|show`).
pub fn reader_grants(keys: &Keys) -> Vec<Grant> {
    vec![
        Grant::prefix(Access::Read, keys.prefix()),
        client_probe_grant(),
    ]
}

/// One node's role: its own keys written, what its agent reads read.
pub fn node_grants(keys: &Keys, node: &NodeName) -> Vec<Grant> {
    let mut grants = Vec::new();
    for own in [keys.node(node), keys.live(node), keys.holdings(node)] {
        grants.push(Grant::key(Access::ReadWrite, own.clone()));
        // Read as a prefix by the agent (its range end is the prefix's).
        grants.push(Grant::prefix(Access::Read, own));
    }
    for own in [
        keys.demand_of_node_prefix(node),
        keys.release_of_node_prefix(node),
    ] {
        grants.push(Grant::prefix(Access::ReadWrite, own));
    }
    for read in [
        keys.owned_prefix(node),
        keys.cloud_interfaces_of_node_prefix(node),
        keys.node_id_of_node(node),
        keys.removal(node),
        keys.config(),
        keys.reassert(),
        keys.election_prefix(),
        // Read in each demand write's transaction: the node count its pace follows.
        keys.census(),
    ] {
        grants.push(Grant::prefix(Access::Read, read));
    }
    grants.push(client_probe_grant());
    grants
}

/// `corral cluster rbac`: passwords go to `password_dir`.
pub async fn cluster_rbac(
    kv: &EtcdKv,
    keys: &Keys,
    password_dir: &Path,
    enable_auth: bool,
) -> Result<Outcome, Failure> {
    let mut out = String::new();
    for (what, grants) in [
        ("operator", operator_grants(keys)),
        ("reader", reader_grants(keys)),
    ] {
        let name = role_name(keys, what);
        role_and_user(kv, &name, &grants, password_dir, &mut out).await?;
    }
    if enable_auth {
        role_and_user(kv, "root", &[], password_dir, &mut out).await?;
        kv.enable_auth().await.map_err(Failure::Cluster)?;
        out.push_str("auth: enabled\n");
    }
    Ok(Outcome::ok(out))
}

/// `corral node credentials NAME`: the password goes to `password_dir`.
pub async fn node_credentials(
    kv: &EtcdKv,
    keys: &Keys,
    node: &NodeName,
    password_dir: &Path,
) -> Result<Outcome, Failure> {
    let name = role_name(keys, &format!("node-{node}"));
    let mut out = String::new();
    role_and_user(kv, &name, &node_grants(keys, node), password_dir, &mut out).await?;
    Ok(Outcome::ok(out))
}

/// Makes role `name` with `grants` (none for `root`, etcd's own) and user `name` with it.
async fn role_and_user(
    kv: &EtcdKv,
    name: &str,
    grants: &[Grant],
    dir: &Path,
    out: &mut String,
) -> Result<(), Failure> {
    let made = kv
        .ensure_role(name, grants)
        .await
        .map_err(Failure::Cluster)?;
    let shown: Vec<String> = grants.iter().map(Grant::to_string).collect();
    let shown = if shown.is_empty() {
        "etcd's root role".to_owned()
    } else {
        shown.join(", ")
    };
    out.push_str(&format!("role {name}: {} ({shown})\n", said(made)));
    let exists = kv.user_exists(name).await.map_err(Failure::Cluster)?;
    let file = dir.join(format!("{name}.password"));
    if exists {
        let made = kv
            .ensure_user(name, "", name)
            .await
            .map_err(Failure::Cluster)?;
        out.push_str(&format!(
            "user {name}: {} (its password is not changed)\n",
            said(made)
        ));
        return Ok(());
    }
    let password = password_for(&file)?;
    let made = kv
        .ensure_user(name, &password, name)
        .await
        .map_err(Failure::Cluster)?;
    out.push_str(&format!(
        "user {name}: {}, password in {}\n",
        said(made),
        file.display()
    ));
    Ok(())
}

fn said(made: Made) -> &'static str {
    match made {
        Made::Created => "created",
        Made::Updated => "updated",
        Made::Unchanged => "unchanged",
    }
}

/// The password in `file` (a new user's, from an earlier run), or a new random one written
/// there with mode 0600.
fn password_for(file: &Path) -> Result<String, Failure> {
    if let Ok(credentials) = corral_etcd::Credentials::from_file("", file) {
        return Ok(credentials.password);
    }
    let mut bytes = [0u8; 24];
    let read = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
    read.map_err(|source| Failure::File {
        action: "read",
        path: "/dev/urandom".into(),
        source,
    })?;
    let password: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(file)
        .and_then(|mut f| writeln!(f, "{password}"));
    written.map_err(|source| Failure::File {
        action: "write the password to",
        path: file.to_owned(),
        source,
    })?;
    Ok(password)
}
