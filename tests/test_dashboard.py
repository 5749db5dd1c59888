"""The dashboard at /ui/ in a real headless browser, over a real cluster (issue 21).

One Chromium for the module (Debian's ``chromium`` and ``chromium-driver`` through
Selenium: :mod:`stager.testing.browser`), a ``stager up`` cluster in a subprocess so
a data server can be killed with SIGKILL, and an auth-on cluster for the token form.
Each state is saved as a screenshot under the test's tmp dir (the path is printed),
and the browser's console must hold no error the page did not expect.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import start_cluster
from reliability_util import wait_for

from stager.testing import ProcessCluster, ThreadCluster
from stager.testing.browser import missing, open_browser, report_job
from stager.testing.cluster import FAST

pytestmark = [pytest.mark.slow,       # a browser: not in make check
              pytest.mark.skipif(missing() is not None, reason=str(missing()))]

REFRESH = 2.0                       # seconds between the page's refreshes (stager/meta/ui)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    driver = open_browser()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    with ProcessCluster(tmp_path_factory.mktemp("dash"), 3) as c:
        yield c


@pytest.fixture(autouse=True)
def _console(browser: Any) -> Iterator[None]:
    """No test leaves an error in the console; each starts with it empty."""
    browser.get_log("browser")
    yield


def console_errors(browser: Any, expected: Callable[[dict[str, Any]], bool] = lambda e: False
                   ) -> list[dict[str, Any]]:
    return [e for e in browser.get_log("browser")
            if e["level"] == "SEVERE" and not expected(e)]



def rows(browser: Any) -> dict[str, str]:
    """target id → its state cell, as the page shows them now."""
    return dict(browser.execute_script(
        "return Array.from(document.querySelectorAll('#targets tbody tr'))"
        ".map(r => [r.dataset.target, r.querySelector('.state').textContent])"))


def shot(browser: Any, path: Path) -> Path:
    browser.save_screenshot(str(path))
    print(f"screenshot: {path}")
    assert path.stat().st_size > 1000
    return path


def cells(browser: Any, table: str) -> dict[str, list[str]]:
    """A table's rows as the page shows them now: its key (the row's first cell) → the
    text of every cell."""
    return {r[0]: r for r in browser.execute_script(
        f"return Array.from(document.querySelectorAll('#{table} tbody tr:not(.none)'))"
        ".map(r => Array.from(r.cells).map(c => c.textContent))")}


def test_attached_directories_quotas_and_pins_are_shown(
        browser: Any, cluster: ProcessCluster, tmp_path: Path) -> None:
    """Issue 28: an attached directory with its source, files, bytes cached of the total
    and hit ratio; a quota with its use; a pin with its end (first in this module: the
    next test kills a data server)."""
    from stager import Client

    source = tmp_path / "source"
    source.mkdir()
    for name, kib in (("a.bin", 100), ("b.bin", 50), ("c.bin", 10)):
        (source / name).write_bytes((name.encode() * kib * 1024)[:kib * 1024])
    with Client(cluster.meta_url) as client:
        client.attach(f"file://{source}", "/dash-attached")
        assert client.cat("/dash-attached/a.bin") == (source / "a.bin").read_bytes()
        client.pipe("/dash-quota/x.bin", b"q" * 3000)
        client.set_quota("/dash-quota", max_bytes=1 << 20, max_files=10)
        client.pipe("/dash-pinned/p.bin", b"p")
        client.pin("/dash-pinned/p.bin", ttl=3 * 3600)
        status = client.status()
    browser.get(cluster.meta_url + "/ui/")
    attached = wait_for(lambda: cells(browser, "attachments").get("/dash-attached"),
                        2 * REFRESH + 3, "the attached directory")
    mine = next(a for a in status["attachments"] if a["path"] == "/dash-attached")
    assert (mine["files"], mine["bytes"], mine["cached_bytes"]) == (3, 160 << 10, 100 << 10)
    assert attached[1:4] == [f"file://{source}", "3", "100.0 KiB / 160.0 KiB"], attached
    ratio = mine["hit_ratio"]
    assert attached[4] == ("–" if ratio is None else f"{100 * ratio:.1f}%"), (attached, mine)

    assert cells(browser, "quotas")["/dash-quota"] == [
        "/dash-quota", "2.93 KiB / 1.00 MiB", "1 / 10"]
    pinned = cells(browser, "pins")["/dash-pinned/p.bin"]
    assert pinned[1].endswith("(in 3.0 h)"), pinned
    shot(browser, tmp_path / "cache.png")

    with Client(cluster.meta_url) as client:        # gone from the page once detached
        client.detach("/dash-attached")
        client.unpin("/dash-pinned/p.bin")
    wait_for(lambda: "/dash-attached" not in cells(browser, "attachments")
             and not cells(browser, "pins"), 2 * REFRESH + 3, "detached and unpinned")
    assert "no pin" in browser.find_element("id", "pins").text
    assert console_errors(browser) == []


def test_every_target_listed_and_a_killed_one_shown_down(
        browser: Any, cluster: ProcessCluster, tmp_path: Path) -> None:
    browser.get(cluster.meta_url + "/ui/")
    ids = {cluster.target_id(i) for i in range(3)}
    wait_for(lambda: set(rows(browser)) == ids and set(rows(browser).values()) == {"up"},
             10, "every target listed, up")
    health = browser.find_element("id", "health").text
    assert health.startswith("healthy: 3 of 3 targets up"), health
    shot(browser, tmp_path / "healthy.png")

    victim = cluster.target_id(0)
    cluster.kill_data(0)                # kill -9: no goodbye to the metadata server
    killed = time.monotonic()
    wait_for(lambda: rows(browser).get(victim) == "down", FAST["target_timeout"] + REFRESH + 3,
             f"{victim} shown down")
    took = time.monotonic() - killed
    print(f"target down on the page {took:.1f} s after kill -9 "
          f"(target_timeout {FAST['target_timeout']} s, refresh {REFRESH} s)")
    assert took <= FAST["target_timeout"] + REFRESH + 1
    assert {k: v for k, v in rows(browser).items() if k != victim} == \
        dict.fromkeys(ids - {victim}, "up")
    assert "degraded" in browser.find_element("id", "health").text
    row = browser.find_element("css selector", f'tr[data-target="{victim}"]')
    assert "down" in row.get_attribute("class")
    # when it will be declared lost, and its rebuild start (issue 26: "nothing to copy")
    assert "lost in 9" in row.find_element("css selector", ".lost-at").text or \
        "lost in 10 min" in row.find_element("css selector", ".lost-at").text
    waiting = browser.find_element("css selector", f'#rebuild p[data-lost="{victim}"]').text
    assert waiting.startswith(f"{victim} is down: lost in "), waiting
    assert "waiting for a down target" in browser.find_element("id", "rebuild").text
    shot(browser, tmp_path / "target-down.png")
    assert console_errors(browser) == []


def metas(browser: Any) -> dict[str, tuple[str, str]]:
    """metadata server URL → (state, duties), as the page shows them now."""
    return {url: (state, duties) for url, state, duties in browser.execute_script(
        "return Array.from(document.querySelectorAll('#metas tbody tr'))"
        ".map(r => [r.dataset.meta, r.querySelector('.state').textContent,"
        " r.cells[2].textContent])")}


def test_the_metadata_server_is_listed(browser: Any, cluster: ProcessCluster) -> None:
    browser.get(cluster.meta_url + "/ui/")
    wait_for(lambda: metas(browser) == {cluster.meta_url: ("up", "holds the duties")}, 10,
             "the one metadata server listed")
    assert console_errors(browser) == []


def test_two_metadata_servers_one_killed_shown_down(
        browser: Any, tmp_path: Path, pg_url: str) -> None:
    """Issue 26: with one of two metadata servers dead the page looked healthy."""
    with ProcessCluster(tmp_path / "c", data_servers=1, meta_store=pg_url,
                        meta_servers=2) as two:
        first, second = two.meta_urls
        browser.get(second + "/ui/")
        wait_for(lambda: set(metas(browser)) == {first, second}
                 and {s for s, _ in metas(browser).values()} == {"up"}
                 and [d for _, d in metas(browser).values()].count("holds the duties") == 1,
                 10, "both metadata servers listed, up, one with the duties")
        assert "metadata servers up" in browser.find_element("id", "health").text
        shot(browser, tmp_path / "two-metas.png")
        two.kill_meta(0)                # kill -9 the first; the page is the second's
        wait_for(lambda: metas(browser).get(first) == ("down", "–")
                 and metas(browser).get(second) == ("up", "holds the duties"),
                 15, "the killed one shown down, the other holding the duties")
        health = browser.find_element("id", "health").text
        assert health.startswith("degraded") and f"metadata server down: {first}" in health
        row = browser.find_element("css selector", f'tr[data-meta="{first}"]')
        assert "down" in row.get_attribute("class")
        shot(browser, tmp_path / "meta-down.png")
        assert console_errors(browser) == []


def test_a_reporting_job_appears_with_its_stall_worst_first(
        browser: Any, cluster: ProcessCluster, tmp_path: Path) -> None:
    target = cluster.target_id(1)
    fine, starving = f"fine-{time.time_ns()}", f"starving-{time.time_ns()}"
    report_job(cluster.meta_url, fine, 0, stall_fraction=0.02, samples_per_second=950.0,
               samples=4000)
    for rank, stall in ((0, 0.18), (1, 0.71)):
        report_job(cluster.meta_url, starving, rank, world_size=2, stall_fraction=stall,
                   recent_stall_fraction=stall, samples_per_second=40.0, samples=900,
                   host=f"gpu{rank}", targets=[{"target": target, "mean_latency": 0.084,
                                                "requests": 50, "bytes": 1 << 20}])
    browser.get(cluster.meta_url + "/ui/")

    def jobs() -> list[str]:
        return list(browser.execute_script(
            "return Array.from(document.querySelectorAll('#jobs section.job'))"
            ".map(s => s.dataset.job)"))

    wait_for(lambda: {fine, starving} <= set(jobs()), 2 * REFRESH + 3, "both jobs shown")
    order = jobs()
    assert order.index(starving) < order.index(fine)
    section = browser.find_element("css selector", f'section[data-job="{starving}"]')
    assert "stall 71.0%" in section.find_element("css selector", ".stall").text
    assert "bad" in section.find_element("css selector", ".stall").get_attribute("class")
    worst = section.find_element("css selector", 'tr[data-rank="1"]')
    assert "starving" in worst.get_attribute("class")
    text = worst.text
    assert "71.0%" in text and "40.0" in text and "gpu1" in text
    assert f"{target} (84.0 ms)" in text
    shot(browser, tmp_path / "starving-job.png")
    assert console_errors(browser) == []


def test_throughput_column_shows_writes(browser: Any, cluster: ProcessCluster) -> None:
    """Bytes written reach the targets' write rate (heartbeat counters → the page)."""
    from stager import Client

    with Client(cluster.meta_url) as client:
        client.pipe(f"/dash/blob-{time.time_ns()}", b"x" * (4 << 20))
    browser.get(cluster.meta_url + "/ui/")

    def writing() -> list[str]:
        cells = browser.execute_script(
            "return Array.from(document.querySelectorAll('#targets tbody tr'))"
            ".map(r => r.cells[7].textContent)")
        return [c for c in cells if c not in ("–", "0 B/s")]

    assert wait_for(writing, 2 * REFRESH + 3, "a write rate above zero")
    assert console_errors(browser) == []


@pytest.fixture(scope="module")
def auth_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadCluster]:
    c = start_cluster(tmp_path_factory.mktemp("dash-auth"), 2, auth=True)
    try:
        c.wait_targets(2)
        yield c
    finally:
        c.stop()


def test_auth_on_the_page_asks_for_a_token(browser: Any, auth_cluster: ThreadCluster,
                                           tmp_path: Path) -> None:
    browser.get(auth_cluster.meta_url + "/ui/")
    form = browser.find_element("id", "login")
    wait_for(form.is_displayed, 5, "the token form")
    assert not browser.find_element("id", "board").is_displayed()
    shot(browser, tmp_path / "token-form.png")

    def submit(token: str) -> None:
        field = browser.find_element("id", "token")
        field.clear()
        field.send_keys(token)
        form.submit()

    submit("not-a-token")               # refused (401): the form comes back, with why
    wait_for(lambda: form.is_displayed() and browser.find_element("id", "login-error").text,
             5, "the form back after a 401")
    assert "refused" in browser.find_element("id", "login-error").text
    assert browser.execute_script("return sessionStorage.getItem('stager.token')") is None

    token = auth_cluster.mint(["read"], name="dashboard")
    submit(token)
    ids = {auth_cluster.target_id(i) for i in range(2)}
    wait_for(lambda: set(rows(browser)) == ids, 5, "the targets, with the token")
    assert not form.is_displayed()
    assert browser.execute_script("return sessionStorage.getItem('stager.token')") == token
    assert browser.execute_script("return localStorage.length") == 0
    assert "no loader is reporting" in browser.find_element("id", "jobs").text \
        or browser.find_elements("css selector", "#jobs section.job")
    shot(browser, tmp_path / "auth-board.png")
    # the one error: the browser's own line for the refused request
    assert console_errors(browser, lambda e: e["source"] == "network" and " 401 " in
                          e["message"]) == []

    browser.find_element("id", "logout").click()    # forgotten: the form again
    wait_for(form.is_displayed, 2, "the form after forgetting the token")
    assert browser.execute_script("return sessionStorage.getItem('stager.token')") is None
