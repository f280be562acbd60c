#!/usr/bin/env python3
"""A LangGraph chat loop run to N turns (default 1,000) with UwfSaver and
with LangGraph's SqliteSaver and PostgresSaver on this machine (issue 24).

Each turn is `graph.invoke` of one human message (about 150 characters)
with `durability="sync"` (every checkpoint durable before invoke returns);
the node appends one AI reply (about 500 characters, varied words). For every saver it reports: bytes stored at each quarter (the growth
per turn), turns/s over the whole run, the time spent in the saver itself
(put, put_writes, get_tuple) per turn, the time to read the newest
checkpoint (a cold saver, then warm) and to list the newest 50. The ratios
are against SqliteSaver, measured in the same run; InMemorySaver (nothing
durable, nothing stored on disk) is the ceiling of any saver.

    python/run-tests.sh                    # once: the venv with uwf_db
    /tmp/uwf-py-venv/bin/pip install langgraph-checkpoint-sqlite==3.1.2 \
        langgraph-checkpoint-postgres==3.2.0 'psycopg[binary]'
    /tmp/uwf-py-venv/bin/python scripts/langgraph-chat-bench.py [--turns 1000]

Env: PG (default postgres://postgres@127.0.0.1:5432): the server on which a
database is made for each PostgreSQL saver and dropped; PG=off skips them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import subprocess
import tempfile
import time

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import START, MessagesState, StateGraph

WORDS = (
    "the report figures quarter total sources dates summary claims data shows fix first next part "
    "stands out review draft model agent thread step reply prompt store branch list value check "
    "cost token budget plan answer question because which would could should then also only"
).split()


def text(seed: int, words: int) -> str:
    """Varied text (a conversation does not repeat itself, and a repeated
    one would flatter whatever compresses)."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def graph_for(saver):
    def chat(state: MessagesState):
        n = len(state["messages"])
        return {"messages": [AIMessage(content=text(2 * n + 1, 80))]}  # about 500 characters

    b = StateGraph(MessagesState)
    b.add_node("chat", chat)
    b.add_edge(START, "chat")
    return b.compile(checkpointer=saver)


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def pg_bytes(url: str) -> int:
    out = subprocess.run(["psql", url, "-Atc", "select pg_database_size(current_database())"],
                         check=True, capture_output=True, text=True).stdout
    return int(out.strip())


def pg_db(server: str, name: str) -> str:
    subprocess.run(["psql", f"{server}/postgres", "-qc", f"DROP DATABASE IF EXISTS {name}"], check=True)
    subprocess.run(["psql", f"{server}/postgres", "-qc", f"CREATE DATABASE {name}"], check=True)
    return f"{server}/{name}"


def timed(saver) -> dict:
    """Wraps the saver's put, put_writes and get_tuple to add up their time:
    what the checkpointer itself costs, apart from LangGraph's own work."""
    spent = {"s": 0.0}
    for name in ("put", "put_writes", "get_tuple"):
        f = getattr(saver, name)

        def wrapped(*a, _f=f, **k):
            t = time.perf_counter()
            try:
                return _f(*a, **k)
            finally:
                spent["s"] += time.perf_counter() - t

        setattr(saver, name, wrapped)
    return spent


def measure(name, make, size, turns, reopen):
    saver, close = make()
    spent = timed(saver)
    g = graph_for(saver)
    config = {"configurable": {"thread_id": "chat"}}
    marks = []
    start = time.perf_counter()
    for i in range(1, turns + 1):
        g.invoke({"messages": [HumanMessage(content=text(2 * i, 25))]}, config, durability="sync")
        if i % (turns // 4) == 0:
            marks.append((i, size()))
    elapsed = time.perf_counter() - start
    checkpoints = sum(1 for _ in saver.list(config))
    close()
    # Reads on a saver opened afresh (cold), then again (warm).
    saver, close = reopen()
    t = time.perf_counter()
    tup = saver.get_tuple(config)
    cold = time.perf_counter() - t
    assert len(tup.checkpoint["channel_values"]["messages"]) == 2 * turns
    t = time.perf_counter()
    saver.get_tuple(config)
    warm = time.perf_counter() - t
    t = time.perf_counter()
    listed = list(saver.list(config, limit=50))
    list50 = time.perf_counter() - t
    assert len(listed) == 50
    close()
    growth = [(b2 - b1) / (t2 - t1) for (t1, b1), (t2, b2) in zip(marks, marks[1:])]
    return {
        "saver": name,
        "bytes": marks[-1][1],
        "bytes_at": marks,
        "growth_per_turn": [round(x) for x in growth],
        "turns_per_s": turns / elapsed,
        "checkpoints_per_s": checkpoints / elapsed,
        "checkpoints": checkpoints,
        "saver_ms_per_turn": spent["s"] * 1e3 / turns,
        "newest_cold_ms": cold * 1e3,
        "newest_warm_ms": warm * 1e3,
        "list50_ms": list50 * 1e3,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=1000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    turns = args.turns
    server = os.environ.get("PG", "postgres://postgres@127.0.0.1:5432")
    tmp = tempfile.mkdtemp(prefix="lg-bench-")
    results = []

    from uwf_db.langgraph import UwfSaver

    path = os.path.join(tmp, "uwf")
    results.append(measure(
        "UwfSaver (LMDB)",
        lambda: (UwfSaver(path), lambda: None),
        lambda: dir_bytes(path), turns,
        lambda: (UwfSaver(path), lambda: None),
    ))

    from langgraph.checkpoint.sqlite import SqliteSaver

    db = os.path.join(tmp, "lg.sqlite")

    def sqlite_saver():
        conn = sqlite3.connect(db, check_same_thread=False)
        return SqliteSaver(conn), conn.close

    results.append(measure("SqliteSaver", sqlite_saver, lambda: dir_bytes(tmp) - dir_bytes(path), turns, sqlite_saver))

    from langgraph.checkpoint.memory import InMemorySaver

    # The ceiling: a saver that stores nothing durably (it still serializes).
    memory = InMemorySaver()
    results.append(measure("InMemorySaver (no I/O)", lambda: (memory, lambda: None), lambda: 1, turns,
                           lambda: (memory, lambda: None)))

    if server != "off":
        url = pg_db(server, "uwf_lg_bench")
        UwfSaver(url)  # its schema and workflow are not the conversation
        uwf_base = pg_bytes(url)
        results.append(measure(
            "UwfSaver (PostgreSQL)",
            lambda: (UwfSaver(url), lambda: None),
            lambda: pg_bytes(url) - uwf_base, turns,
            lambda: (UwfSaver(url), lambda: None),
        ))
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg import Connection
        from psycopg.rows import dict_row

        purl = pg_db(server, "lg_pg_bench")

        def pg_saver():
            conn = Connection.connect(purl, autocommit=True, prepare_threshold=0, row_factory=dict_row)
            s = PostgresSaver(conn)
            s.setup()
            return s, conn.close

        pg_saver()[1]()  # its schema's empty tables are not the conversation
        base = pg_bytes(purl)
        results.append(measure("PostgresSaver", pg_saver, lambda: pg_bytes(purl) - base, turns, pg_saver))
        subprocess.run(["psql", f"{server}/postgres", "-qc", "DROP DATABASE IF EXISTS uwf_lg_bench"], check=True)
        subprocess.run(["psql", f"{server}/postgres", "-qc", "DROP DATABASE IF EXISTS lg_pg_bench"], check=True)

    shutil.rmtree(tmp, ignore_errors=True)
    sqlite = next(r for r in results if r["saver"] == "SqliteSaver")
    if args.json:
        print(json.dumps(results, indent=2))
    print(f"\n{turns} turns, durability=sync; ratios against SqliteSaver in this run\n")
    print(f"{'saver':24} {'MB stored':>10} {'smaller':>8} {'B/turn (quarters)':>26} {'turns/s':>8} {'faster':>7} "
          f"{'saver ms/turn':>13} {'faster':>7} {'newest cold/warm ms':>20} {'list 50 ms':>10}")
    for r in results:
        if r["saver"].startswith("InMemory"):
            mb, smaller, growth = "-", "-", "-"
        else:
            mb = f"{r['bytes'] / 1e6:.2f}"
            smaller = f"{sqlite['bytes'] / r['bytes']:.1f}x"
            growth = "/".join(str(g) for g in r["growth_per_turn"])
        print(f"{r['saver']:24} {mb:>10} {smaller:>8} {growth:>26} {r['turns_per_s']:8.1f} "
              f"{r['turns_per_s'] / sqlite['turns_per_s']:6.2f}x {r['saver_ms_per_turn']:13.1f} "
              f"{sqlite['saver_ms_per_turn'] / r['saver_ms_per_turn']:6.2f}x "
              f"{r['newest_cold_ms']:9.1f}/{r['newest_warm_ms']:<10.1f} {r['list50_ms']:10.1f}")


if __name__ == "__main__":
    main()
