"""launchers/modal_train.py at definition level, with the real `modal` package and no network: what the
Modal function declares (GPU spec, volume, timeout, secret), what it runs (torchrun over train_ddp.py,
settings as environment), what the image ships, and how `modal run` hands settings to it."""

import ast
import contextlib
import importlib.util
import os
import socket
import subprocess

import pytest
from conftest import ROOT

modal = pytest.importorskip("modal")

LAUNCHER = ROOT / "launchers" / "modal_train.py"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No Modal token, and any connection attempt is refused and fails the test (Modal's gRPC client
    resolves its server's name first, so getaddrinfo sees every attempt)."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network denied by test_launchers.py")

    for name in ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET", "MODAL_GPU", "MODAL_HF_SECRET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    yield
    assert not attempts, f"the launcher contacted the network: {attempts}"


def load(monkeypatch, **env):
    """A fresh import of the launcher: its definitions read MODAL_GPU and MODAL_HF_SECRET at import."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location("modal_train", LAUNCHER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeVolume:
    """Records what the launcher does with the volume instead of calling Modal."""

    def __init__(self):
        self.commits, self.uploads = 0, []

    def commit(self):
        self.commits += 1

    @contextlib.contextmanager
    def batch_upload(self, force=False):
        assert force, "a rerun uploads the same file again: without force Modal refuses to overwrite it"
        yield self
        self.uploads.append("closed")

    def put_file(self, local, remote):
        self.uploads.append((str(local), remote))


def test_the_function_rents_h100x8_with_the_volume_and_a_long_timeout(monkeypatch):
    info = load(monkeypatch).train.info()  # built locally for a function defined here: no network call
    assert info.gpus == [("H100", 8)]
    assert list(info.volumes) == ["/vol"]
    assert info.volumes["/vol"].name == "gemma4-lora" and not info.volumes["/vol"].read_only
    assert info.timeout >= 12 * 3600
    assert not any("from_name" in s for s in info.secrets)  # no HF token needed by default


def test_gpu_spec_and_hf_secret_are_set_from_the_local_environment(monkeypatch):
    m = load(monkeypatch, MODAL_GPU="A100-80GB:4", MODAL_HF_SECRET="huggingface")
    info = m.train.info()
    assert info.gpus == [("A100-80GB", 4)]
    assert "--nproc_per_node=4" in m.torchrun_command(m.GPU, {})[0]
    assert any("huggingface" in s for s in info.secrets)
    # the container imports the launcher again: the function hands it the same spec
    assert any("MODAL_GPU" in s for s in info.secrets)


def test_torchrun_runs_train_ddp_on_every_gpu_with_the_settings_as_environment(monkeypatch):
    m = load(monkeypatch)
    cmd, env = m.torchrun_command("H100:8", {"MODEL_ID": "google/gemma-4-12B-it", "EPOCHS": "1"})
    assert cmd == ["torchrun", "--standalone", "--nproc_per_node=8", "/root/app/train_ddp.py"]
    assert env["MODEL_ID"] == "google/gemma-4-12B-it" and env["EPOCHS"] == "1"
    assert env["HF_HOME"].startswith("/vol/") and env["OUTPUT_DIR"].startswith("/vol/")
    assert m.torchrun_command("H100:8", {"OUTPUT_DIR": "/vol/runs/a"})[1]["OUTPUT_DIR"] == "/vol/runs/a"
    assert "--nproc_per_node=1" in m.torchrun_command("H100", {})[0]


def test_the_image_ships_train_ddp_and_every_local_module_and_asset_it_reads(monkeypatch):
    # Private API (modal 1.6): an image's local files are only listed once Modal builds it, so walk the
    # lazy image's dependencies (_deps_) to its mounts and list their files with modal.mount._select_files.
    from modal._utils.async_utils import synchronizer
    from modal.mount import _Mount, _select_files

    def files(obj):
        for dep in obj._deps_():
            yield from (_select_files(dep.entries) if isinstance(dep, _Mount) else files(dep))

    m = load(monkeypatch)
    shipped = {str(remote) for _, remote in files(synchronizer._translate_in(m.image))}
    needed, todo = set(), ["train_ddp"]
    while todo:  # the repo's modules train_ddp.py imports, and theirs
        name = todo.pop()
        needed.add(f"/root/app/{name}.py")
        tree = ast.parse((ROOT / f"{name}.py").read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        todo += [i for i in imported if (ROOT / f"{i}.py").exists() and f"/root/app/{i}.py" not in needed]
    assert {"/root/app/collate.py", "/root/app/run_record.py", "/root/app/memory_budget.py"} <= needed
    assert needed <= shipped
    assert m.torchrun_command(m.GPU, {})[0][-1] in shipped
    assert {
        "/root/app/assets/sample_chat.jsonl",
        "/root/app/assets/tiny-gemma4/config.json",
        "/root/app/configs/gemma-4-12b.json",
    } <= shipped


@pytest.mark.filterwarnings("ignore:.*executing locally")
def test_train_runs_torchrun_in_the_volume_commits_it_and_raises_on_failure(monkeypatch):
    m = load(monkeypatch)
    volume, runs, returncode = FakeVolume(), [], 0

    def run(cmd, env, cwd):
        runs.append((cmd, env, cwd))
        return subprocess.CompletedProcess(cmd, returncode)

    monkeypatch.setattr(m, "volume", volume)
    monkeypatch.setattr(subprocess, "run", run)
    m.train.local({"MODEL_ID": "google/gemma-4-12B-it"})
    ((cmd, env, cwd),) = runs
    assert cmd == m.torchrun_command("H100:8", {})[0] and cwd == "/vol"
    assert env["MODEL_ID"] == "google/gemma-4-12B-it" and env["PATH"] == os.environ["PATH"]
    assert volume.commits == 1

    returncode = 1
    with pytest.raises(RuntimeError, match="exited with 1"):
        m.train.local({})
    assert volume.commits == 2  # the failed run's checkpoints are kept for the rerun


def test_main_uploads_local_data_files_into_the_volume_and_passes_the_settings(monkeypatch, tmp_path):
    m = load(monkeypatch)
    volume, calls = FakeVolume(), []
    monkeypatch.setattr(m, "volume", volume)
    monkeypatch.setattr(m.train, "remote", lambda settings: calls.append(settings))
    (tmp_path / "chat.jsonl").write_text("{}\n")
    m.main(f"DATA_PATH={tmp_path / 'chat.jsonl'}", "EVAL_PATH=data/held.jsonl", "LORA_TARGETS=.*(q|v)_proj")
    assert volume.uploads == [(str(tmp_path / "chat.jsonl"), "data/train/chat.jsonl"), "closed"]
    assert calls == [
        {"DATA_PATH": "/vol/data/train/chat.jsonl", "EVAL_PATH": "data/held.jsonl", "LORA_TARGETS": ".*(q|v)_proj"}
    ]
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        m.main("--epochs=1")
    assert len(calls) == 1


def test_modal_run_hands_key_value_arguments_to_main(monkeypatch):
    # Private API (modal 1.6): modal.cli.run.run_app starts the app on Modal; stubbed, the real CLI
    # parses `modal run launchers/modal_train.py KEY=VALUE ...` and calls main without a network call.
    from click.testing import CliRunner
    from modal.cli.entry_point import entrypoint_cli

    calls = []
    monkeypatch.setattr("modal.cli.run.run_app", lambda *args, **kwargs: contextlib.nullcontext())
    monkeypatch.setattr(modal.Function, "remote", lambda self, *args: calls.append(args))
    result = CliRunner().invoke(entrypoint_cli, ["run", str(LAUNCHER), "MODEL_ID=google/gemma-4-12B-it", "MAX_STEPS=5"])
    assert result.exit_code == 0, result.output
    assert calls == [({"MODEL_ID": "google/gemma-4-12B-it", "MAX_STEPS": "5"},)]
