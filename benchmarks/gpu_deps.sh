#!/usr/bin/env bash
# The packages the GPU machine lacks (MLflow, pydantic, pycocotools, ...), from shared/wheels (`make
# gpu-wheels` here; the folder travels with the working tree), installed without dependency resolution
# into the folder $1 (put it on PYTHONPATH), then lossscale_bench itself (its dist-info carries the MLflow
# artifact-repository entry point). The compiled distributions the machine already shares with torch
# (numpy, pandas, ...) are kept as they are: a venv with --system-site-packages did not see the machine's
# numpy or pyyaml (measured), so no venv. Prints "pip: ok" last when everything installed.
# Used by benchmarks/gpu_session.sh and benchmarks/gpu_census.sh; run from the repository root.
set -u
DEPS=${1:?usage: gpu_deps.sh TARGET_DIR}
PIP="python3 -m pip"
$PIP --version || { python3 -m venv /tmp/lspip && PIP="/tmp/lspip/bin/python -m pip"; }
WHEELS=$(python3 - <<'PY'
import importlib.metadata as m, pathlib, re
KEEP = {"numpy", "scipy", "pandas", "pyyaml", "pillow", "matplotlib", "markupsafe", "jinja2", "sympy"}
for w in sorted(pathlib.Path("shared/wheels").glob("*.whl")):
  name = re.sub(r"[-_.]+", "-", w.name.split("-")[0]).lower()
  if name in KEEP:
      try:
          m.version(name)        # the machine has it (compiled, shared with torch): keep its own
          continue
      except m.PackageNotFoundError:
          pass
  print(w)
PY
)
echo "installing: $WHEELS"
$PIP install -q --no-deps --no-index --target $DEPS $WHEELS && \
  $PIP install -q --no-deps --no-index --find-links shared/wheels --target $DEPS . && echo "pip: ok"
