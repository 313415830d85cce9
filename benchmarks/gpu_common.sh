# Sourced by the device-machine scripts (gpu_session.sh, gpu_census.sh) after setting TAG and
# DEFAULT_SECONDS: checks $OUT, moves to the repository root, starts the clock (the time budget is
# $GPU_SESSION_SECONDS, else DEFAULT_SECONDS), defines `left [reserve]` (seconds left) and `stamp MSG`
# (a timestamped line in $OUT/session.log and on stderr), and writes the device line to $OUT/device.txt.
set -u
: "${OUT:?set OUT to the folder for the results}"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
T0=$(date +%s)
TOTAL=${GPU_SESSION_SECONDS:-$DEFAULT_SECONDS}
left() { echo $(( TOTAL - ($(date +%s) - T0) - ${1:-0} )); }
stamp() { echo "[$TAG] +$(( $(date +%s) - T0 ))s $*" | tee -a "$OUT/session.log" >&2; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  nproc; lscpu | grep -E 'Model name|Flags' | cut -c1-400; date -u; } > "$OUT/device.txt" 2>&1
stamp "device: $(head -1 "$OUT/device.txt")"
