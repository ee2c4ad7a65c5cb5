# The same probe on NCCL: every rank's loader worker stuck in the data (pin_memory on, GPU), 2 ranks on the
# machine's GPUs (nvidia-h200-x2: one each). Expect every worker's stacks, then one line per rank, within ~60 s.
#   bash bench_results/fault-probes/session25-stuck-worker/nccl.sh   (after the lane's install of .whl into /tmp/site)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
SECONDS=0
STUCK_COLLATE=1 PYTHONPATH=bench_results/fault-probes/session25-stuck-worker:.:${PYTHONPATH:-} OUTPUT_DIR=/tmp/stuck \
  DIST_TIMEOUT_S=5 MAX_LEN=128 timeout 150 torchrun --standalone --nproc_per_node=2 train_ddp.py > $OUT/stuck_nccl.log 2>&1
echo "stuck worker on NCCL: exit $? after $SECONDS s" | tee $OUT/stuck_nccl.txt
grep -c "in stuck" $OUT/stuck_nccl.log | sed 's/^/workers whose stacks name the stuck collate: /' | tee -a $OUT/stuck_nccl.txt
grep "error:\|backend" $OUT/stuck_nccl.log | cut -c1-250 | tee -a $OUT/stuck_nccl.txt
