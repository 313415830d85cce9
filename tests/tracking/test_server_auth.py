"""Credentials pass through lsbench: a server in front of MLflow that wants a bearer token, and MLflow's own
basic authentication (``mlflow server --app-name basic-auth``, as docs/guide/team-setup.md starts it).

A real HTTP server stands where a team's authenticating proxy would be: ``/health`` answers without
credentials (as MLflow's does), every API call without ``Authorization: Bearer <token>`` gets 401. Without
``MLFLOW_TRACKING_TOKEN`` the study stops with one line, exit 4, before any work; with it, the header
reaches the server on lsbench's calls (the token is MLflow's client setting; lsbench adds nothing).
"""

from __future__ import annotations

import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import servers

from helpers import lsbench, study_yaml


def _server():
    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self):
            if self.path.startswith("/health"):
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"OK")
                return
            seen.append(self.headers.get("Authorization"))
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error_code": "UNAUTHENTICATED", "message": "a bearer token is required"}')

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, seen


def test_a_server_that_wants_a_token_gets_mlflows_token_or_the_study_stops_with_one_line(tmp_path):
    httpd, seen = _server()
    try:
        study = tmp_path / "s.yaml"
        study.write_text(study_yaml(name="auth"))
        uri = f"http://127.0.0.1:{httpd.server_address[1]}"
        for token, header in ((None, None), ("tok-123", "Bearer tok-123")):
            env = {"MLFLOW_TRACKING_TOKEN": token} if token else {}
            r = lsbench(
                "run", study, "--tracking-uri", uri, "--runs-dir", tmp_path / "runs", "--executor", "local",
                cwd=tmp_path, timeout=300, env=env,
            )  # fmt: skip
            lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
            assert r.returncode == 4 and len(lines) == 1, (r.returncode, r.stderr[-3000:])
            assert "refused this client's credentials" in lines[0] and "MLFLOW_TRACKING_TOKEN" in lines[0]
            assert seen and seen[-1] == header
    finally:
        httpd.shutdown()


def test_mlflows_basic_auth_server_takes_the_users_credentials_and_refuses_none(tmp_path):
    """A real ``mlflow server --app-name basic-auth``: without ``MLFLOW_TRACKING_USERNAME``/``PASSWORD`` the
    study stops with one line, exit 4, before any work; with the admin's, it trains and reports."""
    pytest.importorskip("flask_wtf", reason="MLflow's basic-auth app needs Flask-WTF (the dev extra)")
    port = servers.free_port()
    env = servers.environment(
        AUTH_DIR=tmp_path, ARTIFACTS=tmp_path / "artifacts", MLFLOW_PORT=port,
        MLFLOW_FLASK_SERVER_SECRET_KEY="a-key-of-the-lab", MLFLOW_AUTH_ADMIN_PASSWORD="the-admins-password-1",
        MLFLOW_AUTH_CONFIG_PATH=tmp_path / "auth.ini",
    )  # fmt: skip
    # the users' store in the test's folder (the packaged basic_auth.ini keeps it in the working directory)
    (tmp_path / "auth.ini").write_text(
        f"[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///{tmp_path}/basic_auth.db\n"
        "admin_username = admin\nauthorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    proc = servers.start("mlflow_basic_auth", env, tmp_path / "server.log")
    try:
        uri, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 480
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(uri + "/health", timeout=2) as r:  # noqa: S310
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        assert proc.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
        study = tmp_path / "s.yaml"
        study.write_text(study_yaml(name="basic-auth", schedule={"iterations": 4, "lr": 0.01, "warmup_iterations": 1}))
        run = ("run", study, "--tracking-uri", uri, "--runs-dir", tmp_path / "runs", "--executor", "local", "--quiet")
        r = lsbench(*run, cwd=tmp_path, timeout=300)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 4 and len(lines) == 1, (r.returncode, r.stderr[-3000:])
        assert "refused this client's credentials" in lines[0] and "MLFLOW_TRACKING_USERNAME" in lines[0]
        users = {"MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": "the-admins-password-1"}
        r = lsbench(*run, "--no-report", cwd=tmp_path, timeout=600, env=users)
        assert r.returncode == 0 and "1 finished" in r.stdout, (r.stdout[-2000:], r.stderr[-3000:])
        assert "View run" not in r.stdout  # MLflow's own link lines are not printed under a study's progress
        (tmp_path / "rep").mkdir()
        r = lsbench("report", "--study", "basic-auth", "--tracking-uri", uri, "--out", tmp_path / "rep", cwd=tmp_path,
                    timeout=300, env=users)  # fmt: skip
        assert r.returncode == 0 and (tmp_path / "rep" / "basic-auth.md").exists(), r.stderr[-3000:]
    finally:
        servers.kill_group(proc, timeout=30)
