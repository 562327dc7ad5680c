#!/usr/bin/env bash
# The checks of docs/gpu_checks.md that fit one 10-minute call on a lent GPU machine, each under its
# own time limit so that one stuck step cannot eat the rest. The correctness checks share the GPU
# (and the machine's 16 cores, which compile Warp's kernels) in parallel; the timing check runs alone.
# Run after a first call has copied .gpu/p1/site.part.aa to /tmp (docs/gpu_checks.md, step 1):
#     bash bench/gpu_checks.sh      (carry .gpu/p2; everything lands in $OUT: log.txt, <check>.txt, results.tar)
set -u
. bench/gpu_env.sh
start=$SECONDS
log=$OUT/log.txt
cat /tmp/site.part.aa .gpu/p2/site.part.ab | xz -d -T16 | tar x -C /tmp/site || { echo "unpack failed"; exit 1; }
[ -d .gpu/p2/whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/p2/whl/*.whl
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$log"
git log -1 --format='commit %h %s' 2>/dev/null | tee -a "$log"

# check NAME SECONDS COMMAND...: its output in $OUT/NAME.txt, MuJoCo Warp's "linesearch iterations
# limit" lines filtered out; its exit status and times in log.txt.
check() {
    local name=$1 limit=$2; shift 2
    echo "== $name (limit ${limit} s) from $((SECONDS - start)) s" >> "$log"
    timeout "$limit" "$@" 2>&1 | grep --line-buffered -v -e linesearch -e warn_overflow > "$OUT/$name.txt"
    echo "== $name: exit ${PIPESTATUS[0]} at $((SECONDS - start)) s" >> "$log"
}

# The viewer's tests on CUDA: the state is read from the GPU each frame (no video or W&B here: the
# machine has neither ffmpeg nor wandb, and both are tested on the CPU).
sed -i 's/"task=quadruped_flat", "sim.num_envs=16"/"task=quadruped_flat", "device=cuda:0", "sim.num_envs=16"/;
        s/"agent.video.every=1", "agent.video.max_seconds=1", "agent.logger=wandb"/"agent.logger=tensorboard"/' \
    tests/test_viewer.py

check captured 300 python -m pytest -p no:cacheprovider -q -s -n 0 tests/test_env.py -k captured &
check viewer 240 python -m pytest -p no:cacheprovider -q -n 0 tests/test_viewer.py -k "websocket or ctrl_c" &
check dagger 300 python bench/learning.py --task arm_lift --mode dagger --device cuda:0 --num-envs 4096 --minutes 3 \
    --eval-every 1.5 --episodes 100 --success-goal 0.9 \
    agent.imitation.expert=scripted:legion.tasks.manipulation.expert:lift_joint_space &
wait
check async_vs_sync $((580 - (SECONDS - start))) python bench/async_vs_sync.py device=cuda:0 sim.capture_step=true \
    --tasks quadruped_flat --num-envs 4096 --iterations 150 --seeds 0
tar cf "$OUT/results.tar" -C bench/results/ . 2>/dev/null
echo "== done at $((SECONDS - start)) s" | tee -a "$log"
cat "$log"
