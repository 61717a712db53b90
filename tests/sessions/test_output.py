"""Redaction of streamed output: a secret split across chunks is still caught."""

import pytest

from sessions.output import HOLD_LIMIT, LINE_LIMIT, OVERLAP, CommandOutput, StreamRedactor


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


SECRET = "s3cr3t-Value-0123456789"


def released(steps: list[tuple[str, bytes]]) -> list[tuple[str, str]]:
    """What leaves, in order, when the streams write `steps` and the command then ends."""
    output = CommandOutput(tail_chars=10**6, secrets=(SECRET,))
    events = [(stream, output.feed(stream, data)) for stream, data in steps]
    return [(stream, text) for stream, text in events + output.flush() if text]


def readings(events: list[tuple[str, str]]) -> dict[str, str]:
    """The output as a terminal shows it (merged), and each stream alone."""
    return {"merged": "".join(text for _, text in events),
            **{name: "".join(text for stream, text in events if stream == name) for name in ("stdout", "stderr")}}


def test_a_secret_split_across_stdout_and_stderr_is_redacted_where_they_meet():
    half = len(SECRET) // 2
    for steps in ([("stdout", SECRET[:half].encode()), ("stderr", SECRET[half:].encode())],
                  [("stderr", b"x " + SECRET[:half].encode()), ("stdout", SECRET[half:].encode() + b" y")]):
        for name, text in readings(released(steps)).items():
            assert SECRET not in text, (name, text)


def test_half_a_secret_at_a_long_lines_cut_waits_for_what_follows_it():
    filler = "x" * (LINE_LIMIT + 10)
    half = len(SECRET) // 2
    # The first half sits right where a long line is cut; the second half comes on stderr.
    first = (filler + SECRET[:half]).encode() + b"z" * 1100
    events = released([("stdout", first), ("stderr", SECRET[half:].encode() + b"\n")])
    for name, text in readings(events).items():
        assert SECRET not in text, name
    assert readings(events)["stdout"].replace("[redacted]", "").count(SECRET[:half]) <= 1


def test_a_shaped_secret_continued_on_the_other_stream_is_redacted():
    token = "ghp_" + "A1b2C3d4E5" * 4
    filler = "y" * (LINE_LIMIT + 50) + " "
    events = released([("stdout", (filler + token[:10]).encode() + b" " * OVERLAP),  # cut right after the prefix
                       ("stdout", b""), ("stderr", token[10:].encode() + b"\n")])
    assert token[10:] not in readings(events)["merged"]


@pytest.mark.parametrize("seed", range(40))
def test_no_interleaving_of_the_two_streams_leaks_a_secret(seed):
    """An attacker picks where the secret is split, how each half is chunked and in which order
    the chunks arrive; no reading of what leaves holds the secret."""
    import random

    rng = random.Random(seed)  # noqa: S311 - reproducible choices, not secrets
    cut = rng.randrange(1, len(SECRET))
    pad = "p" * rng.choice([0, 3, LINE_LIMIT - 5, LINE_LIMIT + 200])
    halves = {"stdout": (pad + SECRET[:cut]).encode(), "stderr": SECRET[cut:].encode()}
    if rng.random() < 0.5:
        halves = {"stdout": halves["stderr"], "stderr": halves["stdout"]}
    chunks = {stream: [data[i:i + rng.randrange(1, 40)] for i in range(0, len(data), 40)] or [b""]
              for stream, data in halves.items()}
    order = [stream for stream in chunks for _ in chunks[stream]]
    first = rng.choice(["stdout", "stderr"])
    order.sort(key=lambda stream: stream != first)  # one stream's chunks, then the other's
    steps = [(stream, chunks[stream].pop(0)) for stream in order]
    for name, text in readings(released(steps)).items():
        assert SECRET not in text, (seed, name)


def three_pieces(first: int, second: int, pad: int) -> list[tuple[str, bytes]]:
    """SECRET cut in three: its middle waits on stdout without a newline until the end; on stderr
    one long line is cut right after the first piece (OVERLAP characters before its end), and its
    rest, the last piece, waits there until the end too."""
    stderr = "x" * pad + SECRET[:first] + SECRET[second:] + "y" * (OVERLAP - len(SECRET[second:]))
    return [("stdout", SECRET[first:second].encode()), ("stderr", stderr.encode())]


def test_a_secret_in_three_pieces_across_both_streams_is_redacted():
    """Two characters at the end of the text that leaves (too few to hold back), then the rests
    of both streams: each text that leaves is read against all that left before it on either
    stream, not only against the last text."""
    steps = three_pieces(2, 6, LINE_LIMIT - 96)
    assert released(steps)[0][1].endswith("x" + SECRET[:2])  # the cut falls where the attack wants it
    for name, text in readings(released(steps)).items():
        assert SECRET not in text, (name, text[-200:])


@pytest.mark.parametrize("seed", range(40))
def test_no_three_piece_split_leaks_a_secret(seed):
    import random

    rng = random.Random(1000 + seed)  # noqa: S311 - reproducible choices, not secrets
    first = rng.randrange(1, 5)
    second = rng.randrange(first + 1, len(SECRET))
    steps = three_pieces(first, second, rng.choice([LINE_LIMIT - 96, LINE_LIMIT + 300]))
    if rng.random() < 0.5:
        steps.reverse()  # the long line first
    if rng.random() < 0.5:
        steps.append(("stdout", b"\n"))
    for name, text in readings(released(steps)).items():
        assert SECRET not in text, (seed, name)


def test_a_newline_on_the_other_stream_does_not_hide_a_secret_continued_on_this_one():
    """A line too long to hold leaves whole, ending in two characters of the secret (too few to
    hold back); a newline on stderr ends the merged line; the rest comes on stdout. stdout alone
    (what `airlock exec > file` writes) must not hold the secret."""
    steps = [("stdout", b"-----BEGIN" * 6553), ("stdout", b"-----BEGIN" + SECRET[:2].encode()),
             ("stderr", b"\n"), ("stdout", SECRET[2:].encode() + b"\n")]
    for name, text in readings(released(steps)).items():
        assert SECRET not in text, name


def test_a_line_too_long_to_hold_never_leaves_half_a_secret_for_its_own_next_chunk():
    """Past HOLD_LIMIT a line leaves whole; what it ended with must not join what follows."""
    for first in (b"x" * (HOLD_LIMIT + 5000) + b" -----BEGIN " + SECRET[:8].encode(),
                  b"y" * (HOLD_LIMIT + 5000) + b" " + SECRET[:8].encode()):
        events = released([("stdout", first), ("stdout", SECRET[8:].encode() + b"\n")])
        for name, text in readings(events).items():
            assert SECRET not in text, name
    token = "ghp_" + "Z9y8X7w6V5" * 4
    events = released([("stdout", b"-----BEGIN " + b"q " * (HOLD_LIMIT // 2) + b" " + token[:12].encode()),
                       ("stdout", token[12:].encode() + b"\n")])
    assert token[12:] not in readings(events)["merged"]


def test_a_line_held_open_and_fed_a_few_bytes_at_a_time_is_not_scanned_whole_each_time():
    output = CommandOutput(tail_chars=1000, secrets=(SECRET,))
    output.feed("stdout", b"-----BEGIN " + b"k" * (LINE_LIMIT + 100))
    output.take_scanned()
    for _ in range(200):
        output.feed("stdout", b"kk")
    assert output.take_scanned() < 10 * (LINE_LIMIT + 500)  # a few looks at the held line, not 200
