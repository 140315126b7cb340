// Element-wise operators on shared-memory tiles, and fused chains of them applied in registers.
//
// An operator is a functor on fp32 values: unary `float operator()(float)`, binary
// `float operator()(float, float)`. A fused thread graph is a Chain of unary functors applied
// left to right, so that `make_chain(MulScalar{0.5f}, Exp{})` computes exp(0.5 x). Chains can be
// passed wherever an operator or an epilogue is accepted (element-wise ops, reductions,
// accumulators, matmul write-back, output savers), so intermediates never reach shared memory.
#pragma once

#include "layout.cuh"

namespace mirage::dev {

// ---- unary operators ----------------------------------------------------------------------

struct Identity {
  static constexpr float kLinearScale = 1.0f;  // x · 1 (read by gen::OnlineSoftmax)
  MIRAGE_DEVICE float operator()(float x) const { return x; }
};
struct Exp {
  MIRAGE_DEVICE float operator()(float x) const { return expf(x); }
};
struct Log {
  MIRAGE_DEVICE float operator()(float x) const { return logf(x); }
};
struct Sqrt {
  MIRAGE_DEVICE float operator()(float x) const { return sqrtf(x); }
};
struct Square {
  MIRAGE_DEVICE float operator()(float x) const { return x * x; }
};
struct Sigmoid {
  MIRAGE_DEVICE float operator()(float x) const { return 1.0f / (1.0f + expf(-x)); }
};
struct Tanh {
  MIRAGE_DEVICE float operator()(float x) const { return tanhf(x); }
};
// log(1 + e^x), and x itself above 20 (torch's softplus: there the two agree to float32's precision)
struct Softplus {
  MIRAGE_DEVICE float operator()(float x) const { return x > 20.0f ? x : log1pf(expf(x)); }
};
// the precise forms near 0 (ln(1 + x), e^x − 1), the error function, sine and cosine (full range
// reduction: sinf and cosf, not the fast intrinsics)
struct Log1p {
  MIRAGE_DEVICE float operator()(float x) const { return log1pf(x); }
};
struct Expm1 {
  MIRAGE_DEVICE float operator()(float x) const { return expm1f(x); }
};
struct Erf {
  MIRAGE_DEVICE float operator()(float x) const { return erff(x); }
};
struct Sin {
  MIRAGE_DEVICE float operator()(float x) const { return sinf(x); }
};
struct Cos {
  MIRAGE_DEVICE float operator()(float x) const { return cosf(x); }
};
// x * sigmoid(x)
struct Silu {
  MIRAGE_DEVICE float operator()(float x) const { return x / (1.0f + expf(-x)); }
};
// The exact (erf) form, as torch.nn.functional.gelu computes by default.
struct Gelu {
  MIRAGE_DEVICE float operator()(float x) const { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
};
// NaN stays NaN, as in torch.relu and torch.clamp (fmaxf and a comparison alone would give 0 or a bound).
struct Relu {
  MIRAGE_DEVICE float operator()(float x) const { return x > 0.0f || x != x ? x : 0.0f; }
};
struct MulScalar {
  float scalar;
  MIRAGE_DEVICE float operator()(float x) const { return x * scalar; }
};
struct Clamp {
  float low;
  float high;
  MIRAGE_DEVICE float operator()(float x) const { return x != x ? x : fminf(fmaxf(x, low), high); }
};

// ---- binary operators ---------------------------------------------------------------------

struct Add {
  MIRAGE_DEVICE float operator()(float a, float b) const { return a + b; }
};
struct Sub {
  MIRAGE_DEVICE float operator()(float a, float b) const { return a - b; }
};
struct Mul {
  MIRAGE_DEVICE float operator()(float a, float b) const { return a * b; }
};
struct Div {
  MIRAGE_DEVICE float operator()(float a, float b) const { return a / b; }
};
// a / sqrt(b) (a Div whose denominator is a Sqrt, fused by the lowering): rsqrtf's one SFU op
// instead of IEEE sqrt's and division's sequences with their slow-path branches; within 2 ulp.
// MIRAGE_PROBE_IEEE_DIV_SQRT=1 builds the two IEEE operations instead (for comparisons).
#ifndef MIRAGE_PROBE_IEEE_DIV_SQRT
#define MIRAGE_PROBE_IEEE_DIV_SQRT 0
#endif
struct DivSqrt {
  MIRAGE_DEVICE float operator()(float a, float b) const {
    if constexpr (MIRAGE_PROBE_IEEE_DIV_SQRT) return a / sqrtf(b);
    return a * rsqrtf(b);
  }
};
struct Pow {
  MIRAGE_DEVICE float operator()(float a, float b) const { return powf(a, b); }
};
struct Maximum {
  MIRAGE_DEVICE float operator()(float a, float b) const { return fmaxf(a, b); }
};

// ---- fused chains -------------------------------------------------------------------------

template <class... Ops>
struct Chain {
  constexpr Chain() = default;
  MIRAGE_DEVICE float operator()(float x) const { return x; }
};

template <class First, class... Rest>
struct Chain<First, Rest...> {
  First first;
  Chain<Rest...> rest;
  constexpr Chain() = default;
  MIRAGE_HOST_DEVICE constexpr Chain(First head, Rest... tail) : first(head), rest(tail...) {}
  MIRAGE_DEVICE float operator()(float x) const { return rest(first(x)); }
};

template <class... Ops>
MIRAGE_HOST_DEVICE constexpr Chain<Ops...> make_chain(Ops... ops) {
  return Chain<Ops...>(ops...);
}

// ---- collective element-wise ops on shared tiles ------------------------------------------
// All threads of the block call these; each thread handles elements thread, thread + NumThreads,
// ... The output may alias an input of the same layout (each element is read and written by
// the same thread); it must not alias a broadcast input.

template <int NumThreads, class Op, class Out, class OutLayout, class In, class InLayout>
MIRAGE_DEVICE void elementwise_unary(SharedTile<Out, OutLayout> out, SharedTile<In, InLayout> in, Op op) {
  static_assert(kSameShape<OutLayout, InLayout>, "a unary op keeps the shape of its input");
  for (int i = thread_index(); i < OutLayout::size; i += NumThreads) out.store(i, op(in.load(i)));
}

// out = epilogue(op(a, b)) with NumPy broadcasting of dims of size 1.
template <int NumThreads, class Op, class Out, class OutLayout, class A, class ALayout, class B, class BLayout,
          class Epilogue = Identity>
MIRAGE_DEVICE void elementwise_binary(SharedTile<Out, OutLayout> out, SharedTile<A, ALayout> a,
                                      SharedTile<B, BLayout> b, Op op, Epilogue epilogue = {}) {
  static_assert(kBroadcastsTo<ALayout, OutLayout>, "the first input does not broadcast to the output");
  static_assert(kBroadcastsTo<BLayout, OutLayout>, "the second input does not broadcast to the output");
  for (int i = thread_index(); i < OutLayout::size; i += NumThreads) {
    int index[4];
    OutLayout::coordinates(i, index);
    const float x = to_float(a.data[broadcast_offset<ALayout>(index)]);
    const float y = to_float(b.data[broadcast_offset<BLayout>(index)]);
    out.data[OutLayout::offset_of(i)] = from_float<Out>(epilogue(op(x, y)));
  }
}

// ---- register tiles -----------------------------------------------------------------------
// A tile of layout L distributed over the block: thread t holds chunks t, t + NumThreads, ...
// of `Vector` consecutive elements of a row, in fp32 registers. An output saver writes a
// register tile with one 16-byte store per chunk when Vector * sizeof(element) == 16.
template <class L, int NumThreads, int Vector = 1>
struct RegisterTile {
  static_assert(L::cols % Vector == 0, "a chunk must lie within one row");
  using TileLayout = L;
  static constexpr int kVector = Vector;
  static constexpr int kChunks = L::size / Vector;
  static constexpr int kRounds = ceil_div(kChunks, NumThreads);

  float value[kRounds][Vector];

  static MIRAGE_DEVICE int chunk(int round) { return thread_index() + round * NumThreads; }
  static MIRAGE_DEVICE bool owns(int round) { return kChunks % NumThreads == 0 || chunk(round) < kChunks; }
  // Row-major logical index of the first element of a chunk.
  static MIRAGE_DEVICE int first_element(int round) { return chunk(round) * Vector; }

  template <class T, class SourceLayout>
  MIRAGE_DEVICE void load(SharedTile<T, SourceLayout> tile) {
    static_assert(kSameShape<SourceLayout, L>, "a register tile loads a tile of its own shape");
#pragma unroll
    for (int round = 0; round < kRounds; ++round) {
      if (!owns(round)) continue;
#pragma unroll
      for (int v = 0; v < Vector; ++v) value[round][v] = tile.load(first_element(round) + v);
    }
  }

  template <class Op>
  MIRAGE_DEVICE void apply(Op op) {
#pragma unroll
    for (int round = 0; round < kRounds; ++round) {
#pragma unroll
      for (int v = 0; v < Vector; ++v) value[round][v] = op(value[round][v]);
    }
  }

  // value = op(value, other) with `other` broadcast to L.
  template <class Op, class T, class OtherLayout>
  MIRAGE_DEVICE void combine(SharedTile<T, OtherLayout> other, Op op) {
    static_assert(kBroadcastsTo<OtherLayout, L>, "the operand does not broadcast to the register tile");
#pragma unroll
    for (int round = 0; round < kRounds; ++round) {
      if (!owns(round)) continue;
#pragma unroll
      for (int v = 0; v < Vector; ++v) {
        int index[4];
        L::coordinates(first_element(round) + v, index);
        value[round][v] = op(value[round][v], to_float(other.data[broadcast_offset<OtherLayout>(index)]));
      }
    }
  }

  template <class T, class TargetLayout>
  MIRAGE_DEVICE void store(SharedTile<T, TargetLayout> tile) const {
    static_assert(kSameShape<TargetLayout, L>, "a register tile stores into a tile of its own shape");
#pragma unroll
    for (int round = 0; round < kRounds; ++round) {
      if (!owns(round)) continue;
#pragma unroll
      for (int v = 0; v < Vector; ++v) tile.store(first_element(round) + v, value[round][v]);
    }
  }
};

}  // namespace mirage::dev
