"""pipetrain: the Python client of the pipetrain pipeline-parallel training service.

    import pipetrain
    from pipetrain import data

    digits = data.load("digits")
    with pipetrain.Client("127.0.0.1:7070") as client, client.create_job(
            model="examples/mlp_digits.textproto", stages=2, microbatches=4,
            optimizer="adamw:lr=1e-2", seed=1, data=digits) as job:
        for r in job.train(data.batches(digits, batch_size=64, seed=1), steps=100):
            print(r.step, r.loss, r.bubble_fraction)

API reference: docs/python.md.
"""

from pipetrain.client import (Client, Job, StepResult, lr_schedule_spec, model_spec,
                              optimizer_spec)
from pipetrain.errors import PipetrainError, StatusCode
from pipetrain.generation import generate

__all__ = ["Client", "Job", "PipetrainError", "StatusCode", "StepResult", "generate",
           "lr_schedule_spec", "model_spec", "optimizer_spec"]
__version__ = "0.1.0"
