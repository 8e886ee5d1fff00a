#!/bin/bash
# Run beside `bench/suite.py --mode full --only node`: waits for its bridged phase, then records the daemon and the
# busiest worker with py-spy (--native: grpc's, uvloop's and the kernel-facing C frames too), 20 s at 250 Hz.
# The same procedure as ../2026-11-26-node-bridged/record.sh (which used --nonblocking), after issue 22's changes.
set -u
PYSPY=${PYSPY:-.venv/bin/py-spy}
OUT=${1:-bench/profiles/2026-11-27-issue22-after}
for i in $(seq 1 900); do
  f=$(find /tmp -maxdepth 6 -name 'bridged-000*' 2>/dev/null | head -1)
  [ -n "$f" ] && break
  sleep 1
done
echo "bridged phase: $f at $(date +%T)"
sleep 15   # pods Ready, then the phase's warm-up
daemon=$(pgrep -f "shim.cli serve" | head -1)
worker=$(ps -o pid=,user=,pcpu=,args= -e | awk '$2=="nobody" && /probe_zygote.main/ {print $3, $1}' | sort -rn | head -1 | awk '{print $2}')
echo "daemon $daemon worker $worker"
$PYSPY record -p "$daemon" -d 20 -r 250 -f raw --native -o "$OUT/daemon.collapsed" > /dev/null 2>&1 &
$PYSPY record -p "$worker" -d 20 -r 250 -f raw --native -o "$OUT/worker.collapsed" > /dev/null 2>&1 &
wait
echo "done $(date +%T)"
