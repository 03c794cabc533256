#!/usr/bin/env bash
# The GPU check: everything detaudit verifies on a CUDA machine, in one command.
#
#   bash scripts/gpu-check.sh [RESULTS_DIR]        (default: $OUT if set, else gpu-results/)
#
# 1. records the machine (nvidia-smi, torch, CUDA, cuDNN) in RESULTS_DIR/env.txt;
# 2. makes detaudit importable: an editable install when pip can do it offline, else PYTHONPATH
#    (GPU machines often have no network; torch with CUDA, numpy, click, rich, xxhash, pytest and
#    hypothesis must already be there, or be carried as wheels in ./wheels/: checked first);
# 3. runs the CUDA suite (`pytest -m cuda tests/gpu`), then the CPU suite's cause matrix and
#    end-to-end cause and op-localisation tests, which on a GPU machine run their scripts on CUDA;
# 4. runs `benchmarks/run.py --cuda --quick` (or the full CUDA table with GPU_CHECK_FULL_BENCH=1);
# 5. writes RESULTS_DIR/summary.txt and exits non-zero if any test failed.
# GPU_CHECK_STAGES (default "cuda,e2e,bench") picks stages: a device lease is short, so a session
# may split them over two calls. Tests run GPU_CHECK_WORKERS (default 4) at a time when pytest-xdist
# is installed.
set -uo pipefail
cd "$(dirname "$0")/.."
results=${1:-${OUT:-gpu-results}}
mkdir -p "$results"
results=$(cd "$results" && pwd)
py=${PYTHON:-python3}
started=$(date +%s)
stages=",${GPU_CHECK_STAGES:-cuda,e2e,bench},"
tmp=$(mktemp -d)

{
  date -u +"%Y-%m-%d %H:%M UTC"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  "$py" -c 'import sys, torch; print("python", sys.version.split()[0]); print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version()); print("device", torch.cuda.get_device_name() if torch.cuda.is_available() else "NONE")'
} > "$results/env.txt" 2>&1
cat "$results/env.txt"

missing=$("$py" - <<'PY'
import importlib.util
print(" ".join(m for m in ("torch", "numpy", "click", "rich", "xxhash", "pytest", "hypothesis")
               if importlib.util.find_spec(m) is None))
PY
)
if [ -n "$missing" ]; then
  if [ -d wheels ]; then
    "$py" -m pip install --quiet --no-index --find-links wheels $missing
  else
    echo "gpu-check: missing Python packages: $missing (carry them as wheels in ./wheels/)" >&2
    exit 2
  fi
fi
if ! "$py" -m pip install --quiet --no-deps --no-build-isolation --no-index -e . >"$tmp/install.txt" 2>&1; then
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  echo "gpu-check: editable install not possible offline; using PYTHONPATH=$PWD"
fi
parallel=()
"$py" -c "import xdist" 2>/dev/null && parallel=(-n "${GPU_CHECK_WORKERS:-4}")

status=0
if [[ $stages == *,cuda,* ]]; then
  "$py" -m pytest -m cuda tests/gpu "${parallel[@]}" -v -rA -p no:cacheprovider --durations=0 --basetemp="$tmp/cuda" \
    --junitxml="$results/cuda-junit.xml" >"$results/pytest-cuda.txt" 2>&1 || status=1
  tail -n 40 "$results/pytest-cuda.txt"
fi
if [[ $stages == *,e2e,* ]]; then
  "$py" -m pytest tests/e2e/test_cause_matrix.py tests/e2e/test_e2e_causes.py tests/e2e/test_e2e_ops.py "${parallel[@]}" -q -rA -p no:cacheprovider \
    --basetemp="$tmp/e2e" >"$results/pytest-e2e-on-cuda.txt" 2>&1 || status=1
  tail -n 15 "$results/pytest-e2e-on-cuda.txt"
fi
# the reports of every audit the tests ran (no traces): enough to see why a test failed
(cd "$tmp" && find . \( -name '*.json' -o -name '*.stdout' -o -name '*.stderr' \) -size -2M -print0 \
  | tar --null -czf "$results/test-runs.tgz" -T - 2>/dev/null)

if [[ $stages == *,bench,* ]]; then
  bench=(--cuda --quick)
  [ "${GPU_CHECK_FULL_BENCH:-0}" = 1 ] && bench=(--cuda)
  "$py" benchmarks/run.py "${bench[@]}" >"$results/bench-cuda.txt" 2>&1 || status=1
  tail -n 25 "$results/bench-cuda.txt"
  cp benchmarks/results/cuda-*.json "$results/" 2>/dev/null
fi

{
  cat "$results/env.txt"
  echo "stages: $stages"
  echo "cuda suite:      $(tail -n 1 "$results/pytest-cuda.txt" 2>/dev/null)"
  echo "e2e on cuda:     $(tail -n 1 "$results/pytest-e2e-on-cuda.txt" 2>/dev/null)"
  echo "benchmark table: $results/bench-cuda.txt"
  echo "took $(( $(date +%s) - started )) s; exit $status"
} > "$results/summary.txt"
cat "$results/summary.txt"
rm -rf "$tmp"
exit $status
