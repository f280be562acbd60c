"""A LangGraph checkpointer backed by a uwf-db store (``docs/design.md`` §8g).

    from uwf_db.langgraph import UwfSaver
    saver = UwfSaver("./store")                 # or "postgres://…"
    graph = builder.compile(checkpointer=saver)

Each (LangGraph thread, namespace) is one uwf-db thread of the built-in
workflow ``langgraph``, found by its labels. A ``put`` or ``put_writes`` is
one step appended with the head compare-and-swap. A growing list (the
messages of a chat) is stored as its elements, each a content blob, and each
checkpoint names only the elements it added to its parent's list, so a
conversation of N turns stores each message once. A ``put`` whose parent
checkpoint already has a child is refused with :class:`uwf_db.Conflict`
(another writer continued the thread first), unless LangGraph marks it a
branch (metadata ``source`` ``"update"`` or ``"fork"``: ``update_state`` and
time travel). ``copy_thread`` is a fork (nothing copied); ``delete_thread``,
``delete_for_runs`` and ``prune`` remove or rewrite chains and leave the
bytes to ``Store.gc`` and its grace period.

Needs ``langgraph-checkpoint`` (``pip install langgraph``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from . import Conflict, InvalidInput, NotFound, Store
from ._native import _lg_split

__all__ = ["UwfSaver"]

WORKFLOW = """\
name: langgraph
roles:
  checkpoint: { goal: "A LangGraph checkpoint or a task's writes, written by uwf_db.langgraph" }
graph:
  $START: { _: { role: checkpoint, prompt: checkpoint } }
  checkpoint: { _: { role: checkpoint, prompt: checkpoint } }
"""

#: Sources that make a checkpoint a deliberate branch of its parent.
BRANCH_SOURCES = ("update", "fork")
#: Attempts of a write whose head moved under it for a benign reason (a
#: parallel task's writes): each re-reads the chain and checks again.
ATTEMPTS = 64
#: The bytes of list elements kept in memory, for reads of long lists.
CACHE_BYTES = 64 << 20


def _err(cls: type, message: str) -> Exception:
    """An exception of the package's hierarchy with its ``kind``, as the
    native ones carry."""
    e = cls(message)
    e.kind = {Conflict: "conflict", InvalidInput: "invalid", NotFound: "not_found"}[cls]
    return e


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _label(what: str, text: str) -> str:
    """``text`` as a label value (at most 255 bytes, printable)."""
    if len(text.encode()) > 255 or not text.isprintable():
        raise _err(InvalidInput, 
            f"uwf_db.langgraph: the {what} {text[:80]!r} is not usable: it must be printable "
            "and at most 255 bytes (254 for a namespace)"
        )
    return text


class _Chain:
    """One uwf-db thread's records, read once and then as it grows."""

    def __init__(self, tid: str, gen: int) -> None:
        self.tid = tid
        self.gen = gen
        self.head = ""
        self.seq = 0
        self.records: list[dict] = []
        self.cps: dict[str, dict] = {}  # checkpoint id -> its newest record
        self.children: dict[str, set[str]] = {}
        self.writes: dict[str, dict[tuple[str, int], tuple]] = {}
        self.lists: dict[tuple[str, str], list[str]] = {}

    def add(self, seq: int, role: str, lg: str | None, arts: list[str]) -> None:
        if lg is None:
            return
        rec = json.loads(lg)
        rec["_arts"] = arts
        rec["_seq"] = seq
        self.records.append(rec)
        if rec["k"] == "c":
            cid = rec["id"]
            earlier = self.cps.get(cid)
            if earlier is not None:  # the same id put again: its lists anew
                for channel in earlier["ch"]:
                    self.lists.pop((cid, channel), None)
            self.cps[cid] = rec
            if rec.get("p"):
                self.children.setdefault(rec["p"], set()).add(cid)
        elif rec["k"] == "w":
            stored = self.writes.setdefault(rec["cp"], {})
            for idx, channel, t, enc in rec["w"]:
                key = (rec["task"], idx)
                if idx >= 0 and key in stored:
                    continue
                stored[key] = (rec["task"], channel, t, enc, rec.get("path", ""), arts)

    def list_hashes(self, cid: str, channel: str) -> list[str]:
        """The element hashes of list channel ``channel`` at checkpoint ``cid``."""
        key = (cid, channel)
        if key in self.lists:
            return self.lists[key]
        # Walk back to the base without recursion, then forward.
        path = []
        at = cid
        while True:
            rec = self.cps[at]
            entry = rec["ch"][channel]
            path.append((rec, entry))
            base = entry.get("b")
            if base is None or (base, channel) in self.lists:
                break
            at = base
        hashes = list(self.lists[(base, channel)]) if base is not None else []
        for rec, entry in reversed(path):
            hashes = hashes + [rec["_arts"][i] for i in entry["a"]]
            if len(hashes) != entry["n"]:
                raise RuntimeError(
                    f"uwf_db.langgraph: list {channel!r} of checkpoint {rec['id']} has "
                    f"{len(hashes)} elements, its record says {entry['n']}"
                )
            self.lists[(rec["id"], channel)] = hashes
        return hashes


class UwfSaver(BaseCheckpointSaver[int]):
    """A LangGraph checkpointer on a uwf-db store (LMDB or PostgreSQL).

    ``store`` is a :class:`uwf_db.Store` or a location (a directory or a
    ``postgres://`` URL) opened with ``durability``.
    """

    def __init__(
        self,
        store: Store | str,
        *,
        durability: str = "sync",
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self.store = store if isinstance(store, Store) else Store(store, durability)
        self.store.add_workflow(WORKFLOW)
        self._lock = threading.RLock()
        self._chains: dict[tuple[str, str], _Chain] = {}
        self._bytes: OrderedDict[str, bytes] = OrderedDict()
        # The last lists this saver wrote, by (thread, checkpoint, channel):
        # their bytes and element hashes, so that the next put splits and
        # hashes only what it appends.
        self._last: OrderedDict[tuple, tuple[bytes, list[str]]] = OrderedDict()
        self._cached = 0

    # ------------------------------------------------------------ chains

    @staticmethod
    def _labels(thread_id: str, ns: str, gen: int | None = None) -> dict[str, str]:
        """The labels that find the chain of (thread, ns): the namespace
        behind a '/' (a label value is never empty); ``lg.gen`` counts its
        rewrites (the newest generation is the chain)."""
        labels = {"lg.thread": _label("thread id", thread_id), "lg.ns": _label("namespace", "/" + ns)}
        if gen is not None:
            labels["lg.gen"] = str(gen)
        return labels

    @staticmethod
    def _seed(thread_id: str, ns: str, gen: int) -> str:
        """What a chain's id is made from: two savers making the same chain
        (or the same rewrite) at once make one; the other is refused."""
        return json.dumps([thread_id, ns, gen])

    def _find(self, thread_id: str, ns: str) -> list[dict]:
        found = self.store.threads(workflow="langgraph", labels=self._labels(thread_id, ns), limit=1000)
        return sorted(found, key=lambda t: int(t["labels"].get("lg.gen", "0")))

    def _refresh(self, chain: _Chain) -> None:
        head, seq, steps = self.store._lg_chain(chain.tid, chain.seq)
        for step in steps:
            chain.add(step[0], step[2], step[3], step[4])
        chain.head, chain.seq = head, seq

    def _chain(self, thread_id: str, ns: str, create: bool = False) -> _Chain | None:
        """The chain of (thread, ns), brought up to date; ``None`` if none."""
        key = (str(thread_id), ns)
        for _ in range(ATTEMPTS):
            chain = self._chains.get(key)
            if chain is None:
                found = self._find(thread_id, ns)
                if found:
                    newest = found[-1]
                    chain = _Chain(newest["thread"], int(newest["labels"].get("lg.gen", "0")))
                elif not create:
                    return None
                else:
                    try:
                        tid = self.store._lg_start(
                            f"LangGraph thread {thread_id!r}, namespace {ns!r}",
                            self._labels(str(thread_id), ns, 0),
                            self._seed(str(thread_id), ns, 0),
                        )
                    except Conflict:
                        continue  # another saver made it meanwhile: look again
                    chain = _Chain(tid, 0)
                self._chains[key] = chain
            try:
                self._refresh(chain)
                return chain
            except NotFound:
                # Removed (deleted, or rewritten by another process): look again.
                self._chains.pop(key, None)
        raise _err(Conflict, f"the chain of LangGraph thread {thread_id!r} keeps changing under this saver")

    def _chains_of(self, thread_id: str) -> list[tuple[str, _Chain]]:
        found = self.store.threads(
            workflow="langgraph", labels={"lg.thread": _label("thread id", str(thread_id))}, limit=100000
        )
        out = []
        for ns in sorted({t["labels"]["lg.ns"][1:] for t in found}):
            chain = self._chain(str(thread_id), ns)
            if chain is not None:
                out.append((ns, chain))
        return out

    # ------------------------------------------------------------ values

    def _encode_list(self, tid: str, parent: str | None, name: str, value: Any):
        """``(type, body, texts, hashes, known)`` of a channel value: a list
        (``body`` its array's bytes after the header) as its elements, any
        other as one blob (``body`` None). When this saver wrote the parent's
        list and the new one's bytes start with it, only the new elements
        are split, encoded and hashed: ``texts`` are then those of the
        elements after the first ``known``."""
        t, data = self.serde.dumps_typed(value)
        if t == "msgpack" and data and (0x90 <= data[0] <= 0x9F or data[0] in (0xDC, 0xDD)):
            head = 1 if data[0] <= 0x9F else (3 if data[0] == 0xDC else 5)
            n = data[0] & 0x0F if head == 1 else int.from_bytes(data[1:head], "big")
            body = data[head:]
            prior = self._last.get((tid, parent, name)) if parent else None
            if prior is not None and len(prior[1]) <= n and body.startswith(prior[0]):
                tail = _lg_split(_array_header(n - len(prior[1])) + body[len(prior[0]):])
                if tail is not None:
                    texts = [_b64(e) for e in tail]
                    return t, body, texts, prior[1] + self.store._lg_hash_texts(texts), len(prior[1])
            elems = _lg_split(data)
            if elems is not None:
                texts = [_b64(e) for e in elems]
                return t, body, texts, self.store._lg_hash_texts(texts), 0
        texts = [_b64(data)]
        return t, None, texts, self.store._lg_hash_texts(texts), 0

    def _remember(self, tid: str, cid: str, name: str, body: bytes, hashes: list[str]) -> None:
        self._last[(tid, cid, name)] = (body, hashes)
        while len(self._last) > 16:
            self._last.popitem(last=False)

    def _texts(self, hashes: list[str]) -> list[bytes]:
        missing = [h for h in dict.fromkeys(hashes) if h not in self._bytes]
        if missing:
            texts = self.store._lg_get_texts(missing)
            for h, text in zip(missing, texts):
                if text is None:
                    raise _err(NotFound, f"uwf_db.langgraph: blob {h} is missing (collected while read?)")
                data = _unb64(text)
                self._bytes[h] = data
                self._cached += len(data)
            while self._cached > CACHE_BYTES and len(self._bytes) > len(missing):
                _, old = self._bytes.popitem(last=False)
                self._cached -= len(old)
        out = []
        for h in hashes:
            data = self._bytes.get(h)
            if data is None:  # evicted by this very read: fetch it alone
                (text,) = self.store._lg_get_texts([h])
                data = _unb64(text)
            out.append(data)
        return out

    def _value(self, chain: _Chain, rec: dict, channel: str) -> Any:
        entry = rec["ch"][channel]
        if "n" in entry:
            hashes = chain.list_hashes(rec["id"], channel)
            data = _array_header(len(hashes)) + b"".join(self._texts(hashes))
            return self.serde.loads_typed(("msgpack", data))
        (data,) = self._texts([rec["_arts"][entry["v"]]])
        return self.serde.loads_typed((entry["t"], data))

    def _write_value(self, t: str, enc: dict, arts: list[str]) -> Any:
        if "a" in enc:
            data = self._texts([arts[i] for i in enc["a"]])
            return self.serde.loads_typed(("msgpack", _array_header(len(data)) + b"".join(data)))
        (data,) = self._texts([arts[enc["v"]]])
        return self.serde.loads_typed((t, data))

    def _tuple(self, thread_id: str, ns: str, chain: _Chain, rec: dict) -> CheckpointTuple:
        checkpoint = self.serde.loads_typed((rec["cp"][0], _unb64(rec["cp"][1])))
        checkpoint["channel_values"] = {ch: self._value(chain, rec, ch) for ch in rec["ch"]}
        metadata = self._metadata(rec)
        stored = chain.writes.get(rec["id"], {})
        ordered = sorted(
            ((k, w) for k, w in stored.items()), key=lambda kw: (kw[1][4], kw[0][0], kw[0][1])
        )
        pending = [(w[0], w[1], self._write_value(w[2], w[3], w[5])) for _, w in ordered]
        parent = rec.get("p")
        return CheckpointTuple(
            config=self._config(thread_id, ns, rec["id"]),
            checkpoint=checkpoint,
            metadata=metadata,
            parent_config=self._config(thread_id, ns, parent) if parent else None,
            pending_writes=pending,
        )

    def _metadata(self, rec: dict) -> CheckpointMetadata:
        if "_md" not in rec:
            rec["_md"] = self.serde.loads_typed((rec["md"][0], _unb64(rec["md"][1])))
        return rec["_md"]

    @staticmethod
    def _config(thread_id: str, ns: str, cid: str) -> RunnableConfig:
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}}

    # ------------------------------------------------------------ reads

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        conf = config["configurable"]
        thread_id, ns = str(conf["thread_id"]), conf.get("checkpoint_ns", "")
        with self._lock:
            chain = self._chain(thread_id, ns)
            if chain is None or not chain.cps:
                return None
            cid = get_checkpoint_id(config) or max(chain.cps)
            rec = chain.cps.get(cid)
            if rec is None:
                return None
            return self._tuple(thread_id, ns, chain, rec)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        want_id = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        picked: list[tuple[str, str, str, _Chain]] = []
        with self._lock:  # chains grow under other threads' calls
            for thread_id, ns, chain in self._listed(config):
                for cid in chain.cps:
                    if want_id and cid != want_id:
                        continue
                    if before_id and cid >= before_id:
                        continue
                    picked.append((cid, thread_id, ns, chain))
        picked.sort(key=lambda p: p[0], reverse=True)
        count = 0
        for cid, thread_id, ns, chain in picked:
            if limit is not None and count >= limit:
                return
            with self._lock:
                rec = chain.cps[cid]
                if filter:
                    md = self._metadata(rec)
                    if not all(k in md and md[k] == v for k, v in filter.items()):
                        continue
                tup = self._tuple(thread_id, ns, chain, rec)
            count += 1
            yield tup

    def _listed(self, config: RunnableConfig | None) -> list[tuple[str, str, _Chain]]:
        conf = (config or {}).get("configurable", {})
        thread_id = conf.get("thread_id")
        ns = conf.get("checkpoint_ns")
        if thread_id is not None and ns is not None:
            chain = self._chain(str(thread_id), ns)
            return [(str(thread_id), ns, chain)] if chain else []
        if thread_id is not None:
            return [(str(thread_id), n, c) for n, c in self._chains_of(str(thread_id))]
        out = []
        for t in self.store.threads(workflow="langgraph", limit=1000000):
            labels = t["labels"]
            if "lg.thread" not in labels or "lg.ns" not in labels:
                continue
            tid, n = labels["lg.thread"], labels["lg.ns"][1:]
            if ns is not None and n != ns:
                continue
            chain = self._chain(tid, n)
            if chain is not None and chain.tid == t["thread"]:
                out.append((tid, n, chain))
        return out

    # ------------------------------------------------------------ writes

    def _append(self, chain: _Chain, role: str, rec: dict, reply: str, texts: list[str], arts: list[str]) -> None:
        """One step: the record and the new value blobs, in one commit."""
        self.store._lg_append(chain.tid, chain.head, role, json.dumps(rec, separators=(",", ":")), reply, arts, texts)
        # Read back what was written (and anything before it) in order.
        self._refresh(chain)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        conf = config["configurable"]
        thread_id, ns = str(conf["thread_id"]), conf.get("checkpoint_ns", "")
        parent = conf.get("checkpoint_id")
        cid = checkpoint["id"]
        md = get_checkpoint_metadata(config, metadata)
        rest = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        cp_t, cp_b = self.serde.dumps_typed(rest)
        md_t, md_b = self.serde.dumps_typed(md)
        values = checkpoint["channel_values"]
        versions = checkpoint["channel_versions"]
        encoded: dict[str, tuple[str, dict, list[str]]] = {}
        with self._lock:
            for _ in range(ATTEMPTS):
                chain = self._chain(thread_id, ns, create=True)
                assert chain is not None
                others = chain.children.get(parent, set()) - {cid} if parent else set()
                if others and md.get("source") not in BRANCH_SOURCES:
                    raise _err(Conflict, 
                        f"LangGraph thread {thread_id!r} (namespace {ns!r}): checkpoint {parent} "
                        f"already has a child ({min(others)}): another writer continued it first. "
                        "Nothing was written; reload the newest checkpoint and go on from it "
                        "(update_state and time travel branch on purpose)."
                    )
                if not parent and chain.cps and cid not in chain.cps and md.get("source") == "input" and md.get("step") == -1:
                    raise _err(
                        Conflict,
                        f"LangGraph thread {thread_id!r} (namespace {ns!r}) has checkpoints already "
                        f"(the newest {max(chain.cps)}), but this run began as if it had none: another "
                        "writer started it first. Nothing was written; reload the newest checkpoint and go on from it.",
                    )
                prec = chain.cps.get(parent) if parent else None
                arts: list[str] = []
                texts: list[str] = []
                ch: dict[str, dict] = {}
                carried: list[str] = []  # lists taken unchanged from the parent
                for name, version in versions.items():
                    if name not in values:
                        continue
                    pentry = prec["ch"].get(name) if prec else None
                    if name not in new_versions and pentry is not None and pentry.get("ver") == version:
                        if "n" in pentry:
                            ch[name] = {"ver": version, "n": pentry["n"], "b": parent, "a": []}
                            carried.append(name)
                        else:
                            arts.append(prec["_arts"][pentry["v"]])
                            ch[name] = {"ver": version, "t": pentry["t"], "v": len(arts) - 1}
                        continue
                    if name not in encoded:
                        listed_parent = parent if pentry is not None and "n" in pentry else None
                        encoded[name] = self._encode_list(chain.tid, listed_parent, name, values[name])
                    t, listed, etexts, hashes, known = encoded[name]
                    if not listed:
                        texts.extend(etexts)
                        arts.extend(hashes)
                        ch[name] = {"ver": version, "t": t, "v": len(arts) - 1}
                        continue
                    base, start = None, 0
                    if known and pentry is not None and "n" in pentry:
                        base, start = parent, known  # the parent's list, as this saver wrote it
                    elif pentry is not None and "n" in pentry:
                        before = chain.list_hashes(parent, name)
                        if len(before) <= len(hashes) and hashes[: len(before)] == before:
                            base, start = parent, len(before)
                    first = len(arts)
                    arts.extend(hashes[start:])
                    texts.extend(etexts[start - known:] if start >= known else etexts)
                    ch[name] = {"ver": version, "n": len(hashes), "b": base, "a": list(range(first, len(arts)))}
                rec = {"k": "c", "id": cid, "p": parent, "cp": [cp_t, _b64(cp_b)], "md": [md_t, _b64(md_b)], "ch": ch}
                reply = f"checkpoint {cid} (step {md.get('step')}, {md.get('source')})"
                try:
                    self._append(chain, "checkpoint", rec, reply, texts, arts)
                    for name, (_, listed, _, hashes, _) in encoded.items():
                        if listed:
                            self._remember(chain.tid, cid, name, listed, hashes)
                    for name in carried:
                        prior = self._last.get((chain.tid, parent, name))
                        if prior is not None:
                            self._remember(chain.tid, cid, name, *prior)
                    break
                except Conflict:
                    continue  # the head moved (a task's writes, say): check again
                except NotFound:
                    self._chains.pop((thread_id, ns), None)  # deleted meanwhile: a new chain
            else:
                raise _err(Conflict, f"LangGraph thread {thread_id!r}: the head kept moving; nothing was written")
        return self._config(thread_id, ns, cid)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        conf = config["configurable"]
        thread_id, ns = str(conf["thread_id"]), conf.get("checkpoint_ns", "")
        cid = conf["checkpoint_id"]
        encoded = [(WRITES_IDX_MAP.get(c, i), c, self._encode_list("", None, c, v)) for i, (c, v) in enumerate(writes)]
        with self._lock:
            for _ in range(ATTEMPTS):
                chain = self._chain(thread_id, ns, create=True)
                assert chain is not None
                stored = chain.writes.get(cid, {})
                arts: list[str] = []
                texts: list[str] = []
                entries = []
                for idx, channel, (t, body, etexts, hashes, _) in encoded:
                    if idx >= 0 and (task_id, idx) in stored:
                        continue  # a regular write is kept as first written
                    first = len(arts)
                    arts.extend(hashes)
                    texts.extend(etexts)
                    enc = {"a": list(range(first, len(arts)))} if body is not None else {"v": first}
                    entries.append([idx, channel, t, enc])
                if not entries:
                    return
                rec = {"k": "w", "cp": cid, "task": task_id, "path": task_path, "w": entries}
                reply = f"writes of task {task_id} to checkpoint {cid}: " + ", ".join(sorted({e[1] for e in entries}))
                try:
                    self._append(chain, "checkpoint", rec, reply, texts, arts)
                    return
                except Conflict:
                    continue
                except NotFound:
                    self._chains.pop((thread_id, ns), None)
            raise _err(Conflict, f"LangGraph thread {thread_id!r}: the head kept moving; no writes were written")

    # ------------------------------------------------------------ removal

    def delete_thread(self, thread_id: str) -> None:
        with self._lock:
            for t in self.store.threads(
                workflow="langgraph", labels={"lg.thread": _label("thread id", str(thread_id))}, limit=100000
            ):
                self._remove(t["thread"])
            for key in [k for k in self._chains if k[0] == str(thread_id)]:
                del self._chains[key]

    def _remove(self, tid: str) -> None:
        for _ in range(ATTEMPTS):
            try:
                head = self.store.thread(tid)["head"]
                self.store._lg_remove(tid, head)
                return
            except NotFound:
                return
            except Conflict:
                continue
        raise _err(Conflict, f"uwf-db thread {tid} kept moving while being removed")

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        with self._lock:
            if self._chains_of(str(target_thread_id)):
                raise _err(Conflict, 
                    f"LangGraph thread {target_thread_id!r} already has checkpoints; copy into a new thread id"
                )
            for ns, chain in self._chains_of(str(source_thread_id)):
                target = str(target_thread_id)
                self.store._lg_fork(chain.tid, self._labels(target, ns, 0), self._seed(target, ns, 0))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = set(run_ids)
        with self._lock:
            for thread_id, ns, chain in self._listed(None):
                gone = {cid for cid, rec in chain.cps.items() if self._metadata(rec).get("run_id") in runs}
                if gone:
                    self._rewrite(thread_id, ns, chain, [c for c in chain.cps if c not in gone])

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"prune strategy must be 'keep_latest' or 'delete', not {strategy!r}")
        with self._lock:
            for thread_id in thread_ids:
                if strategy == "delete":
                    self.delete_thread(thread_id)
                    continue
                for ns, chain in self._chains_of(str(thread_id)):
                    if len(chain.cps) > 1:
                        self._rewrite(str(thread_id), ns, chain, [max(chain.cps)])

    def _rewrite(self, thread_id: str, ns: str, chain: _Chain, keep: list[str]) -> None:
        """Replaces the chain by one holding only the checkpoints ``keep`` (and
        their writes): built whole under the next generation, then the old
        chain removed if no writer moved it meanwhile (else undone: Conflict)."""
        old_head = chain.head
        kept = set(keep)
        try:
            tid = self.store._lg_start(
                f"LangGraph thread {thread_id!r}, namespace {ns!r}",
                self._labels(thread_id, ns, chain.gen + 1),
                self._seed(thread_id, ns, chain.gen + 1),
            )
        except Conflict:
            raise _err(
                Conflict,
                f"LangGraph thread {thread_id!r} (namespace {ns!r}) is being rewritten by another saver; try again",
            ) from None
        new = _Chain(tid, chain.gen + 1)
        self._refresh(new)
        for rec in chain.records:
            if rec["k"] == "c":
                if rec["id"] not in kept or chain.cps[rec["id"]] is not rec:
                    continue
                arts: list[str] = []
                ch = {}
                for name, entry in rec["ch"].items():
                    if "n" in entry:
                        hashes = chain.list_hashes(rec["id"], name)
                        base, start = None, 0
                        p = rec.get("p")
                        if p in new.cps and name in new.cps[p]["ch"] and "n" in new.cps[p]["ch"][name]:
                            before = new.list_hashes(p, name)
                            if hashes[: len(before)] == before:
                                base, start = p, len(before)
                        first = len(arts)
                        arts.extend(hashes[start:])
                        ch[name] = {"ver": entry["ver"], "n": len(hashes), "b": base, "a": list(range(first, len(arts)))}
                    else:
                        arts.append(rec["_arts"][entry["v"]])
                        ch[name] = {"ver": entry["ver"], "t": entry["t"], "v": len(arts) - 1}
                out = {k: v for k, v in rec.items() if not k.startswith("_")}
                out["ch"] = ch
                self._append(new, "checkpoint", out, f"checkpoint {rec['id']} (kept)", [], arts)
            elif rec["k"] == "w" and rec["cp"] in kept:
                out = {k: v for k, v in rec.items() if not k.startswith("_")}
                self._append(new, "checkpoint", out, f"writes of task {rec['task']} (kept)", [], rec["_arts"])
        try:
            self.store._lg_remove(chain.tid, old_head)
        except Conflict:
            self._remove(new.tid)
            raise _err(Conflict, 
                f"LangGraph thread {thread_id!r} (namespace {ns!r}) was written while being rewritten; "
                "nothing was removed, try again"
            ) from None
        except NotFound:
            pass
        self._chains[(thread_id, ns)] = new

    # ------------------------------------------------------------ async

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.get_running_loop().run_in_executor(None, self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        items = await asyncio.get_running_loop().run_in_executor(
            None, lambda: list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in items:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.get_running_loop().run_in_executor(
            None, self.put, config, checkpoint, metadata, new_versions
        )

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await asyncio.get_running_loop().run_in_executor(
            None, self.put_writes, config, writes, task_id, task_path
        )

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.get_running_loop().run_in_executor(
            None, self.copy_thread, source_thread_id, target_thread_id
        )

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: self.prune(thread_ids, strategy=strategy)
        )
