# Session 18: out of GPU memory while another process holds part of the GPU (a run left behind). A background
# python holds 60 GiB; the 12B with a layout far too large (oom.sh's) runs out of memory in its first forward: the
# line must say what the other process holds and plan MEMORY_TARGET_GIB for what it leaves (0.93 x (card - 60));
# the same job with that target must train its step beside the other process.
#   run(kind=nvidia-h200, carry=[".whl"]): bash bench_results/gpu-lane/one-gpu/oom_others.sh (after call.sh's install)
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -c "import torch, time; x = torch.empty(60 * 2**30, dtype=torch.uint8, device='cuda'); print('holding', flush=True); time.sleep(400)" > /tmp/holder.log 2>&1 &
holder=$!
for _ in $(seq 300); do grep -q holding /tmp/holder.log && break; sleep 0.1; done
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
job() { name=$1; shift; env "$@" timeout 280 torchrun --standalone --nproc_per_node=1 train_ddp.py > $OUT/oom_$name.log 2>&1
  echo "== $name: exit $?"; grep -hE "error:|traceback : |planner|adapter checksum|^step 1 " $OUT/oom_$name.log | cut -c1-500; }
big="MODEL_CONFIG=configs/gemma-4-12b.json MICRO_BATCH=96 ACCUM_STEPS=1 GRADIENT_CHECKPOINTING=0 MAX_STEPS=1 MAX_LEN=2048"
job others-too-large OUTPUT_DIR=/tmp/q2 $big
target=$(grep -h "error: " $OUT/oom_others-too-large.log | grep -oE "MEMORY_TARGET_GIB=[0-9]+" | head -1)
echo "== following the advice beside the other process: $target"
job others-advised OUTPUT_DIR=/tmp/q3 $big $target
kill $holder
