"""Building the root filesystem as a person sees it: one bar (or a line per phase) with a
percentage and the time, debootstrap's own words when it fails, and a cheap look-up for
`make run` when the tree is cached."""

import io
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from sessions.management.commands.build_rootfs import Bar
from sessions.runtimes import rootfs
from sessions.runtimes.base import RuntimeUnavailable
from sessions.runtimes.linux import is_mount_point, mount_tmpfs, unmount

ROOT = Path(__file__).resolve().parents[2]

# What debootstrap --debian-installer wrote on descriptor 3 in a real build here (a few records
# of each phase; the real run had 4,490 lines).
RECORDS = """P: 0 100 DOWNREL
PF: Downloading Release file
I: RETRIEVING
IA: InRelease
IA:
IF: Retrieving %s %s
P: 100 100 DOWNREL
PF: Downloading Release file
P: 0 50060337 DOWNPKGS
PF: Downloading Packages files
P: 25030168 50060337
P: 50060337 50060337 DOWNPKGS
PF: Downloading Packages files
W: RETRYING
WA: http://deb.debian.org/debian/pool/main/p/python3.11/python3.11_3.11.2-6_amd64.deb
WF: Retrying failed download of %s
P: 0 112 DOWNDEBS
PF: Downloading packages
P: 112 112 DOWNDEBS
PF: Downloading packages
P: 1 88 EXTRACTPKGS
PF: Extracting packages
P: 44 88 UNPACKREQ
PF: Unpacking required packages
P: 2 88 CONFREQ
PF: Configuring required packages
P: 49 49 UNPACKBASE
PF: Unpacking base system
P: 52 52 CONFBASE
PF: Configuring base system
I: BASESUCCESS
IF: Base system installed successfully.
"""


def test_debootstraps_records_become_one_rising_fraction_with_its_phases_in_words():
    seen = []
    records = rootfs.DebootstrapRecords(lambda fraction, phase: seen.append((fraction, phase)))
    for line in RECORDS.splitlines(keepends=True):
        records.feed(line)
    fractions = [fraction for fraction, _ in seen]
    assert fractions == sorted(fractions) and 0.9 <= fractions[-1] < 1.0  # the digest is still to come
    phases = list(dict.fromkeys(phase for _, phase in seen))
    assert phases == ["Downloading Release file", "Downloading Packages files", "Downloading packages",
                      "Extracting packages", "Unpacking required packages", "Configuring required packages",
                      "Unpacking base system", "Configuring base system"]
    halfway = next(fraction for fraction, phase in seen if phase == "Unpacking required packages")
    assert 0.45 < halfway < 0.6
    assert records.warnings == ["Retrying failed download of "
                                "http://deb.debian.org/debian/pool/main/p/python3.11/python3.11_3.11.2-6_amd64.deb"]
    assert records.error == ""


def test_the_bar_redraws_one_line_on_a_terminal_and_writes_a_line_per_phase_elsewhere():
    terminal, log = io.StringIO(), io.StringIO()
    for stream, is_terminal in ((terminal, True), (log, False)):
        bar = Bar(stream, terminal=is_terminal)
        for fraction, phase in ((0.1, "Downloading packages"), (0.2, "Downloading packages"), (0.5, "Extracting")):
            bar(fraction, phase)
        bar.say("root filesystem built in 41 s")
    assert terminal.getvalue().count("\r") == 3 and "[###" in terminal.getvalue()
    assert "  50%  Extracting" in terminal.getvalue()
    assert terminal.getvalue().endswith("\nroot filesystem built in 41 s\n")  # the bar's line is ended first
    assert log.getvalue().splitlines() == ["   10%  Downloading packages  (0 s)", "   50%  Extracting  (0 s)",
                                           "root filesystem built in 41 s"]


@pytest.fixture
def failing_debootstrap(tmp_path, monkeypatch, settings):
    """A debootstrap that fails the way a real one does when the mirror is down (its records on
    descriptor 3, its log on stdout), first on PATH; and an empty cache."""
    if os.geteuid() != 0:
        pytest.skip("a build needs root")
    program = tmp_path / "bin" / "debootstrap"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\necho 'P: 0 100 DOWNREL' >&3\necho 'PF: Downloading Release file' >&3\n"
                       "echo 'E: COULDNTDL' >&3\necho 'EA: InRelease' >&3\necho \"EF: Couldn't download %s\" >&3\n"
                       "echo 'the whole log: wget said no' \nexit 1\n")
    program.chmod(program.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{program.parent}:{os.environ['PATH']}")
    settings.AIRLOCK_ROOTFS_DIR = str(tmp_path / "cache")
    return tmp_path


def test_a_failed_build_names_debootstraps_own_error_and_its_log_and_caches_nothing(failing_debootstrap):
    lines, seen = [], []
    with pytest.raises(RuntimeUnavailable) as failed:
        rootfs.build(progress=lines.append, meter=lambda fraction, phase: seen.append(phase))
    message = str(failed.value)
    assert "Couldn't download InRelease" in message and "check the mirror" in message
    log = Path(message.split("its full log is ")[1].split(";")[0])
    assert log.read_text() == "the whole log: wget said no\n"  # kept, not printed
    assert seen == ["Downloading Release file"]
    assert rootfs.current() is None


def test_build_rootfs_fails_with_one_line_and_a_non_zero_exit(failing_debootstrap, capsys):
    with pytest.raises(CommandError, match="Couldn't download InRelease"):
        call_command("build_rootfs")
    assert "the whole log" not in capsys.readouterr().out


def test_make_runs_look_up_says_whether_the_tree_is_built_and_how_to_build_it(built_rootfs, tmp_path):
    if isinstance(built_rootfs, Exception):
        pytest.skip(f"no root filesystem here: {built_rootfs}")
    env = {**os.environ, "AIRLOCK_ROOTFS_DIR": str(built_rootfs.path.parent.parent), "DEBUG": "true"}
    cached = subprocess.run([sys.executable, "scripts/rootfs_built.py"], cwd=ROOT, env=env, capture_output=True,
                            text=True, check=False)
    assert cached.returncode == 0 and str(built_rootfs.path) in cached.stdout
    env["AIRLOCK_ROOTFS_DIR"] = str(tmp_path / "empty")
    missing = subprocess.run([sys.executable, "scripts/rootfs_built.py"], cwd=ROOT, env=env, capture_output=True,
                             text=True, check=False)
    assert missing.returncode == 3
    assert missing.stdout.startswith("env AIRLOCK_DATA_DIR=") and f"AIRLOCK_ROOTFS_DIR={tmp_path / 'empty'} " in \
        missing.stdout and missing.stdout.strip().endswith("manage.py build_rootfs")


def test_the_tree_keeps_nothing_of_the_host_that_built_it(built_rootfs):
    if isinstance(built_rootfs, Exception):
        pytest.skip(f"no root filesystem here: {built_rootfs}")
    etc = built_rootfs.path / "etc"
    assert (etc / "hostname").read_text() == "sandbox\n"
    assert "nameserver" not in (etc / "resolv.conf").read_text()
    hosts = (etc / "hosts").read_text(errors="replace").split() if (etc / "hosts").exists() else []
    assert os.uname().nodename not in hosts


def test_a_build_after_an_interrupted_one_clears_the_mounts_it_left(failing_debootstrap):
    """debootstrap mounts /proc in its tree and unmounts it only on a clean exit."""
    partial = Path(rootfs.cache_dir()) / f"{rootfs.recipe_hash()}.partial"
    left = partial / "tree" / "proc"
    left.mkdir(parents=True)
    mount_tmpfs(left, size_bytes=2**20, uid=0, gid=0)
    try:
        with pytest.raises(RuntimeUnavailable, match="Couldn't download InRelease"):  # the build's own error
            rootfs.build(progress=lambda line: None)
        assert not is_mount_point(left)
    finally:
        if is_mount_point(left):
            unmount(left)
