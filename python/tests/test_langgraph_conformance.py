"""LangGraph's own conformance suite for checkpointers
(``langgraph-checkpoint-conformance``), run on UwfSaver over LMDB and over
PostgreSQL: every base and extended capability must pass."""

import asyncio
import os
import tempfile

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import Capability

from uwf_db.langgraph import UwfSaver

POSTGRES = os.environ.get("UWF_TEST_POSTGRES")


def run_suite(location_factory):
    @checkpointer_test(name="UwfSaver")
    async def uwf_saver():
        yield UwfSaver(location_factory())

    report = asyncio.run(validate(uwf_saver))
    report.print_report()
    failures = {cap: result.failures for cap, result in report.results.items() if result.passed is not True}
    return report, failures


def check(report, failures):
    assert not failures, f"conformance failures: {failures}"
    tested = {cap for cap, result in report.results.items() if result.detected and result.tests_passed > 0}
    print({cap: r.tests_passed for cap, r in report.results.items()})
    assert tested == {c.value for c in Capability}, f"not every capability was tested: {tested}"
    assert report.passed_all()
    assert report.conformance_level() == "FULL"


def test_conformance_on_lmdb():
    base = tempfile.mkdtemp(prefix="uwf-lg-")
    n = iter(range(1000))
    check(*run_suite(lambda: os.path.join(base, f"store{next(n)}")))


@pytest.mark.skipif(not POSTGRES, reason="UWF_TEST_POSTGRES is not set")
def test_conformance_on_postgres():
    check(*run_suite(lambda: POSTGRES))
