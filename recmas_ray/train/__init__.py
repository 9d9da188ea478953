"""Training of RecursiveMAS links on Ray Train.

    core.py          shared by both loops: LR schedule, data order, run storage (local or URI), sealed
                     checkpoints and resume, fault hooks for tests, the TorchTrainer launch
    inner.py         inner-loop numerics (loss, step); inner_worker.py the Ray Train worker; inner_job.py the driver
    outer.py         outer-loop stage numerics; stage.py one pipeline stage; pipeline.py the Ray Train job
    data.py          rows, role targets and prompts shared by both loops; reference.py the single-process check

Configs live in `recmas_ray.train.config`. Import the submodules directly; this package imports nothing
heavy on its own.
"""
