"""The web dashboard in Firefox (issue 13, point 2: "works in current Chromium and Firefox, at
phone and desktop widths"). test_dashboard.py covers the page in depth in Chromium; this runs
the user's main path again in Debian's firefox-esr, headless, at a phone width and a desktop
width, against the session's daemon with real sandboxes: a wrong key refused, sign-in with a
key, the sandboxes page listing a sandbox made through the API, a stop made through the API
showing on the page without a reload, the sandbox's page with its file in the file browser and
a download of the exact bytes. A screenshot of each page goes to build/test-artifacts/.

Firefox is driven over WebDriver BiDi, which it speaks itself (tests/e2e/bidi.py): Debian has
no geckodriver, and nothing but Debian and PyPI packages may be installed. One browser for the
module, killed by its PID and its profile removed at the end.
"""

import os
import time

import pytest

import bidi
from test_dashboard import ARTIFACTS, WAIT

WIDTHS = {"phone": (390, 844), "desktop": (1280, 900)}


@pytest.fixture(scope="module")
def firefox():
    if not os.access(bidi.FIREFOX, os.X_OK):
        pytest.fail(f"{bidi.FIREFOX} is needed "
                    "(scripts/setup.sh --tests installs Debian's firefox-esr)")
    os.makedirs(ARTIFACTS, exist_ok=True)
    with bidi.Firefox() as b:
        yield b


def wait_for(b, function, what, *args, timeout=WAIT):
    """Polls a JavaScript function in the page until it returns something true; its value. A
    call that fails while the page navigates counts as not yet."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = b.js(function, *args)
            if last:
                return last
        except bidi.BiDiError as e:
            last = e
        time.sleep(0.1)
    b.screenshot(os.path.join(ARTIFACTS, "dashboard-firefox-failure.png"))
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


# What a user sees: an element's rendered text, or null when there is none or it is hidden.
SHOWN = "(css) => { const e = document.querySelector(css); " \
        "return e && e.checkVisibility() ? e.innerText : null; }"
STATE = "(id) => { const c = document.querySelector(" \
        "`tr[data-id=\"${CSS.escape(id)}\"] td[class^=\"state-\"]`); " \
        "return c ? c.textContent : ''; }"

# How many lines each cell of sandbox id's row takes: its content's height over its line height
# (a cell of buttons: how many rows of buttons).
LINES = r"""(id) => [...document.querySelector(`tr[data-id="${CSS.escape(id)}"]`).cells].map((td) => {
  const buttons = [...td.querySelectorAll("button")];
  if (buttons.length)
    return new Set(buttons.map((b) => Math.round(b.getBoundingClientRect().top))).size;
  const r = document.createRange();
  r.selectNodeContents(td);
  return Math.round(r.getBoundingClientRect().height / parseFloat(getComputedStyle(td).lineHeight));
})"""


def sign_in(b, daemon, key):
    """Types key into a fresh sign-in page (nothing saved in the tab) and presses Enter."""
    b.go(f"http://127.0.0.1:{daemon.port}/#/signin")
    b.js("() => sessionStorage.clear()")
    b.go("about:blank")  # a real load, not a same-page fragment change
    b.go(f"http://127.0.0.1:{daemon.port}/#/signin")
    wait_for(b, "() => document.querySelector('#key')?.checkVisibility()", "the sign-in form")
    b.click("#key")
    assert b.js("() => document.activeElement.id") == "key"
    b.type(key + bidi.ENTER)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("width", list(WIDTHS))
def test_firefox_sign_in_list_live_stop_and_download(daemon, firefox, sandbox, make_sandbox,
                                                     width):
    b = firefox
    c = daemon.client
    a = sandbox
    other = make_sandbox(memory_mib=512)["id"]  # stopped through the API below
    b.viewport(*WIDTHS[width])
    assert b.js("() => window.innerWidth") == WIDTHS[width][0]

    def shot(page):
        b.screenshot(os.path.join(ARTIFACTS, f"dashboard-firefox-{width}-{page}.png"))

    # a wrong key: a clear error, still on the sign-in page, nothing kept
    sign_in(b, daemon, "wr_not_a_real_key")
    # (429's message if earlier tests of the session, all from 127.0.0.1, used up its guesses)
    wait_for(b, f"() => {{ const t = ({SHOWN})('#signin-error') || ''; return "
             "t.includes('not accepted') || t.includes('Too many wrong keys'); }",
             "the wrong-key message")
    assert b.js("() => sessionStorage.length") == 0
    shot("signin-wrong-key")

    # the real key: both sandboxes listed as running, the key only in session storage
    sign_in(b, daemon, daemon.key)
    wait_for(b, f"(a, o) => ({STATE})(a).startsWith('running') && "
             f"({STATE})(o).startsWith('running')", "both sandboxes listed as running",
             a, other)
    assert b.js("() => sessionStorage.getItem('withruntime.key')") == daemon.key
    assert daemon.key not in b.js("() => location.href")
    assert b.js("() => document.cookie") == ""
    row = b.js("(id) => document.querySelector(`tr[data-id=\"${id}\"]`).innerText", a)
    assert "1024 MiB" in row and "default" in row and "$" in row, row
    # the page itself never scrolls sideways (wide tables scroll in their own box)
    assert b.js("() => document.documentElement.scrollWidth <= window.innerWidth + 1")
    if width == "desktop":  # and there, every cell of a row but state and image is one line
        lines = b.js(LINES, a)
        assert lines[0] == 1 and all(n <= 1 for i, n in enumerate(lines) if i not in (1, 2)), \
            lines
    shot("sandboxes")

    # a stop made through the API shows on the open page, in place, without a reload
    b.js("() => { window.__noReload = 42; }")
    assert c.expect(200, "POST", f"/v1/sandboxes/{other}/stop").json()["state"] == "stopped"
    wait_for(b, f"(o) => ({STATE})(o).startsWith('stopped')", "the stopped state on the page",
             other, timeout=60)
    assert b.js("() => window.__noReload") == 42
    shot("sandboxes-stopped")

    # one sandbox: the file in the file browser, and a download of its exact bytes
    name = f"report-{width}.bin"
    payload = bytes(range(256)) * 3 + f"firefox {width}\n".encode()
    c.write_file(a, f"/workspace/{name}", payload)
    b.click(f'tr[data-id="{a}"] a')
    wait_for(b, "(n) => document.querySelector(`#f-rows tr[data-name=\"${n}\"]`)",
             "the file in the browser", name)
    wait_for(b, f"() => (({SHOWN})('#d-state') || '').includes('running')", "the state")
    b.click(f'#f-rows tr[data-name="{name}"] button[data-file-action="download"]')
    target = os.path.join(b.downloads, name)
    deadline = time.monotonic() + WAIT
    while not (os.path.exists(target) and os.path.getsize(target) == len(payload)):
        assert time.monotonic() < deadline, f"no download of {name}: {os.listdir(b.downloads)}"
        time.sleep(0.1)
    with open(target, "rb") as f:
        assert f.read() == payload

    # a background command's output, shown as text
    cmd = c.exec(a, f"printf '<b>%s</b>\\n' {width}", background=True, expect=201)["id"]
    wait_for(b, "(id) => document.querySelector(`button[data-cmd-output=\"${id}\"]`)",
             "the command's Output button", cmd)
    b.click(f'button[data-cmd-output="{cmd}"]')
    wait_for(b, f"() => (({SHOWN})('#o-state') || '').includes('Exited with code 0')",
             "the command's end in the output panel")
    assert b.js("() => document.getElementById('o-stdout').textContent") == f"<b>{width}</b>\n"
    assert b.js("() => document.querySelectorAll('#o-panel b').length") == 0
    assert b.js("() => document.documentElement.scrollWidth <= window.innerWidth + 1")
    shot("sandbox")
