# Session 7, GPU call 3 of issue 25 (nvidia-h200, 1 GPU). Call 2's fix-compiled run was killed by its 170 s bound
# after 3 steps (a cold compile cache: its step 1 took 69.9 s against 27.7 s in the next run), so:
# 1. bench_results/issue25/nan_probe.py: which attention path gives the NaN (raw SDPA per backend; the layer pair);
# 2. call 2's fix-compiled run again (current code, the 12B cut to 6 layers, realistic mix, 60 steps), bound 300 s.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
timeout 200 python3 bench_results/issue25/nan_probe.py > $OUT/nan_probe.out 2>&1; echo "== nan_probe: exit $?"
mkdir -p /tmp/mix && python3 tools/make_chat_mix.py /tmp/mix/train.jsonl 480
python3 - <<'PY'
import json
c = json.load(open("configs/gemma-4-12b.json"))
t = c["text_config"]
t.update(num_hidden_layers=6, layer_types=t["layer_types"][:6], per_layer_config={"05": t["per_layer_config"]["05"]})
json.dump(c, open("/tmp/gemma-4-12b-6layers.json", "w"))
PY
export MODEL_CONFIG=/tmp/gemma-4-12b-6layers.json DATA_PATH=/tmp/mix/train.jsonl MAX_LEN=2048 EPOCHS=1
export MICRO_BATCH=4 ACCUM_STEPS=2 GRADIENT_CHECKPOINTING=0 ATTENTION_KERNEL=ffpa CE_CHUNK_TOKENS=1024
OUTPUT_DIR=/tmp/fix-compiled COMPILE_LAYERS=1 timeout 300 torchrun --standalone --nproc_per_node=1 train_ddp.py > $OUT/fix-compiled.log 2>&1; echo "== fix-compiled: exit $?"
grep -v "Warn\|warn" $OUT/nan_probe.out | tail -20
python3 - <<'PY'
import json, os, re
rows = [json.loads(l) for l in open("/tmp/fix-compiled/metrics.jsonl") if '"step"' in l]
skipped = [m["step"] for m in rows if m.get("skipped")]
launch = re.findall(r"([\d.]+) s since launch", open(os.environ["OUT"] + "/fix-compiled.log").read())
print(f"| fix-compiled | {len(rows)} steps | {len(skipped)} skipped {skipped[:12]} | {launch[-1] if launch else '-'} s since launch |")
PY
