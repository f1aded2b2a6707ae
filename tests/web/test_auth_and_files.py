"""Signing in to the web view, and how the gateway serves its files.

The files under /ui/ are public (they hold code, no data); every API call the page makes carries the token
the user pasted, and a visit without one, or with a bad one, shows the login prompt (with the gateway's
reason and fix for a bad one) rather than any data.
"""

from __future__ import annotations

import re

import httpx
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from nodus_gateway.webview import CONTENT_SECURITY_POLICY, load_assets

from .conftest import TOKEN, Gateway, open_page, wait_for
from .sweeps import create_sweep

V1 = "/apis/nodus.dev/v1"


def stored_token(browser: WebDriver) -> str | None:
    token: str | None = browser.execute_script("return sessionStorage.getItem('nodus.token')")
    return token


def test_a_visit_without_a_token_shows_the_login_prompt_and_no_data(
    browser: WebDriver, gateway: Gateway
) -> None:
    browser.get(f"{gateway.url}/ui/")
    login = wait_for(browser, lambda b: b.find_element(By.ID, "login"))
    assert "Sign in" in login.text
    assert browser.find_element(By.ID, "token-input").get_attribute("type") == "password"
    assert browser.find_elements(By.ID, "error") == [], "nothing failed: no token was sent yet"
    assert browser.find_elements(By.CSS_SELECTOR, "table") == []
    assert not browser.find_element(By.ID, "sign-out").is_displayed()


def test_a_bad_token_shows_the_error_with_its_fix_and_a_good_one_signs_in(
    browser: WebDriver, gateway: Gateway, api: httpx.Client, unique: str
) -> None:
    create_sweep(api, unique, "lr")
    browser.get(f"{gateway.url}/ui/#/sweeps/{unique}")
    field = wait_for(browser, lambda b: b.find_element(By.ID, "token-input"))
    field.send_keys("not-the-token")
    browser.find_element(By.ID, "sign-in").click()

    error = wait_for(browser, lambda b: b.find_element(By.CSS_SELECTOR, "#login #error"), "the 401's Status")
    assert error.get_attribute("data-reason") == "Unauthorized"
    assert (
        "the bearer token is not valid for this gateway" in error.find_element(By.CLASS_NAME, "message").text
    )
    assert "Authorization: Bearer <token>" in error.find_element(By.CLASS_NAME, "fix").text
    assert stored_token(browser) is None, "a token the gateway refused is forgotten"

    browser.find_element(By.ID, "token-input").send_keys(TOKEN)
    browser.find_element(By.ID, "sign-in").click()
    wait_for(browser, lambda b: b.find_element(By.CSS_SELECTOR, "#sweeps-table tr[data-name='lr']"))
    assert stored_token(browser) == TOKEN
    assert browser.get_cookies() == [], "the token is never a cookie"

    browser.find_element(By.ID, "sign-out").click()
    wait_for(browser, lambda b: b.find_element(By.ID, "login"))
    assert stored_token(browser) is None


def test_a_missing_sweep_shows_the_gateways_not_found(
    browser: WebDriver, gateway: Gateway, unique: str
) -> None:
    open_page(browser, gateway, f"/sweeps/{unique}/nope")
    error = wait_for(browser, lambda b: b.find_element(By.ID, "error"))
    assert error.get_attribute("data-reason") == "NotFound"
    assert "nope" in error.find_element(By.CLASS_NAME, "message").text
    assert error.find_element(By.CLASS_NAME, "fix").text


def test_the_files_are_public_and_the_api_is_not(gateway: Gateway, api: httpx.Client) -> None:
    with httpx.Client(base_url=gateway.url) as anonymous:
        page = anonymous.get("/ui/")
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert page.headers["x-content-type-options"] == "nosniff"
        assert page.headers["x-request-id"], "a page load is a request like any other"
        assert '<script type="module" src="app.js"></script>' in page.text
        assert "://" not in page.text, "nothing is loaded from elsewhere"

        for name in modules():
            script = anonymous.get(f"/ui/{name}")
            assert script.status_code == 200, name
            # A browser runs a module only with a JavaScript media type.
            assert script.headers["content-type"] == "text/javascript; charset=utf-8", name
            assert script.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
            assert ".innerHTML" not in script.text and "insertAdjacentHTML" not in script.text, name
            again = anonymous.get(f"/ui/{name}", headers={"If-None-Match": script.headers["etag"]})
            assert again.status_code == 304, name
        assert anonymous.get("/ui/app.css").headers["content-type"] == "text/css; charset=utf-8"

        head = anonymous.head("/ui/")
        assert (head.status_code, head.content) == (200, b"")
        redirect = anonymous.get("/ui")
        assert (redirect.status_code, redirect.headers["location"]) == (308, "/ui/")
        missing = anonymous.get("/ui/secrets.txt")
        assert (missing.status_code, missing.json()["reason"]) == (404, "NotFound")
        posted = anonymous.post("/ui/", content=b"x")
        assert (posted.status_code, posted.headers["allow"]) == (405, "GET, HEAD")

        # The API behind the page still wants the token.
        assert anonymous.get(f"{V1}/sweeps").status_code == 401
        assert anonymous.get("/uix").status_code == 401, "only /ui and /ui/... are public"

        # The files are no part of the API: neither discovery nor the OpenAPI documents list them.
        paths = api.get("/openapi/v2").json()["paths"]
        assert paths and not [p for p in paths if p.startswith("/ui")]
        v3 = api.get("/openapi/v3").json()["paths"]
        assert not [p for p in v3 if p.startswith("ui")]


def test_a_browser_at_the_root_lands_on_the_web_view_and_a_client_gets_the_root_paths(
    gateway: Gateway, api: httpx.Client, browser: WebDriver
) -> None:
    """#19: ``GET /`` from a browser is a redirect to ``/ui/`` (it was a 404); a JSON client with a token
    gets Kubernetes' list of root paths (``kubectl get --raw /``), and without one a 401."""
    with httpx.Client(base_url=gateway.url) as anonymous:
        html = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}
        landed = anonymous.get("/", headers=html)
        assert (landed.status_code, landed.headers.get("location")) == (302, "/ui/"), landed.text
        assert anonymous.get("/", headers={"Accept": "application/json"}).status_code == 401
    paths = api.get("/", headers={"Accept": "application/json"}).json()["paths"]
    assert {"/apis", "/apis/nodus.dev/v1", "/openapi/v2", "/ui/", "/version"} <= set(paths)
    assert all(api.get(p).status_code == 200 for p in paths), "every path it lists answers"
    browser.get(f"{gateway.url}/")
    wait_for(
        browser, lambda b: b.current_url.startswith(f"{gateway.url}/ui/"), "the browser lands on the web view"
    )


# An import (or re-export) statement's module: no "(", "=" or ";" before its "from", so that no function or
# constant that holds the word is mistaken for one.
IMPORT = re.compile(r"""^(?:import|export)\s[^;(=]*?\bfrom\s*["']([^"']+)["'];?$""", re.M)


def modules() -> list[str]:
    """The page's scripts: app.js and every module it imports, directly or not (#19 split it by concern)."""
    assets = load_assets()
    found, todo = [], ["app.js"]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.append(name)
        todo += [m.removeprefix("./") for m in IMPORT.findall(assets[name].body.decode())]
    return sorted(found)


def test_every_module_the_page_imports_is_served_and_every_script_served_is_imported() -> None:
    assets = load_assets()
    for name in modules():
        for spec in IMPORT.findall(assets[name].body.decode()):
            # A relative path within /ui/: a bare name needs an import map, and no file is fetched elsewhere.
            assert re.fullmatch(r"\./[a-z]+\.js", spec), f"{name} imports {spec!r}"
            assert spec.removeprefix("./") in assets, f"{name} imports {spec}, which /ui/ does not serve"
    served = sorted(n for n in assets if n.endswith(".js"))
    assert served == modules(), "a script nothing imports is dead code"
