"""run_record.py: identity differences, checkpoint manifests and the OUTPUT_DIR lock (in-process)."""

import dataclasses
import json
import multiprocessing
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import cpu_config
from safetensors.torch import load_file, save_file

import run_record
from guards import InputError


def test_differences_list_structural_changes_first():
    saved = {"LR": 2e-4, "LORA_R": 16, "data_sha256": "a", "SEED": 1}
    now = {"LR": 1e-4, "LORA_R": 8, "data_sha256": "b", "SEED": 1}
    assert run_record.differences(saved, now) == [
        "LORA_R: checkpoint 16, now 8",
        "LR: checkpoint 0.0002, now 0.0001",
        "data_sha256: checkpoint 'a', now 'b'",
    ]
    assert run_record.differences(saved, dict(saved)) == []


def test_identity_names_data_by_content_not_path(tmp_path):
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    a.write_text('{"x": 1}\n{"x": 2}\n')
    b.write_text(a.read_text())
    c.write_text('{"x": 2}\n{"x": 1}\n')  # same bytes, other order
    ident = {
        p: run_record.identity(cpu_config(DATA_PATH=str(p)), 2, {"hidden_size": 8, "transformers_version": "5"})
        for p in (a, b, c)
    }
    assert ident[a] == ident[b] and ident[a]["data_sha256"] != ident[c]["data_sha256"]
    other_version = run_record.identity(
        cpu_config(DATA_PATH=str(a)), 2, {"hidden_size": 8, "transformers_version": "6"}
    )
    assert other_version == ident[a] and ident[a]["global_batch"] == 2 * 1 * 8  # ranks x MICRO_BATCH x ACCUM_STEPS
    elsewhere = run_record.identity(  # the same model under another path (a moved checkout), as config.json says
        cpu_config(DATA_PATH=str(a), MODEL_ID="./moved/model"), 2, {"hidden_size": 8, "_name_or_path": "./moved/model"}
    )
    assert {k: v for k, v in elsewhere.items() if k != "by_path"} == {
        k: v for k, v in ident[a].items() if k != "by_path"
    }
    assert run_record.differences(ident[a], elsewhere) == []
    # saved before session 21: the model known by its path, the config hashed with it; compared so still
    older = {k: v for k, v in ident[a].items() if k not in ("tokenizer_sha256", "by_path")} | ident[a]["by_path"]
    assert run_record.differences(older, ident[a]) == []
    assert run_record.differences(older, elsewhere) == [
        f"MODEL_ID: checkpoint {older['MODEL_ID']!r}, now './moved/model'",
        f"model_config_sha256: checkpoint {older['model_config_sha256']!r}, now "
        f"{elsewhere['by_path']['model_config_sha256']!r}",
    ]


def test_the_weights_are_known_by_their_content_wherever_they_lie(tmp_path, tiny_model_path):
    """A copy of the model folder has the same weights; other weights under the same folder do not, and refuse a
    checkpoint trained on the first (its adapter is a correction to those weights)."""
    copy, other = tmp_path / "copy", tmp_path / "other"
    for folder in (copy, other):
        shutil.copytree(tiny_model_path, folder)
    weights = load_file(str(other / "model.safetensors"))
    save_file({name: w * 1.5 for name, w in weights.items()}, str(other / "model.safetensors"), {"format": "pt"})
    fingerprint = run_record.weights_sha256(str(tiny_model_path))
    assert run_record.weights_sha256(str(copy)) == fingerprint != run_record.weights_sha256(str(other))
    weights = load_file(str(copy / "model.safetensors"))  # the same tensors in two shards, a .bin beside: the same
    names = sorted(weights)
    (copy / "model.safetensors").unlink()
    for k, part in enumerate((names[::2], names[1::2])):
        save_file(
            {n: weights[n] for n in part}, str(copy / f"model-0000{k + 1}-of-00002.safetensors"), {"format": "pt"}
        )
    (copy / "pytorch_model.bin").write_bytes(b"unused")
    assert run_record.weights_sha256(str(copy)) == fingerprint
    one = next(n for n in names[1::2] if weights[n].nbytes <= 1 << 16)  # one value of a tensor read whole
    weights[one].view(-1)[weights[one].numel() // 2] += 1
    save_file({n: weights[n] for n in names[1::2]}, str(copy / "model-00002-of-00002.safetensors"), {"format": "pt"})
    assert run_record.weights_sha256(str(copy)) != fingerprint
    checkpoint = saved_run(tmp_path / "step-00000002", {"model_weights_sha256": fingerprint}, 2)
    run_record.check_same_weights(checkpoint, {"model_weights_sha256": fingerprint})
    with pytest.raises(InputError, match=r"step-00000002 was trained on other base weights than MODEL_ID's now"):
        run_record.check_same_weights(checkpoint, {"model_weights_sha256": run_record.weights_sha256(str(other))})
    older = saved_run(tmp_path / "step-00000001", {}, 1)  # saved before the weights were recorded: not checked
    run_record.check_same_weights(older, {"model_weights_sha256": fingerprint})


def saved_run(folder, identity, step, trainer_state=True, epoch=0, step_in_epoch=None):
    """A folder as train_ddp.py publishes it: a checkpoint, or (without trainer_state.pt) the final adapter; by
    default `step` steps into the first epoch."""
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 40)
    if trainer_state:
        (folder / "trainer_state.pt").write_bytes(b"state" * 100)
    in_epoch = step if step_in_epoch is None else step_in_epoch
    run_record.write_run_json(folder, {"identity": identity}, {"epoch": epoch, "step": step, "step_in_epoch": in_epoch})
    run_record.write_manifest(folder)
    return folder


@pytest.fixture
def checkpoint(tmp_path):
    return saved_run(tmp_path / "step-00000002", {"LR": 2e-4}, 2)


def test_an_intact_checkpoint_has_no_damage(checkpoint):
    assert run_record.damage(checkpoint) is None


@pytest.mark.parametrize(
    "harm,expected",
    [
        (
            lambda f: f.write_bytes(f.read_bytes()[:100]),
            r"adapter_model.safetensors has 100 bytes, the manifest says 10240",
        ),
        (
            lambda f: f.write_bytes(f.read_bytes()[:50] + b"\xff\xfe" + f.read_bytes()[52:]),
            r"does not match its checksum",
        ),
        (
            lambda f: f.write_bytes(f.read_bytes() + b"x"),  # was called "(truncated?)"
            r"adapter_model.safetensors has 10241 bytes, the manifest says 10240 \(written to after the save, or "
            r"edited\)$",
        ),
        (lambda f: f.unlink(), r"adapter_model.safetensors is missing"),
        (lambda f: (f.parent / run_record.MANIFEST).unlink(), r"no readable manifest.json"),
        (lambda f: (f.parent / run_record.MANIFEST).write_text("[]"), r"no readable manifest.json \(TypeError\)"),
        (
            lambda f: (f.parent / run_record.MANIFEST).write_text('{"files": {"run.json": 1}}'),
            r"no readable manifest.json \(ValueError\): incomplete, or not written by this script",
        ),
    ],
    ids=["truncated", "two-bytes-flipped", "grown", "file-missing", "no-manifest", "manifest-a-list", "entry-a-number"],
)
def test_damage_names_the_file_and_the_problem(checkpoint, harm, expected):
    harm(checkpoint / "adapter_model.safetensors")
    assert re.search(expected, run_record.damage(checkpoint)), run_record.damage(checkpoint)


def test_a_manifest_that_leaves_out_a_file_the_resume_reads_is_damage(checkpoint):
    """A file missing from the manifest goes unchecked: one that resume reads must be listed."""
    manifest = json.loads((checkpoint / run_record.MANIFEST).read_text())
    del manifest["files"]["trainer_state.pt"]
    (checkpoint / run_record.MANIFEST).write_text(json.dumps(manifest))
    assert run_record.damage(checkpoint, run_record.ADAPTER_FILES) is None
    assert run_record.damage(checkpoint, run_record.CHECKPOINT_FILES) == "manifest.json does not list trainer_state.pt"


def test_a_checkpoint_past_the_runs_last_step_is_refused(checkpoint):
    run = cpu_config(OUTPUT_DIR=str(checkpoint.parent), RESUME=str(checkpoint), RESUME_ALLOW_CHANGES=True, EPOCHS=1)
    assert run_record.checkpoint_to_resume(run, {"LR": 2e-4}, [2]) == checkpoint  # at the last step: the save remains
    with pytest.raises(
        InputError, match=r"is at step 2, 0 epoch\(s\) done, past this run.s end \(step 1, EPOCHS=\d+; LR: check"
    ):
        run_record.checkpoint_to_resume(run, {"LR": 1e-4}, [1])


@pytest.mark.parametrize(
    "changed, packing, refused",
    [
        ({"data_sha256": "b"}, False, True),  # another file's rows under the checkpoint's position
        ({"GROUP_BY_LENGTH": False}, False, True),  # another order of the same rows
        ({"MAX_LEN": 1024}, True, True),  # other packed rows
        ({"MAX_LEN": 1024}, False, False),  # the same rows, cut elsewhere
        ({"LR": 1e-4}, False, False),
    ],
)
def test_what_orders_the_rows_cannot_change_mid_epoch_and_can_at_an_epoch_end(tmp_path, changed, packing, refused):
    saved = {"data_sha256": "a", "GROUP_BY_LENGTH": True, "MAX_LEN": 2048, "LR": 2e-4, "SEED": 1}
    mid, end = (saved_run(tmp_path / f"step-0000000{i}", saved, i, epoch=i // 4, step_in_epoch=i % 4) for i in (2, 4))
    for path, mid_epoch in ((mid, True), (end, False)):
        run = cpu_config(OUTPUT_DIR=str(tmp_path), RESUME=str(path), RESUME_ALLOW_CHANGES=True, PACKING=packing)
        if refused and mid_epoch:
            with pytest.raises(InputError, match=rf"{list(changed)[0]}: checkpoint .* \(mid-epoch: cannot change\)"):
                run_record.checkpoint_to_resume(run, {**saved, **changed}, [4, 4])
        else:
            assert run_record.checkpoint_to_resume(run, {**saved, **changed}, [4, 4]) == path


def test_another_gpu_count_resumes_a_checkpoint_whose_global_batch_it_keeps_and_is_told_how(tmp_path):
    saved = saved_run(tmp_path / "step-00000002", {"global_batch": 16, "LR": 2e-4, "LORA_R": 16}, 2)  # 2 x 2 x 4

    def resume(world, micro_batch, accum):
        run = cpu_config(OUTPUT_DIR=str(tmp_path), RESUME=str(saved), MICRO_BATCH=micro_batch, ACCUM_STEPS=accum)
        now = {"global_batch": world * micro_batch * accum, "LR": 2e-4, "LORA_R": 16}
        return run_record.checkpoint_to_resume(run, now, [3, 3])

    assert resume(1, 2, 8) == saved == resume(4, 4, 1)
    refused = {
        (1, 2, 4): "checkpoint 16, now 8): on 1 rank, MICRO_BATCH x ACCUM_STEPS = 16 (now 2 x 4) resumes it; or start",
        (4, 3, 1): "now 12): on 4 ranks, MICRO_BATCH x ACCUM_STEPS = 4 (now 3 x 1) resumes it; or start fresh",
        (
            3,
            2,
            4,
        ): "now 24): its global batch of 16 splits over 1, 2, 4, 8, 16 ranks, not 3: start fresh with RESUME=''",
    }
    for layout, says in refused.items():
        with pytest.raises(InputError, match=re.escape(says)):
            resume(*layout)

    def refusal(allow_changes, **now):  # on 1 rank at 2 x 4, with other changes too
        run = cpu_config(OUTPUT_DIR=str(tmp_path), RESUME=str(saved), RESUME_ALLOW_CHANGES=allow_changes)
        run = dataclasses.replace(run, MICRO_BATCH=2, ACCUM_STEPS=4)
        with pytest.raises(InputError) as e:
            run_record.checkpoint_to_resume(run, {"global_batch": 8, "LR": 2e-4, "LORA_R": 16, **now}, [3, 3])
        return str(e.value)

    other_lr = "= 16 (now 2 x 4), with RESUME_ALLOW_CHANGES=1 for the other changes, resumes it; or start fresh"
    assert other_lr in refusal(False, LR=1e-4)
    assert "= 16 (now 2 x 4) resumes it; or" in refusal(True, LR=1e-4)  # the LR change allowed already
    lora_r = refusal(True, LORA_R=8)  # never continues: no advice but a fresh start
    assert lora_r.endswith(
        "(LORA_R: checkpoint 16, now 8; global_batch: checkpoint 16, now 8): start fresh with RESUME='', or use "
        "another OUTPUT_DIR"
    ), lora_r
    # an identity saved before global_batch is compared by the two factors it held
    assert (
        run_record.differences({"world_size": 2, "samples_per_rank_step": 8, "LR": 1}, {"global_batch": 16, "LR": 1})
        == []
    )


def test_a_complete_run_is_told_the_setting_that_trains_it_longer(tmp_path):
    """A complete run said "to train longer, more EPOCHS with RESUME_ALLOW_CHANGES=1" in every case: after a run
    that MAX_STEPS ended, mid-epoch, with no checkpoint, both more EPOCHS and a larger MAX_STEPS were refused."""
    run = cpu_config(OUTPUT_DIR=str(tmp_path), MAX_STEPS=2)
    saved_run(tmp_path / "adapter", {"LR": 2e-4}, 2, trainer_state=False)
    assert run_record.how_to_train_longer(run, 2, [6, 6]) == (
        f"it left no checkpoint to continue in {tmp_path / 'checkpoints'}: training longer starts over, with RESUME=''"
    )
    saved_run(tmp_path / "checkpoints" / "step-00000006", {"LR": 2e-4}, 6)
    assert run_record.how_to_train_longer(run, 2, [6, 6]) == (
        "to train longer, a larger MAX_STEPS with RESUME_ALLOW_CHANGES=1"
    )
    assert run_record.how_to_train_longer(dataclasses.replace(run, MAX_STEPS=0), 12, [6, 6]) == (
        "to train longer, more EPOCHS with RESUME_ALLOW_CHANGES=1"
    )
    assert run_record.how_to_train_longer(dataclasses.replace(run, MAX_STEPS=12), 12, [6, 6]) == (
        "to train longer, a larger MAX_STEPS and more EPOCHS with RESUME_ALLOW_CHANGES=1"
    )


def test_a_run_counts_only_the_epochs_max_steps_lets_it_reach(tmp_path):
    """EPOCHS=1000 MAX_STEPS=50 read every epoch's steps up front: with PACKING each one packed, minutes of silence
    on every start; EPOCHS=1e8 took 45 s and 2.7 GB a rank."""
    import train_ddp as T

    read = []

    def steps():  # 3 steps an epoch, as train_ddp counts them: each epoch made when first read, once
        return T.PerEpoch(lambda epoch: read.append(epoch) or 3)

    run, counted = cpu_config(OUTPUT_DIR=str(tmp_path), EPOCHS=10**6, MAX_STEPS=7), steps()
    assert run_record.last_step(run, counted) == 7 and run_record.last_step(run, counted) == 7 and read == [0, 1, 2]
    read.clear()
    assert run_record.last_step(run, steps(), {"step": 4, "epoch": 1, "step_in_epoch": 1}) == 7 and read == [1, 2]
    saved_run(tmp_path / "adapter", {"LR": 2e-4}, 7, trainer_state=False, epoch=2, step_in_epoch=1)
    saved_run(tmp_path / "checkpoints" / "step-00000006", {"LR": 2e-4}, 6, epoch=2, step_in_epoch=0)
    read.clear()
    assert run_record.how_to_train_longer(run, 7, steps()) == "to train longer, a larger MAX_STEPS with " + (
        "RESUME_ALLOW_CHANGES=1"
    )
    assert read == [2]  # from the adapter's epoch, as last_step counted it


def test_data_changed_at_an_epoch_boundary_keeps_the_steps_of_the_epochs_done(tmp_path):
    """RESUME_ALLOW_CHANGES=1 and other data after an epoch: the run's length was counted as if every epoch ran on
    the new data, so smaller data trained nothing more (the old weights saved as the result) and larger data ran
    past the last epoch (IndexError)."""
    last = saved_run(tmp_path / "checkpoints" / "step-00000004", {"data_sha256": "a"}, 4, epoch=1, step_in_epoch=0)
    run = cpu_config(OUTPUT_DIR=str(tmp_path), RESUME=str(last), RESUME_ALLOW_CHANGES=True, EPOCHS=1)
    progress = run_record.progress_of(last)
    assert run_record.checkpoint_to_resume(run, {"data_sha256": "b"}, [6]) == last
    assert run_record.last_step(run, [6], progress) == 4  # EPOCHS=1 is done: the adapter is saved
    more = dataclasses.replace(run, EPOCHS=2)
    for new in ([2, 2], [9, 9]):  # smaller data, larger data: the second epoch is the new data's
        assert run_record.checkpoint_to_resume(more, {"data_sha256": "b"}, new) == last
        assert run_record.last_step(more, new, progress) == 4 + new[1]
    assert run_record.last_step(dataclasses.replace(more, MAX_STEPS=7), [9, 9], progress) == 7
    saved_run(tmp_path / "adapter", {"data_sha256": "a"}, 4, trainer_state=False, epoch=1, step_in_epoch=0)
    auto = dataclasses.replace(run, RESUME="auto")
    assert run_record.finished(auto, {"data_sha256": "b"}, [6]) is not None  # complete: its one epoch is done
    assert run_record.how_to_train_longer(auto, 4, [6]) == "to train longer, more EPOCHS with RESUME_ALLOW_CHANGES=1"
    assert run_record.finished(dataclasses.replace(auto, EPOCHS=2), {"data_sha256": "b"}, [2, 2]) is None
    past = saved_run(tmp_path / "step-00000008", {"data_sha256": "a"}, 8, epoch=2, step_in_epoch=0)
    with pytest.raises(
        InputError, match=r"step-00000008 is at step 8, 2 epoch\(s\) done, past this run's end \(step 8"
    ):
        run_record.checkpoint_to_resume(dataclasses.replace(run, RESUME=str(past)), {"data_sha256": "a"}, [4])


def test_saves_past_a_runs_start_are_set_aside_not_deleted(tmp_path):
    ckpts = tmp_path / "checkpoints"
    for step in (2, 4, 6):
        saved_run(ckpts / f"step-{step:08d}", {"LR": 2e-4}, step)
    saved_run(tmp_path / "adapter", {"LR": 2e-4}, 7, trainer_state=False)
    saved_run(ckpts / "step-9", {"LR": 2e-4}, 2)  # renamed by hand, and resumed from: stays where the ranks read it
    assert run_record.set_aside_later_saves(str(tmp_path), 9, None) is None
    line = run_record.set_aside_later_saves(str(tmp_path), 2, ckpts / "step-9")
    (aside,) = ckpts.glob("set-aside-*")
    assert line == (
        f"what another line of training saved past step 2 (step-00000004, step-00000006, adapter) was moved to "
        f"{aside}: RESUME=auto continues this run"
    )
    assert sorted(p.name for p in ckpts.glob("step-*")) == ["step-00000002", "step-9"]
    assert sorted(p.name for p in aside.iterdir()) == ["adapter", "step-00000004", "step-00000006"]
    assert run_record.damage(aside / "step-00000006", run_record.CHECKPOINT_FILES) is None


@pytest.mark.parametrize("case", ["another-tool", "edited", "edited-past-the-start"])
def test_an_adapter_this_script_did_not_save_as_it_is_is_set_aside_not_replaced(tmp_path, case):
    """A PEFT adapter from another tool in OUTPUT_DIR/adapter (no run.json), or this run's own adapter edited since
    (adapter_config.json before an upload), was deleted by the run's final save without a word."""
    adapter = saved_run(tmp_path / "adapter", {"LR": 2e-4}, 6, trainer_state=False)
    saved, edited = (
        '{"base_model_name_or_path": "/models/tiny"}',
        '{"base_model_name_or_path": "google/gemma-4-12B-it"}',
    )
    (adapter / "adapter_config.json").write_text(saved)
    run_record.write_manifest(adapter)  # as saved
    (adapter / "adapter_config.json").write_text(edited)
    if case == "another-tool":
        (adapter / "run.json").unlink()
    else:  # resumed at the adapter's step (nothing left to train), or before it (its steps are trained again)
        at = 3 if case == "edited-past-the-start" else 6
        resumed = saved_run(tmp_path / "checkpoints" / f"step-{at:08d}", {"LR": 2e-4}, at)
    run = cpu_config(OUTPUT_DIR=str(tmp_path), RESUME="auto")
    assert run_record.finished(run, {"LR": 2e-4}, [3, 3]) is None  # not this script's adapter: not "complete"
    if case == "another-tool":
        with pytest.raises(InputError) as refused:
            run_record.checkpoint_to_resume(run, {"LR": 2e-4}, [3, 3])
        assert str(refused.value) == (
            f"{adapter} is not a final adapter as train_ddp.py saves one (no run.json: another tool's?) and "
            f"{tmp_path / 'checkpoints'} holds no checkpoint to continue: train from scratch with RESUME='' (it is "
            f"moved aside, into checkpoints/set-aside-<time>), or use another OUTPUT_DIR"
        )
        resumed = None
    line = run_record.set_aside_later_saves(str(tmp_path), int(resumed.name[5:]) if resumed else 0, resumed)
    (aside,) = (tmp_path / "checkpoints").glob("set-aside-*")
    problem = (
        "no run.json: another tool's?"
        if case == "another-tool"
        else f"adapter_config.json has {len(edited)} bytes, the manifest says {len(saved)} (written to after the "
        "save, or edited)"
    )
    assert line == f"{adapter} ({problem}) was moved to {aside}: this run's adapter takes its place"
    assert not adapter.exists()
    assert json.loads((aside / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] == (
        "google/gemma-4-12B-it"
    )


def test_pruning_removes_only_what_the_checkpoint_wrote(tmp_path):
    """shutil.rmtree took a user's notes kept in an old checkpoint's folder; and on a checkpoint moved to another
    disk and linked back, it raised at every later save (rmtree refuses a link), so the run never finished."""
    ckpts = tmp_path / "checkpoints"
    plain = saved_run(ckpts / "step-00000002", {"LR": 2e-4}, 2)
    noted = saved_run(ckpts / "step-00000004", {"LR": 2e-4}, 4)
    (noted / "my-notes.md").write_text("lr looked too high here")
    elsewhere = saved_run(tmp_path / "other-disk" / "step-00000006", {"LR": 2e-4}, 6)
    (ckpts / "step-00000006").symlink_to(elsewhere)
    assert run_record.prune(plain) is None and not plain.exists()
    said = run_record.prune(noted)
    (aside,) = ckpts.glob("set-aside-*")
    assert said == f"pruned {noted}, but it held what the job did not write (my-notes.md): moved to {aside}"
    assert [p.name for p in (aside / "step-00000004").iterdir()] == ["my-notes.md"] and not noted.exists()
    said = run_record.prune(ckpts / "step-00000006")
    assert said == f"pruned {ckpts / 'step-00000006'}, a link: what it pointed to ({elsewhere}) is kept"
    assert not (ckpts / "step-00000006").exists() and run_record.damage(elsewhere, run_record.CHECKPOINT_FILES) is None


def test_an_eval_file_changed_since_the_checkpoint_is_said_at_resume(tmp_path):
    """The resumed run evaluated another EVAL_PATH content without a word: metrics.jsonl's eval curve mixed two
    eval sets (only eval_targets showed it)."""
    checkpoint = tmp_path / "step-00000002"
    checkpoint.mkdir()
    run_record.write_run_json(checkpoint, {"identity": {}, "eval_sha256": "a"}, {"epoch": 0, "step": 2})
    assert run_record.eval_data_changed(checkpoint, "b", "eval.jsonl") == (
        "warning: EVAL_PATH's content (eval.jsonl) differs from the one step-00000002 was evaluated on: eval_loss "
        "from here on is not comparable with the earlier values in metrics.jsonl"
    )
    assert run_record.eval_data_changed(checkpoint, "a", "eval.jsonl") is None
    assert run_record.eval_data_changed(checkpoint, "", "") is None  # EVAL_PATH dropped: said where an eval is due


def test_a_second_job_is_refused_with_the_holders_identity(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / ".lock").write_text(
            json.dumps({"host": socket.gethostname(), "pid": holder.pid, "started": "then"})
        )
        with pytest.raises(
            InputError,
            match=rf"in use by another job \(host {socket.gethostname()}, pid {holder.pid}, started then\)",
        ):
            run_record.OutputLock(str(tmp_path)).acquire()
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_whose_pid_now_names_another_process_is_taken_over_but_not_another_containers(tmp_path):
    """pids are reused (a restarted container numbers its processes as the last one did): a lock whose pid runs but
    started at another time, or is this very process, is stale. A lock from another pid namespace (a container
    beside this one under the same host name) names a pid that means nothing here: it holds until it goes
    unrefreshed, as another host's does."""
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        holder = run_record.process_identity(alive.pid)
        space, boot, started = holder.split()
        assert started != run_record.process_identity(os.getpid()).split()[2]

        def lock(pid, process):
            (tmp_path / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": pid, "process": process}))
            return run_record.OutputLock(str(tmp_path))

        beside = f"pid:[1] {boot} {started}"  # another container's job, whose pid happens to be free or ours here
        for pid, process in [(alive.pid, holder), (alive.pid, None), (os.getpid(), beside), (2**22 + 7, beside)]:
            with pytest.raises(InputError, match=f"pid {pid}"):
                lock(pid, process).acquire()
        for pid, process in [(alive.pid, f"{space} {boot} 1"), (os.getpid(), None)]:
            lock(pid, process).acquire().release()
            assert not list(tmp_path.glob(".lock*"))
        old = time.time() - run_record.OutputLock.STALE_AFTER_S - 1
        taken = lock(os.getpid(), beside)
        os.utime(tmp_path / ".lock", (old, old))
        taken.acquire().release()  # another container's, unrefreshed for ten minutes
    finally:
        alive.kill()
        alive.wait()


def take_the_lock_at_once(folder, barrier, held) -> None:
    barrier.wait()
    try:
        lock = run_record.OutputLock(str(folder)).acquire()
    except InputError:
        return
    held.put(os.getpid())
    time.sleep(0.2)  # hold it while the other tries
    lock.release()


def test_two_jobs_taking_the_lock_at_the_same_moment_never_both_hold_it(tmp_path):
    """The lock was created empty, then written: a job that read it in between took it for a dead job's, deleted
    it and took its own (both held it in 9 of 10 rounds started together)."""
    fork = multiprocessing.get_context("fork")
    for attempt in range(10):
        barrier, held = fork.Barrier(2), fork.Queue()
        jobs = [fork.Process(target=take_the_lock_at_once, args=(tmp_path / str(attempt), barrier, held)) for _ in "ab"]
        (tmp_path / str(attempt)).mkdir()
        for job in jobs:
            job.start()
        for job in jobs:
            job.join(30)
        holders = [held.get(timeout=5) for _ in range(held.qsize())]
        assert len(holders) == 1, f"round {attempt}: {len(holders)} jobs held the lock"
        assert not list((tmp_path / str(attempt)).glob(".lock*"))


def test_a_lock_left_by_a_dead_job_is_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "started": "then"}))
    lock = run_record.OutputLock(str(tmp_path))
    lock.acquire()
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    lock.release()
    assert not list(tmp_path.glob(".lock*"))  # the stale one too


def test_releasing_a_lock_not_yet_taken_leaves_another_jobs_lock_alone(tmp_path):
    """A rank's stop handler holds OUTPUT_DIR's lock before taking it (an exit while taking it must release it):
    an exit before it is taken releases nothing, even while another job holds the folder."""
    other = {"host": socket.gethostname(), "pid": os.getppid(), "started": "then"}  # a live job's
    (tmp_path / ".lock").write_text(json.dumps(other))
    run_record.OutputLock(str(tmp_path)).release()
    assert run_record.lock_holder(str(tmp_path)) == other


def test_a_stop_while_the_lock_is_being_taken_leaves_no_lock(tmp_path, monkeypatch):
    """A stop thread's release() read no holder while the main thread was taking the lock, which then stayed after
    the exit (10 minutes for a rerun on another host): the release now waits for the take, and no take follows."""
    linking, link = threading.Event(), os.link

    def slow_link(source, target):  # the take, caught between writing the lock aside and linking it into place
        linking.set()
        time.sleep(0.5)
        link(source, target)

    monkeypatch.setattr(os, "link", slow_link)
    lock = run_record.OutputLock(str(tmp_path))
    taking = threading.Thread(target=lock.acquire)
    taking.start()
    assert linking.wait(5)
    lock.release()  # as GracefulStop.leave() does, from its own thread
    taking.join(5)
    assert not list(tmp_path.glob(".lock*"))
    with pytest.raises(InputError, match="stopped before it took"):
        lock.acquire()
    assert not list(tmp_path.glob(".lock*"))


@pytest.mark.parametrize("text", ['{"host": "vm"}', "[1, 2]"], ids=["no-pid", "a-list"])
def test_a_lock_file_not_written_by_this_script_is_stale(tmp_path, text):
    (tmp_path / ".lock").write_text(text)
    lock = run_record.OutputLock(str(tmp_path)).acquire()
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    lock.release()


def test_taking_the_lock_clears_what_a_job_killed_mid_save_left(tmp_path, capsys):
    """A kill between publish_atomically's two renames leaves the old adapter as .old-adapter and no adapter;
    a kill while writing leaves a .tmp-step-N that no later save of that name may ever replace."""
    ckpts = tmp_path / "checkpoints"
    for folder, name in [(ckpts, ".tmp-step-00000005"), (ckpts, "step-00000003"), (ckpts, ".old-step-00000003")]:
        (folder / name).mkdir(parents=True)
        (folder / name / "adapter_model.safetensors").write_bytes(name.encode())
    (tmp_path / ".old-adapter").mkdir()
    (tmp_path / ".old-adapter" / "run.json").write_text("{}")
    (tmp_path / ".tmp-adapter").mkdir()
    (tmp_path / ".tmp-notes").mkdir()  # the user's own: not a name this script writes
    lock = run_record.OutputLock(str(tmp_path)).acquire()
    lock.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-notes", "adapter", "checkpoints"]
    assert (tmp_path / "adapter" / "run.json").read_text() == "{}"  # the previous complete adapter, put back
    assert [p.name for p in ckpts.iterdir()] == ["step-00000003"]
    assert (ckpts / "step-00000003" / "adapter_model.safetensors").read_bytes() == b"step-00000003"
    said = capsys.readouterr().out
    assert f"{tmp_path / 'adapter'} put back" in said and f"{ckpts / '.tmp-step-00000005'} removed" in said, said


def test_a_lock_from_another_host_is_stale_only_when_nobody_refreshes_it(tmp_path):
    path = tmp_path / ".lock"
    path.write_text(json.dumps({"host": "elsewhere", "pid": 1, "started": "then"}))
    with pytest.raises(InputError, match="in use by another job"):
        run_record.OutputLock(str(tmp_path)).acquire()
    old = time.time() - run_record.OutputLock.STALE_AFTER_S - 1
    os.utime(path, (old, old))
    lock = run_record.OutputLock(str(tmp_path))
    lock.acquire()
    lock.release()


def test_resume_picks_the_newest_intact_checkpoint(tmp_path, capsys):
    ckpts, identity = tmp_path / "checkpoints", {"LR": 2e-4}
    for name in ("step-00000002", "step-00000004", ".old-step-00000005", ".tmp-step-00000006"):
        saved_run(ckpts / name, identity, 2)
    (ckpts / "step-00000007").mkdir()  # empty: a folder someone made by hand, or a copy that never finished
    run = cpu_config(OUTPUT_DIR=str(tmp_path), RESUME="auto")
    assert run_record.checkpoint_to_resume(run, identity, [2, 2]) == ckpts / "step-00000004"
    assert (
        f"skipping damaged checkpoint {ckpts / 'step-00000007'}: no readable manifest.json" in capsys.readouterr().out
    )
    assert run_record.checkpoint_to_resume(dataclasses.replace(run, RESUME=""), identity, [2, 2]) is None
    with pytest.raises(InputError, match="is not an intact checkpoint folder: no readable manifest.json"):
        run_record.checkpoint_to_resume(dataclasses.replace(run, RESUME=str(ckpts / "step-00000007")), identity, [2, 2])


def test_resume_given_the_final_adapter_says_it_is_not_a_checkpoint(tmp_path):
    identity = {"LR": 2e-4}
    adapter = saved_run(tmp_path / "adapter", identity, 2, trainer_state=False)
    saved_run(tmp_path / "checkpoints" / "step-00000002", identity, 2)
    run = cpu_config(OUTPUT_DIR=str(tmp_path), RESUME=str(adapter))
    with pytest.raises(InputError) as refused:
        run_record.checkpoint_to_resume(run, identity, [1, 1])
    assert str(refused.value) == (
        f"RESUME={str(adapter)!r} is a final adapter, not a checkpoint: it has no trainer_state.pt (no optimizer "
        f"state, no progress), so training cannot continue from it; RESUME takes a checkpoint folder "
        f"(OUTPUT_DIR/checkpoints/step-N), 'auto' (the newest in OUTPUT_DIR) or '' (a fresh start)"
    )
    checkpoint = tmp_path / "checkpoints" / "step-00000002"  # beside it, the same run's checkpoint resumes
    assert (
        run_record.checkpoint_to_resume(dataclasses.replace(run, RESUME=str(checkpoint)), identity, [1, 1])
        == checkpoint
    )


TAKES = r"RESUME takes a checkpoint folder \(OUTPUT_DIR/checkpoints/step-N\), 'auto' \(the newest in OUTPUT_DIR\) or ''"
SWITCH = (
    r"is not a switch: for a fresh start, RESUME='' \(empty\); for the newest checkpoint in OUTPUT_DIR, "
    r"RESUME='auto'; for a given checkpoint, its folder$"
)


@pytest.mark.parametrize(
    "resume,expected",
    [
        (
            "runs/out/checkpoints/step-00000009",
            rf"^RESUME='runs/out/checkpoints/step-00000009': no such folder; {TAKES}",
        ),
        ("notes.txt", rf"^RESUME='notes.txt' is a file, not a checkpoint folder; {TAKES}"),
        (
            "empty",
            r"^RESUME='empty' is not an intact checkpoint folder: no readable manifest.json \(FileNotFoundError\)",
        ),
        *[(word, rf"^RESUME='{word}' {SWITCH}") for word in ("0", "false", "No", "NONE", "off")],
    ],
    ids=["missing", "file", "no-manifest", "0", "false", "No", "NONE", "off"],
)
def test_a_resume_path_that_is_no_checkpoint_folder_says_what_it_is_and_what_resume_takes(
    tmp_path, monkeypatch, resume, expected
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("a file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=expected):
        run_record.checkpoint_to_resume(cpu_config(OUTPUT_DIR=str(tmp_path), RESUME=resume), {"LR": 2e-4}, [2])


THIS_RUN = {"LR": 1e-4, "global_batch": 16, "data_sha256": "a"}


def output_dir_after_a_run(tmp_path, saved, step, with_checkpoint=False):
    """OUTPUT_DIR as a run of identity `saved` left it after `step` steps: its adapter, and maybe a checkpoint."""
    saved_run(tmp_path / "adapter", saved, step, trainer_state=False)
    if with_checkpoint:
        saved_run(tmp_path / "checkpoints" / "step-00000003", saved, 3)
    return tmp_path


@pytest.mark.parametrize(
    "saved,step,listed",
    [
        ({**THIS_RUN, "LR": 2e-4}, 6, "LR: adapter 0.0002, now 0.0001"),
        ({**THIS_RUN, "global_batch": 32}, 2, "global_batch: adapter 32, now 16; steps: adapter 2, now 6"),
        (THIS_RUN, 2, "steps: adapter 2, now 6"),
    ],
    ids=["other-lr", "other-global-batch-and-incomplete", "this-run-incomplete"],
)
def test_an_adapter_of_another_run_with_no_checkpoint_to_continue_is_not_trained_over_unasked(
    tmp_path, saved, step, listed
):
    out = output_dir_after_a_run(tmp_path, saved, step)
    with pytest.raises(InputError) as refused:
        run_record.checkpoint_to_resume(cpu_config(OUTPUT_DIR=str(out), RESUME="auto"), THIS_RUN, [3, 3])
    assert str(refused.value) == (
        f"{out / 'adapter'} is the final adapter of another run ({listed}) and {out / 'checkpoints'} holds no "
        f"checkpoint to continue: train from scratch over it (replacing that adapter) with RESUME='', or use "
        f"another OUTPUT_DIR"
    )


@pytest.mark.parametrize(
    "saved,with_checkpoint,resume,answer",
    [
        (THIS_RUN, False, "auto", ""),  # complete: nothing to train
        (
            {**THIS_RUN, "data_sha256": "b"},
            False,
            "auto",
            "; DATA_PATH's content differs from the data it was trained on (now.jsonl)",
        ),
        ({**THIS_RUN, "LR": 2e-4}, True, "auto", None),  # checkpoint_to_resume continues or refuses the checkpoint
        ({**THIS_RUN, "LR": 2e-4}, False, "", None),  # asked for a fresh start
    ],
    ids=["this-run-complete", "this-run-other-data", "other-lr-with-a-checkpoint", "other-lr-fresh-start"],
)
def test_an_adapter_is_left_to_the_run_when_complete_or_a_checkpoint_or_a_fresh_start_decides(
    tmp_path, saved, with_checkpoint, resume, answer
):
    out = output_dir_after_a_run(tmp_path, saved, 6, with_checkpoint)
    run = cpu_config(OUTPUT_DIR=str(out), RESUME=resume, DATA_PATH="now.jsonl")
    assert run_record.finished(run, THIS_RUN, [3, 3]) == answer


def test_only_the_checkpoints_the_job_wrote_are_resumed_or_pruned(tmp_path):
    """A user's copy named step-latest or step-20 sorted above step-00000023 by name, and RESUME=auto went back to it
    on every run; a backup step-00000020.bak was pruned with the checkpoints."""
    for name in ("step-00000023", "step-00000005", "step-latest", "step-20", "step-00000020.bak", ".tmp-step-00000024"):
        (tmp_path / name).mkdir()
    (tmp_path / "step-00000001.tar.gz").write_bytes(b"")
    assert [p.name for p in run_record.checkpoints_in(tmp_path)] == ["step-00000005", "step-00000023"]
    assert run_record.checkpoints_in(tmp_path / "absent") == []


def test_a_file_where_the_adapter_goes_is_replaced_and_leaves_nothing_behind(tmp_path):
    """It was renamed to .old-adapter and left there, and every later run died on it (NotADirectoryError)."""
    (tmp_path / "adapter").write_text("a user's notes")
    run_record.publish_atomically(tmp_path / "adapter", lambda f: (f.mkdir(), (f / "x").write_text("x")), 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"] and (tmp_path / "adapter" / "x").is_file()
    (tmp_path / ".old-adapter").write_text("left by a kill between the renames")
    assert run_record.remove_interrupted_saves(tmp_path) == [] and not (tmp_path / ".old-adapter").exists()
