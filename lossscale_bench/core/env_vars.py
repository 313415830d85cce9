"""Every ``LSBENCH_*`` environment variable the package reads, with what it does: the one list.

The modules that read a variable read it where they need it (a module constant, a call at run
time); this table says what each one means for a user, and ``docs/reference/environment.md`` is
generated from it (``tools/gen_reference.py``, which fails when the package reads a variable that
has no entry here). Defaults are the values used when the variable is unset.
"""

from __future__ import annotations

__all__ = ["ENV_VARS"]

#: variable -> what it does (one paragraph, markdown)
ENV_VARS: dict[str, str] = {
    "LSBENCH_ADDRESS_TIMEOUT_S": "Seconds `lsbench run --address HOST:PORT` waits for a TCP answer from the Ray "
    "head before giving up with one line (default 5); `ray.init` itself would retry "
    "for minutes.",
    "LSBENCH_DALI_THREADS": "Decoding threads of the DALI loader (`loader: dali`); default: the trial's "
    "`resources.cpus_per_trial`, at least 1.",
    "LSBENCH_DATA": "Folder of the synthetic data cache when the study's `dataset.root` is not given "
    "(default `~/.cache/lossscale_bench`). It must be writable: `validate` and `run` check it "
    "before any work.",
    "LSBENCH_DECODE_CACHE_MB": "Budget in MiB of the in-memory cache of decoded training photos (VOC layouts; "
    "default 512, 0 turns it off). Cached and uncached reads give the same tensors "
    "bit for bit.",
    "LSBENCH_DIST_END_WAIT_S": "Multi-device trials: seconds rank 0 waits for the other replicas' end records "
    "after it finished (default 120).",
    "LSBENCH_DIST_TIMEOUT_S": "Multi-device trials: the `torch.distributed` collective timeout in seconds "
    "(default 1800); it must exceed rank 0's longest evaluation.",
    "LSBENCH_MALLOC": "Host memory allocator settings of CPU trials: unset, empty or `kept` (the default: glibc "
    "keeps freed memory up to 1 GiB instead of faulting it back in every step) or `system` "
    "(glibc's own defaults). Any other value is refused by `lsbench run` in one line.",
    "LSBENCH_MIRROR": "`lsbench data`: base URL serving the VOC/COCO archives by file name, used instead of "
    "the official sites (the same as `--mirror`, which wins).",
    "LSBENCH_NATIVE_CACHE": "Folder where the C kernels of the emulated formats are built and kept "
    "(default `$XDG_CACHE_HOME` or `~/.cache`, then `lossscale_bench/native`).",
    "LSBENCH_NO_COMPILE": "`1` (or `true`, `yes`, `on`): no `torch.compile` and no C kernels anywhere in the "
    "package; eager kernels, the same values.",
    "LSBENCH_NO_NATIVE": "`1` (or `true`, `yes`, `on`): the emulated formats' C kernels are not used (the "
    "Inductor or eager kernels give the same values).",
    "LSBENCH_RUNS": "Default of `--runs-dir` (the study outputs and the default store `<runs-dir>/mlflow.db`) "
    "for `run`, `report` and `ui`; default `runs`.",
    "LSBENCH_SKIP_RESOURCE_CHECK": "`1` (or `true`, `yes`): start trials even when no node of the Ray cluster "
    "can hold them now (an autoscaler adds nodes on demand); the same as "
    "`lsbench run --no-resource-check`.",
}
