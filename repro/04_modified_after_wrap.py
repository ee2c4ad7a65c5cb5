"""Mode 4: the model is changed after the DDP wrap -> DDP's hooks don't match the trained params.

DDP decides at construction which parameters it synchronises: those with requires_grad=True at
that moment get an autograd hook and a slot in a gradient bucket. Anything changed later is
invisible to it. Two shapes (--variant):
  adapters  LoRA injected into model.module after wrapping: DDP hooked the (then trainable) base
            weights, which PEFT freezes; the new lora_A/lora_B have no hook at all
  unfreeze  a frozen layer (here the final norm) unfrozen after wrapping

SYMPTOM  No error, no hang: training "works", but each rank updates the new parameters with its own
         local gradient only, so the replicas drift apart; per-rank checksums differ after step 1,
         and which rank's checkpoint you keep decides what you get. (adapters also allocates
         gradient buckets for the whole base model: about 2 bytes/param extra on a 12B model.)
CAUSE    No all-reduce for parameters DDP did not register at wrap time.
FIX      Do every change first, wrap last: get_peft_model, freezing/unfreezing, gradient
         checkpointing, then DDP(model).   [--fix]
SPOT IT  Compare a checksum of the trainable parameters across ranks (all_gather) after a few
         steps; TORCH_DISTRIBUTED_DEBUG=INFO with TORCH_CPP_LOG_LEVEL=INFO logs DDP's
         num_parameter_tensors at construction: compare it with the number of tensors with
         requires_grad at step 1.

    torchrun --standalone --nproc_per_node=2 repro/04_modified_after_wrap.py [--variant adapters|unfreeze] [--fix]
"""

import argparse
import datetime
import hashlib
import json
import os
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
ap.add_argument("--variant", choices=["adapters", "unfreeze"], default="adapters")
ap.add_argument("--fix", action="store_true")
ap.add_argument("--timeout", type=seconds, default=20, help="process-group timeout, seconds")
ap.add_argument("--model", default=str(ROOT / "assets" / "tiny-gemma4"))
args = ap.parse_args()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from collate import PadCollate  # noqa: E402

cuda = torch.cuda.is_available()
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(dev)  # one GPU per process, by LOCAL_RANK
dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=args.timeout))
rank, world = dist.get_rank(), dist.get_world_size()

tok = AutoTokenizer.from_pretrained(args.model)
rows = [json.loads(line) for line in open(ROOT / "assets" / "sample_chat.jsonl")][rank::world][
    :2
]  # each rank its own data
ids = [tok.apply_chat_template(r["messages"], tokenize=True, return_dict=False) for r in rows]
batch = {k: v.to(dev) for k, v in PadCollate(tok.pad_token_id)([{"input_ids": i, "labels": i} for i in ids]).items()}

torch.manual_seed(0)  # same weights and adapter init on every rank
model = AutoModelForCausalLM.from_pretrained(args.model).to(dev)
lora = LoraConfig(
    r=4, lora_alpha=8, target_modules=r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
)


def change(m):  # the modification: add adapters, or unfreeze the final norm of a LoRA model
    if args.variant == "adapters":
        get_peft_model(m, lora)  # injects lora layers into m in place and freezes its base weights
    else:
        m.get_submodule("base_model.model.model.language_model.norm").weight.requires_grad_(True)


if args.variant == "unfreeze":
    model = get_peft_model(model, lora)
if args.fix:
    change(model)  # every change first ...
ddp = DDP(model, device_ids=[dev.index] if cuda else None)  # ... then wrap
if not args.fix:
    change(ddp.module)  # bug: DDP has already registered its hooks
trained = {n: p for n, p in ddp.module.named_parameters() if p.requires_grad}
opt = torch.optim.AdamW(trained.values(), lr=1e-2)
for _ in range(3):
    ddp(**batch).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def sha(t):
    return hashlib.sha256(t.detach().float().cpu().numpy().tobytes()).hexdigest()[:16]


mine = [sha(p) for p in trained.values()] + [sha(torch.cat([p.flatten() for p in trained.values()]))]
gathered = [None] * world
dist.all_gather_object(gathered, mine)
differ = [n for i, n in enumerate(trained) if len({g[i] for g in gathered}) > 1]
drift = bool(differ)
if rank == 0:
    what = "LoRA adapters added" if args.variant == "adapters" else "final norm unfrozen"
    print(f"{what} {'BEFORE' if args.fix else 'AFTER'} the DDP wrap; {len(trained)} trained tensors, 3 steps")
    for r, g in enumerate(gathered):
        print(f"  rank {r}: sha256 of all trained parameters {g[-1]}")
    example = f", e.g. {differ[0]}" if differ else ""
    print(f"  {len(differ)} of {len(trained)} trained tensors differ across ranks{example}")
    if drift:
        print(
            f"SYMPTOM: no error, but the trained parameters differ on ranks {list(range(world))} after 3 steps "
            "(checksums above): the replicas drifted."
        )
        print(
            f"CAUSE:   {what} after DDP(model): DDP has no hook for those parameters, "
            "so their gradients are never all-reduced."
        )
        print("FIX:     apply get_peft_model / freezing / unfreezing BEFORE wrapping in DDP (--fix).")
        print(
            "SPOT IT: nothing in the logs; an all_gather of a checksum of the trained parameters differs across ranks; "
            "TORCH_DISTRIBUTED_DEBUG=INFO TORCH_CPP_LOG_LEVEL=INFO logs DDP's num_parameter_tensors at the wrap: "
            "not the number of trainable tensors."
        )
    elif args.fix:
        print("OK (--fix): identical checksums on every rank; DDP all-reduced every trained parameter")
    else:
        print(f"NOT REPRODUCED (no --fix): identical checksums on ranks {list(range(world))}")
sys.stdout.flush()
if drift and rank != 0:
    time.sleep(1.5)  # let rank 0 print the summary before torchrun tears the job down
if not drift:
    dist.destroy_process_group()
os._exit(0 if args.fix and not drift else 1)
