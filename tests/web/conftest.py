"""The web view in a real browser: a real gateway (uvicorn over the session's nats-server) and Debian's
headless Chromium driven by Selenium through /usr/bin/chromedriver.

Selenium is synchronous and blocks while it waits on the browser, so the gateway runs in a thread of its
own with its own event loop and NATS connection; the tests are plain functions that drive the browser and
hand the gateway's loop the coroutines that write to the buckets (:meth:`Gateway.run`). Every wait is a
``WebDriverWait`` on a condition of the page, or an ``eventually`` on the bus, with a deadline.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from nats.aio.client import Client as NATS
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from nodus_gateway.app import build_app
from nodus_gateway.resources import stores_for
from nodus_gateway.server import ApiServer
from nodus_kit import declaring
from nodus_kit.connecting import connect

T = TypeVar("T")

TOKEN = "web-test-token-0123456789"
V1 = "/apis/nodus.dev/v1"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
VIEWPORT = (1280, 900)
WAIT_S = 15.0
START_S = 20.0


class Gateway:
    """A gateway served from a thread with its own loop; :meth:`run` runs a coroutine there."""

    def __init__(self, nats_url: str, nats_seed: Path) -> None:
        self.nats_url = nats_url
        self.nats_seed = nats_seed
        self.url = ""
        self.nc: NATS | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: Future[None] = Future()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="web-test-gateway", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.result(timeout=START_S)  # raises what stopped the start

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=START_S)

    def run(self, make: Callable[[NATS], Coroutine[Any, Any, T]]) -> T:
        """``make(nc)`` on the gateway's loop and connection; its result."""
        assert self._loop is not None and self.nc is not None
        return asyncio.run_coroutine_threadsafe(make(self.nc), self._loop).result(timeout=WAIT_S)

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        try:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self.nc = await connect(self.nats_url, "web-tests", nkey_seed=self.nats_seed)
            await declaring.ensure(self.nc.jetstream())
            server = ApiServer(build_app(stores_for(self.nc), admin_token=TOKEN), "127.0.0.1", 0)
            await server.start()
        except BaseException as e:
            self._ready.set_exception(e)
            raise
        self.url = server.url
        self._ready.set_result(None)
        await self._stop.wait()
        await server.stop()
        await self.nc.close()


@pytest.fixture(scope="session")
def gateway(nats_url: str, nats_seed: Path) -> Iterator[Gateway]:
    gw = Gateway(nats_url, nats_seed)
    gw.start()
    yield gw
    gw.stop()


@pytest.fixture
def api(gateway: Gateway) -> Iterator[httpx.Client]:
    """The API with the admin token, as the CLI calls it."""
    with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        yield client


@pytest.fixture(scope="session")
def chromium(gateway: Gateway) -> Iterator[WebDriver]:
    """Debian's Chromium, headless, its viewport fixed at 1280x900 (the screenshot's size). It depends on the
    gateway so that it quits first: a watch it still held would hold up the gateway's graceful stop."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if shutil.which(path) is None:
            pytest.fail(f"{path} is missing: install it with `apt-get install {package}` (make system-deps)")
    options = Options()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root, where Chromium's sandbox cannot start
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}",
    ):
        options.add_argument(arg)
    # The path is given, so Selenium Manager never looks for (or downloads) a driver of its own.
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        # The window size includes no browser frame in headless mode, but pin the viewport itself anyway.
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": VIEWPORT[0], "height": VIEWPORT[1], "deviceScaleFactor": 1, "mobile": False},
        )
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(chromium: WebDriver, gateway: Gateway) -> Iterator[WebDriver]:
    """The browser on the web view, signed out (this tab's sessionStorage empty), on a blank page."""
    chromium.get(f"{gateway.url}/ui/")
    chromium.execute_script("sessionStorage.clear()")
    chromium.get("about:blank")
    yield chromium
    # Leaving the page ends its watch: no request of one test outlives it.
    chromium.get("about:blank")


def open_page(browser: WebDriver, gateway: Gateway, route: str, token: str | None = TOKEN) -> None:
    """The web view at ``#<route>``, signed in with ``token`` as a pasted token is kept."""
    browser.get(f"{gateway.url}/ui/")
    if token is not None:
        browser.execute_script("sessionStorage.setItem('nodus.token', arguments[0])", token)
    browser.get(f"{gateway.url}/ui/#{route}")
    browser.refresh()  # the same document with the token: the route is read afresh


def wait_for(browser: WebDriver, condition: Callable[[WebDriver], T], message: str = "") -> T:
    """``condition`` until it is truthy; the page is redrawn on every change, so an element found a moment
    ago may be gone (stale) or not there yet: both count as "not yet"."""
    wait = WebDriverWait(
        browser,
        WAIT_S,
        poll_frequency=0.05,
        ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
    )
    result: T = wait.until(condition, message)
    return result
