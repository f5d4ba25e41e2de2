// mtz-gen.cc -- writes tests/data/p43212.mtz, the MTZ fixture of tests/test-hkl-mtz.c, with gemmi's writer (Debian
// gemmi-dev, header-only).  Not built by make: the file is committed; to write it again,
//
//   c++ -std=c++11 -O1 tests/data/mtz-gen.cc -o /tmp/mtz-gen && /tmp/mtz-gen tests/data/p43212.mtz
//
// Space group P 43 21 2 (96), cell 40 40 60 90 90 90; columns H K L, FP (F), SIGFP (Q), IMEAN (J), F(+) and F(-)
// (G).  Five reflections (NaN: missing), chosen for the test's hand-computed values:
//   1 2 3   general:            FP 10, IMEAN 400, F(+) 11, F(-) 9
//   3 0 1   on a twofold:        FP 5.5, IMEAN -4 (F 0), F(+) missing, F(-) 6
//   0 0 4   on the 4_3 axis:     FP 7, IMEAN 49, F(+) 7, F(-) 7
//   2 2 5   on a diagonal:       FP missing, IMEAN 16, F(+) 4, F(-) 4
//   1 2 3   again (a repeat):    FP 12, IMEAN 400, F(+) 11, F(-) 9   (FP's mean over the two: 11)
#define USE_STD_SNPRINTF // Debian leaves out the bundled stb_sprintf.h
#define GEMMI_WRITE_IMPLEMENTATION
#include <gemmi/mtz.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main(int argc, char **argv)
{
    if (argc != 2) {
        std::fprintf(stderr, "usage: mtz-gen OUT.mtz\n");
        return 2;
    }
    gemmi::Mtz mtz(true); // with the H, K, L columns and the base dataset
    mtz.spacegroup = gemmi::find_spacegroup_by_name("P 43 21 2");
    mtz.cell.set(40, 40, 60, 90, 90, 90);
    mtz.add_dataset("fixture").wavelength = 1.0;
    mtz.add_column("FP", 'F', -1, -1, false);
    mtz.add_column("SIGFP", 'Q', -1, -1, false);
    mtz.add_column("IMEAN", 'J', -1, -1, false);
    mtz.add_column("F(+)", 'G', -1, -1, false);
    mtz.add_column("F(-)", 'G', -1, -1, false);
    const float nan = NAN;
    const std::vector<float> rows = {
        1, 2, 3, 10, 1, 400, 11, 9,
        3, 0, 1, 5.5f, 1, -4, nan, 6,
        0, 0, 4, 7, 1, 49, 7, 7,
        2, 2, 5, nan, nan, 16, 4, 4,
        1, 2, 3, 12, 1, 400, 11, 9,
    };
    mtz.set_data(rows.data(), rows.size());
    mtz.write_to_file(argv[1]);
    return 0;
}
