#!/usr/bin/env bash
# The GPU check, one command: on a machine with CUDA and torch, from a checkout, with no network.
# Runs fla's accuracy test (RMS ratios of its kernels' outputs and gradients against our float64
# references, 4k and 16k, each case's numbers in fla-accuracy.jsonl beside the store, or in OUT),
# the CUDA tests, the core and block grids (bf16, forward+backward, causal and bidirectional,
# 1k-64k tokens; each step a CUDA graph's replay where the case can be captured, as zoo bench's
# --cuda-graphs auto does), the asv CUDA benchmarks, and writes a report folder reports/gpu-<device>-<date>/
# from the store it fills. Optional packages (fla-core; asv and what it needs) travel as wheels in
# .whl/ (README, "On a GPU"): they are installed into a scratch folder, nothing else is touched.
#
#   bash benchmarks/scripts/gpu_check.sh            # everything
#   GRID=quick bash benchmarks/scripts/gpu_check.sh # the grids at 16k and 64k only
#   OUT=/some/folder ...                            # the store there (rows land as they are
#                                                   # measured), and the report folder as a tarball
#   STEPS="attention decode" STEP_LIMIT=120 ...     # some steps, each stopped after 120 s
#   BUDGET=480 ...                                  # seconds for all steps but the report (the
#                                                   # default), shared by weight (budget.sh)
#   CAUSAL=sdpa,local BIDIRECTIONAL=sdpa,nystrom ...# other backends in the grids (DECODE: in
#                                                   # the decoding step)
#
# fla's accuracy comes first (short; it says whether auto may take fla), then the grids (what the
# targets are about), then the tests, asv and the report. Each
# step's time and exit status are printed at the end; a failed step does not stop the others.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    site=$(mktemp -d)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl || exit 2
    export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'gpu_check.sh: no CUDA \
device is visible; run it on a machine with a GPU (the CPU checks: python -m pytest)')" || exit 2

device=$("$PY" -c "import re, torch; n = torch.cuda.get_device_name().lower(); \
m = re.search(r'\b([a-z]+\d{2,4}[a-z]*)\b', n.replace('nvidia', '')); print(m.group(1) if m else 'gpu')")
stamp=$(date +%Y%m%d)
folder="reports/gpu-$device-$stamp"
store=${STORE:-${OUT:+$OUT/gpu-check.sqlite}}
store=${store:-results/gpu-check.sqlite}
mkdir -p "$(dirname "$store")"
case "${GRID:-full}" in
    quick) lengths=16384,65536 ;;
    full) lengths=1024,4096,16384,65536 ;;
    *) echo "GRID must be quick or full, not ${GRID}" >&2; exit 2 ;;
esac

steps_wanted=" ${STEPS:-accuracy attention block decode targets tests asv report} "
wanted() { case "$steps_wanted" in *" ${1%%-*} "*) return 0 ;; *) return 1 ;; esac; }
source benchmarks/scripts/budget.sh
for item in accuracy:3 attention-causal:8 attention-bidirectional:5 block-causal:6 \
    block-bidirectional:4 decode:4 targets:1 tests:5 asv:5; do
    wanted "${item%%:*}" && budget_plan "$item"
done
declare -a steps=()
step() {  # step NAME COMMAND...: run it (if STEPS names its kind) within its share of BUDGET
    local name=$1 start=$SECONDS status limit  # (the report: no limit), record seconds and status
    shift
    wanted "$name" || return
    limit=""
    if [ "$name" != report ]; then budget_limit "$name" && limit=$budget_now; fi
    echo "=== $name${limit:+ (at most ${limit}s)}: $*"
    if [ -n "$limit" ]; then timeout -k 15 "$limit" "$@"; else "$@"; fi
    status=$?
    steps+=("$(printf '%-28s %5ds  exit %d' "$name" $((SECONDS - start)) "$status")")
}

bench() {  # bench TARGET CAUSAL BACKENDS: one grid, a step of its own
    local target=$1 causal=$2 backends=$3 kind
    kind=$([ "$causal" = true ] && echo causal || echo bidirectional)
    local -a options=()
    case ",$backends," in *,lsh,*) options+=(--option lsh.num_hashes=1,4) ;; esac
    case ",$backends," in *,linformer,*) options+=(--option linformer.max_length=65536) ;; esac
    step "$target-$kind" "$PY" -m attention_zoo bench --target "$target" --devices cuda \
        --dtypes bfloat16 --modes forward+backward --batch 1 --heads 4 --head-dim 64 \
        --hidden 256 --lengths "$lengths" --causal "$causal" --backends "$backends" \
        --metrics time,memory,flops --budget 0.2 --repeats 5 --store "$store" \
        --run-id "$target-$kind" --no-progress "${options[@]}"
}

step accuracy env ZOO_ACCURACY_OUT="${OUT:-$(dirname "$store")}" "$PY" -m pytest -v -rA --tb=line \
    -m gpu -p no:cacheprovider tests/test_fla_accuracy.py

causal_backends=${CAUSAL:-sdpa,local,sliding-window,bigbird,lsh,linear,performer,retention,gla,deltanet,gated-deltanet}
bidirectional_backends=${BIDIRECTIONAL:-sdpa,nystrom,linformer,sliding-window,bigbird,linear,performer}
for target in attention block; do
    bench "$target" true "$causal_backends"
    bench "$target" false "$bidirectional_backends"
done
step decode "$PY" -m attention_zoo bench --target attention --devices cuda --dtypes bfloat16 \
    --modes prefill,decode --new-tokens 32 --lengths "$lengths" --causal true \
    --backends "${DECODE:-sdpa,local,sliding-window,lsh,linear,performer,retention,gla,deltanet,gated-deltanet}" --metrics time,memory \
    --budget 0.2 --repeats 5 --store "$store" --run-id decode --no-progress
step targets "$PY" benchmarks/scripts/gpu_targets.py --store "$store"
step tests "$PY" -m pytest -v -rf --tb=line -m gpu -p no:cacheprovider tests/test_kernels.py \
    tests/test_cuda.py tests/test_capture.py tests/test_attention_contract.py tests/test_throughput.py \
    tests/test_recurrence_decay.py tests/test_recurrence_delta.py
step asv "$PY" benchmarks/scripts/record.py --device cuda
step report "$PY" -m attention_zoo report --store "$store" --out "$folder"

echo
echo "GPU check on $("$PY" -c "import torch; print(torch.cuda.get_device_name(), 'torch', torch.__version__)")"
printf '%s\n' "${steps[@]}"
echo "report: $folder"
if [ -n "${OUT:-}" ]; then
    tar czf "$OUT/gpu-report.tgz" "$folder" 2>/dev/null && echo "report folder: $OUT/gpu-report.tgz"
fi
