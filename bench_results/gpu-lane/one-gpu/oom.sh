# Out of GPU memory on CUDA (world 1, NCCL): the job's one line and what it advises, then the advice followed.
#   1. tests/faulty_train.py FAULT=oom@2: step 2's forward asks for twice the GPU (the tiny model): torch's real
#      allocator message, parsed into the line.
#   2. the 12B (random weights) with a layout far too large: all 96 sample rows in one micro-batch, nothing
#      checkpointed: out of memory in the first forward.
#   3. the same, with the MEMORY_TARGET_GIB that line names: the planner's layout trains a step.
#   run(kind=nvidia-h200, carry=[".whl"]): bash bench_results/gpu-lane/one-gpu/oom.sh (after call.sh's install)
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
job() { name=$1; shift; env "$@" timeout 280 torchrun --standalone --nproc_per_node=1 "$script" > $OUT/oom_$name.log 2>&1
  echo "== $name: exit $?"; grep -hE "error:|traceback : |planner|adapter checksum|^step 1 " $OUT/oom_$name.log | cut -c1-400; }
script=tests/faulty_train.py job fault OUTPUT_DIR=/tmp/o1 FAULT=oom@2 MAX_STEPS=3 MAX_LEN=256 MICRO_BATCH=2 ACCUM_STEPS=1
big="MODEL_CONFIG=configs/gemma-4-12b.json MICRO_BATCH=96 ACCUM_STEPS=1 GRADIENT_CHECKPOINTING=0 MAX_STEPS=1 MAX_LEN=2048"
script=train_ddp.py job 12b-too-large OUTPUT_DIR=/tmp/o2 $big
target=$(grep -h "error: " $OUT/oom_12b-too-large.log | grep -oE "MEMORY_TARGET_GIB=[0-9]+" | head -1)
echo "== following the advice: $target"
script=train_ddp.py job 12b-advised OUTPUT_DIR=/tmp/o3 $big $target
