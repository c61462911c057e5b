"""--device: auto falls back to the CPU, cpu is the CPU, a GPU that is not there is a clear
configuration error (exit code 2 from the command line); the resolved device is recorded in the
run's config. All of it on a machine without CUDA (where a test needs a GPU to be "there", torch's
CUDA queries are patched: nothing is placed on it)."""
import json

import duckdb
import pytest
import torch

from core.model import device as devices
from core.config import ConfigError, TrainConfig, validate
from core.learn.distributed import Ranks
from core.commands.train import main

RUN = ["--env", "bandit", "--model", "tiny", "--steps", "1", "--group-size", "2",
       "--tasks-per-step", "1", "--max-turns", "1", "--max-new-tokens", "4", "--eval-every", "0",
       "--quiet"]


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_cpu_and_auto_without_gpu(no_gpu):
    assert devices.resolve("cpu") == torch.device("cpu")
    assert devices.resolve("auto") == torch.device("cpu")
    assert devices.resolve("AUTO ") == torch.device("cpu")
    assert devices.name(devices.resolve("auto")) == "cpu"


@pytest.mark.parametrize("asked", ["cuda", "cuda:0", "cuda:3"])
def test_gpu_asked_without_gpu_is_refused(no_gpu, asked):
    with pytest.raises(ConfigError, match=rf"device='{asked}': no CUDA GPU .*--device cpu"):
        devices.resolve(asked)


def test_bad_spelling_refused_by_validate():
    for bad in ("gpu", "cuda:", "cuda:x", "mps", ""):
        with pytest.raises(ConfigError, match="device="):
            validate(TrainConfig(device=bad))
    for good in ("auto", "cpu", "cuda", "cuda:1", "CUDA:0"):
        validate(TrainConfig(device=good))


def test_gpu_choice_when_present(two_gpus):
    """auto and cuda take GPU 0, or LOCAL_RANK's GPU under torchrun; cuda:N must exist, and is
    refused under torchrun (two ranks on one GPU)."""
    assert devices.resolve("auto") == torch.device("cuda", 0)
    assert devices.resolve("cuda") == torch.device("cuda", 0)
    assert devices.resolve("cuda:1") == torch.device("cuda", 1)
    assert devices.resolve("auto", local_rank=1, world=2) == torch.device("cuda", 1)
    assert devices.resolve("cuda", local_rank=1, world=2) == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match="GPU 2 does not exist; this machine has 2"):
        devices.resolve("cuda:2")
    with pytest.raises(ConfigError, match="GPU 2 does not exist"):
        devices.resolve("cuda", local_rank=2, world=3)
    with pytest.raises(ConfigError, match="each rank uses cuda:LOCAL_RANK"):
        devices.resolve("cuda:1", local_rank=0, world=2)
    assert devices.resolve("cpu") == torch.device("cpu")


def test_cpu_has_no_autocast_and_no_gpu_metrics():
    cpu = torch.device("cpu")
    assert not torch.is_autocast_enabled()
    with devices.autocast(cpu):
        assert torch.get_autocast_dtype("cpu") is not None and not torch.is_autocast_enabled("cpu")
    clock = devices.StepClock(cpu)
    clock.start()
    assert clock.metrics() == {}
    one = Ranks()
    one.use_device(cpu)  # a single process: nothing to set up
    assert one.tensor_group is None and one.backend == "gloo"


def test_cli_cuda_without_gpu_exits_2(no_gpu, tmp_path, capsys):
    db = tmp_path / "store.duckdb"
    for asked in ("cuda", "cuda:3"):
        assert main(RUN + ["--db", str(db), "--device", asked]) == 2
        err = capsys.readouterr().err
        assert f"error: device='{asked}': no CUDA GPU is visible" in err
    assert main(RUN + ["--db", str(db), "--device", "gpu"]) == 2
    assert "device='gpu': must be auto, cpu, cuda or cuda:N" in capsys.readouterr().err
    assert not db.exists()  # refused before any work: no store created


@pytest.mark.parametrize("asked", ["cpu", "auto"])
def test_cli_trains_on_cpu_and_records_the_device(no_gpu, tmp_path, asked):
    db = tmp_path / "store.duckdb"
    assert main(RUN + ["--db", str(db), "--device", asked]) == 0
    con = duckdb.connect(str(db), read_only=True)
    config = json.loads(con.execute("SELECT config FROM runs").fetchone()[0])
    names = {r[0] for r in con.execute("SELECT DISTINCT name FROM metrics").fetchall()}
    con.close()
    assert config["device"] == asked and config["device_resolved"] == "cpu"
    assert not any(n.startswith("gpu/") for n in names)  # no GPU, no GPU metrics
    assert "time/step_s" in names
