"""A real headless browser for the dashboard's tests: Debian's chromium driven by selenium through chromedriver.

Nothing is downloaded: the browser and its driver are the system's (`apt-get install chromium chromium-driver`;
`python3 dev.py test` installs them where it can). Where they are missing, the browser tests skip with the reason,
except in CI (CI=true), where they fail: a CI run that silently skipped them would claim a dashboard it never tried.

Every request the page makes is recorded (Chrome's performance log) so a test can assert that none left 127.0.0.1;
requests to other hosts are also blocked (a proxy that does not exist: Chrome never proxies loopback).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path(os.environ.get("CORRAL_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("CORRAL_CHROMEDRIVER", "/usr/bin/chromedriver"))
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,900",
    # Anything not on loopback goes to a proxy that is not there: blocked, and still recorded by the log.
    "--proxy-server=http://127.0.0.1:9",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
)


def missing() -> str | None:
    """Why no browser test can run here, or None."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not path.exists():
            return f"{path} is missing (apt-get install -y {package})"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


def require_browser() -> None:
    """Skip the calling module where no browser is; in CI, fail it."""
    why = missing()
    if why is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"browser tests cannot run in CI: {why}", pytrace=False)
    pytest.skip(f"no browser: {why}", allow_module_level=True)


@contextlib.contextmanager
def chromium(profile: Path) -> Iterator[Any]:
    """A headless chromium with a fresh profile, recording the network; quit at the end."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        driver.set_page_load_timeout(30)
        driver.execute_cdp_cmd("Network.enable", {})
        # A headless window can lose the focus (after a frame switch): keys would then reach nothing.
        driver.execute_cdp_cmd("Emulation.setFocusEmulationEnabled", {"enabled": True})
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


class Network:
    """What the page asked for, from the performance log (read once: each read empties the log)."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.responses: list[tuple[str, str]] = []  # (request id, url)

    def read(self, driver: Any) -> None:
        for entry in driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            params = message.get("params", {})
            if message.get("method") == "Network.requestWillBeSent":
                self.requests.append(params["request"]["url"])
            elif message.get("method") == "Network.responseReceived":
                self.responses.append((params["requestId"], params["response"]["url"]))

    def bodies(self, driver: Any, keep: Callable[[str], bool]) -> dict[str, str]:
        """The bodies of the responses recorded so far whose URL `keep` accepts (those the browser still holds)."""
        found = {}
        for request_id, url in self.responses:
            if not keep(url):
                continue
            with contextlib.suppress(Exception):  # a body the browser has already dropped (a replaced page's)
                found[f"{url} ({request_id})"] = driver.execute_cdp_cmd(
                    "Network.getResponseBody", {"requestId": request_id}
                )["body"]
        return found
