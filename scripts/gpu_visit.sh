#!/usr/bin/env bash
# One visit to a GPU machine (16 cores, one NVIDIA GPU), in one call: the CUDA graph's
# tests (central inference sampling beside a capture included), the scaling table on CUDA
# for the layouts that take inference off the actors' cores (central inference, 16 envs per
# actor) and for a halved batch, then Pong from scratch with the defaults and the fastest
# row's flags for the rest of the time. Everything it measures lands in $OUT.
#
#     OUT=/tmp/visit bash scripts/gpu_visit.sh [SECONDS]   # from the repository's root
#
# SECONDS (default 550) bounds the whole visit; the Pong run gets what the rest leaves (none
# under a minute). Wheels in .whl/ (gymnasium, ale-py, farama-notifications) are installed
# first where the machine lacks them. SMALL=1 shrinks every run, to try the script on a
# machine without a GPU. Earlier visits' logs: docs/runs/gpu_h200_visit*.log.
set -u
started=$(date +%s)
budget=${1:-550}
out=${OUT:-/tmp/visit}
work=/tmp/gpu_visit
rm -rf "$work" && mkdir -p "$out" "$work/tables"
exec > >(tee -a "$out/visit.log") 2>&1
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
if ! $PY -c "import ale_py, gymnasium" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
elapsed() { echo $(($(date +%s) - started)); }

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
echo "cores: $(nproc); $(grep -m1 'model name' /proc/cpuinfo)"
$PY -c "import torch, gymnasium, ale_py; print('torch', torch.__version__, \
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA', \
'gymnasium', gymnasium.__version__, 'ale-py', ale_py.__version__)" || exit 1

devices=cuda warmup=10000 steps=40000 wide=16x16 narrow=16x8 central="16x8 32x8"
if [ "${SMALL:-0}" = 1 ]; then
    devices=cpu warmup=500 steps=1000 wide=1x16 narrow=1x8 central="1x8 2x8"
fi

echo "== $(elapsed) s: the CUDA graph's own tests, central inference beside a capture"
$PY -m pytest -q -p no:cacheprovider tests/test_update_graph.py 2>&1 | tail -3

# The scaling table: one benchmark process per row, each table's rows in one JSON file;
# each row's batch grown with its envs, as training grows it, and updates as CUDA graphs
# (the default). Visit 2 measured 16 x 8 at 10,863 SPS, bound by the actors' CPU (env
# 0.66 + inference 0.57 ms per step per core): the rows below take inference off them,
# or batch it over more envs, or halve the batch.
table() {  # NAME, then flags for every row of it
    local name=$1
    shift
    echo "== $(elapsed) s: table $name: $*"
    $PY -m torchbeast.scaling --devices $devices --warmup_steps $warmup --bench_steps $steps \
        --json "$work/tables/$name.json" "$@"
}
table central --central_inference --layouts $central
table wide --layouts $wide
table b32 --batch_size 32 --learning_rate 0.00099 --layouts $narrow
tar -czf "$out/tables.tar.gz" -C "$work" tables

# The fastest row's flags (none where the defaults' own layout was the fastest).
flags=$($PY - "$work/tables" "$(nproc)" <<'EOF'
import json, sys
import torch
from torchbeast.config.resolvers import default_layout
best, own = None, default_layout(int(sys.argv[2]), torch.cuda.is_available())
tables = {"central": "--central_inference", "wide": "", "b32": "--batch_size 32 --learning_rate 0.00099"}
for name, extra in tables.items():
    try:
        rows = json.load(open(f"{sys.argv[1]}/{name}.json"))
    except (OSError, ValueError):
        continue
    for row in rows:
        layout = "" if (row["actors"], row["envs"]) == own else f"--num_actors {row['actors']} --envs_per_actor {row['envs']}"
        if "sps" in row and (best is None or row["sps"] > best[0]):
            best = (row["sps"], f"{extra} {layout}".strip())
print(best[1] if best else "")
EOF
)

# Pong from scratch with the defaults and the fastest row's flags, stopped by SIGTERM
# when the visit's time is up (the run checkpoints and says where it got).
left=$((budget - $(elapsed) - 15))
[ "${SMALL:-0}" = 1 ] && left=40
if [ "$left" -lt 60 ]; then
    echo "== $(elapsed) s: no time left for Pong"
    exit 0
fi
echo "== $(elapsed) s: Pong for ${left} s with the defaults and: ${flags:-nothing else}"
pong_started=$(date +%s.%N)
run="$work/runs/pong_gpu"
(  # the run's logs reach $OUT as it goes, in case the visit is cut short
    while sleep 20; do
        gzip -c "$run/logs.csv" >"$out/pong_logs.csv.gz" 2>/dev/null
        cp "$run/out.log" "$out/pong_out.log" 2>/dev/null
    done
) &
copier=$!
timeout -s TERM "$left" $PY -m torchbeast.monobeast --env PongNoFrameskip-v4 --seed 1 \
    --xpid pong_gpu --savedir "$work/runs" $flags
rc=$?
kill $copier
gzip -c "$run/logs.csv" >"$out/pong_logs.csv.gz"
cp "$run/out.log" "$out/pong_out.log"; cp "$run/meta.json" "$out/pong_meta.json"
echo "== $(elapsed) s: Pong ended (exit $rc)"
$PY - "$run" "$pong_started" <<'EOF'
import csv, sys
folder, started = sys.argv[1], float(sys.argv[2])
with open(f"{folder}/logs.csv") as file:
    lines = csv.reader(file)
    names = [name.lstrip("# ") for name in next(lines)]
    rows = [dict(zip(names, line)) for line in lines]
print(f"{len(rows)} updates logged; first {float(rows[0]['_time']) - started:.0f} s after the start")
best, said = float("-inf"), set()
for row in rows:
    mean = float(row["mean_return_last_100"] or "nan")
    best = max(best, mean) if mean == mean else best
    for bar in (-10, 0, 10, 18):
        if mean >= bar and bar not in said:
            said.add(bar)
            seconds = float(row["_time"]) - started
            print(f"100-episode mean >= {bar}: step {row['step']}, {seconds:.0f} s after the start")
last = rows[-1]
print(f"last: step {last['step']}, 100-episode mean {last['mean_return_last_100']}, best {best}, "
      f"policy lag {last['policy_lag']}")
EOF
echo "== $(elapsed) s: done"
