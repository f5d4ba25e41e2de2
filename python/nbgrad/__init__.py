"""nbgrad: nanoBragg's diffraction images and their exact gradients, from Python.

    import nbgrad
    exp = nbgrad.Experiment(cell=(70, 80, 90, 75, 85, 95), misset=(10, 5, 3), N=5, wavelength=1.0,
                            distance=100, detpixels=512, default_F=100)
    img = nbgrad.simulate(exp)                                  # float32, shape (slow, fast)
    g = nbgrad.grad(exp, dLdI, params=["a", "rotx", "F"])       # {"a": ..., "rotx": ..., "F": ...}
    res = nbgrad.refine(exp, observed, params=["a", "b", "c"])  # values, sigmas, correlations

Keyword arguments are the command line's flags without the dash (``Experiment(N=5)`` is ``-N 5``); the flags are
parsed by the library's experiment builder (nbg_builder, the parser the program uses), so both spellings mean
exactly the same.  Every library failure raises an ``nbgrad.Error`` (a RuntimeError) carrying the library's
message; invalid input also is a ValueError.
"""
import difflib
import os
import re
import shlex
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

from ._cpu import load as _load

#: the extension this CPU runs: the library built for x86-64-v3 (AVX2, FMA) or the baseline x86-64 one ("v3",
#: "baseline"; nbgrad/_cpu.py, NBGRAD_KERNELS to force one).  It is nbgrad._ext (not nbgrad._nbgrad, which an import
#: of the baseline submodule would rebind)
_ext, KERNELS = _load(__name__)
DeviceError, Error, FileError, FormatError = _ext.DeviceError, _ext.Error, _ext.FileError, _ext.FormatError
InvalidError, LimitError, UnsupportedError = _ext.InvalidError, _ext.LimitError, _ext.UnsupportedError

__version__ = _ext.LIBRARY_VERSION
_nbgrad = _ext  # the name the extension had; prefer _ext

#: the table of scalar parameters (nbg_param_info) by name, in the library's order (nbg_param): a dict each with
#: name, alias, unit, flag, groups, help, lo, hi, optional, bound_lo, bound_hi
PARAM_INFO = {p["name"]: p for p in _ext.param_info()}
#: the differentiable parameters' names, in the library's order (nbg_param)
PARAMS = tuple(PARAM_INFO)
#: the builder's flag table: every name (aliases included) -> the names of its values (None: a switch)
_FLAG_ARGS = {name: arg for names, arg, _ in _ext.flag_table() for name in names}
_FLAGS = frozenset(_FLAG_ARGS)
#: parameter groups accepted wherever a parameter list is (as by the program's -params), with the parameters each
#: holds ("all" is every parameter the experiment leaves free, the library decides which)
GROUPS = {g: PARAMS if g == "all" else tuple(p["name"] for p in PARAM_INFO.values() if g in p["groups"])
          for g in _ext.param_groups()}

# Python spellings of flags the command line spells otherwise (or that are Python keywords)
_ALIASES = {
    "wavelength": "lambda",
    "thick": "detector_thick",
    "thick_abs": "detector_abs",
    "det_rotx": "detector_rotx",
    "det_roty": "detector_roty",
    "det_rotz": "detector_rotz",
    "mosaic_spread": "mosaic",
    "polarization": "polar",
    "sample_size": "samplesize",
}
# keyword=False for a switch that is on by default: the flag that turns it off
_NEGATIONS = {"interpolate": "nointerpolate", "round_div": "square_div", "polar": "nopolar", "dump": "nodump"}
_CONVENTIONS = ("mosflm", "denzo", "adxv", "xds", "dials")
_SHAPES = {"square": "-square_xtal", "round": "-round_xtal", "gauss": "-gauss_xtal", "tophat": "-tophat_spots"}
_LOSSES = {"lsq": 0, "poisson": 1}
_METHODS = {"lm": 0, "bfgs": 1}
# parameters readable as attributes under another name (their aliases: exp.wavelength; and exp.lambda_)
_PARAM_ALIASES = {p["alias"]: p["name"] for p in PARAM_INFO.values() if p["alias"]}
_PARAM_ALIASES["lambda_"] = "lambda"
# values readable and writable as attributes that are several parameters: exp.cell, exp.misset, exp.N
_TUPLES = {"cell": ("a", "b", "c", "alpha", "beta", "gamma"), "misset": ("rotx", "roty", "rotz"),
           "N": ("Na", "Nb", "Nc")}


def _did_you_mean(name, names) -> str:
    """"; did you mean 'distance'?" when one of names is close to name, else ""."""
    close = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.75)
    return f"; did you mean '{close[0]}'?" if close else ""


def _keywords():
    """The keyword arguments Experiment accepts: the flags without their dash, their Python spellings."""
    return ({f.lstrip("-") for f in _FLAGS} | set(_ALIASES) | set(_NEGATIONS) | {"convention", "shape"}) - {"h", "help"}


def _number(v):
    if isinstance(v, (bool, np.bool_)):
        raise TypeError("a boolean where a number was expected")
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        # repr is the shortest string that reads back as the same double: the parser gets the exact value
        return repr(float(v))
    if isinstance(v, str):
        return v
    raise TypeError(f"expected a number or a str, got {type(v).__name__}")


def kwargs_to_flags(**kwargs) -> List[str]:
    """The command-line flags that mean what the keyword arguments of Experiment mean (in their order)."""
    argv = []
    for key, value in kwargs.items():
        if value is None:
            continue
        name = key[:-1] if key.endswith("_") else key
        name = _ALIASES.get(name, name)
        if name == "convention":
            if str(value).lower() not in _CONVENTIONS:
                raise ValueError(f"convention: expected one of {', '.join(_CONVENTIONS)}, got {value!r} "
                                 "(the custom convention follows from the vectors, e.g. fdet_vector=...)")
            argv.append("-" + str(value).lower())
            continue
        if name == "shape":
            if value not in _SHAPES:
                raise ValueError(f"shape: expected one of {', '.join(_SHAPES)}, got {value!r}")
            argv.append(_SHAPES[value])
            continue
        flag = "-" + name
        if flag not in _FLAGS:
            raise TypeError(f"Experiment() got an unexpected keyword argument '{key}'"
                            + _did_you_mean(key, _keywords()))
        if isinstance(value, (bool, np.bool_)):
            if value:
                argv.append(flag)
            elif name in _NEGATIONS:
                argv.append("-" + _NEGATIONS[name])
            # False for a switch that is off by default: nothing to say
            continue
        if isinstance(value, np.ndarray):
            value = value.tolist()
        if name == "N" and isinstance(value, (list, tuple)) and len(value) == 3:
            for axis, v in zip("abc", value):
                argv.extend(["-N" + axis, _number(v)])
            continue
        if isinstance(value, (list, tuple)):
            arg = _FLAG_ARGS.get(flag)
            want = len(arg.split()) if arg is not None and "|" not in arg else None
            if want is not None and len(value) != want:
                # (a K_FN flag's arg counts its values too: -cell's six)
                raise ValueError(f"{key}: -{name} takes {want} value{'s' if want > 1 else ''} ({arg}), got "
                                 f"{len(value)}: {tuple(value)!r}")
            argv.append(flag)
            argv.extend(_number(v) for v in value)
        else:
            argv.extend([flag, _number(value) if not hasattr(value, "__fspath__") else str(value.__fspath__())])
    return argv


def _split_flags(flags) -> List[str]:
    argv = shlex.split(flags) if isinstance(flags, str) else [str(a) for a in flags]
    # a pasted command line may start with the program's name (and the simulate subcommand)
    while argv and not argv[0].startswith("-"):
        argv.pop(0)
    return argv


def _expand(params) -> List[str]:
    """The names of a parameter list (a str "a,b,F(1,2,3)" or a sequence of str); the library expands groups and
    aliases, and drops repeats."""
    if isinstance(params, str):
        # commas or spaces separate names, except inside F(h,k,l)'s parentheses
        return re.findall(r"[^,\s(]+(?:\([^)]*\))?", params)
    return list(params)


def _response_property(index, doc):
    """A property for one of the experiment's detector response values (pedestal, gain, read_noise: the order of
    Experiment.response())."""

    def get(self) -> float:
        return self.response()[index]

    def set(self, value):
        r = list(self.response())
        r[index] = float(value)
        self.set_response(*r)

    return property(get, set, doc=doc)


class Experiment(_ext.Experiment):
    """An experiment: crystal, beam, detector, and the structure factors it owns.

    Keyword arguments are the command line's flags without the dash, with their values (a tuple for several):
    ``cell=(70, 80, 90, 75, 85, 95)``, ``N=5`` (Na = Nb = Nc), ``lambda_=1`` or ``wavelength=1``,
    ``detpixels=512``, ``convention="xds"``, ``shape="gauss"``, ``hkl="P1.hkl"``, ``interpolate=False``.
    ``hkl`` may also be a pair (F, (h_min, k_min, l_min)) with F a 3-d array; ``N=(5, 6, 7)`` sets Na, Nb, Nc.
    An unknown keyword is a TypeError naming the closest keyword; a value the builder or the library refuses (NaN,
    out of range, a value left out: ``cell=(70, 80, 90, 90, 90)``) is a ValueError with its message.

    The differentiable parameters read and write as attributes: ``exp.a``, ``exp.rotx``, ``exp.distance``,
    ``exp.wavelength`` ...  (``nbgrad.PARAMS`` lists them), and so do ``exp.cell`` (a b c alpha beta gamma),
    ``exp.misset`` (rotx roty rotz) and ``exp.N`` (Na Nb Nc) as tuples.  Writing an unknown attribute
    (``exp.distanse = 5``) is an AttributeError naming the closest name, and writing a flag's value that is no
    parameter (``exp.detpixels = 64``) one that says so.
    """

    def __init__(self, **kwargs):
        response = {k: kwargs.pop(k) for k in _RESPONSE if k in kwargs}
        table = kwargs.pop("hkl", None)
        if table is not None and not isinstance(table, (str, bytes)) and not hasattr(table, "__fspath__"):
            F, origin = table
            kwargs["hkl"] = None
        else:
            F = origin = None
            kwargs["hkl"] = table
        self._init_flags(kwargs_to_flags(**kwargs), validate=F is None)
        if F is not None:
            self.set_hkl(F, origin)
            self.validate()
        for k, v in response.items():
            setattr(self, k, v)

    # the detector response the losses (loss_grad, refine) read observed counts through: counts = gain * photons +
    # pedestal, with a Gaussian read noise (nbg_detector_model); as refine's -pedestal, -gain, -read_noise
    pedestal = _response_property(0, "The observed image's pedestal, counts (0).")
    gain = _response_property(1, "Counts per photon of the observed image (1).")
    read_noise = _response_property(2, "The observed image's Gaussian read noise, counts rms (0).")

    @property
    def pixels(self) -> Optional[np.ndarray]:
        """The pixel list the calls render and fit (nbg_experiment.pixels): flat pixel indices (uint32, increasing),
        or None for the whole image.  spot_pixels gives one around the Bragg spots (refine's -spots); the image
        simulate returns is then 0 outside the list and the losses sum over the list alone."""
        return self.get_pixels()

    @pixels.setter
    def pixels(self, value):
        self.set_pixels(None if value is None else np.asarray(value).ravel())

    def _init_flags(self, argv, validate=True):
        _ext.Experiment.__init__(self, argv, validate)
        object.__setattr__(self, "_flags", list(argv))
        for line in self.log.splitlines():
            if "warning:" in line or "note:" in line:
                warnings.warn(line.split(": ", 1)[-1], stacklevel=3)

    @classmethod
    def from_flags(cls, flags, **kwargs) -> "Experiment":
        """An experiment from command-line flags: a string ("-cell 70 80 90 90 90 90 -N 5") or a list of them;
        keyword arguments add flags after them."""
        obj = cls.__new__(cls)
        obj._init_flags(_split_flags(flags) + kwargs_to_flags(**kwargs))
        return obj

    @classmethod
    def from_expt(cls, path, **kwargs) -> "Experiment":
        """An experiment from a DIALS experiment list (one experiment, one panel), as -expt reads it; keyword
        arguments supply what the list does not say (structure factors, N, sampling)."""
        return cls(expt=str(path), **kwargs)

    @classmethod
    def from_geometry(cls, geometry: dict, **kwargs) -> "Experiment":
        """An experiment from a geometry dict (read_expt, read_image, Experiment.geometry) and keywords."""
        obj = cls.__new__(cls)
        # checked once complete: the geometry brings the detector and crystal the keywords may lack
        obj._init_flags(kwargs_to_flags(**kwargs), validate=False)
        obj.apply_geometry(geometry)
        return obj

    @classmethod
    def from_dxtbx(cls, experiment, **kwargs) -> "Experiment":
        """An experiment from a dxtbx/DIALS Experiment (beam, one-panel detector, goniometer, scan, crystal)."""
        from .dxtbx import geometry_from_dxtbx

        return cls.from_geometry(geometry_from_dxtbx(experiment), **kwargs)

    def to_expt(self, path, images: str = "", nframes: int = 1) -> None:
        """Writes the experiment as a DIALS experiment list (images: the image file or template it names)."""
        write_expt(path, self.geometry(nframes), images)

    def __copy__(self):
        new = _ext.Experiment.copy(self)
        object.__setattr__(new, "_flags", list(getattr(self, "_flags", [])))
        object.__setattr__(new, "_geometries", list(getattr(self, "_geometries", [])))
        return new

    copy = __copy__

    def __deepcopy__(self, memo):
        return self.__copy__()

    def __getattr__(self, name):
        p = _PARAM_ALIASES.get(name, name)
        if p in PARAMS:
            return self.get_param(p)
        if name in _TUPLES:
            return tuple(self.get_param(q) for q in _TUPLES[name])
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'"
                             + _did_you_mean(name, self._attribute_names()))

    def __setattr__(self, name, value):
        p = _PARAM_ALIASES.get(name, name)
        if p in PARAMS:
            self.set_param(p, float(value))
        elif name in _TUPLES:
            names = _TUPLES[name]
            values = tuple(value) if isinstance(value, (list, tuple, np.ndarray)) else (value,)
            if name == "N" and len(values) == 1:
                values = values * 3  # as -N: Na = Nb = Nc
            if len(values) != len(names):
                raise ValueError(f"{name}: expected {len(names)} values ({' '.join(names)}), got {len(values)}")
            for q, v in zip(names, values):
                self.set_param(q, float(v))
        elif name.startswith("_") or hasattr(type(self), name):
            object.__setattr__(self, name, value)  # the object's own (properties, private state)
        elif name.lstrip("-") in _keywords():
            raise AttributeError(f"'{name}' is set when the Experiment is made (Experiment({name}=...) or "
                                 f"from_flags), not afterwards; the differentiable parameters (nbgrad.PARAMS) can be")
        else:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'"
                                 + _did_you_mean(name, self._attribute_names()))

    def _attribute_names(self):
        return set(PARAMS) | (set(_PARAM_ALIASES) - {"lambda_"}) | set(_TUPLES) | set(super().__dir__())

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(PARAMS) | (set(_PARAM_ALIASES) - {"lambda_"}) | set(_TUPLES))

    def apply_geometry(self, geometry):
        _ext.Experiment.apply_geometry(self, geometry)
        # kept for pickling: the experiment is rebuilt from its flags and the geometries applied since
        object.__setattr__(self, "_geometries", getattr(self, "_geometries", []) + [dict(geometry)])

    def __reduce__(self):
        """Pickles as what rebuilds it: its flags (without -hkl: the table travels as an array), the geometries
        applied, the structure-factor table and every parameter's current value (set since by attribute,
        set_param or refine).  Files the flags name (-mat, -sourcefile, -mask, -expt ...) are read again when it
        is unpickled."""
        flags, skip = [], False
        for a in self.flags:
            if skip:
                skip = not a.startswith("-")
                if skip:
                    continue
            if a in ("-hkl", "-Fdump", "-dump", "-nodump") and self.F is not None:
                skip = a in ("-hkl", "-Fdump")
                continue
            flags.append(a)
        table = (self.F, tuple(self.hkl_origin)) if self.F is not None else None
        params = {}
        for p in PARAMS:
            try:
                params[p] = self.get_param(p)
            except Error:
                pass
        for g in range(4096):
            try:
                vals = {f"g{g}.{c}": self.get_param(f"g{g}.{c}") for c in _MOTION_COMPONENTS}
            except (Error, ValueError):
                break
            params.update(vals)
        return (_rebuild, (type(self), flags, list(getattr(self, "_geometries", [])), table, params, self.response(),
                           self.get_pixels()))

    @property
    def flags(self) -> List[str]:
        """The flags it was made from (parameters set since, by attribute or refine, are not reflected)."""
        return list(getattr(self, "_flags", []))

    def __repr__(self):
        return f"nbgrad.Experiment.from_flags({shlex.join(self.flags)!r})"


_MOTION_COMPONENTS = ("shift_x", "shift_y", "shift_z", "rot_x", "rot_y", "rot_z")
_RESPONSE = ("pedestal", "gain", "read_noise")


def _rebuild(cls, flags, geometries, table, params, response=(0.0, 1.0, 0.0), pixels=None):
    """Experiment.__reduce__'s inverse."""
    obj = cls.__new__(cls)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # they were said when the original was made
        obj._init_flags(flags, validate=False)
    for g in geometries:
        obj.apply_geometry(g)
    if table is not None:
        obj.set_hkl(table[0], table[1])
    for name, value in params.items():
        now = obj.get_param(name)
        if not (now == value or (np.isnan(now) and np.isnan(value))):
            obj.set_param(name, value)
    obj.set_response(*response)
    obj.validate()
    if pixels is not None:
        obj.set_pixels(pixels)
    return obj


class Gradient(dict):
    """{parameter name: dL/dtheta} ("F": dL/dF per table entry, an array of the table's shape, or a float
    without a table; "g3.shift_x" a panel motion, "F(h,k,l)" one table entry), with the image rendered on the
    way (``.image``) and the loss (``.loss``, loss_grad)."""

    image: np.ndarray
    loss: Optional[float] = None


def simulate(exp: Experiment, report: bool = False, out: Optional[np.ndarray] = None):
    """The image, float32 of shape (slow, fast) (and the report dict with report=True).  out: a float32
    C-contiguous array of that shape to render into (no allocation; it is returned)."""
    return _ext.simulate(exp, report, out)


def grad(exp: Experiment, dLdI, params) -> Gradient:
    """dL/dtheta = sum_p dLdI[p] dI[p]/dtheta for each parameter listed, in one reverse pass.  params: a list of
    names or a str "a,b,c", as the program's -params: names and aliases (PARAMS, "wavelength"), groups (GROUPS:
    "all" is every parameter free in exp), panel motions ("g3.shift_x"; "panel_shift", "panel_rot", "panels" ...
    for every panel group), "F" (every structure factor: an array of the table's shape) and "F(h,k,l)" (one entry).
    dLdI: any array-like of shape (slow, fast), converted once to float32."""
    g, image = _ext.grad(exp, dLdI, _expand(params))
    out = Gradient(g)
    out.image = image
    return out


def loss_grad(exp: Experiment, observed, loss: str = "poisson", params=(), weights=None) -> Gradient:
    """The loss against an observed image ("lsq": sum w (I - obs)^2, "poisson": sum I - obs log I) and its
    gradient; pixels outside the ROI or masked are left out."""
    if loss not in _LOSSES:
        raise ValueError(f"loss: expected 'lsq' or 'poisson', got {loss!r}")
    L, g, image = _ext.loss_grad(exp, observed, weights, _LOSSES[loss], _expand(params))
    out = Gradient(g)
    out.image = image
    out.loss = L
    return out


def jvp(exp: Experiment, params, return_image: bool = False):
    """Sensitivity maps dI/dtheta, float64 of shape (nparams, slow, fast), in the parameters' CLI units, in the
    order the names (groups expanded in place) list them (scalars and panel motions, not "F")."""
    tangents, image = _ext.jvp(exp, _expand(params))
    return (tangents, image) if return_image else tangents


@dataclass
class RefineResult:
    """What nbg_refine found.  values, start and sigmas are keyed by parameter name; corr is the correlation
    matrix in the order of params.  constraint says what the space group did to the cell ("" nothing); tied maps a
    cell parameter it ties to another to that one's name (b -> a), and one it holds to None."""

    params: List[str]
    values: Dict[str, float]
    start: Dict[str, float]
    sigmas: Dict[str, float]
    corr: np.ndarray
    loss: float
    start_loss: float
    iterations: int
    converged: bool
    constraint: str = ""
    tied: Dict[str, Optional[str]] = field(default_factory=dict)


def refine(exp: Experiment, observed, params, method: str = "lm", loss: str = "lsq", weights=None,
           max_iter: int = 100, ftol: float = 1e-12, gtol: float = 1e-9, progress=None) -> RefineResult:
    """Fits the parameters of exp to the observed image; exp is updated with the fitted values.
    progress(iter, loss, gnorm, step) is called after each iteration.  "F" among params fits the table's measured
    entries with the others as per-reflection scales (Levenberg-Marquardt; scale cannot be listed with it): the
    result lists them as "F(h,k,l)" and exp's table holds the fitted values."""
    if method not in _METHODS:
        raise ValueError(f"method: expected 'lm' or 'bfgs', got {method!r}")
    if loss not in _LOSSES:
        raise ValueError(f"loss: expected 'lsq' or 'poisson', got {loss!r}")
    if progress is not None and not callable(progress):
        raise TypeError("progress must be callable")
    r = _ext.refine(exp, observed, weights, _expand(params), _METHODS[method], _LOSSES[loss], int(max_iter),
                       float(ftol), float(gtol), progress)
    names = r["params"]
    return RefineResult(params=names, values=dict(zip(names, r["value"])), start=dict(zip(names, r["start"])),
                        sigmas=dict(zip(names, r["sigma"])), corr=r["corr"], loss=r["loss"],
                        start_loss=r["start_loss"], iterations=r["iterations"], converged=r["converged"],
                        constraint=r["constraint"],
                        tied={n: (names[t] if t >= 0 else None) for j, (n, t) in enumerate(zip(names, r["tied"]))
                              if t != j})


@dataclass
class GradcheckResult:
    """One parameter's finite-difference check (nbg_gradcheck_result)."""

    param: str
    adjoint: float
    numeric: float
    relerr: float
    step: float
    order: float
    excluded: int
    passed: bool
    reason: str = field(default="")

    def __bool__(self):
        return self.passed


def gradcheck(exp: Experiment, params, rtol: float = 1e-6, h_scale: float = 1.0) -> List[GradcheckResult]:
    """The library's finite-difference check of the adjoint, one result per parameter (and "F")."""
    return [GradcheckResult(**r) for r in _ext.gradcheck(exp, _expand(params), float(rtol), float(h_scale))]


# --- files -----------------------------------------------------------------------------------------------------

def read_hkl(path, default_F: float = 0.0):
    """An HKL text file as (F, (h_min, k_min, l_min)): F a float64 array (nh, nk, nl), unlisted entries
    default_F."""
    F, origin, _ = _ext.read_hkl(str(path), float(default_F), False)
    return F, origin


def read_fdump(path):
    """nanoBragg's Fdump.bin cache as (F, origin)."""
    F, origin, _ = _ext.read_hkl(str(path), 0.0, True)
    return F, origin


def write_fdump(path, F, origin) -> None:
    _ext.write_fdump(str(path), F, tuple(origin))


def _header(header):
    return header.smv_header() if isinstance(header, _ext.Experiment) else header


def int_image(image, scale: Optional[float] = None, adc: float = 40.0, roi=None) -> np.ndarray:
    """The integer image nanoBragg writes: clip(image * scale + adc, 0, 65535) rounded (scale None: 55000 / max,
    as the program's default)."""
    image = np.asarray(image, dtype=np.float32)
    if scale is None:
        m = float(image.max()) if image.size else 0.0
        scale = 55000.0 / m if m > 0 else 1.0
    return _ext.int_image(image, float(scale), float(adc), None if roi is None else tuple(roi))


def noise_image(image, seed: int, adc: float = 40.0, roi=None):
    """Poisson noise as nanoBragg makes it: (uint16 image, photons, overloads)."""
    return _ext.noise_image(image, int(seed), float(adc), None if roi is None else tuple(roi))


def write_smv(path, image, header, scale: Optional[float] = None, adc: float = 40.0) -> None:
    """Writes an SMV file.  image: uint16 counts written as they are, or photons (any other dtype) turned into
    counts by int_image(image, scale, adc).  header: a dict (read_smv's) or an Experiment (its header)."""
    header = _header(header)
    image = np.asarray(image)
    if image.dtype != np.uint16:
        image = int_image(image, scale, adc)
    _ext.write_smv(str(path), header, image)


def read_smv(path):
    """An SMV file as (uint16 data (slow, fast), header dict)."""
    return _ext.read_smv(str(path))


def write_float(path, image) -> None:
    """The raw float32 image (as -floatfile)."""
    _ext.write_float(str(path), image)


def write_pgm(path, image, scale: float) -> None:
    _ext.write_pgm(str(path), image, float(scale))


class Geometry(dict):
    """A geometry dict (nbg_geometry's fields).  ``complete`` says whether the file described the whole
    experiment (NXmx, full CBF) or only part of it (SMV: pixel counts, size, distance, wavelength, pedestal)."""

    complete: bool = True


def read_image(path, frame: int = 0, shape=None, with_mask: bool = False):
    """One frame of an image file of any format nbgrad knows (NXmx, CBF, SMV, raw float32) as
    (image float32 (slow, fast), geometry or None) (and the mask, 1 = bad, or None, with with_mask=True).
    A raw float file needs shape=(slow, fast).  A file of several panels (a multi-panel CBF, NXmx modules) gives the
    panels' pixels concatenated, flat, and geometry its first panel's (geometry.complete False)."""
    expect = int(np.prod(shape)) if shape is not None else 0
    image, geom, complete, mask = _ext.read_image(str(path), int(frame), expect)
    if geom is not None:
        geom = Geometry(geom)
        geom.complete = bool(complete)
        if geom["spixels"] * geom["fpixels"] == image.size:
            image = image.reshape(geom["spixels"], geom["fpixels"])
            if mask is not None:
                mask = mask.reshape(image.shape)
    elif shape is not None:
        image = image.reshape(shape)
    return (image, geom, mask) if with_mask else (image, geom)


def read_observed(exp: Experiment, path, frame: int = 0, pedestal: Optional[float] = None,
                  gain: Optional[float] = None, read_noise: Optional[float] = None, adc: Optional[float] = None,
                  with_info: bool = False, panel_pedestal=None, panel_gain=None, panel_read_noise=None):
    """The observed image for exp, read as ``nbgrad grad``/``refine -observed`` read it (nbg_observed_read): frame
    `frame` of path (a run of '#' names a series' files, 1-based; else frame `frame` of the one file), any format
    (raw float32 must have exp's pixel count; a file that states its dimensions must have exp's).  Sets exp's
    detector response (exp.pedestal, exp.gain, exp.read_noise) to the values given, else the file's, else
    nanoBragg's (an SMV file without ADC_OFFSET carries adc: exp's -adc, 40; gain 1; read noise 0).  Returns
    (image float32 of exp.shape, mask bool of exp.shape, True = a pixel used): the pixels left out are exp's mask's
    (-mask), the file's mask and the overloads; pass ``weights=mask`` to loss_grad or refine to leave them out as
    the program does.  A pixel used that is not finite raises InvalidError.  with_info=True adds a dict: the file
    read, the response and where each value came from ('given', 'file', 'default'), the file's geometry and
    scan_stated, the pixels left out by cause, and the program's lines (response_text, note, left_out).
    panel_pedestal, panel_gain, panel_read_noise (a value per panel, as ``-panel_pedestal`` ...): each panel of a
    multi-panel detector its own response (the image's where a list is not given); info's 'panel_response' lists
    them, (pedestal, gain, read_noise) per panel."""
    nan = float("nan")
    v = [nan if x is None else float(x) for x in (pedestal, gain, read_noise, adc)]
    lists = [None if x is None else np.asarray(x, dtype=np.float64).ravel()
             for x in (panel_pedestal, panel_gain, panel_read_noise)]
    image, use, info = _ext.read_observed(exp, str(path), int(frame), *v, *lists)
    shape = exp.shape
    image = image.reshape(shape)
    mask = use.reshape(shape).astype(bool)
    if info.get("geometry") is not None:
        info["geometry"] = Geometry(info["geometry"])
        info["geometry"].complete = bool(info.pop("complete"))
    else:
        info.pop("complete", None)
    return (image, mask, info) if with_info else (image, mask)


def spot_pixels(exp: Experiment, image=None, half: Optional[int] = None, frac: float = 0.05, mask=None,
                centres=None, reflections=None, shoebox: Optional[int] = None) -> np.ndarray:
    """The spot regions as ``nbgrad refine -spots HALF -spot_frac FRAC`` draws them (nbg_spot_threshold,
    nbg_spot_pixels): the pixels within `half` pixels (a (2 half + 1)^2 box; None: 3) of every pixel of image
    (None: exp's model, rendered whole) above its floor by frac of its range over the pixels mask keeps (True =
    used, as read_observed gives it; None: all), exp's own mask and ROI left out.  centres ((n, 2) fast, slow pixel
    positions, as refine's -spotlist) boxes those instead.  reflections (a DIALS reflection table from read_refl,
    as refine's ``-spotlist FILE.refl``: nbg_reflection_boxes) boxes its reflections of experiment 0 on their panels:
    each one's bounding box where the table has them and half is None, else a box of half-width half (None: 3)
    about its centroid's pixel; a reflection off the detector raises InvalidError naming it, a table with no
    reflection of experiment 0 ValueError.  With shoebox=N (0 to 1000; as refine's ``-spot_shoebox N``:
    nbg_reflection_shoebox_boxes) the regions are instead the pixels of each reflection's shoebox (the table's
    "shoebox" column, dials.find_spots') that DIALS's mask marks Foreground or Strong, each with those within N
    pixels; a table without shoeboxes raises ValueError.  Returns the flat pixel indices (uint32, increasing) for
    ``exp.pixels``; a flat image raises ValueError.  Drawn from the model, not the data: regions chosen by the
    data's bright pixels would bias a fit towards them."""
    if half is not None and not 0 <= int(half) <= 100000:
        raise ValueError(f"half = {half}: a box half-width in pixels, in [0, 100000]")
    if reflections is not None:
        if centres is not None or image is not None:
            raise ValueError("spot_pixels: reflections box the table's spots; give no image or centres with them")
        missing = [k for k in ("panel", "xyzobs.px.value") if reflections.get(k) is None]
        if missing:
            raise ValueError(f"reflections: no {' or '.join(missing)} column (a table from read_refl)")
        if shoebox is not None:
            if not 0 <= int(shoebox) <= 1000:
                raise ValueError(f"shoebox = {shoebox}: a dilation in pixels, in [0, 1000]")
            if reflections.get("shoebox_offset") is None:
                raise ValueError("reflections: no shoebox column (dials.find_spots writes one; dials.index drops it)")
            pix, nboxes, skipped = _ext.refl_shoebox_pixels(
                exp, reflections.get("id"), reflections["shoebox_panel"], reflections["shoebox_bbox"],
                reflections["shoebox_offset"], reflections["shoebox_mask"], SHOEBOX_FOREGROUND | SHOEBOX_STRONG,
                int(shoebox))
            if nboxes == 0:
                raise ValueError("reflections: the table holds no reflection of experiment 0")
            return pix
        bbox = reflections.get("bbox")
        hb = -1 if half is None and bbox is not None else (3 if half is None else int(half))
        pix, nboxes, _ = _ext.refl_spot_pixels(exp, reflections["panel"], reflections["xyzobs.px.value"],
                                               bbox if hb < 0 else None, reflections.get("id"), hb)
        if nboxes == 0:
            raise ValueError("reflections: the table holds no reflection of experiment 0")
        return pix
    if not float(frac) > 0:
        raise ValueError(f"frac = {frac}: a fraction of the image's range, > 0 (as -spot_frac)")
    m = None if mask is None else np.asarray(mask).astype(np.uint8)
    c = None if centres is None else np.asarray(centres, dtype=np.float64).reshape(-1, 2)
    return _ext.spot_pixels(exp, image, 3 if half is None else int(half), float(frac), m, c)


class Reflections(dict):
    """A DIALS reflection table (read_refl): numpy columns under DIALS's names, None where the table has none:
    "panel" (n,) int32 (0 when the table has no panel column), "xyzobs.px.value" (n, 3) float64 (x fast, y slow in
    pixels, z in images; pixel (f, s) covers [f, f+1) x [s, s+1)), "bbox" (n, 6) int32 (x0, x1, y0, y1, z0, z1),
    "id" (n,) int32 (the experiment; -1 unassigned), "miller_index" (n, 3) int32 (0 0 0 unindexed), "flags" (n,)
    uint64 (DIALS's flags: REFL_INDEXED, REFL_USED_IN_REFINEMENT ...), "xyzcal.px" (n, 3) float64 (DIALS's
    prediction).  Where the table has a "shoebox" column (dials.find_spots'): "shoebox_panel" (n,) int32,
    "shoebox_bbox" (n, 6) int32, "shoebox_offset" (n + 1,) int64 and "shoebox_mask" int32, row r's mask (DIALS's
    MaskCode bits: SHOEBOX_VALID, SHOEBOX_FOREGROUND ...) being shoebox_mask[shoebox_offset[r]:shoebox_offset[r+1]],
    z slowest, x fastest (empty where the row carries no pixels); None without one.  nrows, ncolumns (the table's
    columns, all of them), has_shoebox and path describe the file."""

    nrows: int = 0
    ncolumns: int = 0
    has_shoebox: bool = False
    path: str = ""

    def indexed(self, experiment: int = 0) -> np.ndarray:
        """The rows refine -centroids uses: indexed (miller_index not 0 0 0) and of this experiment (id; a table
        without an id column is all experiment 0).  A boolean array; ValueError without a miller_index column."""
        hkl = self.get("miller_index")
        if hkl is None:
            raise ValueError(f"{self.path}: the table has no miller_index column (index it: dials.index)")
        keep = np.any(hkl != 0, axis=1)
        ids = self.get("id")
        return keep & (ids == experiment) if ids is not None else keep & (experiment == 0)


REFL_INDEXED = 1 << 2
REFL_USED_IN_REFINEMENT = 1 << 3
SHOEBOX_VALID, SHOEBOX_BACKGROUND, SHOEBOX_FOREGROUND, SHOEBOX_STRONG = 1, 2, 4, 8


def read_refl(path) -> Reflections:
    """A DIALS reflection table (.refl, msgpack, as dials.find_spots and dials.index write it) through the library's
    reader (nbg_read_refl, what refine -spotlist and -centroids read): a Reflections dict of its columns.  A file
    that is not one, or is damaged, raises FormatError (FileError when it cannot be read) with the library's message,
    which names the file."""
    d = _ext.read_refl(str(path))
    r = Reflections((k, v) for k, v in d.items() if k not in ("nrows", "ncolumns", "has_shoebox"))
    r.nrows, r.ncolumns, r.has_shoebox, r.path = d["nrows"], d["ncolumns"], bool(d["has_shoebox"]), str(path)
    return r


def reflection_centroids(exp: Experiment, hkl, panel, x, y, radius: int = 5):
    """The model's own spot centroid of each reflection, as ``nbgrad refine -centroids`` computes it
    (nbg_reflection_centroids, -centroid_radius radius): for reflection i (Miller index hkl[i], on panel[i], about the
    position x[i], y[i] in DIALS's pixel coordinates, e.g. its observed centroid xyzobs.px.value), the centroid of
    that reflection's model photons alone (scale applied, no background, the mask ignored) over the square of
    half-width radius pixels about (x[i], y[i]).  Returns (cx, cy, photons), float64 arrays of n; cx, cy are NaN
    and photons 0 where the model puts no photon there.  Refused (UnsupportedError) with tricubic interpolation
    of the structure factors, which mixes neighbouring reflections."""
    if not 1 <= int(radius) <= 1000:
        raise ValueError(f"radius = {radius}: the square's half-width in pixels, in [1, 1000] (as -centroid_radius)")
    return _ext.reflection_centroids(exp, hkl, panel, x, y, int(radius))


def read_expt(path) -> Geometry:
    """A DIALS experiment list (one experiment, one panel) as a geometry dict."""
    return Geometry(_ext.read_expt(str(path)))


def write_expt(path, geometry: dict, images: str = "") -> None:
    _ext.write_expt(str(path), dict(geometry), str(images))


def write_nxmx(path, geometry: dict, frames, mask=None) -> None:
    """NeXus NXmx: frames (nframes, slow, fast) or one (slow, fast) image; integers are written as int32,
    anything else as float32; mask nonzero = bad pixel.  NXmx holds a beam along -z: a geometry whose beam is off it
    (a DIALS list's refined beam) is turned as a whole first, as the program's -nxsfile does
    (nbg_geometry_beam_to_minus_z)."""
    _ext.write_nxmx(str(path), dict(geometry), frames, mask)


def write_cbf(path, geometry: dict, data, frame: int = 0) -> None:
    """A full CBF of one int32 image, frame `frame` of the geometry's scan."""
    _ext.write_cbf(str(path), dict(geometry), data, int(frame))


# --- many shots: shot lists, batch, ensemble ---------------------------------------------------------------------

class ShotList(_ext.ShotList):
    """A shot list (JSON lines, docs/many-shots.md) as the library reads it (nbg_shots_read): ShotList(path).
    len(shots), shots.ids, shots.path; shots[i] is a dict of the keys line i gave (with "id" and "line").  A
    malformed list raises with the library's message naming the file, line and key."""

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __repr__(self):
        return f"ShotList({self.path!r}, {len(self)} shots)"


def read_shots(path) -> ShotList:
    """Reads a shot list (nbg_shots_read), as nbgrad batch -shots and nbgrad ensemble -shots read it."""
    return ShotList(os.fspath(path))


def make_shots(path, n: int, seed: int = 1, cell=None, cell_jitter: float = 0.0, N: float = 0.0,
               N_jitter: float = 0.0, scale_jitter: float = 0.0) -> ShotList:
    """Writes a shot list of n shots in uniformly random orientations (nbg_shots_make: what ``nbgrad shots -n n
    -seed seed [-cell ...] [-cell_jitter ...] [-N ...] [-N_jitter ...] [-scale_jitter ...] -o path`` writes, byte
    for byte) and returns it read back."""
    _ext.make_shots(os.fspath(path), int(n), int(seed), None if cell is None else tuple(float(c) for c in cell),
                    float(cell_jitter), float(N), float(N_jitter), float(scale_jitter))
    return read_shots(path)


def _shots(shots) -> ShotList:
    return shots if isinstance(shots, _ext.ShotList) else read_shots(shots)


def _template(name, what, n):
    if name is None:
        return None
    name = os.fspath(name)
    if n > 1 and "{id}" not in name:
        raise ValueError(f"{what}: every shot would write {name}: put {{id}} in the name (e.g. out/{{id}}.bin)")
    return name


def batch(exp: Experiment, shots, floatfile=None, noisefile=None, seed: int = 1, images: bool = True,
          progress=None) -> Dict[str, np.ndarray]:
    """Renders every shot of a shot list (a ShotList or its path) over exp, as ``nbgrad batch`` does: shot i is exp
    with the line's keys applied (nbg_shot_experiment_make).  Returns {id: image} (float32, (slow, fast); with
    images=False an empty dict).  floatfile and noisefile are file names with {id}: the raw floats and the Poisson
    noise image (SMV, the shot's "seed" or seed + its index, exp's adc), byte for byte the program's -floatfile and
    -noisefile.  progress(id, done, total) after each shot."""
    shots = _shots(shots)
    n = len(shots)
    ftmpl, ntmpl = _template(floatfile, "floatfile", n), _template(noisefile, "noisefile", n)
    smv_adc = "-smv_adc_offset" in getattr(exp, "_flags", ())
    out = {}
    for i in range(n):
        sid = shots.ids[i]
        r = _ext.batch_shot(exp, shots, i, int(seed), bool(images),
                            None if ftmpl is None else ftmpl.replace("{id}", sid),
                            None if ntmpl is None else ntmpl.replace("{id}", sid), smv_adc)
        if r["warning"]:
            warnings.warn(r["warning"], stacklevel=2)
        if images:
            out[sid] = r["image"]
        if progress is not None:
            progress(sid, i + 1, n)
    return out


@dataclass
class EnsembleResult:
    """What nbg_ensemble found.  globals and sigmas are keyed by parameter name (sigmas conditional on the other
    parameters; NaN where no shot informs one); F and F_sigma have the table's shape (exp.F's; F_sigma NaN for an
    entry no shot measured), None unless "F" was global; locals maps each shot's id to its local parameters' values
    ({name: value}), local_values holds them as an array (shots x local_params)."""

    start_loss: float
    loss: float
    globals: Dict[str, float]
    sigmas: Dict[str, float]
    F: Optional[np.ndarray]
    F_sigma: Optional[np.ndarray]
    F_measured: int
    local_params: List[str]
    local_values: np.ndarray
    locals: Dict[str, Dict[str, float]]
    local_not_converged: int
    evaluations: int
    spot_pixels: int = 0
    spot_total: int = 0
    spot_whole: int = 0


def ensemble(exp: Experiment, shots, observed, globals, locals=(), cycles: int = 4, loss: str = "poisson",
             spots: Optional[int] = None, spot_frac: float = 0.05, progress=None, pedestal: Optional[float] = None,
             gain: Optional[float] = None, read_noise: Optional[float] = None, panel_pedestal=None,
             panel_gain=None, panel_read_noise=None) -> EnsembleResult:
    """Refines many still shots together (nbg_ensemble; ``nbgrad ensemble``'s optimiser): the global parameters
    (globals: "F", the whole table of exp, and any parameter names or groups, e.g. "cell") shared by every shot, the
    local ones (locals: e.g. "rotx,roty,rotz,scale") each shot's own.  shots: a ShotList or its path; observed: the
    observed images' file name with {id}.  cycles of local fits (LM) then a global step (EM on F with the Poisson
    loss and F alone, else BFGS); spots: a half-width to fit each shot on its spot regions (-spots).  exp's table
    holds the refined F afterwards.  progress(what, done, total, text), what "info", "warning", "cycle" or "shot",
    as the program prints them.  pedestal, gain, read_noise and the per-panel lists panel_pedestal, panel_gain,
    panel_read_noise: the observed images' detector response, as read_observed and the program's -pedestal ...
    take it (default: each file's)."""
    if loss not in _LOSSES:
        raise ValueError(f"loss: expected 'lsq' or 'poisson', got {loss!r}")
    if progress is not None and not callable(progress):
        raise TypeError("progress must be callable")
    shots = _shots(shots)
    nan = float("nan")
    resp = [nan if x is None else float(x) for x in (pedestal, gain, read_noise)]
    lists = [None if x is None else np.asarray(x, dtype=np.float64).ravel()
             for x in (panel_pedestal, panel_gain, panel_read_noise)]
    r = _ext.ensemble(exp, shots, os.fspath(observed), ",".join(_expand(globals)), ",".join(_expand(locals)),
                      int(cycles), _LOSSES[loss], -1 if spots is None else int(spots), float(spot_frac), progress,
                      *resp, *lists)
    F = Fs = None
    if r["has_F"]:
        shape = exp.F.shape if exp.F is not None else r["F"].shape
        F, Fs = r["F"].reshape(shape), r["F_sigma"].reshape(shape)
    lnames = r["local_params"]
    lv = r["local_value"]
    return EnsembleResult(start_loss=r["start_loss"], loss=r["loss"],
                          globals=dict(zip(r["global_params"], r["global_value"])),
                          sigmas=dict(zip(r["global_params"], r["global_sigma"])), F=F, F_sigma=Fs,
                          F_measured=r["F_measured"], local_params=lnames, local_values=lv,
                          locals={sid: dict(zip(lnames, map(float, lv[i]))) for i, sid in enumerate(shots.ids)},
                          local_not_converged=r["local_not_converged"], evaluations=r["evaluations"],
                          spot_pixels=r["spot_pixels"], spot_total=r["spot_total"], spot_whole=r["spot_whole"])


__all__ = [
    "Experiment", "Gradient", "RefineResult", "GradcheckResult", "Geometry", "PARAMS", "PARAM_INFO", "GROUPS",
    "simulate", "grad", "loss_grad", "jvp", "refine", "gradcheck", "kwargs_to_flags",
    "read_hkl", "read_fdump", "write_fdump", "int_image", "noise_image", "write_smv", "read_smv", "write_float",
    "write_pgm", "read_image", "read_observed", "spot_pixels", "Reflections", "read_refl", "reflection_centroids",
    "REFL_INDEXED", "REFL_USED_IN_REFINEMENT", "SHOEBOX_VALID", "SHOEBOX_BACKGROUND", "SHOEBOX_FOREGROUND",
    "SHOEBOX_STRONG", "read_expt", "write_expt", "write_nxmx", "write_cbf",
    "ShotList", "EnsembleResult", "read_shots", "make_shots", "batch", "ensemble",
    "Error", "InvalidError", "LimitError", "FileError", "FormatError", "UnsupportedError", "DeviceError",
]
