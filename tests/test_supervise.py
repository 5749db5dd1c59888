"""`stager up --restart`: a killed server comes back on its root and port by itself."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stager import Client
from stager.cli.supervise import with_port
from stager.config import load_config
from stager.protocol.models import LayoutSpec
from stager.testing import ProcessCluster, wait_for_targets

pytestmark = pytest.mark.slow      # stager processes: not in make check


def test_with_port_sets_or_adds_the_port() -> None:
    assert with_port(["meta", "--port", "0", "--root", "r"], 7123) == \
        ["meta", "--port", "7123", "--root", "r"]
    assert with_port(["data"], 9) == ["data", "--port", "9"]


def test_killed_servers_come_back_with_their_urls_and_data(tmp_path: Path) -> None:
    with ProcessCluster(tmp_path, 2, replicas=2, restart=True) as cluster:
        with Client(cluster.meta_url, config=load_config(env={})) as c:
            body = os.urandom(300_000)
            c.pipe("/keep.bin", body, layout=LayoutSpec(chunk_size=64 * 1024))
            data_url = cluster.info["data"][0]["url"]
            old = cluster.data_pid(0)
            cluster.kill_data(0)
            cluster.wait_restarted("data", 0, old)
            assert cluster.info["data"][0]["url"] == data_url
            assert cluster.data_pid(0) != old
            meta_url = cluster.meta_url
            old = int(cluster.info["meta"]["pid"])
            cluster.kill_meta()
            cluster.wait_restarted("meta", 0, old)
            assert cluster.meta_url == meta_url
            wait_for_targets(meta_url, 2)
            assert c.cat("/keep.bin") == body
            assert cluster.info["restarts"] == 2
        log = (tmp_path / "up.log").read_text()
        assert log.count("restarted at") == 2


@pytest.mark.parametrize("cmd", ["target", "scrub", "fsck"])
def test_the_new_commands_have_help(cmd: str, capsys: pytest.CaptureFixture[str]) -> None:
    from stager.cli.main import build_parser

    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([cmd, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("usage: stager " + cmd)
