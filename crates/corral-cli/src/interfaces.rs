//! `corral interface ...`: the node's cloud interfaces (interface-backed pools), their
//! addresses and prefixes, and the import of AWS VPC CNI's ipamd checkpoint.

use std::net::IpAddr;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use corral_api::{InterfaceInfo, InterfaceRequest, IpamdImportRequest};

use crate::commands::{Session, read_input};
use crate::exit::{Failure, Outcome};
use crate::output::{self, Table};

#[derive(Debug, Subcommand)]
pub enum InterfaceCommand {
    /// The interfaces of the node's interface-backed pools, with their addresses and use
    List {
        /// Only this pool
        #[arg(long)]
        pool: Option<String>,
    },
    /// One interface: its addresses, their use, and the freeable ones
    Show { id: String },
    /// Add an interface to a pool (which becomes interface-backed)
    Add(AddArgs),
    /// Remove an interface and its addresses; refused while it holds allocations, or is the
    /// primary or a trunk interface, unless --force (which releases its allocations)
    Remove {
        id: String,
        #[arg(long)]
        force: bool,
    },
    /// Add or remove an interface's secondary addresses and delegated prefixes
    #[command(subcommand)]
    Address(AddressCommand),
    /// Import AWS VPC CNI's ipamd checkpoint (vpc-cni-ipam/1, e.g.
    /// /var/run/aws-node/ipam.json) into an interface-backed pool, all or nothing
    ///
    /// Add the node's interfaces and their addresses first (as ipamd learns them from the
    /// instance metadata): every address of the checkpoint must lie on one of the pool's
    /// interfaces. Each allocation is recorded under its CNI key (network, container ID,
    /// interface), so the runtime's later DEL or CHECK of the pod finds it.
    #[command(name = "import-ipamd")]
    ImportIpamd {
        /// The checkpoint file ("-": standard input)
        file: PathBuf,
        #[arg(long)]
        pool: String,
    },
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// The interface's ID (eni-0123456789abcdef0)
    id: String,
    /// The pool it serves (created, interface-backed, if missing)
    #[arg(long)]
    pool: String,
    /// Its device index on the instance (0: the primary interface)
    #[arg(long = "device", value_name = "N")]
    device_number: u32,
    /// Its hardware address
    #[arg(long)]
    mac: String,
    /// Its subnet, one per family (repeatable)
    #[arg(long = "subnet", value_name = "CIDR", required = true)]
    subnets: Vec<String>,
    /// The gateway of a family (default for IPv4: the subnet's first host)
    #[arg(long = "gateway", value_name = "IP")]
    gateways: Vec<IpAddr>,
    /// A CIDR reachable through the gateway, routed in CNI results (repeatable)
    #[arg(long = "route", value_name = "CIDR")]
    routes: Vec<String>,
    /// A secondary address or delegated prefix to add with it, for pods (repeatable)
    #[arg(long = "address", value_name = "ADDR_OR_PREFIX")]
    addresses: Vec<String>,
    /// The interface's own primary address, one per family (the ENI's primary private IP; on
    /// the primary interface, the node's address): recorded and shown, never a pod's
    #[arg(long = "primary-address", value_name = "IP")]
    primary_addresses: Vec<IpAddr>,
    /// The instance's primary interface
    #[arg(long)]
    primary: bool,
    /// A trunk interface (never given pod addresses)
    #[arg(long)]
    trunk: bool,
    /// Kept out of pod networking
    #[arg(long)]
    excluded: bool,
}

#[derive(Debug, Subcommand)]
pub enum AddressCommand {
    /// Add a secondary address (10.0.32.10) or a delegated prefix (10.0.40.16/28)
    Add { id: String, address: String },
    /// Remove one; refused while it holds allocations unless --force (which releases them)
    Remove {
        id: String,
        address: String,
        #[arg(long)]
        force: bool,
    },
}

fn flags(info: &InterfaceInfo) -> String {
    let flags: Vec<&str> = [
        (info.primary, "primary"),
        (info.trunk, "trunk"),
        (info.excluded, "excluded"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect();
    if flags.is_empty() {
        output::none()
    } else {
        flags.join(",")
    }
}

fn interface_table(interfaces: &[&InterfaceInfo]) -> String {
    let mut table = Table::new(&[
        "POOL",
        "INTERFACE",
        "DEVICE",
        "MAC",
        "SUBNETS",
        "FLAGS",
        "ADDRS",
        "PREFIXES",
        "TOTAL",
        "ASSIGNED",
        "COOLING",
        "FREEABLE",
    ])
    .right(&[
        "DEVICE", "ADDRS", "PREFIXES", "TOTAL", "ASSIGNED", "COOLING", "FREEABLE",
    ]);
    for info in interfaces {
        table.push(vec![
            info.pool.clone(),
            info.id.clone(),
            info.device_number.to_string(),
            info.mac.clone(),
            info.subnets.join(","),
            flags(info),
            info.n_addresses.to_string(),
            info.n_prefixes.to_string(),
            info.total.to_string(),
            info.assigned.to_string(),
            info.cooling.to_string(),
            info.freeable.len().to_string(),
        ]);
    }
    table.render()
}

fn one_interface(info: &InterfaceInfo) -> String {
    let mut text = interface_table(&[info]);
    let gateways: Vec<String> = info.gateways.iter().map(ToString::to_string).collect();
    let primary: Vec<String> = info
        .primary_addresses
        .iter()
        .map(ToString::to_string)
        .collect();
    text.push_str(&format!(
        "primary address: {}\ngateways: {}\nroutes: {}\naddresses: {}\nfreeable: {}\n",
        list(&primary),
        list(&gateways),
        list(&info.routes),
        list(&info.addresses),
        list(&info.freeable),
    ));
    text
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        output::none()
    } else {
        items.join(" ")
    }
}

pub fn run(session: &mut Session, command: InterfaceCommand) -> Result<Outcome, Failure> {
    match command {
        InterfaceCommand::List { pool } => {
            let response = session.client.interfaces(pool.as_deref())?;
            session.render(&response, |response| {
                let interfaces: Vec<&InterfaceInfo> =
                    response.pools.iter().flat_map(|p| &p.interfaces).collect();
                if interfaces.is_empty() {
                    return "no interfaces\n".to_owned();
                }
                let mut text = interface_table(&interfaces);
                for pool in &response.pools {
                    text.push_str(&format!(
                        "pool {}: {} addresses, {} assigned, {} cooling\n",
                        pool.pool, pool.total, pool.assigned, pool.cooling
                    ));
                }
                text
            })
        }
        InterfaceCommand::Show { id } => {
            let info = session.client.interface(&id)?;
            session.render(&info, one_interface)
        }
        InterfaceCommand::Add(args) => {
            let request = InterfaceRequest {
                pool: args.pool,
                id: args.id,
                device_number: args.device_number,
                mac: args.mac,
                subnets: args.subnets,
                gateways: args.gateways,
                routes: args.routes,
                primary: args.primary,
                primary_addresses: args.primary_addresses,
                trunk: args.trunk,
                excluded: args.excluded,
                addresses: args.addresses,
            };
            let info = session.client.add_interface(&request)?;
            session.render(&info, one_interface)
        }
        InterfaceCommand::Remove { id, force } => {
            let removed = session.client.remove_interface(&id, force)?;
            session.render(&removed, |removed| {
                format!(
                    "removed interface {} from pool {}; addresses to give back: {}\n",
                    removed.id,
                    removed.pool,
                    list(&removed.addresses)
                )
            })
        }
        InterfaceCommand::Address(AddressCommand::Add { id, address }) => {
            let info = session.client.add_interface_address(&id, &address)?;
            session.render(&info, one_interface)
        }
        InterfaceCommand::Address(AddressCommand::Remove { id, address, force }) => {
            let info = session
                .client
                .remove_interface_address(&id, &address, force)?;
            session.render(&info, one_interface)
        }
        InterfaceCommand::ImportIpamd { file, pool } => {
            let text = read_input(&file)?;
            let checkpoint: serde_json::Value = serde_json::from_str(&text).map_err(|error| {
                Failure::Usage(format!("{} is not JSON: {error}", file.display()))
            })?;
            let response = session
                .client
                .import_ipamd(&IpamdImportRequest { pool, checkpoint })?;
            session.render(&response, |response| {
                let mut table =
                    Table::new(&["ATTACHMENT", "ADDRESS", "OWNER", "INTERFACE", "DEVICE"])
                        .right(&["DEVICE"]);
                for imported in &response.imported {
                    table.push(vec![
                        format!(
                            "{}/{}/{}",
                            imported.key.network, imported.key.container_id, imported.key.ifname
                        ),
                        imported.address.to_string(),
                        imported.owner.clone(),
                        imported.interface.clone(),
                        imported.device_number.to_string(),
                    ]);
                }
                let mut text = String::new();
                if !table.is_empty() {
                    text.push_str(&table.render());
                }
                text.push_str(&format!(
                    "imported {} allocations into pool {}\n",
                    response.imported.len(),
                    response.pool
                ));
                text
            })
        }
    }
}
