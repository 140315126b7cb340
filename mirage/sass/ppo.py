"""A learned move policy: PPO with action masking, after CuAsmRL's "assembly game".

State: one feature row per instruction (control bits, memory kind, pins, block position).  Actions:
move instruction *i* up or down by one, for the instructions of the move set; illegal actions are
masked out with the legality model before sampling, so the policy only ever proposes legal moves.
Reward: the change of measured speedup over the original, in percent, after each move; −1 and the end
of the episode when a candidate fails on the GPU.  Episodes last ``episode_length`` moves from the
original schedule.  The network is small (two 1-D convolutions over the instruction sequence and a
per-instruction action head), so it learns online on the CPU while the GPU measures.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import numpy as np

from mirage.sass import isa
from mirage.sass.kernel import Kernel
from mirage.sass.mutation import Move, candidate_moves, check_move
from mirage.sass.search import (
    Budget,
    CandidateRecord,
    KernelEvaluator,
    SearchOptions,
    SearchResult,
    StopReason,
    TopList,
    failure_window,
    out_of_time,
    progress_bar,
)

FEATURES = 34


@dataclass(frozen=True)
class PPOConfig:
    episode_length: int = 32
    steps_per_update: int = 32
    epochs: int = 4
    minibatch: int = 8
    learning_rate: float = 2.5e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip: float = 0.2
    entropy: float = 0.01
    value_coefficient: float = 0.5
    max_grad_norm: float = 0.5
    hidden: int = 64
    failure_reward: float = -1.0


def features(kernel: Kernel) -> np.ndarray:
    """One row of ``FEATURES`` numbers per instruction."""
    rows = np.zeros((len(kernel), FEATURES), dtype=np.float32)
    for position, instruction in enumerate(kernel.instructions):
        control = instruction.control
        block = kernel.block(position)
        row = rows[position]
        row[0] = control.stall / 15.0
        row[1] = float(control.yield_hint)
        row[2 + (6 if control.write_barrier is None else control.write_barrier)] = 1.0
        row[9 + (6 if control.read_barrier is None else control.read_barrier)] = 1.0
        for scoreboard in control.waits:
            row[16 + scoreboard] = 1.0
        row[22] = float(control.reuse != 0)
        memory = instruction.memory
        if memory is not None:
            row[23] = 1.0
            row[24] = float(bool(memory.reads))
            row[25] = float(bool(memory.writes))
            row[26] = float(isa.MemorySpace.GLOBAL in memory.spaces)
            row[27] = float(isa.MemorySpace.SHARED in memory.spaces)
        row[28] = float(instruction.pinned is not None)
        row[29] = float(instruction.opcode in isa.SIP_MOVABLE)
        row[30] = float(instruction.opcode in isa.MATRIX_OPCODES)
        row[31] = len(instruction.defs) / 4.0
        row[32] = len(instruction.uses) / 8.0
        row[33] = (position - block.start) / max(1, block.end - block.start - 1)
    return rows


def _network(hidden: int):
    import torch
    from torch import nn

    class Policy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(FEATURES, hidden)
            self.mix = nn.Sequential(nn.Conv1d(hidden, hidden, 5, padding=2), nn.ReLU(),
                                     nn.Conv1d(hidden, hidden, 5, padding=2), nn.ReLU())
            self.actor = nn.Linear(hidden, 2)  # per instruction: up, down
            self.critic = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

        def forward(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            hidden_rows = torch.relu(self.embed(rows))  # (batch, n, hidden)
            mixed = self.mix(hidden_rows.transpose(1, 2)).transpose(1, 2)
            logits = self.actor(mixed).reshape(rows.shape[0], -1)  # action 2*i + (0 up, 1 down)
            pooled = torch.cat([mixed.mean(dim=1), mixed.amax(dim=1)], dim=1)
            return logits, self.critic(pooled).squeeze(1)

    return Policy()


def action_mask(kernel: Kernel, options: SearchOptions) -> tuple[np.ndarray, dict[int, tuple]]:
    """Legal actions of the move set, and the stall raises each needs."""
    mask = np.zeros(2 * len(kernel), dtype=bool)
    raises: dict[int, tuple] = {}
    for move in candidate_moves(kernel, options.move_set):
        legality = check_move(kernel, move, latency=options.latency, repair_stalls=options.repair_stalls)
        if legality.ok:
            action = 2 * move.position + (0 if move.direction < 0 else 1)
            mask[action] = True
            raises[action] = legality.stall_raises
    return mask, raises


def learn(original: Kernel, evaluate: KernelEvaluator, budget: Budget, options: SearchOptions,
          config: PPOConfig = PPOConfig()) -> SearchResult:
    import torch

    torch.manual_seed(options.seed)
    generator = random.Random(options.seed)
    policy = _network(config.hidden)
    optimizer = torch.optim.Adam(policy.parameters(), lr=config.learning_rate, eps=1e-5)
    started = time.perf_counter()
    start_evaluations = evaluate.evaluations
    top = TopList()
    top.offer(1.0, original)
    records: list[CandidateRecord] = []
    state, state_speedup, episode_step = original, 1.0, 0
    buffer: list[dict] = []
    stop, step = StopReason.BUDGET, 0
    with progress_bar(budget.candidates, f"ppo {original.name}", options.progress) as bar:
        while True:
            if evaluate.evaluations - start_evaluations >= budget.candidates:
                break
            if out_of_time(started, budget):
                stop = StopReason.TIME
                break
            if step >= budget.candidates * budget.max_steps_per_candidate:
                stop = StopReason.STEPS
                break
            mask, raises = action_mask(state, options)
            if not mask.any():
                if state is original:
                    stop = StopReason.NO_MOVES
                    break
                state, state_speedup, episode_step = original, 1.0, 0
                continue
            rows = torch.from_numpy(features(state)).unsqueeze(0)
            with torch.no_grad():
                logits, value = policy(rows)
            masked = logits.masked_fill(~torch.from_numpy(mask).unsqueeze(0), -1e8)
            distribution = torch.distributions.Categorical(logits=masked)
            action = distribution.sample()
            index = int(action.item())
            move = Move(index // 2, -1 if index % 2 == 0 else 1)
            description = move.describe(state)
            candidate = state.swapped(move.swap_position, raises[index])
            result, cached = evaluate(candidate)
            episode_step += 1
            if result.speedup is None:
                reward, done = config.failure_reward, True
            else:
                reward = (result.speedup - state_speedup) * 100.0
                done = episode_step >= config.episode_length
                top.offer(result.speedup, candidate)
            buffer.append({"rows": rows, "mask": torch.from_numpy(mask).unsqueeze(0), "action": action,
                           "log_prob": distribution.log_prob(action), "value": value, "reward": reward,
                           "done": done})
            if not cached:
                records.append(CandidateRecord(step=step, distance=episode_step, status=result.status.value,
                                               speedup=result.speedup, accepted=result.speedup is not None,
                                               move=description,
                                               failed_words=failure_window(original, candidate, result)))
                bar.update(1)
                bar.set_postfix(best=f"{(top.best()[0][0] - 1) * 100:+.2f}%")
            if done:
                state, state_speedup, episode_step = original, 1.0, 0
            else:
                state, state_speedup = candidate, result.speedup or state_speedup
            step += 1
            if len(buffer) >= config.steps_per_update:
                progress = min(1.0, (evaluate.evaluations - start_evaluations) / max(1, budget.candidates))
                for group in optimizer.param_groups:
                    group["lr"] = config.learning_rate * (1.0 - 0.9 * progress)
                _update(policy, optimizer, buffer, state, config, generator)
                buffer = []
    best_speedup, best = top.best()[0]
    return SearchResult(policy="ppo", best=best, best_speedup=best_speedup, records=tuple(records),
                        stop_reason=stop, seconds=time.perf_counter() - started,
                        evaluations=evaluate.evaluations - start_evaluations, top=top.best())


def _update(policy, optimizer, buffer: list[dict], last_state: Kernel, config: PPOConfig, generator) -> None:
    import torch

    with torch.no_grad():
        _, last_value = policy(torch.from_numpy(features(last_state)).unsqueeze(0))
    rewards = [item["reward"] for item in buffer]
    values = [float(item["value"]) for item in buffer] + [float(last_value)]
    dones = [item["done"] for item in buffer]
    advantages = [0.0] * len(buffer)
    running = 0.0
    for t in reversed(range(len(buffer))):
        not_done = 0.0 if dones[t] else 1.0
        delta = rewards[t] + config.gamma * values[t + 1] * not_done - values[t]
        running = delta + config.gamma * config.gae_lambda * not_done * running
        advantages[t] = running
    returns = [a + v for a, v in zip(advantages, values[:-1], strict=True)]
    indices = list(range(len(buffer)))
    for _ in range(config.epochs):
        generator.shuffle(indices)
        for start in range(0, len(indices), config.minibatch):
            batch = indices[start: start + config.minibatch]
            advantage = torch.tensor([advantages[i] for i in batch])
            if len(batch) > 1:
                advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
            rows = torch.cat([buffer[i]["rows"] for i in batch])
            masks = torch.cat([buffer[i]["mask"] for i in batch])
            actions = torch.cat([buffer[i]["action"] for i in batch])
            old_log_probs = torch.cat([buffer[i]["log_prob"] for i in batch])
            targets = torch.tensor([returns[i] for i in batch])
            logits, value = policy(rows)
            distribution = torch.distributions.Categorical(logits=logits.masked_fill(~masks, -1e8))
            ratio = torch.exp(distribution.log_prob(actions) - old_log_probs)
            clipped = torch.clamp(ratio, 1 - config.clip, 1 + config.clip)
            policy_loss = -torch.min(ratio * advantage, clipped * advantage).mean()
            value_loss = 0.5 * ((value - targets) ** 2).mean()
            entropy = distribution.entropy().mean()
            loss = policy_loss + config.value_coefficient * value_loss - config.entropy * entropy
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm)
            optimizer.step()
