"""Token authentication passes through lsbench: a server in front of MLflow that wants a bearer token.

A real HTTP server stands where a team's authenticating proxy would be: ``/health`` answers without
credentials (as MLflow's does), every API call without ``Authorization: Bearer <token>`` gets 401. Without
``MLFLOW_TRACKING_TOKEN`` the study stops with one line, exit 4, before any work; with it, the header
reaches the server on lsbench's calls (the token is MLflow's client setting; lsbench adds nothing).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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
