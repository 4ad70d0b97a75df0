//! Reads the node's interfaces, addresses and routes (every table) through rtnetlink, for
//! the reservation of local routes (`local_routes.rs`, which decides what they exclude).
//!
//! Three dumps on one blocking `NETLINK_ROUTE` socket (netlink-sys), decoded by
//! netlink-packet-route: links (for their names), addresses, routes. A dump the kernel
//! marks as interrupted (`NLM_F_DUMP_INTR`: the tables changed while it ran) is read again.

use std::collections::BTreeMap;
use std::net::IpAddr;

use corral_core::IpNet;
use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteNextHop, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::protocols::NETLINK_ROUTE;
use netlink_sys::{Socket, SocketAddr};

use corral_api::ErrorCode;

use crate::error::OpError;
use crate::local_routes::{HostNetworks, LocalAddress, LocalRoute, NextHop, RouteKind};

/// Why the node's networks could not be read.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("netlink socket: {0}")]
    Socket(#[source] std::io::Error),
    #[error("netlink {what} dump: {message}")]
    Dump { what: &'static str, message: String },
}

/// How often an interrupted dump is read again before giving up.
const DUMP_ATTEMPTS: usize = 5;

/// The node's interface addresses and routes, as the kernel holds them now.
pub fn read_host_networks() -> Result<HostNetworks, NetlinkError> {
    let mut socket = Socket::new(NETLINK_ROUTE).map_err(NetlinkError::Socket)?;
    socket.bind_auto().map_err(NetlinkError::Socket)?;
    socket
        .connect(&SocketAddr::new(0, 0))
        .map_err(NetlinkError::Socket)?;
    let mut sequence = 0;
    let links = dump(
        &socket,
        &mut sequence,
        "link",
        RouteNetlinkMessage::GetLink(LinkMessage::default()),
    )?;
    let mut names: BTreeMap<u32, String> = BTreeMap::new();
    for message in links {
        if let RouteNetlinkMessage::NewLink(link) = message {
            let name = link.attributes.iter().find_map(|a| match a {
                LinkAttribute::IfName(name) => Some(name.clone()),
                _ => None,
            });
            if let Some(name) = name {
                names.insert(link.header.index, name);
            }
        }
    }
    let device = |index: u32| {
        names
            .get(&index)
            .cloned()
            .unwrap_or_else(|| format!("if{index}"))
    };

    let mut host = HostNetworks::default();
    let addresses = dump(
        &socket,
        &mut sequence,
        "address",
        RouteNetlinkMessage::GetAddress(AddressMessage::default()),
    )?;
    for message in addresses {
        if let RouteNetlinkMessage::NewAddress(address) = message
            && let Some(local) = local_address(&address, &device)
        {
            host.addresses.push(local);
        }
    }
    let routes = dump(
        &socket,
        &mut sequence,
        "route",
        RouteNetlinkMessage::GetRoute(RouteMessage::default()),
    )?;
    for message in routes {
        if let RouteNetlinkMessage::NewRoute(route) = message
            && let Some(local) = local_route(&route, &device)
        {
            host.routes.push(local);
        }
    }
    Ok(host)
}

/// An address message as an interface address: IPv4 gives its own address as `Local`
/// (`Address` is the peer's on a point-to-point link), IPv6 only as `Address`.
fn local_address(
    message: &AddressMessage,
    device: &impl Fn(u32) -> String,
) -> Option<LocalAddress> {
    let find = |want_local: bool| {
        message.attributes.iter().find_map(|a| match a {
            AddressAttribute::Local(ip) if want_local => Some(*ip),
            AddressAttribute::Address(ip) if !want_local => Some(*ip),
            _ => None,
        })
    };
    let address = find(true).or_else(|| find(false))?;
    let prefix_len = message.header.prefix_len;
    // A prefix longer than the family allows would be the kernel's bug; skip it.
    IpNet::new(address, prefix_len).ok()?;
    Some(LocalAddress {
        device: device(message.header.index),
        address,
        prefix_len,
    })
}

fn route_address(address: &RouteAddress) -> Option<IpAddr> {
    match address {
        RouteAddress::Inet(ip) => Some(IpAddr::V4(*ip)),
        RouteAddress::Inet6(ip) => Some(IpAddr::V6(*ip)),
        _ => None,
    }
}

fn gateway_of(attributes: &[RouteAttribute]) -> Option<IpAddr> {
    attributes.iter().find_map(|a| match a {
        RouteAttribute::Gateway(address) => route_address(address),
        _ => None,
    })
}

/// A route message as a route of the node: IPv4 and IPv6 only; no destination attribute
/// means the default route of its family.
fn local_route(message: &RouteMessage, device: &impl Fn(u32) -> String) -> Option<LocalRoute> {
    let unspecified: IpAddr = match message.header.address_family {
        AddressFamily::Inet => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        AddressFamily::Inet6 => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        _ => return None,
    };
    let destination_address = message
        .attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Destination(address) => route_address(address),
            _ => None,
        })
        .unwrap_or(unspecified);
    let destination = IpNet::new(
        destination_address,
        message.header.destination_prefix_length,
    )
    .ok()?;
    let kind = match message.header.kind {
        RouteType::Unicast => RouteKind::Unicast,
        RouteType::Local => RouteKind::Local,
        _ => RouteKind::Other,
    };
    let mut next_hops = Vec::new();
    let output = message.attributes.iter().find_map(|a| match a {
        RouteAttribute::Oif(index) => Some(*index),
        _ => None,
    });
    if let Some(index) = output {
        next_hops.push(NextHop {
            device: device(index),
            gateway: gateway_of(&message.attributes),
        });
    }
    for attribute in &message.attributes {
        if let RouteAttribute::MultiPath(hops) = attribute {
            next_hops.extend(hops.iter().map(|hop: &RouteNextHop| NextHop {
                device: device(hop.interface_index),
                gateway: gateway_of(&hop.attributes),
            }));
        }
    }
    Some(LocalRoute {
        destination,
        kind,
        next_hops,
    })
}

/// One dump request and every message it answers, read again while the kernel says the
/// dump was interrupted.
fn dump(
    socket: &Socket,
    sequence: &mut u32,
    what: &'static str,
    request: RouteNetlinkMessage,
) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
    let fail = |message: String| NetlinkError::Dump { what, message };
    for _ in 0..DUMP_ATTEMPTS {
        *sequence += 1;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        header.sequence_number = *sequence;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(request.clone()));
        packet.finalize();
        let mut buffer = vec![0; packet.buffer_len()];
        packet.serialize(&mut buffer);
        socket
            .send(&buffer, 0)
            .map_err(|e| fail(format!("send: {e}")))?;
        match read_dump(socket, *sequence).map_err(fail)? {
            Some(messages) => return Ok(messages),
            None => continue,
        }
    }
    Err(fail(format!(
        "interrupted {DUMP_ATTEMPTS} times in a row (the tables kept changing)"
    )))
}

/// The messages of one dump up to its end; `None` if the kernel marked it interrupted
/// (what follows is drained, so the socket is ready for the next request).
fn read_dump(socket: &Socket, sequence: u32) -> Result<Option<Vec<RouteNetlinkMessage>>, String> {
    let mut messages = Vec::new();
    let mut interrupted = false;
    loop {
        let datagram = receive(socket)?;
        let mut offset = 0;
        while offset < datagram.len() {
            let message = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&datagram[offset..])
                .map_err(|e| format!("cannot decode a message: {e}"))?;
            let length = message.header.length as usize;
            if length == 0 {
                return Err("a message of length 0".to_owned());
            }
            // Netlink messages are 4-byte aligned in a datagram.
            offset += (length + 3) & !3;
            if message.header.sequence_number != sequence {
                // An answer to an earlier request (never expected on this socket).
                continue;
            }
            if message.header.flags & NLM_F_DUMP_INTR != 0 {
                interrupted = true;
            }
            match message.payload {
                NetlinkPayload::Done(_) => {
                    return Ok((!interrupted).then_some(messages));
                }
                NetlinkPayload::Error(error) if error.code.is_some() => {
                    return Err(error.to_io().to_string());
                }
                NetlinkPayload::InnerMessage(inner) => messages.push(inner),
                _ => {}
            }
        }
    }
}

/// One whole datagram, whatever its size (a peek tells it first).
fn receive(socket: &Socket) -> Result<Vec<u8>, String> {
    let mut peek: Vec<u8> = Vec::new();
    let size = socket
        .recv(&mut peek, libc::MSG_PEEK | libc::MSG_TRUNC)
        .map_err(|e| format!("receive: {e}"))?;
    let mut buffer: Vec<u8> = Vec::with_capacity(size.max(1));
    let read = socket
        .recv(&mut buffer, 0)
        .map_err(|e| format!("receive: {e}"))?;
    if read > buffer.len() {
        return Err(format!(
            "a datagram of {read} bytes did not fit in {} bytes",
            buffer.len()
        ));
    }
    Ok(buffer)
}

/// Reads the node's networks off the async threads; a failure is the agent's (503).
pub async fn read_host_networks_off_thread() -> Result<HostNetworks, OpError> {
    let read = tokio::task::spawn_blocking(read_host_networks)
        .await
        .map_err(|e| OpError::new(ErrorCode::RetryLater, format!("internal: {e}")))?;
    read.map_err(|e| {
        OpError::new(
            ErrorCode::RetryLater,
            format!("cannot read the node's routes and addresses: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every Linux network namespace has its loopback interface, with 127.0.0.1/8 and the
    /// local table's route for it; reading them needs no privilege.
    #[test]
    fn reads_the_loopback_address_and_its_local_routes() {
        let host = read_host_networks().unwrap();
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        assert!(
            host.addresses
                .iter()
                .any(|a| a.device == "lo" && a.address == loopback && a.prefix_len == 8),
            "{:#?}",
            host.addresses
        );
        assert!(
            host.routes.iter().any(|r| r.kind == RouteKind::Local
                && r.destination == "127.0.0.0/8".parse::<IpNet>().unwrap()
                && r.next_hops.iter().any(|h| h.device == "lo")),
            "{:#?}",
            host.routes
        );
    }
}
