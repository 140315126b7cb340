"""The PyTorch frontend: capture, aten lowering, LAX partitioning, the runtime module and the
``torch.compile`` backend (registered as ``"mirage"`` when this package is imported)."""

from mirage.frontend.backend import mirage_backend, register
from mirage.frontend.capture import capture
from mirage.frontend.errors import (
    CaptureError,
    ExampleInputsError,
    ExecutorError,
    FrontendError,
    InputCountError,
    InputDeviceError,
    InputDTypeError,
    InputError,
    InputGradError,
    InputShapeError,
    InputTypeError,
    OptionError,
    UnsupportedProgramError,
)
from mirage.frontend.lowering import LOWERINGS
from mirage.frontend.options import Options
from mirage.frontend.partition import Budget, Partition, Subprogram, partition
from mirage.frontend.runtime import MirageModule

register()

__all__ = [
    "Budget", "CaptureError", "ExampleInputsError", "ExecutorError", "FrontendError", "InputCountError",
    "InputDTypeError", "InputDeviceError", "InputError", "InputGradError", "InputShapeError",
    "InputTypeError", "LOWERINGS", "MirageModule", "OptionError", "Options", "Partition", "Subprogram",
    "UnsupportedProgramError", "capture", "mirage_backend", "partition", "register",
]
