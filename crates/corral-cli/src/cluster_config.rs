//! `corral cluster init|apply` and the view `status` reads: the configuration in force decided as the leader decides it (`ClusterView::for_read`, then every key, then the stored `config` judged by `ClusterConfig::check_install` against `config-applied` and the grants).
//!
//! `apply` holds a new configuration to the same rule against the configuration in force and
//! the grants held now, so it never frees held space (a reserved range over a grant is
//! refused, naming the grants). A stored configuration that cannot be read is replaced only
//! with `--force`, which still checks the grants.

use corral_cluster::{ClusterConfig, ClusterView, Keys, SchemaRecord, encode_value, is_config_key};
use corral_etcd::EtcdKv;
use corral_kv::{Compare, KeyValue, Kv, Txn, TxnOp};

use super::{kv_failure, read_cluster};
use crate::exit::{Failure, Outcome};

/// Everything under the cluster's prefix at one revision, as the leader's full read sees it.
pub(super) struct Read {
    pub view: Result<ClusterView, String>,
    pub revision: i64,
    /// The `config` key's value and mod revision.
    pub stored: Option<(Vec<u8>, i64)>,
}

pub(super) async fn read(kv: &EtcdKv, keys: &Keys) -> Result<Read, Failure> {
    let (all, revision) = read_cluster(kv, keys).await?;
    let value_of = |key: &str| {
        all.iter()
            .find(|e| e.key == key.as_bytes())
            .map(|e| (e.value.clone(), e.mod_revision))
    };
    let stored = value_of(&keys.config());
    let applied = value_of(&keys.config_applied());
    let mut view = ClusterView::for_read(
        keys.clone(),
        stored.as_ref().map(|(v, _)| v.as_slice()),
        applied.as_ref().map(|(v, _)| v.as_slice()),
    );
    if let Ok(view) = &mut view {
        apply_all(view, keys, &all);
        view.finish_read(stored.as_ref().map(|(v, r)| (v.as_slice(), *r)));
    }
    Ok(Read {
        view,
        revision,
        stored,
    })
}

/// Applies to `view` every key read but the configuration's, which the view was made from.
fn apply_all(view: &mut ClusterView, keys: &Keys, all: &[KeyValue]) {
    for entry in all {
        let key = entry.key_str();
        if !is_config_key(keys, &key) {
            view.apply_put(
                &key,
                &entry.value,
                entry.create_revision,
                entry.mod_revision,
            );
        }
    }
}

/// The view `status` and `node` show: the configuration in force, the refusal of a stored one
/// among its problems. No configuration at all is refused (exit 1), naming the cluster.
pub(super) async fn read_view(
    kv: &EtcdKv,
    keys: &Keys,
    cluster: &str,
) -> Result<(ClusterView, i64), Failure> {
    let read = read(kv, keys).await?;
    match read.view {
        Ok(view) => Ok((view, read.revision)),
        Err(_) if read.stored.is_none() => Err(no_configuration(cluster)),
        Err(problem) => Err(Failure::Refused(problem)),
    }
}

/// The refusal of a command on a cluster without a configuration (a typo in `--cluster`).
pub(super) fn no_configuration(cluster: &str) -> Failure {
    Failure::Refused(format!(
        "cluster {cluster} has no configuration (is --cluster right? `corral cluster init` \
         writes one)"
    ))
}

/// Writes `config` as `cluster init` (`init`) or `cluster apply` (`--force`: also over a
/// stored configuration that cannot be read).
pub(super) async fn write(
    kv: &EtcdKv,
    keys: &Keys,
    cluster: &str,
    config: &ClusterConfig,
    init: bool,
    force: bool,
) -> Result<Outcome, Failure> {
    let value = config
        .to_json()
        .map_err(|e| Failure::Usage(e.to_string()))?;
    let read = read(kv, keys).await?;
    let config_key = keys.config();
    let stored_reads = read
        .stored
        .as_ref()
        .map(|(v, _)| ClusterConfig::from_json(v));
    let compare = match (&read.stored, init) {
        (Some(_), true) => {
            return Err(Failure::Refused(format!(
                "cluster {cluster} already has a configuration (use `corral cluster apply`)"
            )));
        }
        (None, false) => {
            return Err(Failure::Refused(format!(
                "cluster {cluster} has no configuration yet (use `corral cluster init`)"
            )));
        }
        (None, true) => Compare::absent(config_key.clone()),
        (Some((_, revision)), false) => Compare::modified_at(config_key.clone(), *revision),
    };
    if let Some(Err(error)) = &stored_reads
        && !force
    {
        return Err(Failure::Refused(format!(
            "the stored configuration cannot be read: {error} (`corral cluster apply --force` \
             replaces it, still checked against what nodes hold)"
        )));
    }
    // The configuration in force, if any (the view's, unless none was ever installed and the
    // stored one does not fit the grants), and what nodes hold now.
    let (last, grants, node_ids) = match &read.view {
        Ok(view) => (
            view.config_in_force().then(|| view.config().clone()),
            view.held_grants(),
            view.granted_node_ids(),
        ),
        // Nothing in force (no configuration, or one unreadable and none applied): the grants
        // alone judge, read without a configuration.
        Err(_) => {
            let mut bare = ClusterView::new(keys.clone(), config.clone());
            let (all, _) = read_cluster(kv, keys).await?;
            apply_all(&mut bare, keys, &all);
            (None, bare.held_grants(), bare.granted_node_ids())
        }
    };
    ClusterConfig::check_install(last.as_ref(), config, &grants, &node_ids)
        .map_err(|e| Failure::Refused(e.to_string()))?;
    let response = kv
        .txn(Txn {
            compares: vec![compare],
            success: vec![
                TxnOp::put(config_key, value),
                TxnOp::put(
                    keys.schema(),
                    encode_value(&SchemaRecord {
                        version: corral_cluster::keys::SCHEMA_VERSION,
                    })
                    .map_err(|e| Failure::Usage(e.to_string()))?,
                ),
            ],
            failure: vec![],
        })
        .await
        .map_err(kv_failure)?;
    if !response.succeeded {
        return Err(Failure::Refused(
            "the configuration changed meanwhile; run the command again".into(),
        ));
    }
    Ok(Outcome::ok(format!(
        "cluster {cluster}: configuration {} at revision {}\n",
        if init { "written" } else { "applied" },
        response.revision
    )))
}
