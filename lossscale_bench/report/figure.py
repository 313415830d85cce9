"""matplotlib without pyplot: a figure on its own Agg canvas, its PNG bytes, and the error when there is none.

matplotlib is imported inside :func:`new_figure` (``lsbench --help`` and the table-only report do not pay
for it) and never through ``pyplot``: no global state, backend switch or open-figure list is touched.
:func:`quiet_numerics` silences the overflow warnings of a diverged run's values; :func:`slug` names files.
"""

from __future__ import annotations

import io
import math
import re

import numpy as np

__all__ = ["DPI", "PlotError", "quiet_numerics", "new_figure", "png_bytes", "panel_grid", "slug"]

DPI = 100


class PlotError(Exception):
    """Plots cannot be produced (e.g. matplotlib missing); one line for the user."""


# --------------------------------------------------------------------------
# matplotlib plumbing (no pyplot)


def quiet_numerics(fn):
    """Run a plotting function with numpy's and matplotlib's overflow warnings off.

    Why: a diverged or refused run can log a scale near or past float range (1e300 seen in a store);
    ``exp2`` of a mean log2 and matplotlib's autoscaling then overflow to inf, which only means the
    line leaves the axes. The warnings were the only library lines left on the terminal after a run;
    the figure is the same with or without them."""
    import functools
    import warnings

    @functools.wraps(fn)
    def quiet(*args, **kwargs):
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return fn(*args, **kwargs)

    return quiet


def new_figure(width: float, height: float):
    """An empty ``width`` x ``height`` inch figure (constrained layout) on its own Agg canvas."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:  # pragma: no cover - matplotlib is a dependency
        raise PlotError(f"matplotlib is not installed ({e}); install it or turn plots off") from None
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig) -> bytes:
    """``fig`` as PNG bytes (no timestamp or software tag, so equal figures give equal bytes); clears it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    fig.clear()
    return buf.getvalue()


def panel_grid(n: int, panel_w: float = 6.4, panel_h: float = 3.6, ncols_max: int = 2):
    """``(figure, axes)``: ``n`` panels of ``panel_w`` x ``panel_h`` inches, at most ``ncols_max`` a row."""
    ncols = max(1, min(ncols_max, n))
    nrows = max(1, math.ceil(n / ncols))
    fig = new_figure(panel_w * ncols, panel_h * nrows)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def slug(text: str) -> str:
    """'loss scale (dynamic, interval=10)' -> 'loss_scale_dynamic_interval_10'."""
    s = re.sub(r"[^A-Za-z0-9]+", "_", str(text)).strip("_").lower()
    return s or "x"
