#!/usr/bin/env bash
# One visit to a GPU machine (16 cores, one NVIDIA GPU), in one call. The actors' CPU bounds
# the recipe there now (visit 3: 16 x 8 at 10,863 SPS, env 0.66 + forward pass 0.57 ms per
# step per core), so the table tries what takes the forward pass off them or makes it
# cheaper: bf16 on a CPU with native bf16 (`--precision auto`; the learner's GPU stays
# fp32), and central inference (its passes on a CUDA stream of their own, one wait for the
# device each; its table says where a pass's time goes, the first look at why it topped
# out at 8,200-8,900 SPS). Then Pong
# from scratch in two seeds, each stopped at a 100-episode mean of +18, 2.5M steps or its
# share of the time, with the defaults, PONG_FLAGS, and the fastest row's flags where that
# row beat the defaults' by 10%. Everything it measures lands in $OUT.
#
#     OUT=/tmp/visit PONG_FLAGS="..." bash scripts/gpu_visit.sh [SECONDS]   # from the root
#
# SECONDS (default 550) bounds the whole visit. Wheels in .whl/ (gymnasium, ale-py,
# farama-notifications) are installed first where the machine lacks them. SMALL=1 shrinks
# every run, to try the script on a machine without a GPU. Earlier visits' logs:
# docs/runs/gpu_h200_visit*.log.
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

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
echo "cores: $(nproc); $(grep -m1 'model name' /proc/cpuinfo);" \
    "bf16 flags: $(grep -m1 -o 'amx_bf16\|avx512_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
$PY -c "import torch, gymnasium, ale_py; print('torch', torch.__version__, \
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA', \
'gymnasium', gymnasium.__version__, 'ale-py', ale_py.__version__)" || exit 1

devices=cuda warmup=10000 steps=40000 layout=16x8 wide=32x8 cap=2500000
if [ "${SMALL:-0}" = 1 ]; then
    devices=cpu warmup=500 steps=1000 layout=1x8 wide=2x8 cap=3000
fi

# The scaling table: the machine's own layout with the defaults, then each lever.
table() {  # NAME, LAYOUTS, then flags for every row of it
    local name=$1 layouts=$2
    shift 2
    echo "== $(elapsed) s: table $name: $*"
    $PY -m torchbeast.scaling --devices $devices --warmup_steps $warmup --bench_steps $steps \
        --json "$work/tables/$name.json" --layouts $layouts "$@"
}
table defaults "$layout"
table bf16_actors "$layout" --precision auto
table central "$layout $wide" --central_inference
tar -czf "$out/tables.tar.gz" -C "$work" tables
faster=$($PY - "$work/tables" "$layout" <<'EOF'
import json, sys
levers = {"defaults": "", "bf16_actors": "--precision auto", "central": "--central_inference"}
own, rows = tuple(int(n) for n in sys.argv[2].split("x")), []
for name, flags in levers.items():
    try:
        for row in json.load(open(f"{sys.argv[1]}/{name}.json")):
            if "sps" in row:
                layout = (row["actors"], row["envs"])
                if layout != own:
                    flags += f" --num_actors {layout[0]} --envs_per_actor {layout[1]}"
                rows.append((row["sps"], flags.strip(), name))
    except (OSError, ValueError):
        pass
base = max([sps for sps, _, name in rows if name == "defaults"] or [1])
best = max(rows, default=(0, "", ""))
print(best[1] if best[0] >= 1.1 * base else "")
EOF
)

# Pong from scratch, two seeds, each stopped (SIGTERM: it checkpoints and says where it
# got) at a 100-episode mean of +18, at the step cap, or when its share of the time is up.
pong() {  # SEED SECONDS
    local seed=$1 seconds=$2 run="$work/runs/pong_seed$1"
    echo "== $(elapsed) s: Pong seed $seed for at most $seconds s, with the defaults and:" \
        "${PONG_FLAGS:-} $faster"
    local pong_started
    pong_started=$(date +%s.%N)
    timeout -s TERM "$seconds" $PY -m torchbeast.monobeast --env PongNoFrameskip-v4 \
        --seed "$seed" --xpid "pong_seed$seed" --savedir "$work/runs" ${PONG_FLAGS:-} $faster &
    local pid=$!
    $PY - "$run/logs.csv" "$pid" "$cap" "$pong_started" "$out/pong_seed$seed" <<'EOF' &
import csv, os, shutil, signal, subprocess, sys, time
path, pid, cap, started, keep = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
said, names, last_copy = set(), None, 0.0
def rows():
    with open(path) as file:
        lines = csv.reader(file)
        header = [name.lstrip("# ") for name in next(lines)]
        return [dict(zip(header, line)) for line in lines]
while True:
    time.sleep(2)
    alive = os.path.exists(f"/proc/{pid}")
    try:
        table = rows()
    except (OSError, StopIteration):
        table = []
    stop = False
    for row in table:
        mean = float(row["mean_return_last_100"] or "nan")
        for bar in (-10, 0, 10, 18):
            if mean >= bar and bar not in said:
                said.add(bar)
                print(f"{os.path.basename(keep)}: 100-episode mean >= {bar}: step {row['step']}, "
                      f"{float(row['_time']) - started:.0f} s after the start", flush=True)
        stop = stop or mean >= 18 or int(row["step"]) >= cap
    if table and (time.time() - last_copy > 20 or not alive or stop):
        last_copy = time.time()
        subprocess.run(f"gzip -c {path} > {keep}_logs.csv.gz", shell=True)
        for name in ("out.log", "meta.json"):
            if os.path.exists(os.path.join(os.path.dirname(path), name)):
                shutil.copy(os.path.join(os.path.dirname(path), name), f"{keep}_{name}")
    if stop and alive:
        os.kill(pid, signal.SIGTERM)
    if not alive:
        last = table[-1] if table else {}
        print(f"{os.path.basename(keep)}: ended at step {last.get('step')}, 100-episode mean "
              f"{last.get('mean_return_last_100')}, policy lag {last.get('policy_lag')}", flush=True)
        break
EOF
    local watcher=$!
    wait "$pid"
    wait "$watcher"
}
left=$((budget - $(elapsed) - 20))
[ "${SMALL:-0}" = 1 ] && left=120
pong 1 $((left / 2))
left=$((budget - $(elapsed) - 15))
[ "${SMALL:-0}" = 1 ] && left=60
pong 2 "$left"
echo "== $(elapsed) s: done"
