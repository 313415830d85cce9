"""Headless Chromium driven over its DevTools pipe (``--remote-debugging-pipe``), standard library only.

Chromium reads DevTools commands from file descriptor 3 and writes replies and events to 4, each a JSON
message ended by a NUL byte; :class:`Browser` speaks that, so a test can open a page, type into it and
read the DOM without a websocket library. One page (target) per browser, attached with a flat session.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

__all__ = ["Browser"]


class Browser:
    """``with Browser(chromium, profile_dir) as b: b.open(url); b.type("word"); b.wait_for(js)``."""

    def __init__(self, chromium: str, profile: Path, width: int = 1280, height: int = 900) -> None:
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        # the child's fds 3 and 4 must be the pipe ends: moved there in the child only, by way of two high
        # numbers (a pipe end may itself be 3 or 4); subprocess keeps them open since pass_fds names them
        def _fds() -> None:
            os.dup2(to_chrome_r, 100)
            os.dup2(from_chrome_w, 101)
            os.dup2(100, 3)
            os.dup2(101, 4)

        self._proc = subprocess.Popen(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-dev-shm-usage",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                "--hide-scrollbars",
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                f"--window-size={width},{height}",
                f"--user-data-dir={profile}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(3, 4),
            preexec_fn=_fds,
            env={**os.environ, "HOME": str(profile)},
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._id = 0
        self.session: str | None = None

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        for fd in (self._to_chrome, self._from_chrome):
            try:
                os.close(fd)
            except OSError:
                pass

    def _read(self) -> dict:
        while b"\0" not in self._buf:
            chunk = os.read(self._from_chrome, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method: str, session: bool = True, **params) -> dict:
        """One DevTools command; its result (events that arrive meanwhile are dropped)."""
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def open(self, url: str) -> None:
        """A new page at ``url``, attached (its load is waited for by :meth:`wait_for`)."""
        target = self.send("Target.createTarget", session=False, url=url)["targetId"]
        self.session = self.send("Target.attachToTarget", session=False, targetId=target, flatten=True)["sessionId"]

    def js(self, expression: str):
        """The value of a JavaScript expression in the page."""
        r = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return r.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 60.0):
        """Poll ``expression`` until it is truthy; its last value (falsy on timeout)."""
        end = time.monotonic() + timeout
        value = None
        while time.monotonic() < end:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.25)
        return value

    def type(self, text: str) -> None:
        """Key presses into the focused element, one character at a time (keydown with text, then keyup)."""
        for ch in text:
            self.send("Input.dispatchKeyEvent", type="keyDown", text=ch, key=ch, unmodifiedText=ch)
            self.send("Input.dispatchKeyEvent", type="keyUp", key=ch)

    def screenshot(self, path: Path, width: int = 1280, height: int = 900) -> None:
        """A PNG of the page's viewport at ``width`` x ``height`` CSS pixels."""
        import base64

        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"]))
