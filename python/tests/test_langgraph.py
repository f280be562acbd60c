"""UwfSaver under a real LangGraph graph: a chat loop, time travel, a cold
reader, compact storage of the growing message list, and two writers racing
on one thread."""

import os
import tempfile
import threading

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph

import uwf_db
from uwf_db.langgraph import UwfSaver

POSTGRES = os.environ.get("UWF_TEST_POSTGRES")


def chat_graph(saver, gate=None):
    def chat(state: MessagesState):
        if gate is not None:
            gate()
        last = state["messages"][-1].content
        return {"messages": [AIMessage(content=f"echo {len(state['messages'])}: {last}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("chat", chat)
    builder.add_edge(START, "chat")
    return builder.compile(checkpointer=saver)


def run_turns(graph, thread, n, start=0):
    config = {"configurable": {"thread_id": thread}}
    for i in range(start, start + n):
        graph.invoke({"messages": [HumanMessage(content=f"turn {i} " + "x" * 200)]}, config, durability="sync")
    return config


def contents(state):
    return [(type(m).__name__, m.content) for m in state.values["messages"]]


@pytest.fixture(params=["lmdb", "postgres"])
def location(request):
    if request.param == "postgres":
        if not POSTGRES:
            pytest.skip("UWF_TEST_POSTGRES is not set")
        return POSTGRES
    return os.path.join(tempfile.mkdtemp(prefix="uwf-lg-"), "store")


def test_a_chat_loop_matches_langgraphs_own_saver(location):
    ours = chat_graph(UwfSaver(location))
    theirs = chat_graph(InMemorySaver())
    thread = f"chat-{os.getpid()}-{id(ours)}"
    config = run_turns(ours, thread, 30)
    run_turns(theirs, thread, 30)
    got, want = ours.get_state(config), theirs.get_state(config)
    assert contents(got) == contents(want)
    assert len(got.values["messages"]) == 60
    assert [m.id for m in got.values["messages"]] != [None] * 60
    # Three checkpoints a turn (input, __start__'s, chat's), as LangGraph's own saver keeps.
    history = list(ours.get_state_history(config))
    their_history = list(theirs.get_state_history(config))
    assert len(history) == len(their_history) == 90
    assert [contents(s) for s in history] == [contents(s) for s in their_history]
    assert [s.metadata["source"] for s in history] == [s.metadata["source"] for s in their_history]

    # A cold reader (a new saver on the same store) sees the same.
    cold = chat_graph(UwfSaver(location))
    assert contents(cold.get_state(config)) == contents(want)

    # Time travel: going on from an older checkpoint branches (LangGraph
    # marks it a fork) where LangGraph's own saver does, to the same state.
    ours.invoke(None, history[21].config, durability="sync")
    theirs.invoke(None, their_history[21].config, durability="sync")
    branched = ours.get_state(config)
    assert contents(branched) == contents(theirs.get_state(config))
    assert len(branched.values["messages"]) < 60
    assert len(list(ours.get_state_history(config))) == len(list(theirs.get_state_history(config)))


def test_the_message_list_is_stored_once_not_per_checkpoint(location):
    saver = UwfSaver(location)
    graph = chat_graph(saver)
    thread = f"size-{os.getpid()}-{id(saver)}"
    config = run_turns(graph, thread, 40)
    (chain,) = [c for _, c in saver._chains_of(thread)]
    # Every element blob is named by exactly one checkpoint of the chain
    # (the one that added it): 80 messages, not 1 + 2 + … + 80.
    named = [h for rec in chain.records if rec["k"] == "c" for e in rec["ch"].values() if "n" in e
             for h in (rec["_arts"][i] for i in e["a"])]
    assert len(named) == len(set(named)) == 80
    assert len(graph.get_state(config).values["messages"]) == 80


@pytest.mark.parametrize("history", [2, 0], ids=["going-thread", "new-thread"])
def test_two_writers_racing_on_one_thread_one_loses_nothing_is_lost(location, history):
    saver = UwfSaver(location)
    thread = f"race-{os.getpid()}-{id(saver)}-{history}"
    run_turns(chat_graph(saver), thread, history)
    barrier = threading.Barrier(2, timeout=3)

    def gate():
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            pass

    outcomes = {}

    def writer(name):
        graph = chat_graph(UwfSaver(location), gate)  # a saver of its own, as another process
        try:
            graph.invoke({"messages": [HumanMessage(content=f"from {name}")]},
                         {"configurable": {"thread_id": thread}}, durability="sync")
            outcomes[name] = "ok"
        except uwf_db.Conflict as e:
            outcomes[name] = e

    ts = [threading.Thread(target=writer, args=(n,)) for n in ("a", "b")]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sorted(type(v).__name__ if v != "ok" else v for v in outcomes.values()) == ["Conflict", "ok"], outcomes
    winner = next(n for n, v in outcomes.items() if v == "ok")
    loser = next(n for n, v in outcomes.items() if v != "ok")
    assert "another writer" in str(outcomes[loser]) and "first" in str(outcomes[loser])
    assert outcomes[loser].kind == "conflict"

    config = {"configurable": {"thread_id": thread}}
    graph = chat_graph(UwfSaver(location))
    msgs = [m.content for m in graph.get_state(config).values["messages"]]
    turn = 2 * history
    assert len(msgs) == turn + 2 and msgs[turn] == f"from {winner}", msgs
    # No checkpoint has two children: nothing was silently merged.
    parents = [s.parent_config["configurable"]["checkpoint_id"] for s in graph.get_state_history(config) if s.parent_config]
    assert len(parents) == len(set(parents))
    # The loser tries again from the newest state: both turns are kept.
    graph.invoke({"messages": [HumanMessage(content=f"from {loser}")]}, config, durability="sync")
    msgs = [m.content for m in graph.get_state(config).values["messages"]]
    assert msgs[turn::2] == [f"from {winner}", f"from {loser}"]
    # One chain holds the thread (both savers made it as one).
    assert len(UwfSaver(location)._find(thread, "")) == 1
