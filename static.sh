#!/bin/bash
# static.sh NAME NODE_RANK PORT OUT T [KEY=VAL...]: torchrun --master_addr/--master_port (static rendezvous), 1 proc per node
name=$1 nr=$2 port=$3 out=$4 T=$5; shift 5
. /tmp/rp22/env.sh
cd /work/main
case $out in /*) ;; *) echo "absolute OUT please"; exit 99;; esac
s=$(date +%s)
env OUTPUT_DIR=$out "$@" timeout -k 5 $T .venv/bin/torchrun --nnodes=2 --node_rank=$nr --nproc_per_node=${NPROC:-1} \
  --master_addr=127.0.0.1 --master_port=$port train_ddp.py > /tmp/rp22/logs/$name.n$nr.log 2>&1
echo "$name node $nr: rc=$? after $(( $(date +%s) - s )) s"
