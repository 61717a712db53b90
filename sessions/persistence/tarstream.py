"""The tar a sandbox writes of its workspace, read as it streams, trusting nothing in it.

Accepted: ustar and GNU headers with valid checksums, a pax or GNU long-name header for a long
path, regular files and directories, each path relative (a leading `./` is dropped, `.` itself
left out), in normal form, UTF-8 and seen once, the files' sizes within a limit. Links, FIFOs,
sockets and devices are left out and listed in `skipped`. Anything else (`..`, a header that does
not add up, a stream cut short) is BadTar. With `emit`, the bytes of what is kept are handed on
as they pass, so what is stored holds regular files and directories only. Each file's SHA-256 is
taken as its bytes pass, without keeping them: the listing (`entries`) is what a manifest records
and what a restore compares the stored tar with."""

import hashlib
import zlib

from sessions.workspace import normalize_path

BLOCK = 512
_ZEROS = bytes(BLOCK)


class BadTar(Exception):
    pass


class TooLarge(BadTar):
    pass


def _octal(field: bytes, what: str) -> int:
    """Octal digits only, as GNU tar reads them (int() would take a sign and underscores too)."""
    text = field.rstrip(b"\0 ").lstrip(b" ")
    if text.translate(None, b"01234567"):
        raise BadTar(f"a header's {what} is not an octal number")
    return int(text, 8) if text else 0


def _byte_sum(block: bytes) -> int:
    """sum(block), six times as fast: Adler-32's low half is 1 + the sum of the bytes modulo
    65521, and 256 bytes sum to at most 65280, so each half of a block gives its sum exactly."""
    return (zlib.adler32(block[:256]) & 0xFFFF) + (zlib.adler32(block[256:]) & 0xFFFF) - 2


class TarReader:
    def __init__(self, max_bytes: int, emit=None):
        self.max_bytes = max_bytes
        self._emit = emit
        self._held: list[bytes] = []  # a long-name header's blocks, until its entry is kept or left out
        self.entries: list[dict] = []
        self.skipped: list[dict] = []
        self.file_bytes = 0
        self._seen: set[str] = set()
        self._buf = bytearray()
        self._want = BLOCK  # bytes wanted in _buf: a header, or a pax header's data
        self._pax_size = None  # reading a long-name header's data of this size
        self._long_kind = b""
        self._longs: list[bytes] = []  # the kinds of the long-name headers held for the next entry
        self._path_override = None
        self._file = None  # the file whose data is passing
        self._remaining = 0
        self._skip = 0  # padding after a file's data
        self._ended = False

    def feed(self, data) -> None:
        view = memoryview(data)
        pos, size = 0, len(view)
        while pos < size:
            if self._remaining:
                end = pos + min(self._remaining, size - pos)
                self._file[1].update(view[pos:end])
                self._remaining -= end - pos
                if not self._remaining:
                    self._file_done()
                    padding = min(self._skip, size - end)  # what of its padding is here: one piece with it
                    self._skip -= padding
                    end += padding
                if self._emit is not None:
                    self._emit(view[pos:end])
                pos = end
            elif self._skip:
                take = min(self._skip, size - pos)
                if self._emit is not None:
                    self._emit(view[pos:pos + take])
                pos += take
                self._skip -= take
            elif self._ended:
                if any(view[pos:]):
                    raise BadTar("data after the archive's end")
                return
            elif not self._buf and size - pos >= self._want:  # a whole header here: no copy through _buf
                want = self._want
                block = bytes(view[pos:pos + want])
                pos += want
                self._on_block(block)
            else:
                take = min(self._want - len(self._buf), size - pos)
                self._buf += view[pos:pos + take]
                pos += take
                if len(self._buf) == self._want:
                    block = bytes(self._buf)
                    self._buf.clear()
                    self._on_block(block)

    def close(self) -> list[dict]:
        if not self._ended or self._buf or self._remaining or self._skip or self._held:
            raise BadTar("the archive was cut short")
        if self._emit is not None:
            self._emit(bytes(2 * BLOCK))
        return self.entries

    def _on_block(self, block: bytes) -> None:
        if self._pax_size is not None:
            self._held.append(block)
            if self._long_kind == b"L":
                self._path_override = block[:self._pax_size].split(b"\0", 1)[0]
            elif self._long_kind == b"x":
                self._pax(block[:self._pax_size])  # (K, a link's long target: the link is left out)
            self._pax_size, self._want = None, BLOCK
            return
        if block == _ZEROS:
            self._ended = True
            return
        checksum = _octal(block[148:156], "checksum")
        if checksum != _byte_sum(block) - sum(block[148:156]) + 256:  # its own field counts as spaces
            raise BadTar("a header's checksum does not match")
        kind = block[156:157]
        size = _octal(block[124:136], "size")
        if kind in (b"x", b"L", b"K"):  # a pax header, GNU tar's long name or long link target
            longs = self._longs
            if kind in longs or b"x" in longs or (kind == b"x" and longs) or not 0 < size <= 65536:
                raise BadTar("an unexpected long-name header")
            self._held.append(block)
            self._longs.append(kind)
            self._long_kind = kind
            self._pax_size, self._want = size, -(-size // BLOCK) * BLOCK
            return
        name = block[:100].split(b"\0", 1)[0]
        prefix = block[345:500].split(b"\0", 1)[0]
        raw = self._path_override if self._path_override is not None else (prefix + b"/" + name if prefix else name)
        self._path_override = None
        held, self._held = self._held, []
        long_target, self._longs = b"K" in self._longs, []
        if raw in (b".", b"./"):  # the workspace itself
            return
        if kind in (b"1", b"2", b"3", b"4", b"6", b"7"):
            what = {b"1": "a hard link", b"2": "a symbolic link", b"6": "a FIFO"}.get(kind, "a device")
            self.skipped.append({"path": raw.decode("utf-8", "replace").removeprefix("./")[:1024],
                                 "why": f"{what} (never followed or read)"})
            return
        path = self._path(raw[2:] if raw.startswith(b"./") else raw)
        if long_target:
            raise BadTar(f"{path!r} has a link's target but is not a link")
        mode = _octal(block[100:108], "mode") & 0o7777
        if self._emit is not None:
            for piece in held:
                self._emit(piece)
            self._emit(block)
        if kind == b"5":
            if size:
                raise BadTar(f"directory {path!r} has a size")
            self.entries.append({"path": path, "type": "dir", "mode": mode})
        elif kind in (b"0", b"\0"):
            self.file_bytes += size
            if self.file_bytes > self.max_bytes:
                raise TooLarge(f"the files hold more than {self.max_bytes} bytes")
            self._file = ({"path": path, "type": "file", "mode": mode, "size": size}, hashlib.sha256())
            self._remaining = size
            if size == 0:
                self._file_done()
        else:
            raise BadTar(f"{path!r} is neither a regular file nor a directory")

    def _file_done(self) -> None:
        entry, digest = self._file
        entry["sha256"] = digest.hexdigest()
        self.entries.append(entry)
        self._file = None
        self._skip = -entry["size"] % BLOCK

    def _path(self, raw: bytes) -> str:
        try:
            text = raw.decode("utf-8").rstrip("/")
            path = normalize_path(text)
        except (UnicodeDecodeError, ValueError):
            raise BadTar(f"a path that is not relative, normal UTF-8: {raw[:200]!r}") from None
        if path != text or path in self._seen:
            raise BadTar(f"{path!r} is not in normal form, or appears twice")
        self._seen.add(path)
        return path

    def _pax(self, data: bytes) -> None:
        """Records `<length> <key>=<value>\\n`: `path` only (what PACK_PROGRAM writes)."""
        pos = 0
        while pos < len(data):
            space = data.find(b" ", pos)
            try:
                length = int(data[pos:space])
            except ValueError:
                raise BadTar("a pax record's length is not a number") from None
            record = data[space + 1:pos + length]
            if length <= 0 or not record.endswith(b"\n") or b"=" not in record:
                raise BadTar("a pax record does not add up")
            key, _, value = record[:-1].partition(b"=")
            if key != b"path":  # GNU tar would honour any other (a size, a link's target): none is written here
                raise BadTar(f"a pax record other than a path: {key[:40]!r}")
            self._path_override = value
            pos += length
        if self._path_override is None:
            raise BadTar("a pax header without a path")
