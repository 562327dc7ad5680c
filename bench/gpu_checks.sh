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
# docs/gpu_checks.md's list, side by side on the GPU (each learning curve is then measured with
# the GPU shared: compare runs of one call, or rerun one alone on the warm machine for its timing).
learn=(python bench/learning.py --device cuda:0 --num-envs 4096)  # options before the overrides
# 1. arm_lift's PPO against the clock (the GPU goal, >= 90%; `--resume` carries the clock on).
check arm_lift_ppo 560 "${learn[@]}" --task arm_lift --minutes 6 --eval-every 3 --episodes 100 --success-goal 0.9 &
# 2. Distillation on CUDA: a Go2 teacher for 2.5 minutes, then a blind student (no base velocity) by DAgger.
check distillation 560 bash -c "${learn[*]} --task quadruped_flat --minutes 2.5 --eval-every 2.5 robot=go2 && \
    teacher=\$(python -c \"import json; print(json.load(open('bench/results/learning_quadruped_flat_go2.json'))['run'])\") && \
    ${learn[*]} --task quadruped_flat --mode dagger --minutes 2 --eval-every 1 robot=go2 \
        ++task.observations.policy.base_lin_vel.enabled=false agent.imitation.expert=run:\$teacher" &
# 4. arm_lift's DAgger with a 5x longer memory: whether its decline after 1.3 minutes was the buffer's.
check dagger_memory 400 "${learn[@]}" --task arm_lift --mode dagger --minutes 2.5 --eval-every 1.25 --episodes 100 \
    --success-goal 0.9 agent.imitation.max_samples=5000000 \
    agent.imitation.expert=scripted:legion.tasks.manipulation.expert:lift_joint_space &
# 5. A shorter recurrent update (the LSTM trained at 0.55x the MLP's env-steps/s, its update the bottleneck).
check lstm_fast 400 "${learn[@]}" --task quadruped_flat_deployable --minutes 3 --eval-every 1.5 --tag lstm_fast \
    robot=go2 agent.actor.rnn.type=lstm agent.algorithm.num_mini_batches=2 &
# 16. Cameras: rendered frames/s on the GPU (the goal: >= 20k RGB frames/s at 128x128 on an H100).
check cameras 300 python bench/cameras.py --device cuda:0 --num-envs 1024 4096 --sizes 64 128 --steps 20 &
# 17. The command latency inside the captured step: env-steps/s with and without it.
check command_latency 300 bash -c "legion train task=quadruped_flat robot=go2 device=cuda:0 agent.max_iterations=20 \
    agent.stop_when.goal=false run_name=_plain && legion train task=quadruped_flat robot=go2 device=cuda:0 \
    agent.max_iterations=20 agent.stop_when.goal=false run_name=_latency \
    '+task.events.latency={func: command_latency, mode: reset, range: [0, 15]}'" &
# 18. Actuator networks inside the captured step: env-steps/s against the DC motors'.
check actuator_network 300 python bench/actuator_network.py --device cuda:0 --backends warp --num-envs 4096 16384 &
wait
# 16b. The CPU renderers on the host's cores (mj_multiRay on every core against SensorCamera on one).
check camera_renderers 300 python bench/cameras.py --renderers --num-envs 256 1024 --sizes 64 128 --steps 20
tar cf "$OUT/results.tar" -C bench/results/ . 2>/dev/null
echo "== done at $((SECONDS - start)) s" | tee -a "$log"
cat "$log"
