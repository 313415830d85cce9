#!/usr/bin/env bash
# One trial of a study under cProfile on the device machine (where the time of a slow CUDA trial goes):
#   OUT=... STUDY=path.yaml bash benchmarks/gpu_profile_trial.sh
set -u
: "${OUT:?}" "${STUDY:?}"
ROOT=$(cd "$(dirname "$0")/.." && pwd); cd "$ROOT"
export DEPS=/tmp/lsdeps
bash benchmarks/gpu_deps.sh "$DEPS" > "$OUT/pip.log" 2>&1; tail -1 "$OUT/pip.log"
sed "s#root: ../../shared/data/kangaroo#root: $ROOT/shared/data/kangaroo#" "$STUDY" > /tmp/study.yaml
( cd /tmp && PYTHONPATH=$DEPS timeout ${SECONDS_MAX:-240} python3 -m cProfile -o "$OUT/prof.out" -m lossscale_bench.cli \
   run /tmp/study.yaml --executor local \
   --runs-dir /tmp/runs_prof --no-report ) > "$OUT/run.log" 2>&1; echo "rc=$?"
python3 -c "
import pstats; p = pstats.Stats('$OUT/prof.out'); p.sort_stats('cumulative').print_stats(45); p.sort_stats('tottime').print_stats(25)" > "$OUT/prof.txt" 2>&1
tail -3 "$OUT/run.log"
