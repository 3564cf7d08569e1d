"""The model thread: jobs in order, one at a time, and how long the current one has run."""

from __future__ import annotations

import asyncio
import threading
import time

from edgespec.cloud.serving.model_thread import ModelThread


def test_jobs_run_in_submission_order_on_one_thread():
    model, seen, threads = ModelThread(), [], set()

    def job(i):
        threads.add(threading.get_ident())
        seen.append(i)
        return i * 2

    async def main():
        model.submit(job, 0)
        return await asyncio.gather(*(model.run(job, i) for i in range(1, 5)))

    assert asyncio.run(main()) == [2, 4, 6, 8]
    assert seen == [0, 1, 2, 3, 4] and len(threads) == 1
    model.shutdown()


def test_busy_for_tells_how_long_a_job_runs():
    model, release = ModelThread(), threading.Event()
    assert model.busy_for() == 0.0
    model.submit(release.wait, 5)
    time.sleep(0.3)
    assert 0.2 < model.busy_for() < 5
    release.set()
    time.sleep(0.1)
    assert model.busy_for() == 0.0
    model.shutdown()
