//! One path installs a configuration in the view: the stored `config` is judged by `ClusterConfig::check_install` against the last one installed (`config-applied`) and the grants, on the watch and on every full read alike.
//!
//! A full read (the leader's start, failover, resync and restart; `corral cluster status`)
//! builds the view under the last configuration installed (`ClusterView::for_read`), applies
//! every other key, and only then judges the stored one (`finish_read`), so the grants are
//! known when it is judged. With no readable `config-applied` (a fresh cluster, or one from
//! before the key existed) the stored configuration is judged against the grants alone; if it
//! fails there, no configuration is in force and nothing may be granted.

use super::{ClusterView, Key};
use crate::config::{ClusterConfig, HeldGrant};
use crate::keys::{AppliedConfigRecord, Keys, decode_value};

impl ClusterView {
    /// The view a full read is loaded into, from the values of `config` and `config-applied`
    /// read at that revision: under the applied configuration when it reads, else under the
    /// stored one (provisional: judged against the grants in `finish_read`). None, with the
    /// reason, when neither reads: nothing can be in force.
    pub fn for_read(
        keys: Keys,
        stored: Option<&[u8]>,
        applied: Option<&[u8]>,
    ) -> Result<ClusterView, String> {
        let applied_config = applied.and_then(|value| {
            decode_value::<AppliedConfigRecord>(value)
                .ok()
                .filter(|record| record.config.validate().is_ok())
        });
        if let Some(record) = applied_config {
            let mut view = ClusterView::new(keys, record.config);
            view.installed_revision = record.config_revision;
            return Ok(view);
        }
        let config_key = keys.config();
        match stored.map(ClusterConfig::from_json) {
            Some(Ok(config)) => {
                let mut view = ClusterView::new(keys, config);
                view.provisional = true;
                Ok(view)
            }
            Some(Err(error)) => Err(format!(
                "{config_key}: the stored configuration cannot be read ({error}) and none was \
                 applied before: nothing is granted until `corral cluster apply --force` \
                 replaces it"
            )),
            None => Err(format!(
                "no cluster configuration yet ({config_key}): waiting for `corral cluster init`"
            )),
        }
    }

    /// Ends a full read: judges the stored configuration (the `config` key's value and mod
    /// revision; a read skips it until every other key is applied) as the watch does.
    pub fn finish_read(&mut self, stored: Option<(&[u8], i64)>) {
        if let Some((value, revision)) = stored {
            let key = self.keys.config();
            self.offer_config(&key, value, revision);
        }
    }

    /// Judges a stored configuration (a put of `config`): installed if it passes
    /// `ClusterConfig::check_install` against the configuration in force and the grants held
    /// now; else not applied, reported, and the last good configuration stays in force.
    pub(super) fn offer_config(&mut self, key: &str, value: &[u8], mod_revision: i64) {
        self.config_revision = mod_revision;
        let grants = self.held_grants();
        let node_ids: Vec<u32> = self.node_ids.keys().copied().collect();
        let last = (!self.provisional).then_some(&self.config);
        let judged = ClusterConfig::from_json(value).and_then(|new| {
            ClusterConfig::check_install(last, &new, &grants, &node_ids).map(|()| new)
        });
        match judged {
            Ok(new) => {
                self.config_refusal = None;
                self.provisional = false;
                self.installed_revision = mod_revision;
                if new != self.config {
                    self.config = new;
                    self.rebuild_spaces();
                }
            }
            Err(error) => {
                let message = if self.provisional {
                    format!(
                        "not applied: {error}; no configuration was applied before, so nothing \
                         is granted until one that fits the grants is applied"
                    )
                } else {
                    format!(
                        "not applied: {error}; the configuration applied at revision {} stays \
                         in force",
                        self.installed_revision
                    )
                };
                self.config_refusal = Some(message.clone());
                self.problem(key, mod_revision, message);
            }
        }
    }

    /// Every grant held now (`grants/` keys, whatever their values), for `check_holdings`.
    pub fn held_grants(&self) -> Vec<HeldGrant> {
        self.grants
            .iter()
            .map(|((pool, family, cidr), entry)| HeldGrant {
                pool: pool.clone(),
                family: *family,
                cidr: *cidr,
                node: entry.record.as_ref().map(|r| r.node.to_string()),
            })
            .collect()
    }

    /// Whether a configuration is in force: false only while no configuration was ever
    /// installed and the stored one fails (then nothing may be granted).
    pub fn config_in_force(&self) -> bool {
        !(self.provisional && self.config_refusal.is_some())
    }

    /// Why the stored configuration is not in force, if it is not.
    pub fn config_refusal(&self) -> Option<&str> {
        self.config_refusal.as_deref()
    }

    /// The mod revision of the `config` key whose value is in force (0 when not known).
    pub fn installed_revision(&self) -> i64 {
        self.installed_revision
    }

    /// The `config-applied` record the leader must write, if the configuration in force is
    /// not the one it holds (none yet, unreadable, or older): the last good configuration then
    /// survives a restart or a failover.
    pub fn applied_to_write(&self) -> Option<AppliedConfigRecord> {
        if !self.config_in_force() || self.provisional {
            return None;
        }
        let current = matches!(&self.applied, Some((_, Some(config))) if *config == self.config);
        (!current).then(|| AppliedConfigRecord {
            config_revision: self.installed_revision,
            config: self.config.clone(),
        })
    }

    /// The mod revision of `config-applied` as seen (0: absent), the compare of its write.
    pub fn applied_revision(&self) -> i64 {
        self.applied.as_ref().map_or(0, |(revision, _)| *revision)
    }
}

/// Whether `key` is the `config` key (a full read applies it last, through `finish_read`).
pub fn is_config_key(keys: &Keys, key: &str) -> bool {
    matches!(keys.parse(key), Ok(Key::Config))
}
