"""Stop strings matched inside jit, exactly, whatever the tokenization.

An Aho-Corasick automaton over bytes recognises every stop string. We fold it over each
token's bytes once, on the host, into two tables indexed [state, token]: the next state and
whether a stop string ended somewhere inside that token. The decode loop then needs two
gathers per step per sequence, and a stop string split across any tokens is still caught.
"""

from __future__ import annotations

import functools
from collections import deque

import numpy as np


def _automaton(stops: tuple[bytes, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Full DFA delta [states, 256] and accept [states] for a set of byte strings."""
    goto: list[dict[int, int]] = [{}]
    accept = [False]
    for s in stops:
        node = 0
        for b in s:
            if b not in goto[node]:
                goto.append({})
                accept.append(False)
                goto[node][b] = len(goto) - 1
            node = goto[node][b]
        accept[node] = True
    n = len(goto)
    delta = np.zeros((n, 256), np.int32)
    fail = [0] * n
    queue: deque[int] = deque()
    for b in range(256):
        child = goto[0].get(b)
        if child is not None:
            delta[0, b] = child
            queue.append(child)
    while queue:
        node = queue.popleft()
        accept[node] = accept[node] or accept[fail[node]]
        for b in range(256):
            child = goto[node].get(b)
            if child is None:
                delta[node, b] = delta[fail[node], b]
            else:
                fail[child] = delta[fail[node], b]
                delta[node, b] = child
                queue.append(child)
    return delta, np.asarray(accept)


@functools.lru_cache(maxsize=32)
def _tables_cached(token_bytes: tuple[bytes, ...],
                   stops: tuple[bytes, ...]) -> tuple[np.ndarray, np.ndarray]:
    delta, accept = _automaton(stops)
    lens = np.fromiter((len(t) for t in token_bytes), np.int32, len(token_bytes))
    width = max(1, int(lens.max()))
    mat = np.zeros((len(token_bytes), width), np.uint8)
    for i, t in enumerate(token_bytes):
        mat[i, : len(t)] = np.frombuffer(t, np.uint8)
    n_states = delta.shape[0]
    next_state = np.zeros((n_states, len(token_bytes)), np.int32)
    hit = np.zeros((n_states, len(token_bytes)), bool)
    for q in range(n_states):
        state = np.full(len(token_bytes), q, np.int32)
        seen = np.zeros(len(token_bytes), bool)
        for j in range(width):
            active = j < lens
            state = np.where(active, delta[state, mat[:, j]], state)
            seen |= active & accept[state]
        next_state[q], hit[q] = state, seen
    return next_state, hit


def stop_tables(token_bytes: list[bytes], stops: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(next_state [S, V] int32, hit [S, V] bool) for the stop strings; state 0 is the start."""
    encoded = tuple(sorted({s.encode() for s in stops if s}))
    if not encoded:
        raise ValueError("stop_tables needs at least one non-empty stop string")
    return _tables_cached(tuple(token_bytes), encoded)
