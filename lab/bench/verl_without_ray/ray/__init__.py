"""A stand-in for Ray where verl's FSDP engine runs without it (the GPU check of
``lab/bench/trl_verl_gpu_session.sh``; this folder goes on ``PYTHONPATH`` for that stage only).

``import verl`` imports ``verl.protocol``, which imports ``ray`` at its top and names
``ray.ObjectRef`` in two annotations (``DataProtoFuture``); nothing else of Ray runs on the path
the check takes (``FSDPEngine(...).initialize()`` and a forward / backward under one torchrun
process, NCCL). Ray's wheel (~70 MB with its dependencies) is not carried to the device, so this
module gives that one name and refuses every other: a use of Ray on the checked path fails with
an error naming what was used, never silently.
"""


class ObjectRef:
    """Only a name to annotate with (``list[ray.ObjectRef]``); never instantiated on the checked path."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("ray placeholder (lab/bench/verl_without_ray): ray.ObjectRef was instantiated")


def __getattr__(name):
    raise AttributeError(f"ray placeholder (lab/bench/verl_without_ray): ray.{name} was used; "
                         "this code path needs the real Ray")
