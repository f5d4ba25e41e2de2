"""Experiments pickle (for multiprocessing, torch DataLoader workers, caches): rebuilt from their flags, the
geometries applied, the table as an array and every parameter's current value."""
import copy
import pickle

import numpy as np

import nbgrad
from conftest import BASE


def test_round_trip_with_parameters_set(exp_hkl):
    exp_hkl.a = 71.5
    exp_hkl.rotx = 11
    exp_hkl.distance = 101
    e = pickle.loads(pickle.dumps(exp_hkl))
    assert (e.a, e.rotx, e.distance) == (71.5, 11, 101)
    assert np.array_equal(e.F, exp_hkl.F) and e.hkl_origin == exp_hkl.hkl_origin
    assert np.array_equal(nbgrad.simulate(e), nbgrad.simulate(exp_hkl))
    assert type(e) is type(exp_hkl)


def test_table_travels_without_its_file(tmp_path):
    path = tmp_path / "t.hkl"
    rng = np.random.default_rng(5)
    path.write_text("".join(f"{h} {k} {l} {rng.uniform(50, 150):.2f}\n"
                            for h in range(-3, 4) for k in range(-3, 4) for l in range(-3, 4)))
    exp = nbgrad.Experiment(hkl=str(path), default_F=10, **BASE)
    blob = pickle.dumps(exp)
    path.unlink()
    e = pickle.loads(blob)
    assert np.array_equal(nbgrad.simulate(e), nbgrad.simulate(exp))


def test_table_given_as_array_and_copy():
    F = np.random.default_rng(7).uniform(50, 150, (9, 9, 9))
    exp = nbgrad.Experiment(hkl=(F, (-4, -4, -4)), default_F=10, **BASE)
    e = pickle.loads(pickle.dumps(copy.deepcopy(exp)))
    assert np.array_equal(e.F, F)
    assert np.array_equal(nbgrad.simulate(e), nbgrad.simulate(exp))


def test_geometry_applied(exp):
    g = exp.geometry()
    e0 = nbgrad.Experiment.from_geometry(g, default_F=100, N=5)
    e = pickle.loads(pickle.dumps(e0))
    assert np.array_equal(nbgrad.simulate(e), nbgrad.simulate(e0))
