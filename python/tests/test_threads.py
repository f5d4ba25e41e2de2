"""The GIL is released while the library works: another Python thread runs meanwhile, and two experiments
render from two threads at once with the right images."""
import threading
import time

import numpy as np

import nbgrad
from conftest import BASE


def slow_experiment():
    # one thread and enough work (about a quarter of a second) to see whether Python runs beside it
    return nbgrad.Experiment(**{**BASE, "detpixels": 256, "oversample": 4}, default_F=100, threads=1)


def test_python_runs_while_simulating():
    e = slow_experiment()
    t0 = time.perf_counter()
    nbgrad.simulate(e)
    alone = time.perf_counter() - t0
    done = threading.Event()
    ticks = 0

    def work():
        nbgrad.simulate(e)
        done.set()

    th = threading.Thread(target=work)
    th.start()
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    th.join()
    # with the GIL held for the whole call the loop would tick about once; released, it ticks about every ms
    assert ticks >= min(20, alone * 1000 / 4), (ticks, alone)


def test_two_threads_two_experiments():
    exps = [slow_experiment(), slow_experiment()]
    exps[1].a = 71
    ref = [nbgrad.simulate(x) for x in exps]
    out = [None, None]

    def work(i):
        for _ in range(2):
            out[i] = nbgrad.simulate(exps[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads), "deadlock"
    assert np.array_equal(out[0], ref[0]) and np.array_equal(out[1], ref[1])


def test_one_experiment_shared_by_threads():
    # one context may be used by one thread at a time: the experiment's lock serialises the calls
    e = nbgrad.Experiment(**BASE, default_F=100)
    ref = nbgrad.simulate(e)
    results = []

    def work():
        for _ in range(5):
            results.append(nbgrad.simulate(e))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert len(results) == 20 and all(np.array_equal(r, ref) for r in results)
