"""train_ddp.py with one injected fault, for tests/test_recovery.py:

    FAULT=KIND@STEP[@RANK] torchrun --nproc_per_node=2 tests/faulty_train.py

The fault fires in optimizer step STEP (`*`: in every step), on RANK (or on every rank), in torchrun's first
attempt only, so a group restarted by --max_restarts resumes and finishes, as after a real one-off failure:
  nan       that step's loss is NaN (in the forward: every rank's all-reduced loss and gradients are NaN)
  term      this rank is sent SIGTERM as that step's evaluation starts (EVAL_EVERY's, or the final one)
  drift     after the update, this rank's first adapter weight moves by 1e-3: the replicas now differ
  die       after the update the process exits with code 17: no exception, no cleanup
  hang      after the update the process sleeps for an hour: its peers' next collective must time out
  desync    after the update this rank enters a barrier its peers never enter (a collective under `if rank`):
            every rank waits, alive, in a collective the others are not in, until the timeout
  vanish    after the update this rank deletes OUTPUT_DIR, as when its storage goes away
  readonly  after the update this rank remounts OUTPUT_DIR read-only (the test mounted a tmpfs there)
  save      exit with code 13 in the middle of that step's checkpoint (adapter written, trainer state not)
  oom       that step's forward (step 0: the first forward, before step 1) asks for twice the GPU's memory: a
            real CUDA out-of-memory error on a GPU; on the CPU the same error, with torch's CUDA allocator's message
  late      this rank sleeps an hour before it joins the process group (STEP is ignored): its peers wait for
            it inside init_process_group
  linger    every DataLoader iterator stays referenced until the interpreter exits (STEP is ignored), as
            the pin-memory thread can keep one on GPUs: the loaders' workers must still end with the job
Each kind patches the one thing it needs; train_ddp.main() then runs as it is.
"""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_post_hook  # noqa: E402

import guards  # noqa: E402
import lm_loss  # noqa: E402
import train_ddp as T  # noqa: E402

KIND, STEP, *RANK = os.environ["FAULT"].split("@")
KINDS = ("nan", "term", "drift", "die", "hang", "desync", "vanish", "readonly", "save", "linger", "oom", "late")
if KIND not in KINDS:
    raise SystemExit(f"FAULT={os.environ['FAULT']}: unknown kind {KIND!r}")


POSITIONS = []  # the training loop's guards.StepPosition: the step under way


def recorded(init, instances=POSITIONS):
    def init_and_record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        instances.append(self)

    return init_and_record


guards.StepPosition.__init__ = recorded(guards.StepPosition.__init__)
STOPS = []  # the job's guards.GracefulStop
guards.GracefulStop.__init__ = recorded(guards.GracefulStop.__init__, STOPS)


def fires() -> bool:
    return (
        os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        and (STEP == "*" or POSITIONS[-1].current == int(STEP))
        and (not RANK or int(RANK[0]) == dist.get_rank())
    )


def nan_loss(forward):
    def forward_with_nan(self, *args, **kwargs):
        loss, n_targets = forward(self, *args, **kwargs)
        return (loss * float("nan") if fires() else loss), n_targets

    return forward_with_nan


# torch's CUDA allocator's message (torch 2.13), for the CPU, where no allocation raises OutOfMemoryError
CPU_OOM = (
    "CUDA out of memory. Tried to allocate 279.62 GiB. GPU 0 has a total capacity of 139.81 GiB of which 138.92 GiB "
    "is free. Including non-PyTorch memory, this process has 0.88 GiB memory in use. Of the allocated memory 0.16 GiB "
    "is allocated by PyTorch, and 0.02 GiB is reserved by PyTorch but unallocated."
)


def out_of_memory(forward):
    def forward_out_of_memory(self, *args, **kwargs):
        if fires():
            if not torch.cuda.is_available():
                raise torch.OutOfMemoryError(CPU_OOM)
            torch.empty(2 * torch.cuda.get_device_properties().total_memory, dtype=torch.uint8, device="cuda")
        return forward(self, *args, **kwargs)

    return forward_out_of_memory


def after_update(optimizer, args, kwargs) -> None:
    if not fires():
        return
    if KIND == "drift":
        with torch.no_grad():
            optimizer.param_groups[0]["params"][0].add_(1e-3)
    elif KIND == "die":
        os._exit(17)
    elif KIND == "hang":
        time.sleep(3600)
    elif KIND == "desync":
        dist.barrier()
    elif KIND == "vanish":
        shutil.rmtree(os.environ["OUTPUT_DIR"])
    elif KIND == "readonly":
        subprocess.run(["mount", "-o", "remount,ro", os.environ["OUTPUT_DIR"]], check=True)


def crash_mid_save(save):
    def save_or_crash(*args, **kwargs):
        if fires():
            os._exit(13)
        return save(*args, **kwargs)

    return save_or_crash


def terminated_first(evaluate):
    def evaluate_after_sigterm(*args, **kwargs):
        if fires():
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 10
            while STOPS[-1].reason is None and time.monotonic() < deadline:  # read by the stop's own thread
                time.sleep(0.01)
        return evaluate(*args, **kwargs)

    return evaluate_after_sigterm


def joins_late(init_distributed):
    def sleep_then_join(*args, **kwargs):
        if not RANK or os.environ.get("RANK", "0") == RANK[0]:  # before the process group: no dist.get_rank()
            time.sleep(3600)
        return init_distributed(*args, **kwargs)

    return sleep_then_join


KEPT = []


def kept(dataloader_iter):
    def iter_and_keep(self):
        KEPT.append(dataloader_iter(self))
        return KEPT[-1]

    return iter_and_keep


if KIND == "nan":
    lm_loss.CausalLMLoss.forward = nan_loss(lm_loss.CausalLMLoss.forward)
elif KIND == "oom":
    lm_loss.CausalLMLoss.forward = out_of_memory(lm_loss.CausalLMLoss.forward)
elif KIND == "term":
    T.evaluate = terminated_first(T.evaluate)
elif KIND == "save":
    torch.save = crash_mid_save(torch.save)  # train_ddp writes trainer_state.pt with it, after the adapter
elif KIND == "late":
    T.init_distributed = joins_late(T.init_distributed)
elif KIND == "linger":
    torch.utils.data.DataLoader.__iter__ = kept(torch.utils.data.DataLoader.__iter__)
else:
    register_optimizer_step_post_hook(after_update)

if __name__ == "__main__":
    T.run()
