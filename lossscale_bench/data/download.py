"""``lsbench data voc|coco --root DIR``: download, verify, extract; resumable and idempotent.

* **Resume.** Each archive downloads to ``DIR/<file>.part``; a cut connection
  (or a second run after Ctrl-C) continues with an HTTP ``Range`` request
  from the bytes already there. A server that ignores ``Range`` (answers 200)
  restarts the file from zero.
* **Checksums.** The complete file is checked against the published MD5 (the
  sums torchvision / the COCO download scripts use) before anything is
  extracted; a mismatch deletes the file and fails. ``--checksums FILE``
  (``md5sum``/``sha256sum`` output: ``<hex>  <file name>``) replaces the sums
  for the files it names, for private mirrors that repackage the archives.
* **Extraction** into ``DIR`` (tar and zip; members that would land outside
  ``DIR``, links included, are refused), then a check that the expected
  folders exist, then a marker ``DIR/.lsbench-data/<file>.done``. A second
  run finds the markers and the folders and does nothing, without network.
  Archives are deleted after extraction unless ``--keep-archives``.
* **Mirror.** ``--mirror URL`` or ``$LSBENCH_MIRROR``: fetch ``URL/<file
  name>`` instead of the official address (the tests use a loopback server).

Resulting layouts: ``DIR/VOCdevkit/VOC2007``, ``DIR/VOCdevkit/VOC2012``
(study: ``dataset: {name: voc0712, root: DIR}``); ``DIR/train2017``,
``DIR/val2017``, ``DIR/annotations/instances_{train,val}2017.json``
(``dataset: {name: coco2017, root: DIR}``).

User errors (bad checksum, HTTP 404, too many failed retries, a bad archive)
raise :class:`DownloadError`, whose text is one line.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import http.client
import json
import os
import re
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DownloadError",
    "Resource",
    "RESOURCES",
    "register",
    "cmd_data",
    "fetch",
    "download_file",
    "verify_checksum",
    "extract",
    "read_checksums",
    "main",
]

MIRROR_ENV = "LSBENCH_MIRROR"
MARKER_DIR = ".lsbench-data"
CHUNK = 1 << 20


class DownloadError(Exception):
    """A download could not be completed or verified; the message is one line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


@dataclass(frozen=True)
class Resource:
    filename: str
    url: str
    checksum: str  # "md5:<hex>" or "sha256:<hex>"
    produces: tuple[str, ...]  # paths (relative to root) that must exist after extraction
    size_mb: int = 0  # approximate, for the progress line only


_VOC = "https://thor.robots.ox.ac.uk/pascal/VOC"
_COCO = "http://images.cocodataset.org"

#: dataset -> part -> archives. MD5s as published (torchvision.datasets.voc; COCO's own listing).
RESOURCES: dict[str, dict[str, tuple[Resource, ...]]] = {
    "voc": {
        "2007": (
            Resource(
                "VOCtrainval_06-Nov-2007.tar",
                f"{_VOC}/voc2007/VOCtrainval_06-Nov-2007.tar",
                "md5:c52e279531787c972589f7e41ab4ae64",
                (
                    "VOCdevkit/VOC2007/Annotations",
                    "VOCdevkit/VOC2007/JPEGImages",
                    "VOCdevkit/VOC2007/ImageSets/Main/trainval.txt",
                ),
                439,
            ),
            Resource(
                "VOCtest_06-Nov-2007.tar",
                f"{_VOC}/voc2007/VOCtest_06-Nov-2007.tar",
                "md5:b6e924de25625d8de591ea690078ad9f",
                (
                    "VOCdevkit/VOC2007/Annotations",
                    "VOCdevkit/VOC2007/JPEGImages",
                    "VOCdevkit/VOC2007/ImageSets/Main/test.txt",
                ),
                430,
            ),
        ),
        "2012": (
            Resource(
                "VOCtrainval_11-May-2012.tar",
                f"{_VOC}/voc2012/VOCtrainval_11-May-2012.tar",
                "md5:6cd6e144f989b92b3379bac3b3de84fd",
                (
                    "VOCdevkit/VOC2012/Annotations",
                    "VOCdevkit/VOC2012/JPEGImages",
                    "VOCdevkit/VOC2012/ImageSets/Main/trainval.txt",
                ),
                1907,
            ),
        ),
    },
    "coco": {
        "annotations": (
            Resource(
                "annotations_trainval2017.zip",
                f"{_COCO}/annotations/annotations_trainval2017.zip",
                "md5:f4bbac642086de4f52a3fdda2de5fa2c",
                ("annotations/instances_train2017.json", "annotations/instances_val2017.json"),
                241,
            ),
        ),
        "val": (
            Resource(
                "val2017.zip", f"{_COCO}/zips/val2017.zip", "md5:442b8da7639aecaf257c1dceb8ba8c80", ("val2017",), 778
            ),
        ),
        "train": (
            Resource(
                "train2017.zip",
                f"{_COCO}/zips/train2017.zip",
                "md5:cced6f7f71b7629ddf16f17bbcfab6b2",
                ("train2017",),
                18441,
            ),
        ),
    },
}


# --------------------------------------------------------------------------- checksums
def _parse_checksum(text: str) -> tuple[str, str]:
    algo, _, hexd = text.partition(":")
    if not hexd:
        hexd, algo = algo, {32: "md5", 64: "sha256"}.get(len(algo), "")
    hexd = hexd.strip().lower()
    if (
        algo not in ("md5", "sha256")
        or not re.fullmatch(r"[0-9a-f]+", hexd)
        or len(hexd) != {"md5": 32, "sha256": 64}[algo]
    ):
        raise DownloadError(f"not an md5 or sha256 checksum: {text!r}")
    return algo, hexd


def read_checksums(path) -> dict[str, str]:
    """``md5sum``/``sha256sum`` output (``<hex>  <name>``, ``*name`` allowed) -> ``{name: "algo:hex"}``."""
    path = Path(path).expanduser()
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise DownloadError(f"--checksums: cannot read {path}: {exc.strerror or exc}") from None
    out: dict[str, str] = {}
    for i, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        if len(parts) != 2:
            raise DownloadError(f"--checksums: {path} line {i}: expected '<hex>  <file name>'")
        hexd, name = parts
        name = os.path.basename(name.strip().lstrip("*"))
        algo, hexd = _parse_checksum(hexd)
        out[name] = f"{algo}:{hexd}"
    return out


def file_digest(path: Path, algo: str) -> str:
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def verify_checksum(path: Path, checksum: str, name: str | None = None) -> None:
    """Raise :class:`DownloadError` unless ``path`` has the ``algo:hex`` checksum."""
    algo, expected = _parse_checksum(checksum)
    got = file_digest(path, algo)
    if got != expected:
        raise DownloadError(f"checksum mismatch for {name or path.name}: expected {algo} {expected}, got {got}")


# --------------------------------------------------------------------------- download
def _say(quiet: bool, msg: str) -> None:
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def _resume_mode(resp, url: str, have: int, part: Path, quiet: bool) -> tuple[int, str, int | None]:
    """``(bytes kept, file mode, total size or None)`` from the server's answer to a (resumed) request."""
    status = resp.status
    length = resp.headers.get("Content-Length")
    length = int(length) if length is not None and length.isdigit() else None
    if have and status == 206:
        m = re.match(r"bytes (\d+)-(\d+)/(\d+|\*)", resp.headers.get("Content-Range", ""))
        if not m or int(m.group(1)) != have:
            raise DownloadError(
                f"{url}: server answered a resume from byte {have} with "
                f"Content-Range {resp.headers.get('Content-Range')!r}"
            )
        return have, "ab", int(m.group(3)) if m.group(3) != "*" else None
    if status in (200, 203):
        if have:
            _say(quiet, f"  {part.name}: server ignored the resume request; starting over")
        return 0, "wb", length
    raise DownloadError(f"{url}: unexpected HTTP status {status}")


class _Progress:
    """Bytes received in the current attempt (kept when it fails midway), and a line every 10 s."""

    def __init__(self, part: Path, quiet: bool) -> None:
        self.part, self.quiet, self.last_report, self.received = part, quiet, 0.0, 0

    def copy(self, resp, mode: str, have: int, total: int | None) -> None:
        """Append (``ab``) or write (``wb``) the body to the part file."""
        with open(self.part, mode) as f:
            while True:
                block = resp.read(CHUNK)
                if not block:
                    break
                f.write(block)
                self.received += len(block)
                now = time.monotonic()
                if not self.quiet and now - self.last_report > 10:
                    self.last_report = now
                    done = have + self.received
                    pct = f" ({100 * done / total:.0f}%)" if total else ""
                    _say(self.quiet, f"  {self.part.name}: {done / 2**20:.0f} MiB{pct}")


def _attempt(url: str, part: Path, have: int, timeout: float, progress: _Progress) -> None:
    """One request from byte ``have``; returns when the body is complete, raises what went wrong."""
    headers = {"User-Agent": "lossscale_bench-downloader/1", "Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
    req = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        length = resp.headers.get("Content-Length")
        length = int(length) if length is not None and length.isdigit() else None
        start, mode, total = _resume_mode(resp, url, have, part, progress.quiet)
        progress.copy(resp, mode, start, total)
        if length is not None and progress.received < length:
            raise ConnectionError(f"connection closed after {progress.received} of {length} bytes")


def _triage(exc: BaseException, url: str, have: int, part: Path) -> bool:
    """True: ``exc`` is the HTTP 416 of a resume, so the file is complete; False: a retry may help;
    raises :class:`DownloadError` for what no retry fixes (a client error, a full disk)."""
    if isinstance(exc, urllib.error.HTTPError):
        if exc.code == 416 and have:
            return True
        if exc.code < 500 and exc.code not in (408, 429):
            raise DownloadError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    elif isinstance(exc, OSError) and getattr(exc, "errno", None) == errno.ENOSPC:
        raise DownloadError(f"no space left on the device while writing {part}") from None
    return False


def download_file(
    url: str,
    part: Path,
    *,
    retries: int = 5,
    timeout: float = 60.0,
    backoff: float = 1.0,
    quiet: bool = False,
    on_attempt: Callable[[int, int], None] | None = None,
) -> Path:
    """Download ``url`` into ``part``, resuming from its current size; return ``part``.

    A connection that ends before ``Content-Length`` bytes, resets, or times
    out is retried (``retries`` times in a row without progress, waiting
    ``backoff`` × 2^k seconds) with a ``Range`` request. HTTP 416 on a resume
    means the file is already complete (the checksum decides).
    """
    part.parent.mkdir(parents=True, exist_ok=True)
    failures = 0
    progress = _Progress(part, quiet)
    while True:
        have = part.stat().st_size if part.exists() else 0
        if on_attempt:
            on_attempt(failures, have)
        progress.received = 0
        try:
            _attempt(url, part, have, timeout, progress)
            return part
        except DownloadError:
            raise
        except (OSError, http.client.HTTPException, ConnectionError, TimeoutError) as exc:
            if _triage(exc, url, have, part):
                return part
            error: BaseException = exc
        failures = 0 if progress.received else failures + 1
        if failures > retries:
            have = part.stat().st_size if part.exists() else 0
            raise DownloadError(
                f"download of {url} failed {failures} times in a row ({type(error).__name__}: "
                f"{error}); {have} bytes kept in {part}: run the same command again to resume"
            )
        _say(quiet, f"  {part.name}: {type(error).__name__}: {error}; resuming")
        if failures:
            time.sleep(min(backoff * 2 ** (failures - 1), 60.0))


# --------------------------------------------------------------------------- extraction
def _inside(root: Path, name: str) -> bool:
    target = (root / name).resolve()
    return target == root or root in target.parents


def extract(archive: Path, root: Path) -> None:
    """Extract a tar or zip archive into ``root``, refusing members that escape it."""
    root = root.resolve()
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                for name in zf.namelist():
                    if not _inside(root, name):
                        raise DownloadError(f"{archive.name}: member {name!r} would be written outside {root}")
                zf.extractall(root)
            return
        if tarfile.is_tarfile(archive):
            with tarfile.open(archive) as tf:
                members = tf.getmembers()
                for m in members:
                    if not _inside(root, m.name) or (
                        (m.issym() or m.islnk())
                        and (
                            os.path.isabs(m.linkname)
                            or not _inside(root, os.path.join(os.path.dirname(m.name), m.linkname))
                        )
                    ):
                        raise DownloadError(f"{archive.name}: member {m.name!r} would be written outside {root}")
                if hasattr(tarfile, "data_filter"):
                    tf.extractall(root, members=members, filter="data")
                else:  # pragma: no cover - Python without PEP 706 filters
                    tf.extractall(root, members=members)
            return
    except (tarfile.TarError, zipfile.BadZipFile, EOFError) as exc:
        raise DownloadError(f"{archive.name}: cannot extract: {exc}") from None
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise DownloadError(f"no space left on the device while extracting {archive.name}") from None
        raise
    raise DownloadError(f"{archive.name}: neither a tar nor a zip archive")


# --------------------------------------------------------------------------- one resource
def _marker(root: Path, res: Resource) -> Path:
    return root / MARKER_DIR / f"{res.filename}.done"


def _present(root: Path, res: Resource, checksum: str) -> bool:
    m = _marker(root, res)
    if not m.is_file():
        return False
    try:
        info = json.loads(m.read_text())
    except (OSError, ValueError):
        return False
    return info.get("checksum") == checksum and all((root / p).exists() for p in res.produces)


def fetch(
    res: Resource,
    root: Path,
    *,
    mirror: str | None = None,
    checksums: dict[str, str] | None = None,
    keep_archive: bool = False,
    retries: int = 5,
    timeout: float = 60.0,
    backoff: float = 1.0,
    quiet: bool = False,
) -> str:
    """Make ``res`` present under ``root``; returns ``"present"`` or ``"fetched"``."""
    checksum = (checksums or {}).get(res.filename, res.checksum)
    if _present(root, res, checksum):
        _say(quiet, f"{res.filename}: already present")
        return "present"
    url = f"{mirror.rstrip('/')}/{res.filename}" if mirror else res.url
    archive = root / res.filename
    if archive.is_file():
        try:
            verify_checksum(archive, checksum)
            _say(quiet, f"{res.filename}: archive already downloaded")
        except DownloadError:
            archive.unlink()
    if not archive.is_file():
        part = root / f"{res.filename}.part"
        have = part.stat().st_size if part.exists() else 0
        _say(
            quiet,
            f"{res.filename}: downloading {url}"
            + (f" (resuming at {have} bytes)" if have else "")
            + (f", about {res.size_mb} MB" if res.size_mb and not mirror else ""),
        )
        download_file(url, part, retries=retries, timeout=timeout, backoff=backoff, quiet=quiet)
        try:
            verify_checksum(part, checksum, res.filename)
        except DownloadError as exc:
            part.unlink(missing_ok=True)
            raise DownloadError(
                f"{exc}; the download was deleted, run the command again to retry (source: {url})"
            ) from None
        os.replace(part, archive)
    _say(quiet, f"{res.filename}: extracting into {root}")
    extract(archive, root)
    missing = [p for p in res.produces if not (root / p).exists()]
    if missing:
        raise DownloadError(
            f"{res.filename}: extracted, but {root / missing[0]} is missing (not the expected archive layout)"
        )
    marker = _marker(root, res)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(
        json.dumps({"file": res.filename, "checksum": checksum, "url": url, "time": time.strftime("%Y-%m-%dT%H:%M:%S")})
        + "\n"
    )
    if not keep_archive:
        archive.unlink(missing_ok=True)
    return "fetched"


def _selected(dataset: str, parts: Iterable[str] | None) -> list[Resource]:
    table = RESOURCES[dataset]
    names = list(parts) if parts else list(table)
    out: list[Resource] = []
    for n in names:
        if n not in table:
            raise DownloadError(f"unknown part {n!r} of {dataset}; allowed: {', '.join(table)}")
        out.extend(table[n])
    return out


# --------------------------------------------------------------------------- CLI
def cmd_data(args) -> int:
    root = Path(args.root).expanduser().resolve()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DownloadError(f"--root: cannot create {root}: {exc.strerror or exc}") from None
    mirror = args.mirror or os.environ.get(MIRROR_ENV) or None
    checksums = read_checksums(args.checksums) if args.checksums else {}
    parts = args.years if args.dataset == "voc" else args.parts
    results = []
    for res in _selected(args.dataset, parts):
        results.append(
            fetch(
                res,
                root,
                mirror=mirror,
                checksums=checksums,
                keep_archive=args.keep_archives,
                retries=args.retries,
                timeout=args.timeout,
                backoff=args.backoff,
                quiet=args.quiet,
            )
        )
    study = (
        "dataset: {name: voc0712, root: %s}" if args.dataset == "voc" else "dataset: {name: coco2017, root: %s}"
    ) % root
    if not args.quiet:
        print(
            f"{args.dataset}: {results.count('fetched')} fetched, {results.count('present')} already present "
            f"in {root}\nuse it with  {study}"
        )
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``data`` to an ``argparse`` sub-parser set; the handler is ``args.func`` (returns 0)."""
    p = subparsers.add_parser(
        "data",
        help="download and extract Pascal VOC 2007+2012 or COCO 2017 (resumable, checksummed)",
        description="Download, verify and extract a data set into --root. Safe to run again: "
        "finished parts are skipped, interrupted downloads resume.",
    )
    p.add_argument(
        "dataset",
        choices=tuple(RESOURCES),
        help="voc: VOC2007 trainval+test and VOC2012 trainval; coco: COCO 2017 train, val and annotations",
    )
    p.add_argument("--root", required=True, help="folder to download and extract into")
    p.add_argument(
        "--years",
        nargs="+",
        choices=tuple(RESOURCES["voc"]),
        default=None,
        help="voc only: which years (default: 2007 2012)",
    )
    p.add_argument(
        "--parts",
        nargs="+",
        choices=tuple(RESOURCES["coco"]),
        default=None,
        help="coco only: which archives (default: annotations val train)",
    )
    p.add_argument(
        "--mirror",
        default=None,
        help=f"base URL serving the archives by file name (default: ${MIRROR_ENV}, else the official sites)",
    )
    p.add_argument(
        "--checksums",
        default=None,
        metavar="FILE",
        help="md5sum/sha256sum-style file whose sums replace the published ones for the files it names",
    )
    p.add_argument("--keep-archives", action="store_true", help="keep the .tar/.zip files after extraction")
    p.add_argument("--retries", type=int, default=5, help="retries in a row without progress (default 5)")
    p.add_argument("--timeout", type=float, default=60.0, help="socket timeout in seconds (default 60)")
    p.add_argument("--backoff", type=float, default=1.0, help=argparse.SUPPRESS)
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=cmd_data)
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m lossscale_bench.data.download voc --root DIR`` (same as ``lsbench data``)."""
    parser = argparse.ArgumentParser(prog="lsbench")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["data", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args) or 0)
    except DownloadError as exc:
        print(f"lsbench: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
