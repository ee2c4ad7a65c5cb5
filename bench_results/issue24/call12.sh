# Session 7, GPU call 12 (nvidia-h200, 1 GPU, one run at a time; nvidia-h200-x2 not lent).
# 1. The right-padded NaN fix (lm_loss: no padding mask for right-padded rows): the GPU attention tests, then the
#    new finite-gradient test once more with the fix taken out (it must fail there).
# 2. frugal compiled with the vision/audio embedders left out (568fd33) and the fix: peak against 24.5 GiB.
# 3. the same with torch._functorch.config.activation_memory_budget = 0.5 (set by a sitecustomize on the path,
#    an experiment only): does the partitioner's recompute lower the peak inside the compiled backward?
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -q -m gpu tests/test_attention.py -p no:cacheprovider > $OUT/gpu-attention.out 2>&1; echo "== gpu attention tests: exit $?"
cp lm_loss.py /tmp/lm_loss.py
python3 - <<'PY'
s = open("lm_loss.py").read()
i = s.index("        elif right_padded:")
j = s.index("            attention_mask = None\n", i) + len("            attention_mask = None\n")
open("lm_loss.py", "w").write(s[:i] + s[j:])
PY
timeout 120 python3 -m pytest -q -m gpu tests/test_attention.py -k finite -p no:cacheprovider > $OUT/gpu-finite-without-fix.out 2>&1; echo "== finite test without the fix (must fail): exit $?"
cp /tmp/lm_loss.py lm_loss.py
B="python3 bench.py --steps 6 --run-timeout 220"
timeout 240 $B --runs frugal --set COMPILE_LAYERS=1 --out /tmp/b/frugal-compile > $OUT/frugal-compile.out 2>&1; echo "== frugal-compile: exit $?"
mkdir -p /tmp/amb && echo "import torch._functorch.config as c; c.activation_memory_budget = 0.5" > /tmp/amb/sitecustomize.py
PYTHONPATH=/tmp/amb:$PYTHONPATH timeout 240 $B --runs frugal --set COMPILE_LAYERS=1 --out /tmp/b/frugal-compile-amb05 > $OUT/frugal-compile-amb05.out 2>&1; echo "== frugal-compile-amb05: exit $?"
tar czf $OUT/logs.tgz -C /tmp/b .
tail -n 3 $OUT/gpu-attention.out; grep -E "passed|failed|assert" $OUT/gpu-finite-without-fix.out | tail -4
for name in frugal-compile frugal-compile-amb05; do grep "^   {" $OUT/$name.out | cut -c1-400; tail -n 1 $OUT/$name.out; done
