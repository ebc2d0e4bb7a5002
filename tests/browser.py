"""Debian's chromium, driven headless by selenium through Debian's chromedriver (no download).

Selenium rather than playwright-core: it is a Python package the test extra installs, and it
drives the distribution's own chromedriver, so nothing comes from a browser vendor's CDN (which
this machine cannot reach: Playwright's browser download fails here).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ROOT = Path(__file__).resolve().parents[1]
# Screenshots the tests keep (not committed): BUILDER_TEST_ARTIFACTS, else test-artifacts/ here.
ARTIFACTS = Path(os.environ.get("BUILDER_TEST_ARTIFACTS") or ROOT / "test-artifacts")

NO_BROWSER = next(
    (why for missing, why in (
        (importlib.util.find_spec("selenium") is None, "selenium is not installed (pip install '.[test]')"),
        (not Path(CHROMIUM).is_file(), "chromium is not installed (apt-get install chromium chromium-driver)"),
        (not Path(CHROMEDRIVER).is_file(), "chromedriver is not installed (apt-get install chromium-driver)"),
    ) if missing),
    None,
)  # fmt: skip


@contextlib.contextmanager
def chromium(width: int = 1280, height: int = 1000) -> Iterator[Any]:
    """A headless chromium with a fresh profile, no network features, no sandbox (root here)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                f"--user-data-dir={profile}", f"--window-size={width},{height}"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def full_page_screenshot(driver: Any, path: Path, width: int) -> Path:
    """The whole page at `width`, saved where the tests keep their artifacts."""
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    driver.set_window_size(width, min(height + 120, 12000))
    path.parent.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(path)), path
    return path
