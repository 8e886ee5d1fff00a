#!/bin/sh
# The A/B of a change on this machine: the full benchmark on the code before it, then on this checkout with the
# code before measured beside it in bridge_load's windows, then bench/ab.py's table (ab.md in the after run).
# Both runs use THIS checkout's bench/ (copied into the worktree), so both have the same scenarios and rows.
#
#   bench/ab_full.sh [COMMIT [OUT]]     # root, from the checkout's top; COMMIT defaults to 7b56778 (before the node cost work)
#
# OUT (default bench/results/<date>-<host>-full-node-cost) gets the after run; OUT-before the run of COMMIT. The
# worktree lives beside this checkout (../before-COMMIT: the kubelet is found in ../shared/kubelet from there)
# and is removed at the end. About 30 minutes on a 2-core machine: run it with nothing else measuring.
set -eu
commit=${1:-7b56778}
out=${2:-bench/results/$(date +%F)-$(hostname)-full-node-cost}
worktree=../before-$commit
python=.venv/bin/python

git worktree add --detach "$worktree" "$commit"
trap 'git worktree remove --force "$worktree"' EXIT
rm -rf "$worktree/bench"
cp -a bench "$worktree/bench"
"$python" "$worktree/bench/suite.py" --mode full --out "$out-before"
"$python" bench/suite.py --mode full --out "$out" --before-code "$worktree"
"$python" bench/ab.py "$out-before/results.json" "$out/results.json"
