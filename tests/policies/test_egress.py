"""The deny set: addresses no policy opens, in every spelling an attacker would try. Nothing here
sends a packet: the addresses are only classified."""
# ruff: noqa: S104 - the addresses are data under test; nothing binds them

import ipaddress
import re
import subprocess

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


def test_this_hosts_own_addresses_are_denied_to_the_proxy(monkeypatch):
    own = egress.host_addresses()
    assert ipaddress.ip_address("127.0.0.1") in own
    assert all(egress.denied_address(address) is not None for address in own)
    # Every address the kernel lists as local, secondary ones included (`ip addr` agrees).
    listed = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    for found in re.findall(r"inet6? ([0-9a-f.:]+)/", listed):
        assert ipaddress.ip_address(found) in own, found
    # A host with a public address: that address is refused to the proxy, not to a policy document.
    public = ipaddress.ip_address("151.101.0.223")
    monkeypatch.setattr(egress, "host_addresses", lambda: frozenset({public}))
    assert egress.denied_address(public) == "an address of this host"
    assert egress.denied_address(public, this_host=False) is None


@pytest.fixture
def published(acme):
    from policies_app import services

    def publish(source: str):
        policy = acme.policies.filter(name="default").first() or services.policy_create(
            tenant=acme, name="default", actor=None)
        version = services.version_create(policy=policy, source=source, actor=None)
        services.version_publish(version=version, actor=None, note="test")
        return policy

    return publish


def _denial(acme, policy, host, port=443):
    from policies_app.decisions import decide

    return decide(tenant=acme, policy=policy, request={"host": host, "port": port}, kind="egress").record


def test_allow_this_on_an_egress_denial_drafts_exactly_its_host_and_port(acme, published):
    from policies_app import narrowing
    from policies_app.document import PolicyDocument

    policy = published("commands: []\n")  # egress: none
    draft = narrowing.draft_allowing(record=_denial(acme, policy, "files.example"), actor=None)
    network = PolicyDocument.model_validate(draft.document).network
    assert (network.egress, network.allow) == ("allowlist", ["files.example:443"])
    assert "egress was none" in draft.source and draft.parent == policy.published_version()

    policy = published("network: {egress: allowlist, allow: ['pypi.org:443'], max_bytes: 1000000}\n")
    draft = narrowing.draft_allowing(record=_denial(acme, policy, "files.example", 80), actor=None)
    network = PolicyDocument.model_validate(draft.document).network
    assert (network.allow, network.max_bytes) == (["pypi.org:443", "files.example:80"], 1000000)


def test_allow_this_is_not_offered_for_what_no_rule_decides(acme, published):
    from policies_app import narrowing

    policy = published("network: {egress: allowlist, allow: ['pypi.org:443']}\n")
    metadata = _denial(acme, policy, "169.254.169.254", 80)
    assert "holds whatever the policy says" in narrowing.why_not(metadata)
    with pytest.raises(narrowing.NotNarrowable):
        narrowing.draft_allowing(record=metadata, actor=None)
    stale = _denial(acme, policy, "files.example")  # denied under v1; v2 then allows it
    assert published("network: {egress: allowlist, allow: ['pypi.org:443', 'files.example:443']}\n") == policy
    assert "v2, published since, already allows it" in narrowing.why_not(stale)


@pytest.mark.parametrize("entry, shared", [
    ("*.amazonaws.com:443", "amazonaws.com"), ("*.windows.net:443", "blob.core.windows.net"),
    ("*.core.windows.net:443", "blob.core.windows.net"),
])
def test_lint_warns_of_a_wildcard_over_shared_hosting(entry, shared):
    from policies_app import lint
    from policies_app.document import parse_yaml

    warnings = lint.lint(parse_yaml(f"network: {{egress: allowlist, allow: ['{entry}']}}\n"))
    assert any(f"names anyone can create under {shared}" in warning.message for warning in warnings), warnings
    exact = lint.lint(parse_yaml("network: {egress: allowlist, allow: ['my-bucket.s3.amazonaws.com:443']}\n"))
    assert not any("anyone can create" in warning.message for warning in exact)
