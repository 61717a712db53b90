"""Redaction of streamed output: a secret split across chunks is still caught."""

from sessions.output import LINE_LIMIT, CommandOutput, StreamRedactor


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
    assert output.feed("stdout", b"the value is s3cr3t-value\n") == "the value is [redacted]\n"
    assert output.tail.text == "the value is [redacted]\n"


def test_a_long_line_without_newline_is_not_held_forever():
    redactor = StreamRedactor()
    assert redactor.feed(b"x" * 10) == ""
    assert len(redactor.feed(b"y" * LINE_LIMIT)) == LINE_LIMIT + 10


def test_invalid_utf8_becomes_replacement_characters():
    redactor = StreamRedactor()
    assert redactor.feed(b"\xff\xfeok\n") == "\ufffd\ufffdok\n"
    assert redactor.feed(b"\xe2\x82") == ""  # half a character waits for the rest
    assert redactor.feed(b"\xac\n") == "\u20ac\n"
