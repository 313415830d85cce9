#!/usr/bin/env bash
# The per-layer methods' and the telemetry's pace on a GPU, in one device call bounded to about 9 minutes.
#
#   make gpu-wheels                                   # here: shared/wheels (travels with the working tree)
#   OUT=/some/dir bash benchmarks/gpu_pace.sh          # on the GPU machine (the machine's runner sets $OUT)
#
# In order of importance, each step bounded by `timeout`, a failing step never stopping the next ones, every
# result under $OUT as soon as it exists (packed into $OUT/results.tgz at the end):
#   1. in the background (CPU): the packages the machine lacks (gpu_deps.sh);
#   2. gpu_check.py section c: adaptive (update_every 1 and 10) against dynamic scaling, real fp16 autocast,
#      SSD300 batch 32 and SSD512 batch 16, interleaved (targets: <= 1.10x at update_every 10, <= 1.5x at 1);
#   3. benchmarks/trial_cost.py on benchmarks/gpu_pace_ssd512.yaml: SSD512 E4M3 steps through the trial's own
#      code, the census every 10th step ("step mean") against the unlogged steps ("step"; target <= 1.05x);
#   4. benchmarks/trial_start.py on studies/gpu_smoke.yaml's E4M3 row: process start to the first step's
#      record, warm and cold caches (target <= 15 s);
#   5. studies/ssd512_census_cuda.yaml whole with what is left (needs the photos: copy
#      ../shared/data/kangaroo to shared/data/kangaroo here first, as for gpu_census.sh; target: 12 trials).
TAG=gpu_pace DEFAULT_SECONDS=540
source "$(dirname "$0")/gpu_common.sh"
export DEPS=/tmp/lsdeps
bash benchmarks/gpu_deps.sh "$DEPS" > "$OUT/pip.log" 2>&1 &
PIP_JOB=$!

# 2. adaptive against dynamic (no package beyond torch needed)
stamp "gpu_check c"
timeout $(( ${C_SECONDS:-150} + 20 )) python3 benchmarks/gpu_check.py --out "$OUT/check_c" --sections c \
  --budget "${C_SECONDS:-150}" > "$OUT/check_c.log" 2>&1
stamp "gpu_check c: rc=$?"
wait $PIP_JOB; stamp "packages: $(tail -1 "$OUT/pip.log")"
if ! grep -q "pip: ok" "$OUT/pip.log"; then
  stamp "packages not installed (see pip.log): steps 3-5 need them"
else
  export PYTHONPATH=$DEPS
  # 3. the telemetry's cost on the SSD512 E4M3 step
  stamp "trial_cost ssd512 e4m3"
  timeout "${COST_SECONDS:-150}" python3 benchmarks/trial_cost.py --study benchmarks/gpu_pace_ssd512.yaml \
    --iterations 40 --repeats 1 > "$OUT/telemetry_cost.md" 2> "$OUT/telemetry_cost.log"
  stamp "trial_cost: rc=$?"
  # 4. a trial's fixed cost
  stamp "trial_start"
  timeout "${START_SECONDS:-100}" python3 benchmarks/trial_start.py --study studies/gpu_smoke.yaml --row 6 \
    --caches warm cold --repeats 2 > "$OUT/trial_start.md" 2> "$OUT/trial_start.log"
  stamp "trial_start: rc=$?"
  # 5. the census study, whole, with what is left
  PHOTOS="$ROOT/shared/data/kangaroo"
  B=$(left 25)
  if [ ! -d "$PHOTOS/JPEGImages" ]; then
    stamp "no photos at $PHOTOS: census skipped"
  elif [ "$B" -gt 60 ]; then
    mkdir -p /tmp/studies
    sed "s#root: ../../shared/data/kangaroo#root: $PHOTOS#" studies/ssd512_census_cuda.yaml > /tmp/studies/census.yaml
    stamp "census (budget $B s)"
    ( cd /tmp && timeout "$B" python3 -m lossscale_bench.cli run /tmp/studies/census.yaml --executor local \
        --runs-dir /tmp/census_runs --no-report ) > "$OUT/census_run.log" 2>&1
    stamp "census: rc=$? ($(grep -c 'finished' "$OUT/census_run.log") trials finished)"
    ( cd /tmp && timeout 60 python3 -m lossscale_bench.cli report /tmp/studies/census.yaml --runs-dir /tmp/census_runs \
        --format markdown ) > "$OUT/census_report.md" 2> "$OUT/census_report.err"
  fi
fi
stamp "done"
cd "$OUT" && find . -type f \( -name '*.md' -o -name '*.json' -o -name '*.log' -o -name '*.txt' -o -name '*.err' \) \
  ! -name session.log > /tmp/lsbench_results.list && tar czf /tmp/results.tgz -T /tmp/lsbench_results.list && \
  find "$OUT" -mindepth 1 ! -name session.log -delete && cp /tmp/results.tgz "$OUT/results.tgz"
