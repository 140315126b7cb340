"""Exception types of the SASS tuner; all derive from :class:`mirage.errors.MirageError`."""

from __future__ import annotations

from mirage.errors import MirageError


class SassError(MirageError):
    """Base class of the errors raised by :mod:`mirage.sass`."""


class CubinFormatError(SassError):
    """The bytes are not a cubin this module can read (not ELF64, not EM_CUDA, truncated, ...)."""


class KernelNotFoundError(SassError):
    """The cubin has no ``.text.<kernel>`` section with the requested name."""


class ToolNotFoundError(SassError):
    """A CUDA binary utility (``nvdisasm``) could not be located."""


class DisassemblyError(SassError):
    """``nvdisasm`` failed, or its output could not be matched with the cubin's bytes."""


class IllegalMoveError(SassError):
    """A mutation was refused by the legality model; ``reason`` says which rule refused it."""

    def __init__(self, message: str, *, reason: str) -> None:
        self.reason = reason
        super().__init__(message)


class EditVerificationError(SassError):
    """An edited kernel did not re-disassemble to the same instructions per basic block."""


class LaunchSpecError(SassError):
    """A launch description does not fit the kernel (parameter sizes, grid, shared memory)."""


class EvaluationError(SassError):
    """The GPU evaluation of the original kernel failed, so no candidate can be judged."""


class InstructionAddressError(SassError):
    """An address does not name an instruction of the kernel (not a multiple of 16, or past the end)."""
