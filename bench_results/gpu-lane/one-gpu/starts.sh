# Session 20's start-up and signal changes on CUDA and NCCL (world 1), beside call.sh when the 2-GPU kind is not lent:
# more ranks than GPUs refused on every rank; Ctrl-C before training ends the rank at once; SIGHUP to torchrun at
# step 2 saves a checkpoint and the resume ends bitwise equal to an uninterrupted run.
#   run(kind=nvidia-h200, carry=[".whl"]): bash bench_results/gpu-lane/one-gpu/call.sh; bash bench_results/gpu-lane/one-gpu/starts.sh
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 MAX_LEN=256 MICRO_BATCH=2 ACCUM_STEPS=1 MAX_STEPS=12 SAVE_EVERY=0 NUM_WORKERS=2
start=$(date +%s)
timeout 120 torchrun --standalone --nproc_per_node=2 train_ddp.py > $OUT/starts_two_ranks.log 2>&1
echo "== 2 ranks on 1 GPU: exit $? in $(( $(date +%s) - start )) s"; grep -h "error:" $OUT/starts_two_ranks.log | cut -c1-220
# signal torchrun (not `timeout`, which passes signals on too) when a line appears in the log
signal_at() { sig=$1 line=$2 log=$3; shift 3
  env "$@" timeout 240 torchrun --standalone --nproc_per_node=1 train_ddp.py > $log 2>&1 & local pid=$!
  for i in $(seq 600); do grep -q "$line" $log && break; sleep 0.1; done
  t=$(date +%s.%N); pkill -$sig -f "python3? .*torchrun --standalone"; wait $pid; rc=$?
  echo "== $sig at '$line': exit $rc, $(python3 -c "print(round($(date +%s.%N) - $t, 1))") s after the signal"; }
signal_at INT "settings (default)" $OUT/starts_ctrl_c.log OUTPUT_DIR=/tmp/c1
grep -h "SIGINT" $OUT/starts_ctrl_c.log | grep -v torch | cut -c1-200; echo "lock left in OUTPUT_DIR: $(ls /tmp/c1/.lock 2>/dev/null || echo none)"
signal_at HUP "^step 2 " $OUT/starts_hup.log OUTPUT_DIR=/tmp/h1
grep -h "stopped by" $OUT/starts_hup.log | cut -c1-200
env OUTPUT_DIR=/tmp/h1 timeout 240 torchrun --standalone --nproc_per_node=1 train_ddp.py > $OUT/starts_resume.log 2>&1; echo "== resume: exit $?"
grep -h "resumed from\|adapter checksum" $OUT/starts_resume.log | cut -c1-200
env OUTPUT_DIR=/tmp/h2 timeout 240 torchrun --standalone --nproc_per_node=1 train_ddp.py > $OUT/starts_whole.log 2>&1; echo "== uninterrupted: exit $?"
python3 - <<'PY'
from safetensors.torch import load_file
a, b = (load_file(f"/tmp/{d}/adapter/adapter_model.safetensors") for d in ("h1", "h2"))
print("| check | result |\n|---|---|")
print(f"| SIGHUP at step 2, resumed == uninterrupted (bitwise) | {all(a[k].equal(b[k]) for k in a)} ({len(a)} tensors) |")
PY
