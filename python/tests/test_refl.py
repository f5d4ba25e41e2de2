"""DIALS reflection tables from Python: read_refl (nbg_read_refl) gives every column the library reads, exactly as
written; damaged tables raise with the file's name; reflection_centroids (nbg_reflection_centroids) gives each
reflection's own model spot, as a render of that reflection alone does and as the program's refine -centroids
writes it; spot_pixels(reflections=...) (nbg_reflection_boxes) draws the spot regions refine -spotlist FILE.refl
draws, and with shoebox=N the shoeboxes' Foreground/Strong pixels (nbg_reflection_shoebox_boxes) as refine
-spot_shoebox N does.  The tables are written here as DIALS writes them (msgpack: ["dials::af::reflection_table",
1, {..., "data": {name: [type, [rows, little-endian bytes]]}}]) by a small msgpack writer, so that no msgpack
package is needed."""
import json
import struct
import subprocess

import numpy as np
import pytest

import nbgrad

# --- a minimal msgpack writer (the subset DIALS's tables use) ------------------------------------------------------


def _pack(v) -> bytes:
    if isinstance(v, bool) or v is None:
        raise TypeError("not used in a table")
    if isinstance(v, int):
        assert v >= 0
        if v < 128:
            return bytes([v])
        for code, fmt, top in ((0xcc, ">B", 1 << 8), (0xcd, ">H", 1 << 16), (0xce, ">I", 1 << 32),
                               (0xcf, ">Q", 1 << 64)):
            if v < top:
                return bytes([code]) + struct.pack(fmt, v)
    if isinstance(v, str):
        b = v.encode()
        if len(b) < 32:
            return bytes([0xa0 | len(b)]) + b
        return (bytes([0xd9, len(b)]) if len(b) < 256 else b"\xda" + struct.pack(">H", len(b))) + b
    if isinstance(v, bytes):
        if len(v) < 256:
            return bytes([0xc4, len(v)]) + v
        return (b"\xc5" + struct.pack(">H", len(v)) if len(v) < 65536 else b"\xc6" + struct.pack(">I", len(v))) + v
    if isinstance(v, (list, tuple)):
        head = bytes([0x90 | len(v)]) if len(v) < 16 else b"\xdc" + struct.pack(">H", len(v))
        return head + b"".join(_pack(x) for x in v)
    if isinstance(v, dict):
        head = bytes([0x80 | len(v)]) if len(v) < 16 else b"\xde" + struct.pack(">H", len(v))
        return head + b"".join(_pack(k) + _pack(x) for k, x in v.items())
    raise TypeError(type(v))


# DIALS's column types and their element layout (little-endian)
_TYPES = {"panel": ("std::size_t", "<u8"), "xyzobs.px.value": ("vec3<double>", "<f8"), "bbox": ("int6", "<i4"),
          "id": ("int", "<i4"), "miller_index": ("cctbx::miller::index<>", "<i4"), "flags": ("std::size_t", "<u8"),
          "xyzcal.px": ("vec3<double>", "<f8"), "intensity.sum.value": ("double", "<f8")}


def table_bytes(columns: dict, nrows: int) -> bytes:
    data = {}
    for name, values in columns.items():
        typ, fmt = _TYPES[name]
        data[name] = [typ, [nrows, np.ascontiguousarray(values, dtype=fmt).tobytes()]]
    return _pack(["dials::af::reflection_table", 1, {"identifiers": {0: "c0ffee"}, "nrows": nrows, "data": data}])


def write_table(path, columns: dict, nrows: int):
    path.write_bytes(table_bytes(columns, nrows))
    return path


def read_or_skip(path):
    try:
        return nbgrad.read_refl(path)
    except nbgrad.UnsupportedError as exc:  # a build without the file formats (FORMATS=0)
        pytest.skip(str(exc))


# --- the model's spots of the test experiment, indexed from its geometry ----------------------------------------


def model_spots(exp, count=12):
    """Up to count isolated local maxima of exp's model at least 6 pixels inside the image, with the Miller index
    whose reciprocal-lattice point the pixel's scattering vector is nearest (nanoBragg's h = a . (s - s0) / lambda,
    from describe()), kept only where that is within 0.25 of an integer on every axis."""
    img = nbgrad.simulate(exp)
    d = exp.describe()
    pix0, fd, sd = (np.array(d[k]) for k in ("pix0", "fdet", "sdet"))
    beam, A, px = np.array(d["beam"]), np.array(d["real_vectors"]).reshape(3, 3), d["pixel"] * 1e-3
    S, F = img.shape
    out = []
    for s in range(6, S - 6):
        for f in range(6, F - 6):
            w = img[s - 1:s + 2, f - 1:f + 2]
            if not (img[s, f] > 0.1 * img.max() and img[s, f] == w.max() and (w == img[s, f]).sum() == 1):
                continue
            pos = pix0 + (f + 0.5) * px * fd + (s + 0.5) * px * sd
            h = A @ (pos / np.linalg.norm(pos) - beam) / d["lambda"]
            if np.all(np.abs(h - np.rint(h)) < 0.25):
                out.append((f, s, tuple(int(v) for v in np.rint(h))))
    # spread over the image: every k-th
    return out[::max(1, len(out) // count)][:count]


@pytest.fixture
def spot_table(exp, tmp_path):
    """A table of exp's model spots as dials.index would leave it: observed centroids moved off the peak pixels'
    centres by a fraction of a pixel, bounding boxes, Miller indices, flags (one row used in refinement, a high
    bit set), DIALS's predictions, plus an unindexed row and a row of experiment 1 that refine -centroids leaves
    out, and a column nbgrad does not read."""
    spots = model_spots(exp)
    assert len(spots) >= 6, f"only {len(spots)} model spots to index"
    rng = np.random.default_rng(3)
    n = len(spots) + 2
    f = np.array([p[0] for p in spots] + [30, 40])
    s = np.array([p[1] for p in spots] + [30, 40])
    cols = {
        "panel": np.zeros(n, np.uint64),
        "xyzobs.px.value": np.column_stack([f + 0.5 + rng.uniform(-0.3, 0.3, n), s + 0.5 + rng.uniform(-0.3, 0.3, n),
                                            np.full(n, 0.5)]),
        "bbox": np.column_stack([f - 2, f + 3, s - 1, s + 2, np.zeros(n), np.ones(n)]).astype(np.int32),
        "id": np.array([0] * len(spots) + [0, 1], np.int32),
        "miller_index": np.array([p[2] for p in spots] + [(0, 0, 0), spots[0][2]], np.int32),
        "flags": np.array([nbgrad.REFL_INDEXED | (nbgrad.REFL_USED_IN_REFINEMENT if i % 2 else 0) | (1 << 40)
                           for i in range(n)], np.uint64),
        "xyzcal.px": np.column_stack([f + 0.5 + rng.uniform(-1, 1, n), s + 0.5 + rng.uniform(-1, 1, n),
                                      np.full(n, 0.5)]),
        "intensity.sum.value": rng.uniform(100, 1000, n),
    }
    return write_table(tmp_path / "indexed.refl", cols, n), cols


# --- read_refl ---------------------------------------------------------------------------------------------------


def test_read_refl_every_column(spot_table):
    path, cols = spot_table
    r = read_or_skip(path)
    n = len(cols["panel"])
    assert isinstance(r, dict) and r.nrows == n and r.ncolumns == len(cols) and not r.has_shoebox
    assert r.path == str(path)
    want = {"panel": (np.int32, (n,)), "xyzobs.px.value": (np.float64, (n, 3)), "bbox": (np.int32, (n, 6)),
            "id": (np.int32, (n,)), "miller_index": (np.int32, (n, 3)), "flags": (np.uint64, (n,)),
            "xyzcal.px": (np.float64, (n, 3))}
    sbkeys = {"shoebox_panel", "shoebox_bbox", "shoebox_offset", "shoebox_mask"}
    assert set(r) == set(want) | sbkeys  # intensity.sum.value is not one the library reads
    assert all(r[k] is None for k in sbkeys)  # no shoebox column
    for name, (dtype, shape) in want.items():
        assert r[name].dtype == dtype and r[name].shape == shape, name
        assert np.array_equal(r[name], np.asarray(cols[name]).astype(dtype)), name
    assert np.array_equal(r.indexed(), np.array([True] * (n - 2) + [False, False]))
    assert np.array_equal(r.indexed(1), np.array([False] * (n - 1) + [True]))


def test_read_refl_without_optional_columns(tmp_path):
    xyz = np.array([[1.25, 2.5, 0.5], [3.75, 4.125, 1.5]])
    r = read_or_skip(write_table(tmp_path / "strong.refl", {"xyzobs.px.value": xyz}, 2))
    assert np.array_equal(r["xyzobs.px.value"], xyz) and np.array_equal(r["panel"], [0, 0])
    assert all(r[k] is None for k in ("bbox", "id", "miller_index", "flags", "xyzcal.px"))
    with pytest.raises(ValueError, match="no miller_index column"):
        r.indexed()


def test_read_refl_refuses_damaged_tables(spot_table, tmp_path):
    path, cols = spot_table
    read_or_skip(path)
    good = path.read_bytes()
    cases = {
        "truncated.refl": (good[:len(good) // 2], nbgrad.FormatError, None),
        "trailing.refl": (good + b"\x00", nbgrad.FormatError, None),
        "text.refl": (b"# not a table\n1 2 3\n", nbgrad.FormatError, None),
        "nan.refl": (table_bytes({"xyzobs.px.value": [[1.0, float("nan"), 0.5]]}, 1), nbgrad.FormatError,
                     "not finite"),
        "count.refl": (table_bytes({"xyzobs.px.value": [[1.0, 2.0, 0.5]], "id": [0, 0]}, 1), nbgrad.FormatError,
                       "rows"),
    }
    for name, (data, exc, words) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(exc) as info:
            nbgrad.read_refl(tmp_path / name)
        assert str(tmp_path / name) in str(info.value), name
        assert words is None or words in str(info.value), name
    with pytest.raises(nbgrad.FileError, match="missing.refl"):
        nbgrad.read_refl(tmp_path / "missing.refl")


# --- reflection_centroids ------------------------------------------------------------------------------------------


def test_centroids_are_each_reflection_rendered_alone(exp, spot_table):
    """Each reflection's centroid and photons from reflection_centroids equal those of a render of the
    experiment with a table holding that reflection's F alone (0 elsewhere), over the square of half-width R
    about its observed centroid's pixel, summed here with numpy."""
    path, _ = spot_table
    r = read_or_skip(path)
    keep = r.indexed()
    hkl, xyz = r["miller_index"][keep], r["xyzobs.px.value"][keep]
    R = 1  # the spots are 2 to 3 pixels wide: a square of 3 x 3 cuts them, so that the radius matters
    cx, cy, ph = nbgrad.reflection_centroids(exp, hkl, r["panel"][keep], xyz[:, 0], xyz[:, 1], radius=R)
    assert cx.shape == (len(hkl),) and cx.dtype == np.float64
    worst = 0.0
    for i, h in enumerate(hkl):
        alone = nbgrad.Experiment.from_flags(exp.flags, default_F=0)
        alone.set_hkl(np.full((1, 1, 1), exp.default_F), tuple(int(v) for v in h))
        f0, s0 = int(np.floor(xyz[i, 0])), int(np.floor(xyz[i, 1]))
        img = nbgrad.simulate(alone)[s0 - R:s0 + R + 1, f0 - R:f0 + R + 1].astype(np.float64)
        ss, ff = np.mgrid[s0 - R:s0 + R + 1, f0 - R:f0 + R + 1] + 0.5
        w = img.sum()
        assert w > 0, f"reflection {tuple(h)} puts no light in its square"
        worst = max(worst, abs(cx[i] - (img * ff).sum() / w), abs(cy[i] - (img * ss).sum() / w),
                    abs(ph[i] - w) / w)
        # its own spot: within a pixel of the peak pixel the table was made from
        assert abs(cx[i] - xyz[i, 0]) < 1.5 and abs(cy[i] - xyz[i, 1]) < 1.5
    assert worst < 1e-9
    # a reflection whose square holds none of its light: NaN, 0 photons (hkl of the first, far from its spot)
    far = nbgrad.reflection_centroids(exp, hkl[:1], [0], [xyz[0, 0] + 40 if xyz[0, 0] < 48 else xyz[0, 0] - 40],
                                      xyz[:1, 1], radius=2)
    assert np.isnan(far[0][0]) and np.isnan(far[1][0]) and far[2][0] == 0


def test_centroids_equal_refine_centroids(exp, spot_table, cli, tmp_path):
    """refine -centroids' start-model centroids (the file's x_start, y_start, written to 4 decimals) are those of
    reflection_centroids on the table's indexed reflections of experiment 0, digit for digit, for the same rows,
    with -centroid_radius as radius; DIALS's predictions and the used_in_refinement flag are the table's."""
    path, _ = spot_table
    r = read_or_skip(path)
    obs = tmp_path / "obs.bin"
    nbgrad.write_float(obs, nbgrad.simulate(exp))
    out = tmp_path / "centroids.txt"
    for radius in (5, 1):  # 1 cuts the spots (2 to 3 pixels wide), 5 holds them whole
        run = subprocess.run([cli, "refine", *exp.flags, "-observed", str(obs), "-params", "a", "-maxiter", "2",
                              "-spotlist", str(path), "-centroids", str(out), "-centroid_radius", str(radius)],
                             cwd=tmp_path, capture_output=True, text=True)
        assert run.returncode in (0, 2), run.stderr  # 2: not converged in 2 iterations (not what is tested)
        rows = [ln.split() for ln in out.read_text().splitlines() if not ln.startswith("#")]
        keep = r.indexed()
        hkl, xyz = r["miller_index"][keep], r["xyzobs.px.value"][keep]
        cx, cy, ph = nbgrad.reflection_centroids(exp, hkl, r["panel"][keep], xyz[:, 0], xyz[:, 1], radius=radius)
        assert len(rows) == keep.sum() == len(cx)
        for i, row in enumerate(rows):
            assert [int(v) for v in row[1:4]] == hkl[i].tolist()
            assert row[4:6] == [f"{xyz[i, 0]:.4f}", f"{xyz[i, 1]:.4f}"]
            assert row[6:8] == [f"{v:.4f}" for v in r["xyzcal.px"][keep][i, :2]]
            assert row[8:10] == [f"{cx[i]:.4f}", f"{cy[i]:.4f}"], (radius, i)
            used = int(r["flags"][keep][i] & nbgrad.REFL_USED_IN_REFINEMENT != 0)
            assert int(row[13]) == used
        assert np.all(np.isfinite(cx)) and np.all(ph > 0)


def test_centroids_refuse_bad_input(exp):
    with pytest.raises(nbgrad.InvalidError, match="panel 1"):
        nbgrad.reflection_centroids(exp, [(1, 2, 3)], [1], [10.0], [10.0])
    with pytest.raises(ValueError, match="hkl"):
        nbgrad.reflection_centroids(exp, [(1, 2)], [0], [10.0], [10.0])
    with pytest.raises(ValueError, match="hkl"):
        nbgrad.reflection_centroids(exp, [(1, 2, 3.5)], [0], [10.0], [10.0])
    with pytest.raises(ValueError, match="y"):
        nbgrad.reflection_centroids(exp, [(1, 2, 3)], [0], [10.0], [10.0, 11.0])
    with pytest.raises(ValueError, match="radius"):
        nbgrad.reflection_centroids(exp, [(1, 2, 3)], [0], [10.0], [10.0], radius=0)
    tricubic = nbgrad.Experiment.from_flags(exp.flags, interpolate=True)
    with pytest.raises(nbgrad.UnsupportedError, match="interpolation"):
        nbgrad.reflection_centroids(tricubic, [(1, 2, 3)], [0], [10.0], [10.0])


# --- spot regions from a table -----------------------------------------------------------------------------------


def test_spot_pixels_from_a_table(exp, spot_table):
    """The bounding boxes of the rows of experiment 0 (clipped to the image), or with half boxes about the
    centroids' pixels: the union computed here; the row of experiment 1 left out."""
    path, cols = spot_table
    r = read_or_skip(path)
    S, F = exp.shape

    def union(boxes):
        m = np.zeros((S, F), bool)
        for x0, x1, y0, y1 in boxes:
            m[max(y0, 0):min(y1, S), max(x0, 0):min(x1, F)] = True
        return np.flatnonzero(m).astype(np.uint32)

    mine = r["id"] == 0
    got = nbgrad.spot_pixels(exp, reflections=r)
    assert np.array_equal(got, union(r["bbox"][mine][:, :4]))
    fs = np.floor(r["xyzobs.px.value"][mine][:, :2]).astype(int)
    got1 = nbgrad.spot_pixels(exp, reflections=r, half=1)
    assert np.array_equal(got1, union([(f - 1, f + 2, s - 1, s + 2) for f, s in fs]))
    assert not np.array_equal(got, got1)
    # no bbox column: boxes of half-width 3 (refine -spotlist's default)
    nob = {k: v for k, v in r.items() if k != "bbox"}
    assert np.array_equal(nbgrad.spot_pixels(exp, reflections=nob),
                          union([(f - 3, f + 4, s - 3, s + 4) for f, s in fs]))
    # refused: a row off the detector (named), no row of experiment 0, the table's spots with centres
    off = dict(r)
    off["xyzobs.px.value"] = r["xyzobs.px.value"].copy()
    off["xyzobs.px.value"][2, 0] = F + 5.0
    with pytest.raises(nbgrad.InvalidError, match=r"reflection 2 \(panel 0"):
        nbgrad.spot_pixels(exp, reflections=off)
    other = dict(r)
    other["id"] = np.ones_like(r["id"])
    with pytest.raises(ValueError, match="no reflection of experiment 0"):
        nbgrad.spot_pixels(exp, reflections=other)
    with pytest.raises(ValueError, match="centres"):
        nbgrad.spot_pixels(exp, reflections=r, centres=[(1, 2)])


def test_spotlist_refine_equals_cli(exp, spot_table, cli, tmp_path):
    """refine -spotlist FILE.refl in the program and a Python refine on spot_pixels(reflections=...): the same
    pixels, the same start loss and fitted value (bounding boxes, and -spots 1 about the centroids)."""
    path, _ = spot_table
    r = read_or_skip(path)
    obs = tmp_path / "obs.bin"
    nbgrad.write_float(obs, nbgrad.simulate(exp))
    for half in (None, 1):
        e = nbgrad.Experiment.from_flags(exp.flags, cell=(70.2, 80, 90, 75, 85, 95))
        image, mask = nbgrad.read_observed(e, obs)
        e.pixels = nbgrad.spot_pixels(e, reflections=r, half=half)
        res = nbgrad.refine(e, image, ["a"], loss="poisson", weights=mask.astype(np.float32))
        out = tmp_path / "r.json"
        subprocess.run([cli, "refine", *exp.flags, "-cell", "70.2", "80", "90", "75", "85", "95", "-observed",
                        str(obs), "-params", "a", "-loss", "poisson", "-spotlist", str(path), "-json", str(out)] +
                       ([] if half is None else ["-spots", str(half)]), cwd=tmp_path, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ref = json.loads(out.read_text())
        assert ref["pixels"] == e.pixels.size
        assert res.start_loss == pytest.approx(ref["start_loss"], rel=1e-9)
        assert res.values["a"] == pytest.approx(ref["parameters"]["a"]["value"], rel=1e-6)
        assert res.values["a"] == pytest.approx(70, abs=0.02)


# --- shoeboxes -------------------------------------------------------------------------------------------------------


def shoebox_bytes(rows) -> bytes:
    """A "Shoebox<>" column's bytes as DIALS writes them: per row the panel (u4), the box (6 i4), a byte 1 with the
    pixels (then data f4, mask i4, background f4 over the box, z slowest) or 0 without."""
    out = b""
    for panel, box, mask in rows:
        out += struct.pack("<I6iB", panel, *box, 0 if mask is None else 1)
        if mask is not None:
            m = np.asarray(mask, np.int32).ravel()
            out += np.arange(m.size, dtype="<f4").tobytes() + m.astype("<i4").tobytes()
            out += np.zeros(m.size, "<f4").tobytes()
    return out


def test_shoebox_masks_and_spot_pixels(exp, tmp_path):
    """The masks of a shoebox column read back value for value; spot_pixels(reflections=, shoebox=N) gives the
    Foreground/Strong pixels of every slice of the rows of experiment 0 (dilated by N), as computed here."""
    S, F = exp.shape
    rng = np.random.default_rng(5)
    rows, xyz, ids = [], [], []
    for k in range(6):
        x0, y0 = int(rng.integers(5, F - 10)), int(rng.integers(5, S - 10))
        box = (x0, x0 + 4, y0, y0 + 3, 0, 2)
        mask = rng.choice([0, 1, 3, 5, 9, 13, 17, 37], size=(2, 3, 4)).astype(np.int32)
        mask[0, 1, 1] = 5  # every row marks a pixel
        rows.append((0, box, mask))
        xyz.append((x0 + 1.5, y0 + 1.5, 0.5))
        ids.append(1 if k == 4 else 0)
    rows.append((0, (1, 3, 1, 2, 0, 1), None))  # a row without pixels, of experiment 1
    xyz.append((1.5, 1.5, 0.5))
    ids.append(1)
    n = len(rows)
    data = {"xyzobs.px.value": ["vec3<double>", [n, np.asarray(xyz, "<f8").tobytes()]],
            "id": ["int", [n, np.asarray(ids, "<i4").tobytes()]],
            "shoebox": ["Shoebox<>", [n, shoebox_bytes(rows)]]}
    path = tmp_path / "strong.refl"
    path.write_bytes(_pack(["dials::af::reflection_table", 1, {"identifiers": {}, "nrows": n, "data": data}]))
    r = read_or_skip(path)
    assert r.has_shoebox and r["shoebox_offset"].shape == (n + 1,)
    assert np.array_equal(r["shoebox_panel"], [p for p, _, _ in rows])
    assert np.array_equal(r["shoebox_bbox"], [b for _, b, _ in rows])
    for k, (_, _, mask) in enumerate(rows):
        got = r["shoebox_mask"][r["shoebox_offset"][k]:r["shoebox_offset"][k + 1]]
        assert np.array_equal(got, np.zeros(0) if mask is None else mask.ravel()), k
    for dil in (0, 1):
        want = np.zeros((S, F), bool)
        for (_, b, mask), i in zip(rows, ids):
            if i != 0:
                continue
            ys, xs = np.nonzero(((mask & (nbgrad.SHOEBOX_FOREGROUND | nbgrad.SHOEBOX_STRONG)) != 0).any(axis=0))
            for y, x in zip(ys + b[2], xs + b[0]):
                want[max(y - dil, 0):y + dil + 1, max(x - dil, 0):x + dil + 1] = True
        got = nbgrad.spot_pixels(exp, reflections=r, shoebox=dil)
        assert got.dtype == np.uint32 and np.array_equal(got, np.flatnonzero(want)), dil
    # refused: a row of experiment 0 without pixels (named), inconsistent offsets, a table without shoeboxes
    bad = dict(r)
    bad["id"] = np.zeros_like(r["id"])
    with pytest.raises(nbgrad.InvalidError, match="reflection 6's shoebox carries no pixels"):
        nbgrad.spot_pixels(exp, reflections=bad, shoebox=0)
    bad = dict(r)
    bad["shoebox_offset"] = r["shoebox_offset"].copy()
    bad["shoebox_offset"][2] += 1
    with pytest.raises(ValueError, match="shoebox row 1"):
        nbgrad.spot_pixels(exp, reflections=bad, shoebox=0)
    with pytest.raises(ValueError, match="no shoebox column"):
        nbgrad.spot_pixels(exp, reflections={k: (None if k.startswith("shoebox") else v) for k, v in r.items()},
                           shoebox=0)
