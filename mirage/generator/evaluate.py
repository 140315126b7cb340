"""Per-process memo of what an op does to given operands: output type (or the rule that cuts it)
and abstract expression.

The depth-first search proposes the same op on the same operands over and over (in sibling
subtrees, and under the many headers that share tiles); shape inference, which reports a mismatch
by raising an exception with a formatted message, term construction and the subexpression check
dominate its cost.  The memo is keyed by ``(for-loop range, op rank, operand type ids, operand term
ids)``: tensor types are interned to small ints; terms are hash-consed, so a term's ``id``
identifies it (each entry keeps its operand terms alive, so an ``id`` in a key is never reused by
another term).  The verdicts of the rules that depend only on the op (``checks.MEMOIZED``) are
cached with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mirage.errors import GraphError
from mirage.generator.expressions import op_term
from mirage.generator.pruning import Candidate
from mirage.generator.space import OpChoice
from mirage.mugraph.algebra import NotInterpretable
from mirage.mugraph.graph import Level, TensorType
from mirage.mugraph.ops import REGISTRY, Op, ShapeContext

SHAPE = "shape"
BATCH = "block_matmul_batch"
KERNEL = 0  # the "for-loop range" key of kernel-level ops

_MATMULS = frozenset({Op.MATMUL, Op.CONCAT_MATMUL})


class OpEvaluator:
    """``rules`` is a :class:`~mirage.generator.checks.SearchRules`; its memoizable verdicts are cached."""

    def __init__(self, rules, reduction_dimx: int, limit: int = 2_000_000) -> None:
        self.rules = rules
        self.reduction_dimx = reduction_dimx
        self.batch_rule = rules.enabled(BATCH)
        self.limit = limit
        self.types: list[TensorType] = []
        self._ids: dict[TensorType, int] = {}
        self._cache: dict[tuple, tuple] = {}
        self._shapes: dict[tuple, tuple] = {}
        self.cache_get = self._cache.get  # keys of unary/binary ops, built by callers in their hot loops
        self._contexts: dict[int, ShapeContext] = {KERNEL: ShapeContext(Level.KERNEL)}

    def intern(self, t: TensorType) -> int:
        found = self._ids.get(t)
        if found is None:
            found = self._ids[t] = len(self.types)
            self.types.append(t)
        return found

    def evaluate(
        self, forloop_range: int, rank: int, choice: OpChoice, type_ids: Sequence[int], terms: Sequence[Any]
    ) -> tuple:
        """``(failed_rule, None, None, None, 0, operand terms)`` or
        ``(None, output type, its id, term, its bytes, operand terms)``."""
        key = (forloop_range, rank, *type_ids, *map(id, terms))
        hit = self._cache.get(key)
        if hit is None:
            shaped = self._shape(forloop_range, rank, choice, type_ids)
            if shaped[0] is not None:
                hit = shaped + (None, 0, ())
            else:
                hit = self._judge(forloop_range, rank, choice, type_ids, terms, shaped[1], shaped[2])
            if len(self._cache) >= self.limit:
                self._cache.clear()  # (keeps the object: ``cache_get`` stays bound to it)
                self._shapes.clear()
            self._cache[key] = hit
        return hit

    def _shape(self, forloop_range: int, rank: int, choice: OpChoice, type_ids: Sequence[int]) -> tuple:
        """``(failed_rule, output type, its id)``, memoized on the operand types alone."""
        key = (forloop_range, rank, *type_ids)
        found = self._shapes.get(key)
        if found is not None:
            return found
        context = self._contexts.get(forloop_range)
        if context is None:
            context = ShapeContext(Level.BLOCK, forloop_range, self.reduction_dimx)
            self._contexts[forloop_range] = context
        in_types = tuple(self.types[i] for i in type_ids)
        try:
            (out,) = REGISTRY[choice.op].shape(context, in_types, choice.attrs)
        except GraphError:
            found = (SHAPE, None, None)
        else:
            batched = any(d != 1 for t in in_types for d in t.shape[:-2])
            if forloop_range != KERNEL and self.batch_rule and choice.op in _MATMULS and batched:
                found = (BATCH, None, None)
            else:
                found = (None, out, self.intern(out))
        self._shapes[key] = found
        return found

    def _judge(
        self,
        forloop_range: int,
        rank: int,
        choice: OpChoice,
        type_ids: Sequence[int],
        terms: Sequence[Any],
        out: TensorType,
        out_id: int,
    ) -> tuple:
        """The term of an op that fits its operands, and the verdict of the memoizable rules."""
        in_types = tuple(self.types[i] for i in type_ids)
        loop = max(forloop_range, 1)
        kept = tuple(terms)
        try:
            term = op_term(choice.op, choice.attrs, in_types, terms, loop, self.reduction_dimx)
        except NotInterpretable:  # an op without an abstract expression (max): never a subexpression
            return ("abstract_expression", None, None, None, 0, kept)
        level = Level.KERNEL if forloop_range == KERNEL else Level.BLOCK
        candidate = Candidate(
            level,
            choice.op,
            choice.attrs,
            (),
            in_types,
            term,
            rank,
            forloop_range=loop,
            reduction_dimx=self.reduction_dimx,
        )
        failed = self.rules.op_verdict(candidate)
        if failed is not None:
            return (failed, None, None, None, 0, kept)
        return (None, out, out_id, term, out.nbytes, kept)
