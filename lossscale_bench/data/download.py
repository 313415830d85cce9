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
raise :class:`~lossscale_bench.data.transfer.DownloadError`, whose text is one line; the transfer, the
checksums and the extraction of one archive are in :mod:`lossscale_bench.data.transfer`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .transfer import DownloadError, download_file, extract, read_checksums, say, verify_checksum

__all__ = ["Resource", "RESOURCES", "register", "cmd_data", "fetch", "main"]

MIRROR_ENV = "LSBENCH_MIRROR"
MARKER_DIR = ".lsbench-data"


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
        say(quiet, f"{res.filename}: already present")
        return "present"
    url = f"{mirror.rstrip('/')}/{res.filename}" if mirror else res.url
    archive = root / res.filename
    if archive.is_file():
        try:
            verify_checksum(archive, checksum)
            say(quiet, f"{res.filename}: archive already downloaded")
        except DownloadError:
            archive.unlink()
    if not archive.is_file():
        part = root / f"{res.filename}.part"
        have = part.stat().st_size if part.exists() else 0
        say(
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
    say(quiet, f"{res.filename}: extracting into {root}")
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
