"""Independent pure-Python oracles for the tessel tests (no maleki_rs code inside)."""

from __future__ import annotations

import random
from collections import defaultdict

import numpy as np


def heads_tails(spans, edges, lags):
    n = len(spans)
    succ = defaultdict(list)
    pred = defaultdict(list)
    for (a, b), c in zip(edges, lags):
        succ[a].append((b, c))
        pred[b].append((a, c))
    order, indeg = [], [len(pred[g]) for g in range(n)]
    stack = [g for g in range(n) if indeg[g] == 0]
    while stack:
        g = stack.pop()
        order.append(g)
        for h, _ in succ[g]:
            indeg[h] -= 1
            if indeg[h] == 0:
                stack.append(h)
    assert len(order) == n
    head = [0] * n
    for g in order:
        head[g] = max((head[p] + spans[p] + c for p, c in pred[g]), default=0)
    tail = [0] * n
    for g in reversed(order):
        tail[g] = max((c + spans[h] + tail[h] for h, c in succ[g]), default=0)
    return head, tail


def lower_bound(spans, devices, edges, lags, ndevs, nmicros):
    """LB(N) of spec §2, from the definition."""
    head, tail = heads_tails(spans, edges, lags)
    lb = 0
    for d in range(ndevs):
        on = [g for g in range(len(spans)) if d in devices[g]]
        if on:
            w = sum(spans[g] for g in on)
            lb = max(lb, min(head[g] for g in on) + nmicros * w + min(tail[g] for g in on))
    for g in range(len(spans)):
        lb = max(lb, head[g] + nmicros * spans[g] + tail[g])
    return lb


def asap(spans, devices, edges, lags, nmicros, orders):
    """Longest-path starts for per-device orders (fixed-point iteration, no graph library)."""
    n = len(spans)
    start = np.zeros((nmicros, n), dtype=np.int64)
    changed = True
    rounds = 0
    while changed:
        rounds += 1
        assert rounds <= nmicros * n + 2, "cycle"
        changed = False
        for (a, b), c in zip(edges, lags):
            for j in range(nmicros):
                need = start[j, a] + spans[a] + c
                if start[j, b] < need:
                    start[j, b] = need
                    changed = True
        for o in orders:
            for (j1, g1), (j2, g2) in zip(o, o[1:]):
                need = start[j1, g1] + spans[g1]
                if start[j2, g2] < need:
                    start[j2, g2] = need
                    changed = True
    return start


def peak_memory(spans, devices, memory, starts, ndevs, free_at_end=False):
    peaks = []
    for d in range(ndevs):
        ev = []
        for g in range(len(spans)):
            if d in devices[g] and memory[g] != 0:
                for j in range(starts.shape[0]):
                    t = starts[j, g] + (spans[g] if (free_at_end and memory[g] < 0) else 0)
                    ev.append((int(t), memory[g]))
        level, best = 0, 0
        for t in sorted({t for t, _ in ev}):
            level += sum(m for tt, m in ev if tt == t)
            best = max(best, level)
        peaks.append(best)
    return peaks


def violations(spans, devices, memory, edges, lags, starts, caps=None, fifo=True):
    """Counts per rule: V0, V1 (edge x micro-batch), V2 (overlapping pairs per device), V3
    (maximal intervals above the cap), V4."""
    nm, n = starts.shape
    out = {"V0": 0, "V1": 0, "V2": 0, "V3": 0, "V4": 0}
    out["V0"] = int((starts < 0).sum())
    for (a, b), c in zip(edges, lags):
        for j in range(nm):
            if starts[j, b] < starts[j, a] + spans[a] + c:
                out["V1"] += 1
    ndevs = 1 + max(max(ds) for ds in devices)
    for d in range(ndevs):
        jobs = [(int(starts[j, g]), int(starts[j, g] + spans[g])) for g in range(n) if d in devices[g] for j in range(nm)]
        for x in range(len(jobs)):
            for y in range(x + 1, len(jobs)):
                (a0, a1), (b0, b1) = jobs[x], jobs[y]
                if a0 < b1 and b0 < a1:
                    out["V2"] += 1
    if caps is not None:
        for d in range(ndevs):
            ev = defaultdict(int)
            for g in range(n):
                if d in devices[g] and memory[g] != 0:
                    for j in range(nm):
                        ev[int(starts[j, g])] += memory[g]
            level, above = 0, False
            for t in sorted(ev):
                level += ev[t]
                if level > caps[d] and not above:
                    out["V3"] += 1
                above = level > caps[d]
    if fifo:
        out["V4"] = int((np.diff(starts, axis=0) <= 0).sum())
    return out


def random_orders(spans, devices, edges, nmicros, ndevs, rnd: random.Random):
    """Per-device orders from a random linear extension of precedence + FIFO."""
    n = len(spans)
    preds = defaultdict(set)
    for a, b in edges:
        preds[b].add(a)
    done = set()
    ready = [(0, g) for g in range(n) if not preds[g]]
    seq = []
    while ready:
        k = rnd.randrange(len(ready))
        j, g = ready.pop(k)
        seq.append((j, g))
        done.add((j, g))
        cand = [(j, h) for h in range(n) if g in preds[h]] + [(j + 1, g)]
        for jj, h in cand:
            if jj >= nmicros or (jj, h) in done or (jj, h) in ready:
                continue
            if all((jj, p) in done for p in preds[h]) and (jj == 0 or (jj - 1, h) in done):
                ready.append((jj, h))
    assert len(seq) == n * nmicros
    return [[x for x in seq if d in devices[x[1]]] for d in range(ndevs)]


def random_premise(rnd: random.Random, max_devs=4, max_blocks=8):
    """A random well-formed premise as plain data: (ndevs, spans, devices, memory, kinds, edges)."""
    ndevs = rnd.randint(1, max_devs)
    n = rnd.randint(1, max_blocks)
    spans = [rnd.randint(1, 3) for _ in range(n)]
    devices = []
    for _ in range(n):
        if rnd.random() < 0.25 and ndevs > 1:
            k = rnd.randint(2, ndevs)
            devices.append(sorted(rnd.sample(range(ndevs), k)))
        else:
            devices.append([rnd.randrange(ndevs)])
    edges = [(a, b) for a in range(n) for b in range(a + 1, n) if rnd.random() < 0.3]
    reach = [{g} for g in range(n)]
    for g in reversed(range(n)):
        for a, b in edges:
            if a == g:
                reach[g] |= reach[b]
    memory = [0] * n
    for _ in range(rnd.randint(0, 3)):
        g = rnd.randrange(n)
        cands = [h for h in reach[g] if h != g and devices[h] == devices[g]]
        if cands:
            h = rnd.choice(cands)
            m = rnd.randint(1, 2)
            memory[g] += m
            memory[h] -= m
    kinds = [rnd.choice(["forward", "backward", "weight", "other"]) for _ in range(n)]
    return ndevs, spans, devices, memory, kinds, edges
