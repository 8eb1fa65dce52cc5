"""The host's inotify limits are checked before machines boot: the kernel's default of 128 instances per user
holds ~25 machines (5 each), and the 26th machine's systemd died with "Too many open files"."""

from __future__ import annotations

import os

import pytest

from sim.hosts import limits

pytestmark = pytest.mark.machines(order=4)


def fake_inotify_dir(tmp_path, instances=128, watches=8192):
    d = tmp_path / "inotify"
    d.mkdir()
    (d / "max_user_instances").write_text(f"{instances}\n")
    (d / "max_user_watches").write_text(f"{watches}\n")
    return d


def fake_proc(tmp_path, inotify_fds: list[list[int]]):
    """A /proc with one process per entry, each holding inotify fds with that many watches."""
    proc = tmp_path / "proc"
    proc.mkdir()
    for pid, fds in enumerate(inotify_fds, start=100):
        (proc / str(pid) / "fd").mkdir(parents=True)
        (proc / str(pid) / "fdinfo").mkdir()
        for fd, wds in enumerate(fds, start=3):
            os.symlink("anon_inode:inotify", proc / str(pid) / "fd" / str(fd))
            (proc / str(pid) / "fdinfo" / str(fd)).write_text(
                "pos:\t0\nflags:\t02004000\n" + "".join(f"inotify wd:{w + 1} ino:1 sdev:0 mask:0\n" for w in range(wds)))
        os.symlink("/dev/null", proc / str(pid) / "fd" / "0")  # not inotify: not counted
    (proc / "self").mkdir()  # non-numeric entries are skipped
    return proc


def test_in_use_counts_instances_and_watches_from_proc(tmp_path):
    proc = fake_proc(tmp_path, [[2, 3], [], [5]])
    assert limits.inotify_in_use(proc) == (3, 10)


def test_64_machines_raise_the_kernel_default_and_say_so(tmp_path):
    d = fake_inotify_dir(tmp_path)
    proc = fake_proc(tmp_path, [[1, 1, 1]])  # 3 instances already held by this user
    said = []
    raised = limits.ensure_room_for(64, d, proc, progress=said.append)
    assert (d / "max_user_instances").read_text() == f"{3 + 64 * limits.INSTANCES_PER_MACHINE}\n"
    assert (d / "max_user_watches").read_text() == "8192\n"  # 3 + 64 * 64 watches fit in 8192
    assert raised == said == ["raised fs.inotify.max_user_instances 128 -> 515 for 64 machines"]


def test_a_limit_with_room_is_left_alone(tmp_path):
    d = fake_inotify_dir(tmp_path, instances=1024)
    assert limits.ensure_room_for(16, d, fake_proc(tmp_path, [])) == []
    assert (d / "max_user_instances").read_text() == "1024\n"


def test_a_short_limit_that_cannot_be_written_refuses_with_the_command(tmp_path, monkeypatch):
    d = fake_inotify_dir(tmp_path)
    real_write = type(d).write_text

    def read_only(path, *args, **kwargs):  # /proc/sys as a container's non-root user sees it
        if path.parent == d:
            raise PermissionError(13, "Permission denied")
        return real_write(path, *args, **kwargs)

    monkeypatch.setattr(type(d), "write_text", read_only)
    with pytest.raises(limits.LimitError) as err:
        limits.ensure_room_for(64, d, fake_proc(tmp_path, []))
    assert "64 machines need fs.inotify.max_user_instances >= 512 (now 128, 0 in use" in str(err.value)
    assert "cannot be written (Permission denied)" in str(err.value)
    assert "sysctl -w fs.inotify.max_user_instances=512" in str(err.value)
    assert (d / "max_user_instances").read_text() == "128\n"
