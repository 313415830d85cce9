"""Getting one archive: a resumable HTTP download, its checksum, and an extraction that stays inside its folder.

:func:`download_file` resumes a ``.part`` file with HTTP ``Range`` requests and retries a cut connection;
:func:`verify_checksum` checks the complete file against an ``md5:``/``sha256:`` sum (``--checksums`` files
are read by :func:`read_checksums`); :func:`extract` unpacks tar or zip, refusing members (links included)
that would land outside the target folder. What goes wrong raises :class:`DownloadError`, whose text is one
line. The data sets and the ``lsbench data`` command are in :mod:`lossscale_bench.data.download`.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import os
import re
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "CHUNK",
    "DownloadError",
    "say",
    "download_file",
    "verify_checksum",
    "file_digest",
    "extract",
    "read_checksums",
]

#: Bytes read or written at a time.
CHUNK = 1 << 20


class DownloadError(Exception):
    """A download could not be completed or verified; the message is one line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


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
    """The hex digest (``algo``: ``md5`` or ``sha256``) of the file at ``path``."""
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
def say(quiet: bool, msg: str) -> None:
    """Print ``msg`` to stderr unless ``quiet``."""
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
            say(quiet, f"  {part.name}: server ignored the resume request; starting over")
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
                    say(self.quiet, f"  {self.part.name}: {done / 2**20:.0f} MiB{pct}")


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
        say(quiet, f"  {part.name}: {type(error).__name__}: {error}; resuming")
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
