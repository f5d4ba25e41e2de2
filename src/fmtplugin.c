/*
 * fmtplugin.c -- the formats plug-in's one exported function (built into nbgrad-formats.so with nxmx.c, cbf.c,
 * cbfbin.c, mtz.c and mtzread.cc, and the library objects they call, all hidden: src/pkg/formats.map).  src/plugin.c opens the plug-in
 * on the first NXmx or CBF call and checks the version and the layouts of the structures both sides pass.
 */
#include "formats.h"

const nbgi_formats_api *nbgi_formats_plugin(void)
{
    static const nbgi_formats_api api = {
        sizeof(nbgi_formats_api),
        NBG_VERSION,
        NBGI_FORMATS_ABI,
        nbgi_read_nxmx_modules,
        nbg_read_nxmx_panels,
        nbgi_write_nxmx_panels_set,
        nbgi_write_nxmx_set,
        nbgi_read_cbf_panels,
        nbg_read_cbf_panels,
        nbgi_write_cbf_set,
        nbgi_read_mtz,
    };
    return &api;
}
