"""Command output on its way out of a sandbox: decoded, redacted, and kept as a bounded tail.

Redaction works on whole lines, so a secret is never split across two events where no pattern
could see it whole. A line is held back until its newline arrives, or until it grows past
LINE_LIMIT characters (it then leaves cut where no secret can be split, nor half a configured
secret left at its end), or until the command ends. A private key block spans lines: from its
BEGIN line to its END line every line is redacted.

Both readings of the output are redacted: each stream alone (a client that follows stdout only)
and the two merged in the order they leave, which is what is stored and what a terminal shows.
What leaves is read against the end of everything that left before it, merged and on its own
stream: what a secret begun there carries into it is redacted (`CommandOutput._meet`), however
many pieces the secret was split into; at the end, both streams' rests leave as one text when a
secret crosses from one into the other. Pacing (sessions/rate.py) charges what the patterns
scan, not only what arrives, so a line held open and fed a byte at a time costs its sender."""

import codecs
import re

from controlplane.redaction import REDACTED, may_hold_a_secret, partial_secret_start, redact, secret_spans, spans_across
from sessions.runtimes.base import OutputTail

LINE_LIMIT = 4096
HOLD_LIMIT = 65536
OVERLAP = 1024
MEET_CHARS = 2 * OVERLAP  # how much of what left is read again where the next text continues it
_KEY_BEGIN = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")
_KEY_END = re.compile(r"-----END [A-Z ]*PRIVATE KEY-----")


class StreamRedactor:
    """One per stream (stdout, stderr) of one command. `feed` returns the text that may leave now."""

    def __init__(self, secrets: tuple[str, ...] = ()):
        self.secrets = secrets
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self._in_key = False
        self._tried_at = 0  # how long the held line was when a cut was last looked for
        self.scanned = 0  # characters the patterns have gone over (what pacing charges)

    def feed(self, data: bytes) -> str:
        text = self._pending + self._decoder.decode(data)
        cut = text.rfind("\n") + 1
        # A long line is looked at again only once it has grown by a quarter: a line held open
        # and fed a few bytes at a time is not scanned whole for every few bytes.
        if cut == 0 and len(text) > LINE_LIMIT and (len(text) >= self._tried_at * 5 // 4 or len(text) > HOLD_LIMIT):
            self._tried_at = len(text)
            self.scanned += len(text)
            cut = self._safe_cut(text)
        if cut:
            self._tried_at = 0
        self._pending = text[cut:]
        return self._redact(text[:cut])

    def _safe_cut(self, text: str) -> int:
        """Where a long line may be cut: at least `overlap` characters before its end (a secret
        that has not fully arrived is shorter than that), and never inside anything redaction
        would match (a match reaching the end moves the cut before it). Past HOLD_LIMIT a line
        that offers no such point leaves whole, redacted as it stands."""
        overlap = max([OVERLAP, *(len(s) + 1 for s in self.secrets)])
        cut = len(text) - overlap
        for start, end in sorted(secret_spans(text, self.secrets), reverse=True):
            if start < cut < end:
                cut = start
        if cut > 0:  # nor after the start of a configured secret whose rest may come on the other stream
            cut = partial_secret_start(text, cut, self.secrets)
        if self._in_key or "-----BEGIN" in text[max(cut - 64, 0):]:
            cut = 0  # inside, or at the start of, a private key block: wait for its end
        if cut <= 0 and len(text) > HOLD_LIMIT:  # it leaves, but not with half a configured secret at its end
            return partial_secret_start(text, len(text), self.secrets)
        return max(cut, 0)

    def flush(self) -> str:
        text = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        return self._redact(text)

    def _redact(self, text: str) -> str:
        if not text:
            return ""
        if not self._in_key and not may_hold_a_secret(text, self.secrets):
            return text
        self.scanned += len(text)
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
    """The redacted output of one command: per-stream redactors, redaction where the streams
    meet, and one interleaved tail. `feed` and `flush` redact, in the order the text leaves;
    `keep` adds to the tail (the runner does it where it numbers the events, so a snapshot of
    the tail and an event's sequence number always agree)."""

    def __init__(self, *, tail_chars: int, secrets: tuple[str, ...] = ()):
        self.secrets = secrets
        self.streams = {"stdout": StreamRedactor(secrets), "stderr": StreamRedactor(secrets)}
        self.tail = OutputTail(tail_chars)
        # The end of what has left since its last newline, merged and per stream: a secret begun
        # there may continue in the next text to leave (the stream alone is a reading too: a
        # client that follows stdout only, and it sees no newline of the other stream).
        self._left = ""
        self._own = {"stdout": "", "stderr": ""}
        self._reach = max([MEET_CHARS, *(len(secret) for secret in secrets)])
        self._lines_end_secrets = not any("\n" in secret for secret in secrets)

    def feed(self, stream: str, data: bytes) -> str:
        return self._meet(stream, self.streams[stream].feed(data))

    def take_scanned(self) -> int:
        """Characters the redaction patterns went over since the last call (both streams)."""
        scanned = sum(redactor.scanned for redactor in self.streams.values())
        for redactor in self.streams.values():
            redactor.scanned = 0
        return scanned

    def flush(self) -> list[tuple[str, str]]:
        rests = [(stream, text) for stream, text in ((s, r.flush()) for s, r in self.streams.items()) if text]
        if len(rests) == 2 and spans_across(self._left + rests[0][1], rests[1][1], self.secrets):
            # Nothing of either has left yet: they leave as one text, redacted as one.
            rests = [(rests[0][0], redact(rests[0][1] + rests[1][1], self.secrets))]
        return [(stream, text) for stream, text in ((s, self._meet(s, t)) for s, t in rests) if text]

    def _meet(self, stream: str, text: str) -> str:
        """`text` of `stream` leaves now: what a secret begun in the output that left before it
        (merged, or on this stream alone; in any number of pieces) carries over into it is redacted."""
        if not text:
            return text
        reach = max([spans_across(before, text, self.secrets) for before in (self._left, self._own[stream]) if before],
                    default=0)
        if reach:
            text = REDACTED + text[reach:]
        # After a newline nothing continues (no pattern matches across one), unless a secret value holds one.
        ended = text.endswith("\n") and self._lines_end_secrets
        self._left = "" if ended else (self._left + text)[-self._reach:]
        self._own[stream] = "" if ended else (self._own[stream] + text)[-self._reach:]
        return text

    def keep(self, text: str) -> None:
        if text:
            self.tail.feed(text.encode())

