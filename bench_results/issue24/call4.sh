# Issue 24, GPU call 4 (nvidia-h200, 1 GPU, one run at a time), at the commit that adds saved_bytes.py: what one
# compiled 12B layer saves (the memory model's compile terms) and the loss chunk's peak; then three bench runs
# (12B, 2,048-token rows, 8 samples/step): frugal's layout compiled, fast-compile without LoRA dropout (what
# dropout costs), and fast-compile at micro-batch 4 (what the 14 GiB the planner leaves unused would buy).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
timeout 120 python3 bench_results/issue24/saved_bytes.py 2048 > $OUT/saved_bytes.out 2>&1; echo "== saved_bytes: exit $?"
timeout 150 python3 bench.py --runs frugal --set COMPILE_LAYERS=1 --steps 6 --run-timeout 140 --out $OUT/frugal-compile > $OUT/frugal-compile.out 2>&1; echo "== frugal-compile: exit $?"
timeout 150 python3 bench.py --runs fast-compile --set LORA_DROPOUT=0 --steps 6 --run-timeout 140 --out $OUT/fast-compile-dropout0 > $OUT/fast-compile-dropout0.out 2>&1; echo "== fast-compile dropout 0: exit $?"
timeout 150 python3 bench.py --runs fast-compile --set MEMORY_TARGET_GIB=0 --set MICRO_BATCH=4 --set GRADIENT_CHECKPOINTING=0 --set CE_CHUNK_TOKENS=1024 --steps 6 --run-timeout 140 --out $OUT/fast-compile-micro4 > $OUT/fast-compile-micro4.out 2>&1; echo "== fast-compile micro 4: exit $?"
tail -n 30 $OUT/saved_bytes.out | cut -c1-400
for name in frugal-compile fast-compile-dropout0 fast-compile-micro4; do tail -n 1 $OUT/$name.out; done
