"""Redaction of streamed output: a secret split across chunks is still caught."""

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


def test_a_long_line_without_newline_leaves_cut_at_whitespace():
    redactor = StreamRedactor()
    assert redactor.feed(b"x" * 10) == ""
    assert redactor.feed(b" " + b"y" * LINE_LIMIT) == "x" * 10 + " "
    assert redactor.flush() == "y" * LINE_LIMIT


def test_a_token_straddling_the_long_line_limit_is_still_redacted():
    token = "ghp_" + "A" * 36
    redactor = StreamRedactor()
    text = redactor.feed(("x " * 2047 + token[:10]).encode()) + redactor.feed((token[10:] + " more\n").encode())
    assert token not in text and "[redacted] more" in text
    endless = StreamRedactor()  # no whitespace at all: held, then cut with an overlap
    out = endless.feed(b"z" * (HOLD_LIMIT + 10)) + endless.flush()
    assert out == "z" * (HOLD_LIMIT + 10)


def test_invalid_utf8_becomes_replacement_characters():
    redactor = StreamRedactor()
    assert redactor.feed(b"\xff\xfeok\n") == "\ufffd\ufffdok\n"
    assert redactor.feed(b"\xe2\x82") == ""  # half a character waits for the rest
    assert redactor.feed(b"\xac\n") == "\u20ac\n"


def test_the_checkout_filter_ignores_case_and_looks_at_every_directory():
    from sessions.workspace import excluded

    for path in (".ENV", "deploy/ID_RSA", "Secrets/db.yaml", "config/credentials/prod.json", ".git/config",
                 "a/.ssh/known_hosts", "infra/main.TFSTATE"):
        assert excluded(path), path
    for path in ("src/app.py", "tests/test_env.py", "docs/secrets-management.md"):
        assert not excluded(path), path
