"""SNI as the egress proxy reads it, from ClientHellos that Python's own TLS stack writes."""

import ssl

import pytest

from sessions.egress.tls import Hello, NotTLS, client_hello


def hello_from_openssl(server_name: str | None) -> bytes:
    """The first flight of a real TLS client (OpenSSL through the ssl module), no socket."""
    context = ssl.create_default_context()
    context.check_hostname = server_name is not None
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


@pytest.mark.parametrize("name", ["pypi.org", "files.pythonhosted.org", "a" * 63 + ".example.com"])
def test_the_server_name_of_a_real_client_hello_is_read(name):
    assert client_hello(hello_from_openssl(name)) == Hello(server_name=name)


def test_a_client_hello_without_sni_has_no_name():
    assert client_hello(hello_from_openssl(None)) == Hello(server_name=None)


def test_a_partial_client_hello_asks_for_more_bytes_at_every_cut():
    data = hello_from_openssl("pypi.org")
    assert all(client_hello(data[:cut]) is None for cut in range(1, len(data)))
    assert client_hello(data) is not None


@pytest.mark.parametrize("data", [
    b"GET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n",  # plain HTTP on 443
    b"SSH-2.0-OpenSSH_9.2\r\n",
    b"\x16\x03\x01\xff\xff" + b"\0" * 10,  # a record longer than any hello
    b"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00",  # a handshake that is not a ClientHello
])
def test_what_is_not_a_client_hello_is_refused(data):
    with pytest.raises(NotTLS):
        client_hello(data)


def test_a_hello_cut_short_inside_its_fields_is_refused_not_crashed():
    body = hello_from_openssl("pypi.org")[9:]  # after the record header (5 bytes) and the handshake's (4)
    refused = 0
    for size in range(len(body)):
        handshake = bytes([1]) + size.to_bytes(3, "big") + body[:size]
        record = b"\x16\x03\x01" + len(handshake).to_bytes(2, "big") + handshake
        try:
            result = client_hello(record)  # any other exception than NotTLS fails the test
        except NotTLS:
            refused += 1
            continue
        assert result.server_name in {None, "pypi.org"}
    assert refused > len(body) // 2
