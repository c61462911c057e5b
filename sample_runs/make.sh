#!/usr/bin/env bash
# Regenerate the sample runs in sample_runs/ with this project's own trainer and importer.
#
#   bash sample_runs/make.sh            every run below (about 42 minutes on 2 CPU cores)
#   bash sample_runs/make.sh spike      only the named ones: collapse spike apps careless credit
#                                       import branches inspect shortcut search (careless: only the
#                                       imported run of apps_tiny; inspect: needs inspect-ai;
#                                       search, search_sft, search_credit: SmolLM2, an hour or
#                                       more each, mismatch: SmolLM2, about 25 minutes, and
#                                       credit_grid: 29 tiny runs, an hour or more, and
#                                       credit_grid_long: its 60-step grid, about 70 minutes;
#                                       credit_corridor: the grid on the corridor, about 45
#                                       minutes; never by default)
#
# Each store is rebuilt from scratch (the old file is removed first). Checkpoints go under runs/
# (ignored by git), never next to the stores. Every command is the one sample_runs/README.md
# quotes; the README gives each run's seed and measured wall time.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=sample_runs
CKPT=runs/sample-checkpoints
# The tiny model is a random network whose output layer alone decides that every token is
# equally likely; adapting lm_head too lets a short SFT teach it the answer format.
LORA=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head
TRAIN=("$PY" -m core.train --model tiny --lora-targets "$LORA" --threads 1 --quiet
       --checkpoint-every 1000)  # a checkpoint at the end only: these runs are not resumed

fresh() {  # remove a store (and its lock files) before recording it again
    rm -f "$OUT/$1" "$OUT/$1".lock "$OUT/$1".turn "$OUT/$1".wal
}

compact() {  # rewrite a finished store with small blocks (about 7x smaller in git)
    "$PY" -m storage.compact "$OUT/$1"
}

ship_adapters() {  # copy the snapshots a store's branch jobs used next to it (DB RUN CKPT_DIR)
    local step
    for step in $("$PY" -c "from storage import turn_queries as t; import sys
print(*t.branch_snapshots(sys.argv[1], sys.argv[2]))" "$1" "$2"); do
        mkdir -p "$OUT/checkpoints/$2/adapters"
        cp "$3/$2/adapters/step-$step.pt" "$OUT/checkpoints/$2/adapters/"
    done
}

timed() {  # run a command, print its wall time
    local t0=$SECONDS
    "$@"
    echo "    ($((SECONDS - t0)) s) $*" >&2
}

# -- 2. reward variance and collapse: the same bandit tasks, GRPO vs StarPO-S vs Dr.GRPO ---------
# The workshop-demo preset (SFT on a coin-flipping expert's demos teaches the answer format) with
# 50 SFT steps instead of 30, after which this seed already pulls the better arm (Dragon) 3 times
# in 4, and a gentler RL learning rate (5e-4) so the drift is visible over 30 steps. The arms'
# payouts are drawn per task and episode seed, so all three runs see the same luck. GRPO divides
# by each group's reward std: in a group where no Dragon pull pays out, the safe arm's 0.1 is the
# best reward and the small std magnifies it, so GRPO drifts to the safe arm until every group is
# identical (std 0, no gradient). StarPO-S keeps only the groups with the largest spread (the ones
# where Dragon paid), Dr.GRPO does not divide by the std: both learn Dragon. No KL term anywhere.
collapse() {
    fresh collapse_bandit.duckdb
    local common=(--preset workshop-demo --sft-steps 50 --lr 5e-4 --steps 30 --eval-every 5
                  --kl-coef 0 --seed 0 --threads 1 --quiet --checkpoint-every 1000
                  --db "$OUT/collapse_bandit.duckdb")
    local algo
    for algo in grpo starpo_s dr_grpo; do
        timed "$PY" -m core.train "${common[@]}" --algo "$algo" --name "bandit-$algo" \
            --checkpoint-dir "$CKPT/collapse-$algo"
    done
    compact collapse_bandit.duckdb
}

# -- 3. a gradient spike traced to its trajectories ----------------------------------------------
spike() {
    fresh spike_frozenlake.duckdb
    timed "${TRAIN[@]}" --env frozenlake --algo grpo --group-size 8 --tasks-per-step 1 \
        --max-turns 4 --max-new-tokens 24 --sft-steps 20 --sft-lr 5e-3 --steps 12 --lr 1e-4 \
        --eval-every 0 --seed 1 --name "frozenlake-grpo-spike" \
        --db "$OUT/spike_frozenlake.duckdb" --checkpoint-dir "$CKPT/spike"
    compact spike_frozenlake.duckdb
}

# -- 4. the apps world: SFT on the scripted expert, then a short RL phase --------------------------
# then a careless rule agent's episodes of the same world, imported beside it (careless below)
apps() {
    fresh apps_tiny.duckdb
    timed "${TRAIN[@]}" --preset apps-tiny --sft-steps 16 --sft-batch-size 2 --sft-lr 5e-3 \
        --steps 2 --eval-every 0 --seed 0 --name "apps-tiny-sft-grpo" --db "$OUT/apps_tiny.duckdb" \
        --checkpoint-dir "$CKPT/apps"
    careless
}

# -- 4b. the careless agent: collateral damage and unmet state tests, graded by the env's tests ---
# Imported into the apps store as its own run; --replace makes a rerun rewrite it in place, so
# `make.sh careless` refreshes this run without retraining the one beside it.
careless() {
    mkdir -p runs
    timed "$PY" sample_runs/agents/careless_apps.py --out runs/careless_apps.jsonl \
        --tasks 16 --rollouts 2 --steps 2 --slip-rate 0.5 --seed 0
    timed "$PY" -m storage.io import runs/careless_apps.jsonl --format jsonl \
        --db "$OUT/apps_tiny.duckdb" --run-id careless-apps \
        --run-name "careless rule agent (imported JSONL)" --replace
    compact apps_tiny.duckdb
}

# -- 5. credit assignment: GiGPO on multi-turn FrozenLake (identical states recur) -------------
credit() {
    fresh credit_gigpo.duckdb
    timed "${TRAIN[@]}" --env frozenlake --algo gigpo --group-size 8 --tasks-per-step 2 \
        --max-turns 4 --max-new-tokens 24 --sft-steps 30 --sft-lr 5e-3 --steps 6 --lr 1e-3 \
        --eval-every 0 --seed 2 --name "frozenlake-gigpo" \
        --db "$OUT/credit_gigpo.duckdb" --checkpoint-dir "$CKPT/credit"
    compact credit_gigpo.duckdb
}

# -- 6. an imported run: a rule-based agent's trajectories in the generic JSONL format ----------
import_run() {
    fresh imported_greedy_lake.duckdb
    mkdir -p runs
    timed "$PY" sample_runs/agents/greedy_lake.py --out runs/greedy_lake.jsonl \
        --tasks 12 --rollouts 4 --steps 3 --seed 0
    timed "$PY" -m storage.io import runs/greedy_lake.jsonl --format jsonl \
        --db "$OUT/imported_greedy_lake.duckdb" --run-id greedy-lake \
        --run-name "greedy rule agent (imported JSONL)"
    compact imported_greedy_lake.duckdb
}

# -- 7. which turn lost the reward? branch-from-turn analyses of two real failures --------------
# Two small runs into one store, each keeping an adapter snapshot after every step
# (--adapter-every 1), so a trajectory of RL step s is continued by the very adapter that sampled
# it. Then the first failure of each kind, found by a rule (pick_failure.py, not a typed id), is
# branched at every turn (core/jobs/branch.py). The lake is 3x3 and slippery as RAGEN's
# (slip=0.2: a move goes where intended 80% of the time), one move a turn, so a fall may be the
# policy's move or the ice's: a keep continuation draws its kept move's slip afresh, which tells
# them apart. A pool of 4 lakes lets 50 SFT steps teach the tiny model to walk them. The apps run
# knows one template (archive the read newsletters, leave the unread ones) on 8 worlds: after
# 140 SFT steps it has the calls' form but not which of the ids a search returned to archive, so
# at temperature 0.7 it sometimes archives an unread one: collateral damage.
# The adapter snapshots the two analyses continued with are copied next to the store
# (checkpoints/RUN/adapters/, a few MB), so the app's branch form runs on them too.
branches() {
    local db="$OUT/branch_failures.duckdb" found run traj name kind k
    if [ -f "$db" ]; then  # the old runs' shipped adapters go with them
        for run in $("$PY" -c "from storage import queries; import sys
print(*queries.runs(sys.argv[1])['run_id'])" "$db"); do rm -rf "${OUT:?}/checkpoints/$run"; done
    fi
    fresh branch_failures.duckdb
    timed "${TRAIN[@]}" --env frozenlake --env-options size=3,slip=0.2,actions_per_turn=1,max_actions=6 \
        --algo grpo --task-pool 4 --group-size 8 --tasks-per-step 2 --max-turns 6 \
        --max-new-tokens 12 --sft-steps 50 --sft-lr 5e-3 --steps 3 --lr 1e-4 --eval-every 0 \
        --adapter-every 1 --seed 1 --name frozenlake-branch --db "$db" \
        --checkpoint-dir "$CKPT/branch-frozenlake"
    timed "${TRAIN[@]}" --env apps --env-options templates=archive_read_newsletters \
        --algo grpo --task-pool 8 --group-size 8 --tasks-per-step 4 --max-turns 8 \
        --max-obs-tokens 512 --max-context 2048 --max-new-tokens 48 --sft-steps 140 \
        --sft-batch-size 2 --sft-lr 5e-3 --steps 2 --temperature 0.7 --eval-every 0 \
        --adapter-every 1 --seed 0 \
        --name apps-branch --db "$db" --checkpoint-dir "$CKPT/branch-apps"
    # K = 64 on the lake (40 s): at K = 8 its V and Q of a late turn are often 0 and 0 by chance
    for pick in frozenlake-branch:hole:64 apps-branch:collateral_damage:8; do
        IFS=: read -r name kind k <<<"$pick"
        found=$("$PY" sample_runs/pick_failure.py --db "$db" --run-name "$name" --kind "$kind")
        read -r run traj <<<"$found"
        timed "$PY" -m core.branch --db "$db" --run "$run" --traj "$traj" --turns all --k "$k" \
            --seed 0
        ship_adapters "$db" "$run" "$CKPT/branch-${name%%-*}"
    done
    compact branch_failures.duckdb
}

# -- 1. search with SmolLM2-135M: the long one (over an hour on 2 cores), not in the default set --
# `bash sample_runs/make.sh search`. Two runs in one store: the earlier recipe (SFT on 10% two-hop
# demonstrations, GRPO at temperature 1 on 75% two-hop tasks), kept because it shows why RL had
# nothing to learn from, then the preset's recipe. Both evaluate the same 100 held-out tasks.
# (The committed earlier run was stopped by hand after its first RL step and has no evaluation
# at step 21; with --steps 1 the trainer also evaluates at the end, step 21.)
search() {
    fresh search_smollm2.duckdb
    timed "$PY" -m core.train --preset search-smollm2 --sft-env-options two_hop_frac=0.1 \
        --env-options two_hop_frac=0.75 --temperature 1.0 --lr 1e-4 --steps 1 --seed 0 \
        --threads 2 --name "search-smollm2: SFT then GRPO" --db "$OUT/search_smollm2.duckdb" \
        --checkpoint-dir "$CKPT/search-smollm2-earlier"
    timed "$PY" -m core.train --preset search-smollm2 --seed 0 --threads 2 \
        --name "search-smollm2: SFT then GRPO" --db "$OUT/search_smollm2.duckdb" \
        --checkpoint-dir "$CKPT/search-smollm2"
    compact search_smollm2.duckdb
}

# -- 8. search with SmolLM2-135M: the SFT budget, then GRPO from a strong start (about an hour) ---
# Held-out every 20 SFT steps (20, 40, 60), then 2 GRPO steps with a held-out evaluation after
# each, the RL optimizer starting from SFT's second moments (rl_moments=sft, the default); then the
# branch analysis of the first failed two-hop question of the last evaluation that answered right
# after one search. The committed run was started with --sft-steps 100 --steps 3, stopped with
# Ctrl-C after step 60 and resumed with --sft-steps 60 --steps 2 (each step's seeds depend only
# on the run seed and the step, so this single command makes the same steps). It kept the name it
# was started with, "100 SFT steps", until the committed store's run was renamed to what it holds.
search_sft() {
    local db="$OUT/search_sft60.duckdb" found run traj
    fresh search_sft60.duckdb
    timed "$PY" -m core.train --preset search-smollm2 --seed 0 --threads 2 --sft-steps 60 \
        --sft-eval-every 20 --steps 2 --eval-every 1 \
        --name "search-smollm2: 60 SFT steps (held-out every 20), then GRPO" --db "$db" \
        --checkpoint-dir "$CKPT/search-v2"
    found=$("$PY" sample_runs/pick_failure.py --db "$db" \
            --run-name "search-smollm2: 60 SFT steps (held-out every 20), then GRPO" \
            --kind one_hop_answer)
    read -r run traj <<<"$found"
    timed "$PY" -m core.branch --db "$db" --run "$run" --traj "$traj" --turns all --k 8 --seed 0
    compact search_sft60.duckdb
}

# -- 9. credit methods on search from one SFT start (SmolLM2; CPU hours, never by default) --------
# SFT once (60 steps, held-out after it), then every credit method from that checkpoint
# (--init-from): the same seed, tasks and RL budget, only the credit differs; then the SFT budget
# curve goes on from the same checkpoint to 100 SFT steps (held-out at 80 and 100).
search_credit() {
    local db="$OUT/search_credit.duckdb" dir=runs/credit ckpt
    fresh search_credit.duckdb
    rm -rf "$dir"
    timed "$PY" -m core.train --preset search-smollm2 --seed 0 --threads 2 --sft-steps 60 \
        --steps 0 --sft-eval-every 60 --checkpoint-every 1 --adapter-every 0 --quiet \
        --name "search-smollm2: 60 SFT steps" --db "$db" --checkpoint-dir "$dir/ckpt"
    ckpt=$(ls -d "$dir"/ckpt/*)
    timed "$PY" bench/credit_compare.py run --out "$dir/cmp" --device cpu --init-from "$ckpt" \
        --runs grpo-s0,info_gain-s0,gigpo-s0,spa-s0,prm-s0,grpo-s1,${CREDIT_BEST:-info_gain}-s1 \
        --sft-steps 60 --steps 3 --eval-every 3 --parallel 2 --limit-s 20000 \
        --set info_gain_gamma=0
    "$PY" bench/credit_compare.py pack "$dir/cmp" "$dir/cmp-packed" --tokens-for grpo-s0,info_gain-s0
    "$PY" bench/credit_compare.py load "$dir/cmp-packed" --db "$db"
    timed "$PY" -m core.train --preset search-smollm2 --seed 0 --threads 2 --init-from "$ckpt" \
        --sft-steps 100 --steps 0 --sft-eval-every 20 --adapter-every 0 --quiet \
        --name "credit sft_curve seed 0" --db "$db" --checkpoint-dir "$dir/ckpt100"
    timed "$PY" -m core.train --preset search-smollm2 --seed 0 --threads 2 \
        --init-from "$(ls -d "$dir"/ckpt100/*)" --sft-steps 140 --steps 0 --sft-eval-every 20 \
        --adapter-every 0 --checkpoint-every 1000 --quiet \
        --name "search-smollm2: SFT 100 -> 140 steps" --db "$db" --checkpoint-dir "$dir/ckpt140"
    # (both comparisons above were recorded before IGPO's turn returns existed: info_gain_gamma=0
    # gives each turn its own gain, as they had)
    # RL from the 100-step checkpoint on train tasks SFT never saw (task_pool=0: the whole train
    # split, none of SFT's 256), all two-hop, sampled at temperature 1; one held-out draw (seed 0)
    timed "$PY" bench/credit_compare.py run --out "$dir/rl100" --device cpu \
        --init-from "$(ls -d "$dir"/ckpt100/*)" --runs info_gain-s0,grpo-s0 --sft-steps 100 \
        --steps 12 --eval-every 6 --parallel 2 --set env_options=two_hop_frac=1.0 \
        --set task_pool=0 --set temperature=1.0 --set record_info_gain=false --limit-s 20000 \
        --set info_gain_gamma=0
    # without token tables (the store stays small; trajectories, turns and signals are kept)
    "$PY" bench/credit_compare.py pack "$dir/rl100" "$dir/rl100-packed"
    "$PY" bench/credit_compare.py load "$dir/rl100-packed" --db "$db" --tag "from SFT 100"
    # the weak start: 30 SFT steps (held-out 24%), then RL on fresh train tasks of the preset's
    # half-two-hop mix at the preset's temperature 0.7 (at 1.0 this policy solved 0 of step 31's
    # 32 rollouts), stopped at 5,700 s each (two runs share 2 cores); information gain with
    # IGPO's turn returns (info_gain_gamma 1, the default)
    timed "$PY" -m core.train --preset search-smollm2 --seed 0 --threads 2 --sft-steps 30 \
        --steps 0 --sft-eval-every 30 --checkpoint-every 1 --adapter-every 0 --quiet \
        --name "search-smollm2: 30 SFT steps" --db "$db" --checkpoint-dir "$dir/ckpt30"
    timed "$PY" bench/credit_compare.py run --out "$dir/rl30" --device cpu \
        --init-from "$(ls -d "$dir"/ckpt30/*)" --runs info_gain-s0,grpo-s0 --sft-steps 30 \
        --steps 8 --eval-every 4 --parallel 2 --set task_pool=0 \
        --set record_info_gain=false --limit-s 5700
    "$PY" bench/credit_compare.py pack "$dir/rl30" "$dir/rl30-packed"
    "$PY" bench/credit_compare.py load "$dir/rl30-packed" --db "$db" --tag "from SFT 30"
    # the same pair at a tenth of the RL learning rate
    timed "$PY" bench/credit_compare.py run --out "$dir/rl30lr" --device cpu \
        --init-from "$(ls -d "$dir"/ckpt30/*)" --runs info_gain-s0,grpo-s0 --sft-steps 30 \
        --steps 8 --eval-every 4 --parallel 2 --set task_pool=0 --set lr=2e-5 \
        --set record_info_gain=false --limit-s 5700
    "$PY" bench/credit_compare.py pack "$dir/rl30lr" "$dir/rl30lr-packed"
    "$PY" bench/credit_compare.py load "$dir/rl30lr-packed" --db "$db" --tag "from SFT 30, lr 2e-5"
    # from the 60-step checkpoint again: 8 tasks x 8 rollouts per step at temperature 1, LOOP's
    # |A| filter, fresh train tasks of the held-out mix; the step size at lr 2e-4 (one step; the
    # recorded run was stopped by hand after it, without this evaluation) and 5 steps at lr 6e-4
    # (the recorded run was started with --steps 20 and stopped after step 65's evaluation)
    # (--limit-s: the harness's default of 420 s would stop these hour-long runs after one step)
    local rl60=(--device cpu --init-from "$ckpt" --runs grpo-s0 --sft-steps 60 --eval-every 5
                --parallel 1 --threads 1 --limit-s 20000 --set task_pool=0 --set temperature=1.0
                --set env_options=two_hop_frac=0.75 --set tasks_per_step=8
                --set min_abs_advantage=0.01 --set record_info_gain=false)
    timed "$PY" bench/credit_compare.py run --out "$dir/rl60a" "${rl60[@]}" --steps 1 &
    timed "$PY" bench/credit_compare.py run --out "$dir/rl60b" "${rl60[@]}" --steps 5 \
        --set lr=6e-4 &
    wait
    # two more steps at lr 6e-4 from step 65's checkpoint (two threads), evaluated at step 67;
    # the later --init-from and --threads override the array's
    timed "$PY" bench/credit_compare.py run --out "$dir/rl60c" "${rl60[@]}" \
        --init-from "$(ls -d "$dir"/rl60b/grpo-s0.ckpt/*)" --steps 7 --threads 2 --set lr=6e-4
    for run in a:2e-4 b:6e-4 "c:6e-4, steps 66-67"; do
        "$PY" bench/credit_compare.py pack "$dir/rl60${run%%:*}" "$dir/rl60${run%%:*}-packed"
        "$PY" bench/credit_compare.py load "$dir/rl60${run%%:*}-packed" --db "$db" \
            --tag "from SFT 60, 8 tasks, lr ${run#*:}"
    done
    # the same 5 steps at lr 6e-4 with two dense credits, side by side at one thread each; the
    # later --runs overrides the array's grpo-s0
    timed "$PY" bench/credit_compare.py run --out "$dir/rl60m" "${rl60[@]}" \
        --runs info_gain-s0,prm-s0 --parallel 2 --steps 5 --set lr=6e-4
    "$PY" bench/credit_compare.py pack "$dir/rl60m" "$dir/rl60m-packed"
    "$PY" bench/credit_compare.py load "$dir/rl60m-packed" --db "$db" \
        --tag "from SFT 60, 8 tasks, lr 6e-4"
    # the 60-step start made once more (recorded on another CPU model, where its SFT losses
    # differ from the first start's from step 1 and it solves 71 held-out tasks; on one machine
    # the two starts are identical), then GRPO at lr 6e-4 and GRPO + information gain at half
    # that lr (its gradient was twice GRPO's), side by side at one thread each. The recorded
    # runs were stopped with Ctrl-C during step 64 (no evaluation on a stop), their step-64
    # adapters written from the checkpoints and evaluated with core.jobs.evaluation on the start's
    # tasks; here 4 steps keep the step-64 adapter (adapter_every=4) for the same evaluation.
    local start
    timed "$PY" -m core.train --preset search-smollm2 --seed 0 --threads 2 --sft-steps 60 \
        --steps 0 --sft-eval-every 60 --checkpoint-every 1 --adapter-every 0 --quiet \
        --name "search-smollm2: 60 SFT steps, made again" --db "$db" --checkpoint-dir "$dir/ckpt60b"
    start=$(basename "$(ls -d "$dir"/ckpt60b/*)")
    local again=("${rl60[@]}" --init-from "$dir/ckpt60b/$start" --steps 4 --set adapter_every=4)
    timed "$PY" bench/credit_compare.py run --out "$dir/rl60n" "${again[@]}" --set lr=6e-4 &
    timed "$PY" bench/credit_compare.py run --out "$dir/rl60h" "${again[@]}" \
        --runs info_gain-s0 --set lr=3e-4 &
    wait
    for run in n:grpo:6e-4 h:info_gain:3e-4; do
        IFS=: read -r out variant lr <<< "$run"
        "$PY" bench/credit_compare.py pack "$dir/rl60$out" "$dir/rl60$out-packed"
        "$PY" bench/credit_compare.py load "$dir/rl60$out-packed" --db "$db" \
            --tag "from SFT 60 again, 8 tasks, lr $lr"
        timed "$PY" -m core.evaluation --db "$db" --step 64 --tasks-from "$start:60" \
            --run "$(basename "$(ls -d "$dir/rl60$out/$variant-s0.ckpt"/*)")"
    done
    # (the evaluations' token rows were deleted from the committed store for its size cap)
    compact search_credit.duckdb
}

# -- 10. training-inference mismatch: SmolLM2 sampled in bf16, updated in fp32 -------------------
# One SFT start (30 steps of the search preset), then from it 8 RL steps each: sampled in fp32
# (no mismatch but rounding), sampled in bf16 (a bf16 engine's mismatch at laptop scale), and
# sampled in bf16 with verl's truncated importance sampling (cap 2); each evaluated on the same 40
# held-out tasks at its last step.
mismatch() {
    fresh mismatch_bf16.duckdb
    local db="$OUT/mismatch_bf16.duckdb" dir="$CKPT/mismatch"
    local common=(--preset search-smollm2 --group-size 4 --tasks-per-step 2 --max-turns 3
                  --max-new-tokens 48 --eval-tasks 40 --seed 0 --threads 1 --quiet --db "$db")
    timed "$PY" -m core.train "${common[@]}" --sft-steps 30 --steps 0 --eval-every 0 \
        --name "SFT start (30 steps)" --checkpoint-dir "$dir/sft"
    for run in fp32:none bf16:none bf16:tis; do
        IFS=: read -r dtype corr <<< "$run"
        timed "$PY" -m core.train "${common[@]}" --sft-steps 30 --steps 8 --eval-every 8 \
            --init-from "$(ls -d "$dir/sft"/*/)" --rollout-dtype "$dtype" \
            --rollout-correction "$corr" \
            --name "sampled $dtype, correction $corr" --checkpoint-dir "$dir/$dtype-$corr"
    done
    # for the sample-store size cap: token rows only for the bf16 run without correction's
    # training rollouts (every run keeps its metrics, trajectories and turns)
    "$PY" -c "from storage import db
with db.writing('$db') as con:
    con.execute(\"DELETE FROM tokens WHERE (run_id, traj_id) NOT IN (SELECT run_id, traj_id
                 FROM trajectories JOIN runs USING (run_id) WHERE split = 'train'
                 AND name = 'sampled bf16, correction none')\")"
    compact mismatch_bf16.duckdb
}

# -- 11. an Inspect AI evaluation: two agents on the same six questions, imported ------------------
# Needs inspect-ai (.venv/bin/pip install --no-deps -r requirements-inspect.txt). Two real .eval
# logs written by Inspect with its offline mockllm model under two names and real Python tools
# (sample_runs/agents/inspect_agents.py says what each agent does), imported as a directory: one
# run per task and model. A few seconds.
inspect_run() {
    local logs=runs/inspect_agents
    fresh inspect_agents.duckdb
    rm -rf "$logs"
    mkdir -p runs
    TIKTOKEN_CACHE_DIR=runs/no-tokenizer INSPECT_DISPLAY=none \
        timed "$PY" sample_runs/agents/inspect_agents.py --out "$logs"
    timed "$PY" -m storage.io import "$logs" --format inspect --db "$OUT/inspect_agents.duckdb" \
        --run-id inspect-agents
    compact inspect_agents.duckdb
}

# -- 12. a reward a shallow strategy earns, and the alarm that names it -----------------------------
# sample_runs/shortcut.yaml holds the whole configuration and says why: format_score=0.2 pays any
# well-formed answer, the tiny model never finds a right one, so RL teaches it to answer at once,
# unsearched. Then the behaviours job writes each step's behaviour rates, Cov(A, b) and the
# shallow-strategy alarms into the store. About 8 minutes on 2 busy CPU cores.
shortcut() {
    local db="$OUT/shortcut.duckdb" run
    fresh shortcut.duckdb
    timed "$PY" -m core.train --config sample_runs/shortcut.yaml --db "$db" --quiet
    run=$("$PY" -c "from storage import queries; import sys
print(queries.runs(sys.argv[1])['run_id'].iloc[0])" "$db")
    timed "$PY" -m storage.behaviours.job --db "$db" --run "$run"  # = agentrl behaviours
    compact shortcut.duckdb
}

# -- 13. credit on a lake where every move counts: each method x 3 seeds from one SFT start -------
# sample_runs/credit_grid.sh holds the grid (the non-slippery 3x3 lake, one move a turn); each run
# records into its own store under runs/credit_grid/, merged into credit_grid.duckdb at the end.
# An hour or more on 2 busy cores: never by default.
credit_grid() {
    rm -rf runs/credit_grid
    timed bash sample_runs/credit_grid.sh
}

# -- 13b. the same lake at a lower lr and almost four times the RL steps (lr 1e-3, 60 steps,
# held-out every 5); GRPO, GiGPO, RLOO and PRM, seeds 0-2, from one SFT start; no token rows kept
# (the first grid's store has them), so the store stays small. 260-760 s a run on 2 busy cores.
credit_grid_long() {
    rm -rf runs/credit_grid_long
    timed env DIR=runs/credit_grid_long OUT="$OUT/credit_grid_long.duckdb" LR=1e-3 STEPS=60 \
        EVAL_EVERY=5 METHODS="grpo gigpo rloo prm" TOKENS_FOR="" bash sample_runs/credit_grid.sh
}

# -- 14. the corridor: the same grid where the tiny model can learn the task (one preference,
# Right, is the whole policy) and every walk mixes good and bad moves; 5e-4, 30 RL steps, held-out
# (sampled) every 3. 90-100 s a run with two running at once on 2 cores; one after another, as
# here, about 45 minutes.
credit_corridor() {
    rm -rf runs/credit_corridor
    timed env TASK=corridor DIR=runs/credit_corridor OUT="$OUT/credit_corridor.duckdb" LR=5e-4 \
        STEPS=30 EVAL_EVERY=3 bash sample_runs/credit_grid.sh
}

ALL=(collapse spike apps credit import_run branches inspect_run shortcut)
if [ $# -gt 0 ]; then
    ALL=()
    for name in "$@"; do
        case "$name" in
            import) ALL+=(import_run) ;;
            inspect) ALL+=(inspect_run) ;;
            collapse|spike|apps|careless|credit|branches|search|search_sft|search_credit|mismatch|shortcut|credit_grid|credit_grid_long|credit_corridor)
                ALL+=("$name") ;;
            *) echo "unknown run '$name' (collapse spike apps careless credit import branches inspect search search_sft search_credit mismatch shortcut credit_grid credit_grid_long credit_corridor)" >&2
               exit 2 ;;
        esac
    done
fi
for run in "${ALL[@]}"; do
    echo "==> $run" >&2
    "$run"
done
ls -l "$OUT"/*.duckdb >&2
