# Generates tests/data/cspad_dxtbx.json: dxtbx's reading of the CSPAD CBF (run once with Debian's dials)
import sys, json
from dxtbx.model.experiment_list import ExperimentListFactory
el = ExperimentListFactory.from_filenames([sys.argv[1]])
imset = el.imagesets()[0]
det = imset.get_detector(); beam = imset.get_beam()
raw = imset.get_raw_data(0)
out = {"source": "dxtbx %s get_raw_data and detector of thermolysin_cspad/idx-20130301060858401.cbf" % imset.get_format_class().__name__,
       "wavelength": beam.get_wavelength(), "direction": list(beam.get_sample_to_source_direction()), "panels": []}
for i, p in enumerate(det):
    d = raw[i].as_double().as_numpy_array()
    out["panels"].append([p.get_name(), p.get_image_size()[0], p.get_image_size()[1], p.get_pixel_size()[0],
        float(d.sum()), float((d * d).sum()), float(d.ravel()[0]), float(d.ravel()[-1])] + [round(x, 12) for x in list(p.get_fast_axis()) + list(p.get_slow_axis()) + list(p.get_origin())])
s = json.dumps(out, separators=(",", ":"))
s = s.replace("[[", "[\n[").replace("],[", "],\n[")
open(sys.argv[2], "w").write(s + "\n")
