#!/usr/bin/env bash
# The checks of docs/gpu_checks.md that fit one 10-minute call on a lent GPU machine, each under its
# own time limit so that one stuck step cannot eat the rest, side by side on the GPU (and the
# machine's 16 cores, which compile Warp's kernels).
# Run after bench/gpu_site.sh here and a first call that copied .gpu/p1/site.part.aa to /tmp
# (docs/gpu_checks.md, step 1):
#     bash bench/gpu_checks.sh      (carry .gpu/p2; everything lands in $OUT: log.txt, <check>.txt, results.tar)
set -u
. bench/gpu_env.sh
start=$SECONDS
log=$OUT/log.txt
cat /tmp/site.part.aa .gpu/p2/site.part.ab | xz -d -T16 | tar x -C /tmp/site || { echo "unpack failed"; exit 1; }
xz -d < .gpu/p2/robots.tar.xz | tar x -C /tmp/site   # the Go2's and the Panda's files (bench/gpu_site.sh)
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
train=(python -m legion train task=quadruped_flat device=cuda:0 sim.num_envs=4096 agent.max_iterations=5
       agent.log_interval=1)

# Issue 28 on CUDA: the recurrent actor under async PPO's lag (the learner re-evaluates the actor's
# own sequences), and symmetry's augmentation and mirror loss (the mirror map's index tensors on the GPU).
check lstm_async 240 "${train[@]}" agent.mode=async agent.actor.rnn.type=lstm &
check symmetry 240 "${train[@]}" agent.symmetry.augmentation=true agent.symmetry.mirror_loss=true &
# The deployable Go2 (measurable observations, latency and gains randomized) against the clock, an
# LSTM actor beside the MLP on the same GPU at the same time: whether the LSTM's update (the
# learner's bottleneck on the CPU) keeps pace here.
learn=(python bench/learning.py --task quadruped_flat_deployable --device cuda:0 --num-envs 4096 --minutes 3
       --eval-every 1.5)  # options before the overrides (argparse takes no option after them)
check deployable_lstm 480 "${learn[@]}" --tag lstm robot=go2 agent.actor.rnn.type=lstm &
check deployable_mlp 480 "${learn[@]}" robot=go2 &
wait
tar cf "$OUT/results.tar" -C bench/results/ . 2>/dev/null
echo "== done at $((SECONDS - start)) s" | tee -a "$log"
cat "$log"
