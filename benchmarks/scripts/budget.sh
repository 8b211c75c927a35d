# The GPU check's time budget, sourced by gpu_check.sh: BUDGET seconds for every step but the
# report, shared by weight among the steps still to run, so what a quick step leaves goes to the
# later ones and a slow one is stopped (timeout) with its rows already stored.
#
#   budget_plan NAME:WEIGHT ...   the steps to run, in order, with their weights
#   budget_limit NAME             sets budget_now to the seconds NAME may take now (at least
#                                 BUDGET_FLOOR; STEP_LIMIT, when set, caps it); NAME leaves the
#                                 plan (call it directly, not in $(...): the plan is kept here)
#
# BUDGET counts from BUDGET_START (a value of SECONDS; default: when this file is sourced).

BUDGET=${BUDGET:-480}
BUDGET_FLOOR=${BUDGET_FLOOR:-10}
BUDGET_START=${BUDGET_START:-$SECONDS}
for budget_var in BUDGET BUDGET_FLOOR STEP_LIMIT; do
    case "${!budget_var:-0}" in
        *[!0-9]*)
            echo "budget.sh: $budget_var must be whole seconds, not '${!budget_var}'" >&2
            exit 2
            ;;
    esac
done
declare -a budget_names=() budget_weights=()

budget_plan() {
    local item
    for item in "$@"; do
        budget_names+=("${item%%:*}")
        budget_weights+=("${item##*:}")
    done
}

budget_limit() {
    local name=$1 i total=0 weight="" left limit
    local -a names=() weights=()
    for i in "${!budget_names[@]}"; do
        total=$((total + budget_weights[i]))
        if [ "${budget_names[i]}" = "$name" ]; then
            weight=${budget_weights[i]}
        else
            names+=("${budget_names[i]}")
            weights+=("${budget_weights[i]}")
        fi
    done
    budget_names=(${names[@]+"${names[@]}"})
    budget_weights=(${weights[@]+"${weights[@]}"})
    if [ -z "$weight" ]; then
        echo "budget.sh: step $name is not in the plan (budget_plan): it gets the floor" >&2
        weight=0
    fi
    left=$((BUDGET - (SECONDS - BUDGET_START)))
    limit=$((total > 0 ? left * weight / total : left))
    [ "$limit" -lt "$BUDGET_FLOOR" ] && limit=$BUDGET_FLOOR
    [ -n "${STEP_LIMIT:-}" ] && [ "$STEP_LIMIT" -lt "$limit" ] && limit=$STEP_LIMIT
    budget_now=$limit
}
