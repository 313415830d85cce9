#!/usr/bin/env bash
# On a GPU machine, in one device call: the SSD512 census on CUDA at the published batch
# (studies/ssd512_census_cuda.yaml) and, on the machine's spare CPU cores meanwhile, the FP32 plateau
# pilot on the kangaroo photos (studies/kangaroo_fp32_pilot.yaml, one process per seed: the machine has
# no Ray, and the local executor runs one trial at a time).
#
#   make gpu-wheels; mkdir -p shared/data && cp -r ../shared/data/kangaroo shared/data/   # here (both ignored)
#   OUT=/some/dir bash benchmarks/gpu_census.sh                                         # there
#
# Both studies name their photos relative to the checkout's parent (../shared/data/kangaroo); on the
# device machine they travel inside the working tree, so the studies run from copies whose dataset root is
# that absolute path. Each step is bounded by
# `timeout`; the runs folders (MLflow stores, per-layer censuses, plots; never checkpoints) come back in
# $OUT/results.tgz, from which `lsbench report` runs here.
TAG=gpu_census DEFAULT_SECONDS=540
source "$(dirname "$0")/gpu_common.sh"
export DEPS=/tmp/lsdeps
bash benchmarks/gpu_deps.sh "$DEPS" > "$OUT/pip.log" 2>&1
stamp "packages: $(tail -1 "$OUT/pip.log")"
grep -q "pip: ok" "$OUT/pip.log" || exit 1
PHOTOS="$ROOT/shared/data/kangaroo"
[ -d "$PHOTOS/JPEGImages" ] || { stamp "no photos at $PHOTOS"; exit 1; }
mkdir -p /tmp/studies
for f in ssd512_census_cuda kangaroo_fp32_pilot; do
  sed "s#root: ../../shared/data/kangaroo#root: $PHOTOS#" "studies/$f.yaml" > "/tmp/studies/$f.yaml"
done
lsbench() { ( cd /tmp && PYTHONPATH=$DEPS python3 -c 'import sys; from lossscale_bench.cli import main; sys.exit(main())' "$@" ); }

# the pilot: one seed per process, two threads each, on the CPU
PILOT=()
for s in 0 1 2; do
  sed "s/^seeds: .*/seeds: [$s]/" /tmp/studies/kangaroo_fp32_pilot.yaml > /tmp/studies/pilot_s$s.yaml
  ( export OMP_NUM_THREADS=2; timeout $(left 40) bash -c "$(declare -f lsbench); lsbench run /tmp/studies/pilot_s$s.yaml \
      --executor local --runs-dir /tmp/runs_pilot_s$s --no-report" ) > "$OUT/pilot_s$s.log" 2>&1 &
  PILOT+=($!)
done
stamp "pilot started"

# the census on the GPU
stamp "lsbench run ssd512_census_cuda"
timeout $(left 60) bash -c "$(declare -f lsbench); lsbench run /tmp/studies/ssd512_census_cuda.yaml --executor local \
  --runs-dir /tmp/runs_census --no-report" > "$OUT/census_run.log" 2>&1
stamp "census: rc=$?"
lsbench report /tmp/studies/ssd512_census_cuda.yaml --runs-dir /tmp/runs_census --format markdown \
  > "$OUT/census_report.md" 2> "$OUT/census_report.err"
lsbench report /tmp/studies/ssd512_census_cuda.yaml --runs-dir /tmp/runs_census --format markdown --telemetry \
  > "$OUT/census_telemetry.md" 2>> "$OUT/census_report.err"
stamp "census report: rc=$?"
for p in "${PILOT[@]}"; do wait "$p"; done
stamp "pilot done: $(grep -h -c finished "$OUT"/pilot_s*.log | tr '\n' ' ')"
cd /tmp && tar czf /tmp/results.tgz --exclude='*.pt' --exclude='*.pth' --exclude='*.ckpt' --exclude=pid \
  runs_census runs_pilot_s0 runs_pilot_s1 runs_pilot_s2 studies -C "$OUT" . 2>>"$OUT/session.log"
ls -la /tmp/results.tgz >> "$OUT/session.log"
find "$OUT" -mindepth 1 ! -name session.log ! -name device.txt -delete; cp /tmp/results.tgz "$OUT/results.tgz"
stamp "done"
