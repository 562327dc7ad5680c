#!/usr/bin/env bash
# The test suite as a new user meets it: clone this repository into a fresh folder, run the README's
# test command there (a new venv, the install, pytest) under the CPU settings of this shell, and
# print the machine and those settings next to the result. Arguments go to pytest.
#
#   bash bench/fresh_machine.sh                                   # torch's and MKL's own choice
#   ATEN_CPU_CAPABILITY=avx2 bash bench/fresh_machine.sh          # torch's AVX2 kernels
#   ATEN_CPU_CAPABILITY=default bash bench/fresh_machine.sh       # torch's kernels without vector units
#   ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_CBWR=AVX2,STRICT bash bench/fresh_machine.sh  # an AVX2 CPU
#   OMP_NUM_THREADS=1 bash bench/fresh_machine.sh -m "learning or bit_exact"
#   WARM=1 bash bench/fresh_machine.sh                            # reuse this checkout's Warp kernel cache
#
# The clone is of the committed HEAD (uncommitted changes are not in it), under $TMPDIR; it is left
# there for a look and its path printed.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d "${TMPDIR:-/tmp}/legion-fresh.XXXXXX")
git clone -q "$repo" "$dir/legion-rl" || exit 1
cd "$dir/legion-rl" || exit 1
if [ "${WARM:-0}" = 1 ] && [ -d "$repo/.warp_cache" ]; then cp -r "$repo/.warp_cache" .warp_cache; fi

# The README's test command, as written there (the line that begins "Run the tests:"), with this
# script's arguments after its pytest.
command=$(grep -m1 '^Run the tests:' README.md | sed -e 's/^[^`]*`//' -e 's/`.*$//')
[ -n "$command" ] || { echo "fresh_machine: README.md has no 'Run the tests:' line" >&2; exit 1; }
echo "[fresh] $dir/legion-rl: $command $*"
start=$(date +%s)
bash -c "$command"' "$@"' fresh "$@" 2>&1 | tee pytest.log
code=${PIPESTATUS[0]}

. .venv/bin/activate
echo
echo "[fresh] machine:  $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
python - <<'EOF'
import os
import legion
import torch
legion.set_process_env()
print(f"[fresh] torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()} "
      f"(ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', 'unset')}), "
      f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', 'unset')}, "
      f"MKL_CBWR={os.environ['MKL_CBWR']}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset (the tests: 1 per worker)')}")
EOF
echo "[fresh] result:   $(grep -E '^=+ .*(passed|failed|error).* =+$' pytest.log | tail -1) (exit $code, $(( $(date +%s) - start )) s)"
exit "$code"
