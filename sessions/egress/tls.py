"""The server name a TLS ClientHello asks for (SNI), read from the first bytes of a CONNECT
tunnel, so the egress proxy can refuse a tunnel whose TLS names another host than the one the
policy allowed (domain fronting). Only the record and handshake headers and the extensions are
parsed; nothing is decrypted (docs/architecture.md, "Egress").

The standard library parses no ClientHello, and the wire format is small and fixed (RFC 8446
§4.1.2, RFC 6066 §3), so this is the whole parser."""

import struct
from dataclasses import dataclass

HANDSHAKE, CLIENT_HELLO, SERVER_NAME, HOST_NAME = 22, 1, 0, 0
# Extensions that hide the name the client really asks for (Encrypted ClientHello, its draft ESNI).
ENCRYPTED_NAMES = {0xFE0D, 0xFFCE}
MAX_HELLO = 16384  # one TLS record: a ClientHello that needs more is refused


class NotTLS(ValueError):
    """The bytes are not the start of a TLS ClientHello."""


@dataclass(frozen=True)
class Hello:
    server_name: str | None  # None: the client sent no SNI
    encrypted_name: bool = False  # it carries an encrypted name beside the one in the clear


def client_hello(data: bytes) -> Hello | None:
    """The ClientHello in `data`, None while more bytes are needed, or NotTLS."""
    if len(data) >= 1 and data[0] != HANDSHAKE:
        raise NotTLS("not a TLS handshake record")
    if len(data) < 5:
        return None
    major, length = data[1], struct.unpack(">H", data[3:5])[0]
    if major != 3 or length > MAX_HELLO:
        raise NotTLS("not a TLS record header")
    if len(data) < 5 + length:
        return None
    body = data[5:5 + length]
    if len(body) < 4 or body[0] != CLIENT_HELLO or int.from_bytes(body[1:4], "big") > len(body) - 4:
        raise NotTLS("not a ClientHello in one record")
    return _hello(body[4:4 + int.from_bytes(body[1:4], "big")])


def _hello(hello: bytes) -> Hello:
    reader = _Reader(hello)
    reader.take(2 + 32)  # legacy version, random
    reader.take(reader.int(1))  # session id
    reader.take(reader.int(2))  # cipher suites
    reader.take(reader.int(1))  # compression methods
    if reader.left() == 0:
        return Hello(server_name=None)  # no extensions at all
    server_name, encrypted = None, False
    extensions = _Reader(reader.take(reader.int(2)))
    while extensions.left():
        kind, data = extensions.int(2), extensions.take(extensions.int(2))
        encrypted = encrypted or kind in ENCRYPTED_NAMES
        if kind == SERVER_NAME and server_name is None:
            names = _Reader(data)
            names = _Reader(names.take(names.int(2)))
            while names.left():
                name_type, name = names.int(1), names.take(names.int(2))
                if name_type == HOST_NAME:
                    try:
                        server_name = name.decode("ascii").lower()
                    except UnicodeDecodeError:
                        raise NotTLS("a server name that is not ASCII") from None
                    break
    return Hello(server_name=server_name, encrypted_name=encrypted)


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def left(self) -> int:
        return len(self.data) - self.at

    def take(self, count: int) -> bytes:
        if count > self.left():
            raise NotTLS("a ClientHello field runs past its end")
        chunk, self.at = self.data[self.at:self.at + count], self.at + count
        return chunk

    def int(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")
