#!/usr/bin/env bash
# What a borrowed GPU machine needs from here (docs/gpu_checks.md), in .gpu/ (ignored by git): the
# packages for its Python 3.12, packed by the site-packing script the GPU machine's provider gives
# (MAKE_GPU_SITE: it writes .gpu/p1/site.part.aa and .gpu/p2/site.part.ab), and beside the second
# part the Go2's and the Panda's files from this venv's example-robot-data (.gpu/p2/robots.tar.xz,
# 4 MB; the G1's 25 MB of meshes do not fit a call).
#     MAKE_GPU_SITE=<path to the site-packing script> bash bench/gpu_site.sh      (about 5 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx .gpu .git/info/exclude 2>/dev/null || echo .gpu >> .git/info/exclude
EXTRA_PKGS="trimesh==5.2.0 pycollada==0.9.3" "${MAKE_GPU_SITE:?set MAKE_GPU_SITE to the site-packing script}" .gpu
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
robots=cmeel.prefix/share/example-robot-data/robots
tar cf - -C "$site" "$robots/go2_description" "$robots/panda_description" | xz -T2 -6 > .gpu/p2/robots.tar.xz
du -bc .gpu/p1/* .gpu/p2/*
