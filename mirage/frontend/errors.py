"""Errors a user of the PyTorch frontend can cause.  Each says what is wrong and what to do."""

from __future__ import annotations

from mirage.errors import MirageError


class FrontendError(MirageError):
    """Base class of the frontend's errors."""


class UnsupportedProgramError(FrontendError):
    """``superoptimize`` got something that is not a module, a function or a kernel graph."""


class ExampleInputsError(FrontendError):
    """The example inputs cannot be used to capture the program."""


class CaptureError(FrontendError):
    """``torch.export`` could not capture the program."""


class OptionError(FrontendError):
    """An option name is unknown or its value is out of range."""


class InputError(FrontendError):
    """A call does not match what was captured."""


class InputCountError(InputError):
    """A call passes a different number of inputs than were captured."""


class InputTypeError(InputError):
    """A call passes a tensor where a non-tensor was captured, or the other way round."""


class InputDTypeError(InputError):
    """A tensor has a different dtype than the one captured."""


class InputDeviceError(InputError):
    """A tensor is on a different device than the one captured."""


class InputShapeError(InputError):
    """A tensor has a shape the (fixed-shape) kernel graph cannot take."""


class InputGradError(InputError):
    """An input requires a gradient; mirage modules compute forward passes only."""


class ExecutorError(FrontendError):
    """The requested way of running subprograms is not available here."""
