//! Cloud pools on the agent's side, pure: what the cluster link makes of the
//! node's `interfaces/<node>/` records ([`wanted`]: the interfaces and addresses the node's
//! interface-backed pools must hold, each bad record a typed [`RecordError`] that leaves its
//! interface as it is), and the demand of cloud pools ([`demand_records`]: as block pools',
//! with single addresses and delegated prefixes in place of blocks).
//!
//! The cluster link does the I/O (`cluster.rs`); the node state applies the result in one commit
//! (`node/cloud.rs`).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use corral_cluster::{
    CloudAttachment, CloudInterfaceRecord, ClusterConfig, DemandRecord, Family, IpNet, PoolName,
};
use corral_core::{InterfaceId, InterfaceSpec, MacAddr, Timestamp};

use crate::node::{CloudInterface, CloudInterfaces, CloudReport};

/// The most addresses and prefixes one record may list: EC2 gives an interface at most 50
/// secondary addresses or prefixes per family, so a record listing more is garbage, and
/// checking and applying one of thousands (up to etcd's 1.5 MB value) would hold the cluster
/// link for minutes on every change.
pub const MAX_RECORD_ADDRESSES: usize = 512;

/// One `interfaces/<node>/<id>` key as the link read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloudEntry {
    /// The value, or why it cannot be read.
    pub record: Result<CloudInterfaceRecord, String>,
    /// The key's create revision (a release handshake's `grant_revision` names it).
    pub create_revision: i64,
    /// The key's mod revision: when what it lists was written.
    pub mod_revision: i64,
}

/// An address of a record written no later than a restore may reach back to, which the node
/// state does not hold ([`screen_restored`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unconfirmed {
    pub interface: String,
    pub pool: PoolName,
    pub address: IpNet,
    pub mod_revision: i64,
}

impl std::fmt::Display for Unconfirmed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "interfaces/{}: {} of pool {} is listed by a record written at revision {}, which \
             a restore of etcd may have brought back, and this node does not hold it (it may \
             have given it up, and the cloud may have given it to another node since): not \
             served until a newer record lists it",
            self.interface, self.address, self.pool, self.mod_revision
        )
    }
}

/// The records as the node may serve them once etcd went back in time: a record written at or
/// before `restored_up_to` (the highest revision a restore may have brought back: the etcd
/// revision at which the agent saw the regression) lists only what the node state holds
/// (`held`: the pools' addresses and prefixes, surrendered ones included). An address it lists
/// that the node does not hold was given up and forgotten since (and the cloud may have given
/// it to another node), or never taken up; either way it waits for a record written after the
/// restore. Answers the screened records and what was left out. With
/// `restored_up_to` 0 (no restore seen) the records are kept as they are.
pub fn screen_restored<'a>(
    records: &'a BTreeMap<String, CloudEntry>,
    restored_up_to: i64,
    held: &BTreeSet<(PoolName, IpNet)>,
) -> (Cow<'a, BTreeMap<String, CloudEntry>>, Vec<Unconfirmed>) {
    let left_out: Vec<Unconfirmed> = records
        .iter()
        .filter(|(_, entry)| entry.mod_revision <= restored_up_to)
        .filter_map(|(interface, entry)| {
            Some((interface, entry.mod_revision, entry.record.as_ref().ok()?))
        })
        .flat_map(|(interface, mod_revision, record)| {
            record
                .addresses
                .iter()
                .filter(|address| !held.contains(&(record.pool.clone(), **address)))
                .map(move |address| Unconfirmed {
                    interface: interface.clone(),
                    pool: record.pool.clone(),
                    address: *address,
                    mod_revision,
                })
        })
        .collect();
    if left_out.is_empty() {
        return (Cow::Borrowed(records), left_out);
    }
    let mut screened = records.clone();
    for out in &left_out {
        if let Some(Ok(record)) = screened.get_mut(&out.interface).map(|e| e.record.as_mut()) {
            record.addresses.retain(|address| *address != out.address);
        }
    }
    (Cow::Owned(screened), left_out)
}

/// Why a record is not applied (its interface is left as it is).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("interfaces/{interface}: the value cannot be read: {reason}")]
    Unreadable { interface: String, reason: String },
    #[error("interfaces/{interface}: not a valid interface ID here: {reason}")]
    BadId { interface: String, reason: String },
    #[error("interfaces/{interface}: pool {pool} is not a cloud pool of the cluster configuration")]
    NotACloudPool { interface: String, pool: PoolName },
    #[error(
        "interfaces/{interface}: the record is for instance {record}, this node runs on {ours}"
    )]
    OtherInstance {
        interface: String,
        record: String,
        ours: String,
    },
    #[error("interfaces/{interface}: bad MAC address {mac:?}")]
    BadMac { interface: String, mac: String },
    #[error("interfaces/{interface}: {reason}")]
    BadInterface { interface: String, reason: String },
    #[error("interfaces/{interface}: address {address}: {reason}")]
    BadAddress {
        interface: String,
        address: IpNet,
        reason: String,
    },
}

/// The routes of a cloud pool's interfaces: the pool's CIDRs (the VPC's).
fn routes_of(config: &ClusterConfig, pool: &PoolName) -> Vec<IpNet> {
    config
        .pool(pool)
        .map(|p| p.families().flat_map(|(_, f)| f.cidrs.clone()).collect())
        .unwrap_or_default()
}

/// The interfaces the node's cloud pools must hold, from the records (keyed by interface
/// ID): every attached record whose values hold up; an attaching one, and a bad one (each a
/// [`RecordError`]), leave their interface as it is. `keep_surrendered`: the surrendered
/// addresses to keep out (see [`CloudInterfaces::keep_surrendered`]).
pub fn wanted(
    config: &ClusterConfig,
    records: &BTreeMap<String, CloudEntry>,
    instance_id: Option<&str>,
    keep_surrendered: BTreeSet<(PoolName, IpNet)>,
) -> (CloudInterfaces, Vec<RecordError>) {
    let mut out = CloudInterfaces {
        pools: config
            .pools
            .iter()
            .filter(|p| p.is_cloud())
            .map(|p| p.name.clone())
            .collect(),
        keep_surrendered,
        ..CloudInterfaces::default()
    };
    let mut errors = Vec::new();
    for (interface, entry) in records {
        let id = match InterfaceId::new(interface) {
            Ok(id) => id,
            Err(error) => {
                errors.push(RecordError::BadId {
                    interface: interface.clone(),
                    reason: error.to_string(),
                });
                continue;
            }
        };
        match check_record(config, interface, &id, entry, instance_id) {
            Ok(Some(wanted)) => out.interfaces.push(wanted),
            Ok(None) => {
                out.untouched.insert(id);
            }
            Err(error) => {
                errors.push(error);
                out.untouched.insert(id);
            }
        }
    }
    (out, errors)
}

/// One record: the interface to hold (`None`: attaching, not served yet), or why not.
fn check_record(
    config: &ClusterConfig,
    interface: &str,
    id: &InterfaceId,
    entry: &CloudEntry,
    instance_id: Option<&str>,
) -> Result<Option<CloudInterface>, RecordError> {
    let name = || interface.to_owned();
    let record = entry
        .record
        .as_ref()
        .map_err(|reason| RecordError::Unreadable {
            interface: name(),
            reason: reason.clone(),
        })?;
    if !config.pool(&record.pool).is_some_and(|p| p.is_cloud()) {
        return Err(RecordError::NotACloudPool {
            interface: name(),
            pool: record.pool.clone(),
        });
    }
    if let Some(ours) = instance_id
        && !record.instance_id.is_empty()
        && record.instance_id != ours
    {
        return Err(RecordError::OtherInstance {
            interface: name(),
            record: record.instance_id.clone(),
            ours: ours.to_owned(),
        });
    }
    if record.attachment == CloudAttachment::Attaching {
        return Ok(None);
    }
    let mac: MacAddr = record.mac.parse().map_err(|_| RecordError::BadMac {
        interface: name(),
        mac: record.mac.clone(),
    })?;
    if record.addresses.len() > MAX_RECORD_ADDRESSES {
        return Err(RecordError::BadInterface {
            interface: name(),
            reason: format!(
                "lists {} addresses and prefixes, more than any interface holds ({MAX_RECORD_ADDRESSES})",
                record.addresses.len()
            ),
        });
    }
    if record.subnets.is_empty() {
        return Err(RecordError::BadInterface {
            interface: name(),
            reason: "no subnet".into(),
        });
    }
    // The same checks the local table makes, on the whole record first: a record with one
    // bad address changes nothing.
    let spec = InterfaceSpec {
        id: id.clone(),
        device_number: record.device_index,
        primary: record.device_index == 0,
        trunk: false,
        excluded: false,
        subnets: record.subnets.clone(),
        mac,
        gateways: Vec::new(),
        routes: Vec::new(),
        primary_addresses: record
            .primary_ipv4
            .map(std::net::IpAddr::V4)
            .into_iter()
            .collect(),
        created_at: Timestamp::from_unix_millis(0),
    };
    let mut table = corral_core::Interfaces::new(record.pool.clone());
    table
        .add_interface(spec.clone())
        .map_err(|e| RecordError::BadInterface {
            interface: name(),
            reason: e.to_string(),
        })?;
    let mut seen: Vec<IpNet> = Vec::new();
    for address in &record.addresses {
        spec.range_of(*address)
            .map_err(|e| RecordError::BadAddress {
                interface: name(),
                address: *address,
                reason: e.to_string(),
            })?;
        if let Some(other) = seen
            .iter()
            .find(|o| o.contains(&address.network()) || address.contains(&o.network()))
        {
            return Err(RecordError::BadAddress {
                interface: name(),
                address: *address,
                reason: format!("overlaps {other} of the same record"),
            });
        }
        if Some(address.addr()) == record.primary_ipv4.map(std::net::IpAddr::V4) {
            return Err(RecordError::BadAddress {
                interface: name(),
                address: *address,
                reason: "is the interface's primary address".into(),
            });
        }
        seen.push(*address);
    }
    Ok(Some(CloudInterface {
        pool: record.pool.clone(),
        id: id.clone(),
        device_number: record.device_index,
        subnets: record.subnets.clone(),
        mac,
        routes: routes_of(config, &record.pool),
        addresses: record.addresses.clone(),
        primary_addresses: spec.primary_addresses.clone(),
    }))
}

/// The record (interface ID and entry) of `pool` that lists `address` and is attached.
pub fn record_listing<'a>(
    records: &'a BTreeMap<String, CloudEntry>,
    pool: &PoolName,
    address: &IpNet,
) -> Option<(&'a String, &'a CloudEntry)> {
    records.iter().find(|(_, entry)| {
        entry.record.as_ref().is_ok_and(|r| {
            &r.pool == pool
                && r.attachment == CloudAttachment::Attached
                && r.addresses.contains(address)
        })
    })
}

/// The demand of each cloud pool of `config`, from the node state's report and the ADDs waiting
/// (`at_ms` left 0): per family `used`, `free` (frozen addresses not counted), `pending`,
/// `blocks` = addresses and prefixes held (surrendered ones not), `empty` = up to
/// `FamilyDemand::MAX_EMPTY` of them with nothing allocated and nothing cooling, highest
/// first: the candidates the operator may mark for release.
pub fn demand_records(
    config: &ClusterConfig,
    report: &CloudReport,
    pending: &BTreeMap<String, u64>,
) -> BTreeMap<PoolName, DemandRecord> {
    config
        .pools
        .iter()
        .filter(|p| p.is_cloud())
        .map(|pool| {
            let held = |family: Family| -> Vec<(IpNet, bool)> {
                report
                    .addresses
                    .iter()
                    .filter(|a| a.pool == pool.name && Family::of(a.address.addr()) == family)
                    .map(|a| (a.address, a.free))
                    .collect()
            };
            let record = crate::link::blocks::demand_record(pool, &report.stats, pending, held);
            (pool.name.clone(), record)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::CloudAddress;

    const CONFIG: &str = include_str!("../../tests/configs/cloud_and_blocks.toml");

    fn config() -> ClusterConfig {
        ClusterConfig::from_toml(CONFIG).unwrap()
    }

    fn record(addresses: &[&str]) -> CloudInterfaceRecord {
        CloudInterfaceRecord {
            pool: PoolName::new("vpc").unwrap(),
            instance_id: "i-1".into(),
            device_index: 1,
            subnet_id: "subnet-1".into(),
            subnets: vec!["10.0.1.0/24".parse().unwrap()],
            mac: "02:00:00:00:00:01".into(),
            primary_ipv4: Some("10.0.1.5".parse().unwrap()),
            addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
            assigned_ms: Default::default(),
            attachment: CloudAttachment::Attached,
            managed: true,
            prefixes_refused_ms: None,
        }
    }

    fn entries(
        list: Vec<(&str, Result<CloudInterfaceRecord, String>)>,
    ) -> BTreeMap<String, CloudEntry> {
        list.into_iter()
            .map(|(id, record)| {
                (
                    id.to_owned(),
                    CloudEntry {
                        record,
                        create_revision: 7,
                        mod_revision: 7,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn a_record_from_before_a_restore_keeps_only_what_the_node_holds() {
        let listed = record(&["10.0.1.10/32", "10.0.1.11/32"]);
        let mut records = entries(vec![
            ("eni-old", Ok(listed.clone())),
            ("eni-new", Ok(listed)),
        ]);
        records.get_mut("eni-new").unwrap().mod_revision = 9;
        let pool = records["eni-old"].record.as_ref().unwrap().pool.clone();
        let held = BTreeSet::from([(pool.clone(), "10.0.1.10/32".parse().unwrap())]);
        // No restore seen: as they are.
        let (same, none) = screen_restored(&records, 0, &held);
        assert!(matches!(same, Cow::Borrowed(_)));
        assert_eq!(*same, records);
        assert!(none.is_empty());
        // A restore up to revision 8: the record written at 7 keeps what is held, the one
        // written at 9 is newer than the restore.
        let (screened, left_out) = screen_restored(&records, 8, &held);
        let addresses = |id: &str| screened[id].record.as_ref().unwrap().addresses.clone();
        assert_eq!(
            addresses("eni-old"),
            ["10.0.1.10/32".parse::<IpNet>().unwrap()]
        );
        assert_eq!(addresses("eni-new").len(), 2);
        assert_eq!(
            left_out,
            [Unconfirmed {
                interface: "eni-old".into(),
                pool,
                address: "10.0.1.11/32".parse().unwrap(),
                mod_revision: 7,
            }]
        );
        assert!(
            left_out[0]
                .to_string()
                .contains("not served until a newer record")
        );
    }

    #[test]
    fn attached_records_are_wanted_with_the_pools_routes_and_bad_ones_are_left_alone() {
        let mut attaching = record(&[]);
        attaching.attachment = CloudAttachment::Attaching;
        let mut other_instance = record(&[]);
        other_instance.instance_id = "i-2".into();
        let mut bad_mac = record(&[]);
        bad_mac.mac = "zz".into();
        let mut blocks = record(&[]);
        blocks.pool = PoolName::new("blocks").unwrap();
        let records = entries(vec![
            ("eni-a", Ok(record(&["10.0.1.10/32", "10.0.1.32/28"]))),
            ("eni-b", Ok(attaching)),
            ("eni-c", Err("expected value".into())),
            ("eni-d", Ok(other_instance)),
            ("eni-e", Ok(bad_mac)),
            ("eni-f", Ok(record(&["10.0.2.10/32"]))),
            ("eni-g", Ok(record(&["10.0.1.5/32"]))),
            ("eni-h", Ok(blocks)),
            ("eni-i", Ok(record(&["10.0.1.32/28", "10.0.1.33/32"]))),
        ]);
        let (wanted, errors) = wanted(&config(), &records, Some("i-1"), BTreeSet::new());
        assert_eq!(wanted.pools.len(), 1);
        assert_eq!(wanted.interfaces.len(), 1, "{:?}", wanted.interfaces);
        let a = &wanted.interfaces[0];
        assert_eq!(a.id.as_str(), "eni-a");
        assert_eq!(a.device_number, 1);
        assert_eq!(a.routes, vec!["10.0.0.0/16".parse::<IpNet>().unwrap()]);
        assert_eq!(a.addresses.len(), 2);
        // Its primary address is carried apart (shown, never a pod's).
        assert_eq!(
            a.primary_addresses,
            vec!["10.0.1.5".parse::<std::net::IpAddr>().unwrap()]
        );
        let untouched: Vec<&str> = wanted.untouched.iter().map(|i| i.as_str()).collect();
        assert_eq!(
            untouched,
            [
                "eni-b", "eni-c", "eni-d", "eni-e", "eni-f", "eni-g", "eni-h", "eni-i"
            ]
        );
        assert_eq!(errors.len(), 7, "{errors:?}");
        assert!(matches!(errors[0], RecordError::Unreadable { .. }));
        assert!(matches!(errors[1], RecordError::OtherInstance { .. }));
        assert!(matches!(errors[2], RecordError::BadMac { .. }));
        assert!(
            matches!(errors[3], RecordError::BadAddress { .. }),
            "outside the subnet"
        );
        assert!(
            matches!(errors[4], RecordError::BadAddress { .. }),
            "the primary"
        );
        assert!(matches!(errors[5], RecordError::NotACloudPool { .. }));
        assert!(
            matches!(errors[6], RecordError::BadAddress { .. }),
            "overlap"
        );
    }

    #[test]
    fn a_record_listing_more_addresses_than_an_interface_can_hold_is_refused() {
        // EC2 gives an interface at most 50 secondary addresses or prefixes per family; a
        // record of thousands (up to etcd's 1.5 MB value) took the link minutes per change.
        let listing = |n: u32| {
            let mut r = record(&[]);
            r.subnets = vec!["10.0.0.0/16".parse().unwrap()];
            r.primary_ipv4 = None;
            r.addresses = (10..10 + n)
                .map(|i| format!("10.0.{}.{}/32", i / 256, i % 256).parse().unwrap())
                .collect();
            entries(vec![("eni-a", Ok(r))])
        };
        let limit = MAX_RECORD_ADDRESSES as u32;
        let (ok, errors) = wanted(&config(), &listing(limit), Some("i-1"), BTreeSet::new());
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(ok.interfaces[0].addresses.len(), MAX_RECORD_ADDRESSES);
        let (refused, errors) =
            wanted(&config(), &listing(limit + 1), Some("i-1"), BTreeSet::new());
        assert!(refused.interfaces.is_empty());
        assert!(
            matches!(&errors[..], [RecordError::BadInterface { reason, .. }] if reason.contains("513")),
            "{errors:?}"
        );
    }

    #[test]
    fn cloud_demand_lists_free_addresses_highest_first() {
        let vpc = PoolName::new("vpc").unwrap();
        let address = |a: &str, n_allocated, free, frozen| CloudAddress {
            pool: vpc.clone(),
            interface: InterfaceId::new("eni-a").unwrap(),
            address: a.parse().unwrap(),
            n_allocated,
            free,
            frozen,
        };
        let report = CloudReport {
            stats: vec![(vpc.clone(), Family::V4, 2, 17)],
            addresses: vec![
                address("10.0.1.10/32", 1, false, false),
                address("10.0.1.11/32", 0, true, false),
                address("10.0.1.12/32", 0, false, false),
                address("10.0.1.13/32", 1, false, true),
                address("10.0.1.32/28", 0, true, false),
            ],
            surrendered: vec![],
            frozen: vec![],
        };
        let records = demand_records(&config(), &report, &BTreeMap::new());
        assert_eq!(records.len(), 1, "cloud pools only");
        let v4 = records[&vpc].ipv4.clone().unwrap();
        assert_eq!((v4.used, v4.free, v4.pending, v4.blocks), (2, 17, 0, 5));
        assert_eq!(
            v4.empty,
            vec![
                "10.0.1.32/28".parse::<IpNet>().unwrap(),
                "10.0.1.11/32".parse().unwrap()
            ]
        );
        let empty = CloudReport::default();
        let records = demand_records(&config(), &empty, &BTreeMap::from([("vpc".into(), 3)]));
        assert_eq!(records[&vpc].ipv4.as_ref().unwrap().pending, 3);
    }
}
