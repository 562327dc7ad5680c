# Sourced first in every call on a lent GPU machine (docs/gpu_checks.md): the packages unpacked in
# /tmp/site, and the run folders and bench results kept in /tmp, which outlives the copied tree's
# ignored folders from one call to the next (while the machine stays warm).
mkdir -p /tmp/site /tmp/keep/runs /tmp/keep/results
rm -rf runs bench/results && ln -s /tmp/keep/runs runs && ln -s /tmp/keep/results bench/results
export PYTHONPATH="/tmp/site:$PWD" WARP_CACHE_PATH=/tmp/warpcache PYTHONUNBUFFERED=1
