"""The dashboard of a ``--tls`` cluster in a real browser, as docs/tls.md says to open it.

A browser that does not trust the cluster's CA shows its certificate warning, not
the page; told to skip the check (``--ignore-certificate-errors``, the docs' way for
a test cluster only) it shows the token form, and the board once a token is entered.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from reliability_util import wait_for

from stager.testing import ThreadCluster
from stager.testing.browser import missing, open_browser

pytestmark = [pytest.mark.slow,       # a browser: not in make check
              pytest.mark.skipif(missing() is not None, reason=str(missing()))]


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadCluster]:
    c = ThreadCluster(tmp_path_factory.mktemp("dash-tls"), 1, auth=True, tls=True)
    c.start()
    try:
        c.wait_targets(1)
        yield c
    finally:
        c.stop()


def test_a_browser_without_the_ca_gets_a_warning_not_the_page(
        tls_cluster: ThreadCluster) -> None:
    url = tls_cluster.meta_url + "/ui/"
    assert url.startswith("https://127.0.0.1:")
    browser = open_browser()
    try:
        browser.get(url)
        assert browser.find_elements("id", "login") == []
        assert "privacy" in browser.title.lower() or "not private" in \
            browser.page_source.lower(), browser.title
    finally:
        browser.quit()


def test_the_docs_test_only_way_shows_the_form_then_the_board(
        tls_cluster: ThreadCluster, tmp_path: Path) -> None:
    browser = open_browser(extra_args=("--ignore-certificate-errors",))
    try:
        browser.get(tls_cluster.meta_url + "/ui/")
        form = browser.find_element("id", "login")
        wait_for(form.is_displayed, 10, "the token form")
        field = browser.find_element("id", "token")
        field.send_keys(tls_cluster.mint(["read"], name="dashboard"))
        form.submit()
        target = tls_cluster.target_id(0)
        wait_for(lambda: browser.find_elements("css selector", f'tr[data-target="{target}"]'),
                 10, "the target, with the token")
        assert not form.is_displayed()
    finally:
        browser.quit()
