"""The µGraph optimizer: from a verified µGraph to what the code generator needs.

``prepare(graph, target)`` runs the passes (online-softmax rewrite, thread-graph fusion, layout
selection, register decisions, scheduling by depth, shared-memory planning) and returns a
:class:`PreparedProgram`.  Each pass is also usable on its own; see docs/optimizer.md.
"""

from mirage.optimizer.combine import CombineError
from mirage.optimizer.errors import LayoutError, OptimizerError
from mirage.optimizer.fusion import FusionResult, fuse_block, fuse_thread_graphs
from mirage.optimizer.layout import LayoutCosts, LayoutPlan, TensorLayout, select_layouts
from mirage.optimizer.memory import Buffer, BufferKind, MemoryPlan, plan_memory
from mirage.optimizer.pipeline import (
    PIPELINE,
    OptimizerOptions,
    Pass,
    PreparedKernel,
    PreparedProgram,
    prepare,
)
from mirage.optimizer.registers import RegisterOptions, RegisterPlan, plan_registers
from mirage.optimizer.schedule import Action, Barrier, Phase, Schedule, Step, build_schedule
from mirage.optimizer.softmax import SoftmaxResult, online_softmax

__all__ = [
    "PIPELINE", "Action", "Barrier", "Buffer", "BufferKind", "CombineError", "FusionResult", "LayoutCosts",
    "LayoutError", "LayoutPlan", "MemoryPlan", "OptimizerError", "OptimizerOptions", "Pass", "Phase",
    "PreparedKernel", "PreparedProgram", "RegisterOptions", "RegisterPlan", "Schedule", "SoftmaxResult",
    "Step", "TensorLayout", "build_schedule", "fuse_block", "fuse_thread_graphs", "online_softmax",
    "plan_memory", "plan_registers", "prepare", "select_layouts",
]
