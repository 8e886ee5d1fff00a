#!/bin/bash
# waits for the bridged phase of bench node, then records the daemon and one worker with py-spy
PYSPY=/work/main/.venv/bin/py-spy
for i in $(seq 1 600); do
  f=$(find /tmp -maxdepth 6 -name 'bridged-000*' 2>/dev/null | head -1)
  [ -n "$f" ] && break
  sleep 1
done
echo "bridged phase: $f at $(date +%T)"
sleep 12   # pods Ready + warmup
daemon=$(pgrep -f "shim.cli serve" | head -1)
workers=$(ps -o pid=,user=,args= -e | awk '$2=="nobody" && /probe_zygote.main/ {print $1}')
echo "daemon $daemon workers $workers"
w=$(echo $workers | awk '{print $1}')
$PYSPY record -p $daemon -d 20 -r 250 -f raw -o /work/tmp/prof/daemon.txt --nonblocking > /work/tmp/prof/d.log 2>&1 &
$PYSPY record -p $w -d 20 -r 250 -f raw -o /work/tmp/prof/worker.txt --nonblocking > /work/tmp/prof/w.log 2>&1 &
$PYSPY record -p $daemon -d 20 -r 250 -f raw --native -o /work/tmp/prof/daemon_native.txt --nonblocking > /work/tmp/prof/dn.log 2>&1 &
wait
echo done $(date +%T)
