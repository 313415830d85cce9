"""`lsbench data` against a real HTTP server on 127.0.0.1 serving tiny archives in the real layouts."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import tarfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from lossscale_bench.data import download as dl
from lossscale_bench.data.download import register
from lossscale_bench.data.prepare import prepare_dataset
from lossscale_bench.data.transfer import DownloadError, read_checksums
from lossscale_bench.data.voc import build_voc_datasets, make_tiny_voc


class _Server:
    """Serves ``files`` by name with Range support; ``cut[name] = k`` cuts the next k full responses halfway."""

    def __init__(self, files: dict[str, bytes]):
        self.files = dict(files)
        self.cut: dict[str, int] = {}
        self.ignore_range = False
        self.log: list[tuple[str, str | None]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # keep pytest output clean
                pass

            def do_GET(self):
                name = self.path.lstrip("/")
                rng = self.headers.get("Range")
                server.log.append((name, rng))
                data = server.files.get(name)
                if data is None:
                    self.send_error(404)
                    return
                start = 0
                if rng and not server.ignore_range:
                    start = int(rng.split("=")[1].split("-")[0])
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if server.cut.get(name, 0) > 0:
                    server.cut[name] -= 1
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _tar(src_root: Path, members: list[str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for m in members:
            tf.add(src_root / m, arcname=m)
    return buf.getvalue()


def _voc_archives(tmp_path: Path) -> dict[str, bytes]:
    """The three VOC tarballs' layouts: VOCdevkit/VOC2007 (trainval, test) and VOCdevkit/VOC2012 (trainval)."""
    a, b, c = tmp_path / "src07tv", tmp_path / "src07test", tmp_path / "src12"
    make_tiny_voc(a / "VOCdevkit/VOC2007", {"trainval": 4}, seed=1)
    make_tiny_voc(b / "VOCdevkit/VOC2007", {"test": 3}, seed=2)
    make_tiny_voc(c / "VOCdevkit/VOC2012", {"trainval": 3}, seed=3)
    return {
        "VOCtrainval_06-Nov-2007.tar": _tar(a, ["VOCdevkit"]),
        "VOCtest_06-Nov-2007.tar": _tar(b, ["VOCdevkit"]),
        "VOCtrainval_11-May-2012.tar": _tar(c, ["VOCdevkit"]),
    }


def _manifest(tmp_path: Path, files: dict[str, bytes], algo: str = "sha256") -> Path:
    p = tmp_path / f"SUMS.{algo}"
    p.write_text("".join(f"{hashlib.new(algo, d).hexdigest()}  {n}\n" for n, d in files.items()))
    return p


def _run(*argv) -> int:
    parser = argparse.ArgumentParser(prog="lsbench")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["data", *argv, "--quiet", "--backoff", "0"])
    return args.func(args)


def test_voc_download_extract_and_rerun(tmp_path, monkeypatch):
    files = _voc_archives(tmp_path)
    sums = _manifest(tmp_path, files, "md5")
    root = tmp_path / "data"
    with _Server(files) as srv:
        monkeypatch.setenv("LSBENCH_MIRROR", srv.url)  # the environment variable names the mirror
        assert _run("voc", "--root", str(root), "--checksums", str(sums)) == 0
        assert sorted(n for n, _ in srv.log) == sorted(files)
    # the layout a voc0712 study expects, and nothing left behind
    cfg = {
        "name": "voc0712",
        "root": str(root),
        "classes": ["square", "disc"],
        "train_split": "trainval",
        "val_split": "test",
    }
    prepare_dataset(cfg)
    train, val, _ = build_voc_datasets(cfg)
    assert len(val) == 3 and len(train) >= 5
    assert not list(root.glob("*.tar")) and not list(root.glob("*.part"))
    markers = sorted(p.name for p in (root / ".lsbench-data").iterdir())
    assert markers == sorted(f"{n}.done" for n in files)
    # idempotent: the server is gone, a second run does nothing and succeeds
    assert _run("voc", "--root", str(root), "--checksums", str(sums)) == 0


def test_resume_after_a_cut_connection(tmp_path):
    files = _voc_archives(tmp_path)
    sums = _manifest(tmp_path, files)
    name = "VOCtrainval_11-May-2012.tar"
    size = len(files[name])
    root = tmp_path / "data"
    with _Server(files) as srv:
        srv.cut[name] = 2  # the first two responses stop halfway through
        assert _run("voc", "--root", str(root), "--years", "2012", "--mirror", srv.url, "--checksums", str(sums)) == 0
        reqs = [r for n, r in srv.log if n == name]
    # full request cut at size/2, then a Range request from there (cut again halfway), then the rest
    first = size // 2
    second = first + (size - first) // 2
    assert reqs == [None, f"bytes={first}-", f"bytes={second}-"]
    assert (root / "VOCdevkit/VOC2012/ImageSets/Main/trainval.txt").is_file()


def test_resume_across_runs_and_server_without_range(tmp_path):
    files = _voc_archives(tmp_path)
    sums = _manifest(tmp_path, files)
    name = "VOCtest_06-Nov-2007.tar"
    root = tmp_path / "data"
    root.mkdir()
    (root / f"{name}.part").write_bytes(files[name][:1000])  # left by an interrupted run
    with _Server(files) as srv:
        assert _run("voc", "--root", str(root), "--years", "2007", "--mirror", srv.url, "--checksums", str(sums)) == 0
        assert (name, "bytes=1000-") in srv.log and (name, None) not in srv.log
    # a server that ignores Range answers 200: the download starts over and still verifies
    root2 = tmp_path / "data2"
    root2.mkdir()
    (root2 / f"{name}.part").write_bytes(b"x" * 500)
    with _Server(files) as srv:
        srv.ignore_range = True
        assert _run("voc", "--root", str(root2), "--years", "2007", "--mirror", srv.url, "--checksums", str(sums)) == 0
    assert (root2 / "VOCdevkit/VOC2007/ImageSets/Main/test.txt").is_file()


def test_bad_checksum_is_refused(tmp_path):
    files = _voc_archives(tmp_path)
    root = tmp_path / "data"
    with _Server(files) as srv:
        # the published MD5s do not match the tiny archives: refused, nothing extracted, nothing kept
        with pytest.raises(
            DownloadError,
            match="checksum mismatch for VOCtrainval_06-Nov-2007.tar: expected md5 c52e279531787c972589f7e41ab4ae64",
        ):
            _run("voc", "--root", str(root), "--mirror", srv.url)
        assert not (root / "VOCdevkit").exists() and not list(root.glob("*.part")) and not list(root.glob("*.tar"))
        # a manifest whose sum is wrong for one file
        sums = _manifest(tmp_path, {**files, "VOCtest_06-Nov-2007.tar": b"something else"})
        with pytest.raises(DownloadError, match="VOCtest_06-Nov-2007.tar") as e:
            _run("voc", "--root", str(root), "--years", "2007", "--mirror", srv.url, "--checksums", str(sums))
        assert "\n" not in str(e.value)
        assert (root / ".lsbench-data/VOCtrainval_06-Nov-2007.tar.done").is_file()  # the good one went through
        assert not (root / ".lsbench-data/VOCtest_06-Nov-2007.tar.done").exists()
        # 404 from the mirror is a one-line user error too
        with pytest.raises(DownloadError, match="HTTP 404"):
            _run("coco", "--root", str(root), "--parts", "val", "--mirror", srv.url)


def test_coco_layout_through_the_module_entry_point(tmp_path, capsys):
    ann = {
        "images": [{"id": 1, "file_name": "000000000001.jpg", "width": 32, "height": 24}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [2, 2, 10, 8], "area": 80, "iscrowd": 0}],
        "categories": [{"id": 3, "name": "car"}],
    }

    def zipped(entries: dict[str, bytes]) -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            for n, d in entries.items():
                zf.writestr(n, d)
        return buf.getvalue()

    from PIL import Image

    jpg = io.BytesIO()
    Image.new("RGB", (32, 24), (90, 90, 90)).save(jpg, format="JPEG")
    files = {
        "annotations_trainval2017.zip": zipped(
            {
                "annotations/instances_train2017.json": json.dumps(ann).encode(),
                "annotations/instances_val2017.json": json.dumps(ann).encode(),
            }
        ),
        "val2017.zip": zipped({"val2017/000000000001.jpg": jpg.getvalue()}),
        "train2017.zip": zipped({"train2017/000000000001.jpg": jpg.getvalue()}),
    }
    sums = _manifest(tmp_path, files)
    root = tmp_path / "coco"
    with _Server(files) as srv:
        rc = dl.main(["coco", "--root", str(root), "--mirror", srv.url, "--checksums", str(sums), "--keep-archives"])
    assert rc == 0
    assert "dataset: {name: coco2017, root: " in capsys.readouterr().out
    prepare_dataset({"name": "coco2017", "root": str(root), "fake_data": False})
    assert (root / "train2017.zip").is_file()  # --keep-archives
    # an archive that would write outside the root is refused
    evil = {"val2017.zip": zipped({"../escape.txt": b"x"})}
    with _Server(evil) as srv:
        rc = dl.main(
            [
                "coco",
                "--root",
                str(tmp_path / "c2"),
                "--parts",
                "val",
                "--mirror",
                srv.url,
                "--checksums",
                str(_manifest(tmp_path, evil)),
                "--quiet",
            ]
        )
    assert rc == 2 and "outside" in capsys.readouterr().err
    assert not (tmp_path / "escape.txt").exists()


def test_checksum_file_parsing(tmp_path):
    p = tmp_path / "sums"
    p.write_text("# comment\n" + "a" * 32 + "  dir/x.tar\n" + "B" * 64 + " *y.zip\n")
    assert read_checksums(p) == {"x.tar": "md5:" + "a" * 32, "y.zip": "sha256:" + "b" * 64}
    p.write_text("abc  x.tar\n")
    with pytest.raises(DownloadError, match="not an md5 or sha256"):
        read_checksums(p)
