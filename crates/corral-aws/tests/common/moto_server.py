"""moto_server with EC2's rules for the private addresses it picks.

moto (5.2) picks an interface's or instance's private IPv4 addresses at random from the
whole subnet: the network address, the VPC router (.1), the DNS server (.2), the address
AWS keeps for future use (.3) and the broadcast address included, and an address already
handed out as well. EC2 never hands out those five, nor an address in use. An interface
with the subnet's gateway among its addresses is one corral refuses to serve (rightly),
so the tests against moto failed one run in about twenty-five.

This wrapper replaces moto's picker (`moto.ec2.utils.random_private_ip`, wherever moto's
modules bound it) with one that keeps EC2's rules, then runs moto_server as its own script
does: `python3 moto_server.py -H 127.0.0.1 -p PORT`. IPv6 picks and picks without a subnet
are moto's own. Once every address of a subnet was handed out, addresses are handed out
again (moto's own exhaustion behaviour, which the tests do not rely on).
"""

import ipaddress
import random
import sys

import moto.ec2.utils as utils

_moto_pick = utils.random_private_ip
_handed_out = {}


def random_private_ip(cidr=None, ipv6=False):
    if cidr is None or ipv6:
        return _moto_pick(cidr, ipv6)
    subnet = ipaddress.IPv4Network(cidr)
    first = int(subnet.network_address) + 4
    last = int(subnet.broadcast_address) - 1
    if last < first:
        return _moto_pick(cidr, ipv6)
    handed = _handed_out.setdefault(subnet, set())
    if len(handed) > last - first:
        handed.clear()
    while True:
        candidate = random.randint(first, last)
        if candidate not in handed:
            handed.add(candidate)
            return str(ipaddress.IPv4Address(candidate))


utils.random_private_ip = random_private_ip
for module in list(sys.modules.values()):
    if getattr(module, "random_private_ip", None) is _moto_pick:
        module.random_private_ip = random_private_ip

from moto.server import main  # noqa: E402  (after the picker is replaced)

if __name__ == "__main__":
    sys.argv[0] = "moto_server"
    sys.exit(main())
