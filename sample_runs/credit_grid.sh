#!/usr/bin/env bash
# The credit grids (sample_runs/credit.md, sections 13 and 14): one SFT start on a task, then every
# method x seed from it, each run into its own store under runs/, merged into one sample store.
# Runs one after another; `bash sample_runs/make.sh credit_grid` (the lake) and `... credit_corridor`
# call this.
#
#   bash sample_runs/credit_grid.sh                    the whole grid (TASK=lake)
#   TASK=corridor LR=5e-4 STEPS=30 EVAL_EVERY=3 ...    the corridor's grid (section 14)
#   METHODS="grpo ppo" SEEDS="0" bash sample_runs/credit_grid.sh     a part of it
#   STEPS=60 LR=1e-3 EVAL_EVERY=5 bash sample_runs/credit_grid.sh   another RL budget (13b)
#   TOKENS_FOR="" ...                                   keep no token rows in the merged store
#   MERGE=0 ...                                         leave the merge for a later call (two
#                                                       halves of SEEDS may then run at once)
#
# A run whose store already exists is kept (the script can be stopped and started again); the
# merge at the end rebuilds the sample store from every run store present.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
TASK=${TASK:-lake}
DIR=${DIR:-runs/credit_grid}
OUT=${OUT:-sample_runs/credit_grid.duckdb}
STEPS=${STEPS:-16}
SEEDS=${SEEDS-"0 1 2"}
METHODS=${METHODS:-"grpo dr_grpo rloo starpo_s gigpo gigpo_traj ppo prm spa"}
LR=${LR:-3e-3}
G=${G:-8}
EVAL_EVERY=${EVAL_EVERY:-4}
MERGE=${MERGE:-1}
# the runs whose token rows the merged store keeps (Replay's token view), "|"-separated
TOKENS_FOR=${TOKENS_FOR-"$TASK credit start:|gigpo seed 0"}
LORA=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head
case "$TASK" in
    # A 3x3 lake without slips, one move a turn, at most 6 moves, the reward only at the goal
    # (1) or nothing. A fall is decided by one turn's move, the goal by all of them: per-turn
    # credit has something to tell apart. Held-out success greedy (the grid's recorded setting).
    lake) TASK_ARGS=(--env frozenlake --env-options size=3,slip=0,actions_per_turn=1,max_actions=6
                     --max-turns 6 --max-new-tokens 12)
          SFT_STEPS=${SFT_STEPS:-80} ;;
    # Corridors of 4-8 cells, the goal at the right end, Left or Right a turn, the distance plus
    # 4 moves, the reward only at the goal; SFT on coin-flip moves teaches the format only.
    # Held-out success sampled at temperature 1 (32 corridors): greedy would jump 0 -> 1 when
    # Right becomes the likelier move, the sampled rate follows every shift of probability.
    corridor) TASK_ARGS=(--env corridor --env-options size=6,slack=4,expert=uniform
                         --max-turns 14 --max-new-tokens 10 --eval-temperature 1)
              SFT_STEPS=${SFT_STEPS:-30} ;;
    *) echo "unknown TASK $TASK (lake corridor)" >&2; exit 2 ;;
esac
# No KL term for any method (StarPO-S has none by definition; the same for all keeps the budget
# equal and saves the reference pass).
COMMON=("${TASK_ARGS[@]}" --model tiny --lora-targets "$LORA"
        --group-size "$G" --tasks-per-step 2 --lr "$LR" --kl-coef 0 --eval-every "$EVAL_EVERY" --eval-tasks 32
        --eval-seed 0 --threads 1 --quiet --checkpoint-every 1000 --adapter-every 0)

flags() {  # the flags that make METHOD
    case "$1" in
        grpo|dr_grpo|rloo|starpo_s) echo "--algo $1" ;;
        ppo) echo "--algo ppo" ;;
        gigpo) echo "--algo gigpo --gigpo-episode-stats steps" ;;
        gigpo_traj) echo "--algo gigpo --gigpo-episode-stats trajectories" ;;
        prm) echo "--algo grpo --w-prm 1" ;;
        spa) echo "--algo grpo --w-spa 1" ;;
        *) echo "unknown method $1" >&2; return 2 ;;
    esac
}

mkdir -p "$DIR"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
start() {  # the SFT start (KIND: start, or start-ppo: the same SFT with PPO's value head)
    local kind=$1 algo=$2 t0=$SECONDS
    [ -f "$DIR/$kind.duckdb" ] && return 0
    "$PY" -m core.train "${COMMON[@]}" --algo "$algo" --sft-steps "$SFT_STEPS" --sft-lr 5e-3 \
        --steps 0 --seed 0 --name "$TASK credit $kind: SFT $SFT_STEPS" --db "$DIR/$kind.duckdb" \
        --checkpoint-dir "$DIR/ckpt-$kind"
    echo "$kind: $((SECONDS - t0)) s, commit $commit" >&2
}
start start grpo
# PPO's optimizer holds its value head too, so it cannot restore the first start's optimizer
# state ("a parameter group that doesn't match"): PPO goes on from its own SFT start, the same
# SFT steps with the value head beside them (the head gets no SFT gradient)
case " $METHODS " in *" ppo "*) start start-ppo ppo ;; esac
for seed in $SEEDS; do  # every method's seed 0 before any seed 1: a stop leaves whole seeds
    for method in $METHODS; do
        db="$DIR/$method-s$seed.duckdb"
        [ -f "$db" ] && continue
        t0=$SECONDS
        rm -f "$db.part" "$db.part.lock" "$db.part.turn" "$db.part.wal"  # a failed try's
        kind=start; [ "$method" = ppo ] && kind=start-ppo
        ckpt=$(ls -d "$DIR/ckpt-$kind"/*/ | head -1)
        # shellcheck disable=SC2046
        if "$PY" -m core.train "${COMMON[@]}" $(flags "$method") --sft-steps "$SFT_STEPS" \
            --init-from "$ckpt" --steps "$STEPS" --seed "$seed" \
            --name "$TASK credit $method seed $seed" --db "$db.part" \
            --checkpoint-dir "$DIR/ckpt-$method-s$seed"; then
            mv "$db.part" "$db"
            echo "$method seed $seed: $((SECONDS - t0)) s, commit $commit" >&2
        else  # one method failing leaves the others to run; its partial store is not merged
            echo "$method seed $seed: FAILED after $((SECONDS - t0)) s, commit $commit" >&2
        fi
    done
done
[ "$MERGE" = 1 ] || exit 0
rm -f "$OUT" "$OUT".lock "$OUT".turn "$OUT".wal
keep=()
IFS='|' read -ra kinds <<< "$TOKENS_FOR"
for k in "${kinds[@]}"; do [ -n "$k" ] && keep+=(--tokens-for "$k"); done
"$PY" bench/credit_grid.py merge "$DIR"/start*.duckdb $(ls "$DIR"/*-s*.duckdb) --db "$OUT" \
    ${keep[@]+"${keep[@]}"}
"$PY" bench/credit_grid.py table --db "$OUT"
