"""Every ``LSBENCH_*`` environment variable the package reads, with what it does, and how each is parsed.

:data:`ENV_VARS` says what each one means for a user; ``docs/reference/environment.md`` is generated
from it (``tools/gen_reference.py``, which fails when the package reads a variable that has no entry
here). Defaults are the values used when the variable is unset.

The values are parsed here, in one place, and only when they are used (never when a module is
imported: a bad value must not turn ``lsbench validate`` or ``--help`` into a traceback):
:func:`env_flag` for the on/off switches (one vocabulary for all of them), :func:`env_number` for
the numbers, each with the range it allows. A bad value raises :class:`EnvVarError`, one line naming
the variable and what is allowed; ``lsbench validate`` and ``lsbench run`` ask :func:`env_problems`
first, so a run with such a value is refused (exit 2) before any run is opened.
"""

from __future__ import annotations

import os

__all__ = ["ENV_VARS", "FLAG_VARS", "NUMBER_VARS", "EnvVarError", "env_flag", "env_number", "env_problems"]

#: the words an on/off switch takes (any case); empty or unset is off
FLAG_ON = ("1", "true", "yes", "on")
FLAG_OFF = ("0", "false", "no", "off", "")

#: the on/off switches, and what setting one does
FLAG_VARS: dict[str, str] = {
    "LSBENCH_NO_COMPILE": "turns every compiled kernel off",
    "LSBENCH_NO_NATIVE": "turns the C rounding loops off",
    "LSBENCH_SKIP_RESOURCE_CHECK": "skips the check that a node can hold each trial",
}

#: the numbers: variable -> (int or float, the least value allowed, whether that value itself is allowed)
NUMBER_VARS: dict[str, tuple[type, float, bool]] = {
    "LSBENCH_ADDRESS_TIMEOUT_S": (float, 0.0, False),
    "LSBENCH_DALI_THREADS": (int, 1, True),
    "LSBENCH_DECODE_CACHE_MB": (float, 0.0, True),
    "LSBENCH_DIST_END_WAIT_S": (float, 0.0, False),
    "LSBENCH_DIST_TIMEOUT_S": (int, 1, True),
}


class EnvVarError(ValueError):
    """An ``LSBENCH_*`` variable set to a value its reader does not take: a user error (exit 2), one line."""


def env_flag(name: str) -> bool:
    """The on/off switch ``name``: ``1``/``true``/``yes``/``on`` (any case) is True, ``0``/``false``/``no``/
    ``off``, empty or unset is False; anything else raises :class:`EnvVarError`."""
    value = os.environ.get(name, "")
    word = value.strip().lower()
    if word in FLAG_ON:
        return True
    if word in FLAG_OFF:
        return False
    raise EnvVarError(
        f"{name}={value!r} in the environment: allowed: 1, true, yes, on ({FLAG_VARS.get(name, 'on')}) or "
        "0, false, no, off, empty or unset (off, the default); any case"
    )


def _allowed(name: str) -> str:
    kind, least, inclusive = NUMBER_VARS[name]
    what = "a whole number" if kind is int else "a number"
    return f"{what} {'>=' if inclusive else '>'} {least:g}"


def env_number(name: str, default: float):
    """The number in ``name`` (``default`` when unset or empty), of the kind and range :data:`NUMBER_VARS` says;
    anything else raises :class:`EnvVarError`."""
    import math

    kind, least, inclusive = NUMBER_VARS[name]
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value < least or (value == least and not inclusive):
        raise EnvVarError(f"{name}={text!r} in the environment: allowed: {_allowed(name)} (or unset)")
    return value


def env_problems() -> list[str]:
    """One line for each switch or number in the environment set to a value its reader does not take."""
    out = []
    for name in FLAG_VARS:
        try:
            env_flag(name)
        except EnvVarError as exc:
            out.append(str(exc))
    for name in NUMBER_VARS:
        try:
            env_number(name, 0)
        except EnvVarError as exc:
            out.append(str(exc))
    return out


#: variable -> what it does (one paragraph, markdown)
ENV_VARS: dict[str, str] = {
    "LSBENCH_ADDRESS_TIMEOUT_S": "Seconds `lsbench run --address HOST:PORT` waits for a TCP answer from the Ray "
    "head before giving up with one line (default 5; a number > 0); `ray.init` itself would retry "
    "for minutes.",
    "LSBENCH_DALI_THREADS": "Decoding threads of the DALI loader (`loader: dali`); default: the trial's "
    "`resources.cpus_per_trial`, at least 1 (a whole number >= 1).",
    "LSBENCH_DATA": "Folder of the synthetic data cache when the study's `dataset.root` is not given "
    "(default `~/.cache/lossscale_bench`). It must be writable: `validate` and `run` check it "
    "before any work.",
    "LSBENCH_DECODE_CACHE_MB": "Budget in MiB of the in-memory cache of decoded training photos (VOC layouts; "
    "default 512, 0 turns it off; a number >= 0). Cached and uncached reads give the same tensors "
    "bit for bit.",
    "LSBENCH_DIST_END_WAIT_S": "Multi-device trials: seconds rank 0 waits for the other replicas' end records "
    "after it finished (default 120; a number > 0).",
    "LSBENCH_DIST_TIMEOUT_S": "Multi-device trials: the `torch.distributed` collective timeout in seconds "
    "(default 1800; a whole number >= 1); it must exceed rank 0's longest evaluation.",
    "LSBENCH_MALLOC": "Host memory allocator settings of CPU trials: unset, empty or `kept` (the default: glibc "
    "keeps freed memory up to 1 GiB instead of faulting it back in every step) or `system` "
    "(glibc's own defaults). Any other value is refused by `lsbench run` in one line.",
    "LSBENCH_MIRROR": "`lsbench data`: base URL serving the VOC/COCO archives by file name, used instead of "
    "the official sites (the same as `--mirror`, which wins).",
    "LSBENCH_NATIVE_CACHE": "Folder where the C kernels of the emulated formats are built and kept "
    "(default `$XDG_CACHE_HOME` or `~/.cache`, then `lossscale_bench/native`).",
    "LSBENCH_NO_COMPILE": "`1` (or `true`, `yes`, `on`, any case; `0`, `false`, `no`, `off`, empty or unset: off): no `torch.compile` and no C kernels anywhere in the "
    "package; eager kernels, the same values.",
    "LSBENCH_NO_NATIVE": "`1` (or `true`, `yes`, `on`, any case; `0`, `false`, `no`, `off`, empty or unset: off): the emulated formats' C kernels are not used (the "
    "Inductor or eager kernels give the same values).",
    "LSBENCH_RUNS": "Default of `--runs-dir` (the study outputs and the default store `<runs-dir>/mlflow.db`) "
    "for `run`, `report` and `ui`; default `runs`.",
    "LSBENCH_SKIP_RESOURCE_CHECK": "`1` (or `true`, `yes`, `on`, any case; `0`, `false`, `no`, `off`, empty or unset: off): start trials even when no node of the Ray cluster "
    "can hold them now (an autoscaler adds nodes on demand); the same as "
    "`lsbench run --no-resource-check`.",
}
