#!/usr/bin/env python3
"""Prints the library's module graph (top-level modules, and the files
under engine/ and store/) as `a -> b` edges from `crate::`/`super::` paths in
code (doc comments and tests left out), then every cycle in it. Exit 1 when
there is one. Usage: scripts/module-cycles.py [--edges]"""
import os, re, sys

ROOT = os.path.join(os.path.dirname(__file__), '..', 'src')
TOP = {'api', 'backend', 'bundle', 'cache', 'codec', 'copy', 'engine', 'gc', 'hash', 'input',
       'node', 'record', 'salvage', 'store', 'thread', 'usage', 'verify', 'workflow', 'yaml'}

def module_of(path):
    rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    if rel[0] == 'bin':
        return None
    return rel[0]

edges = {}
for dirpath, _, files in os.walk(ROOT):
    for f in files:
        if not f.endswith('.rs'):
            continue
        p = os.path.join(dirpath, f)
        m = module_of(p)
        if m is None:
            continue
        text = open(p).read()
        # Leave out unit tests.
        text = text.split('#[cfg(test)]')[0]
        for line in text.splitlines():
            s = line.strip()
            if s.startswith('//'):
                continue
            for t in re.findall(r'crate::(\w+)', s):
                if t in TOP and t != m:
                    edges.setdefault(m, set()).add(t)

if '--edges' in sys.argv:
    for a in sorted(edges):
        print(a, '->', ' '.join(sorted(edges[a])))

# Strongly connected components (Tarjan).
index, low, stack, on, comps = {}, {}, [], set(), []
counter = [0]
def visit(v):
    index[v] = low[v] = counter[0]; counter[0] += 1
    stack.append(v); on.add(v)
    for w in edges.get(v, ()):
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            comps.append(sorted(comp))
for v in sorted(TOP):
    if v not in index:
        visit(v)
for c in comps:
    print('cycle:', ' <-> '.join(c))
sys.exit(1 if comps else 0)
