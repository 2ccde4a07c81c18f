"""Which addresses a webhook may be delivered to: the host of a ``callback_url`` is resolved, and every address
it resolves to must be public (globally routable unicast, not a cloud metadata address) or inside a network the
operator allows (``webhook_allowed_networks``). One name resolving to a public and a private address is refused
as a whole: the connection could be made to either.

The API checks a target at submission; the worker checks it again right before each attempt (the name may
resolve elsewhere by then) and connects to the addresses it checked, never resolving the name a second time
(worker/webhook_transport.py), so a name that answers differently to a second lookup (DNS rebinding) gains
nothing. IPv6 addresses that carry an IPv4 address (mapped, 6to4, Teredo, NAT64) are judged by that address too.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

from core.settings import Settings

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network

# Instance metadata and host services of the large clouds: reachable from a VM, never a receiver's address.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(address)
    for address in (
        "169.254.169.254",
        "169.254.170.2",
        "169.254.170.23",
        "168.63.129.16",
        "100.100.100.200",
        "fd00:ec2::254",
        "fd00:ec2::23",
    )
)
NAT64_PREFIX = ipaddress.ip_network("64:ff9b::/96")
REFUSED_TARGET = (
    "must resolve to public addresses only: this server does not call private, loopback, link-local, multicast, "
    "reserved or cloud metadata addresses (the operator may allow networks: GPUEST_WEBHOOK_ALLOWED_NETWORKS)"
)


class TargetRefused(Exception):
    """The host resolves to an address this server does not call."""


def lookup(host: str, port: int) -> list[str]:
    """The addresses the system resolver gives for ``host``, in its order (the one place a name is resolved)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def resolve(host: str, port: int) -> list[str]:
    """An address literal as itself, a name through :func:`lookup`. Raises OSError when the name does not
    resolve (UnicodeError for a name that cannot be encoded)."""
    literal = host.strip("[]")
    try:
        ipaddress.ip_address(literal)
    except ValueError:
        return lookup(host, port)
    return [literal]


def allowed_networks(settings: Settings) -> list[IPNetwork]:
    return [ipaddress.ip_network(entry, strict=False) for entry in settings.webhook_allowed_networks]


def parse_address(address: str) -> IPAddress:
    """The address without an IPv6 zone (``fe80::1%eth0``), an IPv4-mapped IPv6 address as its IPv4 one."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def embedded_ipv4(ip: IPv6Address) -> IPv4Address | None:
    """The IPv4 address a 6to4, Teredo or NAT64 address reaches (None for other IPv6 addresses)."""
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in NAT64_PREFIX:
        return IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def is_public(ip: IPAddress) -> bool:
    if ip in METADATA_ADDRESSES or ip.is_multicast or not ip.is_global:
        return False
    inner = embedded_ipv4(ip) if isinstance(ip, IPv6Address) else None
    return inner is None or is_public(inner)


def is_allowed_address(address: str, networks: Sequence[IPNetwork]) -> bool:
    """Whether this server calls ``address``: public, or inside an allowed network (a metadata address only
    through a network of that one address)."""
    ip = parse_address(address)
    inside = [network for network in networks if network.version == ip.version and ip in network]
    if ip in METADATA_ADDRESSES:
        return any(network.num_addresses == 1 for network in inside)
    return bool(inside) or is_public(ip)


def vetted_addresses(host: str, port: int, settings: Settings) -> list[str]:
    """The addresses ``host`` resolves to, all of them allowed. Raises TargetRefused when any is not (or the
    name cannot be encoded), OSError when the name does not resolve."""
    try:
        addresses = resolve(host, port)
    except UnicodeError as exc:
        raise TargetRefused(host) from exc
    networks = allowed_networks(settings)
    if not addresses or not all(is_allowed_address(address, networks) for address in addresses):
        raise TargetRefused(host)
    return addresses
