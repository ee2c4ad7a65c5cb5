# F2 (session 14's correctness review): after step 1 the collective timeout is DIST_TIMEOUT_S=300 s. Under
# COMPILE_LAYERS a rank that meets a new shape (or eval mode, at the first evaluation) recompiles its layers while
# the others wait in the next collective. How long is the longest such stall on the 12B? One H200, world 1 (the
# stall is one rank's own time), cold Triton/inductor caches, the realistic mix unpacked (every step's padded
# length differs), TORCH_LOGS=recompiles to list each recompile with its wall-clock time.
#   run(kind=nvidia-h200, carry=[".whl"]): bash bench_results/f2-recompile/call.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
mkdir -p /tmp/mix && python3 tools/make_chat_mix.py /tmp/mix/train.jsonl 960 && python3 tools/make_chat_mix.py /tmp/mix/eval.jsonl 32
export MODEL_CONFIG=configs/gemma-4-12b.json DATA_PATH=/tmp/mix/train.jsonl EVAL_PATH=/tmp/mix/eval.jsonl MAX_LEN=2048
export COMPILE_LAYERS=1 EPOCHS=1 EVAL_EVERY=10 TORCH_LOGS=recompiles
run() { name=$1; shift
  export TRITON_CACHE_DIR=$(mktemp -d) TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)
  env "$@" OUTPUT_DIR=/tmp/f2_$name timeout 280 torchrun --standalone --nproc_per_node=1 train_ddp.py > $OUT/$name.log 2>&1
  echo "== $name: exit $?"; cp /tmp/f2_$name/metrics.jsonl $OUT/metrics_$name.jsonl 2>/dev/null; }
run fast MEMORY_TARGET_GIB=130 MAX_STEPS=30
run frugal MEMORY_TARGET_GIB=24.5 MAX_STEPS=20
python3 bench_results/f2-recompile/table.py $OUT
