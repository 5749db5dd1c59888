"""The dashboard screenshots in docs/: ``python -m bench.screenshots [--out docs]``.

A real ``stager up`` cluster (three data servers), some data written and read
back while the pictures are taken (so the throughput columns move), loader
reports as a training job's ranks send them, and Debian's headless Chromium
(:mod:`stager.testing.browser`).  Three states: healthy, a target killed with
SIGKILL and shown down, a starving job.  Each PNG is 1000 px wide, reduced to a
small palette so it stays well under 150 KB.  The killed target is declared lost
after 3 s here (``target_lost_after``; 600 s by default), so the picture shows its
rebuild under way.
"""

from __future__ import annotations

import argparse
import io
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from PIL import Image

from stager import Client
from stager.protocol.models import LayoutSpec
from stager.testing import ProcessCluster
from stager.testing.browser import missing, open_browser, report_job

WIDTH, HEIGHT = 1000, 640
MAX_HEIGHT = 1400
MiB = 1 << 20


def save(browser: Any, path: Path) -> None:
    """The whole page (not just the window) as an optimized palette PNG."""
    height = min(MAX_HEIGHT, int(browser.execute_script(
        "return document.documentElement.scrollHeight")))
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": WIDTH, "height": height, "deviceScaleFactor": 1, "mobile": False})
    time.sleep(0.3)
    image = Image.open(io.BytesIO(browser.get_screenshot_as_png())).convert("RGB")
    image = image.quantize(colors=64, method=Image.Quantize.MEDIANCUT)
    image.save(path, optimize=True)
    print(f"{path}: {image.size[0]}x{image.size[1]}, {path.stat().st_size // 1024} KiB")


def wait(browser: Any, script: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not browser.execute_script(script):
        if time.monotonic() > deadline:
            raise TimeoutError(script)
        time.sleep(0.1)


def traffic(url: str, stop: threading.Event) -> None:
    """Write a few files, then read them again and again until ``stop``."""
    with Client(url) as client:
        layout = LayoutSpec(chunk_size=4 * MiB, stripe_count=3)
        paths = [f"/datasets/imagenet-mini/shard-{i:03}.tar" for i in range(6)]
        for i, path in enumerate(paths):
            client.pipe(path, bytes([i]) * 16 * MiB, layout=layout)
        while not stop.is_set():
            for path in paths:
                try:
                    client.cat(path)
                except OSError:
                    pass            # a target just killed: its chunks are gone for now
                time.sleep(0.3)


def job(url: str, name: str, ranks: int, stall: float, rate: float, target: str,
        latency: float) -> None:
    for rank in range(ranks):
        s = min(1.0, stall * (0.6 + 0.4 * rank / max(1, ranks - 1)))
        report_job(url, name, rank, world_size=ranks, stall_fraction=s,
                   recent_stall_fraction=s, samples_per_second=rate * (1 - s),
                   samples=int(rate * 600), bytes=int(rate * 600 * 110_000),
                   host=f"gpu-node{rank // 4:02}", targets=[
                       {"target": target, "mean_latency": latency * (1 + rank / 10),
                        "requests": 400, "bytes": 400 * 4 * MiB}])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs", type=Path)
    args = parser.parse_args()
    if missing():
        raise SystemExit(f"no browser: {missing()}")
    args.out.mkdir(parents=True, exist_ok=True)
    # a background scrub running while the pictures are taken, and a killed target
    # declared lost soon, so its rebuild shows bytes remaining
    env = {"STAGER_SCRUB_INTERVAL": "4", "STAGER_SCRUB_RATE": str(4 * MiB),
           "STAGER_TARGET_LOST_AFTER": "3", "STAGER_REBUILD_RATE": str(2 * MiB)}
    with tempfile.TemporaryDirectory() as root, \
            ProcessCluster(root, 3, replicas=2, env=env) as cluster:
        stop = threading.Event()
        mover = threading.Thread(target=traffic, args=(cluster.meta_url, stop), daemon=True)
        mover.start()
        browser = open_browser(WIDTH, HEIGHT)
        try:
            url = cluster.meta_url
            job(url, "resnet50-bs256", 4, 0.03, 2400.0, cluster.target_id(1), 0.004)
            time.sleep(8)           # data written and read: the rates have a minute's start
            browser.get(url + "/ui/")
            wait(browser, "return document.querySelectorAll('#jobs section.job').length == 1")
            time.sleep(2.5)
            save(browser, args.out / "dashboard-healthy.png")

            job(url, "vit-l16-pretrain", 8, 0.62, 900.0, cluster.target_id(2), 0.180)
            wait(browser, "return document.querySelectorAll('#jobs section.job').length == 2")
            save(browser, args.out / "dashboard-starving-job.png")

            victim = cluster.target_id(0)
            cluster.kill_data(0)
            wait(browser, f"return document.querySelector('tr[data-target=\"{victim}\"] "
                          ".state').textContent != 'up'")
            wait(browser, "return document.querySelector('#rebuild .state').textContent "
                          "== 'running'", timeout=20)
            time.sleep(2.5)
            save(browser, args.out / "dashboard-target-down.png")
        finally:
            browser.quit()
            stop.set()
            mover.join(10)


if __name__ == "__main__":
    main()
