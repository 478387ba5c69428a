"""Independent NumPy references of the GRPO/DAPO core (loops; they never call the code under
test), shared by the rl/ tests."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

AGG_MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


# ----------------------------------------------------------------------------------------------
# NumPy references (loops; they never call the code under test)


def ref_advantages(rewards, scale: bool, eps: float = 1e-6, ddof: int = 1):
    """GRPO (``scale``) / Dr.GRPO advantages; the std divides by ``G - ddof`` (1: torch.std,
    as verl and TRL)."""
    rewards = np.asarray(rewards, dtype=np.float64)
    out = np.zeros_like(rewards)
    for n, group in enumerate(rewards):
        g = len(group)
        mean = sum(group) / g
        std = math.sqrt(sum((x - mean) ** 2 for x in group) / (g - ddof))
        if all(x == group[0] for x in group):
            continue
        for i, x in enumerate(group):
            out[n, i] = (x - mean) / (std + eps) if scale else x - mean
    return out


def ref_kl(logp, logp_ref, kind):
    out = np.zeros_like(logp, dtype=np.float64)
    for idx in np.ndindex(logp.shape):
        a, b = float(logp[idx]), float(logp_ref[idx])
        if kind in ("k1", "kl"):
            out[idx] = a - b
        elif kind == "abs":
            out[idx] = abs(a - b)
        elif kind in ("k2", "mse"):
            out[idx] = 0.5 * (a - b) ** 2
        else:
            d = b - a
            out[idx] = min(max(math.exp(d) - d - 1.0, -10.0), 10.0)
    return out


def ref_ppo(logp, logp_old, adv, mask, eps_low, eps_high, dual_clip):
    b_, t_ = logp.shape
    loss = np.zeros((b_, t_))
    n_tok = n_clip = n_dual = 0
    kl_sum = 0.0
    for b in range(b_):
        for t in range(t_):
            a = adv[b] if adv.ndim == 1 else adv[b, t]
            ratio = math.exp(logp[b, t] - logp_old[b, t])
            clipped_ratio = min(max(ratio, 1 - eps_low), 1 + eps_high)
            l1, l2 = -a * ratio, -a * clipped_ratio
            val = max(l1, l2)
            dual = False
            if dual_clip is not None and a < 0 and val > -a * dual_clip:
                val, dual = -a * dual_clip, True
            if mask[b, t]:
                loss[b, t] = val
                n_tok += 1
                n_clip += l2 > l1
                n_dual += dual
                kl_sum += logp_old[b, t] - logp[b, t]
    d = max(n_tok, 1)
    return loss, {"clip_frac": n_clip / d, "dual_clip_frac": n_dual / d, "approx_kl": kl_sum / d}


def ref_agg(loss, mask, mode, max_len=None):
    b_, t_ = loss.shape
    if mode == "token-mean":
        tot = cnt = 0.0
        for b in range(b_):
            for t in range(t_):
                if mask[b, t]:
                    tot += loss[b, t]
                    cnt += 1
        return tot / cnt if cnt else 0.0
    per_seq = []
    for b in range(b_):
        s = sum(loss[b, t] for t in range(t_) if mask[b, t])
        n = sum(1 for t in range(t_) if mask[b, t])
        if n == 0:
            continue
        if mode == "seq-mean-token-mean":
            per_seq.append(s / n)
        elif mode == "seq-mean-token-sum":
            per_seq.append(s)
        else:
            per_seq.append(s / (t_ if max_len is None else max_len))
    return sum(per_seq) / len(per_seq) if per_seq else 0.0


def ref_std(xs, ddof: int = 0):
    mean = sum(xs) / len(xs)
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - ddof))


def ref_overlong(length, max_len, buffer_len, penalty):
    expected = max_len - buffer_len
    if length <= expected:
        return 0.0
    if length <= max_len:
        return (expected - length) / buffer_len * penalty
    return -penalty


def central_fd(f, x, h=1e-6):
    x = np.asarray(x, dtype=np.float64)
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        g[idx] = (float(f(jnp.asarray(xp))) - float(f(jnp.asarray(xm)))) / (2 * h)
    return g


def ragged_mask():
    # lengths 3, 1, 0 (empty row), 5
    return np.array(
        [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=np.float32
    )
