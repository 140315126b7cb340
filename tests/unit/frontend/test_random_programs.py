"""Random PyTorch programs, none written for a test: each is captured, partitioned, lowered and run
(reference graphs through the interpreter, ``search=False``) and must give what float64 eager PyTorch
gives, on inputs other than those it was captured with. A program is a chain of two to six steps:
element-wise ops and row reductions (some spelled out by hand), binary ops against the input, the
first row or itself, and products with weights of changing widths."""

import random

import pytest
import torch
import torch.nn.functional as F

import mirage as mi
from tests.unit.frontend.frontend_calls import float64_calls


def _stable_softmax(a):
    e = torch.exp(a - a.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


UNARY = [
    torch.tanh, torch.sigmoid, torch.relu, F.silu, F.gelu, torch.neg, torch.abs,
    lambda a: a * 0.5 + 1,
    lambda a: torch.exp(a.clamp(-3, 3)),
    lambda a: F.leaky_relu(a, 0.1),
    lambda a: a.clamp(max=0.3),
    lambda a: torch.softmax(a, -1),
    _stable_softmax,
    lambda a: F.rms_norm(a, (a.shape[-1],), eps=1e-5),
    lambda a: a - a.mean(-1, keepdim=True),
    lambda a: a / (a.pow(2).sum(-1, keepdim=True) + 1).sqrt(),
]
BINARY = [
    torch.add, torch.mul, torch.sub, torch.maximum,
    lambda a, b: a / (b.abs() + 1),
    lambda a, b: torch.lerp(a, b, 0.25),
]


def _program(seed: int):
    """A random chain and its inputs (x and the weights of its products), float32."""
    rnd = random.Random(seed)
    rows, width = rnd.choice([4, 8, 16]), rnd.choice([8, 16, 32])
    generator = torch.Generator().manual_seed(seed)
    steps, weights, current = [], [], width
    for _ in range(rnd.randint(2, 6)):
        kind = rnd.random()
        if kind < 0.45:
            steps.append(("unary", rnd.choice(UNARY)))
        elif kind < 0.75:
            steps.append(("binary", rnd.choice(BINARY), rnd.choice(["input", "first_row", "itself"])))
        else:
            out = rnd.choice([current, 2 * current])
            weights.append(torch.randn(current, out, generator=generator) / current ** 0.5)
            steps.append(("product",))
            current = out

    def program(x, *ws):
        a, used = x, 0
        for step in steps:
            if step[0] == "unary":
                a = step[1](a)
            elif step[0] == "binary":
                other = {"input": x if x.shape == a.shape else a, "first_row": a[:1], "itself": a}[step[2]]
                a = step[1](a, other)
            else:
                a, used = a @ ws[used], used + 1
        return a

    return program, torch.randn(rows, width, generator=generator), weights, generator


def _check(seed: int, calls: int) -> None:
    program, x, weights, generator = _program(seed)
    fast = mi.superoptimize(program, (x, *weights), search=False, use_cache=False, progress=False)
    fresh = lambda: (torch.randn(x.shape, generator=generator), *weights)  # noqa: E731
    for got, expected in float64_calls(fast, program, fresh, calls):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()) + 1e-6)


@pytest.mark.parametrize("seed", range(100))
def test_a_random_program_gives_what_eager_float64_gives(seed):
    _check(seed, calls=1)


@pytest.mark.parametrize("seed", range(0, 100, 2))
def test_a_random_program_through_the_compiled_executor_gives_it_call_after_call(seed, gpu_like):
    """The same through the GPU path's executor (its input copies and caches), three calls."""
    _check(seed, calls=3)
