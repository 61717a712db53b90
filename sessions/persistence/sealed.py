"""A blob's encryption: AES-256-GCM over 1 MiB segments, in the shape of Tink's streaming AEAD.

    header = MAGIC | salt (16) | nonce prefix (7)
    segment i = AES-GCM(key, nonce = prefix | i (4, big-endian) | last (1), plaintext, aad = header)

The key is derived from the tenant's data key with the salt and the object's id (keys.subkey), so
no two blobs share a key and a blob copied under another object's name, or another tenant's, does
not open. Each segment is authenticated on its own; the last one says so in its nonce, so a blob
cut short, reordered or extended fails too. Encrypting streams (the tar arrives as it is made);
decrypting streams too, a segment handed on only once it has authenticated, and a restore keeps
nothing until the last one has (services.unpack_checked)."""

import os
from collections.abc import Iterator
from typing import BinaryIO

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from controlplane.keys import TenantKey, subkey

MAGIC = b"ALKS1\0"
SEGMENT = 1 << 20
TAG = 16
HEADER = len(MAGIC) + 16 + 7


class Unsealable(Exception):
    """The blob does not open under this tenant's key for this object: altered, cut, or not its own."""


def _aead(key: TenantKey, object_id: str, salt: bytes) -> AESGCM:
    return AESGCM(subkey(key, f"blob\0{object_id}", salt))


def _nonce(prefix: bytes, index: int, last: bool) -> bytes:
    return prefix + index.to_bytes(4, "big") + (b"\1" if last else b"\0")


class Sealer:
    """Feed plaintext, take sealed bytes as they are ready, then `finish()` for the rest. Each
    piece is copied once, into the segment being filled; a full segment is sealed when more
    follows (the last one is sealed by finish(), flagged last)."""

    def __init__(self, key: TenantKey, object_id: str):
        salt, self._prefix = os.urandom(16), os.urandom(7)
        self.header = MAGIC + salt + self._prefix
        self._aead = _aead(key, object_id, salt)
        self._index = 0
        self._segment = bytearray(SEGMENT)
        self._filled = 0

    def feed(self, data) -> list[bytes]:
        out = []
        view = memoryview(data)
        while view:
            if self._filled == SEGMENT:
                out.append(self._seal(self._segment, last=False))
                self._filled = 0
            take = min(SEGMENT - self._filled, len(view))
            self._segment[self._filled:self._filled + take] = view[:take]
            self._filled += take
            view = view[take:]
        return out

    def finish(self) -> bytes:
        return self._seal(memoryview(self._segment)[:self._filled], last=True)

    def _seal(self, chunk, *, last: bool) -> bytes:
        if self._index >= 1 << 32:
            raise ValueError("a blob holds at most 2**32 segments")
        sealed = self._aead.encrypt(_nonce(self._prefix, self._index, last), chunk, self.header)
        self._index += 1
        return sealed


def unseal(key: TenantKey, object_id: str, blob: BinaryIO) -> Iterator[memoryview]:
    """The plaintext, a segment at a time as the blob is read, each a view of one buffer that the
    next segment overwrites (copy what you keep); Unsealable names the first segment that does
    not open (the plaintext before it has authenticated). The blob is read into two buffers in
    turn (this segment, and the next, which tells whether this one is the last)."""
    header = blob.read(HEADER)
    if len(header) < HEADER or not header.startswith(MAGIC):
        raise Unsealable("the stored blob is not a sealed Airlock blob (its header is missing or altered)")
    aead = _aead(key, object_id, header[len(MAGIC):len(MAGIC) + 16])
    prefix = header[len(MAGIC) + 16:]
    plain = memoryview(bytearray(SEGMENT))
    sealed = (memoryview(bytearray(SEGMENT + TAG)), memoryview(bytearray(SEGMENT + TAG)))
    piece, index = _read_into(blob, sealed[0]), 0
    while True:
        following = _read_into(blob, sealed[(index + 1) % 2]) if len(piece) == SEGMENT + TAG else b""
        last = not following
        if len(piece) < TAG or (not last and len(piece) != SEGMENT + TAG):
            raise Unsealable(f"the stored blob is cut short at segment {index}")
        opened = plain[:len(piece) - TAG]
        try:
            aead.decrypt_into(_nonce(prefix, index, last), piece, header, opened)
        except InvalidTag:
            raise Unsealable(f"segment {index} of the stored blob does not authenticate under this tenant's key: "
                             "the blob was altered, cut short, or belongs to another object") from None
        yield opened
        if last:
            return
        piece, index = following, index + 1


def _read_into(blob: BinaryIO, buffer: memoryview) -> memoryview:
    """As much of the blob as fills `buffer` (less only at its end): the part of it filled."""
    filled = 0
    while filled < len(buffer):
        got = blob.readinto(buffer[filled:])
        if not got:
            break
        filled += got
    return buffer[:filled]
