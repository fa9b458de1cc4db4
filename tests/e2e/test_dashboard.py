"""The web dashboard at / (docs/dashboard.md; issue 13, points 1, 2 and 5).

First the daemon's side, over plain HTTP: the files need no key and carry strict headers,
GET answers carry ETags and If-None-Match gets 304, the page's own Origin is let in and a
foreign one is not, and /v1/whoami says who a key is. Then the page itself in a real browser:
Debian's chromium, headless, driven by Selenium through Debian's chromium-driver (both
installed by scripts/setup.sh --tests), against the session's daemon with real sandboxes: the pages,
an auditor key's Keys and Audit pages, and basic accessibility checks run in the page at phone
and desktop widths. One browser for the module; a screenshot of each page goes to
build/test-artifacts/.
"""

import calendar
import os
import shutil
import tempfile
import time

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
        assert r.status == 405 and r.headers["allow"] == "GET, HEAD", r


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
        pytest.fail(f"{CHROMIUM} and {CHROMEDRIVER} are needed (scripts/setup.sh --tests installs "
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
        except (StaleElementReferenceException, IndexError):
            return False  # the page redrew between two looks
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
    """The state shown for sid on the sandboxes page, if that page is the one shown."""
    if not by_css(drv, "#view-sandboxes") or not by_css(drv, "#view-sandboxes")[0].is_displayed():
        return ""
    cells = by_css(drv, f'tr[data-id="{sid}"] td[class^="state-"]')
    return cells[0].get_attribute("textContent") if cells else ""


# What a sandbox (or its maker) controls, made to run script if the page ever parsed it as HTML.
HOSTILE = '<img src=x onerror="window.__pwned=1">&amp; hi'
HOSTILE_META = "<script>window.__pwned=2</script>"


def usd(micros):
    """Money as the page writes it (app.js's usd)."""
    d = micros / 1e6
    return "$0.00" if d == 0 else f"${d:.6f}" if d < 0.01 else f"${d:.4f}" if d < 1 else f"${d:.2f}"


def not_pwned(drv):
    """Nothing the sandbox controls became markup on the page."""
    assert drv.execute_script("return window.__pwned === undefined"), "script from a sandbox ran"
    assert by_css(drv, "main img, main script") == []


@pytest.fixture(scope="module")
def two(daemon):
    """Two running sandboxes made through the API: one to look into, one to stop."""
    f = conftest.SandboxFactory(daemon.client)
    a = f(memory_mib=512, env={"GREETING": HOSTILE},
          metadata={"test": "dashboard", "note": HOSTILE_META})["id"]
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
    drv.execute_script("performance.clearResourceTimings()")  # to count the page's usage calls
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
    # the chart is one /v1/usage call: this sandbox's, by minute
    usage_calls = drv.execute_script(
        "return performance.getEntriesByType('resource').map((e) => e.name)"
        ".filter((n) => n.includes('/v1/usage'))")
    assert len(usage_calls) == 1, usage_calls
    assert f"sandbox={a}" in usage_calls[0] and "group_by=minute" in usage_calls[0], usage_calls
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


# ---- issue 24: a list that uses the width, small spend seen, command output, settings, lease,
# ---- create

# How many lines each cell of a row takes: the height of its content over its line height (a
# cell of buttons: how many rows of buttons).
LINES_JS = r"""
return [...arguments[0].cells].map((td) => {
  const buttons = [...td.querySelectorAll("button")];
  if (buttons.length)
    return new Set(buttons.map((b) => Math.round(b.getBoundingClientRect().top))).size;
  const r = document.createRange();
  r.selectNodeContents(td);
  return Math.round(r.getBoundingClientRect().height / parseFloat(getComputedStyle(td).lineHeight));
});
"""


@pytest.mark.timeout(60)
def test_browser_list_takes_one_line_a_sandbox_at_1280(daemon, browser, two):
    drv = browser
    a, b = two
    drv.set_window_size(1280, 1000)
    sign_in(drv, daemon, daemon.key)
    wait_for(drv, lambda d: row_state(d, a).startswith("running") and row_state(d, b) and
             "%" in by_css(d, f'tr[data-id="{a}"] td')[7].text and
             "MiB" in by_css(d, f'tr[data-id="{a}"] td')[8].text, "the list with figures")
    shot(drv, "sandboxes-1280")
    heads = [th.text for th in by_css(drv, "#sb-table thead th")]
    assert heads == ["Sandbox", "State", "Image", "Size", "Age", "Lease left", "Cost", "CPU",
                     "Memory", "Actions"], heads
    rows = [by_css(drv, "#sb-table thead tr")[0]] + by_css(drv, "#sb-rows tr")
    for tr in rows:
        lines = drv.execute_script(LINES_JS, tr)
        cells = [td.text for td in tr.find_elements("css selector", "th, td")]
        # every cell one line: the id, size, times, money, figures, the buttons side by side
        # (state and image may wrap; at 1280 px they do not need to)
        # (a figure not read yet is an empty cell: no line)
        assert lines[0] == 1 and all(n <= 1 for i, n in enumerate(lines) if i not in (1, 2)), \
            (cells, lines)
    # and the table fits: no sideways scroll at 1280 px
    assert drv.execute_script(
        "const w = document.querySelector('#sb-table').parentElement;"
        "return w.scrollWidth <= w.clientWidth")


@pytest.mark.timeout(60)
def test_browser_usage_chart_shows_a_small_spend_beside_a_high_limit(daemon, browser, two):
    drv = browser
    c = daemon.client
    me = c.expect(200, "GET", "/v1/whoami").json()["key"]
    ro = daemon.make_key(read_only=True, owner_id=me["id"], daily_limit_micros=10_000_000)
    today = time.strftime("%Y-%m-%d", time.gmtime())

    def spent():
        rows = c.expect(200, "GET", "/v1/usage",
                        query={"group_by": "day", "from": today}).json()["rows"]
        return sum(r["cost_micros"] for r in rows if r["day"] == today)
    # the module's sandboxes have run a while: some spend today, far below the $10 limit
    deadline = time.monotonic() + WAIT
    while not spent() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert 0 < spent() < 100_000, spent()  # under 10 cents: under 1 % of the limit
    sign_in(drv, daemon, ro["key"])
    wait_for(drv, lambda d: row_state(d, two[0]), "the list")
    drv.get(f"http://127.0.0.1:{daemon.port}/#/usage")
    bar = wait_for(drv, lambda d: [r for r in by_css(d, "#u-chart svg rect.bar") if r.get_attribute(
        "textContent").startswith(today[5:] + ": $")], "today's bar")[0]
    shot(drv, "usage-small-spend")
    # seen: a bar of a few pixels at least (at the limit's scale it would be under one)
    assert drv.execute_script("return arguments[0].getBoundingClientRect().height", bar) >= 3
    value = int(bar.get_attribute("data-value"))
    assert value > 0
    limit = by_css(drv, "#u-chart svg line.limit")[0]
    assert limit.get_attribute("data-limit") == "10000000"
    assert limit.get_attribute("data-off-scale") == "true"
    assert "daily limit $10.00" in by_css(drv, "#u-chart svg")[0].get_attribute("textContent")
    # and said in words: today's spend, the limit, the share
    summary = visible_text(drv, "#u-summary")
    assert f"Today (UTC): {usd(value)} spent of this key's daily limit of $10.00" in \
        summary, summary
    share = value / 10_000_000 * 100
    assert f"({'under 0.01' if share < 0.01 else f'{share:.2f}'} %)" in summary, summary


@pytest.mark.timeout(90)
def test_browser_follows_a_background_commands_output(daemon, browser, two):
    drv = browser
    a, _ = two
    c = daemon.client
    c.exec(a, "rm -f /tmp/go")
    # 900 KiB of lines, the env's hostile value, a mark; then, on a signal from the test, 300 KiB
    # more and an end: 1.2 MiB in all, of which the page keeps the last 1 MiB
    first, second = 921600, 307200
    script = ("yes " + "x" * 63 + " | head -c %d; printf '%%s\\n' \"$GREETING\"; echo MARK1; "
              "echo to-stderr >&2; while [ ! -e /tmp/go ]; do sleep 0.1; done; "
              "yes " + "y" * 63 + " | head -c %d; echo END") % (first, second)
    cmd = c.exec(a, script, background=True, max_output_bytes=1 << 20, expect=201)["id"]
    sign_in(drv, daemon, daemon.key)
    wait_for(drv, lambda d: row_state(d, a), "the list")
    drv.get(f"http://127.0.0.1:{daemon.port}/#/sandbox/{a}")
    button = wait_for(drv, lambda d: by_css(d, f'button[data-cmd-output="{cmd}"]'),
                      "the command's Output button")[0]
    button.click()
    text = lambda d, n: d.execute_script(  # noqa: E731
        f"return document.getElementById('o-{n}').textContent")
    wait_for(drv, lambda d: text(d, "stdout").endswith("MARK1\n") and
             text(d, "stderr") == "to-stderr\n", "the output so far")
    assert "Running" in visible_text(drv, "#o-state")
    assert (HOSTILE + "\nMARK1\n") in text(drv, "stdout")  # as text, not markup
    not_pwned(drv)
    shot(drv, "command-output-running")
    c.write_file(a, "/tmp/go", b"")
    # followed without a click: the rest arrives, and the end
    wait_for(drv, lambda d: "Exited with code 0" in (visible_text(d, "#o-state") or ""),
             "the command's end", timeout=30)
    whole = ("x" * 63 + "\n") * (first // 64) + HOSTILE + "\nMARK1\n" + \
        ("y" * 63 + "\n") * (second // 64) + "END\n"
    shown = text(drv, "stdout")
    assert len(shown) == 1 << 20 and shown == whole[-(1 << 20):], (len(shown), shown[-80:])
    note = visible_text(drv, "#o-stdout-note")
    assert f"{len(whole)} bytes written" in note and \
        f"{len(whole) - (1 << 20)} earlier characters dropped" in note, note
    not_pwned(drv)
    assert_accessible(drv, "command-output")
    shot(drv, "command-output")


@pytest.mark.timeout(120)
def test_browser_settings_lease_and_create(daemon, browser, two):
    drv = browser
    a, _ = two
    c = daemon.client
    base = f"http://127.0.0.1:{daemon.port}"
    # a read-only key: the lease control and the create form are there, disabled
    me = c.expect(200, "GET", "/v1/whoami").json()["key"]
    ro = daemon.make_key(read_only=True, owner_id=me["id"])
    sign_in(drv, daemon, ro["key"])
    wait_for(drv, lambda d: row_state(d, a), "the list for the read-only key")
    by_css(drv, "#new summary")[0].click()
    assert not by_css(drv, "#new-submit")[0].is_enabled()
    assert not by_css(drv, "#new-image")[0].is_enabled()
    assert "read-only" in visible_text(drv, "#new-ro")
    drv.get(f"{base}/#/sandbox/{a}")
    wait_for(drv, lambda d: "running" in (visible_text(d, "#d-state") or ""), "the page")
    assert not by_css(drv, "#lease-set")[0].is_enabled()
    assert not by_css(drv, "#lease-min")[0].is_enabled()

    # the full key: the sandbox's network, env and metadata, as text
    sign_in(drv, daemon, daemon.key)
    wait_for(drv, lambda d: row_state(d, a), "the list")
    drv.get(f"{base}/#/sandbox/{a}")
    wait_for(drv, lambda d: by_css(d, 'tr[data-name="GREETING"]'), "the environment")
    assert [td.text for td in by_css(drv, 'tr[data-name="GREETING"] td')] == ["GREETING",
                                                                               HOSTILE]
    assert [td.text for td in by_css(drv, 'tr[data-name="note"] td')] == ["note", HOSTILE_META]
    assert [td.text for td in by_css(drv, 'tr[data-name="test"] td')] == ["test", "dashboard"]
    net = visible_text(drv, "#d-net")
    assert "Internet\noff (reaches nothing)" in net, net
    not_pwned(drv)

    # Extend lease: two hours from now
    lease = by_css(drv, "#lease-min")[0]
    lease.clear()
    lease.send_keys("120")
    asked = time.time()
    by_css(drv, "#lease-set")[0].click()
    wait_for(drv, lambda d: "now ends at" in (visible_text(d, "#lease-note") or ""),
             "the new lease")
    sb = c.get(a)
    ends = calendar.timegm(time.strptime(sb["lease_ends_at"], "%Y-%m-%dT%H:%M:%SZ"))
    assert sb["timeout_seconds"] == 7200 and asked + 7200 - 5 <= ends <= time.time() + 7201, sb
    wait_for(drv, lambda d: sb["lease_ends_at"] in visible_text(d, "#d-facts"),
             "the lease's end on the page")
    # a refusal in words: more than a day
    lease.clear()
    lease.send_keys("100000")
    by_css(drv, "#lease-set")[0].click()
    wait_for(drv, lambda d: "Lease not changed: timeout_seconds" in
             (visible_text(d, "#lease-error") or ""), "the lease refusal")
    assert c.get(a)["timeout_seconds"] == 7200
    shot(drv, "sandbox-settings")

    # Create sandbox: first a refusal in words (too little memory), then one made
    net_on = c.expect(200, "GET", "/v1/health").json()["network"]["enabled"]
    before = {s["id"] for s in c.expect(200, "GET", "/v1/sandboxes").json()["sandboxes"]}
    drv.get(f"{base}/#/sandboxes")
    wait_for(drv, lambda d: row_state(d, a), "the list")
    if not by_css(drv, "#new")[0].get_attribute("open"):
        by_css(drv, "#new summary")[0].click()
    fields = {"#new-cpus": "1", "#new-mem": "64", "#new-disk": "256", "#new-timeout": "10",
              "#new-allow": "pypi.org\n*.pythonhosted.org"}
    for css, value in fields.items():
        by_css(drv, css)[0].clear()
        by_css(drv, css)[0].send_keys(value)
    if net_on:
        by_css(drv, "#new-inet")[0].click()
    by_css(drv, "#new-submit")[0].click()
    wait_for(drv, lambda d: "Not created: memory_mib" in (visible_text(d, "#new-error") or ""),
             "the refusal in words")
    assert_accessible(drv, "create-form")
    shot(drv, "create-refused")
    by_css(drv, "#new-mem")[0].clear()
    by_css(drv, "#new-mem")[0].send_keys("256")
    if not net_on:  # an allow list needs the internet, which this daemon's sandboxes lack
        by_css(drv, "#new-allow")[0].clear()
    by_css(drv, "#new-submit")[0].click()
    made = None
    try:
        made = wait_for(drv, lambda d: [r.get_attribute("data-id") for r in by_css(d, "#sb-rows tr")
                                        if r.get_attribute("data-id") not in before],
                        "the new sandbox in the list", timeout=60)[0]
        assert visible_text(drv, "#new-error") == ""
        wait_for(drv, lambda d: visible_text(d, "#new-note") == f"Created {made}.", "the note")
        sb = c.get(made)
        assert (sb["image"], sb["cpus"], sb["memory_mib"], sb["disk_mib"],
                sb["timeout_seconds"]) == ("default", 1, 256, 256, 600), sb
        if net_on:
            assert sb["network"] == {"internet": True, "allow": ["pypi.org",
                                                                 "*.pythonhosted.org"]}, sb
        else:
            assert sb["network"] == {"internet": False}, sb
        shot(drv, "sandboxes-created")
        drv.get(f"{base}/#/sandbox/{made}")
        wait_for(drv, lambda d: "Internet" in (visible_text(d, "#d-net") or ""),
                 "its network policy")
        net = visible_text(drv, "#d-net")
        if net_on:
            assert "Internet\non" in net and \
                "Allowed hosts\npypi.org, *.pythonhosted.org" in net, net
        assert visible_text(drv, "#d-env-none") == "No variables."
    finally:
        for sid in {s["id"] for s in c.expect(200, "GET", "/v1/sandboxes").json()["sandboxes"]} - \
                before:
            c.request("DELETE", f"/v1/sandboxes/{sid}")


# ---- an auditor key: the Keys and Audit pages ----

@pytest.fixture(scope="module")
def auditor(daemon):
    k = daemon.make_key(auditor=True)
    yield k
    daemon.admin.request("POST", f"/v1/keys/{k['id']}/revoke")


def displayed(drv, css):
    els = by_css(drv, css)
    return bool(els) and els[0].is_displayed()


@pytest.mark.timeout(90)
def test_browser_keys_and_audit_pages(daemon, browser, two, auditor):
    drv = browser
    adm = daemon.admin
    # a key that is not an auditor: no Keys or Audit in the menu; the pages say why, ask nothing
    sign_in(drv, daemon, daemon.key)
    wait_for(drv, lambda d: row_state(d, two[0]).startswith("running"), "the list")
    assert not displayed(drv, 'nav a[href="#/keys"]') and not displayed(drv, 'nav a[href="#/audit"]')
    for page, box in (("keys", "#k-denied"), ("audit", "#a-denied")):
        drv.get(f"http://127.0.0.1:{daemon.port}/#/{page}")
        wait_for(drv, lambda d: "need an auditor key" in (visible_text(d, box) or ""),
                 f"the {page} page's message")
        assert not displayed(drv, f"#{page[0]}-table")
    shot(drv, "keys-not-auditor")

    # the auditor key: Keys and Audit in the menu, no Sandboxes; the Keys page first
    me = daemon.client.expect(200, "GET", "/v1/whoami").json()["key"]
    ro = daemon.make_key(read_only=True, owner_id=me["id"], daily_limit_micros=3_000_000)
    gone = daemon.make_key()
    adm.expect(200, "POST", f"/v1/keys/{gone['id']}/revoke")
    sign_in(drv, daemon, auditor["key"])
    wait_for(drv, lambda d: by_css(d, f'tr[data-key="{auditor["id"]}"]'), "the keys table")
    assert displayed(drv, 'nav a[href="#/keys"]') and displayed(drv, 'nav a[href="#/audit"]')
    assert not displayed(drv, 'nav a[href="#/sandboxes"]')
    assert "auditor" in visible_text(drv, "#who")

    def cells(kid):
        return [td.text for td in by_css(drv, f'tr[data-key="{kid}"] td')]
    assert cells(auditor["id"])[:4] == [auditor["id"], auditor["name"], "auditor", "itself"]
    row = cells(ro["id"])
    assert row[2] == "read-only" and row[3] == me["id"] and row[4] == "$3.00", row
    assert row[7] == "in use"
    assert cells(gone["id"])[7].startswith("20"), cells(gone["id"])  # its revocation time
    assert auditor["key"] not in drv.page_source and daemon.key not in drv.page_source
    # live: a key made now shows up without a reload
    drv.execute_script("window.__noReload = 7")
    fresh = daemon.make_key(metrics=True)
    wait_for(drv, lambda d: by_css(d, f'tr[data-key="{fresh["id"]}"]'), "a new key, live")
    assert cells(fresh["id"])[2] == "metrics"
    assert drv.execute_script("return window.__noReload") == 7
    shot(drv, "keys")

    # the audit trail: more than a page of entries, newest first, "Older entries" pages back
    for _ in range(55):  # revoking a revoked key changes nothing, but is recorded
        adm.expect(200, "POST", f"/v1/keys/{gone['id']}/revoke")
    by_css(drv, 'nav a[href="#/audit"]')[0].click()
    wait_for(drv, lambda d: len(by_css(d, "#a-rows tr")) == 50, "a page of audit entries")

    def seqs():
        return [int(tr.get_attribute("data-seq")) for tr in by_css(drv, "#a-rows tr")]
    first = seqs()
    assert first == sorted(first, reverse=True), first
    top = by_css(drv, "#a-rows tr")[0].text
    assert "POST" in top and "/v1/keys/{id}/revoke" in top and "admin" in top, top
    by_css(drv, "#a-older")[0].click()
    wait_for(drv, lambda d: len(by_css(d, "#a-rows tr")) > 50, "older entries")
    more = seqs()
    assert more[:50] == first and max(more[50:]) < min(first) and len(set(more)) == len(more)
    # live: a request made now is on top without a reload, named by its key's name
    c = daemon.client
    c.expect(200, "POST", f"/v1/sandboxes/{two[0]}/timeout", {"timeout_seconds": 3600})
    wait_for(drv, lambda d: "/v1/sandboxes/{id}/timeout" in by_css(d, "#a-rows tr")[0].text,
             "the new entry on top")
    top = by_css(drv, "#a-rows tr")[0].text
    assert me["name"] in top and two[0] in top and "200" in top, top
    assert seqs()[1:len(more) + 1] == more
    assert drv.execute_script("return window.__noReload") == 7
    shot(drv, "audit")
    # a full key's sandboxes page is not the auditor's: the daemon says so
    drv.get(f"http://127.0.0.1:{daemon.port}/#/sandboxes")
    wait_for(drv, lambda d: "auditor key" in (visible_text(d, "#status") or ""),
             "the refusal for the auditor key")


# ---- accessibility: run in the page, at phone and desktop widths ----

# Returns a list of problems on the page as shown: controls without a label, buttons and links
# without a name, images without alt, text below 4.5:1 contrast (WCAG 2 formula, from computed
# colours over the first opaque background behind it), and a page wider than the window.
A11Y_JS = r"""
const problems = [];
const desc = (e) => e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") +
  (e.className && typeof e.className === "string" ? "." + e.className.split(" ")[0] : "") +
  " '" + (e.textContent || "").trim().slice(0, 30) + "'";
const textOf = (ids) => (ids || "").split(/\s+/).filter(Boolean)
  .map((id) => document.getElementById(id)).map((n) => n ? n.textContent.trim() : "").join(" ").trim();
function labelled(e) {
  if ((e.getAttribute("aria-label") || "").trim()) return true;
  if (textOf(e.getAttribute("aria-labelledby"))) return true;
  if (e.id) {
    const l = document.querySelector(`label[for="${CSS.escape(e.id)}"]`);
    if (l && l.textContent.trim()) return true;
  }
  const wrap = e.closest("label");
  return !!(wrap && wrap.textContent.trim());
}
function named(e) {
  return !!((e.getAttribute("aria-label") || "").trim() || textOf(e.getAttribute("aria-labelledby")) ||
    e.textContent.trim() || (e.getAttribute("title") || "").trim() ||
    [...e.querySelectorAll("img[alt]")].some((i) => i.alt.trim()));
}
for (const e of document.querySelectorAll("input, select, textarea"))
  if (e.type !== "hidden" && !labelled(e)) problems.push("no label: " + desc(e));
for (const e of document.querySelectorAll("button, a[href], [role=button], [role=link]"))
  if (!named(e)) problems.push("no accessible name: " + desc(e));
for (const e of document.querySelectorAll("img"))
  if (!e.hasAttribute("alt")) problems.push("img without alt: " + desc(e));
for (const e of document.querySelectorAll("svg[role=img]"))
  if (!named(e)) problems.push("svg image without a name: " + desc(e));

function rgba(s) {
  const m = /^rgba?\(([^)]*)\)$/.exec(s || "");
  if (!m) return null;
  const p = m[1].split(/[\s,\/]+/).filter(Boolean).map(Number);
  return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
}
const over = (top, under) => [0, 1, 2].map((i) => top[i] * top[3] + under[i] * (1 - top[3])).concat(1);
function background(e) {
  const layers = [];
  for (let n = e; n && n.nodeType === 1; n = n.parentElement) {
    const c = rgba(getComputedStyle(n).backgroundColor);
    if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
  }
  let bg = [255, 255, 255, 1]; // the canvas
  for (let i = layers.length - 1; i >= 0; i--) bg = over(layers[i], bg);
  return bg;
}
const lum = (c) => {
  const f = (v) => { v /= 255; return v <= 0.04045 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
  return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]);
};
let checked = 0;
for (const e of document.querySelectorAll("body *")) {
  if (["SCRIPT", "STYLE", "title"].includes(e.tagName)) continue;
  const own = [...e.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
  if (!own || !e.getClientRects().length) continue;
  const cs = getComputedStyle(e);
  if (cs.visibility !== "visible" || parseFloat(cs.opacity) === 0) continue;
  const r = e.getBoundingClientRect();
  if (r.width <= 1 && r.height <= 1) continue; // visually hidden (.sr): read, not seen
  const isSvg = e instanceof SVGElement;
  let fg = rgba(isSvg ? cs.fill : cs.color);
  if (!fg) { problems.push("unreadable colour: " + desc(e)); continue; }
  const bg = background(e);
  fg = over(fg, bg);
  const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
  const ratio = (a + 0.05) / (b + 0.05);
  checked++;
  if (ratio < 4.5) problems.push(`contrast ${ratio.toFixed(2)}:1 < 4.5: ${desc(e)} ${cs.color} on rgb(${bg.slice(0, 3).map(Math.round)})`);
}
if (document.documentElement.scrollWidth > window.innerWidth + 1)
  problems.push(`page wider than the window: ${document.documentElement.scrollWidth} > ${window.innerWidth}`);
return [problems, checked];
"""

# What the checks must catch: each planted fault is one the page could have.
PLANTED = r"""
const box = document.createElement("div");
box.id = "a11y-planted";
box.innerHTML = '<input id="nolabel"><button type="button"></button><a href="#/x"></a>' +
  '<img src="/icon.svg"><p class="planted-grey">grey on white</p>' +
  '<div class="planted-wide">wide</div>';
document.getElementById("main").append(box);
box.querySelector(".planted-grey").style.color = "#999999";
box.querySelector(".planted-wide").style.width = "3000px";
"""


def assert_accessible(drv, page):
    problems, checked = drv.execute_script(A11Y_JS)
    if problems:
        shot(drv, f"a11y-failure-{page}")
    assert problems == [], (page, problems)
    assert checked >= 5, (page, checked)  # it did look at the page's text


@pytest.mark.timeout(120)
def test_browser_pages_pass_basic_accessibility_checks(daemon, browser, two, auditor):
    drv = browser
    a, _ = two
    base = f"http://127.0.0.1:{daemon.port}"
    daemon.client.write_file(a, "/workspace/a11y.txt", b"checked\n")
    # first, the checks catch what they look for (planted in the sign-in page, then gone)
    sign_in(drv, daemon, "wr_" + "z" * 52)
    wait_for(drv, lambda d: visible_text(d, "#signin-error"), "the wrong-key message")
    drv.execute_script(PLANTED)
    problems, _ = drv.execute_script(A11Y_JS)
    text = "\n".join(problems)
    for want in ("no label: input#nolabel", "no accessible name: button",
                 "no accessible name: a", "img without alt", "contrast 2.85:1 < 4.5",
                 "page wider than the window"):
        assert want in text, (want, problems)
    assert len(problems) == 6, problems
    drv.execute_script("document.getElementById('a11y-planted').remove()")
    try:
        # the sign-in page with its error showing, at both widths (one wrong key: each counts
        # against this address's guesses)
        for width, height, tag in ((1280, 1000, ""), (390, 844, "-phone")):
            drv.set_window_size(width, height)
            assert_accessible(drv, "signin" + tag)
            shot(drv, "signin" + tag)
        for width, height, tag in ((1280, 1000, ""), (390, 844, "-phone")):
            drv.set_window_size(width, height)
            sign_in(drv, daemon, daemon.key)
            wait_for(drv, lambda d: row_state(d, a).startswith("running") and
                     "MiB" in by_css(d, f'tr[data-id="{a}"] td')[8].text, "the list")
            assert_accessible(drv, "sandboxes" + tag)
            shot(drv, "sandboxes" + tag)

            drv.get(f"{base}/#/sandbox/{a}")
            wait_for(drv, lambda d: by_css(d, 'tr[data-name="a11y.txt"]') and by_css(d, "#e-rows tr") and
                     by_css(d, "#d-chart-cost svg") and by_css(d, "#d-chart-live svg"),
                     "the sandbox page")
            assert_accessible(drv, "sandbox" + tag)
            shot(drv, "sandbox" + tag)

            drv.get(f"{base}/#/usage")
            wait_for(drv, lambda d: by_css(d, "#u-chart svg rect.bar"), "the usage page")
            assert_accessible(drv, "usage" + tag)
            shot(drv, "usage" + tag)

            sign_in(drv, daemon, auditor["key"])
            wait_for(drv, lambda d: by_css(d, f'tr[data-key="{auditor["id"]}"]'), "the keys")
            assert_accessible(drv, "keys" + tag)
            shot(drv, "keys" + tag)
            drv.get(f"{base}/#/audit")
            wait_for(drv, lambda d: by_css(d, "#a-rows tr"), "the audit trail")
            assert_accessible(drv, "audit" + tag)
            shot(drv, "audit" + tag)
    finally:
        drv.set_window_size(1280, 1000)


@pytest.mark.timeout(60)
def test_browser_keyboard_alone_signs_in_and_opens_a_sandbox(daemon, browser, two):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    drv = browser
    a, _ = two

    def press(*keys):
        ActionChains(drv).send_keys(*keys).perform()  # to whatever has the focus

    def focused():
        return drv.execute_script(
            "const e = document.activeElement; return [e.tagName, e.id, e.getAttribute('href'),"
            " e.textContent.trim()]")

    drv.get(f"http://127.0.0.1:{daemon.port}/#/signin")
    drv.execute_script("sessionStorage.clear()")
    drv.get(f"http://127.0.0.1:{daemon.port}/#/signin")
    wait_for(drv, lambda d: displayed(d, "#key"), "the sign-in form")
    # from the top of the page: TAB until the key box has the focus
    drv.execute_script("document.activeElement.blur()")
    for _ in range(5):
        if focused()[1] == "key":
            break
        press(Keys.TAB)
    assert focused()[1] == "key", focused()
    press(daemon.key)
    press(Keys.TAB)
    assert focused()[0] == "BUTTON" and focused()[3] == "Sign in", focused()
    press(Keys.ENTER)
    wait_for(drv, lambda d: row_state(d, a).startswith("running"), "the sandboxes page")
    # and on by TAB to the sandbox's link, ENTER opens it
    target = f"#/sandbox/{a}"
    for _ in range(60):
        if focused()[2] == target:
            break
        press(Keys.TAB)
    assert focused()[2] == target, focused()
    press(Keys.ENTER)
    wait_for(drv, lambda d: visible_text(d, "#d-title") == a, "the sandbox's page")
