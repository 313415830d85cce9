"""``lsbench ui`` in a real browser: MLflow's UI over a store that a real ``lsbench run`` filled.

A tiny study (two trials: one finishes, one is forced to diverge) runs through the CLI; ``lsbench
ui`` serves its store; headless Chromium opens the pages a researcher opens and the test reads
what they show once the React app has rendered them:

- the experiments list names the study's experiment;
- the runs table ``lsbench ui`` links to shows each trial, in the row that holds its
  ``lsbench.status`` (the view groups by that tag);
- one trial's "Model metrics" tab draws charts with lines for its logged metrics;
- one trial's plot artifact (``plots/loss.png``) is shown as a decoded image of the file's size.

The browser is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: JSON
messages ending in NUL on file descriptors 3 and 4), so no client library is needed; each page is
polled until what it must show is there (or a generous deadline passes: the server and the app are
slow on a loaded machine), not read after a fixed wait. Skipped where Chromium is absent.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import CHROMIUM, NO_CHROMIUM, lsbench, study_yaml

pytestmark = [pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)]

STUDY = "uicheck"
FINISHED, DIVERGED = "loss scale (128)", "blow-up"
#: seconds: the MLflow server takes ~25 s to start on a loaded 2-core machine, the app as long to render
SERVER_START_S, PAGE_S = 180, 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _above(fd: int, low: int) -> int:
    """``fd`` moved to a number >= ``low`` (the original closed), not inherited by children."""
    import fcntl

    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, low)
    os.close(fd)
    return moved


class _Browser:
    """Headless Chromium with one page, driven over the DevTools protocol on a pipe."""

    def __init__(self, profile: Path) -> None:
        to_browser_r, self._w = os.pipe()
        self._r, from_browser_w = os.pipe()
        # Chromium reads commands on fd 3 and writes replies on fd 4. A small Python launcher puts the pipe's
        # ends there and execs the browser (no preexec_fn: unsafe beside the test's reader thread); the ends
        # are moved above 9 first, so that putting one on 3 never overwrites the other
        to_browser_r, from_browser_w = (_above(fd, 10) for fd in (to_browser_r, from_browser_w))
        launcher = (
            "import os, sys; r, w = int(sys.argv[1]), int(sys.argv[2]); os.dup2(r, 3); os.dup2(w, 4); "
            "os.close(r); os.close(w); os.execv(sys.argv[3], sys.argv[3:])"
        )
        cmd = [
            sys.executable,
            "-c",
            launcher,
            str(to_browser_r),
            str(from_browser_w),
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--mute-audio",
            "--window-size=1600,1000",
            f"--user-data-dir={profile}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        self.proc = subprocess.Popen(
            cmd,
            pass_fds=(to_browser_r, from_browser_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "HOME": str(profile)},
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buf, self._id = b"", 0
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        while True:  # events arrive between the replies: skipped
            while b"\0" not in self._buf:
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"chromium closed the pipe (exit {self.proc.poll()})")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def evaluate(self, expression: str):
        reply = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=self.session)
        return reply["result"].get("value")

    def open(self, url: str, probe: str, ready, timeout: float = PAGE_S):
        """Load ``url``; evaluate ``probe`` (JS returning JSON-able data) until ``ready(data)`` holds.
        Returns the last data read (the caller's asserts then say what was missing)."""
        self.send("Page.navigate", {"url": url}, session=self.session)
        deadline = time.monotonic() + timeout
        data = None
        while time.monotonic() < deadline:
            data = self.evaluate(probe)
            if data is not None and ready(data):
                break
            time.sleep(1.0)
        return data

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (OSError, RuntimeError):
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=20)
        os.close(self._w)
        os.close(self._r)


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    """The study run through ``lsbench run``, then ``lsbench ui`` serving its store."""
    from mlflow.tracking import MlflowClient

    tmp = tmp_path_factory.mktemp("ui-browser")
    study = tmp / f"{STUDY}.yaml"
    study.write_text(
        study_yaml(
            name=STUDY,
            precision="fp16-emulated",
            divergence={"patience": 2},
            scaling=[
                "{method: fixed, scale: 128}",
                f"{{method: fixed, scale: 1.0e+30, skip_nonfinite: false, label: {DIVERGED}}}",
            ],
        )
    )
    runs = tmp / "runs"
    done = lsbench("run", study, "--executor", "local", "--runs-dir", runs, "--no-report", "--quiet", timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    uri = f"sqlite:///{runs / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(STUDY)
    trials = {
        r.data.tags["lsbench.label"]: r
        for r in client.search_runs([exp.experiment_id])
        if r.data.tags.get("lsbench.role") == "trial"
    }
    assert {k: r.data.tags["lsbench.status"] for k, r in trials.items()} == {FINISHED: "finished", DIVERGED: "diverged"}

    port = _free_port()
    log = (tmp / "ui.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "lossscale_bench.cli", "ui", "--runs-dir", str(runs), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        start_new_session=True,
    )
    try:
        # lsbench ui prints its address, then one line per study: "  uicheck: <runs table link>" (read in a
        # thread: a missing line must fail the test, not block it)
        lines: list[str] = []
        threading.Thread(target=lambda: lines.extend(server.stdout), daemon=True).start()
        deadline = time.monotonic() + SERVER_START_S
        while len(lines) < 2 and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        link = lines[1].strip() if len(lines) > 1 else ""
        assert link.startswith(f"{STUDY}: http://127.0.0.1:{port}/"), (lines, (tmp / "ui.log").read_text()[-3000:])
        view = link.split(": ", 1)[1]
        deadline = time.monotonic() + SERVER_START_S
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except OSError:
                assert server.poll() is None, (tmp / "ui.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the MLflow server did not answer /health"
                time.sleep(1)
        browser = _Browser(tmp / "chromium-profile")
        try:
            yield {
                "base": f"http://127.0.0.1:{port}",
                "view": view,
                "exp_id": exp.experiment_id,
                "trials": trials,
                "client": client,
                "browser": browser,
                "runs": runs,
            }
        finally:
            browser.close()
    finally:
        os.killpg(server.pid, signal.SIGINT)  # lsbench ui stops the server's process group on SIGINT
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=20)
        log.close()


def test_the_experiments_list_names_the_study(ui):
    text = ui["browser"].open(f"{ui['base']}/#/experiments", "document.body.innerText", lambda t: STUDY in t)
    assert STUDY in text


#: the runs table's cells by row: MLflow's table (ag-grid) draws the pinned name column and the others in
#: separate row elements that share a ``row-id`` (``...<run id>``); each cell has its column's ``col-id``
ROWS = """JSON.stringify([...document.querySelectorAll('[role=gridcell][col-id]')].map(c => {
  const row = c.closest('[role=row]');
  return [row && row.getAttribute('row-id'), c.getAttribute('col-id'), c.innerText.trim()];
}))"""


def _table(data: str) -> dict[str, dict[str, str]]:
    """row-id -> {col-id: text} from :data:`ROWS`."""
    rows: dict[str, dict[str, str]] = {}
    for row_id, col, text in json.loads(data):
        if row_id:
            rows.setdefault(row_id, {})[col] = text
    return rows


def _trial_row(rows: dict, run_id: str) -> dict[str, str]:
    return next((cells for row_id, cells in rows.items() if row_id.endswith(run_id)), {})


STATUS_COL, NAME_COL = "tags.`lsbench.status`", "attributes.`Run Name`"


def test_the_runs_table_shows_each_trial_with_its_status(ui):
    """The link ``lsbench ui`` prints opens the study's runs with lsbench's columns: each trial's row
    holds its run name and its ``lsbench.status`` (the test reads both cells of the same row)."""
    runs = {label: r.info.run_id for label, r in ui["trials"].items()}

    def ready(data):
        rows = _table(data)
        return all(_trial_row(rows, rid).get(STATUS_COL) for rid in runs.values())

    rows = _table(ui["browser"].open(ui["view"], ROWS, ready))
    for label, status in ((FINISHED, "finished"), (DIVERGED, "diverged")):
        cells = _trial_row(rows, runs[label])
        assert cells.get(NAME_COL) == ui["trials"][label].info.run_name, (label, cells)
        assert cells.get(STATUS_COL) == status, (label, cells)
    text = ui["browser"].evaluate("document.body.innerText")
    assert "lsbench.status" in text  # the column's header
    assert "Group: finished" in text and "Group: diverged" in text  # the view groups by lsbench.status
    assert STUDY in text


#: each chart card of the "Model metrics" tab: its title (the metric) and its drawn line segments (plotly's
#: ``path.js-line``, whose ``d`` has an ``L`` between two points)
CHARTS = """JSON.stringify([...document.querySelectorAll('[data-testid=experiment-view-compare-runs-card]')].map(
  card => ({title: card.innerText.trim().split('\\n')[0],
            segments: [...card.querySelectorAll('path.js-line')].filter(p => (p.getAttribute('d') || '').includes('L'))
                        .length})))"""


def test_a_trials_metrics_tab_draws_its_charts(ui):
    """One trial's "Model metrics" tab: a chart per logged metric, the ones logged over several steps
    drawn as lines (the first charts only: the tab draws the others as they are scrolled to)."""
    run = ui["trials"][FINISHED]
    url = f"{ui['base']}/#/experiments/{ui['exp_id']}/runs/{run.info.run_id}/model-metrics"
    history = {m: len(ui["client"].get_metric_history(run.info.run_id, m)) for m in run.data.metrics}

    def drawn(data):
        return [c for c in json.loads(data) if c["title"] in history and c["segments"]]

    cards = json.loads(ui["browser"].open(url, CHARTS, lambda d: bool(drawn(d))))
    assert cards, "no chart card on the Model metrics tab"
    assert all(c["title"] in history for c in cards), cards  # each card is one of the run's metrics
    lines = [c["title"] for c in cards if c["segments"]]
    assert lines, cards
    assert all(history[t] > 1 for t in lines), (lines, history)  # drawn from the metric's own history


IMAGES = """JSON.stringify([...document.images].map(i => ({alt: i.alt, complete: i.complete,
    size: [i.naturalWidth, i.naturalHeight], src: i.src.slice(0, 40)})))"""


def test_a_trials_plot_artifact_is_shown(ui):
    run = ui["trials"][FINISHED]
    artifacts = [a.path for a in ui["client"].list_artifacts(run.info.run_id, "plots")]
    assert "plots/loss.png" in artifacts
    local = Path(ui["client"].download_artifacts(run.info.run_id, "plots/loss.png", str(ui["runs"].parent)))
    png = local.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    url = f"{ui['base']}/#/experiments/{ui['exp_id']}/runs/{run.info.run_id}/artifacts/plots/loss.png"
    images = json.loads(
        ui["browser"].open(
            url,
            IMAGES,
            lambda d: any(i["alt"] == "plots/loss.png" and i["complete"] and i["size"][0] for i in json.loads(d)),
        )
    )
    shown = [i for i in images if i["alt"] == "plots/loss.png"]
    assert shown, images
    assert shown[0]["complete"] and shown[0]["size"] == [width, height], shown  # decoded, the file's own size
