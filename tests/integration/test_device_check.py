"""``dockflow train`` with a device this machine does not have fails before the first iteration: exit 2 and one
line naming the device and what to install (the driver's check of the Ray cluster), not a worker's traceback."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this check is of a machine without CUDA")
def test_train_on_missing_cuda_exits_2_with_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "dockflow.cli", "train", "configs/grpo_arith.yaml", "engine.device=cuda",
         f"run.output_dir={tmp_path}", "ray.num_cpus=1"],
        capture_output=True, text=True, cwd=ROOT, timeout=180,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("dockflow train: error:")]
    assert errors == [
        "dockflow train: error: engine.device=cuda needs 1 GPU (actor 1) but the Ray cluster has 0: install a CUDA "
        "build of torch (and vllm for engine.backend=vllm) on nodes with NVIDIA GPUs, or set engine.device=cpu"
    ]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "grpo_arith" / "checkpoints" / "initial_model").exists()  # it failed before SFT
