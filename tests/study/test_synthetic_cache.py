"""The synthetic data cache is checked before any work.

Before: ``$LSBENCH_DATA`` that was a file or read-only passed ``lsbench validate`` ("ok") and
ended ``run`` in a traceback, exit 1, from the data step. Now ``validate`` and ``run`` say the
same one line naming the cache and what is wrong (exit 2), before a runs folder is made; a
read-only cache that already holds the set is fine (it is only read).
"""

from __future__ import annotations

import pytest

from helpers import AS_USER, MODES_OBEYED, lsbench, study_yaml


def _study(tmp_path, **dataset):
    f = tmp_path / "s.yaml"
    ds = {"name": "synthetic", "train_images": 16, "val_images": 4, "image_size": 64, "seed": 0, **dataset}
    f.write_text(study_yaml(name="s", dataset=ds, schedule={"iterations": 4, "lr": 0.01, "warmup_iterations": 2}))
    return f


def _both_refuse(f, tmp_path, cache_env, *needles, prefix=()):
    """``validate`` and ``run`` each exit 2 with the same error line; ``run`` made no runs folder."""
    env = {"LSBENCH_DATA": str(cache_env)}
    lines = []
    for cmd in (["validate", f], ["run", f, "--executor", "local", "--runs-dir", tmp_path / "runs"]):
        r = lsbench(*cmd, cwd=tmp_path, timeout=180, env=env, prefix=prefix)
        assert r.returncode == 2, (cmd, r.stdout[-1500:], r.stderr[-3000:])
        assert "Traceback" not in r.stderr + r.stdout and "ok," not in r.stdout
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("lsbench: error: ")]
        assert len(errors) == 1, r.stderr
        for n in needles:
            assert str(n) in errors[0], (n, errors[0])
        lines.append(errors[0])
    assert lines[0] == lines[1]
    assert not (tmp_path / "runs").exists()
    return lines[0]


def test_a_cache_that_is_a_file(tmp_path):
    f = _study(tmp_path)
    (tmp_path / "cache").write_text("not a folder")
    _both_refuse(
        f,
        tmp_path,
        tmp_path / "cache",
        "s.yaml: dataset: ",
        f"$LSBENCH_DATA={tmp_path / 'cache'}",
        "is a file, not a folder",
        "set LSBENCH_DATA to a folder that can be written",
    )
    _both_refuse(
        f,
        tmp_path,
        tmp_path / "cache" / "sub",
        f"{tmp_path / 'cache' / 'sub'} cannot be created: {tmp_path / 'cache'} is a file, not a folder",
    )
    assert (tmp_path / "cache").read_text() == "not a folder"


@pytest.mark.skipif(not MODES_OBEYED, reason="root without setpriv ignores file modes")
def test_a_read_only_cache_and_dataset_root(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        _both_refuse(_study(tmp_path), tmp_path, ro, f"$LSBENCH_DATA={ro} is read-only", prefix=AS_USER)
        _both_refuse(
            _study(tmp_path, root=str(ro / "data")),
            tmp_path,
            tmp_path / "unused",
            f"s.yaml: dataset.root: the synthetic data cache {ro / 'data'} cannot be created: {ro} is read-only",
            "choose a dataset.root that can be written",
            prefix=AS_USER,
        )
    finally:
        ro.chmod(0o755)
    assert list(ro.iterdir()) == []


@pytest.mark.skipif(not MODES_OBEYED, reason="root without setpriv ignores file modes")
def test_a_read_only_cache_that_holds_the_set_is_fine(tmp_path):
    from lossscale_bench.data.synthetic import ensure_synthetic

    f = _study(tmp_path)
    cache = tmp_path / "cache"
    ensure_synthetic(cache, train_images=16, val_images=4, image_size=64, seed=0)
    cache.chmod(0o555)
    try:
        r = lsbench("validate", f, cwd=tmp_path, timeout=120, env={"LSBENCH_DATA": str(cache)}, prefix=AS_USER)
    finally:
        cache.chmod(0o755)
    assert r.returncode == 0 and "s.yaml: ok" in r.stdout, r.stderr[-2000:]
