"""The web dashboard at / (docs/dashboard.md; issue 13, points 1, 2 and 5).

First the daemon's side, over plain HTTP: the files need no key and carry strict headers,
GET answers carry ETags and If-None-Match gets 304, the page's own Origin is let in and a
foreign one is not, and /v1/whoami says who a key is. Then the page itself in a real browser:
Debian's chromium, headless, driven by Selenium through Debian's chromium-driver (both
installed by scripts/setup.sh), against the session's daemon with real sandboxes. One browser
for the module; a screenshot of each page goes to build/test-artifacts/.
"""

import os
import shutil
import tempfile

import pytest

import conftest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ARTIFACTS = os.path.join(ROOT, "build", "test-artifacts")
CHROMIUM = os.environ.get("WR_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("WR_CHROMEDRIVER", "/usr/bin/chromedriver")
WAIT = 20  # seconds any one thing on the page may take to show (a stop takes a few)

ASSETS = {"/": "text/html", "/app.js": "text/javascript", "/term.js": "text/javascript",
          "/app.css": "text/css",
          "/icon.svg": "image/svg+xml"}


def plain(daemon):
    """A client of the daemon's TCP listener without a key."""
    return daemon.client.with_key(None)


# ---- the daemon's side ----

def test_files_need_no_key_and_carry_strict_headers(daemon):
    for path, ctype in ASSETS.items():
        r = plain(daemon).request("GET", path, validate=False)
        assert r.status == 200, r
        h = r.headers
        assert h["content-type"].startswith(ctype), (path, h)
        csp = h["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp, csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp, csp
        assert h["x-content-type-options"] == "nosniff"
        assert h["x-frame-options"] == "DENY"
        assert h["referrer-policy"] == "no-referrer"
        assert h["etag"].startswith('"'), h
        again = plain(daemon).request("GET", path, headers={"If-None-Match": h["etag"]},
                                      validate=False)
        assert again.status == 304 and again.body == b"", again
        other = plain(daemon).request("GET", path, headers={"If-None-Match": '"nope"'},
                                      validate=False)
        assert other.status == 200 and other.body == r.body
    page = plain(daemon).request("GET", "/", validate=False).body.decode()
    assert '<html lang="en">' in page and "<script src=\"/app.js\"" in page
    assert "<script>" not in page and "style=" not in page  # nothing inline: the CSP forbids it
    # also on the Unix socket, and nothing else at the root needs no key
    assert daemon.admin.request("GET", "/", validate=False).status == 200
    assert plain(daemon).request("GET", "/index.html", validate=False).status == 401
    assert plain(daemon).request("POST", "/", validate=False).status == 401
    for method in ("POST", "DELETE", "TRACE"):  # with a key: the file is there, not the method
        r = daemon.client.request(method, "/app.js", validate=False)
        assert r.status == 405 and r.headers["allow"] == "GET", r


def test_page_origin_is_let_in_and_a_foreign_one_is_not(daemon):
    own = f"http://127.0.0.1:{daemon.port}"
    ok = daemon.client.request("GET", "/v1/whoami", headers={"Origin": own})
    assert ok.status == 200, ok
    for origin in ("http://evil.test", f"https://127.0.0.1:{daemon.port}", "null",
                   f"http://127.0.0.1:{daemon.port + 1}"):
        r = daemon.client.request("GET", "/v1/whoami", headers={"Origin": origin})
        assert r.status == 403, (origin, r)
        # the files too: a page elsewhere cannot pull the dashboard into itself
        r = plain(daemon).request("GET", "/", headers={"Origin": origin}, validate=False)
        assert r.status == 403, (origin, r)
    r = plain(daemon).request("GET", "/", headers={"Host": "evil.test"}, validate=False)
    assert r.status == 403, r


def test_api_gets_answer_304_while_nothing_changed(daemon, sandbox):
    c = daemon.client
    for path in ("/v1/sandboxes", f"/v1/sandboxes/{sandbox}/events", "/v1/whoami"):
        first = c.request("GET", path)
        assert first.status == 200 and first.headers.get("etag"), first
        again = c.request("GET", path, headers={"If-None-Match": first.headers["etag"]},
                          validate=False)
        assert again.status == 304 and again.body == b"", (path, again)
    # a change gives a new tag and the new body
    first = c.request("GET", f"/v1/sandboxes/{sandbox}/files/list", query={"path": "/tmp"})
    c.write_file(sandbox, "/tmp/etag-probe.txt", b"x")
    after = c.request("GET", f"/v1/sandboxes/{sandbox}/files/list", query={"path": "/tmp"},
                      headers={"If-None-Match": first.headers["etag"]})
    assert after.status == 200 and after.headers["etag"] != first.headers["etag"]
    assert "etag-probe.txt" in {e["name"] for e in after.json()["entries"]}
    # errors carry no tag
    missing = c.request("GET", "/v1/sandboxes/sb-aaaaaaaaaaaaaaaaaaaaa")
    assert missing.status == 404 and "etag" not in missing.headers


def test_whoami(daemon):
    me = daemon.client.expect(200, "GET", "/v1/whoami").json()
    assert me["admin"] is False and me["key"]["read_only"] is False
    ro = daemon.make_key(read_only=True, owner_id=me["key"]["id"], daily_limit_micros=5_000_000)
    them = daemon.client.with_key(ro["key"]).expect(200, "GET", "/v1/whoami").json()
    assert them["key"]["id"] == ro["id"] and them["key"]["read_only"] is True
    assert them["key"]["daily_limit_micros"] == 5_000_000 and them["auditor"] is False
    assert daemon.admin.expect(200, "GET", "/v1/whoami").json() == {
        "admin": True, "auditor": False, "key": None}
    assert plain(daemon).request("GET", "/v1/whoami").status == 401
    metrics = daemon.make_key(metrics=True)
    assert daemon.client.with_key(metrics["key"]).request("GET", "/v1/whoami").status == 403


# ---- the page, in a browser ----

@pytest.fixture(scope="module")
def browser():
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        pytest.fail(f"{CHROMIUM} and {CHROMEDRIVER} are needed (scripts/setup.sh installs "
                    "Debian's chromium and chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.makedirs(ARTIFACTS, exist_ok=True)
    profile = tempfile.mkdtemp(prefix="wr-chromium-")
    downloads = tempfile.mkdtemp(prefix="wr-downloads-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              f"--user-data-dir={profile}", "--window-size=1280,1000", "--no-first-run",
              "--disable-extensions", "--disable-background-networking"):
        opts.add_argument(a)
    opts.add_experimental_option("prefs", {"download.default_directory": downloads,
                                           "download.prompt_for_download": False})
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium must not try to fetch a driver
    drv = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    try:
        drv.execute_cdp_cmd("Page.setDownloadBehavior",
                            {"behavior": "allow", "downloadPath": downloads})
        drv.downloads = downloads
        yield drv
    finally:
        drv.quit()
        shutil.rmtree(profile, ignore_errors=True)
        shutil.rmtree(downloads, ignore_errors=True)


def wait_for(drv, cond, what, timeout=WAIT):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    def safe(d):
        try:
            return cond(d)
        except StaleElementReferenceException:
            return False
    try:
        return WebDriverWait(drv, timeout, poll_frequency=0.1).until(safe)
    except Exception as e:
        shot(drv, "failure")
        raise AssertionError(f"timed out waiting for {what}: {e!r}") from e


def shot(drv, name):
    drv.save_screenshot(os.path.join(ARTIFACTS, f"dashboard-{name}.png"))


def by_css(drv, css):
    from selenium.webdriver.common.by import By
    return drv.find_elements(By.CSS_SELECTOR, css)


def visible_text(drv, css):
    els = by_css(drv, css)
    return els[0].text if els and els[0].is_displayed() else None


def sign_in(drv, daemon, key):
    from selenium.webdriver.common.keys import Keys

    drv.get(f"http://127.0.0.1:{daemon.port}/#/signin")
    drv.execute_script("sessionStorage.clear()")
    drv.get(f"http://127.0.0.1:{daemon.port}/#/signin")
    wait_for(drv, lambda d: by_css(d, "#key") and by_css(d, "#key")[0].is_displayed(),
             "the sign-in form")
    box = by_css(drv, "#key")[0]
    box.clear()
    box.send_keys(key, Keys.ENTER)  # the keyboard is enough


def row_state(drv, sid):
    cells = by_css(drv, f'tr[data-id="{sid}"] td[class^="state-"]')
    return cells[0].get_attribute("textContent") if cells else ""


@pytest.fixture(scope="module")
def two(daemon):
    """Two running sandboxes made through the API: one to look into, one to stop."""
    f = conftest.SandboxFactory(daemon.client)
    a = f(memory_mib=512, metadata={"test": "dashboard"})["id"]
    b = f(memory_mib=512)["id"]
    yield a, b
    f.cleanup()


@pytest.mark.timeout(120)
def test_browser_sign_in_list_stop_files_and_read_only(daemon, browser, two):
    drv = browser
    a, b = two
    c = daemon.client

    # a wrong key: a clear error, still on the sign-in page
    sign_in(drv, daemon, "wr_not_a_real_key")
    # (429's message if earlier tests of the session, all from 127.0.0.1, used up its guesses)
    wait_for(drv, lambda d: any(m in (visible_text(d, "#signin-error") or "")
                                for m in ("not accepted", "Too many wrong keys")),
             "the wrong-key message")
    assert drv.execute_script("return sessionStorage.length") == 0
    shot(drv, "signin-wrong-key")

    # the real key: the sandboxes page lists both, running, with live CPU and memory
    sign_in(drv, daemon, daemon.key)
    wait_for(drv, lambda d: row_state(d, a).startswith("running") and
             row_state(d, b).startswith("running"),
             "both sandboxes listed as running")
    assert drv.execute_script(
        "return sessionStorage.getItem('withruntime.key')") == daemon.key
    assert daemon.key not in drv.current_url
    assert drv.get_cookies() == []
    wait_for(drv, lambda d: "MiB" in by_css(d, f'tr[data-id="{a}"] td')[8].text,
             "the sandbox's memory from /stats")
    row = by_css(drv, f'tr[data-id="{a}"]')[0].text
    assert "512 MiB" in row and "default" in row and "$" in row, row
    shot(drv, "sandboxes")

    # stop b from the page: its state changes in place, without a reload
    drv.execute_script("window.__noReload = 42")
    by_css(drv, f'button[data-action="stop"][data-id="{b}"]')[0].click()
    wait_for(drv, lambda d: row_state(d, b).startswith("stopped"),
             "the stopped state on the page", timeout=60)
    assert drv.execute_script("return window.__noReload") == 42
    # the polls that saw nothing new were answered 304 (ETag sent back in If-None-Match)
    wait_for(drv, lambda d: d.execute_script("return window.wrNotModified || 0") > 0,
             "a poll answered 304")
    assert c.get(b)["state"] == "stopped"
    assert by_css(drv, f'button[data-action="start"][data-id="{b}"]')[0].is_enabled()
    shot(drv, "sandboxes-stopped")

    # one sandbox: a command's exit code, the file browser, a download of the exact bytes
    payload = bytes(range(256)) * 3 + b"dashboard\n"
    c.write_file(a, "/workspace/report.bin", payload)
    cmd = c.exec(a, "exit 3", background=True, expect=201)
    c.expect(200, "POST", f"/v1/sandboxes/{a}/commands/{cmd['id']}/wait",
             {"timeout_seconds": 30})
    drv.find_element("css selector", f'tr[data-id="{a}"] a').click()
    wait_for(drv, lambda d: by_css(d, 'tr[data-name="report.bin"]'), "the file in the browser")
    wait_for(drv, lambda d: by_css(d, f'tr[data-cmd="{cmd["id"]}"]') and
             by_css(d, f'tr[data-cmd="{cmd["id"]}"] td')[3].text == "3",
             "the command with exit code 3")
    wait_for(drv, lambda d: "running" in (visible_text(d, "#d-state") or ""), "the state")
    wait_for(drv, lambda d: by_css(d, "#e-rows tr"), "the events")
    by_css(drv, 'tr[data-name="report.bin"] button[data-file-action="download"]')[0].click()
    target = os.path.join(drv.downloads, "report.bin")
    wait_for(drv, lambda d: os.path.exists(target) and os.path.getsize(target) == len(payload),
             "the downloaded file")
    with open(target, "rb") as f:
        assert f.read() == payload
    wait_for(drv, lambda d: by_css(d, "#d-chart-live svg path.line"), "the live chart")
    wait_for(drv, lambda d: by_css(d, "#d-chart-cost svg rect.bar"), "the cost chart")
    shot(drv, "sandbox")

    # usage page
    drv.find_element("css selector", 'nav a[href="#/usage"]').click()
    wait_for(drv, lambda d: by_css(d, "#u-chart svg rect.bar") and by_css(d, "#u-key-rows tr"),
             "the usage chart and table")
    shot(drv, "usage")

    # a read-only key of the same owner (with a daily limit): sees the sandboxes, cannot stop
    me = c.expect(200, "GET", "/v1/whoami").json()["key"]
    ro = daemon.make_key(read_only=True, owner_id=me["id"], daily_limit_micros=2_000_000)
    sign_in(drv, daemon, ro["key"])
    wait_for(drv, lambda d: row_state(d, a).startswith("running"),
             "the list for the read-only key")
    stop = by_css(drv, f'button[data-action="stop"][data-id="{a}"]')[0]
    assert not stop.is_enabled()
    drv.execute_script("arguments[0].click()", stop)  # even a scripted click does nothing
    assert "read-only" in (visible_text(drv, "#who") or "")
    shot(drv, "sandboxes-read-only")
    assert c.get(a)["state"] == "running"
    drv.find_element("css selector", 'nav a[href="#/usage"]').click()
    wait_for(drv, lambda d: by_css(d, "#u-chart svg line.limit"), "the daily-limit line")
    limit = by_css(drv, "#u-chart svg line.limit")[0].get_attribute("data-limit")
    assert limit == "2000000", limit
    shot(drv, "usage-read-only")

    # phone width: no horizontal scroll of the page itself (tables scroll in their box)
    drv.set_window_size(390, 844)
    try:
        drv.find_element("css selector", 'nav a[href="#/sandboxes"]').click()
        wait_for(drv, lambda d: row_state(d, a).startswith("running"), "the list at phone width")
        assert drv.execute_script(
            "return document.documentElement.scrollWidth <= window.innerWidth + 1")
        shot(drv, "sandboxes-phone")
    finally:
        drv.set_window_size(1280, 1000)


@pytest.mark.timeout(60)
def test_browser_terminal_runs_a_typed_command(daemon, browser, two):
    from selenium.webdriver.common.keys import Keys

    drv = browser
    a, _ = two
    sign_in(drv, daemon, daemon.key)
    wait_for(drv, lambda d: row_state(d, a).startswith("running"), "the list")
    drv.get(f"http://127.0.0.1:{daemon.port}/#/sandbox/{a}")
    wait_for(drv, lambda d: by_css(d, "#term-open") and by_css(d, "#term-open")[0].is_enabled(),
             "the terminal's open button")
    by_css(drv, "#term-open")[0].click()
    term = wait_for(drv, lambda d: by_css(d, "#term") and by_css(d, "#term")[0].is_displayed()
                    and by_css(d, "#term")[0].text.rstrip().endswith(("#", "$"))
                    and by_css(d, "#term")[0],
                    "a shell prompt in the terminal")
    term.click()
    term.send_keys("echo $((6 * 7))dash")
    # line editing: two characters rubbed out, then typed again
    term.send_keys(Keys.BACKSPACE, Keys.BACKSPACE, "sh", Keys.ENTER)
    wait_for(drv, lambda d: "\n42dash\n" in by_css(d, "#term")[0].text,
             "the command's output in the terminal")
    shot(drv, "terminal")
    sessions = daemon.client.expect(200, "GET", f"/v1/sandboxes/{a}/sessions").json()["sessions"]
    assert any(s["state"] == "running" and s["connected"] for s in sessions), sessions
    by_css(drv, "#term-close")[0].click()
    wait_for(drv, lambda d: not any(
        s["state"] == "running" for s in daemon.client.expect(
            200, "GET", f"/v1/sandboxes/{a}/sessions").json()["sessions"]),
        "the session gone after Close")
