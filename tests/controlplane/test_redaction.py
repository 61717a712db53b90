import pytest

from controlplane.redaction import redact


@pytest.mark.parametrize(
    "secret",
    [
        "AKIAIOSFODNN7EXAMPLE",
        "ghp_" + "x" * 36,
        "github_pat_" + "y" * 50,
        "xoxb-123456789012-abcdefghij",
        "Bearer abcdefghijklmnop.qrstuvwx",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----",
        "alk_0123abcd_" + "z" * 43,
        "ast_" + "Q" * 43,
        "ASIA" + "D" * 16,
        "gho_" + "e" * 36,
        "glpat-" + "f" * 20,
        "AIza" + "g" * 35,
        "sk-" + "h" * 24,
    ],
)
def test_common_credential_shapes_are_redacted(secret):
    assert redact(f"before {secret} after") == "before [redacted] after"
    assert redact(f"café {secret} naïve") == "café [redacted] naïve"  # non-ASCII text takes the full path


@pytest.mark.parametrize("text", ["apikey=abc123", "X-Access-Key: abc123", "credentials=abc123", "passwd=abc123",
                                  "--header=X-Api-Key: abc123", "url=https://h/v1/auth-token=abc123",
                                  "opts:db-password=abc123", "a=b-token=abc123", "$(x)|x-token=abc123",
                                  "X" * 70 + "_PASSWORD=abc123", "[x-api-key=abc123"])
def test_every_secret_word_is_found(text):
    assert "abc123" not in redact(text) and "[redacted]" in redact(text)


def test_configured_secret_values_and_url_credentials_are_redacted():
    text = "db=postgres://app:hunter2hunter2@db/prod token=abc123 value s3cr3t-v4lue"
    expected = "db=postgres://[redacted]@db/prod token=[redacted] value [redacted]"
    assert redact(text, secrets=["s3cr3t-v4lue"]) == expected


def test_ordinary_text_is_left_alone():
    text = "collected 12 items; 12 passed in 0.31s (key=value pairs are fine)"
    assert redact(text) == text


@pytest.mark.parametrize("text", ["DB_PASSWORD=hunter2", "GITHUB_TOKEN=abc", "AWS_SECRET_ACCESS_KEY=xyz",
                                  "Authorization: Basic YWxpY2U6aHVudGVyMg=="])
def test_prefixed_secret_names_and_basic_credentials_are_redacted(text):
    assert "hunter2" not in redact(text) and "abc" not in redact(text).split("=")[-1]
    assert "[redacted]" in redact(text)


def test_the_argument_after_a_secret_flag_is_redacted():
    from controlplane.redaction import redact_data

    assert redact_data(["--password", "hunter2", "--verbose", "x"]) == ["--password", "[redacted]", "--verbose", "x"]


def test_log_records_leave_redacted(settings):
    import logging
    import sys

    from controlplane.redaction import RedactingFilter

    settings.AIRLOCK_REDACT_VALUES = ["supersecretvalue123"]
    record = logging.LogRecord("django.request", logging.WARNING, __file__, 1, "Not Found: %s",
                               ("/files/supersecretvalue123/AKIAABCDEFGHIJKLMNOP",), None)
    try:
        raise ValueError("token=hunter2hunter2")
    except ValueError:
        record.exc_info = sys.exc_info()
    assert RedactingFilter().filter(record)
    assert record.getMessage() == "Not Found: /files/[redacted]/[redacted]"
    assert "hunter2" not in logging.Formatter().format(record) and "token=[redacted]" in record.exc_text


@pytest.mark.parametrize("text", ["token " + "-" * 65536, "token" * 13107, ("a" * 50 + "token") * 1191,
                                  "_" * 65536 + "token=x", "ghp_" * 16384, "bearer " * 9362])
def test_redaction_takes_time_in_proportion_to_the_text(text):
    """A complexity check, not a speed target: these 64 KiB lines took minutes when a pattern
    was quadratic (a sandbox could stall its runner with one printed line); linear, they take
    milliseconds, far below the bound."""
    import time

    started = time.perf_counter()
    redact(text)
    assert time.perf_counter() - started < 5


def test_a_bad_log_call_is_reported_by_logging_not_raised_by_the_filter():
    import logging

    from controlplane.redaction import RedactingFilter

    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "two %s %s", ("only one",), None)
    assert RedactingFilter().filter(record)
