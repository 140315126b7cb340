"""The two Triton kernels SIP tuned, written here in the style of Triton's tutorials (plain pointer
arithmetic, no tensor descriptors, so the cubin launches with a plain parameter list):

* ``matmul_leaky_relu``: C = leaky_relu(A @ B), fp16 in, fp32 accumulate, fp16 out (tutorial 03);
* ``attention_forward``: softmax(Q Kᵀ · scale) V per (batch, head), fp16, online softmax (tutorial 06).

Each builder compiles the kernel with one launch and returns the compiled handle, the launch
arguments, the grid, the output indices and a torch reference of the result.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def matmul_leaky_relu(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                      stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_pid_n
    group_id = pid // group
    first_m = group_id * GROUP_M
    group_size = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % group) % group_size)
    pid_n = (pid % group) // group_size
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    accumulator = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        accumulator = tl.dot(a, b, accumulator)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    accumulator = tl.where(accumulator >= 0, accumulator, 0.01 * accumulator)
    c = accumulator.to(tl.float16)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + stride_cm * rows[:, None] + stride_cn * cols[None, :]
    tl.store(c_ptrs, c, mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def attention_forward(Q, K, V, Out, sm_scale, stride_qh, stride_qm, stride_kh, stride_kn, stride_vh,
                      stride_vn, stride_oh, stride_om, N_CTX, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      HEAD_DIM: tl.constexpr):
    start_m = tl.program_id(0)
    head = tl.program_id(1)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + head * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :])
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504
    for start_n in range(0, N_CTX, BLOCK_N):
        k = tl.load(K + head * stride_kh + (start_n + offs_n)[None, :] * stride_kn + offs_d[:, None])
        qk = tl.dot(q, k) * qk_scale
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = tl.load(V + head * stride_vh + (start_n + offs_n)[:, None] * stride_vn + offs_d[None, :])
        acc = tl.dot(p.to(tl.float16), v, acc)
        m_i = m_ij
    acc = acc / l_i[:, None]
    tl.store(Out + head * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :], acc.to(tl.float16))


def build_matmul(size: int = 2048, device: str = "cuda"):
    torch.manual_seed(0)
    a = torch.randn((size, size), device=device, dtype=torch.float16)
    b = torch.randn((size, size), device=device, dtype=torch.float16)
    c = torch.empty((size, size), device=device, dtype=torch.float16)
    meta = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}
    grid = (triton.cdiv(size, 128) * triton.cdiv(size, 128), 1, 1)
    arguments = [a, b, c, size, size, size, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                 c.stride(1)]
    compiled = matmul_leaky_relu[grid](*arguments, **meta)
    torch.cuda.synchronize()
    reference = torch.nn.functional.leaky_relu(a.float() @ b.float(), 0.01).half()
    error = (c.float() - reference.float()).norm() / reference.float().norm()
    return compiled, arguments, grid, [2], float(error)


def build_attention(batch_heads: int = 64, context: int = 2048, head_dim: int = 64, device: str = "cuda"):
    torch.manual_seed(0)
    shape = (batch_heads, context, head_dim)
    q, k, v = (torch.randn(shape, device=device, dtype=torch.float16) for _ in range(3))
    out = torch.empty_like(q)
    scale = head_dim ** -0.5
    meta = {"BLOCK_M": 128, "BLOCK_N": 64, "HEAD_DIM": head_dim, "num_warps": 4, "num_stages": 3}
    grid = (context // 128, batch_heads, 1)
    arguments = [q, k, v, out, scale, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
                 v.stride(1), out.stride(0), out.stride(1), context]
    compiled = attention_forward[grid](*arguments, **meta)
    torch.cuda.synchronize()
    reference = torch.softmax((q.float() @ k.float().transpose(1, 2)) * scale, dim=-1) @ v.float()
    error = (out.float() - reference).norm() / reference.norm()
    return compiled, arguments, grid, [3], float(error)
