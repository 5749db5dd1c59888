"""``stager attach`` / ``attach --refresh`` / ``detach`` / ``warm`` and the attached table
of ``stager status`` against a real cluster, a local directory as the source (issue 28)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from stager import Client
from stager.cli.main import main
from stager.testing import ThreadCluster

KiB = 1024


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """Three files of 40, 80 and 120 KiB (and one of 4 KiB below a folder)."""
    root = tmp_path / "source"
    (root / "sub").mkdir(parents=True)
    for i in (1, 2, 3):
        (root / f"f{i}.bin").write_bytes(os.urandom(40 * KiB * i))
    (root / "sub" / "g.txt").write_bytes(b"g" * 4 * KiB)
    return root


def run(cluster: ThreadCluster, capsys: pytest.CaptureFixture[str], *argv: str
        ) -> tuple[int, str, str]:
    code = main(["--meta", cluster.meta_url, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_attach_prints_what_the_listing_found_and_status_shows_it(
        cluster: ThreadCluster, client: Client, source: Path, ns: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    dst = f"{ns}/view"
    code, out, _ = run(cluster, capsys, "attach", f"file://{source}", dst, "--exclude",
                       "*.txt", "--refresh", "3600", "-o", "auto_mkdir=false")
    assert code == 0
    assert out == (f"attached {dst} <- file://{source}: 3 files, 240.0 KiB (3 added, "
                   "0 changed, 0 removed, 0 unchanged); 0 B cached\n")
    assert sorted(f.name for f in client.ls(dst)) == ["f1.bin", "f2.bin", "f3.bin"]
    assert client.cat(f"{dst}/f2.bin") == (source / "f2.bin").read_bytes()

    code, out, _ = run(cluster, capsys, "status")
    assert code == 0
    lines = out.splitlines()
    row = next(line for line in lines if line.strip().startswith(dst))
    assert lines[lines.index(row) - 2].startswith("attached: ")
    assert row.split() == [dst, f"file://{source}", "3", "80.0", "KiB", "of", "240.0", "KiB",
                           "0.0%"], row          # f2 read once: a miss, no hit yet
    code, out, _ = run(cluster, capsys, "status", "--json")
    [mine] = [a for a in json.loads(out)["attachments"] if a["path"] == dst]
    assert (mine["files"], mine["bytes"], mine["cached_bytes"], mine["refresh"],
            mine["exclude"]) == (3, 240 * KiB, 80 * KiB, 3600.0, ["*.txt"])


def test_attach_refresh_relists_in_either_form_and_detach_forgets(
        cluster: ThreadCluster, client: Client, source: Path, ns: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    dst = f"{ns}/view"
    assert run(cluster, capsys, "attach", f"file://{source}", dst)[0] == 0
    client.cat(f"{dst}/f1.bin")
    (source / "f1.bin").write_bytes(b"new" * 1000)               # changed
    (source / "f3.bin").unlink()                                 # gone
    (source / "f4.bin").write_bytes(b"4" * KiB)                  # new
    code, out, _ = run(cluster, capsys, "attach", "--refresh", dst)
    assert code == 0
    assert out == (f"refreshed {dst} <- file://{source}: 4 files, 87.9 KiB (1 added, "
                   "1 changed, 1 removed, 2 unchanged); 0 B cached\n"), out
    with Client(cluster.meta_url) as fresh:     # `client` may hold f1's old stat a while
        assert fresh.cat(f"{dst}/f1.bin") == b"new" * 1000
        assert not fresh.exists(f"{dst}/f3.bin")
    code, out, _ = run(cluster, capsys, "attach", dst, "--refresh", "--json")   # DST first
    assert code == 0
    assert json.loads(out)["unchanged"] == 4

    code, out, _ = run(cluster, capsys, "detach", dst)
    assert code == 0
    assert re.fullmatch(rf"detached {dst}: its view of 4 files forgotten, \d+ cached chunks "
                        r"freed\n", out), out
    assert dst not in {a.path for a in client.attachments()}
    assert source.joinpath("f2.bin").exists()                    # the source is untouched
    code, _, err = run(cluster, capsys, "detach", dst)
    assert code == 1 and err.startswith("stager: error:") and dst in err, err


@pytest.mark.parametrize(("argv", "says"), [
    (["ftp://h/x", "{ns}/v"], "source 'ftp://h/x' must be a URL of one of"),
    (["file:///", "{ns}/v"], "naming a directory below its root"),
    (["file://{source}", "{ns}/v", "--refresh", "0.5"], "'refresh' must be at least 1.0"),
    (["file://{source}", "{ns}/v", "--refresh", "soon"], "not a number of seconds: 'soon'"),
    (["file://{source}", "{ns}/v", "-o", "novalue"], "a storage option is KEY=VALUE"),
    (["{ns}/v"], "usage: stager attach SRC DST"),
    (["--refresh", "{ns}/never-attached"], "{ns}/never-attached"),
    (["--refresh", "{ns}/v", "--include", "*.bin"], "no --include/--exclude/--option"),
])
def test_attach_refuses_with_a_clear_error(cluster: ThreadCluster, source: Path, ns: str,
                                           capsys: pytest.CaptureFixture[str],
                                           argv: list[str], says: str) -> None:
    code, out, err = run(cluster, capsys, "attach",
                         *(a.format(ns=ns, source=source) for a in argv))
    assert code == 1 and out == ""
    assert err.startswith("stager: error: ") and says.format(ns=ns) in err, err
    assert "Traceback" not in err


def test_warm_fills_the_tree_with_a_progress_bar_and_a_second_run_fetches_nothing(
        cluster: ThreadCluster, client: Client, source: Path, ns: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    dst = f"{ns}/view"
    assert run(cluster, capsys, "attach", f"file://{source}", dst)[0] == 0
    client.cat(f"{dst}/f1.bin")                                  # 40 KiB cached already
    code, out, err = run(cluster, capsys, "warm", dst, "--parallel", "2", "--progress",
                         "always")
    assert code == 0 and out == ""
    assert f"warm {dst}" in err and "244.0/244.0 KiB" in err, err      # the bar, at its end
    assert err.splitlines()[-1] == (f"warmed {dst}: 4 files, 4 chunks, 244.0 KiB: fetched "
                                    "204.0 KiB, 40.0 KiB cached already"), err
    [a] = [a for a in client.attachments() if a.path == dst]
    assert a.cached_bytes == a.bytes == 244 * KiB

    code, out, err = run(cluster, capsys, "warm", dst, "--json")  # resumable: nothing left
    assert code == 0
    assert json.loads(out) == {"path": dst, "files": 4, "chunks": 4, "bytes_fetched": 0,
                               "bytes_cached_before": 244 * KiB}
    assert err == (f"warmed {dst}: 4 files, 4 chunks, 244.0 KiB: all cached already, "
                   "nothing fetched\n"), err
    with Client(cluster.meta_url) as fresh:
        assert fresh.cat(f"{dst}/sub/g.txt") == b"g" * 4 * KiB


@pytest.mark.parametrize(("argv", "says"), [
    (["{ns}/view", "--plan", "seed=1,world=0,epoch=0"], "world and batch must be at least 1"),
    (["{ns}/view", "--plan", "seed=1,moon=2"], "expected seed=S,world=W,epoch=E"),
    (["{ns}/view", "--parallel", "0"], "--parallel must be at least 1"),
    (["{ns}/nothing-here"], "no such file or directory: {ns}"),
    (["{ns}/plain"], "{ns}/plain holds no file of an attached directory"),
])
def test_warm_refuses_with_a_clear_error(cluster: ThreadCluster, client: Client, ns: str,
                                         capsys: pytest.CaptureFixture[str],
                                         argv: list[str], says: str) -> None:
    client.pipe(f"{ns}/plain/staged.bin", b"written here, not cached")
    code, out, err = run(cluster, capsys, "warm", *(a.format(ns=ns) for a in argv))
    assert code == 1 and out == ""
    assert err.startswith("stager: error: ") and says.format(ns=ns) in err, err
