# Issue 24, GPU call 10 (nvidia-h200, 1 GPU), branch issue24-checkpoint-around-compile. Call 9's history
# (context="alloc") showed ~0.9 GiB live at frugal compiled's peak allocated from eager PEFT/RMSNorm frames under
# "torch_dynamo_resume_in_forward_at_484". This call prints whole stacks of the peak and of the largest sites.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
HISTORY_CONTEXT=alloc timeout 200 python3 bench_results/issue24/memory_peak.py MEMORY_TARGET_GIB=25 COMPILE_LAYERS=1 > $OUT/history.log 2>&1; echo "== history (alloc): exit $?"
grep -A80 "^settings:" $OUT/history.log | cut -c1-3000
