"""Time the VOC content fingerprint and the data check on a VOC07+12-sized tree (not a test).

Writes a generated ``VOCdevkit`` with VOC07+12's counts (VOC2007: 5,011 trainval + 4,952 test;
VOC2012: 11,540 trainval; 21,503 XML annotations of 0.5-1 kB with 1-4 objects each, as the
devkit's are, and small stand-in JPEGs: only their sizes are read) and times, for the
``voc0712`` study defaults (train VOC07+12 trainval, evaluate VOC07 test):

* ``data_fingerprint`` (what every ``validate`` / ``run`` / dry run pays to compute trial ids),
  with a warm page cache, and cold (every listed file evicted with ``posix_fadvise(DONTNEED)``,
  which needs no root; it drops clean pages only, as after a reboot);
* the old size-only pass (two ``stat`` per image id) for comparison;
* ``data_problems`` (``lsbench validate`` / ``run``'s check of every annotation).

    python benchmarks/fingerprint_speed.py [--dir DIR] [--repeat 3]

Generating takes ~10 s; ``--dir`` keeps the tree, and a later run with the same ``--dir`` reuses it.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Report, parser, time_calls  # noqa: E402

from lossscale_bench.core.registry import VOC_CLASSES  # noqa: E402
from lossscale_bench.study import load_study_text  # noqa: E402
from lossscale_bench.study.data_check import data_problems  # noqa: E402
from lossscale_bench.study.fingerprint import data_fingerprint  # noqa: E402

COUNTS = {"VOC2007": {"trainval": 5011, "test": 4952}, "VOC2012": {"trainval": 11540}}


def _xml(year: str, img_id: str, rng: random.Random) -> str:
    objs = []
    for _ in range(rng.randint(1, 4)):
        x1, y1 = rng.randint(1, 250), rng.randint(1, 180)
        objs.append(
            f"\t<object>\n\t\t<name>{rng.choice(VOC_CLASSES)}</name>\n\t\t<pose>Unspecified</pose>\n"
            f"\t\t<truncated>{rng.randint(0, 1)}</truncated>\n\t\t<difficult>0</difficult>\n"
            f"\t\t<bndbox>\n\t\t\t<xmin>{x1}</xmin>\n\t\t\t<ymin>{y1}</ymin>\n"
            f"\t\t\t<xmax>{rng.randint(x1 + 1, 500)}</xmax>\n\t\t\t<ymax>{rng.randint(y1 + 1, 375)}</ymax>\n"
            "\t\t</bndbox>\n\t</object>\n"
        )
    return (
        f"<annotation>\n\t<folder>{year}</folder>\n\t<filename>{img_id}.jpg</filename>\n"
        f"\t<source>\n\t\t<database>The {year} Database</database>\n\t</source>\n"
        "\t<size>\n\t\t<width>500</width>\n\t\t<height>375</height>\n\t\t<depth>3</depth>\n\t</size>\n"
        "\t<segmented>0</segmented>\n" + "".join(objs) + "</annotation>\n"
    )


def generate(devkit: Path) -> list[Path]:
    """Write the tree (once); return every file the fingerprint reads."""
    files: list[Path] = []
    rng = random.Random(0)
    for year, splits in COUNTS.items():
        d = devkit / year
        done = (d / "ImageSets" / "Main" / "trainval.txt").is_file()
        for sub in ("Annotations", "JPEGImages", "ImageSets/Main"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        n = 0
        for split, count in splits.items():
            ids = [f"{year[3:]}_{n + i:06d}" for i in range(count)]
            n += count
            for img_id in ids:
                xml = d / "Annotations" / f"{img_id}.xml"
                if not done:
                    xml.write_text(_xml(year, img_id, rng))
                    (d / "JPEGImages" / f"{img_id}.jpg").write_bytes(b"\xff\xd8" + bytes(rng.randint(100, 400)))
                files.append(xml)
            lst = d / "ImageSets" / "Main" / f"{split}.txt"
            if not done:
                lst.write_text("".join(i + "\n" for i in ids))
            files.append(lst)
    return files


def evict(files: list[Path]) -> None:
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def stat_only(devkit: Path) -> None:
    """The fingerprint when it sized the XMLs instead of hashing them: two ``stat`` per listed image id (string
    paths), no reads."""
    for year, splits in COUNTS.items():
        d = str(devkit / year)
        for split in splits:
            for img_id in (devkit / year / "ImageSets" / "Main" / f"{split}.txt").read_text().split():
                os.stat(f"{d}/Annotations/{img_id}.xml")
                os.stat(f"{d}/JPEGImages/{img_id}.jpg")


def _timed(fn, repeat: int, before=None) -> tuple[float, float]:
    """Median (wall, CPU) seconds: on a shared machine the CPU time is the steadier figure."""
    wall, cpu = [], []
    for _ in range(repeat):
        if before:
            before()
        c0 = time.process_time()
        wall += time_calls(fn, 1)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    ap = parser(__doc__, repeats=3, repeats_flags=("--repeat",), repeats_help="runs of each measurement")
    ap.add_argument("--dir", default=None, help="where the tree is (kept); default: a temporary folder")
    args = ap.parse_args()
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="lsbench-fp-"))
    devkit = base / "VOCdevkit"
    t0 = time.perf_counter()
    files = generate(devkit)
    rep = Report.from_args(args)
    rep.note(f"tree: {devkit} ({len(files)} files read; ready in {time.perf_counter() - t0:.1f} s)")
    cfg = {"name": "voc0712", "root": str(base)}
    study = load_study_text(
        f"name: b\ndataset: {{name: voc0712, root: {base}}}\nmodel: [ssd300_vgg16]\n"
        "batch_size: [8]\nprecision: fp32\nscaling: [{method: none}]\n"
        "schedule: {iterations: 10, lr: 0.001}\neval: {metric: voc07}\n"
    )
    rows = [
        ("fingerprint, warm page cache", _timed(lambda: data_fingerprint(cfg), args.repeats)),
        (
            "fingerprint, cold (files evicted)",
            _timed(lambda: data_fingerprint(cfg), args.repeats, lambda: evict(files)),
        ),
        ("old size-only pass (2 stat per id), warm", _timed(lambda: stat_only(devkit), args.repeats)),
        ("data check (validate/run), warm", _timed(lambda: data_problems(study), args.repeats)),
    ]
    assert data_problems(study) == [], data_problems(study)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    rep.note(f"\n{os.cpu_count()} cores, load average {load:.1f} at the end\n")
    rep.table(
        [f"what ({args.repeats} runs, median)", "wall (s)", "CPU (s)"],
        [[name, f"{wall:.2f}", f"{cpu:.2f}"] for name, (wall, cpu) in rows],
        name="times",
    )
    rep.finish()


if __name__ == "__main__":
    main()
