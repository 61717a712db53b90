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
    ],
)
def test_common_credential_shapes_are_redacted(secret):
    assert redact(f"before {secret} after") == "before [redacted] after"


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
