#!/usr/bin/env bash
# The checks of docs/gpu_checks.md that fit one 10-minute call on a lent GPU machine, most
# valuable first, each under its own time limit so that one stuck step cannot eat the rest.
# Run after a first call has copied .gpu/p1/site.part.aa to /tmp (docs/gpu_checks.md, step 1):
#     bash bench/gpu_checks.sh          (carry .gpu/p2; everything lands in $OUT: log.txt, results.tar)
set -u
. bench/gpu_env.sh
start=$SECONDS
log=$OUT/log.txt
cat /tmp/site.part.aa .gpu/p2/site.part.ab | xz -d -T16 | tar x -C /tmp/site || { echo "unpack failed"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$log"
git log -1 --format='commit %h %s' 2>/dev/null | tee -a "$log"

legion() { python -c 'import sys; from legion.cli import main; sys.argv[0] = "legion"; main()' "$@"; }
# step NAME SECONDS COMMAND...: MuJoCo Warp's "linesearch iterations limit" lines filtered out.
step() {
    local name=$1 limit=$2; shift 2
    echo "== $name (limit ${limit} s) at $((SECONDS - start)) s" | tee -a "$log"
    timeout "$limit" "$@" 2>&1 | grep --line-buffered -v -e linesearch -e warn_overflow | tee -a "$log" | tail -25
    echo "== $name: exit ${PIPESTATUS[0]} at $((SECONDS - start)) s" | tee -a "$log"
}

step backend 150 python -c "from legion.tasks.sim import NewtonSim
print('backend on cuda:0 =', NewtonSim('quadruped.xml', 64, 0.005, 4, device='cuda:0').backend)"
step captured_test 150 python -m pytest -p no:cacheprovider -q -n 0 tests/test_env.py -k captured
step throughput 100 python bench/throughput.py --device cuda:0 --num-envs 4096 16384 --steps 100 --no-randomization
step go2_export 120 bash -c "$(declare -f legion); legion train task=quadruped_flat robot=go2 device=cuda:0 \
    sim.num_envs=1024 agent.max_iterations=20 hydra.run.dir=/tmp/go2_cuda && legion export run=/tmp/go2_cuda &&
    legion sim2sim run=/tmp/go2_cuda physics=matched device=cuda:0 duration_s=5"
step robots 50 python bench/robots.py --device cuda:0 --num-envs 4096 --steps 50 --robots go2 panda
tar cf "$OUT/results.tar" -C bench/results/ . 2>/dev/null
echo "== done at $((SECONDS - start)) s" | tee -a "$log"
