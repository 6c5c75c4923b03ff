"""What `selgate check`'s runner (lanes/check_run.py, reports/check.py) reads and writes around the kernel's
processes, which write their own scratch folders and may have planted files in the caller's
--out: the probe's result is read only as a regular file (a FIFO there hung the check past
every signal), --out's result names may not be symlinks (the check's writes followed them out
of the folder), and the run's temporary folder is removed whatever tree was built in it (one
5000 folders deep crashed the check before its report)."""

from __future__ import annotations

import os

import pytest

from selgate.conformance import sandbox
from selgate.lanes.check_run import UsageError, _remove, prepare_out, writable
from selgate.reports.check import _no_symlink_to


def test_the_probes_result_is_read_only_as_a_regular_file(tmp_path):
    (tmp_path / "file").write_text('{"ok": true}')
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    assert sandbox.read_regular(tmp_path / "file", 4) == '{"ok'
    assert sandbox.read_regular(tmp_path / "fifo", 1 << 20) is None  # returns at once: no writer needed
    assert sandbox.read_regular(tmp_path / "link", 1 << 20) is None
    assert sandbox.read_regular(tmp_path / "missing", 1 << 20) is None


@pytest.mark.parametrize("name", ["report.md", "junit.xml", "repro", ".selgate-writable"])
def test_a_symlink_among_outs_result_names_is_a_usage_error_and_nothing_is_written(tmp_path, name):
    out, victim = tmp_path / "out", tmp_path / "victim"
    out.mkdir()
    victim.write_text("the caller's")
    (out / name).symlink_to(victim if name != "report.md" else tmp_path / "elsewhere.md")
    with pytest.raises(UsageError, match=f"{name} is a symlink"):
        prepare_out(out)
    assert victim.read_text() == "the caller's" and not (tmp_path / "elsewhere.md").exists()


def test_the_writable_probe_replaces_a_symlink_and_leaves_its_target(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("the caller's")
    (tmp_path / ".selgate-writable").symlink_to(victim)
    writable(tmp_path)
    assert victim.read_text() == "the caller's" and not (tmp_path / ".selgate-writable").exists()


def test_a_temporary_folder_thousands_deep_is_removed(tmp_path):
    top = tmp_path / "selgate-check-x"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY)
    for _ in range(3000):
        os.mkdir("d", dir_fd=fd)
        fd, old = os.open("d", os.O_RDONLY, dir_fd=fd), fd
        os.close(old)
    os.close(fd)
    _remove(top)  # shutil.rmtree of Python 3.11 raises RecursionError here
    assert not top.exists()


def test_an_out_folder_reached_through_a_symlink_is_a_usage_error(tmp_path, monkeypatch):
    """A pull request commits `selgate-check -> /elsewhere` beside its kernel: the default --out."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "kernel").mkdir()
    (tmp_path / "kernel" / "selgate-check").symlink_to(tmp_path / "elsewhere")
    monkeypatch.chdir(tmp_path / "kernel")
    for out in ("selgate-check", "selgate-check/deeper", str(tmp_path / "kernel" / "selgate-check" / "deeper")):
        with pytest.raises(UsageError, match="is a symlink"):
            _no_symlink_to(out)
    _no_symlink_to("reports/check")  # an ordinary folder, existing or not


def test_a_real_time_signal_has_a_name_in_the_checks_messages():
    assert sandbox.signal_name(6) == "SIGABRT" and sandbox.signal_name(40) == "signal 40"
