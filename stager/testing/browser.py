"""A real headless browser for the dashboard's tests and screenshots, and job reports.

Debian's ``chromium`` and ``chromium-driver`` through Selenium, with nothing
downloaded: the driver's path is given, so Selenium Manager never runs.  As root
(containers) Chromium needs ``--no-sandbox``.  The browser's console is kept
(``goog:loggingPrefs``) so a test can assert the page logged no script error.
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from typing import Any

from ..protocol.routes import route

DRIVER = "/usr/bin/chromedriver"


def missing() -> str | None:
    """Why no browser can run here, or ``None``."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    if shutil.which("chromium") is None:
        return "chromium is not installed (apt-get install chromium; make sysdeps)"
    if shutil.which("chromedriver") is None:
        return "chromedriver is not installed (apt-get install chromium-driver)"
    return None


def open_browser(width: int = 1280, height: int = 900, *, extra_args: tuple[str, ...] = ()
                 ) -> Any:
    """A headless Chromium driven by Selenium (``quit()`` it when done); ``extra_args``
    are more Chromium flags."""
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--hide-scrollbars", f"--window-size={width},{height}", *extra_args):
        options.add_argument(arg)
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(shutil.which("chromedriver") or DRIVER)
    return webdriver.Chrome(options=options, service=service)


def report_job(meta_url: str, job: str, rank: int, *, token: str | None = None,
               **fields: Any) -> dict[str, Any]:
    """Send one loader report (``PUT /v1/jobs/{job}/ranks/{rank}``), as a Loader with
    reporting on does; ``fields`` over a minimal report's."""
    body = {"interval": 30.0, "world_size": 1, "samples": 0, **fields}
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(route("report_rank").url(meta_url, job=job, rank=rank),
                                     data=json.dumps(body).encode(), method="PUT",
                                     headers=headers)
    with urllib.request.urlopen(request, timeout=10) as resp:
        answer: dict[str, Any] = json.load(resp)
        return answer
