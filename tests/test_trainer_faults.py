"""``MBRTrainer`` under a hard fault: a training process killed with SIGKILL mid-epoch, after a checkpoint,
resumes from that checkpoint to the weights of a run that was never interrupted (fp32 tolerance)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from rerank import MBRTrainer, MBRTrainingConfig
from rerank.training_data import MBRDataConfig, build_mbr_data

from .test_training_data import SOURCES, WordCodec, overlap, tiny_bart_model

ROOT = Path(__file__).resolve().parents[1]

SETTINGS = {
    "per_device_train_batch_size": 2,
    "max_steps": 6,  # two epochs of 3 batches: the kill lands in the second epoch
    "save_strategy": "steps",
    "save_steps": 4,
    "use_cpu": True,
    "report_to": [],
    "disable_tqdm": True,
    "learning_rate": 1e-2,
    "seed": 0,
    "distill_weight": 0.3,
    "pairing": "best-worst",
    "pairs_per_source": 2,
}

CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from transformers import TrainerCallback
    from rerank import MBRTrainer, MBRTrainingConfig
    from tests.test_training_data import WordCodec, tiny_bart_model
    from tests.test_trainer_faults import SETTINGS

    folder, out, marker = sys.argv[1:4]

    class Hang(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 5:  # after checkpoint-4, mid-epoch: wait for the kill
                Path(marker).write_text("5")
                time.sleep(120)

    trainer = MBRTrainer(tiny_bart_model(), MBRTrainingConfig(output_dir=out, **SETTINGS), folder, WordCodec(),
                         callbacks=[Hang()])
    trainer.train()
    """
)


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_equals_the_uninterrupted_run(tmp_path):
    folder = tmp_path / "mbr"
    data = MBRDataConfig(num_samples=6, beams=2, shard_size=4, seed=3, precision="32", utility="chrf")
    build_mbr_data(tiny_bart_model(), WordCodec(), SOURCES, folder, data, utility=overlap, progress=False)
    out, marker = tmp_path / "killed", tmp_path / "at-step-5"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(folder), str(out), str(marker)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            if child.poll() is not None:
                pytest.fail(f"the training process ended before the kill: {child.stdout.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail("the training process did not reach step 5 in 120 s")
            time.sleep(0.1)
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
    checkpoint = out / "checkpoint-4"
    assert (checkpoint / "trainer_state.json").is_file() and not (out / "checkpoint-6").exists()

    resumed = tiny_bart_model()
    trainer = MBRTrainer(resumed, MBRTrainingConfig(output_dir=str(out), **SETTINGS), folder, WordCodec())
    trainer.train(resume_from_checkpoint=str(checkpoint))
    whole = tiny_bart_model()
    MBRTrainer(whole, MBRTrainingConfig(output_dir=str(tmp_path / "whole"), **SETTINGS), folder, WordCodec()).train()
    a, b = whole.state_dict(), resumed.state_dict()
    start = tiny_bart_model().state_dict()
    assert max(float((a[k] - start[k]).abs().max()) for k in a) > 1e-3  # the run moved the weights
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=1e-6, rtol=1e-5)
