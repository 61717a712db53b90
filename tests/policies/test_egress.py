"""The deny set: addresses no policy opens, in every spelling an attacker would try. Nothing here
sends a packet: the addresses are only classified."""
# ruff: noqa: S104 - the addresses are data under test; nothing binds them

import ipaddress

import pytest

from policies_app import egress


@pytest.mark.parametrize("address, why", [
    ("127.0.0.1", "loopback"), ("127.8.9.10", "loopback"), ("0.0.0.0", "unspecified"), ("0.1.2.3", "private"),
    ("10.1.2.3", "private"), ("172.16.0.1", "private"), ("192.168.1.1", "private"), ("100.64.0.1", "routable"),
    ("169.254.169.254", "metadata"), ("169.254.1.1", "link-local"), ("224.0.0.251", "multicast"),
    ("240.0.0.1", "private"), ("255.255.255.255", "private"),
    ("::1", "loopback"), ("::", "unspecified"), ("fe80::1", "link-local"), ("fc00::1", "private"),
    ("fd12:3456::1", "private"), ("ff02::1", "multicast"),
    ("::ffff:127.0.0.1", "IPv6 form of 127.0.0.1"), ("::ffff:169.254.169.254", "metadata"),
    ("2002:a9fe:a9fe::", "IPv6 form of 169.254.169.254"), ("64:ff9b::a00:1", "IPv6 form of 10.0.0.1"),
    ("2001:0:4136:e378:8000:63bf:f5ff:fffe", "IPv6 form of 10.0.0.1"),  # Teredo, client 10.0.0.1
])
def test_every_non_public_address_is_denied_with_its_reason(address, why):
    reason = egress.denied_address(ipaddress.ip_address(address))
    assert reason is not None and why in reason, (address, reason)


@pytest.mark.parametrize("address", ["8.8.8.8", "151.101.0.223", "2a04:4e42::223", "::ffff:8.8.8.8"])
def test_a_public_address_is_not_in_the_deny_set(address):
    assert egress.denied_address(ipaddress.ip_address(address), this_host=False) is None


def test_this_hosts_own_addresses_are_denied_to_the_proxy():
    own = egress.host_addresses()
    assert ipaddress.ip_address("127.0.0.1") in own
    assert all(egress.denied_address(address) is not None for address in own)
