"""Command output on its way out of a sandbox: decoded, redacted, and kept as a bounded tail.

Redaction works on whole lines, so a secret is never split across two events where no pattern
could see it whole. A line is held back until its newline arrives, or until it grows past
LINE_LIMIT characters (it then leaves cut at whitespace), or until the command ends. A private
key block spans lines: from its BEGIN line to its END line every line is redacted."""

import codecs
import re

from controlplane.redaction import REDACTED, redact
from sessions.runtimes.base import OutputTail

LINE_LIMIT = 4096
HOLD_LIMIT = 65536
OVERLAP = 1024
_KEY_BEGIN = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")
_KEY_END = re.compile(r"-----END [A-Z ]*PRIVATE KEY-----")


class StreamRedactor:
    """One per stream (stdout, stderr) of one command. `feed` returns the text that may leave now."""

    def __init__(self, secrets: tuple[str, ...] = ()):
        self.secrets = secrets
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self._in_key = False

    def feed(self, data: bytes) -> str:
        text = self._pending + self._decoder.decode(data)
        cut = text.rfind("\n") + 1
        if cut == 0 and len(text) > LINE_LIMIT:
            # A long line leaves in pieces cut at whitespace: credentials hold none, so none is
            # split where no pattern could see it whole. A run without whitespace is held up to
            # HOLD_LIMIT, then cut keeping an overlap that no credential shape is longer than.
            space = max(text.rfind(" "), text.rfind("\t"))
            if space > 0:
                cut = space + 1
            elif len(text) > HOLD_LIMIT:
                cut = len(text) - OVERLAP
        self._pending = text[cut:]
        return self._redact(text[:cut])

    def flush(self) -> str:
        text = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        return self._redact(text)

    def _redact(self, text: str) -> str:
        if not text:
            return ""
        lines = []
        for line in text.splitlines(keepends=True):
            if self._in_key:
                ended = _KEY_END.search(line)
                self._in_key = not ended
                line = REDACTED + (line[ended.end():] if ended else ("\n" if line.endswith("\n") else ""))
            elif _KEY_BEGIN.search(line) and not _KEY_END.search(line):
                self._in_key = True
            lines.append(redact(line, self.secrets))
        return "".join(lines)


class CommandOutput:
    """The redacted output of one command: per-stream redactors and one interleaved tail.
    `feed` and `flush` redact; `keep` adds to the tail (the runner does it where it numbers the
    events, so a snapshot of the tail and an event's sequence number always agree)."""

    def __init__(self, *, tail_chars: int, secrets: tuple[str, ...] = ()):
        self.streams = {"stdout": StreamRedactor(secrets), "stderr": StreamRedactor(secrets)}
        self.tail = OutputTail(tail_chars)

    def feed(self, stream: str, data: bytes) -> str:
        return self.streams[stream].feed(data)

    def flush(self) -> list[tuple[str, str]]:
        flushed = [(stream, redactor.flush()) for stream, redactor in self.streams.items()]
        return [(stream, text) for stream, text in flushed if text]

    def keep(self, text: str) -> None:
        if text:
            self.tail.feed(text.encode())
