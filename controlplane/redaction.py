"""Secret redaction: configured secret values and common credential shapes become
`[redacted]` before anything is stored, streamed or logged."""

import logging
import re
from collections.abc import Iterable

REDACTED = "[redacted]"

CREDENTIAL_SHAPES = [
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)",  # PEM private keys
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",  # AWS access key ids
    r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}\b",  # GitHub tokens
    r"\bgithub_pat_[A-Za-z0-9_]{40,}\b",
    r"\bglpat-[A-Za-z0-9_-]{20,}\b",  # GitLab
    r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b",  # Slack
    r"\bAIza[0-9A-Za-z_-]{35}\b",  # Google API keys
    r"\bsk-[A-Za-z0-9_-]{20,}\b",  # OpenAI-style secret keys
    r"\balk_[0-9a-f]{8}_[A-Za-z0-9_-]{20,}",  # Airlock's own API keys
    r"\bast_[A-Za-z0-9_-]{30,}",  # Airlock's session tokens
    r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\b",  # JWTs
    r"(?i:bearer|basic)\s+[A-Za-z0-9._~+/=-]{12,}",  # bearer tokens, basic credentials
    r"(?<=://)[^/\s:@]+:[^/\s@]+(?=@)",  # credentials in URLs
]
_SHAPES = re.compile("|".join(f"(?:{shape})" for shape in CREDENTIAL_SHAPES), re.DOTALL)
# `token=…`, `--password=…`, `?api_key=…`: the value goes, the name stays so the line still reads.
SECRET_WORD = r"(?:password|passwd|secret|token|api[_-]?key|access[_-]?key|credentials?)"  # noqa: S105 - a pattern, not a password
# A name starts wherever a letter or digit does not precede it, except inside a dotted or dashed
# run (`--db-password=`, `x.api-key:`), or after `_` (`…_PASSWORD=`); it holds at most 64
# characters on either side of the word. Linear in the text: unbounded names that could start
# after every `-` made one long line cost seconds.
_KEYED = re.compile(
    rf"(?i)((?<![A-Za-z0-9.-])[A-Za-z0-9_.-]{{0,64}}{SECRET_WORD}[A-Za-z0-9_]{{0,64}}\s*[=:]\s*)[^\s&'\"]+")
# `--password hunter2`: an argument that names a secret makes the next argument one.
_SECRET_FLAG = re.compile(rf"(?i)^--?[A-Za-z0-9_-]*{SECRET_WORD}[A-Za-z0-9_-]*$")


# Every credential shape and secret word holds one of these (ASCII text, lowercased). Finding
# none, a plain substring search, spares the patterns: most output has no secret in it, and the
# patterns cost ~15 ms per 64 KiB.
_MARKERS = ("-----begin", "akia", "asia", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "xox",
            "aiza", "sk-", "alk_", "ast_", "eyj", "bearer", "basic", "://", "password", "passwd", "secret", "token",
            "apikey", "api_key", "api-key", "accesskey", "access_key", "access-key", "credential")


def _may_hold_a_shape(text: str) -> bool:
    if not text.isascii():  # case-insensitive matching folds some non-ASCII letters (long s, Kelvin) to ASCII
        return True
    lowered = text.lower()
    return any(marker in lowered for marker in _MARKERS)


def _long_enough(secrets: Iterable[str]) -> list[str]:
    """Configured values short enough to occur by chance are not looked for."""
    return [secret for secret in secrets if len(secret) >= 6]


def may_hold_a_secret(text: str, secrets: Iterable[str] = ()) -> bool:
    """False only when redacting `text` would change nothing."""
    return _may_hold_a_shape(text) or any(secret in text for secret in _long_enough(secrets))


def partial_secret_start(text: str, end: int, secrets: Iterable[str] = ()) -> int:
    """Where the longest start (3+ characters) of a configured secret value that ends at `end`
    begins, or `end` when none does: text cut there would carry half a secret whose rest may
    come later (in another stream)."""
    start = end
    for secret in _long_enough(secrets):
        for length in range(min(len(secret) - 1, end), 2, -1):
            if text.startswith(secret[:length], end - length):
                start = min(start, end - length)
                break
    return start


def spans_across(before: str, after: str, secrets: Iterable[str] = ()) -> int:
    """How far into `after` a secret that starts in `before` reaches, when the two are read as
    one text (0: none crosses from one into the other)."""
    joint = before + after
    return max((end - len(before) for start, end in secret_spans(joint, secrets) if start < len(before) < end),
               default=0)


def secret_spans(text: str, secrets: Iterable[str] = ()) -> list[tuple[int, int]]:
    """Where in `text` something would be redacted (a match may run to the end of the text)."""
    patterns = (_SHAPES, _KEYED) if _may_hold_a_shape(text) else ()
    spans = [match.span() for pattern in patterns for match in pattern.finditer(text)]
    for secret in _long_enough(secrets):
        start = text.find(secret)
        while start != -1:
            spans.append((start, start + len(secret)))
            start = text.find(secret, start + 1)
    return spans


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    for secret in sorted(_long_enough(secrets), key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    if not _may_hold_a_shape(text):
        return text
    return _KEYED.sub(rf"\1{REDACTED}", _SHAPES.sub(REDACTED, text))


def redact_data(value, secrets: Iterable[str] = ()):
    """The same for every string inside a JSON-like value."""
    secrets = tuple(secrets)
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, list):
        redacted, hide_next = [], False
        for item in value:
            redacted.append(REDACTED if hide_next and isinstance(item, str) else redact_data(item, secrets))
            hide_next = isinstance(item, str) and bool(_SECRET_FLAG.match(item))
        return redacted
    if isinstance(value, dict):
        return {key: redact_data(item, secrets) for key, item in value.items()}
    return value


class RedactingFilter(logging.Filter):
    """On every log handler: a record's message and traceback leave redacted."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format call: logging's own handler reports it, as without this filter
            return True
        secrets = configured_secrets()
        redacted = redact(message, secrets)
        if redacted != message:
            record.msg, record.args = redacted, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info), secrets)
        return True


class OneLineSecurityEvents(logging.Filter):
    """Django's security events (a forged Host header, a suspicious operation) as one line each,
    without the traceback it attaches: anyone can cause them, ~40 lines a request otherwise."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("django.security"):
            record.exc_info, record.exc_text = None, None
        return True


def configured_secrets() -> tuple[str, ...]:
    """The secret values this deployment knows: its SECRET_KEY, database and Redis passwords,
    its audit key, its master keys, and AIRLOCK_REDACT_VALUES. None of them may ever appear in output, a record
    or a log."""
    import os
    from urllib.parse import urlsplit

    from django.conf import settings

    values = [settings.SECRET_KEY, settings.DATABASES["default"].get("PASSWORD") or "",
              settings.AIRLOCK_AUDIT_KEY or "", *settings.AIRLOCK_REDACT_VALUES,
              os.environ.get("AIRLOCK_MASTER_KEY", "").strip(), os.environ.get("AIRLOCK_MASTER_KEYS_PREVIOUS", ""),
              *(key.hex() for key in [settings.AIRLOCK_MASTER_KEY, *settings.AIRLOCK_MASTER_KEYS_PREVIOUS] if key)]
    if settings.REDIS_URL:
        values.append(urlsplit(settings.REDIS_URL).password or "")
    return tuple(value for value in values if value)
