//! Interface-backed pools in stored state: each pool's interfaces (`PoolSpec::interfaces`) and
//! their addresses as ranges of the pool (source [`RangeSource::Interface`]).
//!
//! The ranges are ordinary ranges of the configuration, so the engine is built from them as
//! from any other (`build_engine`), cooldowns and allocations included; the interface table
//! ([`Interfaces`]) is rebuilt beside it from the entries with [`restore_interfaces`], which
//! checks that both say the same.

use std::collections::HashSet;

use corral_core::{
    Engine, INTERFACE_EXCLUSION_PREFIX, InterfaceId, InterfaceSpec, Interfaces, IpNet, MacAddr,
    PoolName, Timestamp, parse_addr, parse_net,
};

use crate::{PoolSpec, RangeEntry, RangeSource, RangeState, ScopeConfig, StoreError};

/// One interface of a pool as stored: [`InterfaceSpec`]'s fields as text and numbers, and its
/// addresses and prefixes (CIDR text, in address order).
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct InterfaceEntry {
    pub id: String,
    pub device_number: u32,
    #[serde(default)]
    pub primary: bool,
    #[serde(default)]
    pub trunk: bool,
    #[serde(default)]
    pub excluded: bool,
    pub subnets: Vec<String>,
    pub mac: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateways: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub primary_addresses: Vec<String>,
    /// Milliseconds since the epoch.
    pub created_at_ms: u64,
    #[serde(default)]
    pub addresses: Vec<String>,
}

fn corrupt(what: &str, reason: impl ToString) -> StoreError {
    StoreError::Corrupt {
        what: what.to_owned(),
        reason: reason.to_string(),
    }
}

impl InterfaceEntry {
    pub fn from_spec(spec: &InterfaceSpec, addresses: &[IpNet]) -> InterfaceEntry {
        let texts = |nets: &[IpNet]| nets.iter().map(ToString::to_string).collect();
        InterfaceEntry {
            id: spec.id.to_string(),
            device_number: spec.device_number,
            primary: spec.primary,
            trunk: spec.trunk,
            excluded: spec.excluded,
            subnets: texts(&spec.subnets),
            mac: spec.mac.to_string(),
            gateways: spec.gateways.iter().map(ToString::to_string).collect(),
            routes: texts(&spec.routes),
            primary_addresses: spec
                .primary_addresses
                .iter()
                .map(ToString::to_string)
                .collect(),
            created_at_ms: spec.created_at.as_unix_millis(),
            addresses: texts(addresses),
        }
    }

    /// The interface and its addresses, parsed; damaged text is [`StoreError::Corrupt`].
    pub fn to_spec(&self) -> Result<(InterfaceSpec, Vec<IpNet>), StoreError> {
        let what = |field: &str| format!("interface {:?} {field}", self.id);
        let nets = |texts: &[String], field: &str| {
            texts
                .iter()
                .map(|text| parse_net(text).map_err(|e| corrupt(&what(field), e)))
                .collect::<Result<Vec<IpNet>, StoreError>>()
        };
        let spec = InterfaceSpec {
            id: InterfaceId::new(&self.id).map_err(|e| corrupt("interface id", e))?,
            device_number: self.device_number,
            primary: self.primary,
            trunk: self.trunk,
            excluded: self.excluded,
            subnets: nets(&self.subnets, "subnet")?,
            mac: self
                .mac
                .parse::<MacAddr>()
                .map_err(|e| corrupt(&what("mac"), e))?,
            gateways: self
                .gateways
                .iter()
                .map(|text| parse_addr(text).map_err(|e| corrupt(&what("gateway"), e)))
                .collect::<Result<_, _>>()?,
            routes: nets(&self.routes, "route")?,
            primary_addresses: self
                .primary_addresses
                .iter()
                .map(|text| parse_addr(text).map_err(|e| corrupt(&what("primary address"), e)))
                .collect::<Result<_, _>>()?,
            created_at: Timestamp::from_unix_millis(self.created_at_ms),
        };
        Ok((spec, nets(&self.addresses, "address")?))
    }
}

impl PoolSpec {
    /// Makes the pool's stored interfaces and interface ranges those of `table`: the entries
    /// are rewritten, interface ranges no longer present leave, new ones are appended (active),
    /// and ranges of other sources are left alone. Call it after every change to the table,
    /// in the same commit as the engine's rows.
    pub fn set_interfaces(&mut self, table: &Interfaces) -> Result<(), StoreError> {
        let mut entries = Vec::with_capacity(table.len());
        let mut wanted = Vec::new();
        for (spec, addresses) in table.interfaces() {
            entries.push(InterfaceEntry::from_spec(spec, addresses));
            for address in addresses {
                let range = spec
                    .range_of(*address)
                    .map_err(|e| corrupt("interface address", e))?;
                wanted.push(RangeEntry::new(&range, RangeSource::Interface));
            }
        }
        // Sets, not scans: a node has hundreds of interface ranges.
        let wanted_set: HashSet<&RangeEntry> = wanted.iter().collect();
        self.ranges
            .retain(|entry| entry.source != RangeSource::Interface || wanted_set.contains(entry));
        let present: HashSet<RangeEntry> = self.ranges.iter().cloned().collect();
        for entry in wanted {
            if !present.contains(&entry) {
                self.ranges.push(entry);
            }
        }
        // The exclusions that keep trunk and excluded interfaces' addresses from pods follow
        // the table; the operator's own exclusions stay.
        self.exclusions
            .retain(|(_, reason)| !reason.starts_with(INTERFACE_EXCLUSION_PREFIX));
        self.exclusions.extend(
            table
                .reserved_exclusions()
                .iter()
                .map(|e| (e.network().to_string(), e.reason().to_owned())),
        );
        self.interfaces = entries;
        self.interface_backed = true;
        Ok(())
    }

    /// The pool's interface table, from its entries alone (see [`restore_interfaces`] for the
    /// check against the engine).
    pub fn interface_table(&self) -> Result<Interfaces, StoreError> {
        let pool = PoolName::new(&self.name).map_err(|e| corrupt("pool name", e))?;
        let parsed = self
            .interfaces
            .iter()
            .map(InterfaceEntry::to_spec)
            .collect::<Result<Vec<_>, _>>()?;
        Interfaces::restore(pool, parsed).map_err(|e| corrupt("interfaces", e))
    }

    /// Whether the pool is interface-backed: marked so ([`PoolSpec::interface_backed`], set
    /// by [`PoolSpec::set_interfaces`]), or, for state written before the marker, it has
    /// interfaces or interface ranges.
    pub fn is_interface_pool(&self) -> bool {
        self.interface_backed
            || !self.interfaces.is_empty()
            || self
                .ranges
                .iter()
                .any(|range| range.source == RangeSource::Interface)
    }
}

/// The interface tables of a scope's interface-backed pools, rebuilt after
/// [`crate::build_engine`] built `engine` from the same configuration, and checked against it:
/// every interface address is an active range of its pool and every active range of the pool
/// an interface address. A mismatch is [`StoreError::Corrupt`].
pub fn restore_interfaces(
    config: &ScopeConfig,
    engine: &Engine,
) -> Result<Vec<Interfaces>, StoreError> {
    let mut tables = Vec::new();
    for pool in config.pools.iter().filter(|pool| pool.is_interface_pool()) {
        if let Some(range) = pool.ranges.iter().find(|range| {
            range.source == RangeSource::Interface && range.state != RangeState::Active
        }) {
            return Err(corrupt(
                "interface range",
                format!(
                    "{} of pool {} is {}",
                    range.range,
                    pool.name,
                    range.state.as_str()
                ),
            ));
        }
        let table = pool.interface_table()?;
        table
            .check(engine)
            .map_err(|reason| corrupt(&format!("interfaces of pool {}", pool.name), reason))?;
        tables.push(table);
    }
    Ok(tables)
}
