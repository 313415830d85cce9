#!/usr/bin/env bash
# Every GPU measurement in one device call, bounded to fit about 9 minutes of one card.
#
#   make gpu-wheels                       # here: shared/wheels (travels with the working tree)
#   OUT=/some/dir bash benchmarks/gpu_session.sh     # on the GPU machine (the machine's runner sets $OUT)
#
# In order, each step bounded by `timeout`, a failing step never stopping the next ones, every result
# written under $OUT as soon as it exists:
#   0. the device line (nvidia-smi, torch, CUDA, Python);
#   1. in the background (CPU): a venv with the GPU machine's own packages plus shared/wheels, and
#      lossscale_bench installed in it; and rounding_agreement.py (CPU vs CUDA bits of every format);
#   2. gpu_check.py sections $SECTIONS1 (default gdh: g SSD512 batch 8 real-fp16 flush rates, d SSD300,
#      h section a with foreach SGD) within $SECTIONS1_SECONDS (default 135);
#   3. the real CLI on CUDA: `lsbench run studies/gpu_smoke.yaml --executor local`, then
#      `lsbench report --format markdown`;
#   4. gpu_check.py sections $SECTIONS2 (default bcaef: b throughput target, c adaptive target, a, e, f) with
#      what time is left; then everything is packed into $OUT/results.tgz (the tool brings back few files).
TAG=gpu_session DEFAULT_SECONDS=560
source "$(dirname "$0")/gpu_common.sh"

# 1. the packages the GPU machine lacks (CPU, in the background): shared/wheels, less every distribution
# python3 already has among the compiled ones it shares with torch (numpy, pandas, ...), installed without dependency resolution into a folder on PYTHONPATH (measured: a
# venv with --system-site-packages did not see the machine's numpy or pyyaml), then lossscale_bench itself
# (its dist-info carries the MLflow artifact-repository entry point)
DEPS=/tmp/lsdeps
bash benchmarks/gpu_deps.sh "$DEPS" > "$OUT/pip.log" 2>&1 &
PIP_JOB=$!
timeout 150 python3 benchmarks/rounding_agreement.py --out "$OUT/rounding" > "$OUT/rounding.log" 2>&1 &
ROUND=$!

# 2. flush rates (not timing-sensitive, so they may share the card with the rounding check)
S1=${SECTIONS1:-gdh}
stamp "gpu_check $S1"
timeout $(( ${SECTIONS1_SECONDS:-135} + 15 )) python3 benchmarks/gpu_check.py --out "$OUT/check_$S1" --sections "$S1" \
  --budget "${SECTIONS1_SECONDS:-135}" > "$OUT/check_$S1.log" 2>&1
stamp "gpu_check $S1: rc=$?"
wait $PIP_JOB; stamp "packages: $(tail -1 "$OUT/pip.log")"
wait $ROUND; stamp "rounding: rc=$?"

# 3. the real CLI
if grep -q "pip: ok" "$OUT/pip.log"; then
  RUNS=/tmp/gpu_smoke_runs
  stamp "lsbench run gpu_smoke"
  ( cd /tmp && PYTHONPATH=$DEPS timeout ${SMOKE_SECONDS:-200} python3 -c 'import sys; from lossscale_bench.cli import main; sys.exit(main())' \
      run "$ROOT/studies/gpu_smoke.yaml" --executor local --runs-dir "$RUNS" --reports-dir "$OUT/reports" --no-report ) \
      > "$OUT/gpu_smoke_run.log" 2>&1
  stamp "lsbench run: rc=$?"
  ( cd /tmp && PYTHONPATH=$DEPS timeout 60 python3 -c 'import sys; from lossscale_bench.cli import main; sys.exit(main())' \
      report "$ROOT/studies/gpu_smoke.yaml" --runs-dir "$RUNS" --format markdown ) \
      > "$OUT/gpu_smoke_report.md" 2> "$OUT/gpu_smoke_report.err"
  stamp "lsbench report: rc=$?"
else
  stamp "packages not installed: see pip.log"
fi

# 4. the timed sections with what is left
B=$(left 15)
if [ "$B" -gt 30 ]; then
  stamp "gpu_check b c a e f (budget $B s)"
  timeout $((B + 10)) python3 benchmarks/gpu_check.py --out "$OUT/check_${SECTIONS2:-bcaef}" --sections "${SECTIONS2:-bcaef}" \
    --budget "$B" > "$OUT/check_${SECTIONS2:-bcaef}.log" 2>&1
  stamp "gpu_check ${SECTIONS2:-bcaef}: rc=$?"
fi
stamp "done"
# the GPU machine's runner brings back at most 8 files (measured): the text results in one archive beside the
# session log; data caches and plots stay behind (an archive with section e's data cache was too big)
cd "$OUT" && find . -type f \( -name '*.md' -o -name '*.json' -o -name '*.log' -o -name '*.txt' -o -name '*.err' \) \
  ! -name session.log > /tmp/lsbench_results.list && tar czf /tmp/results.tgz -T /tmp/lsbench_results.list && \
  find "$OUT" -mindepth 1 ! -name session.log -delete && cp /tmp/results.tgz "$OUT/results.tgz"
