"""The versions a run records in its ``run.json`` (:class:`analysis.core.task.RunRecord`)."""

LAYERLENS_VERSION = "0.1.0"


def versions() -> dict:
    import platform

    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "layerlens": LAYERLENS_VERSION}
