#!/usr/bin/env python3
"""tests/ui/run.py: the heatmap page (GET /ui) in a real browser, Debian's headless chromium.

Starts build/attnd (ATTND_BIN) on 127.0.0.1, a free port, with --keep-queries 1 and an API key,
drives a session with random x, and opens /ui?session=..&layer=..&head=..&key=.. twice: once
for the DOM (--dump-dom: the page writes the main canvas's place, cell size and rows into
data- attributes of #heatmap) and once for a screenshot. The screenshot's PNG is decoded here
(zlib and struct) and every cell of the main heatmap is compared with the page's colour map
applied to the API's own numbers (GET /v1/sessions/{id}/attention); the last row must be
framed in the highlight colour, and only it. Then: a wrong key shows the 401 message, an
unknown session the 404, a session advanced by one token shows the new row after a reload, and
a page left open (driven over the DevTools pipe) redraws with the next row by itself; a daemon
without --keep-queries shows the 409 message; on a sliding-window layer (gpt-oss's fixture) the
keys outside a row's window are drawn masked, and a long session whose ring dropped blocks
draws from its first recomputable row; a session on disk after a restart (--state-dir) is read
back and drawn. Standard library and numpy only; `make ui-test`.

--url BASE --key KEY tests an attnd that is already running instead (the 409 check is skipped).
The screenshot of the main check is left in --out (build/ui/screenshot.png).
"""
import argparse
import json
import os
import re
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib

import numpy as np

# The page's drawing rules (server/ui/index.html); the copy is the point: the test must fail
# when the page draws something else.
VIRIDIS = np.array([[68, 1, 84], [72, 36, 117], [65, 68, 135], [53, 95, 141], [42, 120, 142],
                    [33, 145, 140], [34, 168, 132], [68, 191, 112], [122, 209, 81],
                    [189, 223, 38], [253, 231, 37]], dtype=np.float64)
MASKED = np.array([232, 232, 232])
HIGHLIGHT = np.array([230, 0, 126])
TOLERANCE = 2  # per channel, out of 255: the map's rounding is the page's own, so 0 is expected
WINDOW = (1280, 1000)
KEY = "ui-test-key"
SESSION = "ui-test"
# The session's tokens: x is each word's random embedding (x3) plus a little noise, so that a
# word's later copies draw sharp attention and the picture has something to show (docs/ui.png).
LABELS = ("the cat sat on the mat and the dog sat on the cat , so the cat sat on the dog and the "
          "mat sat on the cat").split()


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)
    print("  ok  " + what)


# ---- the daemon and its API ---------------------------------------------------------------


class Daemon:
    """build/attnd on 127.0.0.1 with --port 0; the port comes from its `listening` log line."""

    def __init__(self, binary, log_path, args):
        self.log_path = log_path
        self.log = open(log_path, "wb")
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
        self.proc = subprocess.Popen([binary, "--host", "127.0.0.1", "--port", "0"] + args,
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 30
        self.port = None
        while self.port is None:
            if self.proc.poll() is not None or time.time() > deadline:
                raise Failure("attnd did not start; its log: " + self.tail())
            time.sleep(0.05)
            with open(log_path, "rb") as f:
                m = re.search(rb" listening .*port=(\d+)", f.read())
            self.port = int(m.group(1)) if m else None
        self.url = "http://127.0.0.1:%d" % self.port

    def tail(self):
        with open(self.log_path, "rb") as f:
            return f.read()[-2000:].decode("utf-8", "replace")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def call(base, path, body=None, key=None):
    """(status, JSON answer) of a GET, or of a POST when body is given; key None = KEY."""
    key = KEY if key is None else key
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data, headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def attend(base, layer, x):
    status, ans = call(base, "/v1/attend", {"session_id": SESSION, "layer": layer,
                                            "x": x.tolist()})
    if status != 200:
        raise Failure("attend: %d %s" % (status, ans))
    return ans


def attention(base, layer, head, kind="probs"):
    q = urllib.parse.urlencode({"layer": layer, "heads": head, "kind": kind})
    status, ans = call(base, "/v1/sessions/%s/attention?%s" % (SESSION, q))
    if status != 200:
        raise Failure("GET attention: %d %s" % (status, ans))
    return ans


# ---- chromium ------------------------------------------------------------------------------


def chromium(url, screenshot=None):
    """Loads url in headless chromium for 5 s of virtual time: the DOM as text, or a PNG."""
    exe = shutil.which("chromium")
    if exe is None:
        raise Failure("chromium is not installed: run `make ui-deps` (as root)")
    with tempfile.TemporaryDirectory(prefix="attnd-ui-") as profile:
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--force-device-scale-factor=1", "--force-color-profile=srgb",
               "--no-first-run", "--disable-extensions", "--user-data-dir=" + profile,
               "--window-size=%d,%d" % WINDOW, "--virtual-time-budget=5000"]
        cmd += ["--screenshot=" + screenshot] if screenshot else ["--dump-dom"]
        r = subprocess.run(cmd + [url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=120)
    if r.returncode != 0 or (screenshot and not os.path.exists(screenshot)):
        raise Failure("chromium failed (%d): %s" % (r.returncode, r.stderr[-2000:].decode()))
    return r.stdout.decode("utf-8", "replace")


class Browser:
    """Headless chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe:
    JSON messages ended by a NUL, we write fd 3 and read fd 4), to watch a page that stays
    open while the session advances."""

    def __init__(self):
        exe = shutil.which("chromium")
        if exe is None:
            raise Failure("chromium is not installed: run `make ui-deps` (as root)")
        self.profile = tempfile.TemporaryDirectory(prefix="attnd-ui-")
        to_r, self.w = os.pipe()
        self.r, from_w = os.pipe()
        a, b = os.dup(to_r), os.dup(from_w)  # above 4, so that placing them cannot clobber

        def place():
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             "--no-first-run", "--disable-extensions", "--user-data-dir=" + self.profile.name,
             "--window-size=%d,%d" % WINDOW, "about:blank"],
            pass_fds=(3, 4, a, b), preexec_fn=place, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        for fd in (to_r, from_w, a, b):
            os.close(fd)
        self.buf, self.next_id, self.session = b"", 0, None
        pages = [t for t in self.send("Target.getTargets")["targetInfos"] if t["type"] == "page"]
        self.session = self.send("Target.attachToTarget", targetId=pages[0]["targetId"],
                                 flatten=True)["sessionId"]

    def send(self, method, **params):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if self.session is not None:
            msg["sessionId"] = self.session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + 30
        while True:
            while b"\0" in self.buf:
                text, self.buf = self.buf.split(b"\0", 1)
                answer = json.loads(text)
                if answer.get("id") == self.next_id:
                    if "error" in answer:
                        raise Failure("%s: %s" % (method, answer["error"]))
                    return answer["result"]
            if time.time() > deadline or self.proc.poll() is not None:
                raise Failure("chromium did not answer " + method)
            if select.select([self.r], [], [], 0.5)[0]:
                self.buf += os.read(self.r, 1 << 20)

    def eval(self, expression):
        return self.send("Runtime.evaluate", expression=expression,
                         returnByValue=True)["result"].get("value")

    def wait_for(self, expression, want, seconds, what):
        deadline, got = time.time() + seconds, None
        while time.time() < deadline:
            got = self.eval(expression)
            if got == want:
                return
            time.sleep(0.1)
        raise Failure("%s: %r after %d s, not %r" % (what, got, seconds, want))

    def close(self):
        try:
            self.send("Browser.close")
            self.proc.wait(timeout=20)
        except (Failure, OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        os.close(self.w)
        os.close(self.r)
        self.profile.cleanup()


def page_url(base, layer, head, key=None, session=SESSION, extra=None):
    q = {"session": session, "layer": layer, "head": head, "key": KEY if key is None else key}
    q.update(extra or {})
    return base + "/ui?" + urllib.parse.urlencode(q)


def tag_attrs(dom, pattern):
    m = re.search(pattern, dom)
    if m is None:
        raise Failure("no %s in the page's DOM" % pattern)
    return {k: v for k, v in re.findall(r'([a-z0-9-]+)="([^"]*)"', m.group(0))}


def read_png(path):
    """The PNG's pixels, (height, width, 3) uint8: 8-bit RGB or RGBA, not interlaced."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise Failure(path + " is not a PNG")
    pos, idat, hdr = 8, [], None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat.append(chunk)
        elif kind == b"IEND":
            break
    width, height, depth, color, _, _, interlace = hdr
    if depth != 8 or color not in (2, 6) or interlace != 0:
        raise Failure("unexpected PNG format %s" % (hdr,))
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    out = np.zeros((height, stride), np.uint8)
    prev = np.zeros(stride, np.int64)
    for y in range(height):
        start = y * (stride + 1)
        kind = raw[start]
        line = np.frombuffer(raw, np.uint8, stride, start + 1).astype(np.int64)
        if kind == 0:  # None
            cur = line
        elif kind == 1:  # Sub: a running sum per channel
            cur = np.cumsum(line.reshape(-1, bpp), axis=0).reshape(-1) & 255
        elif kind == 2:  # Up
            cur = (line + prev) & 255
        else:  # Average (3) and Paeth (4) depend on the byte to the left: a plain loop
            cur, b = line.tolist(), prev.tolist()
            for x in range(stride):
                a = cur[x - bpp] if x >= bpp else 0
                if kind == 3:
                    cur[x] = (cur[x] + ((a + b[x]) >> 1)) & 255
                else:
                    c = b[x - bpp] if x >= bpp else 0
                    p = a + b[x] - c
                    pa, pb, pc = abs(p - a), abs(p - b[x]), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else b[x] if pb <= pc else c
                    cur[x] = (cur[x] + pred) & 255
            cur = np.array(cur, np.int64)
        out[y] = cur
        prev = cur
    return out.reshape(height, width, bpp)[:, :, :3]


# ---- what the page must draw ---------------------------------------------------------------


def cmap(t):
    """The page's colour map: t in [0, 1] (array) -> RGB, interpolated and rounded half up."""
    t = np.clip(np.nan_to_num(t, nan=0.0), 0.0, 1.0)
    x = t * 10
    i = np.minimum(np.floor(x), 9).astype(int)
    f = (x - i)[..., None]
    return np.floor(VIRIDIS[i] + (VIRIDIS[i + 1] - VIRIDIS[i]) * f + 0.5).astype(int)


def expected_colours(att, scale="row", window=0):
    """(rows, keys, 3): probs: key > row masked, and on a sliding layer a key `window` or more
    before the row, each row over its max ("row") or 1 ("unit"); scores: null masked, each row
    from its min to its max."""
    rows = np.array(att["rows"])
    k0, k1 = att["keys"]
    w = att["scores" if att["kind"] == "scores" else "weights"][0]
    keys = np.arange(k0, k1)
    if att["kind"] == "scores":
        mask = np.array([[v is None for v in r] for r in w])
        v = np.array([[0.0 if x is None else x for x in r] for r in w])
        lo = np.where(mask, np.inf, v).min(axis=1, keepdims=True)
        hi = np.where(mask, -np.inf, v).max(axis=1, keepdims=True)
        span = hi - lo
        t = np.where(span > 0, (v - lo) / np.where(span > 0, span, 1), 1.0)
    else:
        v = np.array(w, dtype=np.float64)
        mask = keys[None, :] > rows[:, None]
        if window:
            mask |= keys[None, :] <= rows[:, None] - window
        top = np.where(mask, 0, v).max(axis=1, keepdims=True)
        den = np.where(top > 0, top, 1) if scale == "row" else 1.0
        t = v / den
    out = cmap(t)
    out[mask] = MASKED
    return out


def cell_grid(img, a, n_rows, n_keys):
    """The screenshot's pixels of every cell, (rows, keys, cell, cell, 3), from the layout the
    page reports; the last row sits `gap` pixels lower."""
    left, top = float(a["data-left"]), float(a["data-top"])
    check(left == int(left) and top == int(top),
          "the heatmap canvas sits on whole pixels (%s, %s)" % (left, top))
    x0, y0 = int(left) + int(a["data-ox"]), int(top) + int(a["data-oy"])
    c, gap = int(a["data-cell"]), int(a["data-gap"])
    check(c >= 4, "cells are %d pixels, enough to compare" % c)
    if y0 + n_rows * c + gap + 4 > img.shape[0] or x0 + n_keys * c + 4 > img.shape[1]:
        raise Failure("the heatmap does not fit in the %dx%d screenshot" % WINDOW)
    cells = np.empty((n_rows, n_keys, c, c, 3), np.int64)
    for i in range(n_rows):
        y = y0 + i * c + (gap if i == n_rows - 1 else 0)
        block = img[y:y + c, x0:x0 + n_keys * c].astype(np.int64)
        cells[i] = block.reshape(c, n_keys, c, 3).transpose(1, 0, 2, 3)
    return cells, x0, y0, c, gap


def n_bad_cells(cells, want):
    """Cells with any pixel off their expected colour by more than TOLERANCE."""
    diff = np.abs(cells - want[:, :, None, None, :]).max(axis=(2, 3, 4))
    return int((diff > TOLERANCE).sum()), int(diff.max())


def check_heatmap(base, out_dir, name, layer, head, kind="probs", scale="row", labels=False,
                  window=0):
    """Loads the page for (layer, head), and checks its DOM, every drawn cell and the outline
    of the last row against the API's numbers. Returns the screenshot's path."""
    print("%s: layer %d, head %d, %s, scale %s" % (name, layer, head, kind, scale))
    att = attention(base, layer, head, kind)
    extra = {}
    if kind != "probs":
        extra["kind"] = kind
    if scale != "row":
        extra["scale"] = scale
    if labels:
        extra["labels"] = " ".join(LABELS)
    url = page_url(base, layer, head, extra=extra)
    dom = chromium(url)
    body = tag_attrs(dom, r"<body[^>]*>")
    check(body.get("data-state") == "ready", "the page drew (data-state %r, status %r)" % (
        body.get("data-state"), re.sub(r"<[^>]*>", "", re.search(
            r'<div id="status"[^>]*>.*?</div>', dom, re.S).group(0))))
    a = tag_attrs(dom, r'<canvas id="heatmap"[^>]*>')
    n_rows, n_keys = len(att["rows"]), att["keys"][1] - att["keys"][0]
    check(a["data-layer"] == str(layer) and a["data-head"] == str(head) and
          a["data-kind"] == kind, "it shows layer %d, head %d, %s" % (layer, head, kind))
    check(a["data-rows"] == ",".join(map(str, att["rows"])) and
          a["data-n-keys"] == str(n_keys) and a["data-k0"] == str(att["keys"][0]) and
          a["data-n-tokens"] == str(att["n_tokens"]),
          "its rows and keys are the API's (%d x %d of %d tokens)" % (
              n_rows, n_keys, att["n_tokens"]))
    png = os.path.join(out_dir, name + ".png")
    chromium(url, screenshot=png)
    img = read_png(png)
    check(img.shape[:2] == (WINDOW[1], WINDOW[0]), "the screenshot is %dx%d" % WINDOW)
    cells, x0, y0, c, gap = cell_grid(img, a, n_rows, n_keys)
    want = expected_colours(att, scale, window)
    bad, worst = n_bad_cells(cells, want)
    check(bad == 0, "all %d cells have the colour map's colour of the API's value "
          "(%d off, worst channel off by %d)" % (n_rows * n_keys, bad, worst))
    if n_rows == n_keys and n_rows > 2:
        # The comparison must be able to fail: the transposed drawing is far off.
        bad_t, _ = n_bad_cells(cells, want.transpose(1, 0, 2))
        check(bad_t > n_rows * n_keys // 4,
              "the transpose would fail the comparison (%d cells off)" % bad_t)
    # The outline: 2 pixels, 1 pixel clear of the last row, on all four sides.
    is_last = att["rows"][-1] == att["n_tokens"] - 1
    check(a["data-last"] == ("1" if is_last else "0") and gap == (4 if is_last else 0),
          "the last decode step is marked as such")
    if is_last:
        yl = y0 + (n_rows - 1) * c + gap
        w = n_keys * c
        frame = [img[yl - 3:yl - 1, x0 - 3:x0 + w + 3], img[yl + c + 1:yl + c + 3,
                 x0 - 3:x0 + w + 3], img[yl - 3:yl + c + 3, x0 - 3:x0 - 1],
                 img[yl - 3:yl + c + 3, x0 + w + 1:x0 + w + 3]]
        off = max(int(np.abs(f.astype(int) - HIGHLIGHT).max()) for f in frame)
        check(off <= TOLERANCE, "the last row (token %d) is framed in the highlight colour" %
              att["rows"][-1])
        others = img[y0:yl - 4, x0 - 3:x0 + w + 3].astype(int)
        n_hl = int((np.abs(others - HIGHLIGHT).max(axis=2) <= TOLERANCE).sum())
        check(n_hl == 0, "no other row is framed")
    return png


def check_follows(base, layer, head, x):
    """Keeps the page open while the session advances: it must redraw with the new row by
    itself, through its polling, within a few seconds."""
    print("the open page follows the session")
    att = attention(base, layer, head)
    n = att["n_tokens"]
    state = ("[document.body.dataset.state, document.getElementById('heatmap').dataset.nTokens,"
             " document.getElementById('heatmap').dataset.rows.split(',').pop()].join(' ')")
    browser = Browser()
    try:
        browser.send("Page.navigate", url=page_url(base, layer, head))
        browser.wait_for(state, "ready %d %d" % (n, n - 1), 20, "the page drew")
        check(True, "the page shows %d tokens" % n)
        attend(base, layer, x)
        browser.wait_for(state, "ready %d %d" % (n + 1, n), 10, "the page followed")
        check(True, "after one more token it shows %d, the new row %d, without a reload" % (
            n + 1, n))
    finally:
        browser.close()


def check_sliding(base, out_dir):
    """A sliding-window layer (gpt-oss's fixture: window 3, sinks; 16-token KV blocks): the keys its
    window hides are drawn masked, as the scores' nulls are, not as probability 0; and a session
    longer than the page's 256 default rows whose ring has dropped blocks still draws, from the
    first row the cache can recompute."""
    layer, window = 0, 3
    rng = np.random.default_rng(2)
    hidden = call(base, "/v1/model")[1]["hidden_size"]
    attend(base, layer, np.round(rng.standard_normal((12, hidden)), 4))
    check_heatmap(base, out_dir, "sliding", layer, 1, window=window)
    check_heatmap(base, out_dir, "sliding-scores", layer, 1, kind="scores")
    print("a long session on a sliding layer")
    attend(base, layer, np.round(rng.standard_normal((300, hidden)), 4))
    att = attention(base, layer, 1)
    check(att["first_row"] > 312 - 256, "the ring dropped rows the default would show "
          "(first_row %d)" % att["first_row"])
    dom = chromium(page_url(base, layer, 1))
    body = tag_attrs(dom, r"<body[^>]*>")
    status = re.search(r'<div id="status"[^>]*>(.*?)</div>', dom, re.S)
    check(body.get("data-state") == "ready", "the page drew (data-state %r, status %r)" % (
        body.get("data-state"), status.group(1) if status else ""))
    a = tag_attrs(dom, r'<canvas id="heatmap"[^>]*>')
    check(a["data-rows"] == ",".join(map(str, att["rows"])),
          "its rows are the API's recomputable ones (%d.. of %d)" % (
              att["first_row"], att["n_tokens"]))


def check_on_disk(binary, out_dir):
    """A session on disk (--state-dir, written at SIGTERM and found again by the next start)
    lists no layers until it is read back: the page must read it back and draw it, not say
    that it has no tokens."""
    print("a session on disk")
    state = tempfile.mkdtemp(prefix="attnd-ui-state-")
    args = ["--preset", "tiny", "--keep-queries", "1", "--api-key", KEY, "--state-dir", state]
    daemons = []
    try:
        d = Daemon(binary, os.path.join(out_dir, "attnd-disk-1.log"), args)
        daemons.append(d)
        attend(d.url, 0, np.round(np.random.default_rng(3).standard_normal((6, 64)), 4))
        d.stop()
        d = Daemon(binary, os.path.join(out_dir, "attnd-disk-2.log"), args)
        daemons.append(d)
        status, info = call(d.url, "/v1/sessions/" + SESSION)
        check(status == 200 and info["location"] == "disk" and info["layers"] == [],
              "the restarted daemon has the session on disk, its layers not listed")
        dom = chromium(page_url(d.url, 0, 0))
        body = tag_attrs(dom, r"<body[^>]*>")
        st = re.search(r'<div id="status"[^>]*>(.*?)</div>', dom, re.S)
        check(body.get("data-state") == "ready", "the page drew (data-state %r, status %r)" % (
            body.get("data-state"), st.group(1) if st else ""))
        a = tag_attrs(dom, r'<canvas id="heatmap"[^>]*>')
        check(a["data-n-tokens"] == "6" and a["data-rows"] == "0,1,2,3,4,5",
              "it shows the session's 6 tokens")
    finally:
        for d in daemons:
            d.stop()
        shutil.rmtree(state, ignore_errors=True)


def check_message(base, name, code, words, **kw):
    """Loads the page and checks that it shows the error `code` with the given words."""
    print(name)
    dom = chromium(page_url(base, **kw))
    body = tag_attrs(dom, r"<body[^>]*>")
    status = re.search(r'<div id="status"[^>]*>(.*?)</div>', dom, re.S)
    text = status.group(1) if status else ""
    check(body.get("data-state") == "error" and body.get("data-error-code") == code,
          "the page is in error %s (%r)" % (code, body.get("data-error-code")))
    for w in words:
        check(w in text, "its message says %r: %s" % (w, text))


# ---- the run -------------------------------------------------------------------------------


def run(args):
    os.makedirs(args.out, exist_ok=True)
    daemons = []
    try:
        if args.url:
            base = args.url.rstrip("/")
            globals()["KEY"] = args.key
        else:
            d = Daemon(args.attnd, os.path.join(args.out, "attnd.log"),
                       ["--keep-queries", "1", "--api-key", KEY])
            daemons.append(d)
            base = d.url
        status, model = call(base, "/v1/model")
        check(status == 200, "GET /v1/model")
        hidden, n_heads = model["hidden_size"], model["num_attention_heads"]
        rng = np.random.default_rng(1)
        embed = {w: 3 * rng.standard_normal(hidden) for w in sorted(set(LABELS))}
        words = iter(LABELS)

        def x(t):
            rows = [embed[next(words)] + 0.3 * rng.standard_normal(hidden) for _ in range(t)]
            return np.round(np.array(rows), 4)

        # Layer 1 holds 20 tokens of prefill and 3 decode steps; layer 0 only 5, so a page
        # that ignored ?layer= would show the wrong length.
        attend(base, 0, np.round(rng.standard_normal((5, hidden)), 4))
        attend(base, 1, x(20))
        for _ in range(3):
            attend(base, 1, x(1))
        head = min(2, n_heads - 1)
        shot = check_heatmap(base, args.out, "main", 1, head, labels=True)
        shutil.copyfile(shot, os.path.join(args.out, "screenshot.png"))
        check_heatmap(base, args.out, "unit", 1, n_heads - 1, scale="unit")
        check_heatmap(base, args.out, "scores", 1, 0, kind="scores")
        check_message(base, "a wrong key", "unauthorized", ["401", "API key"], layer=1,
                      head=head, key="not-the-key")
        check_message(base, "an unknown session", "session_not_found", ["404", "no-such"],
                      layer=1, head=head, session="no-such")
        attend(base, 1, x(1))
        check_heatmap(base, args.out, "advanced", 1, head)
        check_follows(base, 1, head, x(1))
        if not args.url:
            d2 = Daemon(args.attnd, os.path.join(args.out, "attnd-no-queries.log"),
                        ["--preset", "tiny"])
            daemons.append(d2)
            call(d2.url, "/v1/attend", {"session_id": SESSION, "x": [[0.5] * 64] * 3})
            check_message(d2.url, "a daemon without --keep-queries", "queries_not_kept",
                          ["409", "--keep-queries"], layer=0, head=0)
            gpt_oss = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                                  "hf_gpt_oss_bf16")
            d3 = Daemon(args.attnd, os.path.join(args.out, "attnd-sliding.log"),
                        ["--model", gpt_oss, "--keep-queries", "1", "--kv-block-tokens", "16",
                         "--api-key", KEY])
            daemons.append(d3)
            check_sliding(d3.url, args.out)
            check_on_disk(args.attnd, args.out)
    finally:
        for d in daemons:
            d.stop()
    print("ui-test ok: screenshot in " + os.path.join(args.out, "screenshot.png"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--attnd", default=os.environ.get("ATTND_BIN", "build/attnd"))
    ap.add_argument("--out", default="build/ui", help="where screenshots and logs go")
    ap.add_argument("--url", help="test this running attnd instead of starting one")
    ap.add_argument("--key", default="", help="its API key, with --url")
    args = ap.parse_args()
    try:
        run(args)
    except (Failure, OSError, subprocess.SubprocessError) as e:
        print("ui-test FAILED: %s" % e)
        sys.exit(1)


if __name__ == "__main__":
    main()
