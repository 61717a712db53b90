"""The network side of a policy: which `network.allow` entries are valid, which host and port an
entry admits, and the deny set of addresses no policy can open (docs/architecture.md, "Egress").

An entry is `host:port` or `*.suffix:port` (any name under the suffix, never the suffix itself).
The schema refuses a wildcard over a public suffix (`*.com`, `*.co.uk`) or over everything (`*`).
An IP literal in the deny set is refused at publish and flagged by lint, not by the schema:
versions stored before this check must still load, and the proxy refuses it anyway.

The deny set is every address that is not globally routable (loopback, 0.0.0.0/8, RFC 1918,
100.64/10, link-local with the cloud metadata address, multicast, reserved, fc00::/7, fe80::/10,
...), the same through IPv4-mapped, 6to4, NAT64 and Teredo forms, and every address of this
host's own interfaces."""

import fcntl
import functools
import ipaddress
import re
import socket
import struct
import time

from publicsuffixlist import PublicSuffixList

HOST = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
ENTRY = re.compile(rf"(?P<wildcard>\*\.)?(?P<host>{HOST}|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{{1,5}})")
# Egress refusals a rule decides ("Allow this" and exceptions can turn them), and those no rule
# decides: the proxy's guards, whatever the policy says. Replay leaves the guards' out (a draft
# cannot change them), and neither "Allow this" nor an exception is offered for them.
RULE_REASONS = {"egress_denied", "egress_ip_literal"}
GUARD_REASONS = {"egress_address_denied", "egress_fronting", "egress_not_tls", "egress_control_plane",
                 "limit_exceeded"}
# Domains under which anyone can make a name of their own (buckets, functions, pages, tunnels)
# that the Public Suffix List does not always mark: a wildcard over one admits strangers' hosts.
SHARED_HOSTING = {
    "amazonaws.com", "cloudfront.net", "awsapps.com", "googleapis.com", "googleusercontent.com", "appspot.com",
    "run.app", "cloudfunctions.net", "windows.net", "azurewebsites.net", "azureedge.net", "azurefd.net",
    "herokuapp.com", "github.io", "githubusercontent.com", "gitlab.io", "vercel.app", "netlify.app", "pages.dev",
    "workers.dev", "r2.dev", "firebaseapp.com", "web.app", "fly.dev", "onrender.com", "ngrok.io", "ngrok-free.app",
    "trycloudflare.com", "digitaloceanspaces.com", "backblazeb2.com", "wasabisys.com", "fastly.net",
    "akamaihd.net", "edgekey.net", "blob.core.windows.net", "s3.amazonaws.com", "storage.googleapis.com",
}


def shared_wildcard(entry: str) -> str | None:
    """The shared-hosting domain a wildcard entry reaches into, or None."""
    parsed = parsed_or_none(entry)
    if parsed is None or not parsed[0]:
        return None
    suffix = parsed[1]
    return next((shared for shared in sorted(SHARED_HOSTING)
                 if suffix == shared or shared.endswith("." + suffix)), None)


# Hosts where an allow to fetch is also an allow to push: lint says so.
CODE_HOSTS = {"github.com", "gitlab.com", "bitbucket.org", "codeberg.org"}
METADATA = ipaddress.ip_address("169.254.169.254")
NAT64 = ipaddress.ip_network("64:ff9b::/96")
SITE_LOCAL = ipaddress.ip_network("fec0::/10")  # deprecated, but still routed inside some networks
SIOCGIFADDR = 0x8915


class InvalidEntry(ValueError):
    pass


@functools.cache
def _public_suffixes() -> PublicSuffixList:
    return PublicSuffixList()  # the list the package ships: no download


def parse_entry(entry: str) -> tuple[bool, str, int]:
    """(wildcard, host in lower case, port) of a valid entry, or InvalidEntry saying why."""
    match = ENTRY.fullmatch(entry.strip())
    if match is None:
        if entry.strip().split(":")[0] in {"*", "*.*"}:
            raise InvalidEntry(f"{entry!r} would allow every host; list the hosts themselves")
        raise InvalidEntry(f"{entry!r} is not host:port or *.suffix:port (an IP range is never an entry)")
    wildcard, host, port = bool(match["wildcard"]), match["host"].lower().strip("[]"), int(match["port"])
    if not 1 <= port <= 65535:
        raise InvalidEntry(f"{entry!r}: port {port} is not 1-65535")
    literal = ip_literal(host)
    if literal is not None:
        if wildcard:
            raise InvalidEntry(f"{entry!r}: an address takes no wildcard")
    elif wildcard and (_public_suffixes().is_public(host) or "." not in host):
        raise InvalidEntry(f"{entry!r}: `{host}` is a public suffix, so this allows anyone's hosts; name a domain "
                           f"you trust, such as *.example.{host}")
    return wildcard, host, port


def parsed_or_none(entry: str) -> tuple[bool, str, int] | None:
    """The entry parsed, or None for one this version of the schema refuses (an older stored
    version may hold it: it then admits nothing)."""
    try:
        return parse_entry(entry)
    except InvalidEntry:
        return None


def unreachable_entry(entry: str) -> str | None:
    """Why an entry names an address egress never reaches, or None."""
    parsed = parsed_or_none(entry)
    literal = ip_literal(parsed[1]) if parsed else None
    if literal is not None and (reason := denied_address(literal, this_host=False)):
        return f"`{entry}`: {literal} is {reason}, which egress never reaches"
    return None


def admits(entry: tuple[bool, str, int] | None, host: str, port: int) -> bool:
    """Whether a parsed entry admits `host:port` (a wildcard admits names under its suffix only)."""
    if entry is None:
        return False
    wildcard, name, entry_port = entry
    host = host.lower().rstrip(".")
    if port != entry_port:
        return False
    return host.endswith("." + name) if wildcard else host == name


def ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def denied_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address, *, this_host: bool = True) -> str | None:
    """Why egress never connects to `address`, or None for a public address. `this_host`: also
    refuse this host's own addresses (the proxy does; a policy document, valid on any host, not)."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = (address.ipv4_mapped or address.sixtofour or (address.teredo or (None, None))[1]
                    or (ipaddress.IPv4Address(int(address) & 0xFFFFFFFF) if address in NAT64 else None))
        if embedded is not None:
            reason = denied_address(embedded, this_host=this_host)
            return f"an IPv6 form of {embedded}, {reason}" if reason else None
    if address == METADATA:
        return "the cloud metadata address"
    if address.version == 6 and address in SITE_LOCAL:
        return "site-local (a private network)"
    for test, reason in ((address.is_loopback, "loopback"), (address.is_unspecified, "unspecified"),
                         (address.is_link_local, "link-local"), (address.is_multicast, "multicast"),
                         (address.is_private, "a private network"), (address.is_reserved, "reserved"),
                         (not address.is_global, "not globally routable")):
        if test:
            return reason
    if this_host and address in host_addresses():
        return "an address of this host"
    return None


HOST_ADDRESSES_FRESH_S = 1.0
_host_addresses: tuple[float, frozenset] = (float("-inf"), frozenset())


def host_addresses() -> frozenset:
    """Every address of this host's interfaces, secondary ones included: read from the kernel at
    most once a second (they change, and a proxy asks on every connection)."""
    global _host_addresses
    read_at, addresses = _host_addresses
    if time.monotonic() - read_at > HOST_ADDRESSES_FRESH_S:
        _host_addresses = (time.monotonic(), addresses := _read_host_addresses())
    return addresses


def _read_host_addresses() -> frozenset:
    """IPv4 from the local routing table, IPv6 from /proc/net/if_inet6."""
    found = set()
    try:
        with open("/proc/net/fib_trie") as trie:
            last = None
            for line in trie:
                fields = line.split()
                if fields[:1] == ["|--"]:
                    last = fields[1]
                elif "host" in fields and "LOCAL" in fields and last is not None:
                    found.add(ipaddress.IPv4Address(last))
    except OSError:  # no /proc here: the primary address of each interface
        found |= _primary_ipv4_addresses()
    try:
        with open("/proc/net/if_inet6") as table:
            for line in table:
                found.add(ipaddress.IPv6Address(int(line.split()[0], 16)))
    except OSError:  # no IPv6 here
        pass
    return frozenset(found)


def _primary_ipv4_addresses() -> set:
    found = set()
    for _index, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                raw = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on this interface
                continue
        found.add(ipaddress.IPv4Address(raw[20:24]))
    return found
