# Session 16: the launcher's loss on CUDA and NCCL (world 1), beside call.sh when the 2-GPU kind is not lent. The
# tiny model trains up to 3,000 steps (STEPS); torchrun's agent (which holds the rendezvous store) is SIGKILLed after step 20; the
# rank must say "the launcher is gone" once, stop at its next step with a checkpoint, and the resumed run must end
# bitwise equal to an uninterrupted one.
#   run(kind=nvidia-h200, carry=[".whl"]): bash bench_results/gpu-lane/one-gpu/store_loss.sh
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
mkdir -p ${OUT:=/tmp/store-out}; head -40 assets/sample_chat.jsonl > /tmp/train.jsonl
export DATA_PATH=/tmp/train.jsonl EVAL_PATH= MAX_STEPS=${STEPS:-3000} EPOCHS=1000 MAX_LEN=256 MICRO_BATCH=2 ACCUM_STEPS=1 SAVE_EVERY=0 LOG_EVERY=1
OUTPUT_DIR=/tmp/k2 timeout 300 torchrun --standalone --nproc_per_node=1 train_ddp.py > $OUT/store_whole.log 2>&1
echo "== whole: exit $?"
OUTPUT_DIR=/tmp/k1 torchrun --standalone --nproc_per_node=1 train_ddp.py > $OUT/store_killed.log 2>&1 &
launcher=$!  # torchrun itself (no timeout wrapper: its SIGKILL is the point); bounded by the loops below
for _ in $(seq 600); do grep -q "^step 20 |" $OUT/store_killed.log && break; sleep 0.1; done
kill -9 $launcher; t0=$(date +%s.%N)
for _ in $(seq 600); do pgrep -f "train_ddp.py" > /dev/null || break; sleep 0.1; done
pkill -9 -f train_ddp.py  # (if it is still there after 60 s: that is the finding)
echo "== killed: the rank was gone $(python3 -c "import time; print(f'{time.time() - $t0:.1f}')") s after the launcher's SIGKILL"
grep -hE "launcher is gone|stopped by|error" $OUT/store_killed.log | cut -c1-220
echo "== C++ frame pages in its output: $(grep -c 'frame #0:' $OUT/store_killed.log)"
OUTPUT_DIR=/tmp/k1 timeout 300 torchrun --standalone --nproc_per_node=1 train_ddp.py > $OUT/store_resume.log 2>&1
echo "== resume: exit $?"; grep -hE "resumed from|adapter checksum" $OUT/store_resume.log $OUT/store_whole.log | cut -c1-160
python3 - <<'PY'
from safetensors.torch import load_file
a, b = (load_file(f"/tmp/{d}/adapter/adapter_model.safetensors") for d in ("k1", "k2"))
print(f"| launcher killed after step 20, resumed == uninterrupted (bitwise) | {all(a[k].equal(b[k]) for k in a)} ({len(a)} tensors) |")
PY
