#!/usr/bin/env bash
# The GPU check, one command: on a machine with CUDA and torch, from a checkout, with no network.
# Compiles every grid case once, in parallel processes (warm: FlexAttention's compiled kernels and
# fla's tuned configurations land in the on-disk caches the later steps read), then times the core
# grids (bf16, forward+backward, causal and bidirectional, 16k and 64k tokens; each step a CUDA
# graph's replay where the case can be captured, as zoo bench's --cuda-graphs auto does) and the
# decoding grid, judges the targets on them, runs fla's accuracy test (RMS ratios of its kernels'
# outputs and gradients against our float64 references, 4k, 16k and 64k, each case's numbers in
# fla-accuracy.jsonl beside the store, or in OUT), the CUDA tests, the block grids, the asv CUDA
# benchmarks, and writes a report folder reports/gpu-<device>-<date>/ from the store it fills.
# Optional packages (fla-core; asv and what it needs) travel as wheels in .whl/ (docs/gpu.md):
# they are installed into a scratch folder, nothing else is touched. A tree without git (a copy)
# records the asv benchmarks from a scratch repository of its files, with one commit.
#
#   bash benchmarks/scripts/gpu_check.sh            # everything
#   GRID=full bash benchmarks/scripts/gpu_check.sh  # the grids at 1k and 4k too
#   OUT=/some/folder ...                            # the store there (rows land as they are
#                                                   # measured), the asv results (asv-results/),
#                                                   # the report folder and the compile caches as
#                                                   # tarballs (the caches' only up to
#                                                   # CACHE_MAX_MIB, default 16)
#   COMPILE_CACHE=compile-cache.tgz ...             # start from an earlier run's compile caches
#   STEPS="attention decode" STEP_LIMIT=120 ...     # some steps, each stopped after 120 s
#   BUDGET=480 ...                                  # seconds from the script's start for all
#                                                   # steps but the report (the default; the
#                                                   # report: at most 40 s), shared by weight
#                                                   # (budget.sh)
#   CAUSAL=sdpa,local BIDIRECTIONAL=sdpa,nystrom ...# other backends in the grids (DECODE: in
#                                                   # the decoding step)
#   WARM_JOBS=8 WARM_LEAST=20 ...                   # processes compiling at once; seconds left
#                                                   # that make a warm-up run worth starting
#   STEPS=tasks BUDGET=500 ...                      # instead: the gpu presets of the niah and
#                                                   # state-tracking reproductions, TASK_WORKERS
#                                                   # (default 8) training runs side by side on
#                                                   # the GPU; their wall times calibrate them
#   STEPS=gate BUDGET=500 ...                       # instead: the CUDA gate's acceptance, an
#                                                   # unchanged commit (exit 0) and a planted
#                                                   # 1.25x slowdown (flagged), one run each
#
# The steps run in the order of what they are for: the grids the targets are set on first, then
# the targets' verdicts, then the rest. Each step's time and exit status are printed as it ends,
# and all of them again at the end; a failed or stopped step does not stop the others.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

given_path=${PYTHONPATH:-}
site=""
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    site=$(mktemp -d)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl || exit 2
fi
export PYTHONPATH="${site:+$site:}$PWD${given_path:+:$given_path}"
"$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'gpu_check.sh: no CUDA \
device is visible; run it on a machine with a GPU (the CPU checks: python -m pytest)')" || exit 2
# without fla the accuracy tests skip (exit 0) and its backends run other kernels: said up front
if ! fla_error=$("$PY" -c "import fla" 2>&1 | tail -n 1); then
    echo "gpu_check.sh: WARNING: fla cannot be imported ($fla_error): fla's accuracy tests will" \
        "skip and its backends run other kernels (fla-core's wheel in .whl/: docs/gpu.md)"
fi

device=$("$PY" -c "import re, torch; n = torch.cuda.get_device_name().lower(); \
m = re.search(r'\b([a-z]+\d{2,4}[a-z]*)\b', n.replace('nvidia', '')); print(m.group(1) if m else 'gpu')")
stamp=$(date +%Y%m%d)
folder="reports/gpu-$device-$stamp"
store=${STORE:-${OUT:+$OUT/gpu-check.sqlite}}
store=${store:-results/gpu-check.sqlite}
mkdir -p "$(dirname "$store")"
case "${GRID:-quick}" in
    quick) lengths=16384,65536 ;;
    full) lengths=1024,4096,16384,65536 ;;
    *) echo "GRID must be quick or full, not ${GRID}" >&2; exit 2 ;;
esac
WARM_JOBS=${WARM_JOBS:-8}
WARM_LEAST=${WARM_LEAST:-20}  # seconds left that make a warm-up run worth starting (an import, a compile)
for var in WARM_JOBS WARM_LEAST; do
    case "${!var}" in
        "" | *[!0-9]* | 0) echo "$var must be a whole number of at least 1, not '${!var}'" >&2; exit 2 ;;
    esac
done
# OUT may be copied back with a limit on each file's size: a larger cache tarball is dropped
# rather than left to fail the copy
CACHE_MAX_MIB=${CACHE_MAX_MIB:-16}
case "$CACHE_MAX_MIB" in
    "" | *[!0-9]*) echo "CACHE_MAX_MIB must be whole MiB, not '$CACHE_MAX_MIB'" >&2; exit 2 ;;
esac
trap 'kill $(jobs -p) 2>/dev/null' EXIT  # warm-up runs do not outlive the check
# tuned configurations on disk: fla's kernels are tuned once, not again in every process
export TRITON_CACHE_AUTOTUNING=${TRITON_CACHE_AUTOTUNING:-1}
# the compile caches in one folder, so that a run can hand them to the next on a machine of the
# same kind (COMPILE_CACHE: a tarball an earlier run left in its OUT); keys that do not match
# (another torch, another GPU) are misses, not errors
cache_root=$(mktemp -d)
export TORCHINDUCTOR_CACHE_DIR=$cache_root/inductor TRITON_CACHE_DIR=$cache_root/triton
if [ -n "${COMPILE_CACHE:-}" ]; then
    if tar xzf "$COMPILE_CACHE" -C "$cache_root" 2>/dev/null; then
        echo "compile caches from $COMPILE_CACHE"
    else
        echo "gpu_check.sh: could not unpack COMPILE_CACHE=$COMPILE_CACHE; starting cold" >&2
    fi
fi

steps_wanted=" ${STEPS:-warm attention decode targets accuracy tests block asv report} "
wanted() { case "$steps_wanted" in *" ${1%%-*} "*) return 0 ;; *) return 1 ;; esac; }
BUDGET_START=0  # the budget counts from the script's start: the setup above is part of it
source benchmarks/scripts/budget.sh
for item in warm:8 attention-causal:6 attention-bidirectional:3 decode:3 targets:1 accuracy:3 \
    tests:4 block-causal:3 block-bidirectional:2 asv:3 gate:1 tasks-niah:1 tasks-state:1; do
    wanted "${item%%:*}" && budget_plan "$item"
done
REPORT_LIMIT=40  # the report's own seconds, outside BUDGET: a stuck report loses no tarball
declare -a steps=()
step() {  # step NAME COMMAND...: run it (if STEPS names its kind) within its share of BUDGET
    local name=$1 start=$SECONDS status limit line  # (the report: REPORT_LIMIT; a function of
    shift  # this script: it keeps to budget_now itself), print and record seconds and status
    wanted "$name" || return
    limit=$REPORT_LIMIT
    if [ "$name" != report ]; then budget_limit "$name" && limit=$budget_now; fi
    echo "=== $name (at most ${limit}s): $*"
    if ! declare -F "$1" >/dev/null; then
        timeout -k 15 "$limit" "$@"
    else
        "$@"
    fi
    status=$?
    line=$(printf '%-28s %5ds  exit %d' "$name" $((SECONDS - start)) "$status")
    steps+=("$line")
    echo "=== $line"
}

causal_backends=${CAUSAL:-sdpa,local,sliding-window,bigbird,lsh,linear,performer,retention,gla,deltanet,gated-deltanet,moba,nsa}
bidirectional_backends=${BIDIRECTIONAL:-sdpa,nystrom,linformer,sliding-window,bigbird,linear,performer}
# the decoding targets' backends first (gpu_targets.py's DECODERS), timed before a stop
decode_backends=${DECODE:-sdpa,linear,performer,local,sliding-window,lsh,retention,gla,deltanet,gated-deltanet}

grid() {  # grid TARGET CAUSAL BACKENDS: one grid's zoo bench command, in the array `command`
    local target=$1 causal=$2 backends=$3  # (no time-limit preflight: the step has its limit)
    command=("$PY" -m attention_zoo bench --target "$target" --devices cuda --dtypes bfloat16
        --modes forward+backward --batch 1 --heads 4 --head-dim 64 --hidden 256
        --lengths "$lengths" --causal "$causal" --backends "$backends" --time-limit none
        --no-progress)
    case ",$backends," in *,lsh,*) command+=(--option lsh.num_hashes=1,4) ;; esac
    case ",$backends," in *,linformer,*) command+=(--option linformer.max_length=65536) ;; esac
}

decode_grid() {  # decode_grid BACKENDS: the decoding grid's command, in the array `command`
    command=("$PY" -m attention_zoo bench --target attention --devices cuda --dtypes bfloat16
        --modes prefill,decode --new-tokens 32 --lengths "$lengths" --causal true
        --backends "$1" --time-limit none --no-progress)
}

bench() {  # bench TARGET CAUSAL BACKENDS: one grid timed into the store, a step of its own
    local target=$1 causal=$2 kind
    kind=$([ "$causal" = true ] && echo causal || echo bidirectional)
    grid "$target" "$causal" "$3"
    step "$target-$kind" "${command[@]}" --metrics time,memory,flops --budget 0.2 --repeats 5 \
        --store "$store" --run-id "$target-$kind"
}

needs_warming() {  # needs_warming TARGET:CAUSAL:BACKENDS ...: "TARGET CAUSAL NAME compile" or
    # "... tune" for each backend whose implementation auto picks on this GPU is compiled
    # (FlexAttention, torch.compile) or tuned (fla's Triton kernels); the others have nothing to warm
    "$PY" -c '
import sys, torch
from attention_zoo import build_attention
from attention_zoo.attention.dispatch import Call
kinds = {"flex": "compile", "compiled": "compile", "fla": "tune"}
for grid in sys.argv[1:]:
    target, causal, names = grid.split(":")
    for name in names.split(","):
        try:
            core = build_attention(name, causal=causal == "true", device="cuda")
            picked = core.pick(Call("cuda", torch.bfloat16, 16384, 64)).name
        except Exception:
            continue
        if picked in kinds:
            print(target, causal, name, kinds[picked])
' "$@"
}

warm_run() {  # warm_run SPEC N END: one grid ("attention CAUSAL NAME" or "decode true NAME") run
    # once, untimed and uncaptured, until SECONDS reaches END; its exit status in $scratch/N.status
    local target causal b
    read -r target causal b <<<"$1"
    if [ "$target" = decode ]; then decode_grid "$b"; else grid "$target" "$causal" "$b"; fi
    timeout -k 5 $(($3 - SECONDS)) "${command[@]}" --metrics time --budget 0 --repeats 1 \
        --cuda-graphs off --store "$scratch/$2.sqlite" --run-id warm >"$scratch/$2.log" 2>&1
    echo $? >"$scratch/$2.status"
}

warm() {  # the grids of the backends that compile, WARM_JOBS processes at a time, then those
    # that tune one after another (tuning times its candidates: alone on the GPU), within
    # budget_now: what they compile and tune lands in the on-disk caches the timed steps read.
    # The decoding grids are warmed too: their prefill runs the forward without autograd (another
    # compiled graph, a Flex kernel without the log-sum-exp) and their steps run the state's own
    # kernels, none of which the timed attention grids compile
    local start=$SECONDS
    deadline=$((start + budget_now))
    scratch=$(mktemp -d)
    local -a compile=() tune=() specs=()
    local target causal b kind n=0 i spec status ran=0 stopped=0 failed=0 compiled=$deadline
    while read -r target causal b kind; do
        [ "$kind" = tune ] && tune+=("$target $causal $b") || compile+=("$target $causal $b")
    done < <(needs_warming "attention:true:$causal_backends" \
        "attention:false:$bidirectional_backends" "decode:true:$decode_backends")
    # compiling could take the whole share: it ends at 60% of it where grids wait to be tuned
    [ ${#tune[@]} -gt 0 ] && compiled=$((start + budget_now * 3 / 5))
    for spec in ${compile[@]+"${compile[@]}"}; do
        while [ "$(jobs -rp | wc -l)" -ge "$WARM_JOBS" ]; do wait -n; done
        [ $((compiled - SECONDS)) -ge "$WARM_LEAST" ] || break
        n=$((n + 1))
        specs[n]=$spec
        warm_run "$spec" "$n" "$compiled" &
    done
    wait
    for spec in ${tune[@]+"${tune[@]}"}; do
        [ $((deadline - SECONDS)) -ge "$WARM_LEAST" ] || break
        n=$((n + 1))
        specs[n]=$spec
        warm_run "$spec" "$n" "$deadline"
    done
    for ((i = 1; i <= n; i++)); do
        status=$(cat "$scratch/$i.status" 2>/dev/null)
        case $status in
            0) ran=$((ran + 1)); continue ;;
            124 | 137) stopped=$((stopped + 1)); echo "warm: ${specs[i]}: stopped at the limit" ;;
            *) failed=$((failed + 1)); echo "warm: ${specs[i]}: failed (exit ${status:-unknown})" ;;
        esac
        tail -n 5 "$scratch/$i.log" 2>/dev/null | sed 's/^/    /'
    done
    echo "warm: ${#compile[@]} grids to compile, ${#tune[@]} to tune: $ran ran, $stopped stopped" \
        "at the limit, $failed failed, $(( ${#compile[@]} + ${#tune[@]} - n )) not started"
    rm -rf "$scratch"
    [ "$failed" -eq 0 ]
}

step warm warm
bench attention true "$causal_backends"
bench attention false "$bidirectional_backends"
decode_grid "$decode_backends"
step decode "${command[@]}" --metrics time,memory --budget 0.2 --repeats 5 --store "$store" \
    --run-id decode
step targets "$PY" benchmarks/scripts/gpu_targets.py --store "$store"
# four test processes: pyproject's -n auto would start one a core, each with its CUDA context
step accuracy env ZOO_ACCURACY_OUT="${OUT:-$(dirname "$store")}" "$PY" -m pytest -n 4 -v -rA \
    --tb=line -m gpu -p no:cacheprovider tests/test_fla_accuracy.py
# the CUDA tests but those marked slow (each compiles shapes no grid warmed): GPU_TESTS="gpu"
# runs them all (minutes: a run of its own, STEPS=tests)
step tests "$PY" -m pytest -n 4 -v -rf --tb=line -m "${GPU_TESTS:-gpu and not slow}" \
    -p no:cacheprovider tests/test_kernels.py \
    tests/test_cuda.py tests/test_capture.py tests/test_attention_contract.py tests/test_throughput.py \
    tests/test_recurrence_decay.py tests/test_recurrence_delta.py
bench block true "$causal_backends"
bench block false "$bidirectional_backends"
scratch_repository() {  # scratch_repository WHAT: a one-commit git repository of this tree's
    # files in $repo (what .gitignore leaves out left out), for a script that needs a commit in a
    # tree without git (a copy); says why not and fails where none can be made
    if ! command -v git >/dev/null; then
        echo "$1: skipped: it needs a git commit, and this tree has no git repository and no git" \
            "to make one"
        return 1
    fi
    repo=$(mktemp -d)
    # git add reads this tree (its .gitignore too) and writes only into the scratch repository
    if ! { git -c init.defaultBranch=main init -q "$repo" &&
        git --git-dir="$repo/.git" --work-tree=. add -A &&
        git -C "$repo" -c user.name=gpu_check.sh -c user.email=gpu-check@localhost \
            -c commit.gpgsign=false commit -q --no-verify -m "scratch commit of a copied tree" &&
        git -C "$repo" reset -q --hard; }; then
        echo "$1: skipped: this tree has no git repository, and a scratch one could not be made"
        rm -rf "$repo"
        return 1
    fi
}
left() { echo $((budget_now - (SECONDS - $1) > 1 ? budget_now - (SECONDS - $1) : 1)); }
asv_record() {  # the asv CUDA benchmarks (record.py) within budget_now, their results in
    # OUT/asv-results when OUT is set. record.py records a commit: a tree without git (a copy)
    # is committed once into a scratch repository, which record.py then runs from
    local start=$SECONDS repo status
    local -a results=()
    [ -n "${OUT:-}" ] && results=(--results-dir "$OUT/asv-results")
    if git rev-parse -q --verify HEAD >/dev/null 2>&1; then
        timeout -k 15 "$budget_now" "$PY" benchmarks/scripts/record.py --device cuda \
            ${results[@]+"${results[@]}"}
        return
    fi
    scratch_repository asv || return 1
    [ ${#results[@]} -gt 0 ] || results=(--results-dir "$PWD/reports/asv-results")
    echo "asv: no git repository here: recording from a scratch repository of this tree's files," \
        "one commit ($(git -C "$repo" rev-parse --short HEAD), in no project history), results" \
        "in ${results[1]}"
    PYTHONPATH="${site:+$site:}$repo${given_path:+:$given_path}" timeout -k 15 "$(left "$start")" \
        "$PY" "$repo/benchmarks/scripts/record.py" --device cuda "${results[@]}"
    status=$?
    rm -rf "$repo"
    return "$status"
}
gate_acceptance() {  # the CUDA gate's two acceptance runs within budget_now: an unchanged commit
    # passes, a planted 1.25x slowdown of the local core is flagged (acceptance.py clones HEAD:
    # a tree without git runs it from a scratch repository); every gate run's output in OUT
    local start=$SECONDS repo="$PWD" status
    local log="${OUT:-$(dirname "$store")}/gate-acceptance.log"
    if ! git rev-parse -q --verify HEAD >/dev/null 2>&1; then
        scratch_repository gate || return 1
    fi
    PYTHONPATH="${site:+$site:}$repo${given_path:+:$given_path}" timeout -k 15 "$(left "$start")" \
        "$PY" "$repo/benchmarks/scripts/acceptance.py" --device cuda --runs 1 \
        --scenario unchanged --scenario slowdown --slowdown 1.25 --log "$log"
    status=$?
    [ "$repo" = "$PWD" ] || rm -rf "$repo"
    return "$status"
}

step asv asv_record
step gate gate_acceptance  # only with STEPS=gate: not part of the check (minutes a run)
for reproduction in niah state-tracking; do  # only with STEPS=tasks: not part of the check
    step "tasks-${reproduction%%-*}" "$PY" -m attention_zoo reproduce "$reproduction" --preset gpu \
        --threads 1 --executor processes --workers "${TASK_WORKERS:-8}" --store "$store" --no-progress
done
step report "$PY" -m attention_zoo report --store "$store" --out "$folder"
if [ -n "${OUT:-}" ] && [ -d "$folder" ]; then  # the report's tarball first, the caches' last
    tar czf "$OUT/gpu-report.tgz" "$folder" && echo "report folder: $OUT/gpu-report.tgz"
fi

echo
echo "GPU check on $("$PY" -c "import torch; print(torch.cuda.get_device_name(), 'torch', torch.__version__)")"
printf '%s\n' ${steps[@]+"${steps[@]}"}
echo "report: $folder"
if [ -n "${OUT:-}" ]; then
    [ -d "$OUT/asv-results" ] && echo "asv results: $OUT/asv-results"
    mkdir -p "$TORCHINDUCTOR_CACHE_DIR" "$TRITON_CACHE_DIR"
    if tar czf "$OUT/compile-cache.tgz" -C "$cache_root" inductor triton; then
        size=$(stat -c %s "$OUT/compile-cache.tgz")
        if [ "$size" -le $((CACHE_MAX_MIB * 1024 * 1024)) ]; then
            echo "compile caches: $OUT/compile-cache.tgz ($(du -h "$OUT/compile-cache.tgz" |
                cut -f1); COMPILE_CACHE=it for the next run)"
        else
            rm -f "$OUT/compile-cache.tgz"
            echo "compile caches: not kept: their tarball has $((size / 1024)) KiB, more than" \
                "CACHE_MAX_MIB=$CACHE_MAX_MIB"
        fi
    fi
fi
