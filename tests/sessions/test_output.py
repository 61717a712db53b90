"""Redaction of streamed output: a secret split across chunks is still caught."""

import pytest

from sessions.output import HOLD_LIMIT, LINE_LIMIT, CommandOutput, StreamRedactor


def test_a_secret_split_across_chunks_is_redacted():
    redactor = StreamRedactor()
    pieces = [redactor.feed(b"aws AKIAABCDEF"), redactor.feed(b"GHIJKLMNOP done\nnext")]
    assert pieces == ["", "aws [redacted] done\n"]
    assert redactor.flush() == "next"


def test_a_private_key_block_is_redacted_line_by_line():
    redactor = StreamRedactor()
    text = redactor.feed(b"before\n-----BEGIN RSA PRIVATE KEY-----\nMIIEow")
    text += redactor.feed(b"IBAAKCAQEA\nabcdef\n-----END RSA PRIVATE KEY----- after\nplain\n")
    assert "MIIE" not in text and "abcdef" not in text
    assert text.startswith("before\n") and text.endswith(" after\nplain\n")


def test_configured_secret_values_are_redacted():
    output = CommandOutput(tail_chars=100, secrets=("s3cr3t-value",))
    text = output.feed("stdout", b"the value is s3cr3t-value\n")
    assert text == "the value is [redacted]\n"
    output.keep(text)
    assert output.tail.text == "the value is [redacted]\n"


def test_a_long_line_without_newline_is_not_held_forever():
    redactor = StreamRedactor()
    assert redactor.feed(b"x" * 10) == ""
    first = redactor.feed(b" " + b"y" * (LINE_LIMIT + 2000))
    assert first  # it left before the line ended, minus an overlap kept back
    assert first + redactor.flush() == "x" * 10 + " " + "y" * (LINE_LIMIT + 2000)


def leaked(chunks: list[bytes], secrets: tuple[str, ...] = ()) -> str:
    redactor = StreamRedactor(secrets)
    return "".join(redactor.feed(chunk) for chunk in chunks) + redactor.flush()


@pytest.mark.parametrize("secret", [
    "ghp_" + "A" * 36, "Bearer abcdefghijklmnopqrstuvwx", "password: hunter2hunter2", "my secret value",
])
def test_a_secret_straddling_a_cut_in_a_long_line_is_still_redacted(secret):
    filler = ("x" * 50 + " ") * 90  # past LINE_LIMIT, no newline
    for split in (5, len(secret) // 2, len(secret) - 2):
        out = leaked([(filler + secret[:split]).encode(), (secret[split:] + " tail" + filler).encode()],
                     secrets=("my secret value",))
        assert secret not in out and "[redacted]" in out, (secret, split)
        assert "hunter2" not in out and "AAAAAAAAAA" not in out and "abcdefghij" not in out


def test_a_private_key_in_a_long_line_is_redacted_whole():
    body = "MIIEow" + "Q" * 6000
    out = leaked([("x " * 3000 + "-----BEGIN RSA PRIV").encode(), ("ATE KEY-----" + body[:3000]).encode(),
                  (body[3000:] + "-----END RSA PRIVATE KEY----- done\n").encode()])
    assert "QQQQ" not in out and "MIIE" not in out and out.endswith(" done\n")


def test_a_token_across_the_hold_limit_is_redacted():
    token = "ghp_" + "B" * 36
    out = leaked([b"z" * (HOLD_LIMIT - 10) + b" " + token[:20].encode(), token[20:].encode() + b" end\n"])
    assert token not in out


def test_the_checkout_filter_ignores_case_and_looks_at_every_directory():
    from sessions.workspace import excluded

    for path in (".ENV", "deploy/ID_RSA", "Secrets/db.yaml", "config/credentials/prod.json", ".git/config",
                 "a/.ssh/known_hosts", "infra/main.TFSTATE"):
        assert excluded(path), path
    for path in ("src/app.py", "tests/test_env.py", "docs/secrets-management.md"):
        assert not excluded(path), path
