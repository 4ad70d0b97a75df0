//! One path installs a configuration in the view: the stored `config` is judged by `ClusterConfig::check_install` against the last one installed (`config-applied`) and the grants, on the watch and on every full read alike.
//!
//! A full read (the leader's start, failover, resync and restart; `corral cluster status`)
//! builds the view under the last configuration installed (`ClusterView::for_read`), applies
//! every other key, and only then judges the stored one (`finish_read`), so the grants are
//! known when it is judged. With no readable `config-applied` (a fresh cluster, or one from
//! before the key existed) the stored configuration is judged against the grants alone; if it
//! fails there, no configuration is in force and nothing may be granted.

use super::{ClusterView, Key};
use crate::config::AppliedConfigRecord;
use crate::config::{ClusterConfig, HeldGrant};
use crate::keys::{Keys, decode_value};

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
        ClusterView::for_read_after(keys, stored, applied, None)
    }

    /// `for_read` by a reader that had a configuration in force before (`last`, with the
    /// `config` revision it came from: a leader's resync or restart), used when
    /// `config-applied` does not read (not written yet, or deleted).
    pub fn for_read_after(
        keys: Keys,
        stored: Option<&[u8]>,
        applied: Option<&[u8]>,
        last: Option<(ClusterConfig, i64)>,
    ) -> Result<ClusterView, String> {
        let applied_config = applied
            // Decoding checks the configuration: one that breaks a rule does not decode.
            .and_then(|value| decode_value::<AppliedConfigRecord>(value).ok())
            .or(last.map(|(config, config_revision)| AppliedConfigRecord {
                config_revision,
                config,
            }));
        if let Some(record) = applied_config {
            let mut view = ClusterView::new(keys, record.config);
            view.installed_revision = record.config_revision;
            view.reading = true;
            return Ok(view);
        }
        let config_key = keys.config();
        match stored.map(ClusterConfig::from_json) {
            Some(Ok(config)) => {
                let mut view = ClusterView::new(keys, config);
                view.provisional = true;
                view.reading = true;
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

    /// Ends a full read (every key was applied once, `config` aside): judges the stored configuration (the `config` key's value and mod
    /// revision; a read skips it until every other key is applied) as the watch does.
    pub fn finish_read(&mut self, stored: Option<(&[u8], i64)>) {
        self.reading = false;
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
        let node_ids = self.granted_node_ids();
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

    /// Every node ID granted now (`nodeids/id/` keys, whatever their values).
    pub fn granted_node_ids(&self) -> Vec<u32> {
        self.node_ids.keys().copied().collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{ClusterName, GrantRecord, NodeName, OwnedRecord, encode_value};
    use corral_core::{Family, PoolName};
    use ipnet::IpNet;

    use crate::tests::pool_toml;

    const CONFIG: &str = pool_toml!("default", "10.244.0.0/22", node_prefix_len = 24);

    fn keys() -> Keys {
        Keys::new(ClusterName::new("t").unwrap())
    }

    fn json(toml: &str) -> Vec<u8> {
        ClusterConfig::from_toml(toml)
            .unwrap()
            .to_json()
            .unwrap()
            .into_bytes()
    }

    fn applied(toml: &str, revision: i64) -> Vec<u8> {
        encode_value(&AppliedConfigRecord {
            config_revision: revision,
            config: ClusterConfig::from_toml(toml).unwrap(),
        })
        .unwrap()
    }

    /// A full read as the leader does it: `config` last.
    fn read(
        stored: &str,
        applied_value: Option<&[u8]>,
        grants: &[(&str, &str, &str)],
    ) -> ClusterView {
        let keys = keys();
        let stored = json(stored);
        let mut view = ClusterView::for_read(keys.clone(), Some(&stored), applied_value).unwrap();
        if let Some(value) = applied_value {
            view.apply_put(&keys.config_applied(), value, 2, 2);
        }
        for (i, (pool, cidr, node)) in grants.iter().enumerate() {
            grant(&mut view, pool, cidr, node, 10 + i as i64);
        }
        view.finish_read(Some((&stored, 5)));
        view
    }

    fn grant(view: &mut ClusterView, pool: &str, cidr: &str, node: &str, revision: i64) {
        let keys = view.keys().clone();
        let pool = PoolName::new(pool).unwrap();
        let cidr: IpNet = cidr.parse().unwrap();
        let node = NodeName::new(node).unwrap();
        let record = GrantRecord {
            node: node.clone(),
            uid: "u".into(),
            node_revision: 1,
            granted_ms: None,
        };
        view.apply_put(
            &keys.grant(&pool, Family::V4, &cidr),
            &encode_value(&record).unwrap(),
            revision,
            revision,
        );
        view.apply_put(
            &keys.owned(&node, &pool, Family::V4, &cidr),
            &encode_value(&OwnedRecord { node_revision: 1 }).unwrap(),
            revision,
            revision,
        );
    }

    fn renamed() -> String {
        CONFIG.replace("\"default\"", "\"pods\"")
    }

    /// Issue 20: the watch refused a renamed pool, but a full read (resync, restart, failover)
    /// installed it and granted 10.244.1.0/24 again in the new pool.
    #[test]
    fn a_full_read_holds_the_stored_configuration_to_the_rules_of_the_watch() {
        let before = applied(CONFIG, 1);
        let view = read(
            &renamed(),
            Some(&before),
            &[("default", "10.244.1.0/24", "a")],
        );
        assert!(view.config_in_force());
        assert_eq!(view.config().pools[0].name.as_str(), "default");
        let refusal = view.config_refusal().unwrap();
        assert!(refusal.contains("not applied"), "{refusal}");
        assert!(
            refusal.contains("pool default ipv4 is not configured"),
            "{refusal}"
        );
        assert!(refusal.contains("stays in force"), "{refusal}");
        let report = view.status_report(5, None);
        assert!(
            report.problems.iter().any(|p| p.contains("not applied")),
            "{report:?}"
        );
        // The grants' compare is the stored key's revision: granting goes on under the last
        // good configuration, and nothing new is recorded as applied.
        assert_eq!(view.config_revision(), 5);
        assert_eq!(view.applied_to_write(), None);
        // A changed node prefix length likewise.
        let longer = CONFIG.replace("= 24", "= 25");
        let view = read(&longer, Some(&before), &[("default", "10.244.1.0/24", "a")]);
        assert_eq!(
            view.config().pools[0]
                .ipv4
                .as_ref()
                .unwrap()
                .node_prefix_len,
            24
        );
        assert!(view.config_refusal().unwrap().contains("node_prefix_len"));
    }

    /// A fresh leader without `config-applied` judges the stored configuration against the
    /// grants alone: one that frees held space is not in force, and nothing is granted.
    #[test]
    fn without_an_applied_configuration_the_grants_judge_the_stored_one() {
        let view = read(&renamed(), None, &[("default", "10.244.1.0/24", "a")]);
        assert!(!view.config_in_force());
        let refusal = view.config_refusal().unwrap();
        assert!(refusal.contains("10.244.1.0/24 (node a)"), "{refusal}");
        assert!(refusal.contains("nothing is granted"), "{refusal}");
        assert_eq!(view.applied_to_write(), None);
        // One that fits is installed and is to be recorded.
        let view = read(CONFIG, None, &[("default", "10.244.1.0/24", "a")]);
        assert!(view.config_in_force());
        assert_eq!(view.config_refusal(), None);
        let record = view.applied_to_write().unwrap();
        assert_eq!(record.config_revision, 5);
        assert_eq!(&record.config, view.config());
    }

    #[test]
    fn the_watch_refuses_a_reserved_range_over_a_grant_and_accepts_a_growth() {
        let before = applied(CONFIG, 1);
        let mut view = read(CONFIG, Some(&before), &[("default", "10.244.1.0/24", "a")]);
        assert_eq!(view.applied_to_write(), None);
        let reserved = format!("{CONFIG}reserved = [\"10.244.1.0/24\"]\n");
        view.apply_put(&keys().config(), &json(&reserved), 20, 20);
        assert!(
            view.config().pools[0]
                .ipv4
                .as_ref()
                .unwrap()
                .reserved
                .is_empty()
        );
        assert!(view.config_refusal().unwrap().contains("reserved[0]"));
        assert_eq!(view.config_revision(), 20);
        let grown = CONFIG.replace(
            "[\"10.244.0.0/22\"]",
            "[\"10.244.0.0/22\", \"10.250.0.0/22\"]",
        );
        view.apply_put(&keys().config(), &json(&grown), 21, 21);
        assert_eq!(view.config_refusal(), None);
        assert_eq!(view.config().pools[0].ipv4.as_ref().unwrap().cidrs.len(), 2);
        assert_eq!(view.applied_to_write().unwrap().config_revision, 21);
    }

    #[test]
    fn an_unreadable_stored_configuration_keeps_the_applied_one() {
        let before = applied(CONFIG, 1);
        let keys = keys();
        let mut view =
            ClusterView::for_read(keys.clone(), Some(b"{garbage"), Some(&before)).unwrap();
        view.finish_read(Some((b"{garbage", 5)));
        assert!(view.config_in_force());
        assert!(view.config_refusal().unwrap().contains("does not parse"));
        // Neither readable: nothing in force.
        let error = ClusterView::for_read(keys.clone(), Some(b"{garbage"), None).unwrap_err();
        assert!(error.contains("cluster apply --force"), "{error}");
        let error = ClusterView::for_read(keys, None, None).unwrap_err();
        assert!(error.contains("cluster init"), "{error}");
    }

    /// A grant of a pool no longer configured stays held: its CIDR is never granted from
    /// another pool's space over the same addresses.
    #[test]
    fn a_grant_of_a_pool_not_configured_blocks_its_addresses_everywhere() {
        let mut view = ClusterView::new(keys(), ClusterConfig::from_toml(&renamed()).unwrap());
        grant(&mut view, "default", "10.244.0.0/24", "a", 3);
        let pods = PoolName::new("pods").unwrap();
        let space = view.space(&pods, Family::V4).unwrap();
        assert_eq!(space.lowest_free().unwrap().to_string(), "10.244.1.0/24");
        assert!(
            view.problems()
                .iter()
                .any(|p| p.message.contains("never granted again"))
        );
        // Released (its grant and `owned/` key go together): free again.
        let pool = PoolName::new("default").unwrap();
        let cidr: IpNet = "10.244.0.0/24".parse().unwrap();
        let node = NodeName::new("a").unwrap();
        view.apply_delete(&view.keys().grant(&pool, Family::V4, &cidr), 4);
        view.apply_delete(&view.keys().owned(&node, &pool, Family::V4, &cidr), 4);
        let space = view.space(&pods, Family::V4).unwrap();
        assert_eq!(space.lowest_free().unwrap().to_string(), "10.244.0.0/24");
    }
}
