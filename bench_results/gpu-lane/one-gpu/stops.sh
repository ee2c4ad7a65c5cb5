# Session 12's new stops on CUDA and NCCL (world 1), beside call.sh when the 2-GPU kind is not lent: the tiny model
# on one GPU, the evaluation that agrees on a stop after every batch, a SIGTERM as step 2's evaluation starts
# (tests/faulty_train.py FAULT=term@2), its resume, and a run whose every step is non-finite (FAULT=nan@*).
#   run(kind=nvidia-h200, carry=[".whl"]): bash bench_results/gpu-lane/one-gpu/call.sh; bash bench_results/gpu-lane/one-gpu/stops.sh
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
head -40 assets/sample_chat.jsonl > /tmp/train.jsonl && sed -n 41,48p assets/sample_chat.jsonl > /tmp/eval.jsonl
export DATA_PATH=/tmp/train.jsonl EVAL_PATH=/tmp/eval.jsonl EVAL_EVERY=2 MAX_STEPS=4 MAX_LEN=256 MICRO_BATCH=2 ACCUM_STEPS=1
job() { name=$1; shift; env "$@" timeout 240 torchrun --standalone --nproc_per_node=1 "$script" > $OUT/stops_$name.log 2>&1
  echo "== $name: exit $?"; grep -hE "stopped by|resumed from|eval \||final evaluation|error: all|adapter checksum" $OUT/stops_$name.log | cut -c1-220; }
script=tests/faulty_train.py job term OUTPUT_DIR=/tmp/s1 FAULT=term@2
script=train_ddp.py job resume OUTPUT_DIR=/tmp/s1
script=train_ddp.py job whole OUTPUT_DIR=/tmp/s2
script=tests/faulty_train.py job nan OUTPUT_DIR=/tmp/s3 FAULT=nan@* EVAL_PATH=
python3 - <<'PY'
import json
from safetensors.torch import load_file
a, b = (load_file(f"/tmp/{d}/adapter/adapter_model.safetensors") for d in ("s1", "s2"))
print("| check | result |\n|---|---|")
print(f"| stopped at step 2 and resumed == uninterrupted (bitwise) | {all(a[k].equal(b[k]) for k in a)} ({len(a)} tensors) |")
print(f"| evals logged, interrupted run + resume | {[r['step'] for r in map(json.loads, open('/tmp/s1/metrics.jsonl')) if 'eval_loss' in r]} |")
print(f"| evals logged, uninterrupted | {[r['step'] for r in map(json.loads, open('/tmp/s2/metrics.jsonl')) if 'eval_loss' in r]} |")
PY
