"""dlaunch's worker side for PyTorch jobs: health beats, a flight recorder of collectives and
Python stacks that the dlaunch agent reads (docs/python.md).

Nothing happens on import: `import dlaunch.torch` and call `dlaunch.torch.watch(ddp_model)` after
`init_process_group`. Outside dlaunch (no DLAUNCH_* variables) every call is a no-op."""

__all__ = ["__version__"]

__version__ = "0.1.0"
