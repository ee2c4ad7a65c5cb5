"""Mode 2: parameters that never receive a gradient -> DDP fails at the SECOND step.

SYMPTOM  Step 1 runs. Step 2 raises on every rank:
           RuntimeError: Expected to have finished reduction in the prior iteration before starting
           a new one. ... Parameter indices which did not receive grad for rank 0: 44 45 46 47 48 49
         (real Gemma 4 multimodal checkpoints name six indices too). In a real job this is the
         first traceback in the log of step 2; it is not a hang.
CAUSE    target_modules="all-linear" also puts LoRA on the vision and audio embedders' projections.
         A text-only batch never runs them, so their lora_A/lora_B get no gradient, DDP's reducer
         waits for them, and the iteration never finishes its reduction.
FIX      Scope the adapters to the text decoder with the regex
           .*language_model.*\\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)   [--fix]
         find_unused_parameters=True also runs [--fix=find_unused], but it walks the autograd graph
         after every forward and still all-reduces the dead adapters: use it only when which
         parameters are used truly depends on the data.
SPOT IT  Rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL: the error then lists the parameter NAMES
         instead of indices. Without it, map index i to
         [n for n, p in model.module.named_parameters() if p.requires_grad][i] (done below).

    torchrun --standalone --nproc_per_node=2 repro/02_unused_parameters.py [--fix[=scope|find_unused]]
"""

import argparse
import datetime
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def seconds(text):  # argparse type of --timeout: a bad value is refused before any process group starts
    t = float(text)
    if not 1 <= t <= 86400:  # also refuses nan and inf; under 1 s, start-up itself times out
        raise argparse.ArgumentTypeError(f"must be 1 to 86400 seconds, got {text}")
    return t


ap = argparse.ArgumentParser()  # parsed before the slow imports: a bad option is refused at once
ap.add_argument("--fix", nargs="?", const="scope", choices=["scope", "find_unused"])
ap.add_argument("--timeout", type=seconds, default=20, help="process-group timeout, seconds")
ap.add_argument("--model", default=str(ROOT / "assets" / "tiny-gemma4"))
args = ap.parse_args()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from collate import PadCollate  # noqa: E402

SCOPED = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"

cuda = torch.cuda.is_available()
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(device)  # one GPU per process, by LOCAL_RANK
dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=args.timeout))
rank, world = dist.get_rank(), dist.get_world_size()

tok = AutoTokenizer.from_pretrained(args.model)
rows = [json.loads(line) for line in open(ROOT / "assets" / "sample_chat.jsonl")][rank::world][:4]
examples = [
    {"input_ids": ids, "labels": ids}
    for ids in (tok.apply_chat_template(r["messages"], tokenize=True, return_dict=False) for r in rows)
]
batch = {k: v.to(device) for k, v in PadCollate(tok.pad_token_id)(examples).items()}

torch.manual_seed(0)  # same adapter init on every rank
model = AutoModelForCausalLM.from_pretrained(args.model).to(device)
targets = SCOPED if args.fix == "scope" else "all-linear"
model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
names = [n for n, p in model.named_parameters() if p.requires_grad]  # DDP's parameter index order
n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
model = DDP(model, device_ids=[device.index] if cuda else None, find_unused_parameters=args.fix == "find_unused")
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
if rank == 0:
    print(f"target_modules={targets!r}: {len(names)} LoRA tensors, {n_train:,} trainable parameters")

error = None
for step in (1, 2, 3):
    try:
        t0 = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(
            f"[rank {rank}] step {step} ok, local loss {loss.item():.4f}, {time.perf_counter() - t0:.2f} s", flush=True
        )
    except RuntimeError as e:
        error = str(e)
        print(f"[rank {rank}] step {step} FAILED: {error.splitlines()[0]}", flush=True)
        break

if error is None:
    dist.destroy_process_group()
    if rank == 0:
        why = (
            "adapters only on the text decoder, every one gets a gradient"
            if args.fix == "scope"
            else "DDP walked the autograd graph for unused parameters after every forward "
            "(costly; the dead adapters are still all-reduced)"
        )
        print(
            f"OK (--fix={args.fix}): 3 steps on {world} ranks; {why}"
            if args.fix
            else f"NOT REPRODUCED (no --fix): 3 steps on {world} ranks without an error"
        )
    sys.stdout.flush()
    os._exit(0 if args.fix else 1)  # no interpreter teardown: a DDP object outliving its process group can abort (gloo)

m = re.search(r"did not receive grad for rank (\d+): ([\d ]+)", error)
idx = [int(i) for i in m.group(2).split()] if m else []
print(f"[rank {rank}] parameter indices without grad: {idx}", flush=True)
if rank == 0:
    print("  which are:", *[f"    {i}: {names[i]}" for i in idx], sep="\n")
    modules = sorted({names[i].rsplit(".lora_", 1)[0].removeprefix("base_model.model.") for i in idx})
    print(
        f"SYMPTOM: step 1 passed; step 2 raised 'Expected to have finished reduction in the prior iteration' "
        f"on every rank (ranks 0..{world - 1}), parameter indices {idx}."
    )
    print(
        f"CAUSE:   all-linear put LoRA on {', '.join(modules) or 'the multimodal embedders'}; "
        "text-only batches never use them, so they get no gradient."
    )
    print(
        f"FIX:     target_modules={SCOPED!r} (--fix); "
        "find_unused_parameters=True (--fix=find_unused) works but costs a graph walk per step."
    )
    print(
        "SPOT IT: the log's first traceback comes at step 2 (step 1 passes; no hang), ending in 'Parameter indices "
        "which did not receive grad'; TORCH_DISTRIBUTED_DEBUG=DETAIL names them: modules a text batch never runs."
    )
sys.stdout.flush()
if rank != 0:
    time.sleep(1.5)  # let rank 0 print the summary before torchrun tears the job down
os._exit(1)
